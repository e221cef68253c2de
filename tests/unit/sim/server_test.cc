// Tests for sim/server and sim/generation, end to end in process: a SimServer on a loopback port,
// driven by the tests' own HTTP client. Checks every route's JSON and SSE event sequence, the
// flags that change shapes, --instant, faults, disconnect cancellation and the info endpoints.
#include "sim/server.h"

#include <gtest/gtest.h>
#include <simdjson.h>

#include <fstream>
#include <future>
#include <thread>

#include "sim/pooling.h"
#include "sim_harness.h"
#include "support/http_client.h"
#include "support/models.h"
#include "support/process.h"

namespace kvgate::sim {
namespace {

using namespace std::chrono_literals;
using simdjson::dom::element;
using testing::HttpClient;
using testing::sse_data;

const std::vector<std::string> kFast = {"--ttft-ms", "1", "--tpot-ms", "1"};
const char* kChat =
    R"({"model":"m1","messages":[{"role":"user","content":"Hello there"}],"max_tokens":6)";
const char* kGen = R"({"text":"The capital of France is","sampling_params":{"max_new_tokens":6})";
const char* kCmpl = R"({"model":"m2","prompt":"Once upon a time","max_tokens":6)";

class SimServerTest : public ::testing::Test {
 protected:
  element parse(const std::string& json) {
    docs.push_back(std::make_unique<simdjson::dom::parser>());
    element e;
    EXPECT_FALSE(docs.back()->parse(json).get(e)) << json;
    return e;
  }
  // The SSE events of a stream, each parsed (the last one, [DONE], is checked and dropped).
  std::vector<element> events(const testing::Response& r) {
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.header("content-type"), "text/event-stream");
    auto data = sse_data(r.body);
    EXPECT_FALSE(data.empty());
    EXPECT_EQ(data.back(), "[DONE]") << r.body;
    std::vector<element> out;
    for (size_t i = 0; i + 1 < data.size(); ++i) out.push_back(parse(data[i]));
    return out;
  }
  std::vector<std::unique_ptr<simdjson::dom::parser>> docs;
};

std::string str(element e) {
  return std::string(std::string_view(e));
}

std::string with(const char* body, std::string_view extra) {
  return std::string(body) + std::string(extra) + "}";
}

TEST_F(SimServerTest, GenerateWholeAndStreamAgree) {
  Sim s(kFast);
  HttpClient c(s.port);
  auto whole = c.post("/generate", with(kGen, ""));
  ASSERT_EQ(whole.status, 200) << whole.body;
  EXPECT_EQ(whole.header("content-type"), "application/json");
  element w = parse(whole.body);
  std::string text = str(w["text"]);
  EXPECT_EQ(w["output_ids"].get_array().size(), 6u);
  EXPECT_EQ(int64_t(w["meta_info"]["completion_tokens"]), 6);
  EXPECT_EQ(int64_t(w["meta_info"]["cached_tokens"]), 0);
  EXPECT_EQ(std::string_view(w["meta_info"]["id"]).size(), 32u);
  EXPECT_GT(double(w["meta_info"]["e2e_latency"]), 0);

  auto ev = events(c.post("/generate", with(kGen, R"(,"stream":true,"rid":"my-rid")")));
  ASSERT_EQ(ev.size(), 6u);  // one event per token
  for (size_t i = 0; i < ev.size(); ++i) {
    element m = ev[i]["meta_info"];
    EXPECT_EQ(std::string_view(m["id"]), "my-rid");
    EXPECT_EQ(int64_t(m["completion_tokens"]), static_cast<int64_t>(i + 1));
    EXPECT_EQ(ev[i]["output_ids"].get_array().size(), i + 1);  // whole so far, not deltas
    bool last = i + 1 == ev.size();
    EXPECT_EQ(m["finish_reason"].is_null(), !last);
    EXPECT_EQ(m["e2e_latency"].error() == simdjson::SUCCESS, last);
  }
  EXPECT_EQ(std::string_view(ev.back()["text"]), text);  // same prompt, same text
}

TEST_F(SimServerTest, IncrementalStreamingSendsDeltas) {
  Sim s({"--ttft-ms", "1", "--tpot-ms", "1", "--incremental-streaming-output"});
  HttpClient c(s.port);
  std::string whole = str(parse(c.post("/generate", with(kGen, "")).body)["text"]);
  auto ev = events(c.post("/generate", with(kGen, R"(,"stream":true)")));
  std::string joined;
  for (auto& e : ev) {
    EXPECT_EQ(e["output_ids"].get_array().size(), 1u);
    joined += str(e["text"]);
  }
  EXPECT_EQ(joined, whole);
}

TEST_F(SimServerTest, GenerateBatch) {
  Sim s(kFast);
  HttpClient c(s.port);
  auto r = c.post("/generate", R"({"text":["a","b c"],"sampling_params":{"max_new_tokens":2}})");
  element e = parse(r.body);
  ASSERT_TRUE(e.is_array()) << r.body;
  EXPECT_EQ(e.get_array().size(), 2u);
  EXPECT_EQ(int64_t(e.at(1)["meta_info"]["prompt_tokens"]), 3);
  auto ev = events(
      c.post("/generate",
             R"({"input_ids":[[1],[2]],"sampling_params":{"max_new_tokens":2},"stream":true})"));
  ASSERT_EQ(ev.size(), 4u);
  int64_t index_sum = 0;
  for (auto& x : ev) index_sum += int64_t(x["index"]);
  EXPECT_EQ(index_sum, 2);
}

TEST_F(SimServerTest, ChatWholeAndStreamSequence) {
  Sim s(kFast);
  HttpClient c(s.port);
  auto whole = c.post("/v1/chat/completions", with(kChat, ""));
  element w = parse(whole.body);
  EXPECT_EQ(std::string_view(w["model"]), "m1");
  std::string content = str(w["choices"].at(0)["message"]["content"]);
  EXPECT_FALSE(content.empty());
  EXPECT_NE(content.front(), ' ');  // the reply starts a fresh line after "assistant\n"

  auto r = c.post("/v1/chat/completions", with(kChat, R"(,"stream":true)"));
  auto ev = events(r);
  ASSERT_EQ(ev.size(), 1u + 6u + 1u);  // role, 6 content deltas, finish; no usage chunk
  EXPECT_EQ(std::string_view(ev[0]["choices"].at(0)["delta"]["role"]), "assistant");
  std::string joined;
  for (size_t i = 1; i + 1 < ev.size(); ++i) {
    joined += str(ev[i]["choices"].at(0)["delta"]["content"]);
    EXPECT_TRUE(ev[i]["choices"].at(0)["finish_reason"].is_null());
  }
  EXPECT_EQ(joined, content);
  element fin = ev.back()["choices"].at(0);
  EXPECT_EQ(fin["delta"].get_object().size(), 0u);
  EXPECT_EQ(std::string_view(fin["finish_reason"]), "length");
  for (auto& e : ev) EXPECT_EQ(std::string_view(e["id"]), std::string_view(ev[0]["id"]));

  ev = events(c.post("/v1/chat/completions",
                     with(kChat, R"(,"stream":true,"stream_options":{"include_usage":true})")));
  element usage = ev.back();
  EXPECT_EQ(usage["choices"].get_array().size(), 0u);
  EXPECT_EQ(int64_t(usage["usage"]["completion_tokens"]), 6);
  EXPECT_EQ(int64_t(usage["usage"]["prompt_tokens"]), int64_t(w["usage"]["prompt_tokens"]));
}

TEST_F(SimServerTest, CompletionsStreamAndServerDefaultUsage) {
  Sim s({"--ttft-ms", "1", "--tpot-ms", "1", "--stream-response-default-include-usage"});
  HttpClient c(s.port);
  auto ev = events(c.post("/v1/completions", with(kCmpl, R"(,"stream":true)")));
  ASSERT_EQ(ev.size(), 6u + 1u);  // 6 text chunks (the last with finish_reason), usage
  EXPECT_TRUE(ev[0]["choices"].at(0)["finish_reason"].is_null());
  EXPECT_EQ(std::string_view(ev[5]["choices"].at(0)["finish_reason"]), "length");
  EXPECT_EQ(std::string_view(ev[5]["model"]), "m2");
  EXPECT_EQ(int64_t(ev[6]["usage"]["total_tokens"]), int64_t(ev[6]["usage"]["prompt_tokens"]) + 6);
  EXPECT_TRUE(ev[6]["usage"]["prompt_tokens_details"].error());  // absent here
}

TEST_F(SimServerTest, InstantAnswersAtOnceInTheSameShapes) {
  Sim s({"--instant", "--ttft-ms", "60000"});
  HttpClient c(s.port);
  auto start = Clock::now();
  element chat = parse(
      c.post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}]})").body);
  EXPECT_LT(Clock::now() - start, 5s);  // not the 60 s TTFT
  element choice = chat["choices"].at(0);
  EXPECT_EQ(std::string_view(choice["finish_reason"]), "stop");
  EXPECT_EQ(int64_t(choice["matched_stop"]), s.tokenizer->eos_token_id());
  EXPECT_EQ(int64_t(chat["usage"]["completion_tokens"]), 9);  // 8 words + EOS
  element gen =
      parse(c.post("/generate", R"({"text":"x","sampling_params":{"max_new_tokens":3}})").body);
  EXPECT_EQ(std::string_view(gen["meta_info"]["finish_reason"]["type"]), "length");
  EXPECT_EQ(gen["output_ids"].get_array().size(), 3u);
  auto ev =
      events(c.post("/v1/chat/completions",
                    R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":4,"stream":true,)"
                    R"("stream_options":{"include_usage":true}})"));
  ASSERT_EQ(ev.size(), 1u + 4u + 1u + 1u);
  std::string joined;
  for (size_t i = 1; i <= 4; ++i) joined += str(ev[i]["choices"].at(0)["delta"]["content"]);
  std::string_view full = choice["message"]["content"];
  EXPECT_TRUE(full.starts_with(joined)) << joined;
  EXPECT_EQ(s.metrics->rank(0).requests->value(), 3u);
}

