// Integration: what a router observes of kvgate-sim's HTTP timing, on a raw socket, as of SGLang
// behind uvicorn: a /generate stream's status and headers arrive before its first token; an OpenAI
// stream's come with its first chunk (SGLang pulls that chunk before answering); an idle
// keep-alive connection is closed after --timeout-keep-alive seconds. And SGLang's tokenizer
// endpoints (/tokenize, /detokenize, each also under /v1/), whose ids must be the ones kvgate's
// own tokenizer (src/tokenizer) computes, since a gateway that counts or routes by tokens relies
// on both sides agreeing.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "support/cluster.h"
#include "support/models.h"
#include "tokenizer/tokenizer.h"

namespace kvgate::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// One raw TCP connection: what arrived so far, and whether the server closed it.
class Raw {
 public:
  explicit Raw(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  }
  ~Raw() { ::close(fd_); }
  Raw(const Raw&) = delete;
  Raw& operator=(const Raw&) = delete;

  bool connected() const { return connected_; }
  void send(const std::string& s) {
    ASSERT_EQ(::send(fd_, s.data(), s.size(), 0), ssize_t(s.size()));
  }
  // Reads until `done(received)` holds, the server closes, or `timeout` passes.
  void read_until(const std::function<bool(const std::string&)>& done,
                  std::chrono::milliseconds timeout) {
    const auto end = Clock::now() + timeout;
    while (!done(in_) && !closed_) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now());
      if (left <= 0ms) return;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char buf[4096];
      ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) {
        closed_ = true;
      } else {
        in_.append(buf, static_cast<size_t>(n));
      }
    }
  }
  const std::string& received() const { return in_; }
  bool closed() const { return closed_; }

 private:
  int fd_ = -1;
  bool connected_ = false;
  bool closed_ = false;
  std::string in_;
};

