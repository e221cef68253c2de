// Fuzz target: parse_traceparent and TraceContext (http/traceparent), which read the traceparent
// header of client requests (untrusted) on every proxied request. The first byte picks how many
// traceparent fields the request is said to carry (0, 1 or 2) and seeds the random ids. Checks:
// a parsed value has 32 + 16 lowercase hex digits that are not all zeros and came from the input;
// whatever the input, the header sent upstream is a valid version-00 traceparent, continuing the
// input's trace exactly when the input was valid and alone (a version-00 input: sent unchanged).
// The same bytes are also truncated as a tracestate: the result fits in 512 characters, and
// every member kept came from the input.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "http/traceparent.h"

namespace {

void check(bool ok) {
  if (!ok) __builtin_trap();
}

bool lower_hex(std::string_view s) {
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

bool zeros(std::string_view s) {
  return s.find_first_not_of('0') == std::string_view::npos;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int count = data[0] % 3;
  std::string_view value(reinterpret_cast<const char*>(data + 1), size - 1);
  auto parsed = kvgate::http::parse_traceparent(value);
  if (parsed) {
    std::string_view trace(parsed->trace_id, 32), parent(parsed->parent_id, 16);
    check(lower_hex(trace) && lower_hex(parent) && !zeros(trace) && !zeros(parent));
    check(value.substr(3, 32) == trace && value.substr(36, 16) == parent);
    check(value.size() >= 55);
  }
  kvgate::http::TraceContext t;
  const uint64_t seed = data[0] * 0x9e3779b97f4a7c15ull;
  if (!t.continue_from(value, count)) t.start(seed, seed >> 7, seed ^ 0x5555);
  auto sent = kvgate::http::parse_traceparent(t.header());
  check(sent.has_value());
  check(t.header().starts_with("00-"));
  check(t.continued() == (parsed.has_value() && count == 1));
  if (t.continued()) {
    check(t.trace_id() == std::string_view(parsed->trace_id, 32));
    check(t.parent_id() == std::string_view(parsed->parent_id, 16));
    check(sent->flags == parsed->flags);
    if (value.starts_with("00")) check(t.header() == value);
  } else {
    check(sent->flags == kvgate::http::TraceContext::kSampled);
  }
  std::string kept = kvgate::http::truncate_tracestate(value);
  check(kept.size() <= kvgate::http::kMaxTraceState);
  for (size_t pos = 0; pos < kept.size();) {
    size_t comma = std::min(kept.find(',', pos), kept.size());
    std::string_view member = std::string_view(kept).substr(pos, comma - pos);
    check(!member.empty() && value.find(member) != std::string_view::npos);
    pos = comma + 1;
  }
  return 0;
}
