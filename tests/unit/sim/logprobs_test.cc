// Tests for sim/logprobs and /generate's return_logprob end to end: the stand-in model's values
// (deterministic, negative, float32, the actual token first in a top-k), the meta_info keys and
// row shapes SGLang writes (the first prompt row's null logprob, logprob_start_len, top-k,
// token_ids_logprob, return_text_in_logprobs), what a PD decode server leaves out, how streams
// carry the rows (cumulative; output rows cut with --incremental-streaming-output), the request
// fields and their errors, the cache match limited by logprob_start_len, and the 400 abort of a
// logprob_start_len past the prompt.
#include "sim/logprobs.h"

#include <gtest/gtest.h>
#include <simdjson.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "sim/request.h"
#include "sim/responses.h"
#include "sim_harness.h"
#include "support/http_client.h"

namespace kvgate::sim {
namespace {

using simdjson::dom::array;
using simdjson::dom::element;
using testing::HttpClient;
using testing::sse_data;

class SimLogprobs : public ::testing::Test {
 protected:
  element parse(const std::string& json) {
    docs.push_back(std::make_unique<simdjson::dom::parser>());
    element e;
    EXPECT_FALSE(docs.back()->parse(json).get(e)) << json;
    return e;
  }
  static std::vector<std::string> keys(element e) {
    std::vector<std::string> out;
    simdjson::dom::object o;
    EXPECT_FALSE(e.get_object().get(o));
    for (auto f : o) out.emplace_back(f.key);
    return out;
  }
  // The meta_info keys append_logprob_keys writes for `r`, as a parsed object.
  element meta(const LogprobRows& r) {
    std::string out = R"({"x":0)";
    append_logprob_keys(out, r);
    out.push_back('}');
    return parse(out);
  }
  // The events of a /generate stream, parsed ([DONE] checked and dropped).
  std::vector<element> events(const testing::Response& r) {
    EXPECT_EQ(r.status, 200) << r.body;
    auto data = sse_data(r.body);
    EXPECT_FALSE(data.empty());
    EXPECT_EQ(data.back(), "[DONE]") << r.body;
    std::vector<element> out;
    for (size_t i = 0; i + 1 < data.size(); ++i) out.push_back(parse(data[i]));
    return out;
  }

