// tokenizer/regex: see regex.h.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>

#include <cstring>

namespace kvgate::tokenizer::detail {
namespace {

// Per-thread match data and JIT stack, shared by every pattern used on the thread.
struct ThreadMatcher {
  pcre2_match_data* data = nullptr;
  pcre2_jit_stack* stack = nullptr;
  pcre2_match_context* context = nullptr;
  ThreadMatcher() {
    data = pcre2_match_data_create(8, nullptr);
    stack = pcre2_jit_stack_create(size_t{32} * 1024, size_t{4} * 1024 * 1024, nullptr);
    context = pcre2_match_context_create(nullptr);
    if (context != nullptr && stack != nullptr) pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~ThreadMatcher() {
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(stack);
    pcre2_match_data_free(data);
  }
  ThreadMatcher(const ThreadMatcher&) = delete;
  ThreadMatcher& operator=(const ThreadMatcher&) = delete;
};

ThreadMatcher& matcher() {
  thread_local ThreadMatcher m;
  return m;
}

// Oniguruma escapes that mean something else in PCRE2 (or whose Unicode classes differ).
std::string unsupported_construct(std::string_view p) {
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char e = p[i + 1];
      switch (e) {
        case 'h':
        case 'H':
          return std::string("\\") + e + " (hex digit in Oniguruma, horizontal space in PCRE2)";
        case 'w':
        case 'W':
        case 'b':
        case 'B':
          return std::string("\\") + e + " (word classes differ between Oniguruma and PCRE2)";
        case 'K':
        case 'R':
        case 'X':
        case 'G':
        case 'y':
        case 'Y':
        case 'O':
          return std::string("\\") + e;
        default:
          break;
      }
      ++i;
      continue;
    }
    if (c == '[') in_class = true;
    if (c == ']') in_class = false;
    if (!in_class && c == '(' && i + 2 < p.size() && p[i + 1] == '?') {
      char k = p[i + 2];
      // Supported groups: (?: (?= (?! (?<= (?<! and inline flags (?i) (?i: (?-i ...
      if (k == ':' || k == '=' || k == '!' || k == 'i' || k == 'm' || k == 's' || k == 'x' ||
          k == '-') {
        continue;
      }
      if (k == '<' && i + 3 < p.size() && (p[i + 3] == '=' || p[i + 3] == '!')) continue;
      return "(?" + std::string(1, k) + " group";
    }
  }
  return "";
}

struct ClassExtra {
  std::string_view name;
  std::string_view items;
};
constexpr ClassExtra kClassExtras[] = {
#include "tokenizer/unicode_classes.inc"
};

// Oniguruma's \s under Unicode: White_Space (PCRE2's \s also matches U+180E).
constexpr std::string_view kSpaceItems =
    "\\t-\\r\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}"
    "\\x{202f}\\x{205f}\\x{3000}";

std::string_view extras_of(std::string_view cls) {
  for (const auto& e : kClassExtras) {
    if (e.name == cls) return e.items;
  }
  return {};
}

// Rewrites a tokenizer.json pattern so PCRE2 classifies characters as Oniguruma does: \s gets
// Oniguruma's definition, \p{..} classes gain the code points newer Unicode assigned to them.
bool translate(std::string_view p, std::string& out, std::string& error) {
  bool in_class = false;
  size_t class_start = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char e = p[i + 1];
      if (e == 'p' || e == 'P') {
        std::string_view name;
        size_t end;
        if (i + 2 < p.size() && p[i + 2] == '{') {
          end = p.find('}', i + 3);
          if (end == std::string_view::npos) {
            error = "unterminated \\p{ in pattern";
            return false;
          }
          name = p.substr(i + 3, end - i - 3);
        } else {
          end = i + 2;
          name = p.substr(i + 2, 1);
        }
        std::string_view extra = extras_of(name);
        std::string base = "\\p{" + std::string(name) + "}";
        if (extra.empty()) {
          out.append(p.substr(i, end + 1 - i));
        } else if (e == 'p') {
          if (in_class) {
            out.append(base).append(extra);
          } else {
            out.append("[").append(base).append(extra).append("]");
          }
        } else {
          if (in_class) {
            error = "\\P{" + std::string(name) + "} inside a character class is not supported";
            return false;
          }
          out.append("[^").append(base).append(extra).append("]");
        }
        i = end;
        continue;
      }
      if (e == 's' || e == 'S' || e == 'd') {
        if (e == 'd') {
          std::string_view extra = extras_of("Nd");
          out.append(in_class ? "" : "[")
              .append("\\p{Nd}")
              .append(extra)
              .append(in_class ? "" : "]");
        } else if (in_class) {
          if (e == 'S') {
            error = "\\S inside a character class is not supported";
            return false;
          }
          out.append(kSpaceItems);
        } else {
          out.append(e == 's' ? "[" : "[^").append(kSpaceItems).append("]");
        }
        ++i;
        continue;
      }
      out.push_back(c);
      out.push_back(e);
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      class_start = i;
      out.push_back(c);
      // A ']' right after '[' or '[^' is a literal.
      if (i + 1 < p.size() && p[i + 1] == '^') {
        out.push_back('^');
        ++i;
      }
      if (i + 1 < p.size() && p[i + 1] == ']') {
        out.push_back(']');
        ++i;
      }
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {
      size_t end = p.find(":]", i + 2);
      if (end != std::string_view::npos) {
        out.append(p.substr(i, end + 2 - i));
        i = end + 1;
        continue;
      }
    }
    if (in_class && c == ']' && i > class_start) in_class = false;
    out.push_back(c);
  }
  return true;
}

}  // namespace