TEST_F(SimServerTest, ErrorsInEachRoutesShape) {
  Sim s(kFast);
  HttpClient c(s.port);
  auto r = c.post("/v1/chat/completions", R"({"messages":)");
  EXPECT_EQ(r.status, 400);
  element e = parse(r.body);
  EXPECT_EQ(std::string_view(e["object"]), "error");
  EXPECT_EQ(int64_t(e["code"]), 400);
  EXPECT_NE(std::string_view(e["message"]).find("malformed JSON"), std::string_view::npos);
  r = c.post("/generate", R"({"text":"a","routed_dp_rank":5})");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(std::string_view(parse(r.body)["error"]["message"]),
            "routed_dp_rank=5 out of range [0, 1)");
  r = c.get("/nope");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(r.body, R"({"detail":"Not Found"})");
  EXPECT_EQ(c.get("/generate").status, 405);
  EXPECT_EQ(c.get("/metrics").status, 404);  // only with --enable-metrics
}

// With a model's template, a conversation the template rejects is a 400 carrying the template's
// own message (SGLang answers the jinja exception), never a silent fallback.
TEST_F(SimServerTest, ChatTemplateErrorIs400WithItsMessage) {
  KVGATE_REQUIRE_MODEL("gemma3", "tokenizer_config.json");
  std::string dir = testing::models_dir() + "/gemma3";
  Sim s({"--ttft-ms", "1", "--tpot-ms", "1", "--tokenizer-path", dir});
  HttpClient c(s.port);
  auto r = c.post("/v1/chat/completions",
                  R"({"messages":[{"role":"user","content":"a"},{"role":"user","content":"b"}],)"
                  R"("max_tokens":2})");
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_NE(std::string_view(parse(r.body)["message"]).find("roles must alternate"),
            std::string_view::npos)
      << r.body;
  r = c.post("/v1/chat/completions",
             R"({"messages":[{"role":"user","content":[{"type":"text","text":"a"}]}],)"
             R"("max_tokens":2})");
  EXPECT_EQ(r.status, 200) << r.body;
}

