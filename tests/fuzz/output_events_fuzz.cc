// Fuzz target: OutputEventCounter (gateway/output_events), which reads worker SSE streams
// (untrusted) as they are relayed, in whatever pieces reads deliver, in both of its formats. The
// first byte seeds the piece sizes. Checks: fed in pieces it counts what it counts on the whole
// body (its carry holds every key it recognizes, with its spaces and the value it reads); it never
// counts more output events than events, nor more events than the body has newlines.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "gateway/output_events.h"

namespace {

void check(std::string_view body, uint32_t seed, kvgate::OutputEventCounter::Format format) {
  kvgate::OutputEventCounter whole(format);
  const uint64_t count = whole.feed(body);
  if (count > whole.events()) __builtin_trap();
  if (whole.events() > static_cast<uint64_t>(std::count(body.begin(), body.end(), '\n'))) {
    __builtin_trap();
  }
  kvgate::OutputEventCounter pieces(format);
  uint64_t in_pieces = 0;
  for (std::string_view rest = body; !rest.empty();) {
    seed = seed * 1103515245u + 12345u;
    size_t n = 1 + ((seed >> 16) % 8 == 0 ? (seed >> 8) % 127 : (seed >> 8) % 8);
    n = std::min(n, rest.size());
    in_pieces += pieces.feed(rest.substr(0, n));
    rest.remove_prefix(n);
  }
  if (in_pieces != count || pieces.events() != whole.events()) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  const uint32_t seed = data[0] | 1u;
  check(body, seed, kvgate::OutputEventCounter::Format::kDefault);
  check(body, seed, kvgate::OutputEventCounter::Format::kResponses);
  return 0;
}
