// discovery/registrar: keeps one key in etcd for as long as its owner runs: a lease, the key put
// under it, keepalives every third of the lease's TTL, a new lease and put again when the lease
// is lost (etcd restarted, or unreachable for longer than the TTL), and the lease revoked at the
// end so the key goes at once. An owner that dies without revoking leaves the key until the TTL.
// `kvgate register` keeps a worker's record this way (register_cli.h); a gateway with
// --replica-registry its own (replica/registry.h).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

namespace kvgate::discovery {

struct RegistrarOptions {
  std::string etcd_url;  // http://HOST:PORT
  std::string key;
  std::string value;
  int64_t ttl_secs = 10;
  std::string what = "worker";  // in logs: "worker registered", ...
};

// Runs the loop above until `wait` returns true: wait(d) waits up to d and says whether to stop.
// `registered` (optional) is true while the key is believed to be in etcd. Blocking (its own
// thread); every etcd call is bounded by the client's timeout.
void keep_registered(const RegistrarOptions& options,
                     const std::function<bool(std::chrono::milliseconds)>& wait,
                     std::atomic<bool>* registered = nullptr);

}  // namespace kvgate::discovery