std::string post(const std::string& path, const std::string& body) {
  return "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

bool has_head(const std::string& s) {
  return s.find("\r\n\r\n") != std::string::npos;
}

TEST(SimHttp, GenerateStreamHeadersArriveBeforeTheFirstToken) {
  Sim s;
  s.port = free_port();
  s.args = {"--ttft-ms", "3000", "--tpot-ms", "1"};  // first token 3 s after arrival
  s.start();
  Raw r(s.port);
  ASSERT_TRUE(r.connected());
  r.send(
      post("/generate", R"({"text":"hi","sampling_params":{"max_new_tokens":2},"stream":true})"));
  r.read_until(has_head, 10s);
  ASSERT_TRUE(has_head(r.received())) << r.received();
  const std::string head = r.received().substr(0, r.received().find("\r\n\r\n") + 4);
  EXPECT_EQ(head.rfind("HTTP/1.1 200 ", 0), 0u) << head;
  EXPECT_NE(head.find("content-type: text/event-stream"), std::string::npos) << head;
  // The head came alone: the prefill is still running.
  EXPECT_EQ(r.received().find("data:"), std::string::npos) << r.received();
  // Then the tokens, and the end of the stream.
  r.read_until([](const std::string& in) { return in.find("data: [DONE]") != std::string::npos; },
               15s);
  EXPECT_NE(r.received().find("data: [DONE]"), std::string::npos) << r.received();
  EXPECT_NE(r.received().find("\"completion_tokens\":2"), std::string::npos) << r.received();
}

TEST(SimHttp, OpenAiStreamHeadersComeWithTheFirstChunk) {
  Sim s;
  s.port = free_port();
  s.args = {"--ttft-ms", "2500", "--tpot-ms", "1"};
  s.start();
  Raw r(s.port);
  ASSERT_TRUE(r.connected());
  r.send(post("/v1/chat/completions",
              R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":2,"stream":true})"));
  // Nothing during the prefill: SGLang's OpenAI routes answer once the first chunk exists.
  r.read_until([](const std::string& in) { return !in.empty(); }, 1500ms);
  EXPECT_EQ(r.received(), "");
  r.read_until([](const std::string& in) { return in.find("data: ") != std::string::npos; }, 10s);
  EXPECT_EQ(r.received().rfind("HTTP/1.1 200 ", 0), 0u) << r.received();
  EXPECT_NE(r.received().find("\"role\":\"assistant\""), std::string::npos) << r.received();
}

TEST(SimHttp, IdleKeepAliveConnectionIsClosedAfterTheTimeout) {
  Sim s;
  s.port = free_port();
  s.args = {"--instant", "--timeout-keep-alive", "1"};
  s.start();
  Raw r(s.port);
  ASSERT_TRUE(r.connected());
  const auto sent = Clock::now();
  r.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  r.read_until(has_head, 5s);
  ASSERT_EQ(r.received().rfind("HTTP/1.1 200 ", 0), 0u) << r.received();
  EXPECT_EQ(r.received().find("connection: close"), std::string::npos) << "kept alive";
  // Idle from here on: the server closes the connection after about a second.
  r.read_until([](const std::string&) { return false; }, 10s);
  EXPECT_TRUE(r.closed());
  EXPECT_GE(Clock::now() - sent, 900ms);
  // A connection that keeps asking is served on the same connection meanwhile.
  Raw busy(s.port);
  for (int i = 0; i < 3; ++i) {
    busy.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    size_t want = static_cast<size_t>(i) + 1;
    busy.read_until(
        [want](const std::string& in) {
          size_t n = 0;
          for (size_t p = 0; (p = in.find("HTTP/1.1 200", p)) != std::string::npos; ++p) ++n;
          return n == want && in.size() >= 4 && in.compare(in.size() - 4, 4, "\r\n\r\n") == 0;
        },
        5s);
    EXPECT_FALSE(busy.closed()) << "request " << i;
  }
}

// ---- /tokenize and /detokenize ----

using nlohmann::json;

// A sim answering at once; `args` are added (e.g. --tokenizer-path).
Sim tokenizer_sim(std::vector<std::string> args) {
  Sim s;
  s.port = free_port();
  s.args = {"--instant", "--context-length", "8192"};
  s.args.insert(s.args.end(), args.begin(), args.end());
  s.start();
  return s;
}

// POSTs `body` (a JSON value) to `path`; the answer's status and parsed body (null when the body
// is not JSON).
std::pair<int, json> call(HttpClient& c, const std::string& path, const json& body) {
  Response r = c.post(path, body.dump());
  EXPECT_EQ(r.header("content-type"), "application/json") << path;
  return {r.status, json::parse(r.body, nullptr, false)};
}

// SGLang's ErrorResponse, flat: {"object":"error","message","type","param":null,"code"}.
void expect_openai_error(const std::pair<int, json>& a, int status, const std::string& message) {
  EXPECT_EQ(a.first, status) << a.second.dump();
  ASSERT_TRUE(a.second.is_object()) << a.second.dump();
  EXPECT_EQ(a.second.value("object", ""), "error");
  EXPECT_EQ(a.second.value("message", ""), message);
  EXPECT_EQ(a.second.value("type", ""), status == 400 ? "BadRequestError" : "InternalServerError");
  ASSERT_TRUE(a.second.contains("param"));
  EXPECT_TRUE(a.second["param"].is_null());
  EXPECT_EQ(a.second.value("code", 0), status);
  EXPECT_EQ(a.second.size(), 5u) << a.second.dump();
}

std::unique_ptr<tokenizer::Tokenizer> gateway_tokenizer(const std::string& model) {
  std::string error;
  auto t = tokenizer::Tokenizer::load(models_dir() + "/" + model, error);
  EXPECT_TRUE(t) << error;
  return t;
}

const std::vector<std::string> kTexts = {
    "Hello world",
    "The quick brown fox jumps over the lazy dog. 12345 + 678 = ?",
    "<|im_start|>user\nnǐ hǎo 你好 😀 café<|im_end|>\n",
    "  leading spaces\tand\ttabs\n\nand blank lines  ",
    "",
};

TEST(SimHttp, TokenizeAnswersTheStandInsIdsInSglangsShape) {
  Sim s = tokenizer_sim({});
  HttpClient c(s.port);
  // The stand-in: "{" and "}" are bytes, <|im_start|> its special token 256, and it adds no
  // special tokens of its own.
  for (const char* path : {"/tokenize", "/v1/tokenize"}) {
    for (bool add : {true, false}) {
      auto [status, j] = call(c, path, {{"prompt", "{<|im_start|>}"}, {"add_special_tokens", add}});
      ASSERT_EQ(status, 200) << j.dump();
      EXPECT_EQ(j, json::parse(R"({"tokens":[123,256,125],"count":3,"max_model_len":8192})"));
    }
  }
  // The keys in TokenizeResponse's order.
  Response raw = c.post("/tokenize", R"({"model":"m","prompt":"{}"})");
  EXPECT_EQ(raw.body, R"({"tokens":[123,125],"count":2,"max_model_len":8192})");
  // A list of prompts: a list of id lists and a list of counts.
  raw = c.post("/tokenize", R"({"prompt":["{","","}}"]})");
  EXPECT_EQ(raw.status, 200);
  EXPECT_EQ(raw.body, R"({"tokens":[[123],[],[125,125]],"count":[1,0,2],"max_model_len":8192})");
  raw = c.post("/tokenize", R"({"prompt":[]})");
  EXPECT_EQ(raw.body, R"({"tokens":[],"count":[],"max_model_len":8192})");
  // Every text comes back from its ids.
  for (const std::string& text : kTexts) {
    json ids = call(c, "/tokenize", {{"prompt", text}}).second["tokens"];
    auto [st, d] = call(c, "/detokenize", {{"tokens", ids}, {"skip_special_tokens", false}});
    ASSERT_EQ(st, 200) << d.dump();
    EXPECT_EQ(d["text"], text);
  }
}

