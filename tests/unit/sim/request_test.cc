// Tests for sim/request: reading /generate, /v1/completions and /v1/chat/completions bodies.
#include "sim/request.h"

#include <gtest/gtest.h>

namespace kvgate::sim {
namespace {

class SimRequest : public ::testing::Test {
 protected:
  std::string parse(Route route, std::string body) {
    body.reserve(body.size() + 64);
    return parse_request(route, body, tok, tmpl, limits, req);
  }
  std::vector<int32_t> ids(std::string_view text) {
    std::vector<int32_t> out;
    tok.encode(text, out);
    return out;
  }
  StandInTokenizer tok;
  ChatMLTemplate tmpl;
  RequestLimits limits{.default_max_new_tokens = 128,
                       .context_length = 1000,
                       .max_req_input_len = 999,
                       .default_include_usage = false};
  ParsedRequest req;
};

TEST_F(SimRequest, GenerateText) {
  ASSERT_EQ(parse(Route::kGenerate,
                  R"({"text":"the cat","sampling_params":{"max_new_tokens":7,"temperature":0},
                      "stream":true,"rid":"r1","routed_dp_rank":1,"unknown":{"x":1}})"),
            "");
  ASSERT_EQ(req.prompts.size(), 1u);
  EXPECT_EQ(req.prompts[0], ids("the cat"));
  EXPECT_FALSE(req.batch);
  EXPECT_TRUE(req.stream);
  EXPECT_EQ(req.sampling.max_new_tokens, 7);
  EXPECT_EQ(req.rids, std::vector<std::string>{"r1"});
  EXPECT_EQ(req.routed_dp_rank, 1);
}

TEST_F(SimRequest, GenerateDefaultsAndStops) {
  ASSERT_EQ(parse(Route::kGenerate,
                  R"({"text":"hi","sampling_params":{"stop":"the","stop_token_ids":[5,6]}})"),
            "");
  EXPECT_EQ(req.sampling.max_new_tokens, 128);
  EXPECT_EQ(req.sampling.stop, std::vector<std::string>{"the"});
  EXPECT_EQ(req.sampling.stop_token_ids, (std::vector<int32_t>{5, 6}));
  EXPECT_FALSE(req.stream);
  EXPECT_EQ(req.rids, std::vector<std::string>{""});
}

TEST_F(SimRequest, GenerateInputIdsAndBatches) {
  ASSERT_EQ(parse(Route::kGenerate, R"({"input_ids":[1,2,3]})"), "");
  EXPECT_EQ(req.prompts, (std::vector<std::vector<int32_t>>{{1, 2, 3}}));
  EXPECT_FALSE(req.batch);

  ASSERT_EQ(parse(Route::kGenerate, R"({"input_ids":[[1,2],[3]],"rid":["a","b"]})"), "");
  EXPECT_TRUE(req.batch);
  EXPECT_EQ(req.prompts, (std::vector<std::vector<int32_t>>{{1, 2}, {3}}));
  EXPECT_EQ(req.rids, (std::vector<std::string>{"a", "b"}));

  ASSERT_EQ(parse(Route::kGenerate, R"({"text":["a","the"]})"), "");
  EXPECT_TRUE(req.batch);
  ASSERT_EQ(req.prompts.size(), 2u);
  EXPECT_EQ(req.prompts[1], ids("the"));
}

TEST_F(SimRequest, ChatRendersTheTemplateThenTokenizes) {
  ASSERT_EQ(parse(Route::kChatCompletions,
                  R"({"model":"m","messages":[{"role":"system","content":"Be brief."},
                      {"role":"user","content":[{"type":"text","text":"Hi"},
                                                {"type":"text","text":"there"}]},
                      {"role":"assistant","content":null}],
                      "max_completion_tokens":9,"max_tokens":3,"stream":true,
                      "stream_options":{"include_usage":true}})"),
            "");
  EXPECT_EQ(req.model, "m");
  EXPECT_EQ(req.sampling.max_new_tokens, 9);  // max_completion_tokens wins
  EXPECT_TRUE(req.stream);
  EXPECT_TRUE(req.include_usage);
  EXPECT_EQ(req.prompts[0], ids("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi "
                                "there<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n"
                                "<|im_start|>assistant\n"));
}

TEST_F(SimRequest, ChatDefaults) {
  ASSERT_EQ(parse(Route::kChatCompletions, R"({"messages":[{"role":"user","content":"x"}]})"), "");
  EXPECT_EQ(req.model, "default");
  EXPECT_EQ(req.sampling.max_new_tokens, 128);
  EXPECT_FALSE(req.include_usage);
  limits.default_include_usage = true;
  ASSERT_EQ(parse(Route::kChatCompletions,
                  R"({"messages":[{"role":"user","content":"x"}],"stream":true})"),
            "");
  EXPECT_TRUE(req.include_usage);
}

TEST_F(SimRequest, CompletionsPromptShapes) {
  ASSERT_EQ(parse(Route::kCompletions, R"({"model":"m","prompt":"Once upon a time"})"), "");
  EXPECT_EQ(req.sampling.max_new_tokens, 16);  // OpenAI's default for completions
  EXPECT_EQ(req.prompts[0], ids("Once upon a time"));
  ASSERT_EQ(parse(Route::kCompletions, R"({"prompt":["a","b"],"max_tokens":4})"), "");
  EXPECT_EQ(req.prompts.size(), 2u);
  EXPECT_EQ(req.sampling.max_new_tokens, 4);
  ASSERT_EQ(parse(Route::kCompletions, R"({"prompt":[7,8,9]})"), "");
  EXPECT_EQ(req.prompts[0], (std::vector<int32_t>{7, 8, 9}));
}

