// Fuzz target: http::cookie_value, which reads a browser's Cookie header (untrusted bytes) for the
// dashboard's session (gateway/admin_ui.cc).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "http/message.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  for (std::string_view name : {std::string_view("kvgate_session"), std::string_view("a")}) {
    std::string_view value = kvgate::http::cookie_value(text, name);
    if (value.empty()) continue;
    // A part of the header (a view into it), within one pair, right after "name=".
    if (value.data() < text.data() || value.data() + value.size() > text.data() + text.size()) {
      __builtin_trap();
    }
    if (value.find(';') != std::string_view::npos) __builtin_trap();
    std::string_view before = text.substr(0, static_cast<size_t>(value.data() - text.data()));
    if (!before.ends_with(std::string(name) + "=")) __builtin_trap();
  }
  return 0;
}
