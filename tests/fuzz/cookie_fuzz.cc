// Fuzz target: the Cookie header's parsers (untrusted bytes from a browser): cookie_values, which
// the admin listener reads the dashboard's session from (gateway/admin_ui.cc), and
// without_cookies, which takes that session out of a Cookie field the inference listener forwards.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "http/message.h"

namespace {

bool inside(std::string_view part, std::string_view text) {
  return part.data() >= text.data() && part.data() + part.size() <= text.data() + text.size();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  for (std::string_view name : {std::string_view("kvgate_session_29001"), std::string_view("a")}) {
    auto values = kvgate::http::cookie_values(text, name, 4);
    if (values.size() > 4) __builtin_trap();
    for (std::string_view value : values) {
      // A non-empty part of the header (a view into it), within one pair, right after "name="
      // where the name starts the pair (after "; " or the header's start).
      if (value.empty() || !inside(value, text)) __builtin_trap();
      if (value.find(';') != std::string_view::npos) __builtin_trap();
      std::string_view before = text.substr(0, static_cast<size_t>(value.data() - text.data()));
      if (!before.ends_with(std::string(name) + "=")) __builtin_trap();
      std::string_view lead = before.substr(0, before.size() - name.size() - 1);
      while (!lead.empty() && (lead.back() == ' ' || lead.back() == '\t')) lead.remove_suffix(1);
      if (!lead.empty() && lead.back() != ';') __builtin_trap();
    }
    // The limit only cuts: the first values are the same with a larger one.
    auto more = kvgate::http::cookie_values(text, name, 8);
    if (more.size() < values.size() || !std::equal(values.begin(), values.end(), more.begin())) {
      __builtin_trap();
    }
  }
  // What is forwarded holds no pair named kvgate_session*, and nothing the header did not have.
  std::string kept = kvgate::http::without_cookies(text, kvgate::http::kSessionCookiePrefix);
  if (kept.size() > text.size() + text.size() / 2 + 2) __builtin_trap();
  if (!kvgate::http::cookie_values(kept, "kvgate_session_29001").empty()) __builtin_trap();
  if (kvgate::http::without_cookies(kept, kvgate::http::kSessionCookiePrefix) != kept)
    __builtin_trap();  // idempotent
  return 0;
}
