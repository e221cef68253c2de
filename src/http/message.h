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
// `name` equals `lower` (lowercase letters, digits, '-') ignoring ASCII case: one OR per byte,
// exact for any bytes (a byte | 0x20 that gives such a character came from that character or its
// uppercase, unless it was a control character, which never matches).
inline bool iequals_lower(std::string_view name, std::string_view lower) {
  if (name.size() != lower.size()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    auto c = static_cast<unsigned char>(name[i]);
    if (c < 0x20 || static_cast<char>(c | 0x20) != lower[i]) return false;
  }
  return true;
}

// Hop-by-hop headers (RFC 9110 7.6.1) that a proxy must not forward.
bool is_hop_by_hop(std::string_view name);

// What a proxy needs to know about a header name, found with one switch on its length.
enum class HeaderKind {
  kOther,
  kHopByHop,  // connection, keep-alive, te, trailer, transfer-encoding, upgrade, proxy-*
  kHost,
  kContentLength,
  kContentType,
  kExpect,
  kRequestId,  // x-request-id
  kDoctor,     // x-kvgate-doctor: the gateway's own probes; never forwarded either way
  // traceparent (W3C Trace Context): forwarded upstream by the gateway only after checking it
  // (the client's when valid and alone, else one the gateway starts: http/traceparent.h).
  kTraceParent,
};
HeaderKind classify_header(std::string_view name);

// Appends "HTTP/1.1 <status> <reason>\r\n" + headers (without the final blank line).
void append_status_line(std::string& out, int status, unsigned version = 11);
void append_header(std::string& out, std::string_view name, std::string_view value);
// Appends "content-length: N\r\n".
void append_content_length(std::string& out, uint64_t n);

// Header lists built per request live on the coroutine frame, not the heap.
template <size_t N>
class HeaderBuffer {
 public:
  void push_back(Header h) {
    if (size_ < N) {
      fixed_[size_++] = h;
    } else {
      if (overflow_.empty()) overflow_.assign(fixed_, fixed_ + N);
      overflow_.push_back(h);
      ++size_;
    }
  }
  operator HeaderList() const {
    return size_ <= N ? HeaderList(fixed_, size_) : HeaderList(overflow_.data(), size_);
  }

 private:
  Header fixed_[N];
  size_t size_ = 0;
  std::vector<Header> overflow_;
};

// Simdjson reads request bodies in place: bodies keep this many spare bytes past their end.
inline constexpr size_t kBodyPadding = 64;

// `%XX` escapes decoded (a malformed one is kept as it is).
std::string percent_decode(std::string_view s);
// The raw (still escaped) value of query parameter `name` in a request target, or "".
std::string_view query_param(std::string_view target, std::string_view name);
// The values of cookie `name` in a Cookie header ("a=1; kvgate_session=abc"), in order, at most
// `limit` (RFC 6265 5.4: pairs separated by "; "; another site of the host may have set a pair of
// the same name, sent first).
std::vector<std::string_view> cookie_values(std::string_view header, std::string_view name,
                                            size_t limit = 16);
// The Cookie header without the pairs whose name starts with `prefix` ("" when none is left).
std::string without_cookies(std::string_view header, std::string_view prefix);
// What the names of the dashboard's session cookies start with (gateway/admin_ui.cc names them
// per admin port). A browser sends them to every port of the host: the inference listener takes
// them out of what it forwards, and cookie-keyed routing leaves them out of its key.
inline constexpr std::string_view kSessionCookiePrefix = "kvgate_session";

}  // namespace kvgate::http
