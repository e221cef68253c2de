// sim/sim_metrics: the sglang:* Prometheus families kvgate-sim exposes at /metrics (SGLang's names,
// labels model_name and dp_rank), and the per-rank cells schedulers update without locks.
#pragma once

#include <string>
#include <vector>

#include "metrics/metrics.h"

namespace kvgate::sim {

// The cells of one DP rank.
struct RankMetrics {
  metrics::Counter* prompt_tokens;
  metrics::Counter* generation_tokens;
  metrics::Counter* cached_tokens;
  metrics::Counter* requests;
  metrics::Gauge* running;
  metrics::Gauge* queued;
  metrics::Gauge* used_tokens;
  metrics::Gauge* token_usage;
  metrics::Gauge* cache_hit_rate;
  metrics::Histogram* ttft;
  metrics::Histogram* e2e;
};

class SimMetrics {
 public:
  SimMetrics(const std::string& model_name, int dp_size);
  RankMetrics& rank(int r) { return ranks_[static_cast<size_t>(r)]; }
  std::string expose() const { return registry_.expose(); }

 private:
  metrics::Registry registry_;
  std::vector<RankMetrics> ranks_;
};

}  // namespace kvgate::sim
