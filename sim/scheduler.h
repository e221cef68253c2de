// sim/scheduler: the per-DP-rank scheduler interface. A scheduler decides WHEN a sequence gets its
// prefill and each output token (the Sequence decides WHICH token and when it stops), keeps the
// rank's load (what /get_load, /v1/loads and /metrics report), and owns the rank's KV cache.
// This issue has one implementation, FixedDelayScheduler (sim/fixed_delay_scheduler.h); the
// continuous-batching scheduler with its paged radix cache and KV event publisher slots in here.
#pragma once

#include <cstdint>
#include <memory>

#include "sim/sequence.h"

namespace kvgate::sim {

struct RankLoad {
  int dp_rank = 0;
  int64_t running = 0;      // requests in the running batch (prefill or decode)
  int64_t waiting = 0;      // requests queued for admission
  int64_t used_tokens = 0;  // KV slots held by running requests (+ cached pages, with a cache)
  int64_t max_total_tokens = 0;
  double cache_hit_rate = 0;  // cached / prompt tokens of admitted requests
  double token_usage() const {
    return max_total_tokens > 0 ? static_cast<double>(used_tokens) / max_total_tokens : 0;
  }
};

class Scheduler {
 public:
  virtual ~Scheduler() = default;
  // Takes a new sequence and runs it to its end (finish or cancel). Thread-safe.
  virtual void submit(std::shared_ptr<Sequence> seq) = 0;
  // A consistent-enough snapshot of the rank's load. Thread-safe.
  virtual RankLoad load() const = 0;
  // Empties the KV cache. Returns false (and does nothing) while requests run or wait.
  virtual bool flush_cache() = 0;
};

}  // namespace kvgate::sim
