// Rules the compiler cannot enforce, checked over the sources. GCC 12.2 miscompiles a co_await
// inside the condition of an if/while/switch (the coroutine traps with an illegal instruction, or
// crashes on paths that never run the line; reproduced with plain Asio): await into a variable,
// then test it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace kvgate {
namespace {

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
        size_t line = 1 + static_cast<size_t>(std::count(text.begin(), text.begin() + static_cast<long>(open), '\n'));
        out.push_back(file + ":" + std::to_string(line));
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
}

TEST(SourceRules, NoCoAwaitInsideAConditionAnywhere) {
  std::vector<std::string> found;
  std::string root = KVGATE_SOURCE_DIR;
  for (const char* dir : {"src", "sim", "bench", "tests"}) {
    for (const auto& e : std::filesystem::recursive_directory_iterator(root + "/" + dir)) {
      auto ext = e.path().extension();
      if (ext != ".cc" && ext != ".h") continue;
      if (e.path().filename() == "source_rules_test.cc") continue;
      std::ifstream in(e.path());
      std::stringstream ss;
      ss << in.rdbuf();
      auto hits = awaits_in_conditions(e.path().lexically_relative(root).string(), ss.str());
      found.insert(found.end(), hits.begin(), hits.end());
    }
  }
  std::string list;
  for (const auto& f : found) list += "  " + f + "\n";
  EXPECT_TRUE(found.empty()) << "co_await inside a condition (await into a variable first):\n"
                             << list;
}

}  // namespace
}  // namespace kvgate