TEST_F(SimServerTest, InfoEndpoints) {
  Sim s({"--dp-size", "2", "--page-size", "16", "--served-model-name", "qwen", "--enable-metrics"});
  HttpClient c(s.port);
  for (const char* path : {"/get_server_info", "/server_info"}) {
    element e = parse(c.get(path).body);
    EXPECT_EQ(int64_t(e["page_size"]), 16);
    EXPECT_EQ(int64_t(e["dp_size"]), 2);
    EXPECT_EQ(int64_t(e["tp_size"]), 1);
    EXPECT_EQ(int64_t(e["port"]), s.port) << "the bound port, not 0";
    EXPECT_EQ(std::string_view(e["disaggregation_mode"]), "null");
    EXPECT_EQ(int64_t(e["disaggregation_bootstrap_port"]), 8998);
    EXPECT_TRUE(e["kv_events_config"].is_null());
    EXPECT_TRUE(e["kv_events"].is_null());
    EXPECT_EQ(int64_t(e["max_total_num_tokens"]), 400000);
    EXPECT_EQ(e["internal_states"].get_array().size(), 2u);
  }
  element load = parse(c.get("/get_load").body);
  ASSERT_EQ(load.get_array().size(), 2u);
  EXPECT_EQ(int64_t(load.at(1)["dp_rank"]), 1);
  element loads = parse(c.get("/v1/loads").body);
  EXPECT_EQ(loads["loads"].get_array().size(), 2u);
  EXPECT_DOUBLE_EQ(double(loads["loads"].at(0)["token_usage"]), 0);
  element models = parse(c.get("/v1/models").body);
  EXPECT_EQ(std::string_view(models["data"].at(0)["id"]), "qwen");
  auto m = c.get("/metrics");
  EXPECT_EQ(m.status, 200);
  EXPECT_NE(m.body.find("sglang:num_running_reqs{model_name=\"qwen\",dp_rank=\"1\"} 0"),
            std::string::npos);
  EXPECT_EQ(c.post("/flush_cache", "").status, 200);
}

