// workers/circuit_breaker: see circuit_breaker.h.
#include "workers/circuit_breaker.h"

namespace kvgate {

std::string_view to_string(BreakerState s) {
  switch (s) {
    case BreakerState::kClosed:
      return "closed";
    case BreakerState::kOpen:
      return "open";
    case BreakerState::kHalfOpen:
      return "half_open";
  }
  return "unknown";
}

bool CircuitBreaker::allow(TimePoint now) {
  if (!config_.enabled) return true;
  auto s = static_cast<BreakerState>(state_.load(std::memory_order_acquire));
  if (s != BreakerState::kOpen) return true;
  int64_t opened = opened_at_ns_.load(std::memory_order_acquire);
  int64_t now_ns = now.time_since_epoch().count();
  auto timeout_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(config_.open_timeout).count();
  if (now_ns - opened < timeout_ns) return false;
  uint8_t expected = static_cast<uint8_t>(BreakerState::kOpen);
  if (state_.compare_exchange_strong(expected, static_cast<uint8_t>(BreakerState::kHalfOpen))) {
    successes_.store(0);
  }
  return true;
}

std::optional<BreakerState> CircuitBreaker::record_success() {
  if (!config_.enabled) return std::nullopt;
  failures_.store(0, std::memory_order_relaxed);
  auto s = static_cast<BreakerState>(state_.load(std::memory_order_acquire));
  if (s != BreakerState::kHalfOpen) return std::nullopt;
  if (successes_.fetch_add(1) + 1 >= config_.success_threshold) {
    uint8_t expected = static_cast<uint8_t>(BreakerState::kHalfOpen);
    if (state_.compare_exchange_strong(expected, static_cast<uint8_t>(BreakerState::kClosed))) {
      successes_.store(0);
      return BreakerState::kClosed;
    }
  }
  return std::nullopt;
}

std::optional<BreakerState> CircuitBreaker::record_failure(TimePoint now) {
  if (!config_.enabled) return std::nullopt;
  successes_.store(0, std::memory_order_relaxed);
  auto s = static_cast<BreakerState>(state_.load(std::memory_order_acquire));
  if (s == BreakerState::kOpen) return std::nullopt;
  bool trip =
      s == BreakerState::kHalfOpen || failures_.fetch_add(1) + 1 >= config_.failure_threshold;
  if (!trip) return std::nullopt;
  uint8_t expected = static_cast<uint8_t>(s);
  opened_at_ns_.store(now.time_since_epoch().count(), std::memory_order_release);
  if (state_.compare_exchange_strong(expected, static_cast<uint8_t>(BreakerState::kOpen))) {
    failures_.store(0);
    return BreakerState::kOpen;
  }
  return std::nullopt;
}

}  // namespace kvgate
