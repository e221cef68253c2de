// Tests for sim/openai_responses: the response store's bound, how a /v1/responses body becomes a
// chat prompt (instructions, the stored conversation, input items normalized as SGLang's
// serving_responses does), the output budget, the refusals in SGLang's order and envelope, and
// the Response object and stream events.
#include "sim/openai_responses.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace kvgate::sim {
namespace {

using Json = nlohmann::json;

class SimResponsesApi : public ::testing::Test {
 protected:
  ResponsesError parse(std::string body) {
    body.reserve(body.size() + 64);
    return parse_responses_request(body, opt, store, tok, tmpl, limits, req);
  }
  const std::vector<int32_t>& prompt() const { return req.prompts.at(0); }
  // The ids of `messages` rendered by the chat template, as the chat route renders them.
  std::vector<int32_t> render(const std::vector<ChatMessage>& messages) const {
    std::string text;
    tmpl.render(messages, true, text);
    std::vector<int32_t> ids;
    tok.encode(text, ids);
    return ids;
  }
  static Json error_of(const ResponsesError& e) { return Json::parse(e.body)["error"]; }

  StandInTokenizer tok;
  ChatMLTemplate tmpl;
  RequestLimits limits{.default_max_new_tokens = 128,
                       .context_length = 4096,
                       .max_req_input_len = 4090,
                       .default_include_usage = false};
  std::vector<std::string> adapters = {"ad1"};
  ResponsesOptions opt{.enable_store = true,
                       .served_model_name = "served",
                       .lora_adapters = adapters,
                       .context_length = 4096,
                       .default_max_new_tokens = 16};
  ResponseStore store{8};
  ParsedRequest req;
};

TEST(ResponseStore, DropsTheOldestBeyondItsCapacity) {
  ResponseStore s(2);
  s.put("resp_a", {.object = "A", .history = ""});
  s.put("resp_b", {.object = "B", .history = ""});
  s.put("resp_a", {.object = "A2", .history = ""});  // a replacement keeps its place
  EXPECT_EQ(s.size(), 2u);
  s.put("resp_c", {.object = "C", .history = ""});
  EXPECT_EQ(s.size(), 2u);
  EXPECT_FALSE(s.get("resp_a"));
  ASSERT_TRUE(s.get("resp_b"));
  EXPECT_EQ(s.get("resp_c")->object, "C");
}

TEST_F(SimResponsesApi, StringInputIsOneUserTurnWithInstructionsAsSystem) {
  ASSERT_EQ(parse(R"({"model":"served","input":"the cat","instructions":"be brief",
                      "max_output_tokens":10})")
                .status,
            0);
  EXPECT_EQ(req.route, Route::kResponses);
  EXPECT_EQ(prompt(), render({{"system", "be brief"}, {"user", "the cat"}}));
  // min(max_output_tokens, max(context - prompt, 512)) - 2: to_sampling_params' headroom.
  EXPECT_EQ(req.sampling.max_new_tokens, 8);
  ASSERT_TRUE(req.responses);
  EXPECT_TRUE(req.responses->id.starts_with("resp_"));
  EXPECT_EQ(req.responses->id.size(), 5u + 32u);
  EXPECT_EQ(req.rids.at(0), req.responses->id);  // the response id is the engine's rid
  EXPECT_EQ(req.responses->persist, &store);
  EXPECT_EQ(req.responses->history, R"({"role":"user","content":"the cat"})");
}

TEST_F(SimResponsesApi, WithoutMaxOutputTokensTheDefaultBudgetApplies) {
  ASSERT_EQ(parse(R"({"input":"hi"})").status, 0);
  EXPECT_EQ(req.sampling.max_new_tokens, 16);
  EXPECT_FALSE(req.responses->model);
  ASSERT_EQ(parse(R"({"input":"hi","max_output_tokens":1})").status, 400);
}

TEST_F(SimResponsesApi, InputItemsAreNormalizedAsSglangDoes) {
  ASSERT_EQ(parse(R"({"instructions":"top","input":[
        {"role":"developer","content":"dev rules"},
        {"type":"message","role":"user","content":[{"type":"input_text","text":"q1"}]},
        {"id":"msg_1","type":"message","role":"assistant","status":"completed",
         "content":[{"type":"output_text","text":"a1","annotations":[]}]},
        {"role":"assistant","content":"a2"},
        {"type":"reasoning","summary":[],"content":[]},
        {"role":"user","content":"q2"}]})")
                .status,
            0);
  // developer -> labelled system text, every system text coalesced in front; the two assistant
  // messages (same phase) merged into one turn; the empty reasoning item dropped.
  EXPECT_EQ(prompt(), render({{"system", "top\n\nDeveloper instructions:\ndev rules"},
                              {"user", "q1"},
                              {"assistant", "a1 a2"},
                              {"user", "q2"}}));
  const ResponsesError bad = parse(R"({"input":[{"type":"web_search_call","id":"x"}]})");
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(error_of(bad)["message"],
            "Unsupported Responses API input item type: "
            "'web_search_call' None");
}

TEST_F(SimResponsesApi, PreviousResponseContinuesItsConversation) {
  ASSERT_EQ(parse(R"({"input":"first","instructions":"sys"})").status, 0);
  const ResponsesContext first = *req.responses;
  std::string body;
  const FinishReason stop{.kind = FinishReason::Kind::kStop, .matched_token = 0};
  finish_response(body, first,
                  ResponseResult{.message_id = "msg_1",
                                 .text = "reply one",
                                 .prompt_tokens = 5,
                                 .completion_tokens = 2,
                                 .finish = &stop});
  ASSERT_TRUE(store.get(first.id));
  EXPECT_EQ(store.get(first.id)->object, body);

  ASSERT_EQ(parse(R"({"input":"second","previous_response_id":")" + first.id + R"("})").status, 0);
  // The previous instructions do not carry over; the conversation does, with the reply.
  EXPECT_EQ(prompt(), render({{"user", "first"}, {"assistant", "reply one"}, {"user", "second"}}));
  const Json answer = Json::parse(body);
  EXPECT_EQ(answer["status"], "completed");
  EXPECT_EQ(answer["output"][0]["content"][0]["text"], "reply one");
}