TEST_F(SimServerTest, InfoAdvertisesTheKvEventPublisher) {
  const int port = free_port_range(4);
  const std::string config = R"({"publisher":"zmq","endpoint":"tcp://*:)" + std::to_string(port) +
                             R"(","replay_endpoint":"tcp://*:)" + std::to_string(port + 2) +
                             R"(","topic":"kv"})";
  Sim s({"--dp-size", "2", "--page-size", "16", "--kv-events-config", config});
  HttpClient c(s.port);
  for (const char* path : {"/get_server_info", "/server_info"}) {
    element e = parse(c.get(path).body);
    EXPECT_EQ(str(e["kv_events_config"]), config) << "the flag's JSON, as a string";
    element kv = e["kv_events"];
    EXPECT_EQ(str(kv["publisher"]), "zmq");
    EXPECT_EQ(str(kv["endpoint_host"]), "*")
        << "a gateway replaces a wildcard with the worker's host";
    EXPECT_EQ(int64_t(kv["endpoint_port_base"]), port);
    EXPECT_EQ(str(kv["topic"]), "kv");
    EXPECT_EQ(int64_t(kv["block_size"]), 16);
    EXPECT_EQ(int64_t(kv["dp_size"]), 2);
    EXPECT_EQ(int64_t(kv["replay_endpoint_port_base"]), port + 2);
    EXPECT_EQ(str(e["scheduler"]), "batch");
  }
}

TEST_F(SimServerTest, QueueLimitAnswers503) {
  Sim s({"--max-running-requests", "1", "--max-queued-requests", "1", "--time-scale", "0.2"});
  std::vector<std::thread> clients;
  struct Join {
    std::vector<std::thread>& t;
    ~Join() {
      for (auto& x : t) x.join();
    }
  } join{clients};
  auto send = [&] {
    clients.emplace_back([port = s.port] {
      HttpClient c(port);
      c.post("/generate", R"({"text":"long","sampling_params":{"max_new_tokens":300}})");
    });
  };
  send();
  ASSERT_TRUE(testing::wait_until([&] { return s.load().running == 1; }));
  send();
  ASSERT_TRUE(testing::wait_until([&] { return s.load().waiting == 1; }));
  HttpClient c(s.port);
  auto r = c.post("/generate", R"({"text":"one more"})");
  EXPECT_EQ(r.status, 503);
  EXPECT_NE(r.body.find("The request queue is full."), std::string::npos) << r.body;
  auto o = c.post("/v1/completions", R"({"prompt":"one more"})");
  EXPECT_EQ(o.status, 503);
  EXPECT_EQ(int64_t(parse(o.body)["code"]), 503);
  EXPECT_EQ(str(parse(o.body)["type"]), "503");  // FastAPI's HTTPException body
  // Streams: SGLang's scheduler aborts the request, after status 200.
  auto ev = events(c.post("/generate", R"({"text":"one more","stream":true})"));
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(str(ev[0]["meta_info"]["finish_reason"]["message"]), "The request queue is full.");
  EXPECT_EQ(int64_t(ev[0]["meta_info"]["finish_reason"]["status_code"]), 503);
  ev = events(c.post("/v1/chat/completions",
                     R"({"messages":[{"role":"user","content":"x"}],"stream":true})"));
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(str(ev[0]["error"]["type"]), "SERVICE_UNAVAILABLE");
  EXPECT_EQ(str(ev[0]["error"]["message"]), "The request queue is full.");
}

