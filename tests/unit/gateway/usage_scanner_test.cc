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
  // The Responses API and Anthropic's messages say input_tokens and output_tokens.
  UsageScanner r;
  r.feed(R"({"usage":{"input_tokens":5,"output_tokens":17}})");
  EXPECT_EQ(r.completion_tokens(), 17);
  EXPECT_EQ(r.prompt_tokens(), 5);
  // A key that only starts like one is another key.
  UsageScanner d;
  d.feed(R"({"input_tokens_details":{"cached_tokens":3},"cache_read_input_tokens":9,)"
         R"("xinput_tokens":4,"output_tokens_details":{"reasoning_tokens":2}})");
  EXPECT_FALSE(d.prompt_tokens());
  EXPECT_FALSE(d.completion_tokens());
  EXPECT_EQ(d.cached_tokens(), 3);
  // At the very start of the body.
  UsageScanner b;
  b.feed(R"("input_tokens":6,)");
  EXPECT_EQ(b.prompt_tokens(), 6);
}

// What SGLang's /v1/responses answers (serving_responses.py; the sim's openai_responses.cc): the
// prompt is input_tokens, its cached part input_tokens_details.cached_tokens. Before input_tokens
// was read, the cached counter grew on /v1/responses and the prompt counter did not.
const std::string kResponsesAnswer =
    R"({"id":"resp_3f2a9c1e5b7d4e6f8a0b1c2d3e4f5a6b","object":"response","created_at":1796264910,)"
    R"("model":"qwen3","output":[{"id":"msg_0a1b2c3d4e5f60718293a4b5c6d7e8f9","content":[{)"
    R"("annotations":[],"text":"Caches keep prefixes.","type":"output_text","logprobs":null}],)"
    R"("role":"assistant","status":"completed","type":"message"}],"status":"completed",)"
    R"("usage":{"input_tokens":1200,"input_tokens_details":{"cached_tokens":1024,)"
    R"("cache_write_tokens":0},"output_tokens":5,"output_tokens_details":{"reasoning_tokens":0},)"
    R"("total_tokens":1205},"parallel_tool_calls":true,"tool_choice":"auto","tools":[]})";

TEST(UsageScanner, ResponsesApiUsageWholeStreamedAndInPieces) {
  UsageScanner whole;
  whole.feed(kResponsesAnswer);
  EXPECT_EQ(whole.prompt_tokens(), 1200);
  EXPECT_EQ(whole.cached_tokens(), 1024);
  EXPECT_EQ(whole.completion_tokens(), 5);
  // Streamed: the usage is in response.completed (response.created says "usage":null).
  UsageScanner stream;
  stream.feed(
      "event: response.created\ndata: {\"response\":{\"id\":\"resp_1\",\"usage\":null},"
      "\"sequence_number\":0,\"type\":\"response.created\"}\n\n");
  EXPECT_FALSE(stream.prompt_tokens());
  stream.feed("event: response.completed\ndata: {\"response\":" + kResponsesAnswer +
              ",\"sequence_number\":9,\"type\":\"response.completed\"}\n\n");
  EXPECT_EQ(stream.prompt_tokens(), 1200);
  EXPECT_EQ(stream.cached_tokens(), 1024);
  EXPECT_EQ(stream.completion_tokens(), 5);
  for (size_t cut = 1; cut < kResponsesAnswer.size(); ++cut) {
    UsageScanner s;
    s.feed(std::string_view(kResponsesAnswer).substr(0, cut));
    s.feed(std::string_view(kResponsesAnswer).substr(cut));
    ASSERT_EQ(s.prompt_tokens(), 1200) << cut;
    ASSERT_EQ(s.cached_tokens(), 1024) << cut;
  }
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
                         "\"input_tokens\":",
                         "\"input_tokens_details\":",
                         "\"input",
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
    // prompt_tokens and input_tokens feed one value: the later key wins.
    size_t prompt_at = 0, input_at = 0;
    auto prompt = last_value(body, "\"prompt_tokens\":", &prompt_at);
    auto input = last_value(body, "\"input_tokens\":", &input_at);
    EXPECT_EQ(sc.prompt_tokens(), !input || (prompt && prompt_at > input_at) ? prompt : input)
        << body;
    size_t completion_at = 0, output_at = 0;
    auto completion = last_value(body, "\"completion_tokens\":", &completion_at);
    auto output = last_value(body, "\"output_tokens\":", &output_at);
    auto generated = !output || (completion && completion_at > output_at) ? completion : output;
    EXPECT_EQ(sc.completion_tokens(), generated) << body;
  }
}

}  // namespace
}  // namespace kvgate
