// Tests for gateway/retry: backoff growth, cap and jitter bounds; retryable statuses.
#include "gateway/retry.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "gateway/knobs.h"

namespace kvgate {
namespace {

using std::chrono::milliseconds;

TEST(Retry, BackoffGrowsAndCaps) {
  RetryConfig c = retry_config(GatewayConfig{});  // 50 ms * 1.5^n, cap 30 s, jitter 0.2
  EXPECT_EQ(backoff_delay(c, 0, 0.5), milliseconds(50));
  EXPECT_EQ(backoff_delay(c, 1, 0.5), milliseconds(75));
  EXPECT_EQ(backoff_delay(c, 2, 0.5), milliseconds(113));  // 112.5 rounded
  EXPECT_EQ(backoff_delay(c, 40, 0.5), milliseconds(30000));
}

TEST(Retry, JitterStaysWithinFactor) {
  RetryConfig c = retry_config(GatewayConfig{});
  EXPECT_EQ(backoff_delay(c, 0, 0.0), milliseconds(40));       // -20%
  EXPECT_EQ(backoff_delay(c, 0, 0.999999), milliseconds(60));  // +20%
  c.jitter = 0;
  EXPECT_EQ(backoff_delay(c, 3, 0.0), backoff_delay(c, 3, 0.99));
}

TEST(Retry, RetryableStatuses) {
  for (int s : {408, 429, 500, 502, 503}) EXPECT_TRUE(retryable_status(s)) << s;
  // 504: the request may still be running behind what timed out.
  for (int s : {200, 400, 401, 404, 413, 501, 504}) EXPECT_FALSE(retryable_status(s)) << s;
  // Refusals say the worker did not run the request; 500 and 504 say it ran (and failed).
  for (int s : {408, 429, 502, 503}) EXPECT_TRUE(refused_status(s)) << s;
  for (int s : {500, 504, 200}) EXPECT_FALSE(refused_status(s)) << s;
}

TEST(Retry, RetryAfterSecondsAndDates) {
  auto now = std::chrono::system_clock::from_time_t(784111777);  // Sun, 06 Nov 1994 08:49:37 GMT
  EXPECT_EQ(parse_retry_after("120", now), milliseconds(120000));
  EXPECT_EQ(parse_retry_after(" 0 ", now), milliseconds(0));
  EXPECT_EQ(parse_retry_after("Sun, 06 Nov 1994 08:49:47 GMT", now), milliseconds(10000));
  EXPECT_EQ(parse_retry_after("Sun, 06 Nov 1994 08:49:00 GMT", now), milliseconds(0));  // past
  EXPECT_EQ(parse_retry_after("99999999999999999999999", now),
            std::chrono::duration_cast<milliseconds>(std::chrono::hours(24 * 365)));
  // Dates are capped like seconds: a year ahead at most, even past what system_clock holds (2262).
  for (const char* far : {"Mon, 06 Nov 1995 08:49:38 GMT", "Fri, 31 Dec 9999 23:59:59 GMT"}) {
    EXPECT_EQ(parse_retry_after(far, now),
              std::chrono::duration_cast<milliseconds>(std::chrono::hours(24 * 365)))
        << far;
  }
  for (const char* bad : {"", "soon", "-5", "12abc", "Sun, 06 Nov 1994"}) {
    EXPECT_FALSE(parse_retry_after(bad, now)) << bad;
  }
}

TEST(Retry, BudgetAllowsAPercentageOfActiveRequestsWithAFloor) {
  RetryConfig c = retry_config(GatewayConfig{});
  c.budget_percent = 20;
  c.budget_min_concurrency = 3;
  RetryBudget b(c);
  // With few requests in progress, the floor decides: 3 retries at once, not a 4th.
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(b.try_acquire());
  EXPECT_FALSE(b.try_acquire());
  EXPECT_EQ(b.retries_in_progress(), 3);
  b.release();
  EXPECT_TRUE(b.try_acquire());
  for (int i = 0; i < 3; ++i) b.release();
  // 100 requests in progress: 20% of them may be retrying.
  for (int i = 0; i < 100; ++i) b.request_started();
  int granted = 0;
  while (b.try_acquire()) ++granted;
  EXPECT_EQ(granted, 20);
  EXPECT_EQ(b.allowed(), 20);
}

TEST(Retry, ZeroBudgetMeansNoRetries) {
  RetryConfig c = retry_config(GatewayConfig{});
  c.budget_percent = 0;
  c.budget_min_concurrency = 0;
  RetryBudget b(c);
  for (int i = 0; i < 10; ++i) b.request_started();
  EXPECT_FALSE(b.try_acquire());
}

// Request threads take and give back retry slots while others start and end requests and the
// control thread reads the gauges (make check-tsan watches the interleaving). Every slot taken is
// given back: nothing leaks.
TEST(Retry, BudgetSharedByRequestThreads) {
  RetryConfig c = retry_config(GatewayConfig{});
  c.budget_percent = 50;
  c.budget_min_concurrency = 2;
  RetryBudget b(c);
  std::atomic<int> running{4};
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&] {
      for (int i = 0; i < 5000; ++i) {
        b.request_started();
        if (b.try_acquire()) b.release();
        b.request_ended();
      }
      running.fetch_sub(1);
    });
  }
  while (running.load() > 0) {
    EXPECT_GE(b.allowed(), 2);
    EXPECT_GE(b.retries_in_progress(), 0);
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(b.retries_in_progress(), 0);
  EXPECT_EQ(b.allowed(), 2);
}

}  // namespace
}  // namespace kvgate