TEST_F(SimServerTest, EmbeddingsAndRerank) {
  Sim s(kFast);
  HttpClient c(s.port);
  element e =
      parse(c.post("/v1/embeddings", R"({"model":"m","input":["the cat","the cat"]})").body);
  ASSERT_EQ(e["data"].get_array().size(), 2u);
  EXPECT_EQ(e["data"].at(0)["embedding"].get_array().size(), kEmbeddingDim);
  EXPECT_EQ(simdjson::to_string(e["data"].at(0)["embedding"]),
            simdjson::to_string(e["data"].at(1)["embedding"]));
  element r = parse(
      c.post("/v1/rerank", R"({"query":"the river","documents":["a cold day","the river bank"]})")
          .body);
  ASSERT_EQ(r.get_array().size(), 2u);
  EXPECT_EQ(int64_t(r.at(0)["index"]), 1);  // best match first
  EXPECT_GT(double(r.at(0)["score"]), double(r.at(1)["score"]));
  EXPECT_EQ(c.post("/v1/embeddings", "{}").status, 400);
}

TEST_F(SimServerTest, InjectedFailuresAndHealth) {
  Sim s({"--ttft-ms", "1", "--tpot-ms", "1", "--start-unhealthy-secs", "600"});
  HttpClient c(s.port);
  EXPECT_EQ(c.get("/health").status, 503);
  EXPECT_EQ(c.get("/health_generate").status, 503);
  EXPECT_EQ(c.post("/sim/faults", R"({"unhealthy":false,"fail_rate":1,"fail_status":503})").status,
            200);
  EXPECT_EQ(c.get("/health").status, 200);
  auto r = c.post("/v1/chat/completions", with(kChat, ""));
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(int64_t(parse(r.body)["code"]), 503);
  r = c.post("/generate", with(kGen, ""));
  EXPECT_EQ(r.status, 503);
  EXPECT_FALSE(parse(r.body)["error"]["message"].error());
  EXPECT_EQ(c.post("/sim/faults", R"({"fail_rate":2})").status, 400);
  EXPECT_EQ(c.post("/sim/faults", R"({"fail_rate":0})").status, 200);
  EXPECT_EQ(c.post("/generate", with(kGen, "")).status, 200);
}