// With --tokenizer-path, the sim's ids are the ids of kvgate's own tokenizer for the same model
// (src/tokenizer, itself checked against HF tokenizers by the conformance tests), with and without
// the special tokens HF's encode adds.
TEST(SimHttp, TokenizeIdsAreTheGatewayTokenizersForRealModels) {
  for (const std::string model : {"qwen3", "llama3", "llama3_1"}) {
    SCOPED_TRACE(model);
    KVGATE_REQUIRE_MODEL(model);
    auto tok = gateway_tokenizer(model);
    ASSERT_TRUE(tok);
    Sim s = tokenizer_sim({"--tokenizer-path", models_dir() + "/" + model});
    HttpClient c(s.port);
    for (bool add : {true, false}) {
      json want_tokens = json::array(), want_counts = json::array();
      for (const std::string& text : kTexts) {
        SCOPED_TRACE(text);
        std::vector<int32_t> want = tok->encode(text, add);
        for (const char* path : {"/tokenize", "/v1/tokenize"}) {
          auto [status, j] = call(c, path, {{"prompt", text}, {"add_special_tokens", add}});
          ASSERT_EQ(status, 200) << j.dump();
          EXPECT_EQ(j["tokens"].get<std::vector<int32_t>>(), want);
          EXPECT_EQ(j["count"], want.size());
          EXPECT_EQ(j["max_model_len"], 8192);
        }
        want_tokens.push_back(want);
        want_counts.push_back(want.size());
      }
      // The same texts as one list.
      auto [status, j] = call(c, "/tokenize", {{"prompt", kTexts}, {"add_special_tokens", add}});
      ASSERT_EQ(status, 200) << j.dump();
      EXPECT_EQ(j["tokens"], want_tokens);
      EXPECT_EQ(j["count"], want_counts);
    }
    // add_special_tokens defaults to true, as in SGLang's TokenizeRequest.
    EXPECT_EQ(call(c, "/tokenize", {{"prompt", "Hello world"}}).second["tokens"],
              json(tok->encode("Hello world", true)));
  }
}

