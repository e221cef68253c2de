// Tests for request/request_info: what the gateway reads from a body, and its 400 messages.
#include "request/request_info.h"

#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "http/message.h"
#include "support/models.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "util/json_parser.h"

namespace kvgate {
namespace {

std::string padded(std::string s) {
  s.reserve(s.size() + http::kBodyPadding);
  return s;
}

// After an outsized body the thread's parser gives its memory back (a request thread must not
// keep the largest body's worth of parser buffers for good).
TEST(RequestInfo, ParserMemoryReturnsAfterAnOutsizedBody) {
  std::thread t([] {  // a fresh thread: its parser has parsed nothing else
    RequestInfo info;
    std::string small = padded(R"({"model":"m","prompt":"hi"})");
    ASSERT_EQ(parse_request(ApiRoute::kCompletions, small, info), "");
    size_t steady = request_parser_capacity();
    EXPECT_GT(steady, 0u);
    EXPECT_LE(steady, json::kParserRetainedBytes);
    std::string prompt(3 * json::kParserRetainedBytes, 'p');
    std::string big = padded(R"({"model":"big","prompt":")" + prompt + R"("})");
    ASSERT_EQ(parse_request(ApiRoute::kCompletions, big, info, {.want_text = true}), "");
    EXPECT_EQ(info.model, "big");
    EXPECT_EQ(info.text, prompt);
    EXPECT_LE(request_parser_capacity(), json::kParserRetainedBytes);
    ASSERT_EQ(parse_request(ApiRoute::kCompletions, small, info), "");
    EXPECT_EQ(info.model, "m");
    EXPECT_LE(request_parser_capacity(), json::kParserRetainedBytes);
  });
  t.join();
}

TEST(RequestInfo, ReadsModelStreamRid) {
  RequestInfo info;
  std::string body = padded(
      R"({"model":"qwen","stream":true,"rid":"r1","stream_options":{"include_usage":true},"messages":[]})");
  ASSERT_EQ(parse_request(ApiRoute::kChatCompletions, body, info), "");
  EXPECT_EQ(info.model, "qwen");
  EXPECT_TRUE(info.stream);
  EXPECT_EQ(info.rid, "r1");
  EXPECT_TRUE(info.include_usage);
}

// SGLang reads an OpenAI route's model "base:adapter" as a LoRA adapter; other engines take the
// whole string as a served name, so only a pool of SGLang engines reads it so.
TEST(RequestInfo, AdapterFromLoraPathOrTheModelsSuffix) {
  ParseOptions sglang;
  sglang.model_names_adapter = true;
  RequestInfo info;
  std::string b1 = padded(R"({"model":"qwen:sql ","messages":[]})");
  ASSERT_EQ(parse_request(ApiRoute::kChatCompletions, b1, info, sglang), "");
  EXPECT_TRUE(info.names_lora);
  EXPECT_EQ(info.lora, std::optional<std::string>("sql"));
  EXPECT_EQ(info.model, "qwen:sql ");  // the pool is still chosen by the model as sent
  ASSERT_EQ(parse_request(ApiRoute::kChatCompletions, b1, info), "");
  EXPECT_FALSE(info.names_lora);
  EXPECT_FALSE(info.lora);
  std::string b2 = padded(R"({"model":"qwen","lora_path":"a1","text":"x"})");
  ASSERT_EQ(parse_request(ApiRoute::kGenerate, b2, info, sglang), "");
  EXPECT_EQ(info.lora, std::optional<std::string>("a1"));
  std::string b3 = padded(R"({"lora_path":["a1","a2"],"text":["x","y"]})");
  ASSERT_EQ(parse_request(ApiRoute::kGenerate, b3, info, sglang), "");
  EXPECT_TRUE(info.names_lora);
  EXPECT_FALSE(info.lora);  // a list: no single namespace
  std::string b4 = padded(R"({"model":"qwen","text":"x"})");
  ASSERT_EQ(parse_request(ApiRoute::kGenerate, b4, info, sglang), "");
  EXPECT_FALSE(info.names_lora);  // nothing left over from the last request
}

TEST(RequestInfo, DefaultsWhenAbsentOrNull) {
  RequestInfo info;
  std::string body = padded(R"({"text":"hi","stream":null,"model":null})");
  ASSERT_EQ(parse_request(ApiRoute::kGenerate, body, info), "");
  EXPECT_EQ(info.model, "");
  EXPECT_FALSE(info.stream);
}

TEST(RequestInfo, ErrorsNameTheProblem) {
  RequestInfo info;
  std::string b1 = padded(R"({"model": "x",)");
  EXPECT_NE(parse_request(ApiRoute::kGenerate, b1, info).find("not valid JSON"), std::string::npos);
  std::string b2 = padded("[1,2]");
  EXPECT_NE(parse_request(ApiRoute::kGenerate, b2, info).find("must be a JSON object"),
            std::string::npos);
  std::string b3 = padded(R"({"stream":"yes"})");
  EXPECT_NE(parse_request(ApiRoute::kGenerate, b3, info).find("\"stream\" must be true or false"),
            std::string::npos);
  std::string b4 = padded(R"({"model":3})");
  EXPECT_NE(parse_request(ApiRoute::kGenerate, b4, info).find("\"model\" must be a string"),
            std::string::npos);
  std::string b5;
  EXPECT_NE(parse_request(ApiRoute::kGenerate, b5, info).find("empty"), std::string::npos);
  std::string b6 = padded("{\"text\":\"\xff\xfe\"}");
  EXPECT_NE(parse_request(ApiRoute::kGenerate, b6, info).find("not valid JSON"), std::string::npos);
}

TEST(RequestInfo, UnpaddedBodyStillParses) {
  RequestInfo info;
  std::string body = R"({"model":"m"})";
  body.shrink_to_fit();
  ASSERT_EQ(parse_request(ApiRoute::kCompletions, body, info), "");
  EXPECT_EQ(info.model, "m");
}

}  // namespace
}  // namespace kvgate

