// http/traceparent: W3C Trace Context (level 1) for the request path. A request's `traceparent`
//   VERSION "-" TRACE-ID "-" PARENT-ID "-" FLAGS      e.g. 00-4bf92f3577b34da6a3ce929d0e0e4736-
//                                                          00f067aa0ba902b7-01
// (lowercase hex: 2, 32, 16, 2 digits) is continued when valid: the gateway acts as one span of
// that trace, and each upstream call gets the same trace-id with a span id of its own (the
// engine's spans then hang under the gateway's call). Invalid or absent: a new trace is started,
// as the specification says (trace-id and span id random, never all zero).
// Valid: version 00 at exactly 55 characters; a later version (not ff) at 55 characters or more,
// the 56th being '-' when there are more (its first four fields read as version 00's, as level 1
// asks of a parser meeting a future version); trace-id and parent-id not all zeros; nothing but
// lowercase hex in the fields.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace kvgate::http {

struct TraceParent {
  char trace_id[32];
  char parent_id[16];
  uint8_t flags = 0;
};

// The parsed header value, or nullopt when it is not a valid traceparent.
std::optional<TraceParent> parse_traceparent(std::string_view value);

// A request's trace: what the gateway forwards upstream and logs.
class TraceContext {
 public:
  static constexpr size_t kHeaderSize = 55;
  static constexpr uint8_t kSampled = 0x01;

  // Continues the trace of `incoming` when it is a valid traceparent, else starts a new one with
  // the trace-id from `rand_hi`/`rand_lo` (flags: sampled, so that an engine tracing requests
  // without a parent records this one as it would have). `header_count`: how many traceparent
  // fields the request had; more than one is invalid (a new trace).
  void begin(std::string_view incoming, int header_count, uint64_t rand_hi, uint64_t rand_lo);
  // A new span id (from `rand`) for the next upstream call; header() then carries it.
  void next_span(uint64_t rand);

  // The traceparent to send upstream: version 00, the trace-id, the current span id, the flags.
  std::string_view header() const { return {value_, kHeaderSize}; }
  std::string_view trace_id() const { return {value_ + 3, 32}; }
  std::string_view span_id() const { return {value_ + 36, 16}; }
  // The client's span (the parent-id it sent), "" when the trace started here.
  std::string_view client_span_id() const {
    return continued_ ? std::string_view(client_span_, 16) : std::string_view();
  }
  bool continued() const { return continued_; }
  bool started() const { return value_[0] != 0; }

 private:
  char value_[kHeaderSize] = {};
  char client_span_[16] = {};
  bool continued_ = false;
};

}  // namespace kvgate::http
