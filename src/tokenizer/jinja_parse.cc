// tokenizer/jinja_parse: lexer (jinja2's whitespace rules with trim_blocks and lstrip_blocks) and
// recursive-descent parser (jinja2's grammar and operator precedence) for Template::parse.
#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "tokenizer/jinja.h"
#include "tokenizer/jinja_internal.h"
#include "tokenizer/unicode.h"

namespace kvgate::tokenizer::jinja {
namespace {

struct ParseError {
  std::string message;
};

enum class Tok : uint8_t {
  kData,
  kBlockBegin,
  kBlockEnd,
  kVarBegin,
  kVarEnd,
  kName,
  kString,
  kInt,
  kFloat,
  kOp,
  kEof,
};

struct Token {
  Tok type;
  std::string text;  // data, name, op, string (unescaped), number text
  uint32_t line;
};

bool is_space_at(std::string_view s, size_t i, size_t& len) {
  size_t k = i;
  char32_t c = unicode::next_code_point(s, k);
  len = k - i;
  return unicode::is_python_space(c);
}

// Python str.rstrip() (whitespace).
std::string_view rstrip_ws(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t p = end - 1;
    while (p > 0 && (static_cast<unsigned char>(s[p]) & 0xC0) == 0x80) --p;
    size_t len;
    if (!is_space_at(s, p, len)) break;
    end = p;
  }
  return s.substr(0, end);
}

size_t skip_ws(std::string_view s, size_t i) {
  size_t len;
  while (i < s.size() && is_space_at(s, i, len)) i += len;
  return i;
}

bool all_ws(std::string_view s) {
  if (s.empty()) return false;
  size_t i = 0, len;
  while (i < s.size()) {
    if (!is_space_at(s, i, len)) return false;
    i += len;
  }
  return true;
}

void unescape_into(std::string_view body, std::string& out, uint32_t line) {
  auto hexval = [&](std::string_view h) -> int64_t {
    int64_t v = 0;
    for (char c : h) {
      int d;
      if (c >= '0' && c <= '9')
        d = c - '0';
      else if (c >= 'a' && c <= 'f')
        d = c - 'a' + 10;
      else if (c >= 'A' && c <= 'F')
        d = c - 'A' + 10;
      else
        return -1;
      v = v * 16 + d;
    }
    return v;
  };
  for (size_t i = 0; i < body.size(); ++i) {
    char c = body[i];
    if (c != '\\' || i + 1 >= body.size()) {
      out.push_back(c);
      continue;
    }
    char e = body[++i];
    switch (e) {
      case '\n':
        break;
      case '\\':
        out.push_back('\\');
        break;
      case '\'':
        out.push_back('\'');
        break;
      case '"':
        out.push_back('"');
        break;
      case 'a':
        out.push_back('\a');
        break;
      case 'b':
        out.push_back('\b');
        break;
      case 'f':
        out.push_back('\f');
        break;
      case 'n':
        out.push_back('\n');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'v':
        out.push_back('\v');
        break;
      case 'x':
      case 'u':
      case 'U': {
        size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        int64_t v = i + n < body.size() ? hexval(body.substr(i + 1, n)) : -1;
        if (v < 0 || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
          throw ParseError{"line " + std::to_string(line) + ": invalid \\" + std::string(1, e) +
                           " escape in a string literal"};
        }
        unicode::append_utf8(static_cast<char32_t>(v), out);
        i += n;
        break;
      }
      default:
        if (e >= '0' && e <= '7') {
          int v = e - '0';
          size_t k = 1;
          while (k < 3 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7') {
            v = v * 8 + (body[++i] - '0');
            ++k;
          }
          unicode::append_utf8(static_cast<char32_t>(v), out);
        } else {
          out.push_back('\\');  // unknown escapes stay as written (as Python)
          out.push_back(e);
        }
    }
  }
}

class Lexer {
 public:
  explicit Lexer(std::string_view source) {
    // Newlines: \r\n and \r become \n; one trailing newline is dropped (keep_trailing_newline off).
    src_.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_.push_back('\n');
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_.push_back(source[i]);
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<Token> run() {
    std::string_view s = src_;
    size_t pos = 0;
    bool line_starting = true;
    while (pos < s.size()) {
      size_t tag = find_tag(s, pos);
      if (tag == std::string_view::npos) {
        emit_data(s.substr(pos));
        break;
      }
      std::string_view text = s.substr(pos, tag - pos);
      char kind = s[tag + 1];  // '{', '%' or '#'
      char sign = tag + 2 < s.size() && (s[tag + 2] == '-' || s[tag + 2] == '+') ? s[tag + 2] : 0;
      // raw block?
      size_t raw_end = 0;
      bool is_raw = kind == '%' && match_raw_begin(s, tag, raw_end);
      if (sign == '-') {
        text = rstrip_ws(text);
      } else if (sign != '+' && kind != '{') {
        size_t l_pos = text.rfind('\n');
        l_pos = l_pos == std::string_view::npos ? 0 : l_pos + 1;
        if ((l_pos > 0 || line_starting) && all_ws(text.substr(l_pos))) {
          text = text.substr(0, l_pos);
        }
      }
      emit_data(text);
      line_ += count_nl(s.substr(pos, tag - pos));
      if (is_raw) {
        pos = lex_raw(s, raw_end, line_starting);
        continue;
      }
      size_t after = tag + 2 + (sign ? 1 : 0);
      if (kind == '#') {
        size_t end = s.find("#}", after);
        if (end == std::string_view::npos) fail("missing end of comment tag");
        line_ += count_nl(s.substr(tag, end - tag));
        char end_sign = end > after && (s[end - 1] == '-' || s[end - 1] == '+') ? s[end - 1] : 0;
        pos = end + 2;
        if (end_sign == '-') {
          size_t np = skip_ws(s, pos);
          line_ += count_nl(s.substr(pos, np - pos));
          pos = np;
        } else if (end_sign != '+' && pos < s.size() && s[pos] == '\n') {
          ++pos;
          ++line_;
        }
        line_starting = pos > 0 && s[pos - 1] == '\n';
        continue;
      }
      tokens_.push_back({kind == '%' ? Tok::kBlockBegin : Tok::kVarBegin, "", line_});
      pos = lex_tag(s, after, kind == '%', line_starting);
    }
    tokens_.push_back({Tok::kEof, "", line_});
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void fail(const std::string& msg) const {
    throw ParseError{"line " + std::to_string(line_) + ": " + msg};
  }
  static uint32_t count_nl(std::string_view s) {
    return static_cast<uint32_t>(std::count(s.begin(), s.end(), '\n'));
  }
  static size_t find_tag(std::string_view s, size_t pos) {
    while (true) {
      size_t p = s.find('{', pos);
      if (p == std::string_view::npos || p + 1 >= s.size()) return std::string_view::npos;
      char n = s[p + 1];
      if (n == '{' || n == '%' || n == '#') return p;
      pos = p + 1;
    }
  }
  void emit_data(std::string_view text) {
    if (!text.empty()) tokens_.push_back({Tok::kData, std::string(text), line_});
  }
  // {%[-+]? raw [-]?%}
  static bool match_raw_begin(std::string_view s, size_t tag, size_t& end) {
    size_t i = tag + 2;
    if (i < s.size() && (s[i] == '-' || s[i] == '+')) ++i;
    i = skip_ws(s, i);
    if (s.substr(i, 3) != "raw") return false;
    i = skip_ws(s, i + 3);
    if (s.substr(i, 3) == "-%}") {
      end = skip_ws(s, i + 3);
      return true;
    }
    if (s.substr(i, 2) == "%}") {
      end = i + 2;
      return true;
    }
    return false;
  }
  size_t lex_raw(std::string_view s, size_t start, bool& line_starting) {
    size_t search = start;
    while (true) {
      size_t p = s.find("{%", search);
      if (p == std::string_view::npos) fail("missing end of raw directive");
      size_t i = p + 2;
      char sign = i < s.size() && (s[i] == '-' || s[i] == '+') ? s[i] : 0;
      if (sign) ++i;
      i = skip_ws(s, i);
      if (s.substr(i, 6) != "endraw") {
        search = p + 2;
        continue;
      }
      i = skip_ws(s, i + 6);
      size_t end;
      if (s.substr(i, 3) == "+%}") {
        end = i + 3;
      } else if (s.substr(i, 3) == "-%}") {
        end = skip_ws(s, i + 3);
      } else if (s.substr(i, 2) == "%}") {
        end = i + 2;
        if (end < s.size() && s[end] == '\n') ++end;
      } else {
        search = p + 2;
        continue;
      }
      std::string_view text = s.substr(start, p - start);
      if (sign == '-') {
        text = rstrip_ws(text);
      } else if (sign != '+') {
        size_t l_pos = text.rfind('\n');
        l_pos = l_pos == std::string_view::npos ? 0 : l_pos + 1;
        if (l_pos > 0 && all_ws(text.substr(l_pos))) text = text.substr(0, l_pos);
      }
      emit_data(text);
      line_ += count_nl(s.substr(start, end - start));
      line_starting = end > 0 && s[end - 1] == '\n';
      return end;
    }
  }
  size_t lex_tag(std::string_view s, size_t i, bool block, bool& line_starting) {
    int depth = 0;
    while (true) {
      // whitespace
      size_t len;
      while (i < s.size() && is_space_at(s, i, len)) {
        if (s[i] == '\n') ++line_;
        i += len;
      }
      if (i >= s.size())
        fail(block ? "unexpected end of template in a {% %} tag"
                   : "unexpected end of template in a {{ }} tag");
      if (depth == 0) {
        if (block) {
          if (s.substr(i, 3) == "+%}") {
            tokens_.push_back({Tok::kBlockEnd, "", line_});
            line_starting = false;
            return i + 3;
          }
          if (s.substr(i, 3) == "-%}") {
            tokens_.push_back({Tok::kBlockEnd, "", line_});
            size_t e = skip_ws(s, i + 3);
            line_ += count_nl(s.substr(i, e - i));
            line_starting = e > 0 && s[e - 1] == '\n';
            return e;
          }
          if (s.substr(i, 2) == "%}") {
            tokens_.push_back({Tok::kBlockEnd, "", line_});
            size_t e = i + 2;
            if (e < s.size() && s[e] == '\n') {
              ++e;
              ++line_;
            }
            line_starting = s[e - 1] == '\n';
            return e;
          }
        } else {
          if (s.substr(i, 3) == "-}}") {
            tokens_.push_back({Tok::kVarEnd, "", line_});
            size_t e = skip_ws(s, i + 3);
            line_ += count_nl(s.substr(i, e - i));
            line_starting = e > 0 && s[e - 1] == '\n';
            return e;
          }
          if (s.substr(i, 2) == "}}") {
            tokens_.push_back({Tok::kVarEnd, "", line_});
            line_starting = false;
            return i + 2;
          }
        }
      }
      char c = s[i];
      if (c >= '0' && c <= '9') {
        i = lex_number(s, i);
        continue;
      }
      if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
          static_cast<unsigned char>(c) >= 0x80) {
        size_t j = i;
        while (j < s.size()) {
          char d = s[j];
          if ((d >= 'a' && d <= 'z') || (d >= 'A' && d <= 'Z') || (d >= '0' && d <= '9') ||
              d == '_' || static_cast<unsigned char>(d) >= 0x80) {
            ++j;
          } else {
            break;
          }
        }
        tokens_.push_back({Tok::kName, std::string(s.substr(i, j - i)), line_});
        i = j;
        continue;
      }
      if (c == '\'' || c == '"') {
        size_t j = i + 1;
        while (j < s.size() && s[j] != c) {
          if (s[j] == '\\') ++j;
          ++j;
        }
        if (j >= s.size()) fail("unterminated string literal");
        std::string v;
        unescape_into(s.substr(i + 1, j - i - 1), v, line_);
        line_ += count_nl(s.substr(i, j - i));
        tokens_.push_back({Tok::kString, std::move(v), line_});
        i = j + 1;
        continue;
      }
      static const char* kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
      bool two = false;
      for (const char* op : kTwo) {
        if (s.substr(i, 2) == op) {
          tokens_.push_back({Tok::kOp, op, line_});
          i += 2;
          two = true;
          break;
        }
      }
      if (two) continue;
      if (std::strchr("+-/*%~[](){}><=.:|,;", c) == nullptr) {
        fail(std::string("unexpected character '") + c + "'");
      }
      if (c == '(' || c == '[' || c == '{') ++depth;
      if (c == ')' || c == ']' || c == '}') {
        if (depth == 0) fail(std::string("unexpected '") + c + "'");
        --depth;
      }
      tokens_.push_back({Tok::kOp, std::string(1, c), line_});
      ++i;
    }
  }
  size_t lex_number(std::string_view s, size_t i) {
    size_t j = i;
    auto digits = [&] {
      while (j < s.size() && ((s[j] >= '0' && s[j] <= '9') || s[j] == '_')) ++j;
    };
    digits();
    bool is_float = false;
    if (j + 1 < s.size() && s[j] == '.' && s[j + 1] >= '0' && s[j + 1] <= '9' &&
        !(!tokens_.empty() && tokens_.back().type == Tok::kOp && tokens_.back().text == ".")) {
      ++j;
      digits();
      is_float = true;
    }
    if (j < s.size() && (s[j] == 'e' || s[j] == 'E')) {
      size_t k = j + 1;
      if (k < s.size() && (s[k] == '+' || s[k] == '-')) ++k;
      if (k < s.size() && s[k] >= '0' && s[k] <= '9') {
        j = k;
        digits();
        is_float = true;
      }
    }
    std::string text;
    for (char c : s.substr(i, j - i)) {
      if (c != '_') text.push_back(c);
    }
    tokens_.push_back({is_float ? Tok::kFloat : Tok::kInt, std::move(text), line_});
    return j;
  }

  std::string src_;
  std::vector<Token> tokens_;
  uint32_t line_ = 1;
};

// ---- parser ----

class Parser {
 public:
  Parser(std::vector<Token> tokens, Template::Impl& t) : toks_(std::move(tokens)), t_(t) {}