namespace kvgate {
namespace {

std::string text_of(ApiRoute route, const std::string& json, std::string* first_user = nullptr,
                    bool* ids = nullptr) {
  RequestInfo info;
  std::string body = json;
  body.reserve(body.size() + 64);
  EXPECT_EQ(parse_request(route, body, info, {.want_text = true}), "");
  if (first_user) *first_user = std::string(info.first_user());
  if (ids) *ids = info.token_ids;
  return info.text;
}

TEST(RequestText, ChatIsTheWholeConversationInOrder) {
  std::string first;
  std::string t = text_of(ApiRoute::kChatCompletions,
                          R"({"messages":[{"role":"system","content":"Be brief."},
                              {"role":"user","content":[{"type":"text","text":"Hi "},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"there"}]},
                              {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},
                              {"role":"user","content":"Thanks"}]})",
                          &first);
  EXPECT_EQ(t,
            "system\nBe brief.\nuser\nHi there\nassistant\n"
            R"([{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}])"
            "\nuser\nThanks\n");
  EXPECT_EQ(first, "Hi there");
}

TEST(RequestText, PromptsAndIds) {
  bool ids = false;
  EXPECT_EQ(text_of(ApiRoute::kCompletions, R"({"prompt":"Once upon"})"), "Once upon");
  EXPECT_EQ(text_of(ApiRoute::kCompletions, R"({"prompt":["a","b"]})"), "a\nb");
  EXPECT_EQ(text_of(ApiRoute::kGenerate, R"({"text":"hello"})"), "hello");
  EXPECT_EQ(text_of(ApiRoute::kGenerate, R"({"input_ids":[1,22,333]})", nullptr, &ids), "1,22,333");
  EXPECT_TRUE(ids);
  EXPECT_EQ(text_of(ApiRoute::kGenerate, R"({"input_ids":[[1,2],[3]]})"), "1,2\n3");
  EXPECT_EQ(text_of(ApiRoute::kEmbeddings, R"({"input":"vec me"})"), "vec me");
  EXPECT_EQ(text_of(ApiRoute::kRerank, R"({"query":"q","documents":["a"]})"), "q");
}

