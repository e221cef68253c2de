// Tests for sim/responses: every JSON/SSE shape parses and carries SGLang's keys and values.
#include "sim/responses.h"

#include <gtest/gtest.h>
#include <simdjson.h>

namespace kvgate::sim {
namespace {

using simdjson::dom::element;

// Parses `json` (kept alive by the fixture's parser until the next call).
class SimResponses : public ::testing::Test {
 protected:
  element parse(const std::string& json) {
    element e;
    auto err = parser.parse(json).get(e);
    EXPECT_FALSE(err) << json;
    return e;
  }
  static std::vector<std::string> keys(element e) {
    std::vector<std::string> out;
    simdjson::dom::object o;
    EXPECT_FALSE(e.get_object().get(o));
    for (auto f : o) out.emplace_back(f.key);
    return out;
  }
  simdjson::dom::parser parser;
  std::vector<int32_t> ids = {300, 301, 302};
  FinishReason length{.kind = FinishReason::Kind::kLength, .length = 3};
  OutputView view{.id = "0123456789abcdef0123456789abcdef",
                  .ids = ids,
                  .text = "a \"quoted\"\ntext",
                  .prompt_tokens = 10,
                  .completion_tokens = 3,
                  .cached_tokens = 4,
                  .dp_rank = 1,
                  .finish = &length,
                  .e2e_latency = 0.25};
  OpenAIContext ctx{
      .id = "0123456789abcdef0123456789abcdef", .model = "my-model", .created = 1700000000};
};

TEST_F(SimResponses, GenerateObject) {
  std::string out;
  append_generate_object(out, view);
  element e = parse(out);
  EXPECT_EQ(keys(e), (std::vector<std::string>{"text", "output_ids", "meta_info"}));
  EXPECT_EQ(std::string_view(e["text"]), "a \"quoted\"\ntext");
  EXPECT_EQ(e["output_ids"].get_array().size(), 3u);
  element m = e["meta_info"];
  EXPECT_EQ(keys(m),
            (std::vector<std::string>{"id", "finish_reason", "prompt_tokens", "weight_version",
                                      "total_retractions", "completion_tokens", "cached_tokens",
                                      "cached_tokens_details", "dp_rank", "e2e_latency"}));
  EXPECT_EQ(std::string_view(m["finish_reason"]["type"]), "length");
  EXPECT_EQ(int64_t(m["finish_reason"]["length"]), 3);
  EXPECT_EQ(int64_t(m["cached_tokens"]), 4);
  EXPECT_EQ(int64_t(m["dp_rank"]), 1);
  EXPECT_DOUBLE_EQ(double(m["e2e_latency"]), 0.25);
  EXPECT_TRUE(m["cached_tokens_details"].is_null());
}

TEST_F(SimResponses, GenerateChunkWhileRunningHasNullFinishAndNoLatency) {
  OutputView v = view;
  v.finish = nullptr;
  v.e2e_latency = -1;
  std::string out;
  append_generate_object(out, v, 2);
  element e = parse(out);
  EXPECT_TRUE(e["meta_info"]["finish_reason"].is_null());
  EXPECT_TRUE(e["meta_info"]["e2e_latency"].error());
  EXPECT_EQ(int64_t(e["index"]), 2);
}

TEST_F(SimResponses, StopFinishReasons) {
  FinishReason by_token{.kind = FinishReason::Kind::kStop, .matched_token = 257};
  FinishReason by_string{.kind = FinishReason::Kind::kStop, .matched_text = "the"};
  OutputView v = view;
  std::string out;
  v.finish = &by_token;
  append_generate_object(out, v);
  EXPECT_EQ(int64_t(parse(out)["meta_info"]["finish_reason"]["matched"]), 257);
  out.clear();
  v.finish = &by_string;
  append_chat_completion(out, ctx, std::span(&v, 1));
  element c = parse(out)["choices"].at(0);
  EXPECT_EQ(std::string_view(c["finish_reason"]), "stop");
  EXPECT_EQ(std::string_view(c["matched_stop"]), "the");
}

TEST_F(SimResponses, ChatCompletion) {
  std::string out;
  append_chat_completion(out, ctx, std::span(&view, 1));
  element e = parse(out);
  EXPECT_EQ(keys(e), (std::vector<std::string>{"id", "object", "created", "model", "choices",
                                               "usage", "metadata"}));
  EXPECT_EQ(std::string_view(e["id"]).size(), 32u);
  EXPECT_EQ(std::string_view(e["object"]), "chat.completion");
  EXPECT_EQ(std::string_view(e["model"]), "my-model");
  element c = e["choices"].at(0);
  EXPECT_EQ(keys(c), (std::vector<std::string>{"index", "message", "logprobs", "finish_reason",
                                               "matched_stop"}));
  EXPECT_EQ(keys(c["message"]),
            (std::vector<std::string>{"role", "content", "reasoning_content", "tool_calls"}));
  EXPECT_EQ(std::string_view(c["message"]["content"]), view.text);
  EXPECT_EQ(std::string_view(c["finish_reason"]), "length");
  EXPECT_TRUE(c["matched_stop"].is_null());
  element u = e["usage"];
  EXPECT_EQ(keys(u), (std::vector<std::string>{"prompt_tokens", "total_tokens", "completion_tokens",
                                               "prompt_tokens_details", "reasoning_tokens"}));
  EXPECT_EQ(int64_t(u["total_tokens"]), 13);
  EXPECT_TRUE(u["prompt_tokens_details"].is_null());  // no --enable-cache-report
  EXPECT_EQ(std::string_view(e["metadata"]["weight_version"]), "default");
}

TEST_F(SimResponses, CachedTokensOnlyWithCacheReportAndAHit) {
  OpenAIContext c = ctx;
  c.cache_report = true;
  std::string out;
  append_chat_completion(out, c, std::span(&view, 1));
  EXPECT_EQ(int64_t(parse(out)["usage"]["prompt_tokens_details"]["cached_tokens"]), 4);
  OutputView miss = view;
  miss.cached_tokens = 0;
  out.clear();
  append_completion(out, c, std::span(&miss, 1));
  EXPECT_TRUE(parse(out)["usage"]["prompt_tokens_details"].is_null());
}

TEST_F(SimResponses, Completion) {
  std::vector<OutputView> two = {view, view};
  std::string out;
  append_completion(out, ctx, two);
  element e = parse(out);
  EXPECT_EQ(std::string_view(e["object"]), "text_completion");
  EXPECT_EQ(e["choices"].get_array().size(), 2u);
  EXPECT_EQ(int64_t(e["choices"].at(1)["index"]), 1);
  EXPECT_EQ(keys(e["choices"].at(0)), (std::vector<std::string>{"index", "text", "logprobs",
                                                                "finish_reason", "matched_stop"}));
  EXPECT_EQ(int64_t(e["usage"]["prompt_tokens"]), 20);
}

TEST_F(SimResponses, ChatChunks) {
  std::string out;
  append_chat_role_chunk(out, ctx, 0);
  element e = parse(out);
  EXPECT_EQ(keys(e), (std::vector<std::string>{"id", "object", "created", "model", "choices"}));
  EXPECT_EQ(std::string_view(e["object"]), "chat.completion.chunk");
  element c = e["choices"].at(0);
  EXPECT_EQ(keys(c["delta"]), (std::vector<std::string>{"role", "content"}));
  EXPECT_EQ(std::string_view(c["delta"]["content"]), "");
  EXPECT_TRUE(c["finish_reason"].is_null());

  out.clear();
  append_chat_content_chunk(out, ctx, 0, " word");
  EXPECT_EQ(keys(parse(out)["choices"].at(0)["delta"]), std::vector<std::string>{"content"});

  out.clear();
  append_chat_finish_chunk(out, ctx, 0, length);
  c = parse(out)["choices"].at(0);
  EXPECT_EQ(c["delta"].get_object().size(), 0u);
  EXPECT_EQ(std::string_view(c["finish_reason"]), "length");
}

TEST_F(SimResponses, UsageChunks) {
  std::string out;
  append_usage_chunk(out, ctx, true, std::span(&view, 1));
  element e = parse(out);
  EXPECT_EQ(e["choices"].get_array().size(), 0u);
  EXPECT_TRUE(e["usage"]["prompt_tokens_details"].is_null());
  out.clear();
  append_usage_chunk(out, ctx, false, std::span(&view, 1));
  e = parse(out);
  EXPECT_EQ(std::string_view(e["object"]), "text_completion");
  EXPECT_TRUE(e["usage"]["prompt_tokens_details"].error());  // absent, not null
}

TEST_F(SimResponses, CompletionChunks) {
  std::string out;
  append_completion_chunk(out, ctx, 0, " more", nullptr);
  element e = parse(out);
  EXPECT_TRUE(e["usage"].is_null());
  EXPECT_TRUE(e["choices"].at(0)["finish_reason"].is_null());
  out.clear();
  append_completion_chunk(out, ctx, 0, "", &length);
  EXPECT_EQ(std::string_view(parse(out)["choices"].at(0)["finish_reason"]), "length");
}

TEST_F(SimResponses, Errors) {
  std::string out;
  append_openai_error(out, "bad \"thing\"", 400);
  element e = parse(out);
  EXPECT_EQ(keys(e), (std::vector<std::string>{"object", "message", "type", "param", "code"}));
  EXPECT_EQ(std::string_view(e["object"]), "error");
  EXPECT_EQ(std::string_view(e["type"]), "BadRequestError");
  EXPECT_TRUE(e["param"].is_null());
  EXPECT_EQ(int64_t(e["code"]), 400);
  out.clear();
  append_openai_stream_error(out, "boom", 500);
  EXPECT_EQ(std::string_view(parse(out)["error"]["type"]), "InternalServerError");
  out.clear();
  append_generate_error(out, "nope");
  EXPECT_EQ(std::string_view(parse(out)["error"]["message"]), "nope");
  EXPECT_EQ(openai_error_type(503), "ServiceUnavailable");
  EXPECT_EQ(openai_error_type(404), "NotFoundError");
}

TEST_F(SimResponses, AbortShapesFollowSglang) {
  // /generate: FINISH_ABORT.to_json() as the finish reason of a normal chunk.
  FinishReason abort{.kind = FinishReason::Kind::kAbort, .message = "full", .status_code = 503};
  OutputView v{.id = "rid", .prompt_tokens = 7, .finish = &abort, .e2e_latency = 0.5};
  std::string out;
  append_generate_object(out, v);
  element f = parse(out)["meta_info"]["finish_reason"];
  EXPECT_EQ(keys(f), (std::vector<std::string>{"type", "message", "status_code", "err_type"}));
  EXPECT_EQ(std::string_view(f["type"]), "abort");
  EXPECT_EQ(std::string_view(f["message"]), "full");
  EXPECT_EQ(int64_t(f["status_code"]), 503);
  EXPECT_TRUE(f["err_type"].is_null());
  EXPECT_EQ(int64_t(parse(out)["meta_info"]["completion_tokens"]), 0);
  EXPECT_EQ(parse(out)["output_ids"].get_array().size(), 0u);
  out.clear();
  FinishReason graceful{.kind = FinishReason::Kind::kAbort, .message = "bye"};
  v.finish = &graceful;
  append_generate_object(out, v);
  EXPECT_TRUE(parse(out)["meta_info"]["finish_reason"]["status_code"].is_null());

  // OpenAI streams: create_streaming_error_response's json.dumps, byte for byte.
  out.clear();
  append_openai_abort_event(out, "The request queue is full.", 503);
  EXPECT_EQ(out, R"({"error": {"object": "error", "message": "The request queue is full.", )"
                 R"("type": "SERVICE_UNAVAILABLE", "param": null, "code": 503}})");
  out.clear();
  append_openai_abort_event(out, "x", 500);
  EXPECT_EQ(std::string_view(parse(out)["error"]["type"]), "INTERNAL_SERVER_ERROR");
  EXPECT_EQ(http_status_name(400), "BAD_REQUEST");

  // Whole answers aborted with a 5xx: FastAPI's HTTPException body, the status as the type.
  out.clear();
  append_http_exception_error(out, "gone", 503);
  EXPECT_EQ(out, R"({"object":"error","message":"gone","type":"503","param":null,"code":503})");
}

TEST_F(SimResponses, SseFraming) {
  std::string out;
  append_sse(out, [](std::string& o) { o.append("{}"); });
  EXPECT_EQ(out, "data: {}\n\n");
  EXPECT_EQ(kSseDone, "data: [DONE]\n\n");
}

TEST_F(SimResponses, Numbers) {
  std::string out;
  append_int(out, -42);
  out.push_back(' ');
  append_double(out, 2);
  out.push_back(' ');
  append_double(out, 0.125);
  EXPECT_EQ(out, "-42 2.0 0.125");
}

}  // namespace
}  // namespace kvgate::sim
