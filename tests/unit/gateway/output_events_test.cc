// Tests for gateway/output_events: which SSE events carry output, fed whole or in any pieces.
#include "gateway/output_events.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace kvgate {
namespace {

using Format = OutputEventCounter::Format;

uint32_t count_whole(const std::string& body, Format format = Format::kDefault) {
  OutputEventCounter c(format);
  return c.feed(body);
}

// The counts per piece when `body` is cut at `cuts` (sorted offsets).
uint32_t count_in_pieces(const std::string& body, const std::vector<size_t>& cuts,
                         Format format = Format::kDefault) {
  OutputEventCounter c(format);
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
  // Spaced JSON (Python's json.dumps) is read too.
  EXPECT_EQ(count_whole("data: {\"text\": \"Hi\"}\n\ndata: {\"text\":  \"\"}\n\n"), 1u);
}

// A /v1/responses stream as SGLang's serving_responses.py writes it (and the sim, keys in the
// OpenAI SDK's order): the lifecycle events, a reasoning item and a message item, each opened
// (*.added), its deltas, closed with the whole text (*.done), then response.completed with the
// whole response. Five deltas carry output (one of them empty does not).
std::string responses_event(const std::string& type, const std::string& fields, int seq) {
  return "event: " + type + "\ndata: {" + fields + (fields.empty() ? "" : ",") +
         "\"sequence_number\":" + std::to_string(seq) + ",\"type\":\"" + type + "\"}\n\n";
}
const std::string kResponsesStream = [] {
  const std::string response =
      R"("response":{"id":"resp_3f2a9c1e5b7d4e6f8a0b1c2d3e4f5a6b","object":"response",)"
      R"("created_at":1796264910,"model":"qwen3",)";
  const std::string done_response =
      response +
      R"("output":[{"id":"rs_1","summary":[],"type":"reasoning","content":[{"text":"Think.",)"
      R"("type":"reasoning_text"}],"status":"completed"},{"id":"msg_1","content":[{)"
      R"("annotations":[],"text":"Hello there","type":"output_text","logprobs":null}],)"
      R"("role":"assistant","status":"completed","type":"message"}],"status":"completed",)"
      R"("usage":{"input_tokens":12,"input_tokens_details":{"cached_tokens":8},)"
      R"("output_tokens":6,"output_tokens_details":{"reasoning_tokens":2},"total_tokens":18},)"
      R"("metadata":{"delta":"not an event's"}})";
  const std::string in_progress = response + R"("output":[],"status":"in_progress","usage":null})";
  const std::string rs = R"("item_id":"rs_1","output_index":0)";
  const std::string msg = R"("item_id":"msg_1","logprobs":[],"output_index":1)";
  int seq = 0;
  std::string s;
  s += responses_event("response.created", in_progress, seq++);
  s += responses_event("response.in_progress", in_progress, seq++);
  s += responses_event("response.output_item.added",
                       R"("item":{"id":"rs_1","summary":[],"type":"reasoning","status":)"
                       R"("in_progress"},"output_index":0)",
                       seq++);
  s += responses_event("response.content_part.added",
                       R"("content_index":0,"item_id":"rs_1","output_index":0,"part":{)"
                       R"("annotations":[],"text":"","type":"output_text","logprobs":null})",
                       seq++);
  s += responses_event("response.reasoning_text.delta", R"("content_index":0,"delta":"Thi",)" + rs,
                       seq++);
  s += responses_event("response.reasoning_text.delta", R"("content_index":0,"delta":"nk.",)" + rs,
                       seq++);
  s += responses_event("response.reasoning_text.done",
                       R"("content_index":0,)" + rs + R"(,"text":"Think.")", seq++);
  s += responses_event("response.output_item.done",
                       R"("item":{"id":"rs_1","summary":[],"type":"reasoning","content":[{)"
                       R"("text":"Think.","type":"reasoning_text"}],"status":"completed"},)"
                       R"("output_index":0)",
                       seq++);
  s += responses_event("response.output_item.added",
                       R"("item":{"id":"msg_1","content":[],"role":"assistant","status":)"
                       R"("in_progress","type":"message"},"output_index":1)",
                       seq++);
  s += responses_event("response.content_part.added",
                       R"("content_index":0,"item_id":"msg_1","output_index":1,"part":{)"
                       R"("annotations":[],"text":"","type":"output_text","logprobs":null})",
                       seq++);
  for (const char* piece : {"Hel", "", "lo", " there"}) {
    s +=
        responses_event("response.output_text.delta",
                        R"("content_index":0,"delta":")" + std::string(piece) + "\"," + msg, seq++);
  }
  s += responses_event("response.output_text.done",
                       R"("content_index":0,)" + msg + R"(,"text":"Hello there")", seq++);
  s += responses_event("response.content_part.done",
                       R"("content_index":0,"item_id":"msg_1","output_index":1,"part":{)"
                       R"("annotations":[],"text":"Hello there","type":"output_text",)"
                       R"("logprobs":null})",
                       seq++);
  s += responses_event("response.output_item.done",
                       R"("item":{"id":"msg_1","content":[{"annotations":[],"text":)"
                       R"("Hello there","type":"output_text","logprobs":null}],"role":)"
                       R"("assistant","status":"completed","type":"message"},"output_index":1)",
                       seq++);
  s += responses_event("response.completed", done_response, seq++);
  return s;
}();

TEST(OutputEvents, ResponsesStreamCountsOneEventPerDelta) {
  OutputEventCounter c(Format::kResponses);
  EXPECT_EQ(c.feed(kResponsesStream), 5u);
  EXPECT_EQ(c.events(), 18u);
  // Function-call arguments stream as deltas too; a lone delta with a type of another kind, or a
  // type too long to be an event's, is not one.
  EXPECT_EQ(
      count_whole("event: response.function_call_arguments.delta\n"
                  "data: {\"delta\":\"{\\\"city\\\"\",\"item_id\":\"fc_1\",\"output_index\":0,"
                  "\"sequence_number\":3,\"type\":\"response.function_call_arguments.delta\"}"
                  "\n\n",
                  Format::kResponses),
      1u);
  EXPECT_EQ(count_whole("data: {\"delta\":\"x\",\"type\":\"response.output_text.done\"}\n\n",
                        Format::kResponses),
            0u);
  EXPECT_EQ(
      count_whole("data: {\"delta\":\"x\",\"type\":\"" + std::string(60, 'a') + ".delta\"}\n\n",
                  Format::kResponses),
      0u);
  // Every cut gives the same count.
  for (size_t cut = 1; cut < kResponsesStream.size(); ++cut) {
    ASSERT_EQ(count_in_pieces(kResponsesStream, {cut}, Format::kResponses), 5u) << cut;
  }
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
                         "[DONE]",
                         "\"delta\":\"d\"",
                         "\"type\":\"response.output_text.delta\"",
                         "\"type\":  \"a.delta",
                         "\"type\":\"response.output_text.done\"",
                         "\"",
                         ","};
  for (int round = 0; round < 3000; ++round) {
    std::string body;
    int n = 1 + static_cast<int>(rng() % 16);
    for (int i = 0; i < n; ++i) body += parts[rng() % std::size(parts)];
    std::vector<size_t> cuts;
    for (size_t at = 1 + rng() % 5; at < body.size(); at += 1 + rng() % 7) cuts.push_back(at);
    ASSERT_EQ(count_in_pieces(body, cuts), count_whole(body)) << body;
    ASSERT_EQ(count_in_pieces(body, cuts, Format::kResponses),
              count_whole(body, Format::kResponses))
        << body;
  }
}

}  // namespace
}  // namespace kvgate