// Llama 3.1's post-processor (TemplateProcessing) puts <|begin_of_text|> (128000) first: with
// add_special_tokens only. models/llama3 is the first Llama 3 tokenizer.json, whose post-processor
// is ByteLevel alone: HF's encode adds no BOS there even with add_special_tokens (nor for Qwen3),
// and neither does the sim.
TEST(SimHttp, TokenizeAddsTheBosOnlyWithAddSpecialTokens) {
  const json hello_with = {{"prompt", "Hello world"}, {"add_special_tokens", true}};
  const json hello_without = {{"prompt", "Hello world"}, {"add_special_tokens", false}};
  {
    KVGATE_REQUIRE_MODEL("llama3_1");
    Sim s = tokenizer_sim({"--tokenizer-path", models_dir() + "/llama3_1"});
    HttpClient c(s.port);
    json with = call(c, "/tokenize", hello_with).second;
    json without = call(c, "/tokenize", hello_without).second;
    ASSERT_FALSE(with["tokens"].empty()) << with.dump();
    EXPECT_EQ(with["tokens"][0], 128000);
    EXPECT_EQ(with["count"], without["count"].get<int>() + 1);
    for (const json& id : without["tokens"]) EXPECT_NE(id, 128000);
    json rest = with["tokens"];
    rest.erase(rest.begin());
    EXPECT_EQ(rest, without["tokens"]);
    // An empty prompt is the BOS alone; add_special_tokens defaults to true.
    EXPECT_EQ(call(c, "/tokenize", {{"prompt", ""}}).second["tokens"], json::array({128000}));
    EXPECT_EQ(call(c, "/v1/tokenize", {{"prompt", "Hello world"}}).second, with);
  }
  for (const std::string model : {"llama3", "qwen3"}) {
    SCOPED_TRACE(model);
    KVGATE_REQUIRE_MODEL(model);
    Sim s = tokenizer_sim({"--tokenizer-path", models_dir() + "/" + model});
    HttpClient c(s.port);
    json with = call(c, "/tokenize", hello_with).second;
    EXPECT_EQ(with, call(c, "/tokenize", hello_without).second);
    for (const json& id : with["tokens"]) EXPECT_NE(id, 128000);
  }
}

// /detokenize gives back the text of /tokenize's ids: without the special tokens by default
// (skip_special_tokens defaults to true in SGLang's DetokenizeRequest), with them on request; as
// kvgate's tokenizer decodes them.
TEST(SimHttp, DetokenizeRoundTripsTheTokenizedText) {
  KVGATE_REQUIRE_MODEL("llama3_1");
  auto tok = gateway_tokenizer("llama3_1");
  ASSERT_TRUE(tok);
  Sim s = tokenizer_sim({"--tokenizer-path", models_dir() + "/llama3_1"});
  HttpClient c(s.port);
  const std::string text = "Hello world, 你好 😀 <|eot_id|> done";
  json ids = call(c, "/tokenize", {{"prompt", text}}).second["tokens"];
  ASSERT_EQ(ids[0], 128000) << ids.dump();
  const std::vector<int32_t> v = ids.get<std::vector<int32_t>>();
  for (const char* path : {"/detokenize", "/v1/detokenize"}) {
    auto [status, j] = call(c, path, {{"model", "m"}, {"tokens", ids}});
    ASSERT_EQ(status, 200) << j.dump();
    EXPECT_EQ(j, (json{{"text", tok->decode(v, true)}}));
    EXPECT_EQ(j["text"], "Hello world, 你好 😀  done");  // both special tokens left out
    j = call(c, path, {{"tokens", ids}, {"skip_special_tokens", false}}).second;
    EXPECT_EQ(j["text"], "<|begin_of_text|>" + text);
    EXPECT_EQ(j["text"], tok->decode(v, false));
  }
  // A list of id lists: a list of texts.
  json hello = call(c, "/tokenize", {{"prompt", "Hello"}, {"add_special_tokens", false}}).second;
  auto [status, j] = call(c, "/detokenize", {{"tokens", {ids, hello["tokens"], json::array()}}});
  ASSERT_EQ(status, 200) << j.dump();
  EXPECT_EQ(j, (json{{"text", {tok->decode(v, true), "Hello", ""}}}));
  // [] is "", and ids past the vocabulary decode to nothing (HF skips them).
  EXPECT_EQ(c.post("/detokenize", R"({"tokens":[]})").body, R"({"text":""})");
  EXPECT_EQ(
      call(c, "/detokenize", json::parse(R"({"tokens":[9906,4294967295,1917]})")).second["text"],
      tok->decode(std::vector<int32_t>{9906, 1917}));
  // A byte token cut from its character: U+FFFD, as HF.
  std::vector<int32_t> emoji = tok->encode("😀", false);
  EXPECT_EQ(call(c, "/detokenize", {{"tokens", json::array({emoji[0]})}}).second["text"],
            tok->decode(std::vector<int32_t>{emoji[0]}));
}

