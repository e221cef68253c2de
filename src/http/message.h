// http/message: plain HTTP vocabulary shared by the server, the client and handlers (no Beast).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvgate::http {

struct Header {
  std::string_view name;
  std::string_view value;
};
using HeaderList = std::span<const Header>;

// Owned header storage for responses assembled over time.
struct OwnedHeader {
  std::string name;
  std::string value;
};

// Reason phrase for a status code ("OK", "Not Found"...).
std::string_view reason(int status);

// ASCII case-insensitive comparison of header names.
bool iequals(std::string_view a, std::string_view b);

// Hop-by-hop headers (RFC 9110 7.6.1) that a proxy must not forward.
bool is_hop_by_hop(std::string_view name);

// Appends "HTTP/1.1 <status> <reason>\r\n" + headers (without the final blank line).
void append_status_line(std::string& out, int status, unsigned version = 11);
void append_header(std::string& out, std::string_view name, std::string_view value);

// Simdjson reads request bodies in place: bodies keep this many spare bytes past their end.
inline constexpr size_t kBodyPadding = 64;

}  // namespace kvgate::http
