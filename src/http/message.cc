// http/message: see message.h.
#include "http/message.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cstring>

namespace kvgate::http {

std::string_view reason(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 201:
      return "Created";
    case 202:
      return "Accepted";
    case 204:
      return "No Content";
    case 301:
      return "Moved Permanently";
    case 302:
      return "Found";
    case 303:
      return "See Other";
    case 304:
      return "Not Modified";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 409:
      return "Conflict";
    case 411:
      return "Length Required";
    case 413:
      return "Payload Too Large";
    case 415:
      return "Unsupported Media Type";
    case 422:
      return "Unprocessable Entity";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 502:
      return "Bad Gateway";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    default:
      break;
  }
  if (status >= 200 && status < 300) return "OK";
  if (status >= 400 && status < 500) return "Client Error";
  return "Server Error";
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x + 32);
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y + 32);
    if (x != y) return false;
  }
  return true;
}

HeaderKind classify_header(std::string_view n) {
  switch (n.size()) {
    case 2:
      return iequals_lower(n, "te") ? HeaderKind::kHopByHop : HeaderKind::kOther;
    case 4:
      return iequals_lower(n, "host") ? HeaderKind::kHost : HeaderKind::kOther;
    case 6:
      return iequals_lower(n, "expect") ? HeaderKind::kExpect : HeaderKind::kOther;
    case 7:
      return iequals_lower(n, "trailer") || iequals_lower(n, "upgrade") ? HeaderKind::kHopByHop
                                                                        : HeaderKind::kOther;
    case 10:
      return iequals_lower(n, "connection") || iequals_lower(n, "keep-alive")
                 ? HeaderKind::kHopByHop
                 : HeaderKind::kOther;
    case 11:
      return iequals_lower(n, "traceparent") ? HeaderKind::kTraceParent : HeaderKind::kOther;
    case 12:
      if (iequals_lower(n, "content-type")) return HeaderKind::kContentType;
      return iequals_lower(n, "x-request-id") ? HeaderKind::kRequestId : HeaderKind::kOther;
    case 14:
      return iequals_lower(n, "content-length") ? HeaderKind::kContentLength : HeaderKind::kOther;
    case 15:
      return iequals_lower(n, "x-kvgate-doctor") ? HeaderKind::kDoctor : HeaderKind::kOther;
    case 16:
      return iequals_lower(n, "proxy-connection") ? HeaderKind::kHopByHop : HeaderKind::kOther;
    case 17:
      return iequals_lower(n, "transfer-encoding") ? HeaderKind::kHopByHop : HeaderKind::kOther;
    case 18:
      return iequals_lower(n, "proxy-authenticate") ? HeaderKind::kHopByHop : HeaderKind::kOther;
    case 19:
      return iequals_lower(n, "proxy-authorization") ? HeaderKind::kHopByHop : HeaderKind::kOther;
    default:
      return HeaderKind::kOther;
  }
}

bool is_hop_by_hop(std::string_view name) {
  return classify_header(name) == HeaderKind::kHopByHop;
}

void append_status_line(std::string& out, int status, unsigned version) {
  out.append(version == 10 ? "HTTP/1.0 " : "HTTP/1.1 ");
  char code[4] = {static_cast<char>('0' + status / 100 % 10),
                  static_cast<char>('0' + status / 10 % 10), static_cast<char>('0' + status % 10),
                  ' '};
  out.append(code, 4);
  out.append(reason(status));
  out.append("\r\n");
}

void append_header(std::string& out, std::string_view name, std::string_view value) {
  // One growth and four copies (the chained appends checked capacity four times).
  size_t at = out.size();
  size_t len = name.size() + value.size() + 4;
  if (out.capacity() < at + len) out.reserve(std::max(at + len, out.capacity() * 2));
  out.resize(at + len);
  char* p = out.data() + at;
  if (!name.empty()) std::memcpy(p, name.data(), name.size());  // (an empty view may be null)
  p += name.size();
  *p++ = ':';
  *p++ = ' ';
  if (!value.empty()) std::memcpy(p, value.data(), value.size());
  p += value.size();
  *p++ = '\r';
  *p = '\n';
}

}  // namespace kvgate::http

namespace kvgate::http {

void append_content_length(std::string& out, uint64_t n) {
  char buf[24];
  auto r = std::to_chars(buf, buf + sizeof buf, n);
  out.append("content-length: ").append(buf, r.ptr).append("\r\n");
}

std::string percent_decode(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out.push_back(static_cast<char>(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16)));
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

std::string_view query_param(std::string_view target, std::string_view name) {
  size_t q = target.find('?');
  if (q == std::string_view::npos) return {};
  std::string_view rest = target.substr(q + 1);
  while (!rest.empty()) {
    size_t amp = rest.find('&');
    std::string_view kv = rest.substr(0, amp);
    rest = amp == std::string_view::npos ? std::string_view{} : rest.substr(amp + 1);
    size_t eq = kv.find('=');
    if (kv.substr(0, eq) == name) {
      return eq == std::string_view::npos ? std::string_view{} : kv.substr(eq + 1);
    }
  }
  return {};
}

namespace {

// Calls fn(name, value, pair) for each pair of a Cookie header (blanks around them trimmed)
// until it returns false.
template <class Fn>
void for_each_cookie(std::string_view header, Fn&& fn) {
  auto trim = [](std::string_view v) {
    while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
    while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
    return v;
  };
  while (!header.empty()) {
    size_t end = header.find(';');
    std::string_view pair = trim(header.substr(0, end));
    header = end == std::string_view::npos ? std::string_view{} : header.substr(end + 1);
    size_t eq = pair.find('=');
    std::string_view name = eq == std::string_view::npos ? pair : pair.substr(0, eq);
    std::string_view value =
        eq == std::string_view::npos ? std::string_view{} : pair.substr(eq + 1);
    if (!fn(name, value, pair)) return;
  }
}

}  // namespace

std::vector<std::string_view> cookie_values(std::string_view header, std::string_view name,
                                            size_t limit) {
  std::vector<std::string_view> out;
  if (name.empty() || limit == 0) return out;
  for_each_cookie(header, [&](std::string_view n, std::string_view v, std::string_view) {
    if (n == name && !v.empty()) out.push_back(v);
    return out.size() < limit;
  });
  return out;
}

std::string without_cookies(std::string_view header, std::string_view prefix) {
  std::string out;
  for_each_cookie(header, [&](std::string_view n, std::string_view, std::string_view pair) {
    if (!pair.empty() && !n.starts_with(prefix)) {
      if (!out.empty()) out += "; ";
      out += pair;
    }
    return true;
  });
  return out;
}

}  // namespace kvgate::http
