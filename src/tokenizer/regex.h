// tokenizer/regex: a PCRE2 (JIT) pattern compiled from a tokenizer.json regex (Oniguruma syntax as
// Hugging Face tokenizers reads it), with per-thread match data. Constructs whose meaning differs
// between Oniguruma and PCRE2 are refused at compile time.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace kvgate::tokenizer::detail {

class Regex {
 public:
  // nullptr with `error` set when the pattern does not compile or uses an unsupported construct.
  static std::unique_ptr<Regex> compile(std::string_view pattern, std::string& error);
  // The literal string `text` as a pattern.
  static std::unique_ptr<Regex> literal(std::string_view text, std::string& error);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Finds the leftmost match in subject[start..] (subject is valid UTF-8). Returns 1 and sets
  // [mstart, mend) on a match, 0 when there is none, and a negative PCRE2 error code when the
  // matcher ran out of resources (the caller reports it; it never guesses).
  int find(std::string_view subject, size_t start, size_t& mstart, size_t& mend) const;
  const std::string& pattern() const { return pattern_; }

 private:
  Regex() = default;
  void* code_ = nullptr;  // pcre2_code_8
  bool jit_ = false;
  std::string pattern_;
  std::string literal_;  // set for literal patterns (matched with memmem, no PCRE2)
  bool is_literal_ = false;
};

std::string pcre2_error_message(int code);

}  // namespace kvgate::tokenizer::detail