  StandInTokenizer tok;
  LogprobModel model{tok, 0};
  std::vector<int32_t> prompt = {300, 301, 302, 303, 304};
  std::vector<int32_t> output = {400, 401, 402};
  std::vector<std::unique_ptr<simdjson::dom::parser>> docs;
};

int64_t id_of(element row) {
  return int64_t(row.at(1));
}

double value_of(element row) {
  return double(row.at(0));
}

TEST_F(SimLogprobs, ValuesAreDeterministicNegativeFloat32AndSeeded) {
  LogprobModel same(tok, 0);
  LogprobModel other_seed(tok, 7);
  int differ = 0;
  for (int64_t pos = 0; pos < 50; ++pos) {
    const auto id = static_cast<int32_t>(259 + pos);
    const double v = model.logprob(id, pos);
    EXPECT_LT(v, 0);
    EXPECT_GT(v, -4);
    EXPECT_EQ(v, static_cast<double>(static_cast<float>(v))) << "float32, as tensors hold them";
    EXPECT_EQ(v, same.logprob(id, pos));
    EXPECT_EQ(model.logprob_of(id, pos, id), v);
    EXPECT_LT(model.logprob_of(id, pos, id + 1), v);
    differ += v != other_seed.logprob(id, pos);
  }
  EXPECT_GT(differ, 40) << "--seed changes the values";
  EXPECT_NE(model.logprob(300, 3), model.logprob(300, 4)) << "the position counts";
}

TEST_F(SimLogprobs, TopRanksTheActualTokenFirstThenDistinctLowerOnes) {
  std::vector<std::pair<double, int32_t>> top;
  model.top(300, 9, 6, top);
  ASSERT_EQ(top.size(), 6u);
  EXPECT_EQ(top[0].second, 300);
  EXPECT_EQ(top[0].first, model.logprob(300, 9));
  for (size_t i = 1; i < top.size(); ++i) {
    EXPECT_LT(top[i].first, top[i - 1].first);
    for (size_t j = 0; j < i; ++j) EXPECT_NE(top[i].second, top[j].second);
    EXPECT_GE(top[i].second, 0);
    EXPECT_LT(top[i].second, tok.vocab_size());
  }
  std::vector<std::pair<double, int32_t>> again;
  model.top(300, 9, 3, again);
  EXPECT_EQ(again, (std::vector<std::pair<double, int32_t>>(top.begin(), top.begin() + 3)))
      << "a smaller k is a prefix";
  std::vector<std::pair<double, int32_t>> all;
  model.top(300, 9, 1000000, all);
  EXPECT_EQ(all.size(), static_cast<size_t>(tok.vocab_size())) << "k stops at the vocabulary";
}

TEST_F(SimLogprobs, DefaultStartGivesTheLastPromptTokenANullRow) {
  LogprobParams lp{.return_logprob = true};
  element m = meta(LogprobRows{.model = &model, .params = &lp, .prompt = prompt, .output = output});
  EXPECT_EQ(keys(m), (std::vector<std::string>{"x", "input_token_logprobs", "output_token_logprobs",
                                               "output_token_logprobs_length"}));
  array in = m["input_token_logprobs"].get_array();
  ASSERT_EQ(in.size(), 1u);
  EXPECT_TRUE(in.at(0).at(0).is_null());
  EXPECT_EQ(id_of(in.at(0)), 304);
  EXPECT_TRUE(in.at(0).at(2).is_null());
  array out = m["output_token_logprobs"].get_array();
  ASSERT_EQ(out.size(), 3u);
  for (size_t j = 0; j < 3; ++j) {
    EXPECT_EQ(id_of(out.at(j)), output[j]);
    EXPECT_EQ(value_of(out.at(j)), model.logprob(output[j], 5 + static_cast<int64_t>(j)))
        << "output positions follow the prompt's";
  }
  EXPECT_EQ(int64_t(m["output_token_logprobs_length"]), 3);
  EXPECT_TRUE(meta(LogprobRows{}).get_object().size() == 1) << "no model: no keys";
}

TEST_F(SimLogprobs, StartLenTopKTokenIdsAndText) {
  LogprobParams lp{.return_logprob = true,
                   .start_len = 2,
                   .top_logprobs_num = 2,
                   .token_ids = {5, 300},
                   .return_text_in_logprobs = true};
  element m = meta(LogprobRows{.model = &model, .params = &lp, .prompt = prompt, .output = output});
  EXPECT_EQ(keys(m), (std::vector<std::string>{"x", "input_token_logprobs", "output_token_logprobs",
                                               "output_token_logprobs_length", "input_top_logprobs",
                                               "output_top_logprobs", "input_token_ids_logprobs",
                                               "output_token_ids_logprobs"}));
  array in = m["input_token_logprobs"].get_array();
  ASSERT_EQ(in.size(), 3u) << "prompt_tokens - logprob_start_len rows";
  EXPECT_TRUE(in.at(0).at(0).is_null()) << "the first row never has a logprob";
  EXPECT_EQ(id_of(in.at(0)), 302);
  EXPECT_EQ(value_of(in.at(1)), model.logprob(303, 3));
  std::string text;
  tok.decode_token(303, text);
  EXPECT_EQ(std::string_view(in.at(1).at(2)), text);

  array in_top = m["input_top_logprobs"].get_array();
  ASSERT_EQ(in_top.size(), 3u);
  EXPECT_TRUE(in_top.at(0).is_null());
  ASSERT_EQ(in_top.at(1).get_array().size(), 2u);
  EXPECT_EQ(id_of(in_top.at(1).at(0)), 303);
  EXPECT_LT(value_of(in_top.at(1).at(1)), value_of(in_top.at(1).at(0)));
  array out_top = m["output_top_logprobs"].get_array();
  ASSERT_EQ(out_top.size(), 3u);
  EXPECT_EQ(id_of(out_top.at(2).at(0)), 402);

  array in_ids = m["input_token_ids_logprobs"].get_array();
  ASSERT_EQ(in_ids.size(), 3u);
  EXPECT_TRUE(in_ids.at(0).is_null());
  ASSERT_EQ(in_ids.at(2).get_array().size(), 2u);
  EXPECT_EQ(id_of(in_ids.at(2).at(0)), 5);
  EXPECT_EQ(id_of(in_ids.at(2).at(1)), 300);
  EXPECT_EQ(value_of(in_ids.at(2).at(1)), model.logprob_of(304, 4, 300));
  EXPECT_EQ(m["output_token_ids_logprobs"].get_array().size(), 3u);
}

TEST_F(SimLogprobs, PdDecodeHasNoPromptRowsAndNoTokenIdsRowForTheTransferredToken) {
  LogprobParams lp{.return_logprob = true, .start_len = 0, .top_logprobs_num = 1, .token_ids = {7}};
  LogprobRows plain{.model = &model, .params = &lp, .prompt = prompt, .output = output};
  LogprobRows decode = plain;
  decode.prompt_rows = false;
  element p = meta(plain);
  element d = meta(decode);
  EXPECT_EQ(keys(d), keys(p)) << "the same keys, empty input lists";
  EXPECT_EQ(d["input_token_logprobs"].get_array().size(), 0u);
  EXPECT_EQ(d["input_top_logprobs"].get_array().size(), 0u);
  EXPECT_EQ(d["input_token_ids_logprobs"].get_array().size(), 0u);
  EXPECT_EQ(simdjson::minify(d["output_token_logprobs"]),
            simdjson::minify(p["output_token_logprobs"]))
      << "the first output token's row came with the KV";
  EXPECT_EQ(simdjson::minify(d["output_top_logprobs"]), simdjson::minify(p["output_top_logprobs"]));
  array d_ids = d["output_token_ids_logprobs"].get_array();
  ASSERT_EQ(d_ids.size(), 2u);
  EXPECT_EQ(simdjson::minify(d_ids.at(0)), simdjson::minify(p["output_token_ids_logprobs"].at(1)));
}

TEST_F(SimLogprobs, IncrementalChunksCutTheOutputListsOnly) {
  LogprobParams lp{.return_logprob = true, .top_logprobs_num = 1, .token_ids = {7}};
  LogprobRows r{
      .model = &model, .params = &lp, .prompt = prompt, .output = output, .output_from = 2};
  element m = meta(r);
  EXPECT_EQ(m["input_token_logprobs"].get_array().size(), 1u);
  array out = m["output_token_logprobs"].get_array();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(id_of(out.at(0)), 402);
  EXPECT_EQ(int64_t(m["output_token_logprobs_length"]), 3) << "the length counts every row";
  EXPECT_EQ(m["output_top_logprobs"].get_array().size(), 1u);
  EXPECT_EQ(m["output_token_ids_logprobs"].get_array().size(), 1u);
}

TEST_F(SimLogprobs, GenerateObjectPutsTheKeysWhereSglangDoes) {
  LogprobParams lp{.return_logprob = true};
  FinishReason length{.kind = FinishReason::Kind::kLength, .length = 3};
  OutputView v{.id = "r",
               .ids = output,
               .text = "x",
               .prompt_tokens = 5,
               .completion_tokens = 3,
               .finish = &length,
               .logprobs = {.model = &model, .params = &lp, .prompt = prompt, .output = output}};
  std::string out;
  append_generate_object(out, v);
  EXPECT_EQ(keys(parse(out)["meta_info"]),
            (std::vector<std::string>{
                "id", "finish_reason", "prompt_tokens", "weight_version", "total_retractions",
                "input_token_logprobs", "output_token_logprobs", "output_token_logprobs_length",
                "completion_tokens", "cached_tokens", "cached_tokens_details", "dp_rank"}));
}

class SimLogprobRequest : public ::testing::Test {
 protected:
  std::string parse(std::string body) {
    body.reserve(body.size() + 64);
    return parse_request(Route::kGenerate, body, tok, tmpl, limits, req);
  }
  StandInTokenizer tok;
  ChatMLTemplate tmpl;
  RequestLimits limits;
  ParsedRequest req;
};

TEST_F(SimLogprobRequest, FieldsForEveryPromptOrOnePerPrompt) {
  ASSERT_EQ(parse(R"({"text":"a b"})"), "");
  EXPECT_TRUE(req.logprobs.empty());
  EXPECT_FALSE(req.logprob(0).return_logprob);

  ASSERT_EQ(parse(R"({"text":"a b","return_logprob":true,"logprob_start_len":1,
                      "top_logprobs_num":3,"token_ids_logprob":[4,5],
                      "return_text_in_logprobs":true})"),
            "");
  const LogprobParams& lp = req.logprob(0);
  EXPECT_TRUE(lp.return_logprob);
  EXPECT_EQ(lp.start_len, 1);
  EXPECT_EQ(lp.top_logprobs_num, 3);
  EXPECT_EQ(lp.token_ids, (std::vector<int32_t>{4, 5}));
  EXPECT_TRUE(lp.return_text_in_logprobs);

