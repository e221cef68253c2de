// gateway/retry: see retry.h.
#include "gateway/retry.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <ctime>
#include <string>

namespace kvgate {

std::chrono::milliseconds backoff_delay(const RetryConfig& c, int retry, double u) {
  double base = static_cast<double>(c.initial_backoff.count()) * std::pow(c.multiplier, retry);
  base = std::min(base, static_cast<double>(c.max_backoff.count()));
  double spread = 1.0 + c.jitter * (2.0 * u - 1.0);
  double ms = std::max(0.0, base * spread);
  return std::chrono::milliseconds(static_cast<int64_t>(std::llround(ms)));
}

std::optional<std::chrono::milliseconds> parse_retry_after(
    std::string_view v, std::chrono::system_clock::time_point now) {
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
  if (v.empty()) return std::nullopt;
  constexpr int64_t kMaxSecs = 365ll * 24 * 3600;  // a longer wait is a year's wait
  if (v.front() >= '0' && v.front() <= '9') {
    uint64_t secs = 0;
    auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), secs);
    if (ec == std::errc::result_out_of_range) return std::chrono::seconds(kMaxSecs);
    if (ec != std::errc() || p != v.data() + v.size()) return std::nullopt;
    secs = std::min<uint64_t>(secs, kMaxSecs);
    return std::chrono::seconds(secs);
  }
  // IMF-fixdate: "Sun, 06 Nov 1994 08:49:37 GMT".
  std::tm tm{};
  std::string text(v);
  const char* end = ::strptime(text.c_str(), "%a, %d %b %Y %H:%M:%S GMT", &tm);
  if (end == nullptr || *end != '\0') return std::nullopt;
  // Compared in milliseconds, not as a time_point: strptime takes years up to 9999, past what
  // system_clock's nanoseconds hold (2262), and the conversion would overflow.
  int64_t when_ms = static_cast<int64_t>(::timegm(&tm)) * 1000;
  int64_t now_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count();
  if (when_ms <= now_ms) return std::chrono::milliseconds(0);
  return std::chrono::milliseconds(std::min(when_ms - now_ms, kMaxSecs * 1000));
}

int64_t RetryBudget::allowed() const {
  auto requests = static_cast<double>(requests_.load(std::memory_order_relaxed));
  return std::max(min_, static_cast<int64_t>(requests * percent_ / 100.0));
}

bool RetryBudget::try_acquire() {
  int64_t limit = allowed();
  int64_t now = retries_.fetch_add(1, std::memory_order_relaxed);
  if (now < limit) return true;
  retries_.fetch_sub(1, std::memory_order_relaxed);
  return false;
}

}  // namespace kvgate