TEST(RequestText, NotExtractedUnlessAsked) {
  RequestInfo info;
  std::string body = R"({"prompt":"x"})";
  body.reserve(100);
  ASSERT_EQ(parse_request(ApiRoute::kCompletions, body, info), "");
  EXPECT_TRUE(info.text.empty());
}

TEST(RequestText, MessagesMustBeAList) {
  RequestInfo info;
  std::string body = R"({"messages":"hi"})";
  body.reserve(100);
  EXPECT_NE(
      parse_request(ApiRoute::kChatCompletions, body, info).find("\"messages\" must be a list"),
      std::string::npos);
}

}  // namespace
}  // namespace kvgate

namespace kvgate {
namespace {

using testing::models_dir;

struct Model {
  std::unique_ptr<tokenizer::Tokenizer> tok;
  std::unique_ptr<tokenizer::ChatTemplate> tmpl;
};

Model load(const std::string& name) {
  Model m;
  std::string err;
  m.tok = tokenizer::Tokenizer::load(models_dir() + "/" + name, err);
  m.tmpl = tokenizer::ChatTemplate::load(models_dir() + "/" + name, err);
  return m;
}

TEST(RequestText, ChatRendersWithTheModelTemplateAndTokenizes) {
  Model m = load("qwen3");
  ASSERT_TRUE(m.tok && m.tmpl) << testing::missing_model("qwen3", "tokenizer_config.json");
  std::string body = padded(
      R"({"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi there"}],)"
      R"("chat_template_kwargs":{"enable_thinking":false}})");
  RequestInfo info;
  ParseOptions opt{.want_text = true,
                   .want_tokens = true,
                   .tokenizer = m.tok.get(),
                   .chat_template = m.tmpl.get()};
  ASSERT_EQ(parse_request(ApiRoute::kChatCompletions, body, info, opt), "");
  EXPECT_TRUE(info.rendered);
  // What the engine renders: the template with the generation prompt (and the kwargs).
  std::string expected, err;
  ASSERT_TRUE(m.tmpl->render_json(
      R"([{"role":"system","content":"Be brief."},{"role":"user","content":"Hi there"}])", "", true,
      R"({"enable_thinking":false})", expected, err))
      << err;
  EXPECT_EQ(info.text, expected);
  EXPECT_NE(info.text.find("<|im_start|>assistant\n<think>\n\n</think>"), std::string::npos);
  EXPECT_EQ(info.first_user(), "Hi there");
  EXPECT_EQ(info.tokens, m.tok->encode(expected, false));
  EXPECT_FALSE(info.tokens.empty());

  // Without want_tokens nothing is tokenized; a reused RequestInfo is reset.
  opt.want_tokens = false;
  ASSERT_EQ(parse_request(ApiRoute::kChatCompletions, body, info, opt), "");
  EXPECT_TRUE(info.tokens.empty());
}

TEST(RequestText, TemplateRejectionFallsBackToTheMessages) {
  std::string err;
  auto tmpl = tokenizer::ChatTemplate::from_source(
      "{% if messages[0].role != 'user' %}{{ raise_exception('user first') }}{% endif %}"
      "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}",
      {}, err);
  ASSERT_TRUE(tmpl) << err;
  ParseOptions opt{.want_text = true, .chat_template = tmpl.get()};
  RequestInfo info;
  std::string ok = padded(R"({"messages":[{"role":"user","content":"a"}]})");
  ASSERT_EQ(parse_request(ApiRoute::kChatCompletions, ok, info, opt), "");
  EXPECT_EQ(info.text, "[user]a");
  EXPECT_TRUE(info.rendered);
  std::string bad = padded(R"({"messages":[{"role":"assistant","content":"a"}]})");
  ASSERT_EQ(parse_request(ApiRoute::kChatCompletions, bad, info, opt), "");
  EXPECT_FALSE(info.rendered);
  EXPECT_EQ(info.text, "assistant\na\n");
}

// prefix_hash asks for its first N ids only: they are the first N of the whole prompt's ids.
TEST(RequestText, MaxTokensKeepsTheFirstIdsOfThePrompt) {
  Model m = load("qwen3");
  ASSERT_TRUE(m.tok && m.tmpl) << models_dir() << "/qwen3 is missing: run scripts/setup";
  std::string messages;
  for (int i = 0; i < 40; ++i) {
    messages += std::string(i ? "," : "") + R"({"role":")" + (i % 2 ? "assistant" : "user") +
                R"(","content":"Turn )" + std::to_string(i) + R"(: tell me more about caches."})";
  }
  std::string body = padded(R"({"messages":[)" + messages + "]}");
  ParseOptions opt{.want_text = true,
                   .want_tokens = true,
                   .tokenizer = m.tok.get(),
                   .chat_template = m.tmpl.get()};
  RequestInfo full;
  ASSERT_EQ(parse_request(ApiRoute::kChatCompletions, body, full, opt), "");
  ASSERT_GT(full.tokens.size(), 300u);
  for (size_t n : {size_t{1}, size_t{16}, size_t{256}, full.tokens.size() + 10}) {
    opt.max_tokens = n;
    RequestInfo info;
    ASSERT_EQ(parse_request(ApiRoute::kChatCompletions, body, info, opt), "");
    EXPECT_EQ(info.text, full.text) << "the text is still all of it";
    size_t want = std::min(n, full.tokens.size());
    EXPECT_EQ(info.tokens, std::vector<int32_t>(full.tokens.begin(),
                                                full.tokens.begin() + static_cast<ptrdiff_t>(want)))
        << "n=" << n;
  }
}