  void run() {
    std::vector<std::string_view> none;
    parse_body(t_.body, none);
    if (cur().type != Tok::kEof) fail("unexpected tag");
  }

 private:
  const Token& cur() const { return toks_[pos_]; }
  const Token& peek(size_t k = 1) const { return toks_[std::min(pos_ + k, toks_.size() - 1)]; }
  [[noreturn]] void fail(const std::string& msg) const {
    throw ParseError{"line " + std::to_string(cur().line) + ": " + msg};
  }
  bool is_op(std::string_view op) const { return cur().type == Tok::kOp && cur().text == op; }
  bool is_name(std::string_view n) const { return cur().type == Tok::kName && cur().text == n; }
  void expect_op(std::string_view op) {
    if (!is_op(op)) fail("expected '" + std::string(op) + "'" + got());
    ++pos_;
  }
  void expect_name(std::string_view n) {
    if (!is_name(n)) fail("expected '" + std::string(n) + "'" + got());
    ++pos_;
  }
  void expect(Tok t, const char* what) {
    if (cur().type != t) fail(std::string("expected ") + what + got());
    ++pos_;
  }
  std::string got() const {
    switch (cur().type) {
      case Tok::kEof:
        return " but the template ended";
      case Tok::kBlockEnd:
        return " but got '%}'";
      case Tok::kVarEnd:
        return " but got '}}'";
      case Tok::kData:
        return " but got text";
      default:
        return " but got '" + cur().text + "'";
    }
  }
  NodePtr node(NodeKind k) { return std::make_unique<Node>(k, cur().line); }

