// replica/registry: see registry.h.
#include "replica/registry.h"

#include <charconv>
#include <cinttypes>
#include <cstdio>
#include <vector>

#include "discovery/etcd.h"
#include "discovery/registrar.h"
#include "discovery/source.h"
#include "replica/sync.h"
#include "util/log.h"

namespace kvgate::replica {
namespace {

std::string hex_id(uint64_t id) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, id);
  return buf;
}

bool parse_hex_id(std::string_view s, uint64_t& out) {
  if (s.size() != 16) return false;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out, 16);
  return ec == std::errc() && end == s.data() + s.size();
}

}  // namespace

std::string parse_registry_url(std::string_view uri, std::string& etcd_url) {
  discovery::Spec spec;
  if (!uri.starts_with("etcd://")) {
    return "--replica-registry takes etcd://HOST:PORT (etcd's client address), got '" +
           std::string(uri) + "'";
  }
  if (std::string e = discovery::parse_spec(uri, spec); !e.empty()) {
    return "--replica-registry: " + e;
  }
  if (spec.etcd_prefix != discovery::kWorkersPrefix) {
    return "--replica-registry takes etcd://HOST:PORT without a path (the gateways' keys are "
           "under /kvgate/v1/gateways/<--replica-sync-subject>/), got '" +
           std::string(uri) + "'";
  }
  etcd_url = spec.etcd_url;
  return "";
}

Registry::Registry(RegistryConfig config, Sync& sync, metrics::Registry* registry)
    : config_(std::move(config)),
      sync_(sync),
      key_(std::string(discovery::kGatewaysPrefix) + config_.subject + "/" + hex_id(sync.id())) {
  if (!registry) return;
  auto& registered = registry->gauge("kvgate_replica_registry_registered",
                                     "1 while this gateway's key is in etcd (--replica-registry)");
  auto& gateways = registry->gauge("kvgate_replica_registry_gateways",
                                   "Gateways of this fleet registered in etcd (this one included)");
  // (The collector outlives this object: it reads the shared state, which it keeps.)
  registry->add_collector([state = state_, r = &registered.with({}), g = &gateways.with({})] {
    r->set(state->registered.load(std::memory_order_relaxed) ? 1.0 : 0.0);
    g->set(static_cast<double>(state->gateways.load(std::memory_order_relaxed)));
  });
}

Registry::~Registry() {
  stop();
}

std::string Registry::start() {
  if (std::string e = discovery::check_worker_key_parts(config_.subject, hex_id(sync_.id()));
      !e.empty()) {
    return "--replica-sync-subject '" + config_.subject + "' cannot name an etcd key: " + e;
  }
  discovery::EtcdWatcher::Options wo;
  wo.root = std::string(discovery::kGatewaysPrefix);
  watcher_ = std::make_unique<discovery::EtcdWatcher>(
      config_.etcd_url, std::string(discovery::kGatewaysPrefix) + config_.subject + "/", wo,
      [this](const std::vector<discovery::WorkerRecord>& records) {
        std::vector<uint64_t> ids;
        ids.reserve(records.size());
        for (const auto& r : records) {
          uint64_t id = 0;
          // (Only this fleet's: the prefix also holds longer subjects' keys, "<subject>/x/<id>".)
          if (r.model == config_.subject && parse_hex_id(r.id, id)) ids.push_back(id);
        }
        state_->gateways.store(ids.size(), std::memory_order_relaxed);
        sync_.set_registered(std::move(ids));
      });
  if (std::string e = watcher_->start(); !e.empty()) {
    watcher_.reset();
    return "--replica-registry: " + e;
  }
  discovery::WorkerRecord record;
  record.url = config_.url;
  discovery::RegistrarOptions ro{.etcd_url = config_.etcd_url,
                                 .key = key_,
                                 .value = discovery::serialize_worker_record(record),
                                 .ttl_secs = config_.ttl_secs,
                                 .what = "gateway"};
  thread_ = std::thread([this, ro] {
    discovery::keep_registered(
        ro,
        [this](std::chrono::milliseconds d) {
          std::unique_lock lock(mu_);
          return cv_.wait_for(lock, d, [this] { return stopping_; });
        },
        &state_->registered);
  });
  log::info("replica registry started")
      .kv("etcd", config_.etcd_url)
      .kv("key", key_)
      .kv("ttl", config_.ttl_secs);
  return "";
}

void Registry::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (watcher_) watcher_->stop();
}

}  // namespace kvgate::replica
