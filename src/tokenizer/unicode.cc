// tokenizer/unicode: see unicode.h.
#include "tokenizer/unicode.h"

#include <unicode/bytestream.h>
#include <unicode/casemap.h>
#include <unicode/edits.h>
#include <unicode/normalizer2.h>
#include <unicode/ucasemap.h>
#include <unicode/uchar.h>
#include <unicode/utypes.h>

#include <cstring>

namespace kvgate::tokenizer::unicode {
namespace {

// Length of the valid sequence at s[i], or 0 when it is ill-formed; `bad` then gets the length
// of its maximal subpart (at least 1).
size_t valid_sequence(std::string_view s, size_t i, size_t& bad) {
  const size_t n = s.size();
  auto at = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char b = at(i);
  bad = 1;
  if (b < 0x80) return 1;
  if (b < 0xC2 || b > 0xF4) return 0;
  if (b < 0xE0) {
    if (i + 1 < n && (at(i + 1) & 0xC0) == 0x80) return 2;
    return 0;
  }
  unsigned char lo = 0x80, hi = 0xBF;
  if (b == 0xE0) lo = 0xA0;
  if (b == 0xED) hi = 0x9F;
  if (b == 0xF0) lo = 0x90;
  if (b == 0xF4) hi = 0x8F;
  size_t len = b < 0xF0 ? 3 : 4;
  if (i + 1 >= n || at(i + 1) < lo || at(i + 1) > hi) return 0;
  bad = 2;
  for (size_t k = 2; k < len; ++k) {
    if (i + k >= n || (at(i + k) & 0xC0) != 0x80) return 0;
    bad = k + 1;
  }
  return len;
}

const icu::Normalizer2* instance(Form form) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = nullptr;
  switch (form) {
    case Form::kNFC:
      n = icu::Normalizer2::getNFCInstance(status);
      break;
    case Form::kNFD:
      n = icu::Normalizer2::getNFDInstance(status);
      break;
    case Form::kNFKC:
      n = icu::Normalizer2::getNFKCInstance(status);
      break;
    case Form::kNFKD:
      n = icu::Normalizer2::getNFKDInstance(status);
      break;
  }
  return U_SUCCESS(status) ? n : nullptr;
}

bool all_below(std::string_view s, unsigned char limit) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= limit) return false;
  }
  return true;
}

}  // namespace

bool is_valid_utf8(std::string_view s) {
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t bad;
    size_t len = valid_sequence(s, i, bad);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

void append_sanitized_utf8(std::string_view s, std::string& out) {
  const size_t n = s.size();
  size_t i = 0, run = 0;
  while (i < n) {
    size_t bad;
    size_t len = valid_sequence(s, i, bad);
    if (len > 0) {
      i += len;
      continue;
    }
    out.append(s.data() + run, i - run);
    out.append("\xEF\xBF\xBD");
    i += bad;
    run = i;
  }
  out.append(s.data() + run, n - run);
}

void append_utf8(char32_t c, std::string& out) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

size_t count_code_points(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

bool is_white_space(char32_t c) {
  if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0D);
  return u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_WHITE_SPACE);
}

bool is_word_char(char32_t c) {
  if (c < 0x80) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  }
  auto cp = static_cast<UChar32>(c);
  if (u_hasBinaryProperty(cp, UCHAR_ALPHABETIC) || u_hasBinaryProperty(cp, UCHAR_JOIN_CONTROL)) {
    return true;
  }
  int8_t t = u_charType(cp);
  return t == U_NON_SPACING_MARK || t == U_ENCLOSING_MARK || t == U_COMBINING_SPACING_MARK ||
         t == U_DECIMAL_DIGIT_NUMBER || t == U_CONNECTOR_PUNCTUATION;
}

bool is_python_space(char32_t c) {
  if (c >= 0x1C && c <= 0x1F) return true;
  return is_white_space(c);
}

bool normalize(Form form, std::string_view s, std::string& out) {
  // ASCII is invariant under every form; below U+0300 nothing composes or decomposes under NFC.
  if (all_below(s, 0x80) || (form == Form::kNFC && all_below(s, 0xCC))) {
    out.append(s);
    return true;
  }
  const icu::Normalizer2* n = instance(form);
  if (n == nullptr) return false;
  UErrorCode status = U_ZERO_ERROR;
  icu::StringByteSink<std::string> sink(&out, static_cast<int32_t>(s.size()));
  n->normalizeUTF8(0, icu::StringPiece(s.data(), static_cast<int32_t>(s.size())), sink, nullptr,
                   status);
  return U_SUCCESS(status);
}

bool is_normalized(Form form, std::string_view s) {
  if (all_below(s, 0x80) || (form == Form::kNFC && all_below(s, 0xCC))) return true;
  const icu::Normalizer2* n = instance(form);
  if (n == nullptr) return false;
  UErrorCode status = U_ZERO_ERROR;
  bool yes =
      n->isNormalizedUTF8(icu::StringPiece(s.data(), static_cast<int32_t>(s.size())), status);
  return U_SUCCESS(status) && yes;
}

namespace {

std::string case_map(std::string_view s, bool upper) {
  std::string out;
  bool ascii = all_below(s, 0x80);
  if (ascii) {
    out.assign(s);
    for (char& c : out) {
      if (upper && c >= 'a' && c <= 'z') c = static_cast<char>(c - 32);
      if (!upper && c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
    }
    return out;
  }
  UErrorCode status = U_ZERO_ERROR;
  icu::StringByteSink<std::string> sink(&out, static_cast<int32_t>(s.size()));
  icu::StringPiece piece(s.data(), static_cast<int32_t>(s.size()));
  if (upper) {
    icu::CaseMap::utf8ToUpper("", 0, piece, sink, nullptr, status);
  } else {
    icu::CaseMap::utf8ToLower("", 0, piece, sink, nullptr, status);
  }
  if (U_FAILURE(status)) return std::string(s);
  return out;
}

void append_mapped(char32_t c, std::string& out, bool title) {
  // Simple per-code-point mapping (full mappings of a few ligatures differ; rare in templates).
  UChar32 m = title ? u_totitle(static_cast<UChar32>(c)) : u_tolower(static_cast<UChar32>(c));
  append_utf8(static_cast<char32_t>(m), out);
}

bool is_cased(char32_t c) {
  return u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_CASED);
}

}  // namespace

std::string to_upper(std::string_view s) {
  return case_map(s, true);
}
std::string to_lower(std::string_view s) {
  return case_map(s, false);
}

std::string to_title(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  bool previous_cased = false;
  size_t i = 0;
  while (i < s.size()) {
    char32_t c = next_code_point(s, i);
    bool cased = is_cased(c);
    if (cased) {
      append_mapped(c, out, !previous_cased);
    } else {
      append_utf8(c, out);
    }
    previous_cased = cased;
  }
  return out;
}

std::string capitalize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  bool first = true;
  while (i < s.size()) {
    char32_t c = next_code_point(s, i);
    append_mapped(c, out, first);
    first = false;
  }
  return out;
}

}  // namespace kvgate::tokenizer::unicode
