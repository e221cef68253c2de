// util/json: small helpers for writing JSON text by hand on hot paths (escaping).
#pragma once

#include <string>
#include <string_view>

namespace kvgate::json {

// Appends `s` as a JSON string literal (with quotes). Invalid UTF-8 bytes become U+FFFD.
void append_string(std::string& out, std::string_view s);
std::string quote(std::string_view s);

}  // namespace kvgate::json
