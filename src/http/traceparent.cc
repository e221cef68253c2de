// http/traceparent: see traceparent.h.
#include "http/traceparent.h"

#include <cstring>

namespace kvgate::http {
namespace {

constexpr char kHex[] = "0123456789abcdef";

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;  // uppercase is invalid in traceparent
}

bool all_hex(std::string_view s) {
  for (char c : s) {
    if (hex_value(c) < 0) return false;
  }
  return true;
}

bool all_zero(std::string_view s) {
  for (char c : s) {
    if (c != '0') return false;
  }
  return true;
}

void write_hex(char* out, uint64_t v, int digits) {
  for (int i = digits - 1; i >= 0; --i) {
    out[i] = kHex[v & 15];
    v >>= 4;
  }
}

}  // namespace

std::optional<TraceParent> parse_traceparent(std::string_view v) {
  if (v.size() < TraceContext::kHeaderSize) return std::nullopt;
  std::string_view version = v.substr(0, 2);
  if (!all_hex(version) || version == "ff") return std::nullopt;
  if (version == "00" ? v.size() != TraceContext::kHeaderSize
                      : v.size() > TraceContext::kHeaderSize && v[55] != '-') {
    return std::nullopt;
  }
  if (v[2] != '-' || v[35] != '-' || v[52] != '-') return std::nullopt;
  std::string_view trace_id = v.substr(3, 32), parent_id = v.substr(36, 16),
                   flags = v.substr(53, 2);
  if (!all_hex(trace_id) || !all_hex(parent_id) || !all_hex(flags)) return std::nullopt;
  if (all_zero(trace_id) || all_zero(parent_id)) return std::nullopt;
  TraceParent out;
  std::memcpy(out.trace_id, trace_id.data(), 32);
  std::memcpy(out.parent_id, parent_id.data(), 16);
  out.flags = static_cast<uint8_t>(hex_value(flags[0]) * 16 + hex_value(flags[1]));
  return out;
}

void TraceContext::begin(std::string_view incoming, int header_count, uint64_t rand_hi,
                         uint64_t rand_lo) {
  std::optional<TraceParent> parent;
  if (header_count == 1) parent = parse_traceparent(incoming);
  std::memcpy(value_, "00-", 3);
  value_[35] = '-';
  value_[52] = '-';
  uint8_t flags = kSampled;
  if (parent) {
    std::memcpy(value_ + 3, parent->trace_id, 32);
    std::memcpy(client_span_, parent->parent_id, 16);
    flags = parent->flags;
    continued_ = true;
  } else {
    if (rand_hi == 0 && rand_lo == 0) rand_lo = 1;  // an all-zero trace-id is invalid
    write_hex(value_ + 3, rand_hi, 16);
    write_hex(value_ + 19, rand_lo, 16);
    continued_ = false;
  }
  write_hex(value_ + 53, flags, 2);
  next_span(rand_lo ^ (rand_hi << 1) ^ 0x5bd1e995);
}

void TraceContext::next_span(uint64_t rand) {
  if (rand == 0) rand = 1;  // an all-zero span id is invalid
  write_hex(value_ + 36, rand, 16);
}

}  // namespace kvgate::http
