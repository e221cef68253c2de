// policy/cache_aware: sgl-model-gateway's default, done right. Per request: if the load is
// imbalanced (max - min > abs AND max > min * rel) the least-loaded worker; else the match rate of
// the request text on the model's approximate tree (prefix/approx_tree) decides: above
// --cache-threshold the worker holding the longest match (least loaded among equals), else the
// least loaded worker, random among ties. The text is then recorded under the chosen worker. The
// tree is checked against what workers report (cached_tokens): a worker that missed a prefix the
// tree gave it loses that part of the tree. Trees are evicted to --max-tree-size characters per
// worker every
// --eviction-interval seconds.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <shared_mutex>
#include <string>

#include "policy/common.h"
#include "policy/registry.h"
#include "prefix/approx_tree.h"

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

  // The tree of a model (created on first use). Exposed for tests and benchmarks.
  prefix::ApproxTree& tree(std::string_view model);

 private:
  PolicyConfig config_;
  PolicyRng rng_;
  std::shared_mutex trees_mu_;
  std::map<std::string, std::unique_ptr<prefix::ApproxTree>, std::less<>> trees_;
  std::set<uint64_t> known_workers_;
  metrics::CounterFamily* predicted_ = nullptr;
  metrics::CounterFamily* cached_ = nullptr;
  metrics::CounterFamily* corrections_ = nullptr;
  metrics::GaugeFamily* tree_chars_ = nullptr;
  metrics::GaugeFamily* tree_nodes_ = nullptr;
  std::map<uint64_t, std::string> worker_urls_;  // id -> url, for the per-worker gauges
};

}  // namespace kvgate
