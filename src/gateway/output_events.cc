// gateway/output_events: see output_events.h.
#include "gateway/output_events.h"

#include <algorithm>
#include <array>
#include <cstring>

namespace kvgate {
namespace {

struct OutputKey {
  std::string_view name;
  bool array;  // a non-empty array (tool_calls), else a non-empty string
};
constexpr std::array<OutputKey, 6> kKeys = {{{"content", false},
                                             {"text", false},
                                             {"reasoning_content", false},
                                             {"reasoning", false},
                                             {"delta", false},
                                             {"tool_calls", true}}};
constexpr size_t kMaxSpaces = 8;
// kResponses: the longest "type" value read (the Responses API's event types are at most ~45).
constexpr size_t kMaxType = 48;

enum class Value { kNo, kYes, kCut };

// Whether the value after the colon at `colon` is a non-empty string (or array): kCut when `s`
// ends before that can be told.
Value value_after(std::string_view s, size_t colon, bool array) {
  size_t q = colon + 1;
  size_t spaces = 0;
  while (q < s.size() && s[q] == ' ') {
    if (++spaces > kMaxSpaces) return Value::kNo;
    ++q;
  }
  if (q + 1 >= s.size()) return Value::kCut;
  if (array) {
    if (s[q] != '[') return Value::kNo;
    size_t r = q + 1;
    spaces = 0;
    while (r < s.size() && s[r] == ' ') {
      if (++spaces > kMaxSpaces) return Value::kNo;
      ++r;
    }
    if (r >= s.size()) return Value::kCut;
    return s[r] == ']' ? Value::kNo : Value::kYes;
  }
  return s[q] == '"' && s[q + 1] != '"' ? Value::kYes : Value::kNo;
}

// Whether the key that ends at the colon `p` is `name`, with unescaped quotes. The byte before
// the opening quote must be in `s` (a key at its very start is not taken: an event never starts
// with one, and a piece's is read again in the seam with the byte before it).
bool key_is(std::string_view s, size_t p, std::string_view name) {
  // s[p - 1] is the closing quote (checked by the caller), not escaped.
  if (p < name.size() + 3) return false;
  size_t open = p - name.size() - 2;
  if (s[open] != '"' || s[open - 1] == '\\') return false;
  return s.compare(open + 1, name.size(), name) == 0;
}

// kResponses: whether the value after the colon at `colon` is a string of at most kMaxType
// characters, without escapes, that ends in ".delta"; kCut when `s` ends before that can be told.
Value delta_type_after(std::string_view s, size_t colon) {
  size_t q = colon + 1;
  size_t spaces = 0;
  while (q < s.size() && s[q] == ' ') {
    if (++spaces > kMaxSpaces) return Value::kNo;
    ++q;
  }
  if (q >= s.size()) return Value::kCut;
  if (s[q] != '"') return Value::kNo;
  for (size_t i = q + 1; i <= q + 1 + kMaxType; ++i) {
    if (i >= s.size()) return Value::kCut;
    if (s[i] == '\\') return Value::kNo;
    if (s[i] == '"')
      return s.substr(q + 1, i - q - 1).ends_with(".delta") ? Value::kYes : Value::kNo;
  }
  return Value::kNo;  // longer than any event type
}

}  // namespace

void OutputEventCounter::scan_responses(std::string_view s) {
  for (size_t p = s.find(':'); p != std::string_view::npos && !output_; p = s.find(':', p + 1)) {
    if (p < 3 || s[p - 1] != '"' || s[p - 2] == '\\') continue;
    const char last = s[p - 2];
    if (last == 'a' && !delta_ && key_is(s, p, "delta")) {
      if (value_after(s, p, false) == Value::kYes) delta_ = true;
    } else if (last == 'e' && !delta_type_ && key_is(s, p, "type")) {
      if (delta_type_after(s, p) == Value::kYes) delta_type_ = true;
    }
    output_ = delta_ && delta_type_;
  }
}

void OutputEventCounter::scan(std::string_view s) {
  if (format_ == Format::kResponses) {
    scan_responses(s);
    return;
  }
  for (size_t p = s.find(':'); p != std::string_view::npos && !output_; p = s.find(':', p + 1)) {
    if (p < 3 || s[p - 1] != '"' || s[p - 2] == '\\') continue;
    const char last = s[p - 2];  // a key's last letter
    if (last != 't' && last != 'a' && last != 's' && last != 'g') continue;
    for (const auto& k : kKeys) {
      if (k.name.back() != last || !key_is(s, p, k.name)) continue;
      if (value_after(s, p, k.array) == Value::kYes) output_ = true;
      break;
    }
  }
}

void OutputEventCounter::scan_segment(std::string_view seg) {
  if (seg.empty()) return;
  if (!output_) {
    if (!carry_.empty()) {
      // A key (or its value) split between pieces: the seam is scanned first; what lies wholly in
      // `seg` is found again below, to the same effect.
      std::string seam = carry_;
      seam.append(seg.substr(0, std::min(seg.size(), kCarry)));
      scan(seam);
    }
    scan(seg);
  }
  if (output_) {
    carry_.clear();  // decided: nothing more to look for in this event
    return;
  }
  if (seg.size() >= kCarry) {
    carry_.assign(seg.substr(seg.size() - kCarry));
  } else {
    carry_.append(seg);
    if (carry_.size() > kCarry) carry_.erase(0, carry_.size() - kCarry);
  }
}

uint32_t OutputEventCounter::feed(std::string_view piece) {
  uint32_t count = 0;
  size_t from = 0;  // start of the current event's bytes in `piece`
  const char* base = piece.data();
  for (size_t i = 0; i < piece.size();) {
    const void* hit = std::memchr(base + i, '\n', piece.size() - i);
    if (!hit) break;
    i = static_cast<size_t>(static_cast<const char*>(hit) - base);
    const char c1 = i >= 1 ? piece[i - 1] : last_[1];
    const char c2 = i >= 2 ? piece[i - 2] : i == 1 ? last_[1] : last_[0];
    if (c1 == '\n' || (c1 == '\r' && c2 == '\n')) {  // a blank line: the event ends here
      scan_segment(piece.substr(from, i - from));
      ++events_;
      if (output_) ++count;
      output_ = delta_ = delta_type_ = false;
      carry_.clear();
      from = i + 1;
    }
    ++i;
  }
  scan_segment(piece.substr(from));
  if (piece.size() >= 2) {
    last_[0] = piece[piece.size() - 2];
    last_[1] = piece.back();
  } else if (piece.size() == 1) {
    last_[0] = last_[1];
    last_[1] = piece[0];
  }
  return count;
}

}  // namespace kvgate
