// gateway/retry: see retry.h.
#include "gateway/retry.h"

#include <algorithm>
#include <cmath>

namespace kvgate {

std::chrono::milliseconds backoff_delay(const RetryConfig& c, int retry, double u) {
  double base = static_cast<double>(c.initial_backoff.count()) * std::pow(c.multiplier, retry);
  base = std::min(base, static_cast<double>(c.max_backoff.count()));
  double spread = 1.0 + c.jitter * (2.0 * u - 1.0);
  double ms = std::max(0.0, base * spread);
  return std::chrono::milliseconds(static_cast<int64_t>(std::llround(ms)));
}

}  // namespace kvgate
