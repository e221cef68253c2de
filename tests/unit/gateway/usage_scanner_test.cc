// Tests for gateway/usage_scanner: cached_tokens / prompt_tokens read from relayed pieces.
#include "gateway/usage_scanner.h"

#include <gtest/gtest.h>

#include <optional>
#include <random>
#include <string>

namespace kvgate {
namespace {

TEST(UsageScanner, WholeBodies) {
  UsageScanner s;
  s.feed(
      R"({"text":"x","meta_info":{"prompt_tokens":120,"cached_tokens":96,"completion_tokens":4}})");
  EXPECT_EQ(s.prompt_tokens(), 120);
  EXPECT_EQ(s.cached_tokens(), 96);
  EXPECT_EQ(s.completion_tokens(), 4);
  UsageScanner o;
  o.feed(R"({"usage":{"prompt_tokens": 50, "prompt_tokens_details": {"cached_tokens": 32}}})");
  EXPECT_EQ(o.prompt_tokens(), 50);
  EXPECT_EQ(o.cached_tokens(), 32);
  UsageScanner n;
  n.feed(R"({"usage":{"prompt_tokens":7,"prompt_tokens_details":null}})");
  EXPECT_EQ(n.prompt_tokens(), 7);
  EXPECT_FALSE(n.cached_tokens());
  EXPECT_FALSE(n.completion_tokens());
  // OpenAI usage with its details (reasoning_tokens is not the count of generated tokens).
  UsageScanner u;
  u.feed(R"({"usage":{"prompt_tokens":9,"completion_tokens":31,"total_tokens":40,)"
         R"("completion_tokens_details":{"reasoning_tokens":12}}})");
  EXPECT_EQ(u.completion_tokens(), 31);
  // The Responses API and Anthropic's messages say output_tokens.
  UsageScanner r;
  r.feed(R"({"usage":{"input_tokens":5,"output_tokens":17}})");
  EXPECT_EQ(r.completion_tokens(), 17);
  EXPECT_FALSE(r.prompt_tokens());
}

TEST(UsageScanner, StreamedUsageChunkAfterTheLastToken) {
  // stream_options.include_usage: the choices' chunks carry no usage, the last chunk does.
  UsageScanner s;
  s.feed("data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}],\"usage\":null}\n\n");
  EXPECT_FALSE(s.completion_tokens());
  s.feed(
      "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":8,"
      "\"prompt_tokens_details\":{\"cached_tokens\":2}}}\n\ndata: [DONE]\n\n");
  EXPECT_EQ(s.prompt_tokens(), 3);
  EXPECT_EQ(s.completion_tokens(), 8);
  EXPECT_EQ(s.cached_tokens(), 2);
}

TEST(UsageScanner, KeysAndNumbersSplitAcrossPieces) {
  std::string body =
      R"(data: {"meta_info":{"prompt_tokens":1234,"cached_tokens":5678,"completion_tokens":91}})";
  for (size_t cut = 1; cut < body.size(); ++cut) {
    UsageScanner s;
    s.feed(std::string_view(body).substr(0, cut));
    s.feed(std::string_view(body).substr(cut));
    EXPECT_EQ(s.prompt_tokens(), 1234) << cut;
    EXPECT_EQ(s.cached_tokens(), 5678) << cut;
    EXPECT_EQ(s.completion_tokens(), 91) << cut;
  }
}

TEST(UsageScanner, LastValueWins) {
  UsageScanner s;
  s.feed("data: {\"meta_info\":{\"cached_tokens\":0}}\n\n");
  s.feed("data: {\"meta_info\":{\"cached_tokens\":64}}\n\n");
  EXPECT_EQ(s.cached_tokens(), 64);
}

// What the scanner must find, written the plain way: every full key, its number, the last wins
// (`at`: where the last found key starts, to compare two keys that feed one value).
std::optional<int64_t> last_value(const std::string& s, const std::string& key,
                                  size_t* at = nullptr) {
  std::optional<int64_t> v;
  for (size_t p = s.find(key); p != std::string::npos; p = s.find(key, p + 1)) {
    size_t i = p + key.size();
    while (i < s.size() && s[i] == ' ') ++i;
    size_t start = i;
    int64_t n = 0;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9' && i - start < 18)
      n = n * 10 + (s[i++] - '0');
    if (i != start && i != s.size()) {
      v = n;
      if (at) *at = p;
    }
  }
  return v;
}

TEST(UsageScanner, AgreesWithAPlainSearchOnRandomBodiesInRandomPieces) {
  std::mt19937 rng(7);
  const char* parts[] = {"\"cached_tokens\":",
                         "\"prompt_tokens\":",
                         "\"completion_tokens\":",
                         "\"output_tokens\":",
                         "_tokens\":",
                         "\"cached",
                         "\"prompt",
                         "_",
                         " ",
                         "12",
                         "3",
                         "\"",
                         ",",
                         "x_tokens\":",
                         "{\"a\":1}"};
  for (int round = 0; round < 2000; ++round) {
    std::string body;
    int n = 1 + static_cast<int>(rng() % 12);
    for (int i = 0; i < n; ++i) body += parts[rng() % std::size(parts)];
    body += ",";  // a number at the very end is incomplete by design
    UsageScanner sc;
    for (size_t at = 0; at < body.size();) {
      size_t len = 1 + rng() % 9;
      sc.feed(std::string_view(body).substr(at, len));
      at += len;
    }
    EXPECT_EQ(sc.cached_tokens(), last_value(body, "\"cached_tokens\":")) << body;
    EXPECT_EQ(sc.prompt_tokens(), last_value(body, "\"prompt_tokens\":")) << body;
    size_t completion_at = 0, output_at = 0;
    auto completion = last_value(body, "\"completion_tokens\":", &completion_at);
    auto output = last_value(body, "\"output_tokens\":", &output_at);
    auto generated = !output || (completion && completion_at > output_at) ? completion : output;
    EXPECT_EQ(sc.completion_tokens(), generated) << body;
  }
}

}  // namespace
}  // namespace kvgate