TEST(SimHttp, TokenizerRouteErrorsAreSglangs) {
  Sim s = tokenizer_sim({});
  HttpClient c(s.port);
  for (const char* path : {"/tokenize", "/v1/tokenize"}) {
    expect_openai_error(call(c, path, {{"prompt", 5}}), 400,
                        "Invalid prompt type: <class 'int'>. Expected str or List[str].");
    expect_openai_error(call(c, path, json::parse(R"({"prompt":["a",1]})")), 400,
                        "Invalid prompt type: <class 'list'>. Expected str or List[str].");
    expect_openai_error(call(c, path, json::parse(R"({"prompt":{"a":1}})")), 400,
                        "Invalid prompt type: <class 'dict'>. Expected str or List[str].");
    expect_openai_error(call(c, path, {{"model", "m"}}), 400,
                        "Exactly one of 'prompt' or 'messages' must be provided.");
    expect_openai_error(call(c, path, {{"prompt", "a"}, {"add_special_tokens", "yes"}}), 400,
                        "'add_special_tokens' must be true or false");
  }
  for (const char* path : {"/detokenize", "/v1/detokenize"}) {
    expect_openai_error(call(c, path, json::parse(R"({"tokens":[1,"a"]})")), 400,
                        "Invalid input: 'tokens' must be a list of integers.");
    expect_openai_error(call(c, path, json::parse(R"({"tokens":[1,2.5]})")), 400,
                        "Invalid input: 'tokens' must be a list of integers.");
    expect_openai_error(
        call(c, path, json::parse(R"({"tokens":[[1],[2,"x",null,true]]})")), 400,
        "Invalid input: Sublist in 'tokens' must contain only integers. Found: [2, 'x', None, "
        "True]");
    expect_openai_error(
        call(c, path, {{"tokens", "abc"}}), 400,
        "Invalid tokens type: <class 'str'>. Expected List[int] or List[List[int]].");
    expect_openai_error(
        call(c, path, json::parse(R"({"tokens":["abc"]})")), 400,
        "Invalid tokens type: <class 'list'>. Expected List[int] or List[List[int]].");
    // An id HF's decode cannot convert: SGLang's 500.
    expect_openai_error(call(c, path, json::parse(R"({"tokens":[1,-1]})")), 500,
                        "Internal server error during detokenization: out of range integral type "
                        "conversion attempted");
    expect_openai_error(call(c, path, json::parse(R"({"tokens":[1],"skip_special_tokens":1})")),
                        400, "'skip_special_tokens' must be true or false");
  }
  // A body that is not a JSON object: what /v1/completions answers for it.
  for (const std::string body : {R"({"prompt":)", "[1]", ""}) {
    Response want = c.post("/v1/completions", body);
    ASSERT_EQ(want.status, 400) << want.body;
    for (const char* path : {"/tokenize", "/v1/tokenize", "/detokenize", "/v1/detokenize"}) {
      Response r = c.post(path, body);
      EXPECT_EQ(r.status, 400) << path;
      EXPECT_EQ(r.body, want.body) << path;
    }
  }
  // POST only, as SGLang registers them; another method is FastAPI's 405.
  for (const char* path : {"/tokenize", "/v1/tokenize", "/detokenize", "/v1/detokenize"}) {
    for (const char* method : {"GET", "PUT", "DELETE"}) {
      Response r = c.request(method, path, method == std::string("GET") ? "" : R"({"prompt":"a"})");
      EXPECT_EQ(r.status, 405) << method << " " << path;
      EXPECT_EQ(r.body, R"({"detail":"Method Not Allowed"})");
    }
  }
}

}  // namespace
}  // namespace kvgate::testing
