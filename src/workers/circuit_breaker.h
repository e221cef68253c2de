// workers/circuit_breaker: per-worker breaker. Closed -> Open after N consecutive failures;
// Open -> HalfOpen once the open timeout has passed (checked lazily by allow()); HalfOpen -> Closed
// after M consecutive successes, HalfOpen -> Open on any failure. Lock-free; all methods are safe
// from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string_view>

namespace kvgate {

struct BreakerConfig {
  bool enabled = true;
  uint32_t failure_threshold = 10;
  uint32_t success_threshold = 3;
  std::chrono::milliseconds open_timeout{60000};
};

enum class BreakerState : uint8_t { kClosed = 0, kOpen = 1, kHalfOpen = 2 };
std::string_view to_string(BreakerState s);

class CircuitBreaker {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  explicit CircuitBreaker(BreakerConfig config = {}) : config_(config) {}

  // May a request be sent now? Moves Open -> HalfOpen when the timeout has passed.
  bool allow(TimePoint now);
  // Outcome of a request. Return the new state when this call changed it.
  std::optional<BreakerState> record_success();
  std::optional<BreakerState> record_failure(TimePoint now);

  BreakerState state() const { return static_cast<BreakerState>(state_.load()); }
  const BreakerConfig& config() const { return config_; }

 private:
  BreakerConfig config_;
  std::atomic<uint8_t> state_{0};
  std::atomic<uint32_t> failures_{0};
  std::atomic<uint32_t> successes_{0};
  std::atomic<int64_t> opened_at_ns_{0};
};

}  // namespace kvgate
