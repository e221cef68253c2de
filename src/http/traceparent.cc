// http/traceparent: see traceparent.h.
#include "http/traceparent.h"

#include <algorithm>
#include <cstring>
#include <vector>

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

bool TraceContext::continue_from(std::string_view incoming, int header_count) {
  if (header_count != 1) return false;
  std::optional<TraceParent> parent = parse_traceparent(incoming);
  if (!parent) return false;
  // Version 00: the same 55 characters as the client's (parse_traceparent accepted nothing else).
  write(parent->trace_id, parent->parent_id, parent->flags);
  continued_ = true;
  return true;
}

void TraceContext::start(uint64_t trace_hi, uint64_t trace_lo, uint64_t parent) {
  if (trace_hi == 0 && trace_lo == 0) trace_lo = 1;  // an all-zero trace-id is invalid
  if (parent == 0) parent = 1;                       // so is an all-zero parent-id
  char trace_id[32], parent_id[16];
  write_hex(trace_id, trace_hi, 16);
  write_hex(trace_id + 16, trace_lo, 16);
  write_hex(parent_id, parent, 16);
  write(trace_id, parent_id, kSampled);
  continued_ = false;
}

void TraceContext::write(const char* trace_id, const char* parent_id, uint8_t flags) {
  std::memcpy(value_, "00-", 3);
  std::memcpy(value_ + 3, trace_id, 32);
  value_[35] = '-';
  std::memcpy(value_ + 36, parent_id, 16);
  value_[52] = '-';
  write_hex(value_ + 53, flags, 2);
}

std::string truncate_tracestate(std::string_view combined) {
  std::vector<std::string_view> members;
  size_t joined = 0;  // the members' size joined with commas
  auto add = [&](std::string_view m) {
    joined += m.size() + (members.empty() ? 0 : 1);
    members.push_back(m);
  };
  for (size_t pos = 0; pos <= combined.size();) {
    size_t comma = std::min(combined.find(',', pos), combined.size());
    std::string_view m = combined.substr(pos, comma - pos);
    while (!m.empty() && (m.front() == ' ' || m.front() == '\t')) m.remove_prefix(1);
    while (!m.empty() && (m.back() == ' ' || m.back() == '\t')) m.remove_suffix(1);
    if (!m.empty()) add(m);
    pos = comma + 1;
  }
  if (joined > kMaxTraceState) {
    std::vector<std::string_view> all = std::move(members);
    members.clear();
    joined = 0;
    for (std::string_view m : all) {
      if (m.size() <= kMaxTraceStateMember) add(m);
    }
  }
  while (joined > kMaxTraceState) {
    joined -= members.back().size() + (members.size() > 1 ? 1 : 0);
    members.pop_back();
  }
  std::string out;
  out.reserve(joined);
  for (std::string_view m : members) {
    if (!out.empty()) out.push_back(',');
    out.append(m);
  }
  return out;
}

}  // namespace kvgate::http
