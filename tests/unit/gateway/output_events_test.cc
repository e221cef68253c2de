// Tests for gateway/output_events: which SSE events carry output, fed whole or in any pieces.
#include "gateway/output_events.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace kvgate {
namespace {

uint32_t count_whole(const std::string& body) {
  OutputEventCounter c;
  return c.feed(body);
}

// The counts per piece when `body` is cut at `cuts` (sorted offsets).
uint32_t count_in_pieces(const std::string& body, const std::vector<size_t>& cuts) {
  OutputEventCounter c;
  uint32_t total = 0;
  size_t at = 0;
  for (size_t cut : cuts) {
    total += c.feed(std::string_view(body).substr(at, cut - at));
    at = cut;
  }
  return total + c.feed(std::string_view(body).substr(at));
}

// What SGLang's OpenAI chat stream sends (pydantic's compact JSON): a role-only chunk, content
// chunks, a finish chunk, the usage chunk of include_usage, [DONE].
const std::string kChat =
    "data: {\"id\":\"1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":"
    "{\"role\":\"assistant\",\"content\":\"\",\"reasoning_content\":null,\"tool_calls\":null},"
    "\"finish_reason\":null}],\"usage\":null}\n\n"
    "data: {\"id\":\"1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"},"
    "\"finish_reason\":null}],\"usage\":null}\n\n"
    "data: {\"id\":\"1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"},"
    "\"finish_reason\":null}],\"usage\":null}\n\n"
    "data: {\"id\":\"1\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n"
    "data: {\"id\":\"1\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}"
    "\n\n"
    "data: [DONE]\n\n";

TEST(OutputEvents, ChatStreamCountsOnlyChunksWithContent) {
  OutputEventCounter c;
  EXPECT_EQ(c.feed(kChat), 2u);
  EXPECT_EQ(c.events(), 6u);
}

TEST(OutputEvents, GenerateCompletionsReasoningToolCallsAndResponses) {
  EXPECT_EQ(count_whole("data: {\"text\":\"Hi\",\"meta_info\":{\"id\":\"a\"}}\n\n"
                        "data: {\"text\":\"Hi there\",\"meta_info\":{}}\n\n"
                        "data: [DONE]\n\n"),
            2u);
  EXPECT_EQ(count_whole("data: {\"choices\":[{\"text\":\"x\",\"index\":0}]}\n\n"
                        "data: {\"choices\":[{\"text\":\"\",\"finish_reason\":\"length\"}]}\n\n"),
            1u);
  EXPECT_EQ(count_whole("data: {\"choices\":[{\"delta\":{\"content\":null,"
                        "\"reasoning_content\":\"think\"}}]}\n\n"),
            1u);
  EXPECT_EQ(count_whole("data: {\"choices\":[{\"delta\":{\"reasoning\":\"think\"}}]}\n\n"), 1u);
  EXPECT_EQ(count_whole("data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,"
                        "\"function\":{\"arguments\":\"{\\\"a\\\"\"}}]}}]}\n\n"
                        "data: {\"choices\":[{\"delta\":{\"tool_calls\":[]}}]}\n\n"),
            1u);
  EXPECT_EQ(count_whole("event: response.output_text.delta\n"
                        "data: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi\"}\n\n"),
            1u);
  // Spaced JSON (Python's json.dumps) is read too.
  EXPECT_EQ(count_whole("data: {\"text\": \"Hi\"}\n\ndata: {\"text\":  \"\"}\n\n"), 1u);
}

TEST(OutputEvents, ErrorsAbortsAndEscapedKeysAreNotOutput) {
  EXPECT_EQ(count_whole("data: {\"error\":{\"message\":\"queue full\",\"code\":503}}\n\n"), 0u);
  EXPECT_EQ(count_whole("data: {\"text\":\"\",\"meta_info\":{\"finish_reason\":{\"type\":"
                        "\"abort\"}}}\n\n"),
            0u);
  // A key inside a string (escaped quotes) is not a key.
  EXPECT_EQ(count_whole("data: {\"x\":\"\\\"text\\\":\\\"y\"}\n\n"), 0u);
  EXPECT_EQ(count_whole(": keep-alive\n\n"), 0u);
  // The last event has no blank line yet: not counted until it ends.
  OutputEventCounter c;
  EXPECT_EQ(c.feed("data: {\"text\":\"a\"}\n"), 0u);
  EXPECT_EQ(c.feed("\n"), 1u);
}

TEST(OutputEvents, CrLfBlankLines) {
  EXPECT_EQ(count_whole("data: {\"text\":\"a\"}\r\n\r\ndata: {\"text\":\"b\"}\n\r\n"), 2u);
}

TEST(OutputEvents, EveryCutGivesTheSameCount) {
  for (size_t cut = 1; cut < kChat.size(); ++cut) {
    ASSERT_EQ(count_in_pieces(kChat, {cut}), 2u) << cut;
  }
  const std::string spaced = "data: {\"reasoning_content\":        \"x\"}\n\n";
  for (size_t cut = 1; cut < spaced.size(); ++cut) {
    ASSERT_EQ(count_in_pieces(spaced, {cut}), 1u) << cut;
  }
}

TEST(OutputEvents, RandomPiecesAgreeWithTheWholeBody) {
  std::mt19937 rng(11);
  const char* parts[] = {"data: ",
                         "{\"text\":\"",
                         "\"content\":\"\"",
                         "\"content\":\"a\"",
                         "\"delta\":{}",
                         "\"tool_calls\":[",
                         "]",
                         "{",
                         "}",
                         "\n",
                         "\r",
                         "\n\n",
                         " ",
                         "\\\"",
                         "x",
                         "[DONE]"};
  for (int round = 0; round < 3000; ++round) {
    std::string body;
    int n = 1 + static_cast<int>(rng() % 16);
    for (int i = 0; i < n; ++i) body += parts[rng() % std::size(parts)];
    std::vector<size_t> cuts;
    for (size_t at = 1 + rng() % 5; at < body.size(); at += 1 + rng() % 7) cuts.push_back(at);
    ASSERT_EQ(count_in_pieces(body, cuts), count_whole(body)) << body;
  }
}

}  // namespace
}  // namespace kvgate
