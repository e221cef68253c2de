// sim/fixed_delay_scheduler: the simplest Scheduler: every sequence gets its first token --ttft-ms
// after arrival and one more every --tpot-ms, independently of the others (no batching, no queue;
// times shrink with --time-scale). It keeps the rank's radix cache all the same, so cached_tokens
// and KV events are truthful: a request matches the cache on arrival, inserts its prompt pages
// when its prefill (the TTFT) ends, and prompt + output when it finishes. Each sequence runs as a
// coroutine on its request's executor, so a client disconnect stops its timer at once; the cache
// is shared by those executors under a mutex.
#pragma once

#include <atomic>
#include <chrono>
#include <mutex>

#include "sim/scheduler.h"

namespace kvgate::sim {

struct FixedDelayTiming {
  std::chrono::nanoseconds ttft{std::chrono::milliseconds(20)};
  std::chrono::nanoseconds tpot{std::chrono::milliseconds(5)};
};

class FixedDelayScheduler final : public Scheduler {
 public:
  // `timing` is already scaled by --time-scale.
  FixedDelayScheduler(const RankSetup& setup, FixedDelayTiming timing);
  void submit(std::shared_ptr<Sequence> seq) override;
  RankLoad load() const override;
  bool flush_cache() override;

 private:
  awaitable<void> run(std::shared_ptr<Sequence> seq);
  // Under mu_: admission (match + KV for the prompt), prefill done, one token, the end.
  RadixCache::Handle admit(const Sequence& seq);
  void prefilled(RadixCache::Handle& h, const Sequence& seq);
  void grow(RadixCache::Handle& h);
  void release(RadixCache::Handle& h, const Sequence& seq, bool computed);

  const RankSetup setup_;
  const FixedDelayTiming timing_;
  mutable std::mutex mu_;
  RadixCache cache_;
  int64_t prompt_seen_ = 0;
  int64_t cached_seen_ = 0;
  std::atomic<int64_t> running_{0};
};

}  // namespace kvgate::sim