  ASSERT_EQ(parse(R"({"text":["a","b"],"return_logprob":[false,true],"logprob_start_len":[0,-1],
                      "token_ids_logprob":[null,[9]]})"),
            "");
  EXPECT_FALSE(req.logprob(0).return_logprob);
  EXPECT_TRUE(req.logprob(1).return_logprob);
  EXPECT_EQ(req.logprob(0).start_len, 0);
  EXPECT_EQ(req.logprob(1).start_len, -1);
  EXPECT_TRUE(req.logprob(0).token_ids.empty());
  EXPECT_EQ(req.logprob(1).token_ids, std::vector<int32_t>{9});

  ASSERT_EQ(parse(R"({"text":["a","b"],"return_logprob":true,"token_ids_logprob":[3]})"), "");
  EXPECT_TRUE(req.logprob(1).return_logprob);
  EXPECT_EQ(req.logprob(1).token_ids, std::vector<int32_t>{3}) << "a flat list: every prompt";
  EXPECT_EQ(parse(R"({"text":"a","return_logprob":true,"token_ids_logprob":[]})"), "");
  EXPECT_TRUE(req.logprob(0).token_ids.empty()) << "[] is None";
}

TEST_F(SimLogprobRequest, Errors) {
  EXPECT_EQ(parse(R"({"text":"a","token_ids_logprob":[1.5]})"),
            "token_ids_logprob must be a flat list of integers.");
  EXPECT_EQ(parse(R"({"text":"a","token_ids_logprob":[100000]})"),
            "token_ids_logprob contains out-of-vocabulary token id 100000; valid range is [0, " +
                std::to_string(tok.vocab_size()) + ").");
  EXPECT_NE(parse(R"({"text":"a","return_logprob":"yes"})"), "");
  EXPECT_NE(parse(R"({"text":["a","b"],"return_logprob":[true]})"), "");
  EXPECT_NE(parse(R"({"text":"a","top_logprobs_num":"3"})"), "");
  EXPECT_EQ(parse(R"({"text":"a","return_logprob":true,"logprob_start_len":99})"), "")
      << "past the prompt: the scheduler's abort, not a parse error";
}