  // Statements until one of `ends` ({% name %}) or EOF; leaves pos at the {% of the end tag.
  void parse_body(NodeList& out, const std::vector<std::string_view>& ends) {
    while (cur().type != Tok::kEof) {
      if (cur().type == Tok::kData) {
        auto n = node(NodeKind::kText);
        n->value = Value(cur().text);
        n->value.make_immortal();
        n->owns_value = true;
        out.push_back(std::move(n));
        ++pos_;
        continue;
      }
      if (cur().type == Tok::kVarBegin) {
        ++pos_;
        auto n = node(NodeKind::kOutput);
        n->x = parse_tuple(true);
        expect(Tok::kVarEnd, "'}}'");
        out.push_back(std::move(n));
        continue;
      }
      if (cur().type == Tok::kBlockBegin) {
        const Token& nt = peek();
        if (nt.type != Tok::kName) {
          ++pos_;
          fail("expected a statement name after '{%'");
        }
        for (auto e : ends) {
          if (nt.text == e) return;
        }
        ++pos_;
        out.push_back(parse_statement());
        continue;
      }
      fail("unexpected token" + got());
    }
    if (!ends.empty()) {
      std::string want;
      for (auto e : ends)
        want += (want.empty() ? "" : " or ") + std::string("{% ") + std::string(e) + " %}";
      fail("missing " + want);
    }
  }

