// replica/registry: a gateway registering itself in etcd (--replica-registry etcd://HOST:PORT),
// as `kvgate register` registers a worker: its record (url: this gateway's address) at
// /kvgate/v1/gateways/<subject>/<replica id> under a lease it keeps alive (discovery/registrar.h)
// and revokes when it stops. It also watches the fleet's keys (discovery::EtcdWatcher under
// /kvgate/v1/gateways/<subject>/) and tells Sync which replicas are registered: a peer whose key
// goes (its lease expired: the replica died; or it stopped and revoked it) is forgotten at once
// instead of after --replica-peer-timeout-ms of silence.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "metrics/metrics.h"

namespace kvgate::discovery {
class EtcdWatcher;
}

namespace kvgate::replica {

class Sync;

struct RegistryConfig {
  std::string uri;       // --replica-registry as given (etcd://HOST:PORT)
  std::string etcd_url;  // http://HOST:PORT (from etcd://HOST:PORT)
  std::string subject;   // the fleet's subject prefix (--replica-sync-subject)
  std::string url;       // this gateway's address, as clients reach it
  int64_t ttl_secs = 10;
  bool operator==(const RegistryConfig&) const = default;
};

// "" and `etcd_url` set to http://HOST:PORT, or what is wrong with an --replica-registry value.
std::string parse_registry_url(std::string_view uri, std::string& etcd_url);

class Registry {
 public:
  // `sync` outlives the Registry; `registry` may be null (no metrics).
  Registry(RegistryConfig config, Sync& sync, metrics::Registry* registry);
  ~Registry();  // stop()
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // "" and the threads started, or what is wrong (nothing started).
  std::string start();
  // Revokes this gateway's lease (its key goes at once) and joins the threads.
  void stop();
  // This gateway's key.
  const std::string& key() const { return key_; }
  bool registered() const { return state_->registered.load(std::memory_order_relaxed); }

 private:
  RegistryConfig config_;
  Sync& sync_;
  std::string key_;
  struct State {
    std::atomic<bool> registered{false};
    std::atomic<size_t> gateways{0};  // keys under the fleet's prefix
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
  std::unique_ptr<discovery::EtcdWatcher> watcher_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace kvgate::replica