TEST_F(SimResponsesApi, RefusalsInSglangsOrder) {
  opt.enable_store = false;
  ResponsesError e = parse(R"({"input":"x","previous_response_id":"","model":"nope"})");
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(error_of(e)["param"], "previous_response_id");
  EXPECT_EQ(error_of(e)["message"],
            "Response store is disabled. Stateful Responses require --enable-response-store on a "
            "standalone server; response storage is unavailable in PD mode.");
  EXPECT_EQ(error_of(parse(R"({"input":"x","background":true})"))["param"], "background");
  // Without the store a request still runs, and nothing is kept.
  ASSERT_EQ(parse(R"({"input":"x"})").status, 0);
  EXPECT_EQ(req.responses->persist, nullptr);

  opt.enable_store = true;
  e = parse(R"({"input":"x","background":true,"store":false})");
  EXPECT_EQ(error_of(e)["message"], "background=true requires store=true.");
  e = parse(R"({"input":"x","model":"nope"})");
  EXPECT_EQ(e.status, 404);
  EXPECT_EQ(error_of(e)["message"], "The model 'nope' does not exist");
  EXPECT_EQ(parse(R"({"input":"x","model":"served:ad1"})").status, 0);
  EXPECT_EQ(parse(R"({"input":"x","model":"ad1"})").status, 0);
  e = parse(R"({"input":"x","previous_response_id":"abc"})");
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(error_of(e)["message"],
            "Invalid 'response_id': 'abc'. Expected an ID that begins with 'resp'.");
  e = parse(R"({"input":"x","previous_response_id":"resp_gone"})");
  EXPECT_EQ(e.status, 404);
  EXPECT_EQ(e.body, R"({"error":{"message":"Response with id 'resp_gone' not found.",)"
                    R"("type":"invalid_request_error","param":"response_id","code":404}})");
  EXPECT_EQ(parse(R"({"model":"served"})").status, 400);  // no input
}

TEST_F(SimResponsesApi, RetrieveAndCancelAnswers) {
  EXPECT_EQ(retrieve_response("resp_x", false, store).status, 400);
  EXPECT_EQ(retrieve_response("x", true, store).status, 400);
  EXPECT_EQ(retrieve_response("resp_x", true, store).status, 404);
  store.put("resp_x", {.object = R"({"id":"resp_x"})", .history = ""});
  EXPECT_EQ(retrieve_response("resp_x", true, store).body, R"({"id":"resp_x"})");
  // A stored response is terminal: cancelling it returns it unchanged.
  EXPECT_EQ(cancel_response("resp_x", true, store).status, 200);
}

TEST_F(SimResponsesApi, ObjectStatusFollowsTheFinishReason) {
  ASSERT_EQ(
      parse(R"({"input":"x","max_output_tokens":5,"metadata":{"k":"v"},"temperature":1})").status,
      0);
  const FinishReason length{.kind = FinishReason::Kind::kLength, .length = 3};
  std::string out;
  append_response_object(out, *req.responses,
                         ResponseResult{.message_id = "msg_1",
                                        .text = "a b c",
                                        .prompt_tokens = 10,
                                        .completion_tokens = 3,
                                        .cached_tokens = 4,
                                        .finish = &length},
                         false);
  const Json o = Json::parse(out);
  EXPECT_EQ(o["object"], "response");
  EXPECT_EQ(o["status"], "incomplete");
  EXPECT_EQ(o["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(o["usage"]["input_tokens"], 10);
  EXPECT_EQ(o["usage"]["input_tokens_details"]["cached_tokens"], 4);
  EXPECT_EQ(o["usage"]["total_tokens"], 13);
  EXPECT_EQ(o["max_output_tokens"], 5);
  EXPECT_EQ(o["metadata"]["k"], "v");
  EXPECT_EQ(o["text"]["format"]["type"], "text");
  EXPECT_NE(out.find(R"("temperature":1.0)"), std::string::npos) << out;

  const FinishReason aborted{.kind = FinishReason::Kind::kAbort, .message = "Aborted"};
  out.clear();
  append_response_object(out, *req.responses, ResponseResult{.finish = &aborted}, false);
  const Json f = Json::parse(out);
  EXPECT_EQ(f["status"], "failed");
  EXPECT_EQ(f["error"]["code"], "server_error");
  EXPECT_EQ(f["output"].size(), 0u);
  EXPECT_TRUE(f["text"].is_null());
}

TEST_F(SimResponsesApi, ExceptionFailures) {
  ASSERT_EQ(parse(R"({"input":"x"})").status, 0);
  std::string out;
  int status = 0;
  append_exception_failure(out, *req.responses, 503, "The request queue is full.", false, status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(Json::parse(out)["error"]["message"], "503: The request queue is full.");
  out.clear();
  append_exception_failure(out, *req.responses, 503, "full", true, status);
  EXPECT_EQ(status, 200);
  EXPECT_EQ(out.find("event: response.created\n"), 0u);
  const size_t failed = out.find("event: response.failed\ndata: ");
  ASSERT_NE(failed, std::string::npos);
  const Json e = Json::parse(out.substr(out.find("data: ", failed) + 6));
  EXPECT_EQ(e["sequence_number"], 2);
  EXPECT_EQ(e["response"]["error"]["message"], "503: full");
}

}  // namespace
}  // namespace kvgate::sim
