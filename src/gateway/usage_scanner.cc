// gateway/usage_scanner: see usage_scanner.h.
#include "gateway/usage_scanner.h"

#include <algorithm>

namespace kvgate {
namespace {

// The keys' heads: each key is `"HEAD_tokens":`.
constexpr std::string_view kCachedHead = "\"cached";
constexpr std::string_view kPromptHead = "\"prompt";
constexpr std::string_view kInputHead = "\"input";  // the Responses API's prompt_tokens
constexpr std::string_view kCompletionHead = "\"completion";
constexpr std::string_view kOutputHead = "\"output";
constexpr size_t kCarry = 40;  // longer than the longest key, optional spaces and a number

// The integer after `pos` (optional spaces), or nullopt when the digits may continue past s.
std::optional<int64_t> number_at(std::string_view s, size_t pos) {
  while (pos < s.size() && s[pos] == ' ') ++pos;
  size_t start = pos;
  int64_t v = 0;
  while (pos < s.size() && s[pos] >= '0' && s[pos] <= '9' && pos - start < 18) {
    v = v * 10 + (s[pos] - '0');
    ++pos;
  }
  if (pos == start || pos == s.size()) return std::nullopt;  // null, or cut at the end
  return v;
}

}  // namespace

void UsageScanner::scan(std::string_view s) {
  // Every key ends in `_tokens":`. Anchored on '_' (a few per body) rather than on '"' (every
  // key and string: a search from each quote cost ~4,000 instructions per response).
  constexpr std::string_view kTail = "_tokens\":";
  for (size_t p = s.find('_'); p != std::string_view::npos; p = s.find('_', p + 1)) {
    // Most underscores start no `_tokens":` (finish_reason, tool_calls, prompt_tokens_details):
    // two bytes rule them out before the whole tail is compared. (No head is shorter than
    // `"input`.)
    if (p < kInputHead.size() || p + kTail.size() > s.size() || s[p + 1] != 't' ||
        s[p + 7] != '"' || s.compare(p, kTail.size(), kTail) != 0) {
      continue;
    }
    auto head_is = [&](std::string_view head) {
      return p >= head.size() && s.compare(p - head.size(), head.size(), head) == 0;
    };
    std::optional<int64_t>* out = head_is(kCachedHead)       ? &cached_
                                  : head_is(kPromptHead)     ? &prompt_
                                  : head_is(kInputHead)      ? &prompt_
                                  : head_is(kCompletionHead) ? &completion_
                                  : head_is(kOutputHead)     ? &completion_
                                                             : nullptr;
    if (!out) continue;
    if (auto v = number_at(s, p + kTail.size())) *out = v;
  }
}

void UsageScanner::feed(std::string_view data) {
  if (data.empty()) return;
  if (!carry_.empty()) {
    // Keys (or numbers) split across the boundary: scan the seam first; matches inside `data`
    // found again below carry the same or a later value.
    std::string seam = carry_;
    seam.append(data.substr(0, std::min(data.size(), kCarry)));
    scan(seam);
  }
  scan(data);
  if (data.size() >= kCarry) {
    carry_.assign(data.substr(data.size() - kCarry));
  } else {
    carry_.append(data);
    if (carry_.size() > kCarry) carry_.erase(0, carry_.size() - kCarry);
  }
}

}  // namespace kvgate
