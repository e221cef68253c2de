// sim/batch_scheduler: continuous batching, as SGLang's scheduler loop runs one DP rank. Each step
// prefills up to --chunked-prefill-size uncached prompt tokens (a long prompt is chunked over
// several steps; prefix-cache hits cost nothing) and decodes one token for every running request;
// it lasts step_fixed + per_prefill_token * prefilled + per_running_request * batch, times
// --time-scale. New requests wait in a FIFO queue and are admitted while the running batch is under
// --max-running-requests and their KV (uncached prompt + max_new_tokens) fits in free plus
// evictable cache, so no running request ever has to be retracted. Pages are inserted into the
// radix cache as prefill completes them and, with the generated tokens, when a request finishes;
// the KV events of one step go out as one batch.
//
// BatchCore is the logic with explicit time (unit-testable, not thread-safe); BatchScheduler runs
// it on its own thread, sleeping for each step's duration.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>
#include <vector>

#include "sim/scheduler.h"

namespace kvgate::sim {

struct BatchTiming {
  std::chrono::nanoseconds step_fixed{std::chrono::milliseconds(8)};
  std::chrono::nanoseconds per_prefill_token{std::chrono::microseconds(55)};
  std::chrono::nanoseconds per_running_request{std::chrono::microseconds(150)};
  double time_scale = 1.0;
};

struct BatchLimits {
  int64_t chunked_prefill_size = 8192;  // <= 0: a whole prompt in one step
  int64_t max_running_requests = 256;
};

class BatchCore {
 public:
  BatchCore(const RankSetup& setup, BatchTiming timing, BatchLimits limits);
  ~BatchCore();
  BatchCore(const BatchCore&) = delete;
  BatchCore& operator=(const BatchCore&) = delete;

  void enqueue(std::shared_ptr<Sequence> seq);
  // Plans the step starting at `now`: drops cancelled requests, continues chunked prefills, admits
  // waiting requests, allocates KV. Returns the step's (scaled) duration, or nullopt when there is
  // nothing to compute.
  std::optional<Clock::duration> begin_step(Clock::time_point now);
  // Completes the planned step: prefill progress, one token per decoding request, cache inserts;
  // publishes the step's KV events as one batch, then wakes the requests that moved.
  void end_step(Clock::time_point now);
  // PD prefill role: when the earliest KV transfer ends; completes the transfers due at `now`.
  std::optional<Clock::time_point> next_transfer() const;
  void complete_transfers(Clock::time_point now);
  // Publishes the KV events recorded since the last call as one batch, then wakes the requests
  // whose tokens were held back for it.
  void publish_events();

  bool has_requests() const;
  size_t waiting() const { return waiting_.size(); }
  bool flush_cache();
  RankLoad load() const;
  // Ends every request with an abort (shutdown).
  void abort_all(std::string_view message);
  RadixCache& cache() { return cache_; }
  uint64_t steps() const { return steps_; }

  struct Req;

 private:
  void emit(Req& r, Clock::time_point now);
  void finish(Req& r, Clock::time_point now, bool completed);
  int64_t reserved() const;
  void reap_cancelled();
  void fail(Req& r, std::string_view message);

  RankSetup setup_;
  BatchTiming timing_;
  BatchLimits limits_;
  RadixCache cache_;
  std::deque<std::unique_ptr<Req>> waiting_;
  std::vector<std::unique_ptr<Req>> running_;  // admission order
  std::vector<std::unique_ptr<Req>> transferring_;
  struct Plan {
    std::vector<std::pair<Req*, int64_t>> prefill;  // request, chunk
    std::vector<Req*> decode;
  } plan_;
  std::vector<std::shared_ptr<Sequence>> woken_;  // to notify after the step's events
  uint64_t steps_ = 0;
  int64_t prompt_seen_ = 0;  // admitted prompt tokens (hit rate)
  int64_t cached_seen_ = 0;
};

class BatchScheduler final : public Scheduler {
 public:
  BatchScheduler(const RankSetup& setup, BatchTiming timing, BatchLimits limits);
  ~BatchScheduler() override;
  void submit(std::shared_ptr<Sequence> seq) override;
  RankLoad load() const override;
  int64_t waiting() const override;
  bool flush_cache() override;
  void stop() override;

 private:
  void run();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool new_work_ = false;
  BatchCore core_;
  std::thread thread_;
};

}  // namespace kvgate::sim