TEST_F(SimServerTest, AbortInTheFirstEventAsSglangSendsIt) {
  Sim s({"--ttft-ms", "1", "--tpot-ms", "1", "--abort-first-event-rate", "1"});
  HttpClient c(s.port);
  const std::string message = "injected abort (kvgate-sim --abort-first-event-rate)";

  // /generate: status 200, one chunk whose finish_reason is the abort, then [DONE].
  auto ev = events(c.post("/generate", with(kGen, R"(,"stream":true,"rid":"r1")")));
  ASSERT_EQ(ev.size(), 1u);
  element m = ev[0]["meta_info"];
  EXPECT_EQ(str(m["id"]), "r1");
  EXPECT_EQ(str(m["finish_reason"]["type"]), "abort");
  EXPECT_EQ(str(m["finish_reason"]["message"]), message);
  EXPECT_EQ(int64_t(m["finish_reason"]["status_code"]), 503);
  EXPECT_TRUE(m["finish_reason"]["err_type"].is_null());
  EXPECT_GT(int64_t(m["prompt_tokens"]), 0);
  EXPECT_EQ(int64_t(m["completion_tokens"]), 0);
  EXPECT_EQ(str(ev[0]["text"]), "");
  EXPECT_GE(double(m["e2e_latency"]), 0);
  // A batch: one aborted chunk per prompt, each with its index.
  ev = events(c.post("/generate", R"({"text":["a b","c d"],"stream":true})"));
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(int64_t(ev[1]["index"]), 1);
  EXPECT_EQ(str(ev[1]["meta_info"]["finish_reason"]["type"]), "abort");

  // OpenAI routes: the error event SGLang's serving code writes (json.dumps spacing), [DONE].
  const std::string error_event =
      R"({"error": {"object": "error", "message": ")" + message +
      R"(", "type": "SERVICE_UNAVAILABLE", "param": null, "code": 503}})";
  for (auto [path, body] :
       {std::pair{"/v1/chat/completions", kChat}, std::pair{"/v1/completions", kCmpl}}) {
    auto r = c.post(path, with(body, R"(,"stream":true)"));
    EXPECT_EQ(r.status, 200) << path;
    EXPECT_EQ(r.header("content-type"), "text/event-stream");
    EXPECT_EQ(sse_data(r.body), (std::vector<std::string>{error_event, "[DONE]"})) << r.body;
  }
  // With usage asked for, the usage chunk still follows the error (SGLang breaks out of its loop
  // and then sends it): the prompt was counted, nothing was generated.
  ev = events(c.post("/v1/chat/completions",
                     with(kChat, R"(,"stream":true,"stream_options":{"include_usage":true})")));
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(int64_t(ev[0]["error"]["code"]), 503);
  EXPECT_EQ(ev[1]["choices"].get_array().size(), 0u);
  EXPECT_GT(int64_t(ev[1]["usage"]["prompt_tokens"]), 0);
  EXPECT_EQ(int64_t(ev[1]["usage"]["completion_tokens"]), 0);

  // Whole answers: 503 with FastAPI's HTTPException body on every route.
  for (auto [path, body] : {std::pair{"/generate", kGen}, std::pair{"/v1/chat/completions", kChat},
                            std::pair{"/v1/completions", kCmpl}}) {
    auto r = c.post(path, with(body, ""));
    EXPECT_EQ(r.status, 503) << path;
    element e = parse(r.body);
    EXPECT_EQ(str(e["object"]), "error");
    EXPECT_EQ(str(e["message"]), message);
    EXPECT_EQ(str(e["type"]), "503");
    EXPECT_EQ(int64_t(e["code"]), 503);
  }
  EXPECT_EQ(s.load().running, 0);  // nothing reached the engine
}

TEST_F(SimServerTest, AbortFaultAtRuntimeAndWithInstant) {
  Sim s({"--instant"});
  HttpClient c(s.port);
  ASSERT_EQ(c.post("/sim/faults", R"({"abort_first_event_rate":1})").status, 200);
  EXPECT_NE(c.get("/sim/faults").body.find(R"("abort_first_event_rate":1.0)"), std::string::npos);
  auto ev = events(c.post("/generate", with(kGen, R"(,"stream":true)")));
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(str(ev[0]["meta_info"]["finish_reason"]["type"]), "abort");
  ASSERT_EQ(c.post("/sim/faults", R"({"abort_first_event_rate":0})").status, 200);
  ev = events(c.post("/generate", with(kGen, R"(,"stream":true)")));
  EXPECT_EQ(ev.size(), 6u);
  EXPECT_EQ(str(ev.back()["meta_info"]["finish_reason"]["type"]), "length");
}

TEST(SimServerConfig, KeepAliveTimeoutReachesTheHttpServer) {
  SimConfig c;
  std::string error, help;
  std::vector<std::string> args = {"--host", "0.0.0.0", "--port", "0"};
  ASSERT_TRUE(parse_sim_args(args, c, error, help)) << error;
  http::ServerConfig sc = http_server_config(c);
  EXPECT_EQ(sc.idle_timeout, std::chrono::seconds(5));  // uvicorn as SGLang runs it
  EXPECT_EQ(sc.host, "0.0.0.0");
  args = {"--timeout-keep-alive", "42"};
  ASSERT_TRUE(parse_sim_args(args, c, error, help)) << error;
  EXPECT_EQ(http_server_config(c).idle_timeout, std::chrono::seconds(42));
}