const std::vector<std::string> kFast = {"--ttft-ms", "1", "--tpot-ms", "1", "--page-size", "4"};
const char* kGen =
    R"({"text":"The capital of France is a city","sampling_params":{"max_new_tokens":4})";

std::string with(std::string_view extra) {
  return std::string(kGen) + std::string(extra) + "}";
}

TEST_F(SimLogprobs, GenerateAnswersTheSameRowsForTheSamePrompt) {
  Sim s(kFast);
  HttpClient c(s.port);
  auto a = c.post("/generate", with(R"(,"return_logprob":true,"logprob_start_len":0)"));
  auto b = c.post("/generate", with(R"(,"return_logprob":true,"logprob_start_len":0)"));
  ASSERT_EQ(a.status, 200) << a.body;
  element ma = parse(a.body)["meta_info"];
  element mb = parse(b.body)["meta_info"];
  const auto prompt_tokens = static_cast<size_t>(int64_t(ma["prompt_tokens"]));
  EXPECT_EQ(ma["input_token_logprobs"].get_array().size(), prompt_tokens);
  EXPECT_EQ(ma["output_token_logprobs"].get_array().size(), 4u);
  EXPECT_EQ(simdjson::minify(ma["input_token_logprobs"]),
            simdjson::minify(mb["input_token_logprobs"]));
  EXPECT_EQ(simdjson::minify(ma["output_token_logprobs"]),
            simdjson::minify(mb["output_token_logprobs"]));
  EXPECT_EQ(int64_t(mb["cached_tokens"]), 0)
      << "logprob_start_len 0: no prefix reuse, every prompt row is computed";
  element plain = parse(c.post("/generate", with("")).body)["meta_info"];
  EXPECT_TRUE(plain["input_token_logprobs"].error()) << "no return_logprob, no keys";
  EXPECT_GT(int64_t(plain["cached_tokens"]), 0);
}

TEST_F(SimLogprobs, LogprobStartLenLimitsTheCacheMatch) {
  Sim s(kFast);
  HttpClient c(s.port);
  ASSERT_EQ(c.post("/generate", with("")).status, 200);  // caches the prompt's pages
  element m = parse(c.post("/generate", with(R"(,"return_logprob":true,"logprob_start_len":6)"))
                        .body)["meta_info"];
  EXPECT_EQ(int64_t(m["cached_tokens"]), 4) << "at most 6 tokens, in whole pages of 4";
  const auto n = static_cast<size_t>(int64_t(m["prompt_tokens"]));
  EXPECT_EQ(m["input_token_logprobs"].get_array().size(), n - 6);
  element d = parse(c.post("/generate", with(R"(,"return_logprob":true)")).body)["meta_info"];
  EXPECT_EQ(int64_t(d["cached_tokens"]), static_cast<int64_t>((n - 1) / 4 * 4))
      << "the default start does not limit the match";
}

