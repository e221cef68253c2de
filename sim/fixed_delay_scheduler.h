// sim/fixed_delay_scheduler: the simplest Scheduler: every sequence gets its first token --ttft-ms
// after arrival and one more every --tpot-ms, independently of the others (no batching, no queue,
// no cache: cached_tokens is 0). Each sequence runs as a coroutine on its request's executor, so a
// client disconnect stops its timer at once.
#pragma once

#include <atomic>
#include <chrono>

#include "sim/scheduler.h"
#include "sim/sim_metrics.h"

namespace kvgate::sim {

struct FixedDelayTiming {
  std::chrono::nanoseconds ttft{std::chrono::milliseconds(20)};
  std::chrono::nanoseconds tpot{std::chrono::milliseconds(5)};
};

class FixedDelayScheduler final : public Scheduler {
 public:
  FixedDelayScheduler(int dp_rank, FixedDelayTiming timing, int64_t max_total_tokens,
                      RankMetrics& metrics);
  void submit(std::shared_ptr<Sequence> seq) override;
  RankLoad load() const override;
  bool flush_cache() override;

 private:
  awaitable<void> run(std::shared_ptr<Sequence> seq);
  void release(const Sequence& seq);

  const int dp_rank_;
  const FixedDelayTiming timing_;
  const int64_t max_total_tokens_;
  RankMetrics& metrics_;
  std::atomic<int64_t> running_{0};
  std::atomic<int64_t> used_tokens_{0};
};

}  // namespace kvgate::sim
