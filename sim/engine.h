// sim/engine: the simulated inference engine behind the HTTP layer. Owns the model stand-in
// (PseudoText), one Scheduler per DP rank, and the DP dispatch (routed_dp_rank, else round robin as
// SGLang's default controller does). The HTTP layer hands it GenerationRequests and reads the
// returned Sequences; it never sees timing, caches or ranks' internals.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sim/pseudo_text.h"
#include "sim/scheduler.h"
#include "sim/sim_metrics.h"
#include "sim/tokenizer.h"

namespace kvgate::sim {

struct EngineConfig {
  int dp_size = 1;
  int64_t max_total_tokens = 400000;
  uint64_t seed = 0;
  std::chrono::nanoseconds ttft{std::chrono::milliseconds(20)};
  std::chrono::nanoseconds tpot{std::chrono::milliseconds(5)};
};

class Engine {
 public:
  Engine(EngineConfig config, const Tokenizer& tokenizer, SimMetrics& metrics);

  // "" when `rank` (a request's routed_dp_rank) can be served, else the 400 message.
  std::string check_rank(std::optional<int64_t> rank) const;
  // The rank a request goes to: its routed_dp_rank, else the next in round robin.
  int pick_rank(std::optional<int64_t> routed);
  // Starts a generation on its rank; `notifier` is woken whenever it moves. The rank must have
  // passed check_rank.
  std::shared_ptr<Sequence> submit(GenerationRequest request, std::shared_ptr<Notifier> notifier);

  std::vector<RankLoad> loads() const;
  // Flushes every rank's cache, or none when any rank has requests (returns false).
  bool flush_cache();

  int dp_size() const { return config_.dp_size; }
  uint64_t seed() const { return config_.seed; }
  const Tokenizer& tokenizer() const { return tokenizer_; }
  const PseudoText& model() const { return model_; }
  RankMetrics& rank_metrics(int rank) { return metrics_.rank(rank); }

 private:
  EngineConfig config_;
  const Tokenizer& tokenizer_;
  SimMetrics& metrics_;
  PseudoText model_;
  std::vector<std::unique_ptr<Scheduler>> ranks_;
  std::atomic<uint64_t> next_rank_{0};
};

}  // namespace kvgate::sim
