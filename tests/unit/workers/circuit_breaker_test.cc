// Tests for workers/circuit_breaker: every transition and its thresholds.
#include "workers/circuit_breaker.h"

#include <gtest/gtest.h>

namespace kvgate {
namespace {

using namespace std::chrono_literals;
using TP = CircuitBreaker::TimePoint;

BreakerConfig cfg(uint32_t fail, uint32_t succ, std::chrono::milliseconds timeout) {
  BreakerConfig c;
  c.failure_threshold = fail;
  c.success_threshold = succ;
  c.open_timeout = timeout;
  return c;
}

TEST(CircuitBreaker, OpensAfterConsecutiveFailures) {
  CircuitBreaker b(cfg(3, 2, 1000ms));
  TP t0{};
  EXPECT_FALSE(b.record_failure(t0));
  EXPECT_FALSE(b.record_failure(t0));
  EXPECT_EQ(b.state(), BreakerState::kClosed);
  EXPECT_EQ(b.record_failure(t0), BreakerState::kOpen);
  EXPECT_FALSE(b.allow(t0 + 999ms));
}

TEST(CircuitBreaker, SuccessResetsTheFailureCount) {
  CircuitBreaker b(cfg(3, 2, 1000ms));
  TP t0{};
  b.record_failure(t0);
  b.record_failure(t0);
  b.record_success();
  b.record_failure(t0);
  b.record_failure(t0);
  EXPECT_EQ(b.state(), BreakerState::kClosed);
}

TEST(CircuitBreaker, HalfOpenAfterTimeoutThenClosesAfterSuccesses) {
  CircuitBreaker b(cfg(1, 2, 1000ms));
  TP t0{};
  b.record_failure(t0);
  ASSERT_EQ(b.state(), BreakerState::kOpen);
  EXPECT_TRUE(b.allow(t0 + 1000ms));
  EXPECT_EQ(b.state(), BreakerState::kHalfOpen);
  EXPECT_FALSE(b.record_success());
  EXPECT_EQ(b.record_success(), BreakerState::kClosed);
  EXPECT_TRUE(b.allow(t0 + 1001ms));
}

TEST(CircuitBreaker, FailureInHalfOpenReopens) {
  CircuitBreaker b(cfg(5, 3, 1000ms));
  TP t0{};
  for (int i = 0; i < 5; ++i) b.record_failure(t0);
  ASSERT_TRUE(b.allow(t0 + 2000ms));
  b.record_success();
  EXPECT_EQ(b.record_failure(t0 + 2000ms), BreakerState::kOpen);
  EXPECT_FALSE(b.allow(t0 + 2500ms));
  EXPECT_TRUE(b.allow(t0 + 3000ms));
}

TEST(CircuitBreaker, DisabledNeverOpens) {
  BreakerConfig c = cfg(1, 1, 1000ms);
  c.enabled = false;
  CircuitBreaker b(c);
  for (int i = 0; i < 10; ++i) b.record_failure(TP{});
  EXPECT_TRUE(b.allow(TP{}));
  EXPECT_EQ(b.state(), BreakerState::kClosed);
}

}  // namespace
}  // namespace kvgate
