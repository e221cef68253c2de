// gateway/retry: when another attempt is allowed, and how long to wait before it.
//
// Retry safety (Pingora's rule, kept here once): after a connect failure a retry is always safe;
// after the request was sent, only when the worker provably did not start it (it was not written
// whole, or the worker refused it with 408/429/503 or aborted it before any output); never after
// the first byte of the response reached the client. A reset after the whole request was written
// is not retried: the worker may be generating, and a second attempt could run it twice.
//
// Retries are budgeted (Envoy's retry budget): retries in progress may be at most
// max(--retry-budget-min-concurrency, --retry-budget-percent of the requests in progress), so an
// overloaded fleet is not hit by a retry storm. A Retry-After the worker sends is honoured: the
// next attempt waits at least that long, and when that is too long (past the request deadline or
// --retry-max-backoff-ms) the worker's own answer goes to the client.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string_view>

namespace kvgate {

// Built by retry_config() (gateway/knobs.h) from the knob table, which holds the defaults.
struct RetryConfig {
  int max_attempts = 1;  // total attempts, the first included (1 = no retries)
  std::chrono::milliseconds initial_backoff{0};
  std::chrono::milliseconds max_backoff{0};
  double multiplier = 1;
  double jitter = 0;
  double budget_percent = 0;  // retries in progress, as a percentage of requests in progress
  int64_t budget_min_concurrency = 0;  // retries always allowed in progress at once
  bool operator==(const RetryConfig&) const = default;
};

// Delay before retry number `retry` (0 = the first retry): min(initial * multiplier^retry, max),
// spread by +-jitter using `u` uniform in [0, 1).
std::chrono::milliseconds backoff_delay(const RetryConfig& c, int retry, double u);

// Upstream statuses worth another attempt: 408, 429, 502, 503 (the worker refused or could not
// take the request) and 500 (it ran and failed: retried once, on another worker). Not 504 (which
// sgl-model-gateway retries): whatever timed out, the request may still be running behind it.
constexpr bool retryable_status(int status) {
  return status == 408 || status == 429 || status == 500 || status == 502 || status == 503;
}

// Statuses with which a worker says it did not run the request (it refused or could not take it):
// the prompt was not computed there.
constexpr bool refused_status(int status) {
  return status == 408 || status == 429 || status == 502 || status == 503;
}

// A Retry-After value: delay-seconds, or an HTTP-date relative to `now`. nullopt when malformed.
std::optional<std::chrono::milliseconds> parse_retry_after(
    std::string_view value, std::chrono::system_clock::time_point now);

// Envoy-style retry budget, shared by all request threads.
class RetryBudget {
 public:
  explicit RetryBudget(const RetryConfig& c)
      : percent_(c.budget_percent), min_(c.budget_min_concurrency) {}
  // A request in progress (counts toward the budget's base).
  void request_started() { requests_.fetch_add(1, std::memory_order_relaxed); }
  void request_ended() { requests_.fetch_sub(1, std::memory_order_relaxed); }
  // Takes a retry slot if the budget allows one now; release it when the retry attempt ends.
  bool try_acquire();
  void release() { retries_.fetch_sub(1, std::memory_order_relaxed); }
  int64_t retries_in_progress() const { return retries_.load(std::memory_order_relaxed); }
  int64_t allowed() const;

 private:
  double percent_;
  int64_t min_;
  std::atomic<int64_t> requests_{0};
  std::atomic<int64_t> retries_{0};
};

}  // namespace kvgate
