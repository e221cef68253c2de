// gateway/admission: a global limit on requests proxied at once (--max-concurrent-requests) with
// a bounded FIFO queue (--queue-size) and a queue timeout (--queue-timeout-secs). Shared by all
// request threads; a freed slot is handed directly to the oldest waiter. A waiter whose client
// went away is cancelled and leaves the queue at once.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>

#include "http/io.h"

namespace kvgate {

class Admission {
 public:
  enum class Result { kAdmitted, kQueueFull, kTimeout, kCancelled };
  struct Waiter {
    explicit Waiter(const Executor& ex) : executor(ex), timer(ex) {}
    Executor executor;
    Timer timer;
    bool granted = false;
    bool cancelled = false;
  };

  Admission(int64_t max_concurrent, size_t queue_size, std::chrono::milliseconds queue_timeout);
  bool enabled() const { return max_ > 0; }
  // By value: a coroutine must not keep references to its caller's temporaries. While queued,
  // `*handle` (when given) holds the waiter, for cancel(); it is reset when acquire returns.
  awaitable<Result> acquire(Executor ex,  // NOLINT(performance-unnecessary-value-param)
                            std::shared_ptr<Waiter>* handle = nullptr);
  // Takes a queued waiter out (its acquire returns kCancelled); from the waiter's executor. A
  // waiter already granted a slot keeps it (its caller releases it).
  void cancel(const std::shared_ptr<Waiter>& w);
  void release();
  int64_t active() const;
  size_t queued() const;
  size_t queue_size() const { return queue_size_; }
  std::chrono::milliseconds queue_timeout() const { return timeout_; }

 private:
  int64_t max_;
  size_t queue_size_;
  std::chrono::milliseconds timeout_;
  mutable std::mutex mu_;
  int64_t active_ = 0;
  std::deque<std::shared_ptr<Waiter>> waiters_;
};

}  // namespace kvgate
