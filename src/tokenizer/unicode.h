// tokenizer/unicode: UTF-8 decoding, validation and repair, Unicode character classes and
// normalization forms (ICU) for the tokenizer pipeline and the chat-template engine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvgate::tokenizer::unicode {

constexpr char32_t kReplacement = 0xFFFD;

// True when `s` is well-formed UTF-8 (no overlongs, no surrogates, nothing above U+10FFFF).
bool is_valid_utf8(std::string_view s);

// Appends `s` to `out` with every ill-formed sequence replaced by U+FFFD, one per maximal
// subpart (the Unicode / WHATWG practice: what a browser, Node's Buffer#toString and Rust's
// String::from_utf8_lossy produce).
void append_sanitized_utf8(std::string_view s, std::string& out);

// Decodes the code point at s[i] (s must be valid UTF-8) and advances i.
inline char32_t next_code_point(std::string_view s, size_t& i) {
  auto b = static_cast<unsigned char>(s[i]);
  if (b < 0x80) {
    ++i;
    return b;
  }
  if (b < 0xE0) {
    char32_t c = ((b & 0x1Fu) << 6) | (static_cast<unsigned char>(s[i + 1]) & 0x3Fu);
    i += 2;
    return c;
  }
  if (b < 0xF0) {
    char32_t c = ((b & 0x0Fu) << 12) | ((static_cast<unsigned char>(s[i + 1]) & 0x3Fu) << 6) |
                 (static_cast<unsigned char>(s[i + 2]) & 0x3Fu);
    i += 3;
    return c;
  }
  char32_t c = ((b & 0x07u) << 18) | ((static_cast<unsigned char>(s[i + 1]) & 0x3Fu) << 12) |
               ((static_cast<unsigned char>(s[i + 2]) & 0x3Fu) << 6) |
               (static_cast<unsigned char>(s[i + 3]) & 0x3Fu);
  i += 4;
  return c;
}

// Byte length of the UTF-8 sequence starting with lead byte b (1 for stray continuation bytes).
inline size_t sequence_length(unsigned char b) {
  if (b < 0xC0) return 1;
  if (b < 0xE0) return 2;
  if (b < 0xF0) return 3;
  return 4;
}

void append_utf8(char32_t c, std::string& out);
// Number of code points of valid UTF-8 text.
size_t count_code_points(std::string_view s);

// Unicode White_Space (Rust's char::is_whitespace, regex \s).
bool is_white_space(char32_t c);
// Rust regex \w: Alphabetic, Mark, Decimal_Number, Connector_Punctuation, Join_Control.
bool is_word_char(char32_t c);
// Python str.isspace(): White_Space plus the separators U+001C..U+001F.
bool is_python_space(char32_t c);

enum class Form { kNFC, kNFD, kNFKC, kNFKD };
// Appends the normalization form of `s` (valid UTF-8) to `out`; false when ICU fails.
bool normalize(Form form, std::string_view s, std::string& out);
// Quick check: true when `s` is certainly already in `form` (then normalize() would copy it).
bool is_normalized(Form form, std::string_view s);

// Full Unicode case mapping of the root locale (Python's str.upper()/lower()).
std::string to_upper(std::string_view s);
std::string to_lower(std::string_view s);
// Python str.title() / str.capitalize().
std::string to_title(std::string_view s);
std::string capitalize(std::string_view s);

}  // namespace kvgate::tokenizer::unicode
