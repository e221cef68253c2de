// util/json: see json.h.
#include "util/json.h"

namespace kvgate::json {
namespace {

// Length of the valid UTF-8 sequence starting at s[i], or 0 if invalid.
size_t utf8_len(std::string_view s, size_t i) {
  auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char c = b(i);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xc0) != 0x80) return 0;
  }
  if (n == 2 && c < 0xc2) return 0;
  if (n == 3) {
    unsigned cp = ((c & 0x0fu) << 12) | ((b(i + 1) & 0x3fu) << 6) | (b(i + 2) & 0x3fu);
    if (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  }
  if (n == 4) {
    unsigned cp = ((c & 0x07u) << 18) | ((b(i + 1) & 0x3fu) << 12) | ((b(i + 2) & 0x3fu) << 6) |
                  (b(i + 3) & 0x3fu);
    if (cp < 0x10000 || cp > 0x10ffff) return 0;
  }
  return n;
}

}  // namespace

void append_string(std::string& out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out.push_back('"');
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      size_t n = utf8_len(s, i);
      if (n == 0) {
        out.append("\xef\xbf\xbd");
        ++i;
      } else {
        out.append(s.substr(i, n));
        i += n;
      }
      continue;
    }
    switch (c) {
      case '"':
        out.append("\\\"");
        break;
      case '\\':
        out.append("\\\\");
        break;
      case '\n':
        out.append("\\n");
        break;
      case '\r':
        out.append("\\r");
        break;
      case '\t':
        out.append("\\t");
        break;
      case '\b':
        out.append("\\b");
        break;
      case '\f':
        out.append("\\f");
        break;
      default:
        if (c < 0x20) {
          out.append("\\u00");
          out.push_back(kHex[c >> 4]);
          out.push_back(kHex[c & 15]);
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
    ++i;
  }
  out.push_back('"');
}

std::string quote(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  append_string(out, s);
  return out;
}

}  // namespace kvgate::json
