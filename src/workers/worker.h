// workers/worker: an upstream inference server as the request path sees it: an immutable
// descriptor (URL, resolved address) plus atomics the planes update (health, breaker, in-flight
// requests, the load the server reports). WorkerRegistry publishes the current set as an immutable
// snapshot; the request path takes a reference to it (util/shared_snapshot: a lock held for a
// reference-count increment, never across the planes' work).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "http/client.h"
#include "metrics/metrics.h"
#include "util/shared_snapshot.h"
#include "util/versioned.h"
#include "workers/circuit_breaker.h"

namespace kvgate {

// The `kv_events` object of an SGLang server's /server_info (newer builds): where its DP ranks
// publish KV events, and their page size.
struct KvEventsInfo {
  std::string host;  // endpoint_host ("*", "0.0.0.0", "::" or empty: the worker's own host)
  int64_t port_base = 0;
  std::optional<int64_t> replay_port_base;
  std::string topic;
  int64_t block_size = 0;
  int64_t dp_size = 1;
  bool operator==(const KvEventsInfo&) const = default;
};

struct WorkerMetrics {
  metrics::Gauge* inflight = nullptr;
  metrics::Gauge* health = nullptr;
  metrics::Gauge* cb_state = nullptr;
  metrics::Gauge* reported_load = nullptr;
  metrics::Counter* requests = nullptr;
  metrics::Counter* failures = nullptr;
  metrics::Counter* load_poll_failures = nullptr;
};

// Told of a worker's changes (Worker::add_listener): an availability index
// (workers/availability.h). Called on any thread with the worker's listener lock held: keep it
// short, and never call back into a Worker from it.
class WorkerListener {
 public:
  // Health or breaker state changed: whether the worker could take a request may have changed.
  virtual void availability_changed(uint32_t cookie) = 0;
  // Its in-flight count moved by `delta` (+1 or -1).
  virtual void inflight_changed(uint32_t cookie, int64_t delta) = 0;

 protected:
  ~WorkerListener() = default;
};

class Worker {
 public:
  Worker(uint64_t id, http::Target target, BreakerConfig breaker);

  uint64_t id() const { return id_; }
  const std::string& url() const { return target_.url; }
  // XXH3 of url(), made once: how kvgate replicas name this worker to each other
  // (replica::worker_key gives the same for a URL).
  uint64_t url_key() const { return url_key_; }
  const http::Target& target() const { return target_; }

  bool healthy() const { return healthy_.load(std::memory_order_acquire); }
  void set_healthy(bool h);
  // Healthy and the breaker could let a request through now (no side effect: for listing
  // candidates). Dispatching takes a pass with admit().
  bool available(Clock::time_point now) const { return healthy() && breaker_.could_pass(now); }
  CircuitBreaker::Pass admit(Clock::time_point now);

  // Requests this gateway has in flight to the worker.
  int64_t inflight() const { return inflight_.load(std::memory_order_relaxed); }
  void begin_request();
  void end_request();
  // What the other kvgate replicas last said they have in flight to it (replica/sync.h; 0
  // without --replica-sync), and the sum the policies compare.
  int64_t peer_inflight() const { return peer_inflight_.at(0)[0]; }
  int64_t fleet_inflight() const { return inflight() + peer_inflight(); }
  // `from_us`: the moment the sum counts from on every replica (a report's sending + settle;
  // 0: now, tests).
  void set_peer_inflight(int64_t n, int64_t from_us = 0);
  // This gateway's own in-flight count as NATS last echoed its load report, counting from
  // `from_us` as the peers' do (replica::Sync).
  void set_echoed_inflight(int64_t n, int64_t from_us);
  // The fleet's in-flight count every replica weighs alike as of `when_us` (unix us; 0: now):
  // the peers' sum and, with `own_echoed` (replica::Sync::own_view()), this gateway's as echoed;
  // else its live count. A figure that changed after `when_us` counts as before the change, so a
  // decision asked for a moment (route-only ?at=) weighs that moment's figures.
  int64_t shared_inflight(int64_t when_us, bool own_echoed) const {
    const int64_t own =
        own_echoed ? echoed_inflight_.at(when_us)[0] : inflight_.load(std::memory_order_relaxed);
    return own + peer_inflight_.at(when_us)[0];
  }
  // Load the server last reported on /get_load (running + waiting requests), 0 before the first
  // report. When polls fail, the health plane keeps the last value or raises it (never lowers it
  // to look idle).
  int64_t reported_load() const { return reported_load_.load(std::memory_order_relaxed); }
  void set_reported_load(int64_t v);
  // What power_of_two and the least-loaded choices compare.
  int64_t load() const { return inflight() + reported_load(); }

