// policy/cache_aware: sgl-model-gateway's default, done right. Per request: if the load is
// imbalanced (max - min > abs AND max > min * rel) the least-loaded worker; else the match rate of
// the request text on the model's approximate tree (prefix/approx_tree) decides: above
// --cache-threshold the worker holding the longest match (least loaded among equals), else the
// least loaded worker, random among ties. The text is then recorded under the chosen worker
// (Decision::predicted_chars says how much of it the tree believed the worker held before, on
// every branch); when the worker did not run the request after all (Outcome::started false) the
// record is withdrawn back to that. The tree is checked against what workers report
// (cached_tokens): a worker that missed a prefix the tree gave it loses that part of the tree.
// Trees are evicted to --max-tree-size characters per worker every --eviction-interval seconds.
//
// One tree per request `model`, at most --max-prefix-trees of them: requests naming a model
// beyond that share one overflow tree (kvgate_prefix_tree_overflow_total counts them), and a
// model tree left empty (eviction, corrections, workers leaving) is removed at the next eviction,
// making room for another model.
//
// Several replicas (--replica-sync, PolicyConfig::replica): the tree needs a request's text, which
// replicas do not send each other, so the policy routes on a chunk index instead
// (prefix/chunk_index.h): each dispatch is applied to it at once and published (the chain of the
// prompt's chunks, the worker, the origin time), and peers' records of the same rule are applied
// as they arrive, each counting from its origin time + replica::Sync::settle() (by then every
// replica has it) until its origin time + --eviction-interval. Loads are the fleet's as every
// replica weighs them at that moment (Worker::shared_inflight): the peers' reports and this
// replica's own as NATS echoed its report, each counting from its sending + settle. The decision
// is then a function of state every replica holds at the moment decided for (now, or route-only's
// ?at=), ties broken by a hash of the request and the worker instead of a random draw, so the same
// request asked of any replica goes to the same worker. A withdrawal is published as the
// retraction of the record it undoes; a worker's report of fewer cached tokens is counted
// (predicted vs cached) but corrects nothing, since the index holds no other text of the worker to
// cut.
//
// Concurrency: select/on_dispatched/on_completed run on request threads while on_period runs on
// the control thread. Each use of a tree holds the table's reader lock (one walk down one tree);
// removing a tree takes the writer lock, so a tree is never destroyed while a request uses it.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <string>

#include "policy/common.h"
#include "policy/registry.h"
#include "prefix/approx_tree.h"
#include "prefix/chunk_index.h"
#include "replica/wire.h"

namespace kvgate {

class CacheAwarePolicy final : public Policy {
 public:
  explicit CacheAwarePolicy(const PolicyConfig& config);
  std::string_view name() const override { return "cache_aware"; }
  Decision select(std::span<Worker* const> available, RouteContext& ctx) override;
  void on_dispatched(const Decision& d, RouteContext& ctx) override;
  void on_completed(const Decision& d, RouteContext& ctx, const Outcome& outcome) override;
  void on_workers_changed(const WorkerSet& set) override;
  ParseOptions parse_options() const override { return {.want_text = true}; }
  bool wants_usage() const override { return true; }
  std::chrono::milliseconds period() const override;
  void on_period() override;
  void start() override;
  void stop() override;
  bool shared() const { return chunks_ != nullptr; }
  // Applies a peer's record (replica/sync.h's sink; also for tests).
  void apply_peer(const replica::ChainRecord& r);

  // The tree requests naming `model` use (created on first use; the overflow tree when the table
  // is full). Exposed for tests and benchmarks: the pointer keeps it alive even once removed.
  std::shared_ptr<prefix::ApproxTree> tree(std::string_view model);
  size_t tree_count();  // model trees held (the overflow tree not counted)

 private:
  // Runs f(tree, overflowed) on the tree of `model` under the table's reader lock. A model with no
  // tree gets one when `create` and the table has room; past --max-prefix-trees it shares the
  // overflow tree; otherwise (no tree, not creating) f(nullptr, false).
  template <class F>
  void with_tree(std::string_view model, bool create, F&& f);
  Decision select_indexed(std::span<Worker* const> available, RouteContext& ctx);
  Decision select_shared(std::span<Worker* const> available, RouteContext& ctx);
  const std::vector<uint64_t>& chain_of(RouteContext& ctx);
  // Characters of `text` the tree of `model` holds for worker `w`.
  size_t held_by(std::string_view model, std::string_view text, const Worker* w);

  PolicyConfig config_;
  PolicyRng rng_;
  size_t max_trees_;
  std::shared_mutex trees_mu_;
  std::map<std::string, std::shared_ptr<prefix::ApproxTree>, std::less<>> trees_;
  std::shared_ptr<prefix::ApproxTree> overflow_;  // shared by models past max_trees_
  std::atomic<bool> overflow_logged_{false};
  std::set<uint64_t> known_workers_;
  metrics::CounterFamily* predicted_ = nullptr;
  metrics::CounterFamily* cached_ = nullptr;
  metrics::CounterFamily* corrections_ = nullptr;
  metrics::CounterFamily* withdrawn_ = nullptr;
  metrics::GaugeFamily* tree_chars_ = nullptr;
  metrics::Gauge* tree_nodes_ = nullptr;
  metrics::Counter* overflow_total_ = nullptr;
  metrics::Gauge* trees_gauge_ = nullptr;
  std::map<uint64_t, std::string> worker_urls_;  // id -> url, for the per-worker gauges

  // Shared by replicas (null: this replica alone).
  std::unique_ptr<prefix::ChunkIndex> chunks_;
  size_t chunk_bytes_ = 0;
  int64_t ttl_us_ = 0;
  std::mutex start_mu_;
  int starts_ = 0;
  uint64_t sink_ = 0;
  metrics::Gauge* chunk_entries_ = nullptr;
  metrics::Counter* chunk_dropped_ = nullptr;
};

}  // namespace kvgate
