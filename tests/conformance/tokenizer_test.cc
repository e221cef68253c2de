// Conformance: `kvgate tokenize` against HF tokenizers' Rust core (@anush008/tokenizers) for ids
// and @huggingface/jinja for chat prompts, over the corpus of tokenizer_reference.mjs (English,
// code, CJK, emoji and ZWJ sequences, Arabic/Devanagari, whitespace runs, digits, special-token
// strings in text, invalid UTF-8, very long words, a 100k-token document, every code point, random
// Unicode; chats single/multi turn, with and without system, tools and tool calls, generation
// prompt on and off; decodes), twice (the second time from a warm piece cache). Every model of
// models/ that scripts/setup fetched is checked; qwen3 and llama3 are required. 100% identical
// answers are required.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "support/process.h"

#ifndef KVGATE_SOURCE_DIR
#define KVGATE_SOURCE_DIR "."
#endif

namespace kvgate::testing {
namespace {

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<std::string> out;
  std::string line;
  while (std::getline(in, line)) out.push_back(line);
  return out;
}

std::string describe_difference(const nlohmann::json& got, const nlohmann::json& want) {
  std::ostringstream os;
  for (const auto& [key, value] : want.items()) {
    if (!got.contains(key)) {
      os << "missing \"" << key << "\"";
      if (got.contains("error")) os << " (error: " << got["error"].get<std::string>() << ")";
      return os.str();
    }
    if (got[key] == value) continue;
    if (value.is_array() && got[key].is_array()) {
      const auto& g = got[key];
      size_t i = 0;
      while (i < g.size() && i < value.size() && g[i] == value[i]) ++i;
      os << key << " differ at position " << i << " (got " << g.size() << ", want " << value.size()
         << ")";
      return os.str();
    }
    std::string gs = got[key].dump(), ws = value.dump();
    size_t i = 0;
    while (i < gs.size() && i < ws.size() && gs[i] == ws[i]) ++i;
    size_t from = i > 40 ? i - 40 : 0;
    os << key << " differ at char " << i << ": got ..." << gs.substr(from, 120) << "... want ..."
       << ws.substr(from, 120) << "...";
    return os.str();
  }
  return "extra keys: " + got.dump().substr(0, 200);
}

// Every model scripts/setup fetches is required: a missing one fails (setup is broken).
void check_model(const std::string& model) {
  std::string src = KVGATE_SOURCE_DIR;
  std::string dir = src + "/models/" + model;
  ASSERT_TRUE(std::filesystem::exists(dir + "/tokenizer.json"))
      << dir << " is missing: run scripts/setup (make test does)";
  std::string conf = src + "/tests/conformance";
  ASSERT_TRUE(std::filesystem::exists(conf + "/node_modules/@anush008/tokenizers"))
      << "reference packages missing: run scripts/setup";
  std::string out = std::filesystem::temp_directory_path().string() + "/kvgate-tok-conf-" + model +
                    "-" + std::to_string(::getpid());
  auto ref = run("/usr/bin/node", {conf + "/tokenizer_reference.mjs", dir, out});
  ASSERT_EQ(ref.status, 0) << ref.output;
  std::ifstream input(out + "/input.jsonl", std::ios::binary);
  std::stringstream in;
  in << input.rdbuf();
  // The corpus twice through one process: `kvgate tokenize` has the gateway's piece cache (the
  // ids of the text between added tokens), so the second pass answers every cacheable piece from
  // it, and must still be identical to the reference.
  auto got = run(bin_dir() + "/kvgate", {"tokenize", "--tokenizer-path", dir}, in.str() + in.str());
  ASSERT_EQ(got.status, 0) << got.output.substr(0, 2000);
  auto expected = lines_of(out + "/expected.jsonl");
  auto names = lines_of(out + "/names.txt");
  std::vector<std::string> answers;
  std::istringstream gs(got.output);
  for (std::string line; std::getline(gs, line);) answers.push_back(line);
  ASSERT_EQ(answers.size(), 2 * expected.size()) << "one answer per input line";
  size_t identical = 0, failures = 0;
  for (size_t i = 0; i < answers.size(); ++i) {
    const size_t k = i % expected.size();
    if (answers[i] == expected[k]) {  // the same bytes (the common case: no JSON to parse)
      ++identical;
      continue;
    }
    const char* pass = i < expected.size() ? "" : " (second pass: piece cache warm)";
    auto want = nlohmann::json::parse(expected[k]);
    auto have = nlohmann::json::parse(answers[i], nullptr, false);
    bool same = !have.is_discarded() &&
                (have == want || (want.contains("error") && have.contains("error")));
    if (same) {
      ++identical;
      continue;
    }
    if (++failures <= 10) {
      ADD_FAILURE() << model << ": " << names[k] << pass << ": " << describe_difference(have, want);
    }
  }
  std::cout << "[ " << model << " ] " << identical << "/" << answers.size()
            << " answers identical to the reference (the corpus twice; "
            << ref.output.substr(0, ref.output.find('\n')) << ")\n";
  EXPECT_EQ(identical, answers.size());
  std::filesystem::remove_all(out);
}

TEST(TokenizerConformance, Qwen3) {
  check_model("qwen3");
}
TEST(TokenizerConformance, Llama3) {
  check_model("llama3");
}
TEST(TokenizerConformance, Llama31) {
  check_model("llama3_1");
}
TEST(TokenizerConformance, DeepSeekV3) {
  check_model("deepseek_v3");
}
TEST(TokenizerConformance, GptOss) {
  check_model("gptoss");
}
TEST(TokenizerConformance, Llama2SentencePiece) {
  check_model("llama2");
}
TEST(TokenizerConformance, Gemma3SentencePiece) {
  check_model("gemma3");
}

}  // namespace
}  // namespace kvgate::testing