TEST_F(SimLogprobs, StreamsCarryEveryRowSoFar) {
  Sim s(kFast);
  HttpClient c(s.port);
  element whole =
      parse(c.post("/generate", with(R"(,"return_logprob":true,"top_logprobs_num":2)")).body);
  auto ev = events(
      c.post("/generate", with(R"(,"return_logprob":true,"top_logprobs_num":2,"stream":true)")));
  ASSERT_EQ(ev.size(), 4u);
  for (size_t i = 0; i < ev.size(); ++i) {
    element m = ev[i]["meta_info"];
    EXPECT_EQ(m["input_token_logprobs"].get_array().size(), 1u) << "in every chunk";
    EXPECT_EQ(m["output_token_logprobs"].get_array().size(), i + 1) << "cumulative";
    EXPECT_EQ(m["output_top_logprobs"].get_array().size(), i + 1);
    EXPECT_EQ(int64_t(m["output_token_logprobs_length"]), static_cast<int64_t>(i + 1));
  }
  EXPECT_EQ(simdjson::minify(ev.back()["meta_info"]["output_token_logprobs"]),
            simdjson::minify(whole["meta_info"]["output_token_logprobs"]));
}

TEST_F(SimLogprobs, IncrementalStreamsCutTheOutputRows) {
  auto args = kFast;
  args.emplace_back("--incremental-streaming-output");
  Sim s(args);
  HttpClient c(s.port);
  element whole = parse(c.post("/generate", with(R"(,"return_logprob":true)")).body);
  auto ev = events(c.post("/generate", with(R"(,"return_logprob":true,"stream":true)")));
  ASSERT_EQ(ev.size(), 4u);
  array all = whole["meta_info"]["output_token_logprobs"].get_array();
  for (size_t i = 0; i < ev.size(); ++i) {
    element m = ev[i]["meta_info"];
    EXPECT_EQ(m["input_token_logprobs"].get_array().size(), 1u) << "the input rows stay whole";
    array out = m["output_token_logprobs"].get_array();
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(simdjson::minify(out.at(0)), simdjson::minify(all.at(i)));
    EXPECT_EQ(int64_t(m["output_token_logprobs_length"]), static_cast<int64_t>(i + 1));
  }
}

TEST_F(SimLogprobs, StartPastThePromptIsTheSchedulers400Abort) {
  Sim s(kFast);
  HttpClient c(s.port);
  auto whole = c.post("/generate", with(R"(,"return_logprob":true,"logprob_start_len":100)"));
  EXPECT_EQ(whole.status, 400);
  std::string message = std::string(parse(whole.body)["error"]["message"]);
  EXPECT_TRUE(
      message.starts_with("req.logprob_start_len=100 is higher than the number of input "
                          "tokens len(req.origin_input_ids)="))
      << message;
  EXPECT_TRUE(message.ends_with(". Please use a smaller logprob_start_len.")) << message;
  auto ev = events(
      c.post("/generate", with(R"(,"return_logprob":true,"logprob_start_len":100,"stream":true)")));
  ASSERT_EQ(ev.size(), 1u);
  element f = ev[0]["meta_info"]["finish_reason"];
  EXPECT_EQ(std::string_view(f["type"]), "abort");
  EXPECT_EQ(int64_t(f["status_code"]), 400);
  EXPECT_EQ(std::string_view(f["err_type"]), "BadRequestError");
  EXPECT_EQ(std::string(std::string_view(f["message"])), message);
  EXPECT_EQ(c.post("/generate", with(R"(,"logprob_start_len":100)")).status, 200)
      << "without return_logprob the start is not checked";
}

TEST_F(SimLogprobs, InstantAnswersCarryTheRowsToo) {
  Sim s({"--instant"});
  HttpClient c(s.port);
  element m = parse(c.post("/generate", with(R"(,"return_logprob":true,"logprob_start_len":0)"))
                        .body)["meta_info"];
  EXPECT_EQ(m["input_token_logprobs"].get_array().size(),
            static_cast<size_t>(int64_t(m["prompt_tokens"])));
  EXPECT_EQ(m["output_token_logprobs"].get_array().size(),
            static_cast<size_t>(int64_t(m["completion_tokens"])));
}

}  // namespace
}  // namespace kvgate::sim