  const CircuitBreaker& breaker() const { return breaker_; }
  BreakerState breaker_state() const { return breaker_.state(); }
  // The outcome of a request the breaker let through with `pass` (exactly one per admit()).
  void record_success(CircuitBreaker::Pass pass);
  void record_failure(CircuitBreaker::Pass pass, Clock::time_point now);
  void record_neutral(CircuitBreaker::Pass pass);

  // Models the worker serves (raw JSON objects from its /v1/models), refreshed by the health plane.
  std::vector<std::string> models() const;
  void set_models(std::vector<std::string> models);
  // What the worker's /server_info says of its KV event publishers (kv_events), when fetched.
  std::optional<KvEventsInfo> kv_events() const;
  void set_kv_events(std::optional<KvEventsInfo> info);
  // The data-parallel ranks the worker's /server_info says it runs (dp_size), when fetched and
  // said (--dp-aware's discovery); 1..kMaxDpRanks.
  static constexpr int64_t kMaxDpRanks = 64;
  std::optional<int64_t> dp_size() const;
  void set_dp_size(std::optional<int64_t> n);
  // The load of each DP rank as /get_load last reported it (index = dp_rank; empty before a
  // report, or when the report did not give ranks), at most kMaxDpRanks entries.
  std::vector<int64_t> rank_loads() const;
  void set_rank_loads(std::vector<int64_t> loads);

  // Listeners hear every availability change and in-flight move (fleet_inflight: this
  // gateway's and its peers') from here on; `inflight` is told the fleet count at the moment of
  // registration (consistent with the moves that follow).
  // Remove before the listener goes.
  void add_listener(WorkerListener* l, uint32_t cookie, int64_t& inflight);
  void remove_listener(WorkerListener* l);

  void attach_metrics(WorkerMetrics m);
  // The role label of kvgate_worker_role ("" before one is set). Control loop only.
  std::string_view role() const { return role_; }
  void set_role(std::string_view r) { role_ = r; }
  const WorkerMetrics& metrics() const { return metrics_; }

 private:
  void publish_breaker(std::optional<BreakerState> changed);
  void availability_changed();

  struct Listener {
    WorkerListener* l;
    uint32_t cookie;
  };

  uint64_t id_;
  http::Target target_;
  uint64_t url_key_;
  std::atomic<bool> healthy_{false};
  std::atomic<int64_t> inflight_{0};  // changed under listeners_mu_ (see add_listener)
  // The peers' sum, written under listeners_mu_ too, and this gateway's own count as NATS echoed
  // it, written under replica::Sync's load lock: each with the moment it counts from
  // (util/versioned).
  VersionedFigures<1> peer_inflight_;
  VersionedFigures<1> echoed_inflight_;
  std::mutex listeners_mu_;
  std::vector<Listener> listeners_;
  std::atomic<int64_t> reported_load_{0};
  CircuitBreaker breaker_;
  WorkerMetrics metrics_;
  mutable std::mutex models_mu_;
  std::vector<std::string> models_;
  std::optional<KvEventsInfo> kv_events_;
  std::optional<int64_t> dp_size_;
  std::vector<int64_t> rank_loads_;
  std::string_view role_;  // a static string
};

using WorkerPtr = std::shared_ptr<Worker>;

// An immutable list of workers.
struct WorkerSet {
  std::vector<WorkerPtr> workers;
};

class WorkerRegistry {
 public:
  WorkerRegistry() : current_(std::make_shared<const WorkerSet>()) {}
  std::shared_ptr<const WorkerSet> snapshot() const { return current_.load(); }
  void publish(std::shared_ptr<const WorkerSet> set) { current_.store(std::move(set)); }
  size_t healthy_count() const;

 private:
  SharedSnapshot<const WorkerSet> current_;
};

}  // namespace kvgate
