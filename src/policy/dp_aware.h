// policy/dp_aware: --dp-aware (a rule's dpAware). An SGLang server run with --dp-size N has N
// data-parallel ranks, each with its own KV cache; left to itself it spreads requests over them
// round robin, splitting a conversation's turns over caches that do not share. This wrapper makes
// any policy treat each (worker, rank) as its own target: the inner policy is given one target per
// rank of each available worker (a Worker of the wrapper's own, named "url@rank", whose in-flight
// count is the requests dispatched to that rank and whose reported load is the rank's own from
// /get_load), and its choice is turned back into the real worker plus Decision::dp_rank, which the
// gateway writes into the body as routed_dp_rank. So cache_aware keeps one tree slot per rank
// (a conversation stays on one rank), power_of_two and the least-loaded choices balance ranks,
// ring policies place keys on ranks.
//
// Ranks per worker: the dp_size of its /server_info (the health plane fetches it), else the
// configured default (--kv-dp-rank-count, a rule's kvDpRankCount; 1: the whole server is one
// target and the engine picks the rank). Targets are rebuilt on the control thread only (when the
// pool's workers change, and on the wrapper's period when a worker says another dp_size); a rank
// target keeps its identity (and the inner policy's state of it) while its rank exists.
//
// Availability of a rank target is its worker's: only ranks of the workers the gateway found
// available (healthy, breaker passing) are offered. Hooks stay balanced: the inner policy hears
// on_completed exactly once for each on_dispatched it heard, with the same target, even when the
// targets were rebuilt meanwhile (a retired target lives on, draining, until nothing dispatched to
// it is in flight). A decision made for a target retired before its dispatch opened is dispatched
// without the inner policy hearing of it at all (neither hook).
//
// kv_exact is not wrapped: it already routes per (endpoint, rank), its fallback's choices
// included (make_policy leaves it as it is).
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "metrics/metrics.h"
#include "policy/policy.h"

namespace kvgate {

struct PolicyConfig;

class DpAwarePolicy final : public Policy {
 public:
  DpAwarePolicy(const PolicyConfig& config, std::unique_ptr<Policy> inner);

  std::string_view name() const override { return inner_->name(); }
  Decision select(std::span<Worker* const> available, RouteContext& ctx) override;
  void on_dispatched(const Decision& d, RouteContext& ctx) override;
  void on_completed(const Decision& d, RouteContext& ctx, const Outcome& o) override;
  void on_first_token(const Decision& d, RouteContext& ctx) override;
  void on_workers_changed(const WorkerSet& set) override;
  ParseOptions parse_options() const override { return inner_->parse_options(); }
  bool uses_reported_load() const override { return inner_->uses_reported_load(); }
  bool wants_kv_events() const override { return inner_->wants_kv_events(); }
  bool wants_dp_size() const override { return true; }
  bool wants_usage() const override { return inner_->wants_usage(); }
  // Its own upkeep (a worker saying another dp_size, ranks' reported loads, retired targets no
  // longer in flight), and the inner policy's at the inner policy's own period.
  std::chrono::milliseconds period() const override { return kPeriod; }
  void on_period() override;
  void start() override { inner_->start(); }
  void stop() override { inner_->stop(); }
  void attach(const PolicyRuntime& runtime) override { inner_->attach(runtime); }

  static constexpr std::chrono::milliseconds kPeriod{250};

  // For tests.
  Policy& inner() { return *inner_; }
  // Ranks the targets of this worker were built with (nullopt: not a worker of the pool).
  std::optional<int64_t> ranks_of(uint64_t worker_id) const;
  size_t targets() const;   // rank targets offered to the inner policy
  size_t draining() const;  // retired targets still in flight
  // The target of (worker, rank), null if none: to look at its in-flight count and load.
  WorkerPtr target(uint64_t worker_id, int rank) const;

 private:
  struct Target {
    WorkerPtr target;  // what the inner policy sees
    uint64_t worker_id = 0;
    std::string worker_url;
    int rank = 0;
    bool live = true;  // false: retired (rank or worker gone), kept while in flight
  };
  // Rebuilds the targets when a worker of `workers_` has another number of ranks than its
  // targets were built with (or `force`); then drops retired targets no longer in flight and
  // refreshes the targets' reported loads. Control thread (change_mu_ held).
  void refresh(bool force);
  int64_t ranks_wanted(const Worker& w) const;
  // The rank targets offered for one set of available workers (the pool's index's), with an
  // index of their own for the inner policy.
  struct Offer {
    uint64_t generation = 0;  // the available set's
    uint64_t version = 0;     // version_ when built
    std::unique_ptr<AvailabilityIndex> index;
    std::shared_ptr<const AvailableSet> set;
  };
  // The offer for the available set `generation` (`available` its workers), built when the last
  // one was for another set or older targets; null when no worker of it has targets.
  std::shared_ptr<Offer> offer_for(uint64_t generation, std::span<Worker* const> available);
  // The inner policy's decision as the gateway's (the real worker, the rank). mu_ held.
  Decision from_inner(const Decision& inner, std::span<Worker* const> available,
                      const RouteContext& ctx) const;
  // The target a decision names (its target_id), or null when it was dropped.
  WorkerPtr find(uint64_t target_id) const;

  std::string rule_;
  int64_t default_ranks_;
  std::unique_ptr<Policy> inner_;
  metrics::CounterFamily* dispatched_ = nullptr;  // kvgate_dp_rank_dispatched_total
  metrics::GaugeFamily* ranks_gauge_ = nullptr;   // kvgate_dp_ranks (control thread)

  mutable std::shared_mutex mu_;  // the maps below: request threads read, the control thread swaps
  std::unordered_map<uint64_t, Target> by_id_;  // target id -> target (live and draining)
  std::unordered_map<uint64_t, std::vector<WorkerPtr>> ranks_;  // worker id -> its live targets

  std::atomic<uint64_t> version_{0};  // bumped when ranks_ changes
  std::mutex offer_mu_;
  std::shared_ptr<Offer> offer_;  // the last offer made (under offer_mu_)

  std::mutex change_mu_;                              // on_workers_changed / on_period
  std::vector<WorkerPtr> workers_;                    // the pool's, as last told (under change_mu_)
  std::unordered_map<uint64_t, std::string> gauged_;  // workers with a kvgate_dp_ranks series
  uint64_t next_id_ = 1;                              // target ids, never reused (under change_mu_)
  std::chrono::steady_clock::time_point next_inner_period_{};  // under change_mu_
};

}  // namespace kvgate
