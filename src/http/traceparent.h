// http/traceparent: W3C Trace Context (level 1) for the request path. A request's `traceparent`
//   VERSION "-" TRACE-ID "-" PARENT-ID "-" FLAGS      e.g. 00-4bf92f3577b34da6a3ce929d0e0e4736-
//                                                          00f067aa0ba902b7-01
// (lowercase hex: 2, 32, 16, 2 digits) and its `tracestate` (vendors' key=value list).
//
// kvgate exports no spans, so it is no span of the trace: a valid traceparent is forwarded to
// every upstream call as the client sent it (same trace-id, parent-id and flags; a later version
// goes on as version 00 with those three fields, as level 1 asks), with the client's tracestate,
// so the engine's spans hang under the client's span as if kvgate were not there. Invalid,
// repeated or absent: kvgate starts the trace (trace-id and parent-id random, never all zero;
// flags 01) and forwards no tracestate (the client's belongs to a trace not continued).
//
// Should kvgate one day export spans (an OTLP exporter), it would become a participant: each
// upstream call (each attempt; each half of prefill/decode) would then get a span id of its own
// as the parent-id sent, exported with the client's parent-id as its parent, and tracestate could
// carry kvgate's entry. Without an exporter such span ids would name parents no tracing backend
// ever receives, orphaning the engine's spans: hence none.
//
// Valid: version 00 at exactly 55 characters; a later version (not ff) at 55 characters or more,
// the 56th being '-' when there are more (its first four fields read as version 00's, as level 1
// asks of a parser meeting a future version); trace-id and parent-id not all zeros; nothing but
// lowercase hex in the fields.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kvgate::http {

struct TraceParent {
  char trace_id[32];
  char parent_id[16];
  uint8_t flags = 0;
};

// The parsed header value, or nullopt when it is not a valid traceparent.
std::optional<TraceParent> parse_traceparent(std::string_view value);

// A request's trace: the traceparent the gateway forwards upstream, and the trace id it logs.
class TraceContext {
 public:
  static constexpr size_t kHeaderSize = 55;
  static constexpr uint8_t kSampled = 0x01;

  // Continues the client's trace when `incoming` is a valid traceparent and the request had no
  // other (`header_count`: how many traceparent fields it had; more than one is invalid). True
  // when it did; false leaves the context as it was (start() it).
  bool continue_from(std::string_view incoming, int header_count);
  // Starts a new trace: the trace-id from `trace_hi`/`trace_lo`, the parent-id from `parent`
  // (random), flags sampled (so that an engine tracing requests with a parent-based sampler
  // records this one as it would one without a parent).
  void start(uint64_t trace_hi, uint64_t trace_lo, uint64_t parent);

  // The traceparent to send upstream (version 00): for a continued trace of version 00, exactly
  // the client's value.
  std::string_view header() const { return {value_, kHeaderSize}; }
  std::string_view trace_id() const { return {value_ + 3, 32}; }
  std::string_view parent_id() const { return {value_ + 36, 16}; }
  bool continued() const { return continued_; }
  bool started() const { return value_[0] != 0; }

 private:
  void write(const char* trace_id, const char* parent_id, uint8_t flags);

  char value_[kHeaderSize] = {};
  bool continued_ = false;
};

// tracestate: what level 1 asks vendors to propagate at least (commas included, optional white
// space not), and the size of a list-member dropped first when a longer one must be truncated.
inline constexpr size_t kMaxTraceState = 512;
inline constexpr size_t kMaxTraceStateMember = 128;

// A tracestate longer than kMaxTraceState (its fields combined with commas, in order), truncated
// as level 1 says: its list-members trimmed of optional white space, empty ones dropped; if still
// too long, members longer than kMaxTraceStateMember removed, then members from the end, until
// it fits. Members are otherwise opaque (not validated). Empty when nothing is left.
std::string truncate_tracestate(std::string_view combined);

}  // namespace kvgate::http