  // At the statement name (after '{%').
  NodePtr parse_statement() {
    DepthGuard guard(*this);
    std::string name = cur().text;
    if (name == "if") return parse_if();
    if (name == "for") return parse_for();
    if (name == "set") return parse_set();
    if (name == "macro") return parse_macro();
    if (name == "break" || name == "continue") {
      auto n = node(name == "break" ? NodeKind::kBreak : NodeKind::kContinue);
      ++pos_;
      if (loop_depth_ == 0) fail("'" + name + "' outside of a loop");
      expect(Tok::kBlockEnd, "'%}'");
      return n;
    }
    if (name == "filter") return parse_filter_block();
    if (name == "with") return parse_with();
    if (name == "generation") {
      // transformers' {% generation %} marks assistant text; it renders its body unchanged.
      ++pos_;
      expect(Tok::kBlockEnd, "'%}'");
      auto n = node(NodeKind::kWith);
      parse_body(n->a, {"endgeneration"});
      end_tag("endgeneration");
      return n;
    }
    fail("unsupported statement '{% " + name + " %}'");
  }

  void end_tag(std::string_view name) {
    expect(Tok::kBlockBegin, "'{%'");
    expect_name(name);
    expect(Tok::kBlockEnd, "'%}'");
  }

  NodePtr parse_if() {
    auto n = node(NodeKind::kIf);
    ++pos_;  // if / elif
    n->x = parse_tuple(false);
    expect(Tok::kBlockEnd, "'%}'");
    parse_body(n->a, {"elif", "else", "endif"});
    ++pos_;  // {%
    if (is_name("elif")) {
      DepthGuard guard(*this);  // an elif is an if inside the else branch
      n->b.push_back(parse_if());
      return n;
    }
    if (is_name("else")) {
      ++pos_;
      expect(Tok::kBlockEnd, "'%}'");
      parse_body(n->b, {"endif"});
      ++pos_;
    }
    expect_name("endif");
    expect(Tok::kBlockEnd, "'%}'");
    return n;
  }

  NodePtr parse_assign_target(bool allow_attr) {
    // name | name.attr | name, name, ...
    std::vector<NodePtr> items;
    bool tuple = false;
    while (true) {
      if (cur().type != Tok::kName) fail("expected a variable name" + got());
      auto t = node(NodeKind::kName);
      t->name = cur().text;
      t->sym = t_.intern(t->name);
      ++pos_;
      if (allow_attr && is_op(".")) {
        ++pos_;
        if (cur().type != Tok::kName) fail("expected an attribute name" + got());
        auto a = node(NodeKind::kAttr);
        a->x = std::move(t);
        a->name = cur().text;
        a->id = method_mask(a->name);
        ++pos_;
        t = std::move(a);
      }
      items.push_back(std::move(t));
      if (!is_op(",")) break;
      tuple = true;
      ++pos_;
      if (cur().type != Tok::kName) break;  // trailing comma
    }
    if (!tuple) return std::move(items[0]);
    auto n = node(NodeKind::kTuple);
    n->a = std::move(items);
    return n;
  }

