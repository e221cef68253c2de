// Tests for gateway/retry: backoff growth, cap and jitter bounds; retryable statuses.
#include "gateway/retry.h"

#include <gtest/gtest.h>

namespace kvgate {
namespace {

using std::chrono::milliseconds;

TEST(Retry, BackoffGrowsAndCaps) {
  RetryConfig c;  // 50 ms * 1.5^n, cap 30 s, jitter 0.2
  EXPECT_EQ(backoff_delay(c, 0, 0.5), milliseconds(50));
  EXPECT_EQ(backoff_delay(c, 1, 0.5), milliseconds(75));
  EXPECT_EQ(backoff_delay(c, 2, 0.5), milliseconds(113));  // 112.5 rounded
  EXPECT_EQ(backoff_delay(c, 40, 0.5), milliseconds(30000));
}

TEST(Retry, JitterStaysWithinFactor) {
  RetryConfig c;
  EXPECT_EQ(backoff_delay(c, 0, 0.0), milliseconds(40));       // -20%
  EXPECT_EQ(backoff_delay(c, 0, 0.999999), milliseconds(60));  // +20%
  c.jitter = 0;
  EXPECT_EQ(backoff_delay(c, 3, 0.0), backoff_delay(c, 3, 0.99));
}

TEST(Retry, RetryableStatuses) {
  for (int s : {408, 429, 500, 502, 503, 504}) EXPECT_TRUE(retryable_status(s)) << s;
  for (int s : {200, 400, 401, 404, 413, 501}) EXPECT_FALSE(retryable_status(s)) << s;
}

}  // namespace
}  // namespace kvgate