TEST_F(SimServerTest, DroppedStreamClosesAfterKEvents) {
  Sim s({"--ttft-ms", "1", "--tpot-ms", "1", "--drop-mid-stream-rate", "1", "--drop-after-chunks",
         "3"});
  HttpClient c(s.port);
  auto r = c.post("/v1/chat/completions", with(kChat, R"(,"stream":true)"));
  EXPECT_EQ(r.status, 200);
  EXPECT_TRUE(r.truncated || r.closed);
  auto data = sse_data(r.body);
  EXPECT_EQ(data.size(), 3u) << r.body;
  EXPECT_NE(data.back(), "[DONE]");
  HttpClient c2(s.port);
  r = c2.post("/generate", with(kGen, ""));  // a whole answer is cut half-way
  EXPECT_TRUE(r.truncated || r.status == 0) << r.body;
}

TEST_F(SimServerTest, HangNeverAnswersAndFreesOnDisconnect) {
  Sim s({"--hang-rate", "1"});
  {
    HttpClient c(s.port);
    c.set_timeout(200ms);
    EXPECT_EQ(c.post("/generate", with(kGen, "")).status, 0);
  }
  HttpClient c(s.port);
  EXPECT_EQ(c.get("/health").status, 200);  // the server is still serving
}

TEST_F(SimServerTest, ClientDisconnectCancelsTheGeneration) {
  Sim s({"--ttft-ms", "1", "--tpot-ms", "20"});
  {
    HttpClient c(s.port);
    int chunks = 0;
    int64_t running = 0;
    c.stream("POST", "/generate",
             R"({"text":"hi","sampling_params":{"max_new_tokens":500},"stream":true})", {},
             [&](std::string_view) {
               running = s.load().running;
               return ++chunks < 2;
             });
    EXPECT_EQ(running, 1);
  }
  EXPECT_TRUE(testing::wait_until([&] { return s.load().running == 0; }, 2s));
  // Non-stream: the same through the disconnect watch.
  {
    HttpClient c(s.port);
    c.set_timeout(50ms);
    c.post("/v1/completions", R"({"prompt":"x","max_tokens":500})");
  }
  EXPECT_TRUE(testing::wait_until([&] { return s.load().running == 0; }, 2s));
  EXPECT_LT(s.metrics->rank(0).generation_tokens->value(), 200u);
}

// SGLang's POST /abort_request: 200 with an empty body; a running request with that rid ends
// with finish_reason {"type":"abort","message":"Aborted"} (no status: the whole answer is a 200).
TEST_F(SimServerTest, AbortRequestEndsARunningRequestByRid) {
  Sim s({"--ttft-ms", "1", "--tpot-ms", "20"});
  HttpClient control(s.port);
  auto none = control.post("/abort_request", R"({"rid":"nobody"})");
  EXPECT_EQ(none.status, 200);
  EXPECT_EQ(none.body, "");
  EXPECT_EQ(control.get("/abort_request").status, 405);
  EXPECT_EQ(control.post("/abort_request", "[1").status, 422);
  EXPECT_EQ(control.post("/abort_request", R"({"rid":5})").status, 422);
  EXPECT_EQ(control.post("/abort_request", "").status, 422);

  auto answer = std::async(std::launch::async, [&] {
    return HttpClient(s.port).post("/v1/completions",
                                   R"({"prompt":"x","max_tokens":500,"rid":"run-1"})");
  });
  ASSERT_TRUE(testing::wait_until([&] { return s.load().running == 1; }, 5s));
  EXPECT_EQ(control.post("/abort_request", R"({"rid":"run-1","abort_all":false})").status, 200);
  auto r = answer.get();
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_NE(r.body.find(R"("finish_reason":"abort")"), std::string::npos) << r.body;
  EXPECT_TRUE(testing::wait_until([&] { return s.load().running == 0; }, 2s));
  EXPECT_LT(s.metrics->rank(0).generation_tokens->value(), 200u);
}

}  // namespace
}  // namespace kvgate::sim