  NodePtr parse_for() {
    auto n = node(NodeKind::kFor);
    ++pos_;
    n->x = parse_assign_target(false);
    expect_name("in");
    n->y = parse_tuple(false, /*with_condexpr=*/false);
    if (is_name("if")) {
      ++pos_;
      n->z = parse_expression(true);
      n->flag = true;
    }
    if (is_name("recursive")) fail("unsupported: recursive for loops");
    expect(Tok::kBlockEnd, "'%}'");
    ++loop_depth_;
    parse_body(n->a, {"endfor", "else"});
    --loop_depth_;
    ++pos_;
    if (is_name("else")) {
      ++pos_;
      expect(Tok::kBlockEnd, "'%}'");
      parse_body(n->b, {"endfor"});
      ++pos_;
    }
    expect_name("endfor");
    expect(Tok::kBlockEnd, "'%}'");
    return n;
  }

  NodePtr parse_set() {
    ++pos_;
    auto target = parse_assign_target(true);
    if (is_op("=")) {
      ++pos_;
      auto n = node(NodeKind::kSet);
      n->x = std::move(target);
      n->y = parse_tuple(false);
      expect(Tok::kBlockEnd, "'%}'");
      return n;
    }
    auto n = node(NodeKind::kSetBlock);
    if (target->kind != NodeKind::kName) fail("a block set assigns one name");
    n->x = std::move(target);
    // Optional filters: {% set x | trim %}
    NodePtr filt;
    while (is_op("|")) {
      ++pos_;
      filt = parse_filter(std::move(filt));
    }
    n->y = std::move(filt);
    expect(Tok::kBlockEnd, "'%}'");
    parse_body(n->a, {"endset"});
    end_tag("endset");
    return n;
  }

  NodePtr parse_macro() {
    auto n = node(NodeKind::kMacro);
    ++pos_;
    if (cur().type != Tok::kName) fail("expected a macro name" + got());
    n->name = cur().text;
    n->sym = t_.intern(n->name);
    ++pos_;
    expect_op("(");
    bool defaults = false;
    while (!is_op(")")) {
      if (!n->params.empty()) expect_op(",");
      if (is_op(")")) break;
      if (cur().type != Tok::kName) fail("expected a parameter name" + got());
      Param p;
      p.name = cur().text;
      p.sym = t_.intern(p.name);
      ++pos_;
      if (is_op("=")) {
        ++pos_;
        p.dflt = parse_expression(true);
        defaults = true;
      } else if (defaults) {
        fail("non-default argument follows default argument");
      }
      n->params.push_back(std::move(p));
    }
    ++pos_;
    expect(Tok::kBlockEnd, "'%}'");
    int saved = loop_depth_;
    loop_depth_ = 0;
    parse_body(n->a, {"endmacro"});
    loop_depth_ = saved;
    end_tag("endmacro");
    return n;
  }

  NodePtr parse_filter_block() {
    auto n = node(NodeKind::kFilterBlock);
    ++pos_;
    NodePtr f;
    f = parse_filter(std::move(f));
    while (is_op("|")) {
      ++pos_;
      f = parse_filter(std::move(f));
    }
    n->x = std::move(f);
    expect(Tok::kBlockEnd, "'%}'");
    parse_body(n->a, {"endfilter"});
    end_tag("endfilter");
    return n;
  }

  NodePtr parse_with() {
    auto n = node(NodeKind::kWith);
    ++pos_;
    while (cur().type != Tok::kBlockEnd) {
      if (!n->b.empty()) expect_op(",");
      auto s = node(NodeKind::kSet);
      s->x = parse_assign_target(false);
      expect_op("=");
      s->y = parse_expression(true);
      n->b.push_back(std::move(s));
    }
    ++pos_;
    parse_body(n->a, {"endwith"});
    end_tag("endwith");
    return n;
  }

  // ---- expressions ----

  // expr (',' expr)* ; a tuple when there is a comma.
  NodePtr parse_tuple(bool /*allow_empty*/, bool with_condexpr = true) {
    auto first = parse_expression(with_condexpr);
    if (!is_op(",")) return first;
    auto n = node(NodeKind::kTuple);
    n->a.push_back(std::move(first));
    while (is_op(",")) {
      ++pos_;
      if (cur().type == Tok::kBlockEnd || cur().type == Tok::kVarEnd || is_op(")") ||
          is_name("in") || is_name("if")) {
        break;
      }
      n->a.push_back(parse_expression(with_condexpr));
    }
    return n;
  }

