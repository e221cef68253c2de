// workers/circuit_breaker: per-worker breaker. Closed -> Open after N consecutive failures;
// Open -> HalfOpen once the open timeout has passed; in HalfOpen only trial requests pass, one at a
// time: M consecutive successful trials close it, a failed trial opens it again. Every request the
// breaker lets through must be reported exactly once (success, failure, or neutral: the request
// said nothing about the worker's health, e.g. the client went away), so a trial slot is never
// lost. Closed is the common state and costs one atomic load per check; the rarer transitions take
// a small lock. Safe from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string_view>

namespace kvgate {

// Built by breaker_config() (gateway/knobs.h) from the knob table, which holds the defaults.
// Default-constructed: no breaker.
struct BreakerConfig {
  bool enabled = false;
  uint32_t failure_threshold = 0;
  uint32_t success_threshold = 0;
  std::chrono::milliseconds open_timeout{0};
  bool operator==(const BreakerConfig&) const = default;
};

enum class BreakerState : uint8_t { kClosed = 0, kOpen = 1, kHalfOpen = 2 };
std::string_view to_string(BreakerState s);

class CircuitBreaker {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  // An enabled breaker needs thresholds of at least 1 (aborts otherwise: a config not built by
  // breaker_config() is a programming error).
  explicit CircuitBreaker(BreakerConfig config);

  // What admit() granted: a normal pass, or the half-open trial slot (report it!).
  enum class Pass : uint8_t { kDenied, kNormal, kTrial };

  // Could a request pass now (no side effect on the trial slot; use to list candidates)?
  bool could_pass(TimePoint now) const;
  // Lets one request through, taking the trial slot when half-open. Moves Open -> HalfOpen when
  // the open timeout has passed. Every non-denied pass must be followed by exactly one record_*.
  Pass admit(TimePoint now);
  // Outcomes. Return the new state when this call changed it.
  std::optional<BreakerState> record_success(Pass pass);
  std::optional<BreakerState> record_failure(Pass pass, TimePoint now);
  void record_neutral(Pass pass);

  BreakerState state() const { return static_cast<BreakerState>(state_.load()); }
  // Open: the time could_pass() turns true by the clock alone (the open timeout's end); nullopt
  // in any other state (every other change happens in a call above).
  std::optional<TimePoint> passes_from() const;
  const BreakerConfig& config() const { return config_; }

 private:
  BreakerConfig config_;
  std::atomic<uint8_t> state_{0};
  std::atomic<uint32_t> failures_{0};  // consecutive, while closed
  mutable std::mutex mu_;              // transitions and the half-open fields below
  uint32_t successes_ = 0;             // consecutive successful trials, while half-open
  bool trial_in_flight_ = false;
  TimePoint opened_at_{};
};

}  // namespace kvgate
