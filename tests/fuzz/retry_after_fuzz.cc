// Fuzz target: parse_retry_after (gateway/retry), which reads a worker's Retry-After header
// (untrusted): delay-seconds or an HTTP-date. Checks: whatever parses is a delay of zero to 365
// days, however far the date or large the number, for a clock at the epoch, today or far ahead.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "gateway/retry.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace std::chrono;
  std::string_view value(reinterpret_cast<const char*>(data), size);
  constexpr auto kMax = hours(24 * 365);
  for (int64_t now_s :
       {int64_t{0}, int64_t{1735689600} /* 2025-01-01 */, int64_t{4102444800} /* 2100-01-01 */}) {
    system_clock::time_point now{seconds(now_s)};
    auto delay = kvgate::parse_retry_after(value, now);
    if (delay && (delay->count() < 0 || *delay > kMax)) __builtin_trap();
  }
  return 0;
}