  // Nesting guard: parentheses, brackets, unary chains and nested blocks recurse.
  struct DepthGuard {
    explicit DepthGuard(Parser& p) : p_(p) {
      if (++p_.depth_ > 200) p_.fail("expression or block nested too deeply");
    }
    ~DepthGuard() { --p_.depth_; }
    DepthGuard(const DepthGuard&) = delete;
    DepthGuard& operator=(const DepthGuard&) = delete;
    Parser& p_;
  };

  NodePtr parse_expression(bool with_condexpr = true) {
    DepthGuard guard(*this);
    auto e = parse_or();
    if (!with_condexpr) return e;
    while (is_name("if")) {
      auto n = node(NodeKind::kCondExpr);
      ++pos_;
      n->y = std::move(e);
      n->x = parse_or();
      if (is_name("else")) {
        ++pos_;
        n->z = parse_expression(true);
      }
      e = std::move(n);
    }
    return e;
  }

  NodePtr parse_or() {
    auto l = parse_and();
    while (is_name("or")) {
      auto n = node(NodeKind::kOr);
      ++pos_;
      n->x = std::move(l);
      n->y = parse_and();
      l = std::move(n);
    }
    return l;
  }

  NodePtr parse_and() {
    auto l = parse_not();
    while (is_name("and")) {
      auto n = node(NodeKind::kAnd);
      ++pos_;
      n->x = std::move(l);
      n->y = parse_not();
      l = std::move(n);
    }
    return l;
  }

  NodePtr parse_not() {
    DepthGuard guard(*this);
    if (is_name("not")) {
      auto n = node(NodeKind::kNot);
      ++pos_;
      n->x = parse_not();
      return n;
    }
    return parse_compare();
  }

  NodePtr parse_compare() {
    auto first = parse_math1();
    NodePtr n;
    while (true) {
      CmpOp op;
      if (is_op("=="))
        op = CmpOp::kEq;
      else if (is_op("!="))
        op = CmpOp::kNe;
      else if (is_op("<"))
        op = CmpOp::kLt;
      else if (is_op("<="))
        op = CmpOp::kLe;
      else if (is_op(">"))
        op = CmpOp::kGt;
      else if (is_op(">="))
        op = CmpOp::kGe;
      else if (is_name("in"))
        op = CmpOp::kIn;
      else if (is_name("not") && peek().type == Tok::kName && peek().text == "in") {
        op = CmpOp::kNotIn;
        ++pos_;
      } else {
        break;
      }
      ++pos_;
      if (!n) {
        n = node(NodeKind::kCompare);
        n->x = std::move(first);
      }
      n->cmp.push_back(op);
      n->a.push_back(parse_math1());
    }
    return n ? std::move(n) : std::move(first);
  }

  NodePtr binary(BinOp op, NodePtr l, NodePtr r) {
    auto n = node(NodeKind::kBinary);
    n->op = static_cast<uint8_t>(op);
    n->x = std::move(l);
    n->y = std::move(r);
    return n;
  }

  NodePtr parse_math1() {
    auto l = parse_concat();
    while (is_op("+") || is_op("-")) {
      BinOp op = is_op("+") ? BinOp::kAdd : BinOp::kSub;
      ++pos_;
      l = binary(op, std::move(l), parse_concat());
    }
    return l;
  }

  NodePtr parse_concat() {
    auto l = parse_math2();
    while (is_op("~")) {
      ++pos_;
      l = binary(BinOp::kConcat, std::move(l), parse_math2());
    }
    return l;
  }

  NodePtr parse_math2() {
    auto l = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      BinOp op = is_op("*")    ? BinOp::kMul
                 : is_op("/")  ? BinOp::kDiv
                 : is_op("//") ? BinOp::kFloorDiv
                               : BinOp::kMod;
      ++pos_;
      l = binary(op, std::move(l), parse_pow());
    }
    return l;
  }

  NodePtr parse_pow() {
    auto l = parse_unary(true);
    while (is_op("**")) {
      ++pos_;
      l = binary(BinOp::kPow, std::move(l), parse_unary(true));
    }
    return l;
  }

  NodePtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    NodePtr n;
    if (is_op("-") || is_op("+")) {
      n = node(is_op("-") ? NodeKind::kNeg : NodeKind::kPos);
      ++pos_;
      n->x = parse_unary(false);
    } else {
      n = parse_primary();
    }
    n = parse_postfix(std::move(n));
    if (with_filter) n = parse_filter_expr(std::move(n));
    return n;
  }

