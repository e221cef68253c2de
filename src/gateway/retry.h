// gateway/retry: when and how long to wait before trying again. Retries happen only before the
// first response byte reaches the client; each retry selects a worker again.
#pragma once

#include <chrono>

namespace kvgate {

struct RetryConfig {
  int max_attempts = 5;  // total attempts, the first included (1 = no retries)
  std::chrono::milliseconds initial_backoff{50};
  std::chrono::milliseconds max_backoff{30000};
  double multiplier = 1.5;
  double jitter = 0.2;
};

// Delay before retry number `retry` (0 = the first retry): min(initial * multiplier^retry, max),
// spread by +-jitter using `u` uniform in [0, 1).
std::chrono::milliseconds backoff_delay(const RetryConfig& c, int retry, double u);

// Upstream statuses worth another attempt: 408, 429, 500, 502, 503, 504.
constexpr bool retryable_status(int status) {
  return status == 408 || status == 429 || status == 500 || status == 502 || status == 503 ||
         status == 504;
}

}  // namespace kvgate
