// Rules the compiler cannot enforce, checked over the sources. GCC 12.2 miscompiles a co_await
// inside the condition of an if/while/switch (the coroutine traps with an illegal instruction, or
// crashes on paths that never run the line; reproduced with plain Asio): await into a variable,
// then test it. It also mishandles the temporary of a conditional expression inside a co_await
// expression (a crash when the coroutine resumes: GatewayRetry, when the request path became
// phases): name the value first.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace kvgate {
namespace {

// The code of a C++ source with comments removed and the contents of string and character
// literals (raw strings included) blanked, so neither can unbalance parentheses or quote a rule.
std::string code_only(const std::string& src) {
  std::string out;
  out.reserve(src.size());
  size_t i = 0;
  auto keep_newlines = [&](size_t from, size_t to) {
    for (size_t k = from; k < to && k < src.size(); ++k) out.push_back(src[k] == '\n' ? '\n' : ' ');
  };
  while (i < src.size()) {
    char c = src[i];
    if (c == '/' && i + 1 < src.size() && src[i + 1] == '/') {
      size_t end = src.find('\n', i);
      if (end == std::string::npos) end = src.size();
      keep_newlines(i, end);
      i = end;
    } else if (c == '/' && i + 1 < src.size() && src[i + 1] == '*') {
      size_t end = src.find("*/", i + 2);
      end = end == std::string::npos ? src.size() : end + 2;
      keep_newlines(i, end);
      i = end;
    } else if (c == 'R' && i + 1 < src.size() && src[i + 1] == '"') {
      size_t open = src.find('(', i + 2);
      std::string delim = ")" + src.substr(i + 2, open - i - 2) + "\"";
      size_t end = src.find(delim, open);
      end = end == std::string::npos ? src.size() : end + delim.size();
      out += "\"\"";
      keep_newlines(i + 2, end);
      i = end;
    } else if (c == '"' || c == '\'') {
      size_t k = i + 1;
      while (k < src.size() && src[k] != c) k += src[k] == '\\' ? 2 : 1;
      out.push_back(c);
      keep_newlines(i + 1, k);
      out.push_back(c);
      i = k + 1;
    } else {
      out.push_back(c);
      ++i;
    }
  }
  return out;
}

// Every "if (...)", "while (...)" and "switch (...)" condition of `text` that contains co_await,
// as "file:line". The init-statement of an if (before its ';') is allowed.
std::vector<std::string> awaits_in_conditions(const std::string& file, const std::string& text) {
  std::vector<std::string> out;
  for (const char* kw : {"if (", "while (", "switch ("}) {
    size_t pos = 0;
    std::string k = kw;
    while ((pos = text.find(k, pos)) != std::string::npos) {
      bool word_start = pos == 0 || !(std::isalnum(static_cast<unsigned char>(text[pos - 1])) ||
                                      text[pos - 1] == '_');
      size_t open = pos + k.size() - 1;
      pos = open + 1;
      if (!word_start) continue;
      int depth = 0;
      size_t cond_begin = open + 1, end = open;
      for (size_t i = open; i < text.size(); ++i) {
        if (text[i] == '(') ++depth;
        if (text[i] == ')' && --depth == 0) {
          end = i;
          break;
        }
        if (text[i] == ';' && depth == 1) cond_begin = i + 1;  // past an init-statement
      }
      std::string cond = text.substr(cond_begin, end - cond_begin);
      if (cond.find("co_await") != std::string::npos) {
        size_t line = 1 + static_cast<size_t>(std::count(
                              text.begin(), text.begin() + static_cast<long>(open), '\n'));
        out.push_back(file + ":" + std::to_string(line));
      }
    }
  }
  return out;
}

// Every co_await expression of `text` (to the end of its statement) that contains a conditional
// operator or a braced initializer (other than `{}` and lambda bodies: a braced aggregate
// temporary is destroyed twice by GCC 12.2, reproduced under ASan), as "file:line".
std::vector<std::string> conditionals_in_awaits(const std::string& file, const std::string& text) {
  std::vector<std::string> out;
  size_t pos = 0;
  while ((pos = text.find("co_await", pos)) != std::string::npos) {
    size_t at = pos;
    pos += 8;
    int depth = 0;
    for (size_t i = pos; i < text.size(); ++i) {
      char c = text[i];
      if (c == '(' || c == '{' || c == '[') ++depth;
      if (c == ')' || c == '}' || c == ']') {
        if (--depth < 0) break;
      }
      if (c == ';' && depth == 0) break;
      bool braced = false;
      if (c == '{') {
        size_t next = text.find_first_not_of(" \t\n", i + 1);
        size_t prev = text.find_last_not_of(" \t\n", i - 1);
        bool empty = next != std::string::npos && text[next] == '}';
        bool lambda_body =
            prev != std::string::npos && (text[prev] == ')' || text[prev] == ']' ||
                                          (prev >= 6 && text.compare(prev - 6, 7, "mutable") == 0));
        braced = !empty && !lambda_body;
      }
      if (c == '?' || braced) {
        size_t line = 1 + static_cast<size_t>(
                              std::count(text.begin(), text.begin() + static_cast<long>(at), '\n'));
        out.push_back(file + ":" + std::to_string(line));
        break;
      }
    }
  }
  return out;
}

TEST(SourceRules, AwaitSelfTest) {
  EXPECT_EQ(awaits_in_conditions("f", "if (!co_await x()) return;").size(), 1u);
  EXPECT_EQ(awaits_in_conditions("f", "while (n > 0 &&\n !co_await x()) {}").size(), 1u);
  EXPECT_EQ(awaits_in_conditions("f", "bool ok = co_await x();\nif (!ok) return;").size(), 0u);
  EXPECT_EQ(awaits_in_conditions("f", "if (int e = co_await x(); e) {}").size(), 0u);
  EXPECT_EQ(awaits_in_conditions("f", "if (a) co_await x();").size(), 0u);
  EXPECT_EQ(awaits_in_conditions("f", code_only("// if (co_await x)\nint y;")).size(), 0u);
  EXPECT_EQ(awaits_in_conditions("f", code_only("if (s == \"(\") { co_await x(); }")).size(), 0u);
  EXPECT_EQ(
      awaits_in_conditions("f", code_only("f(R\"(if (co_await)\"); if (!co_await y) {}")).size(),
      1u);
  EXPECT_EQ(conditionals_in_awaits("f", "co_await f(a ? x() : y());").size(), 1u);
  EXPECT_EQ(conditionals_in_awaits("f", "co_await f(\n  a\n  ? x() : y(), w);").size(), 1u);
  EXPECT_EQ(conditionals_in_awaits("f", "E e = a ? x() : y();\nco_await f(e);").size(), 0u);
  EXPECT_EQ(conditionals_in_awaits("f", "if (a) { co_await f(); } int b = c ? 1 : 2;").size(), 0u);
  EXPECT_EQ(conditionals_in_awaits("f", code_only("co_await f(\"?\");")).size(), 0u);
  EXPECT_EQ(conditionals_in_awaits("f", "co_await f(E{1, 2});").size(), 1u);
  EXPECT_EQ(conditionals_in_awaits("f", "co_await f(ex, {}, x);").size(), 0u);
  EXPECT_EQ(conditionals_in_awaits("f", "co_await f([&] { return 1; });").size(), 0u);
  EXPECT_EQ(conditionals_in_awaits("f", "co_await f([x]() mutable { x(); });").size(), 0u);
}

TEST(SourceRules, NoCoAwaitInsideAConditionAnywhere) {
  std::vector<std::string> found, conditionals;
  std::string root = KVGATE_SOURCE_DIR;
  for (const char* dir : {"src", "sim", "bench", "tests"}) {
    for (const auto& e : std::filesystem::recursive_directory_iterator(root + "/" + dir)) {
      auto ext = e.path().extension();
      if (ext != ".cc" && ext != ".h") continue;
      if (e.path().filename() == "source_rules_test.cc") continue;
      std::ifstream in(e.path());
      std::stringstream ss;
      ss << in.rdbuf();
      auto hits =
          awaits_in_conditions(e.path().lexically_relative(root).string(), code_only(ss.str()));
      found.insert(found.end(), hits.begin(), hits.end());
      hits =
          conditionals_in_awaits(e.path().lexically_relative(root).string(), code_only(ss.str()));
      conditionals.insert(conditionals.end(), hits.begin(), hits.end());
    }
  }
  std::string list;
  for (const auto& f : found) list += "  " + f + "\n";
  EXPECT_TRUE(found.empty()) << "co_await inside a condition (await into a variable first):\n"
                             << list;
  list.clear();
  for (const auto& f : conditionals) list += "  " + f + "\n";
  EXPECT_TRUE(conditionals.empty())
      << "a conditional expression or a braced temporary inside a co_await expression (name "
         "its value first):\n"
      << list;
}

}  // namespace
}  // namespace kvgate