  NodePtr parse_primary() {
    const Token& t = cur();
    switch (t.type) {
      case Tok::kName: {
        if (t.text == "true" || t.text == "True" || t.text == "false" || t.text == "False") {
          auto n = node(NodeKind::kConst);
          n->value = Value(t.text == "true" || t.text == "True");
          ++pos_;
          return n;
        }
        if (t.text == "none" || t.text == "None") {
          auto n = node(NodeKind::kConst);
          n->value = Value::none();
          ++pos_;
          return n;
        }
        auto n = node(NodeKind::kName);
        n->name = t.text;
        n->sym = t_.intern(t.text);
        ++pos_;
        return n;
      }
      case Tok::kString: {
        auto n = node(NodeKind::kConst);
        std::string s = t.text;
        ++pos_;
        while (cur().type == Tok::kString) {  // adjacent literals concatenate
          s += cur().text;
          ++pos_;
        }
        n->value = Value(std::move(s));
        n->value.make_immortal();
        n->owns_value = true;
        return n;
      }
      case Tok::kInt: {
        auto n = node(NodeKind::kConst);
        errno = 0;
        long long v = std::strtoll(t.text.c_str(), nullptr, 10);
        if (errno == ERANGE) fail("integer literal out of range");
        n->value = Value(static_cast<int64_t>(v));
        ++pos_;
        return n;
      }
      case Tok::kFloat: {
        auto n = node(NodeKind::kConst);
        n->value = Value(std::strtod(t.text.c_str(), nullptr));
        ++pos_;
        return n;
      }
      case Tok::kOp:
        if (t.text == "(") {
          ++pos_;
          if (is_op(")")) {
            ++pos_;
            auto n = node(NodeKind::kTuple);
            return n;
          }
          auto e = parse_tuple(false);
          if (e->kind == NodeKind::kTuple) e->flag = true;
          expect_op(")");
          return e;
        }
        if (t.text == "[") {
          ++pos_;
          auto n = node(NodeKind::kList);
          while (!is_op("]")) {
            if (!n->a.empty()) expect_op(",");
            if (is_op("]")) break;
            n->a.push_back(parse_expression(true));
          }
          ++pos_;
          return n;
        }
        if (t.text == "{") {
          ++pos_;
          auto n = node(NodeKind::kDict);
          while (!is_op("}")) {
            if (!n->a.empty()) expect_op(",");
            if (is_op("}")) break;
            n->a.push_back(parse_expression(true));
            expect_op(":");
            n->b.push_back(parse_expression(true));
          }
          ++pos_;
          return n;
        }
        break;
      default:
        break;
    }
    fail("expected an expression" + got());
  }

  NodePtr parse_postfix(NodePtr n) {
    while (true) {
      if (is_op(".")) {
        ++pos_;
        if (cur().type == Tok::kName) {
          auto a = node(NodeKind::kAttr);
          a->x = std::move(n);
          a->name = cur().text;
          a->id = method_mask(a->name);
          ++pos_;
          n = std::move(a);
        } else if (cur().type == Tok::kInt) {
          auto a = node(NodeKind::kItem);
          a->x = std::move(n);
          a->y = node(NodeKind::kConst);
          a->y->value = Value(static_cast<int64_t>(std::strtoll(cur().text.c_str(), nullptr, 10)));
          ++pos_;
          n = std::move(a);
        } else {
          fail("expected an attribute name after '.'" + got());
        }
      } else if (is_op("[")) {
        ++pos_;
        n = parse_subscript(std::move(n));
      } else if (is_op("(")) {
        n = parse_call(std::move(n));
      } else {
        return n;
      }
    }
  }

  NodePtr parse_subscript(NodePtr obj) {
    // [expr] or [start:stop:step]
    NodePtr parts[3];
    int idx = 0;
    bool slice = false;
    if (!is_op(":")) parts[0] = parse_expression(true);
    while (is_op(":")) {
      slice = true;
      ++pos_;
      ++idx;
      if (idx > 2) fail("too many ':' in a slice");
      if (!is_op(":") && !is_op("]")) parts[idx] = parse_expression(true);
    }
    if (!slice && is_op(",")) {
      fail("tuple subscripts are not supported");
    }
    expect_op("]");
    if (!slice) {
      auto n = node(NodeKind::kItem);
      n->x = std::move(obj);
      n->y = std::move(parts[0]);
      return n;
    }
    auto n = node(NodeKind::kSlice);
    n->x = std::move(obj);
    for (auto& p : parts) n->a.push_back(std::move(p));
    return n;
  }

