// workers/circuit_breaker: see circuit_breaker.h.
#include "workers/circuit_breaker.h"

#include <cstdio>
#include <cstdlib>

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

CircuitBreaker::CircuitBreaker(BreakerConfig config) : config_(config) {
  if (config_.enabled && (config_.failure_threshold == 0 || config_.success_threshold == 0)) {
    std::fprintf(stderr, "kvgate: CircuitBreaker given an incomplete BreakerConfig\n");
    std::abort();
  }
}

bool CircuitBreaker::could_pass(TimePoint now) const {
  if (!config_.enabled) return true;
  if (state() == BreakerState::kClosed) return true;
  std::lock_guard lock(mu_);
  switch (state()) {
    case BreakerState::kClosed:
      return true;
    case BreakerState::kOpen:
      return now - opened_at_ >= config_.open_timeout;
    case BreakerState::kHalfOpen:
      return !trial_in_flight_;
  }
  return false;
}

std::optional<CircuitBreaker::TimePoint> CircuitBreaker::passes_from() const {
  if (!config_.enabled || state() != BreakerState::kOpen) return std::nullopt;
  std::lock_guard lock(mu_);
  if (state() != BreakerState::kOpen) return std::nullopt;
  return opened_at_ + config_.open_timeout;
}

CircuitBreaker::Pass CircuitBreaker::admit(TimePoint now) {
  if (!config_.enabled || state() == BreakerState::kClosed) return Pass::kNormal;
  std::lock_guard lock(mu_);
  auto s = state();
  if (s == BreakerState::kClosed) return Pass::kNormal;
  if (s == BreakerState::kOpen) {
    if (now - opened_at_ < config_.open_timeout) return Pass::kDenied;
    state_.store(static_cast<uint8_t>(BreakerState::kHalfOpen));
    successes_ = 0;
    trial_in_flight_ = false;
  }
  if (trial_in_flight_) return Pass::kDenied;
  trial_in_flight_ = true;
  return Pass::kTrial;
}

std::optional<BreakerState> CircuitBreaker::record_success(Pass pass) {
  if (!config_.enabled || pass == Pass::kDenied) return std::nullopt;
  failures_.store(0, std::memory_order_relaxed);
  if (pass != Pass::kTrial) return std::nullopt;  // a request let through before it opened
  std::lock_guard lock(mu_);
  trial_in_flight_ = false;
  if (state() != BreakerState::kHalfOpen) return std::nullopt;
  if (++successes_ < config_.success_threshold) return std::nullopt;
  successes_ = 0;
  state_.store(static_cast<uint8_t>(BreakerState::kClosed));
  return BreakerState::kClosed;
}

std::optional<BreakerState> CircuitBreaker::record_failure(Pass pass, TimePoint now) {
  if (!config_.enabled || pass == Pass::kDenied) return std::nullopt;
  if (pass == Pass::kTrial) {
    std::lock_guard lock(mu_);
    trial_in_flight_ = false;
    if (state() != BreakerState::kHalfOpen) return std::nullopt;
    state_.store(static_cast<uint8_t>(BreakerState::kOpen));
    opened_at_ = now;
    successes_ = 0;
    return BreakerState::kOpen;
  }
  if (state() != BreakerState::kClosed) return std::nullopt;  // already open: nothing to add
  if (failures_.fetch_add(1, std::memory_order_relaxed) + 1 < config_.failure_threshold) {
    return std::nullopt;
  }
  std::lock_guard lock(mu_);
  if (state() != BreakerState::kClosed) return std::nullopt;
  state_.store(static_cast<uint8_t>(BreakerState::kOpen));
  opened_at_ = now;
  failures_.store(0, std::memory_order_relaxed);
  return BreakerState::kOpen;
}

void CircuitBreaker::record_neutral(Pass pass) {
  if (!config_.enabled || pass != Pass::kTrial) return;
  std::lock_guard lock(mu_);
  trial_in_flight_ = false;
}

}  // namespace kvgate
