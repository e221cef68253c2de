// Fuzz target: UsageScanner (gateway/usage_scanner), which reads cached_tokens, prompt_tokens (or
// input_tokens) and completion_tokens (or output_tokens) out of worker response bodies (untrusted)
// as they are relayed, in whatever pieces reads deliver. The first byte seeds the piece sizes.
// Checks: values are non-negative; fed in pieces, the scanner finds what it finds in the whole
// body, for every value short enough for its carry (a key, spaces and digits within 40 bytes:
// SGLang and OpenAI write `"cached_tokens":123`).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "gateway/usage_scanner.h"

namespace {

// Whether every key in `s` is followed by its number (spaces, at most 18 digits that count) within
// 40 bytes of the key's start: the scanner's carry then holds the key until the number ends.
bool fits_carry(std::string_view s) {
  for (std::string_view key : {"\"cached_tokens\":", "\"prompt_tokens\":", "\"input_tokens\":",
                               "\"completion_tokens\":", "\"output_tokens\":"}) {
    for (size_t k = s.find(key); k != std::string_view::npos; k = s.find(key, k + 1)) {
      size_t p = k + key.size();
      while (p < s.size() && s[p] == ' ') ++p;
      size_t digits = 0;
      while (p < s.size() && s[p] >= '0' && s[p] <= '9' && digits < 18) ++p, ++digits;
      if (p - k > 40) return false;
    }
  }
  return true;
}

// A found value as a number, -1 when none; traps on values the scanner cannot produce.
int64_t checked(const std::optional<int64_t>& v) {
  int64_t n = v.value_or(-1);
  if (v && (n < 0 || n >= 1'000'000'000'000'000'000)) __builtin_trap();
  return n;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  kvgate::UsageScanner whole;
  whole.feed(body);
  int64_t cached = checked(whole.cached_tokens());
  int64_t prompt = checked(whole.prompt_tokens());
  int64_t completion = checked(whole.completion_tokens());

  kvgate::UsageScanner pieces;
  uint32_t seed = data[0] | 1u;
  for (std::string_view rest = body; !rest.empty();) {
    seed = seed * 1103515245u + 12345u;
    // Mostly short pieces (1-8 bytes, around the 40-byte carry), sometimes up to 127.
    size_t n = 1 + ((seed >> 16) % 8 == 0 ? (seed >> 8) % 127 : (seed >> 8) % 8);
    n = std::min(n, rest.size());
    pieces.feed(rest.substr(0, n));
    rest.remove_prefix(n);
  }
  int64_t cached_pieces = checked(pieces.cached_tokens());
  int64_t prompt_pieces = checked(pieces.prompt_tokens());
  int64_t completion_pieces = checked(pieces.completion_tokens());
  if (fits_carry(body) &&
      (cached_pieces != cached || prompt_pieces != prompt || completion_pieces != completion)) {
    __builtin_trap();
  }
  return 0;
}