  void parse_args(Node& n) {
    expect_op("(");
    bool kw = false;
    while (!is_op(")")) {
      if (!n.a.empty() || !n.kwargs.empty()) expect_op(",");
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) fail("argument unpacking (*args, **kwargs) is not supported");
      if (cur().type == Tok::kName && peek().type == Tok::kOp && peek().text == "=") {
        std::string key = cur().text;
        pos_ += 2;
        n.kwargs.emplace_back(key, parse_expression(true));
        kw = true;
        continue;
      }
      if (kw) fail("positional argument follows keyword argument");
      n.a.push_back(parse_expression(true));
    }
    ++pos_;
  }

  NodePtr parse_call(NodePtr callee) {
    auto n = node(NodeKind::kCall);
    if (callee->kind == NodeKind::kAttr && !is_known_method(callee->name)) {
      fail("unsupported method '." + callee->name + "()'");
    }
    n->x = std::move(callee);
    parse_args(*n);
    return n;
  }

  NodePtr parse_filter(NodePtr operand) {
    if (cur().type != Tok::kName) fail("expected a filter name" + got());
    auto n = node(NodeKind::kFilter);
    n->name = cur().text;
    ++pos_;
    while (is_op(".")) {  // dotted filter names are not a thing in chat templates
      fail("unsupported filter '" + n->name + ".'");
    }
    n->id = find_name(filter_names(), n->name);
    if (n->id < 0) fail("unsupported filter '" + n->name + "'");
    n->x = std::move(operand);
    if (is_op("(")) parse_args(*n);
    return n;
  }

  NodePtr parse_filter_expr(NodePtr n) {
    while (true) {
      if (is_op("|")) {
        ++pos_;
        n = parse_filter(std::move(n));
      } else if (is_name("is")) {
        ++pos_;
        auto t = node(NodeKind::kTest);
        if (is_name("not")) {
          t->flag = true;
          ++pos_;
        }
        if (cur().type != Tok::kName) fail("expected a test name" + got());
        t->name = cur().text;
        ++pos_;
        t->id = find_name(test_names(), t->name);
        if (t->id < 0) fail("unsupported test '" + t->name + "'");
        t->x = std::move(n);
        if (is_op("(")) {
          parse_args(*t);
        } else if ((cur().type == Tok::kName || cur().type == Tok::kString ||
                    cur().type == Tok::kInt || cur().type == Tok::kFloat || is_op("[") ||
                    is_op("{")) &&
                   !(is_name("else") || is_name("or") || is_name("and") || is_name("if") ||
                     is_name("in") || is_name("is") || is_name("not"))) {
          auto arg = parse_primary();
          arg = parse_postfix(std::move(arg));
          t->a.push_back(std::move(arg));
        }
        n = std::move(t);
      } else if (is_op("(")) {
        n = parse_call(std::move(n));
      } else {
        return n;
      }
    }
  }

  std::vector<Token> toks_;
  size_t pos_ = 0;
  int loop_depth_ = 0;
  int depth_ = 0;
  Template::Impl& t_;
};

}  // namespace

void Node::take_children(std::vector<NodePtr>& out) {
  for (NodePtr* p : {&x, &y, &z}) {
    if (*p) out.push_back(std::move(*p));
  }
  for (NodeList* list : {&a, &b}) {
    for (auto& n : *list) {
      if (n) out.push_back(std::move(n));
    }
    list->clear();
  }
  for (auto& kv : kwargs) {
    if (kv.second) out.push_back(std::move(kv.second));
  }
  kwargs.clear();
  for (auto& p : params) {
    if (p.dflt) out.push_back(std::move(p.dflt));
  }
}

Node::~Node() {
  if (owns_value) value.free_immortal();
  std::vector<NodePtr> pending;
  take_children(pending);
  while (!pending.empty()) {
    NodePtr n = std::move(pending.back());
    pending.pop_back();
    n->take_children(pending);
  }  // each node is freed here, with no children left to free recursively
}

namespace {

// Fails when the tree is deeper than kMaxSyntaxDepth. The parser's recursion is bounded on its
// own (DepthGuard), but chains it builds in a loop are not: `a + b + c ...`, `x.a.b ...`,
// `x | f | g ...` nest one node per operator.
void check_depth(const NodeList& body) {
  std::vector<std::pair<const Node*, int>> stack;
  for (const auto& n : body) stack.emplace_back(n.get(), 1);
  while (!stack.empty()) {
    auto [n, depth] = stack.back();
    stack.pop_back();
    if (depth > kMaxSyntaxDepth) {
      throw ParseError{"line " + std::to_string(n->line) +
                       ": expression or block nested too deeply (more than " +
                       std::to_string(kMaxSyntaxDepth) + " levels)"};
    }
    for (const Node* c : {n->x.get(), n->y.get(), n->z.get()}) {
      if (c) stack.emplace_back(c, depth + 1);
    }
    for (const NodeList* list : {&n->a, &n->b}) {
      for (const auto& c : *list) {
        if (c) stack.emplace_back(c.get(), depth + 1);
      }
    }
    for (const auto& kv : n->kwargs) {
      if (kv.second) stack.emplace_back(kv.second.get(), depth + 1);
    }
    for (const auto& p : n->params) {
      if (p.dflt) stack.emplace_back(p.dflt.get(), depth + 1);
    }
  }
}

}  // namespace

int find_name(const std::vector<std::string_view>& names, std::string_view name) {
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == name) return static_cast<int>(i);
  }
  return -1;
}

std::unique_ptr<Template> Template::parse(std::string_view source, std::string& error) {
  if (!unicode::is_valid_utf8(source)) {
    error = "chat template: the template text is not valid UTF-8";
    return nullptr;
  }
  auto impl = std::make_unique<Impl>();
  impl->sym_loop = impl->intern("loop");
  try {
    Lexer lexer(source);
    Parser parser(lexer.run(), *impl);
    parser.run();
    check_depth(impl->body);
  } catch (const ParseError& e) {
    error = "chat template: " + e.message;
    return nullptr;
  }
  return std::unique_ptr<Template>(new Template(std::move(impl)));
}

Template::Template(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Template::~Template() = default;

}  // namespace kvgate::tokenizer::jinja