TEST_F(SimRequest, ErrorsNameTheProblem) {
  struct Case {
    Route route;
    std::string body, expect;
  };
  std::vector<Case> cases = {
      {Route::kGenerate, R"({"text":)", "malformed JSON body"},
      {Route::kGenerate, "", "the request body is empty"},
      {Route::kGenerate, "[1]", "must be a JSON object"},
      {Route::kGenerate, "{}", "Either text or input_ids should be provided."},
      {Route::kGenerate, R"({"text":"a","input_ids":[1]})", "not both"},
      {Route::kGenerate, R"({"text":5})", "'text' must be a string or a list of strings"},
      {Route::kGenerate, R"({"input_ids":"abc"})", "'input_ids' must be a list of token ids"},
      {Route::kGenerate, R"({"input_ids":[1,999999]})", "token id 999999, outside the vocabulary"},
      {Route::kGenerate, R"({"text":[]})", "'text' is an empty list"},
      {Route::kGenerate, R"({"text":"a","sampling_params":{"max_new_tokens":-1}})", "at least 0"},
      {Route::kGenerate, R"({"text":"a","sampling_params":{"max_new_tokens":"x"}})",
       "'max_new_tokens' must be an integer"},
      {Route::kGenerate, R"({"text":"a","sampling_params":{"n":2}})", "'n' = 2 is not supported"},
      {Route::kGenerate, R"({"text":["a","b"],"rid":"x"})", "list of 2 strings"},
      {Route::kGenerate, R"({"text":"a","stream":"yes"})", "'stream' must be true or false"},
      {Route::kGenerate, R"({"text":""})", "the prompt is empty"},
      {Route::kGenerate, R"({"text":"a","sampling_params":{"max_new_tokens":5000}})",
       "Requested token count exceeds the model's maximum context length of 1000 tokens"},
      {Route::kGenerate, "{\"text\":\"" + std::string(1200, 'x') + "\"}",
       "The input (1200 tokens) is longer than the model's context length (1000 tokens)."},
      {Route::kCompletions, R"({"model":"m"})", "'prompt' is required"},
      {Route::kCompletions, R"({"prompt":"a","max_tokens":0})", "max_tokens must be positive"},
      {Route::kChatCompletions, R"({"model":"m"})", "'messages' is required"},
      {Route::kChatCompletions, R"({"messages":[]})", "'messages' must not be empty"},
      {Route::kChatCompletions, R"({"messages":[{"content":"x"}]})", "string 'role'"},
      {Route::kChatCompletions,
       R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]})",
       "'image_url' is not supported"},
      {Route::kChatCompletions, R"({"messages":[{"role":"user","content":"x"}],"model":3})",
       "'model' must be a string"},
  };
  for (const auto& k : cases) {
    std::string err = parse(k.route, k.body);
    EXPECT_NE(err.find(k.expect), std::string::npos) << k.body << " -> " << err;
  }
}

// The PD fields, on every route: bootstrap_host/port/room (per prompt), disagg_prefill_dp_rank,
// and the rid the abort finds the request by.
TEST_F(SimRequest, PdFieldsAndRids) {
  ASSERT_EQ(parse(Route::kChatCompletions,
                  R"({"messages":[{"role":"user","content":"hi"}],"rid":"c1",
                      "bootstrap_host":"10.0.0.1","bootstrap_port":8998,"bootstrap_room":12,
                      "routed_dp_rank":1,"disagg_prefill_dp_rank":0})"),
            "");
  EXPECT_EQ(req.rids, std::vector<std::string>{"c1"});
  EXPECT_EQ(req.routed_dp_rank, 1);
  EXPECT_EQ(req.disagg_prefill_dp_rank, 0);
  std::string host;
  int64_t port = 0;
  uint64_t room = 0;
  bool has_host = false, has_port = false, has_room = false;
  ASSERT_TRUE(req.bootstrap(0, host, port, room, has_host, has_port, has_room));
  EXPECT_EQ(host, "10.0.0.1");
  EXPECT_EQ(port, 8998);
  EXPECT_EQ(room, 12u);

  // A batch with one room: GenerateReqInput gives prompt i the room + i.
  ASSERT_EQ(parse(Route::kGenerate, R"({"text":["a","b","c"],"bootstrap_room":100})"), "");
  for (size_t i = 0; i < 3; ++i) {
    req.bootstrap(i, host, port, room, has_host, has_port, has_room);
    EXPECT_TRUE(has_room);
    EXPECT_FALSE(has_host);
    EXPECT_EQ(room, 100 + i);
  }
  ASSERT_EQ(parse(Route::kGenerate, R"({"text":["a","b"],"bootstrap_room":[7,3]})"), "");
  req.bootstrap(1, host, port, room, has_host, has_port, has_room);
  EXPECT_EQ(room, 3u);
  EXPECT_NE(parse(Route::kGenerate, R"({"text":"a","disagg_prefill_dp_rank":"x"})"), "");
}

TEST_F(SimRequest, ClearKeepsNothingFromTheLastRequest) {
  ASSERT_EQ(parse(Route::kGenerate, R"({"text":["a","b"],"stream":true,"routed_dp_rank":2,
                                        "disagg_prefill_dp_rank":1})"),
            "");
  ASSERT_EQ(parse(Route::kGenerate, R"({"text":"c"})"), "");
  EXPECT_EQ(req.prompts.size(), 1u);
  EXPECT_FALSE(req.stream);
  EXPECT_FALSE(req.batch);
  EXPECT_FALSE(req.routed_dp_rank.has_value());
  EXPECT_FALSE(req.disagg_prefill_dp_rank.has_value());
}

}  // namespace
}  // namespace kvgate::sim