std::string pcre2_error_message(int code) {
  PCRE2_UCHAR buf[256];
  int n = pcre2_get_error_message(code, buf, sizeof(buf));
  if (n < 0) return "PCRE2 error " + std::to_string(code);
  return std::string(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
}

std::unique_ptr<Regex> Regex::compile(std::string_view pattern, std::string& error) {
  if (std::string bad = unsupported_construct(pattern); !bad.empty()) {
    error = "unsupported regex construct " + bad + " in pattern " + std::string(pattern);
    return nullptr;
  }
  std::string translated;
  if (!translate(pattern, translated, error)) {
    error += " (pattern " + std::string(pattern) + ")";
    return nullptr;
  }
  int err = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &offset, nullptr);
  if (code == nullptr) {
    error = "regex does not compile at offset " + std::to_string(offset) + ": " +
            pcre2_error_message(err) + " (pattern " + std::string(pattern) + ")";
    return nullptr;
  }
  std::unique_ptr<Regex> r(new Regex());
  r->code_ = code;
  r->pattern_ = std::string(pattern);
  r->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return r;
}

std::unique_ptr<Regex> Regex::literal(std::string_view text, std::string& error) {
  if (text.empty()) {
    error = "empty split pattern";
    return nullptr;
  }
  std::unique_ptr<Regex> r(new Regex());
  r->is_literal_ = true;
  r->literal_ = std::string(text);
  r->pattern_ = std::string(text);
  return r;
}

Regex::~Regex() {
  if (code_ != nullptr) pcre2_code_free(static_cast<pcre2_code*>(code_));
}

int Regex::find(std::string_view subject, size_t start, size_t& mstart, size_t& mend) const {
  if (is_literal_) {
    if (start > subject.size()) return 0;
    const void* hit =
        memmem(subject.data() + start, subject.size() - start, literal_.data(), literal_.size());
    if (hit == nullptr) return 0;
    mstart = static_cast<size_t>(static_cast<const char*>(hit) - subject.data());
    mend = mstart + literal_.size();
    return 1;
  }
  ThreadMatcher& m = matcher();
  if (m.data == nullptr) return PCRE2_ERROR_NOMEMORY;
  auto* code = static_cast<pcre2_code*>(code_);
  auto subj = reinterpret_cast<PCRE2_SPTR>(subject.data());
  int rc;
  if (jit_) {
    rc = pcre2_jit_match(code, subj, subject.size(), start, 0, m.data, m.context);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      // Fall back to the interpreter, which keeps its backtracking state on the heap.
      rc = pcre2_match(code, subj, subject.size(), start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, m.data,
                       nullptr);
    }
  } else {
    rc = pcre2_match(code, subj, subject.size(), start, PCRE2_NO_UTF_CHECK, m.data, nullptr);
  }
  if (rc == PCRE2_ERROR_NOMATCH) return 0;
  if (rc < 0) return rc;
  PCRE2_SIZE* ov = pcre2_get_ovector_pointer(m.data);
  mstart = ov[0];
  mend = ov[1];
  return 1;
}

}  // namespace kvgate::tokenizer::detail