TEST(RequestText, InputIdsAreTheTokens) {
  RequestInfo info;
  std::string body = padded(R"({"input_ids":[1,22,333]})");
  ASSERT_EQ(
      parse_request(ApiRoute::kGenerate, body, info, {.want_text = true, .want_tokens = true}), "");
  EXPECT_EQ(info.tokens, (std::vector<int32_t>{1, 22, 333}));
  ASSERT_EQ(parse_request(ApiRoute::kGenerate, body, info,
                          {.want_text = true, .want_tokens = true, .max_tokens = 2}),
            "");
  EXPECT_EQ(info.tokens, (std::vector<int32_t>{1, 22}));
  // Text without a tokenizer stays characters.
  body = padded(R"({"text":"hello"})");
  ASSERT_EQ(
      parse_request(ApiRoute::kGenerate, body, info, {.want_text = true, .want_tokens = true}), "");
  EXPECT_TRUE(info.tokens.empty());
}

}  // namespace
}  // namespace kvgate

namespace kvgate {
namespace {

// /v1/responses: the messages SGLang's serving_responses builds (instructions as a system
// message, then the input), rendered with the chat template as its chat route renders them.
TEST(RequestText, ResponsesRenderInstructionsThenInput) {
  Model m = load("qwen3");
  ASSERT_TRUE(m.tok && m.tmpl) << testing::missing_model("qwen3", "tokenizer_config.json");
  ParseOptions opt{.want_text = true,
                   .want_tokens = true,
                   .tokenizer = m.tok.get(),
                   .chat_template = m.tmpl.get()};
  RequestInfo info;
  std::string body =
      padded(R"({"model":"q","input":"Hi there","instructions":"Be brief.","stream":true})");
  ASSERT_EQ(parse_request(ApiRoute::kResponses, body, info, opt), "");
  std::string expected, err;
  ASSERT_TRUE(m.tmpl->render_json(
      R"([{"role":"system","content":"Be brief."},{"role":"user","content":"Hi there"}])", "", true,
      "", expected, err))
      << err;
  EXPECT_TRUE(info.rendered);
  EXPECT_EQ(info.text, expected);
  EXPECT_EQ(info.tokens, m.tok->encode(expected, false));
  EXPECT_EQ(info.first_user(), "Hi there");
  EXPECT_TRUE(info.stream);
  EXPECT_TRUE(info.store);
  EXPECT_TRUE(info.previous_response_id.empty());

  // A list input: message items, their text parts joined.
  body =
      padded(R"({"input":[{"role":"user","content":[{"type":"input_text","text":"a"},)"
             R"({"type":"input_text","text":"b"}]},{"type":"message","role":"assistant",)"
             R"("content":[{"type":"output_text","text":"c"}]},{"role":"user","content":"d"}]})");
  ASSERT_EQ(parse_request(ApiRoute::kResponses, body, info, opt), "");
  expected.clear();
  ASSERT_TRUE(
      m.tmpl->render_json(R"([{"role":"user","content":"ab"},{"role":"assistant","content":"c"},)"
                          R"({"role":"user","content":"d"}])",
                          "", true, "", expected, err))
      << err;
  EXPECT_EQ(info.text, expected);
}

TEST(RequestText, ResponsesReadTheirStateFields) {
  RequestInfo info;
  std::string body =
      padded(R"({"input":"x","previous_response_id":"resp_abc","store":false,"instructions":"I"})");
  ASSERT_EQ(parse_request(ApiRoute::kResponses, body, info, {.want_text = true}), "");
  EXPECT_EQ(info.previous_response_id, "resp_abc");
  EXPECT_FALSE(info.store);
  EXPECT_EQ(info.text, "system\nI\nuser\nx\n");  // the stand-in without a template
  EXPECT_EQ(info.first_user(), "x");
  body = padded(R"({"input":"x","previous_response_id":7})");
  EXPECT_NE(parse_request(ApiRoute::kResponses, body, info), "");
  // previous_response_id means nothing elsewhere.
  body = padded(R"({"prompt":"x","previous_response_id":"resp_abc"})");
  ASSERT_EQ(parse_request(ApiRoute::kCompletions, body, info), "");
  EXPECT_TRUE(info.previous_response_id.empty());
}

TEST(RequestText, PoolingAndScoringRoutesRouteOnTheirInput) {
  RequestInfo info;
  ParseOptions opt{.want_text = true};
  ASSERT_EQ(parse_request(ApiRoute::kEncode, padded(R"({"text":"encode me"})"), info, opt), "");
  EXPECT_EQ(info.text, "encode me");
  ASSERT_EQ(parse_request(ApiRoute::kEncode, padded(R"({"input_ids":[1,2,3]})"), info, opt), "");
  EXPECT_EQ(info.text, "1,2,3");
  EXPECT_TRUE(info.token_ids);
  ASSERT_EQ(parse_request(ApiRoute::kClassify, padded(R"({"text":["a","b"]})"), info, opt), "");
  EXPECT_EQ(info.text, "a\nb");
  EXPECT_TRUE(info.batch);
  ASSERT_EQ(parse_request(ApiRoute::kClassifyOpenAI, padded(R"({"input":"classify"})"), info, opt),
            "");
  EXPECT_EQ(info.text, "classify");
  ASSERT_EQ(parse_request(ApiRoute::kScore, padded(R"({"query":"the query","items":["x","y"]})"),
                          info, opt),
            "");
  EXPECT_EQ(info.text, "the query");
}

TEST(RequestText, OnlyOpenAIRoutesReadAnAdapterInTheModel) {
  RequestInfo info;
  ParseOptions opt{.model_names_adapter = true};
  ASSERT_EQ(parse_request(ApiRoute::kResponses, padded(R"({"model":"base:ad"})"), info, opt), "");
  EXPECT_EQ(info.lora, "ad");
  ASSERT_EQ(parse_request(ApiRoute::kEncode, padded(R"({"model":"base:ad"})"), info, opt), "");
  EXPECT_FALSE(info.lora);
}

TEST(RequestRoutes, NamesAndGeneration) {
  EXPECT_EQ(to_string(ApiRoute::kResponses), "/v1/responses");
  EXPECT_EQ(to_string(ApiRoute::kResponse), "/v1/responses/{id}");
  EXPECT_EQ(to_string(ApiRoute::kScore), "/v1/score");
  EXPECT_TRUE(generates(ApiRoute::kResponses));
  EXPECT_TRUE(generates(ApiRoute::kGenerate));
  EXPECT_FALSE(generates(ApiRoute::kEncode));
  EXPECT_FALSE(generates(ApiRoute::kTokenize));
}

}  // namespace
}  // namespace kvgate
