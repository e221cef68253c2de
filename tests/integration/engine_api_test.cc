// Integration: every API the engine serves, through kvgate to kvgate-sim: /v1/tokenize and
// /v1/detokenize answered by the gateway from the rule's tokenizer (the engine's ids), SGLang's own
// /tokenize proxied, the pooling and scoring routes, /v1/responses routed to the worker holding
// each response, /v1/models one entry per model, and control routes kept off the inference
// listener.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>

#include "support/cluster.h"
#include "support/models.h"

namespace kvgate::testing {
namespace {

using nlohmann::json;

const std::vector<std::string> kFast = {"--ttft-ms", "1", "--tpot-ms", "1"};
// SGLang keeps responses only with --enable-response-store (newer builds; older ones always did).
const std::vector<std::string> kStore = {"--ttft-ms", "1", "--tpot-ms", "1",
                                         "--enable-response-store"};

std::string model_dir(const std::string& name) {
  return models_dir() + "/" + name;
}

std::pair<int, json> call(HttpClient& c, const std::string& path, const json& body) {
  Response r = c.post(path, body.dump());
  return {r.status, json::parse(r.body, nullptr, false)};
}

const std::vector<std::string> kTexts = {
    "Hello world",
    "The quick brown fox jumps over the lazy dog. 12345 + 678 = ?",
    "<|im_start|>user\nnǐ hǎo 你好 😀 café<|im_end|>\n",
    "",
};

// The gateway answers /v1/tokenize from the rule's tokenizer: the ids equal the engine's own
// (SGLang's /tokenize, here the sim's with the same tokenizer files), with and without special
// tokens, single and batched; /v1/detokenize gives the text back. (The sim tokenizes with
// kvgate's own tokenizer code, so this checks the gateway's request and answer shapes and the
// rule's tokenizer choice; that the ids are Hugging Face's is tests/conformance' job.)
TEST(EngineApi, TokenizeThroughTheGatewayIsTheEnginesIds) {
  for (const std::string model : {"qwen3", "llama3"}) {
    SCOPED_TRACE(model);
    KVGATE_REQUIRE_MODEL(model);
    Cluster c(1, {"--instant", "--tokenizer-path", model_dir(model)},
              {"--policy", "round_robin", "--tokenizer-path", model_dir(model)});
    HttpClient gw(c.port());
    HttpClient engine(c.sim(0).port);
    for (const std::string& text : kTexts) {
      for (bool add : {true, false}) {
        json req = {{"prompt", text}, {"add_special_tokens", add}};
        auto [gs, g] = call(gw, "/v1/tokenize", req);
        auto [es, e] = call(engine, "/tokenize", req);
        ASSERT_EQ(gs, 200) << g.dump();
        ASSERT_EQ(es, 200) << e.dump();
        EXPECT_EQ(g["tokens"], e["tokens"]) << text;
        EXPECT_EQ(g["count"], e["count"]);
        ASSERT_TRUE(g["max_model_len"].is_number_integer()) << g.dump();
        // The gateway's detokenize gives the text back (special tokens kept).
        auto [ds, d] =
            call(gw, "/v1/detokenize", {{"tokens", g["tokens"]}, {"skip_special_tokens", false}});
        ASSERT_EQ(ds, 200) << d.dump();
        if (!add) {
          EXPECT_EQ(d["text"], text);
        }
      }
    }
    // Batches: a list of id lists and a list of counts, as sgl-model-gateway answers.
    auto [bs, b] = call(gw, "/v1/tokenize", {{"prompt", {"Hello", "world"}}});
    ASSERT_EQ(bs, 200) << b.dump();
    ASSERT_TRUE(b["tokens"].is_array() && b["tokens"].size() == 2) << b.dump();
    EXPECT_TRUE(b["tokens"][0].is_array());
    EXPECT_EQ(b["count"].size(), 2u);
    auto [dbs, db] = call(gw, "/v1/detokenize", {{"tokens", b["tokens"]}});
    ASSERT_EQ(dbs, 200) << db.dump();
    EXPECT_EQ(db["text"], json({"Hello", "world"}));
    // A chat: the ids of the prompt the chat template renders, as kv_exact routes on.
    auto [ms, m] =
        call(gw, "/v1/tokenize", {{"messages", {{{"role", "user"}, {"content", "Hi there"}}}}});
    ASSERT_EQ(ms, 200) << m.dump();
    auto [rs, rendered] =
        call(gw, "/v1/detokenize", {{"tokens", m["tokens"]}, {"skip_special_tokens", false}});
    ASSERT_EQ(rs, 200);
    EXPECT_NE(rendered["text"].get<std::string>().find("Hi there"), std::string::npos);
    EXPECT_GT(m["count"].get<int>(), 3);
    // Bad input: a clear 400.
    auto [s1, e1] = call(gw, "/v1/tokenize", {{"text", "no prompt"}});
    EXPECT_EQ(s1, 400);
    EXPECT_NE(e1.dump().find("prompt"), std::string::npos) << e1.dump();
    auto [s2, e2] = call(gw, "/v1/detokenize", {{"tokens", {1, -5}}});
    EXPECT_EQ(s2, 400);
    EXPECT_NE(e2.dump().find("outside the vocabulary"), std::string::npos) << e2.dump();
    auto [s3, e3] = call(gw, "/v1/tokenize", {{"prompt", "x"}, {"model", "nobody-serves-this"}});
    EXPECT_EQ(s3, 200) << "a catch-all rule takes any model: " << e3.dump();
  }
}

// Without a tokenizer in the rule the engines answer /v1/tokenize (proxied), and SGLang's own
// /tokenize and /detokenize are always proxied.
TEST(EngineApi, TokenizeWithoutATokenizerIsTheEnginesAnswer) {
  KVGATE_REQUIRE_MODEL("qwen3");
  Cluster c(2, {"--instant", "--tokenizer-path", model_dir("qwen3")}, {"--policy", "round_robin"});
  HttpClient gw(c.port());
  HttpClient engine(c.sim(0).port);
  json req = {{"prompt", "Hello world"}};
  for (const char* path : {"/v1/tokenize", "/tokenize"}) {
    auto [gs, g] = call(gw, path, req);
    auto [es, e] = call(engine, "/tokenize", req);
    ASSERT_EQ(gs, 200) << path << " " << g.dump();
    EXPECT_EQ(g, e) << path;
  }
  auto [ds, d] =
      call(gw, "/detokenize", {{"tokens", call(engine, "/tokenize", req).second["tokens"]}});
  ASSERT_EQ(ds, 200) << d.dump();
  EXPECT_EQ(d["text"], "Hello world");
  // Proxied, /v1/tokenize is still counted as /v1/tokenize.
  EXPECT_GE(c.metric(R"(kvgate_requests_total{route="/v1/tokenize",status="200",model="",)"
                     R"(streaming="false"})"),
            1);
}

// Answered by the gateway, tokenizing takes an admission slot like a proxied request, and gives
// it back: one slot serves request after request, and each wait is observed.
TEST(EngineApi, GatewayTokenizeIsAdmitted) {
  KVGATE_REQUIRE_MODEL("qwen3");
  Cluster c(1, {"--instant"},
            {"--policy", "round_robin", "--tokenizer-path", model_dir("qwen3"),
             "--max-concurrent-requests", "1", "--queue-timeout-secs", "5"});
  HttpClient gw(c.port());
  for (int i = 0; i < 3; ++i) {
    auto [st, body] = call(gw, i % 2 ? "/v1/detokenize" : "/v1/tokenize",
                           i % 2 ? json{{"tokens", {9707}}} : json{{"prompt", "Hello"}});
    ASSERT_EQ(st, 200) << i << " " << body.dump();
  }
  EXPECT_EQ(c.metric(R"(kvgate_admission_queue_seconds_count{rule="default"})"), 3);
  EXPECT_EQ(c.metric("kvgate_admission_queue_depth"), 0);
}

// SGLang's control routes are the admin listener's: the inference listener says so, and never
// passes them through; an unknown route's 404 lists the routes.
TEST(EngineApi, ControlRoutesStayOffTheInferenceListener) {
  Cluster c(1, kFast, {"--policy", "round_robin"});
  HttpClient gw(c.port());
  for (const char* path :
       {"/flush_cache", "/update_weights_from_disk", "/abort_request", "/start_profile",
        "/release_memory_occupation", "/get_load", "/workers/x"}) {
    Response r = gw.post(path, "{}");
    EXPECT_EQ(r.status, 404) << path;
    EXPECT_NE(r.body.find("admin listener"), std::string::npos) << path << ": " << r.body;
  }
  Response r = gw.get("/v2/nothing");
  EXPECT_EQ(r.status, 404);
  EXPECT_NE(r.body.find("/v1/responses"), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("/v1/score"), std::string::npos) << r.body;
  // Methods: a 405 naming those allowed.
  r = gw.get("/encode");
  EXPECT_EQ(r.status, 405);
  EXPECT_NE(r.body.find("POST or PUT"), std::string::npos) << r.body;
  r = gw.post("/v1/responses/resp_abc", "");
  EXPECT_EQ(r.status, 405);
  EXPECT_NE(r.body.find("GET or DELETE"), std::string::npos) << r.body;
  r = gw.get("/v1/responses/not-an-id");
  EXPECT_EQ(r.status, 404);
  EXPECT_NE(r.body.find("not a response id"), std::string::npos) << r.body;
}

// /v1/models: one entry per served model, however many workers serve it.
TEST(EngineApi, ModelsAreOneEntryPerServedModel) {
  Cluster c(4, kFast, {"--policy", "round_robin"});
  HttpClient gw(c.port());
  Response r = gw.get("/v1/models");
  ASSERT_EQ(r.status, 200);
  json j = json::parse(r.body);
  ASSERT_EQ(j["data"].size(), 1u) << r.body;
  EXPECT_EQ(j["object"], "list");
}

// ---- /v1/responses: the worker holding each response ----

struct Turn {
  int status = 0;
  std::string id;      // the response's id
  std::string worker;  // x-kvgate-worker
  std::string route;   // x-kvgate-route
  int cached = -1;     // usage.input_tokens_details.cached_tokens
  std::string body;
};

Turn respond(HttpClient& c, const json& body) {
  Response r = c.post("/v1/responses", body.dump());
  Turn t;
  t.status = r.status;
  t.worker = r.header("x-kvgate-worker");
  t.route = r.header("x-kvgate-route");
  t.body = r.body;
  json j = json::parse(r.body, nullptr, false);
  if (body.value("stream", false)) {
    // The id is in the first event (response.created), the usage in the last.
    for (size_t pos = 0; (pos = r.body.find("data: ", pos)) != std::string::npos;) {
      size_t end = r.body.find('\n', pos);
      json e = json::parse(r.body.substr(pos + 6, end - pos - 6), nullptr, false);
      pos = end;
      if (!e.is_object() || !e.contains("response")) continue;
      if (t.id.empty()) t.id = e["response"].value("id", "");
      if (e["response"].contains("usage") && e["response"]["usage"].is_object()) j = e["response"];
    }
  } else if (j.is_object()) {
    t.id = j.value("id", "");
  }
  if (j.is_object() && j.contains("usage") && j["usage"].is_object() &&
      j["usage"].contains("input_tokens_details")) {
    t.cached = j["usage"]["input_tokens_details"].value("cached_tokens", -1);
  }
  return t;
}

std::string words(int turn) {
  std::string s;
  for (int i = 0; i < 40; ++i)
    s += "turn" + std::to_string(turn) + " word" + std::to_string(i) + " ";
  return s;
}

// A conversation chained by previous_response_id over 4 workers under round_robin (which would
// send each turn elsewhere): every turn lands on the worker holding the previous response, its
// cache grows turn by turn, streams included; GET, cancel and DELETE reach the owner too.
TEST(EngineApi, ResponsesChainLandsOnTheirOwnerEveryTurn) {
  Cluster c(4, kStore, {"--policy", "round_robin", "--debug-headers"});
  HttpClient gw(c.port());
  for (bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "stream" : "whole");
    Turn first = respond(gw, {{"input", words(0)},
                              {"instructions", "Be brief."},
                              {"stream", stream},
                              {"max_output_tokens", 8}});
    ASSERT_EQ(first.status, 200) << first.body;
    ASSERT_TRUE(first.id.starts_with("resp_")) << first.body;
    ASSERT_FALSE(first.worker.empty());
    std::string prev = first.id;
    int last_cached = -1;
    for (int turn = 1; turn <= 5; ++turn) {
      Turn t = respond(gw, {{"input", words(turn)},
                            {"previous_response_id", prev},
                            {"stream", stream},
                            {"max_output_tokens", 8}});
      ASSERT_EQ(t.status, 200) << t.body;
      EXPECT_EQ(t.worker, first.worker) << "turn " << turn;
      EXPECT_EQ(t.route, "response_owner/owner") << "turn " << turn;
      ASSERT_TRUE(t.id.starts_with("resp_")) << t.body;
      EXPECT_NE(t.id, prev);
      // The owner has the conversation so far cached: more every turn.
      EXPECT_GT(t.cached, last_cached) << "turn " << turn << ": " << t.body;
      last_cached = t.cached;
      prev = t.id;
    }
    // Retrieval and deletion reach the owner.
    Response g = gw.get("/v1/responses/" + prev);
    EXPECT_EQ(g.status, 200) << g.body;
    EXPECT_EQ(g.header("x-kvgate-worker"), first.worker);
    EXPECT_NE(g.body.find(prev), std::string::npos) << g.body;
    // DELETE reaches the owner, which answers as SGLang does (no DELETE route: 405).
    Response d = gw.request("DELETE", "/v1/responses/" + prev, "", {});
    EXPECT_EQ(d.header("x-kvgate-worker"), first.worker) << d.status << " " << d.body;
    EXPECT_EQ(d.header("x-kvgate-route"), "response_owner/owner");
    // Cancel reaches the owner too (a finished response: SGLang's answer, whatever it is).
    Response x = gw.post("/v1/responses/" + prev + "/cancel", "");
    EXPECT_EQ(x.header("x-kvgate-worker"), first.worker) << x.status << " " << x.body;
  }
  EXPECT_GE(c.metric(R"(kvgate_response_owner_routes_total{result="owner"})"), 10);
}

// A gateway that does not remember a response (forgotten: here a table of one entry; or a
// restart, another replica) asks the workers and finds its owner; one nobody has is a 404.
TEST(EngineApi, ResponsesForgottenAreLookedForOnTheWorkers) {
  Cluster c(4, kStore,
            {"--policy", "round_robin", "--debug-headers", "--max-response-owners", "1"});
  HttpClient gw(c.port());
  std::vector<Turn> firsts;
  for (int i = 0; i < 4; ++i) {
    firsts.push_back(respond(gw, {{"input", words(10 + i)}, {"max_output_tokens", 4}}));
    ASSERT_EQ(firsts.back().status, 200) << firsts.back().body;
  }
  std::set<std::string> workers;
  for (const Turn& f : firsts) {
    workers.insert(f.worker);
    Turn t = respond(
        gw, {{"input", "and then?"}, {"previous_response_id", f.id}, {"max_output_tokens", 4}});
    ASSERT_EQ(t.status, 200) << t.body;
    EXPECT_EQ(t.worker, f.worker);
  }
  EXPECT_EQ(workers.size(), 4u) << "round_robin spread the first turns";
  EXPECT_GE(c.metric(R"(kvgate_response_owner_routes_total{result="found"})"), 3);
  EXPECT_LE(c.metric("kvgate_response_owners"), 1);
  // Never stored, or never made: not found anywhere, said so.
  Turn unstored = respond(gw, {{"input", "x"}, {"store", false}, {"max_output_tokens", 4}});
  ASSERT_EQ(unstored.status, 200) << unstored.body;
  Turn t = respond(gw, {{"input", "x"}, {"previous_response_id", unstored.id}});
  EXPECT_EQ(t.status, 404) << t.body;
  EXPECT_NE(t.body.find("response_not_found"), std::string::npos) << t.body;
  Response g = gw.get("/v1/responses/resp_0000000000000000000000000000dead");
  EXPECT_EQ(g.status, 404) << g.body;
}

// The owner is gone: its conversation is nowhere else, so the turn fails visibly instead of
// landing on a worker that would answer a different conversation.
TEST(EngineApi, ResponsesWhoseOwnerIsDownFailVisibly) {
  Cluster c(3, kStore,
            {"--policy", "round_robin", "--debug-headers", "--health-check-interval-secs", "1",
             "--health-failure-threshold", "1"});
  HttpClient gw(c.port());
  Turn first = respond(gw, {{"input", words(1)}, {"max_output_tokens", 4}});
  ASSERT_EQ(first.status, 200) << first.body;
  size_t owner = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    if (c.sim(i).url() == first.worker) owner = i;
  }
  c.sim(owner).kill();
  ASSERT_TRUE(c.wait_healthy(2));
  Turn t = respond(gw, {{"input", "more"}, {"previous_response_id", first.id}});
  EXPECT_EQ(t.status, 503) << t.body;
  EXPECT_NE(t.body.find("response_owner_unavailable"), std::string::npos) << t.body;
  // The worker by number, never its address (docs/security.md).
  EXPECT_NE(t.body.find("worker #"), std::string::npos) << t.body;
  EXPECT_EQ(t.body.find(first.worker), std::string::npos) << t.body;
}

// What a client names as previous_response_id goes into the lookup's request line: only an id's
// characters may (an id carrying CR LF would append a request of the client's choosing to every
// worker). Engines without a response store refuse every lookup: that refusal is the answer, not
// "not found". A response asked for by id under admission (no rule until it is found) is answered.
TEST(EngineApi, ResponseIdsAreCheckedAndLookupRefusalsRelayed) {
  Cluster c(2, kFast,
            {"--policy", "round_robin", "--max-concurrent-requests", "8", "--queue-size", "8"});
  HttpClient gw(c.port());
  const std::string smuggled =
      "resp_a HTTP/1.1\r\nHost: w\r\n\r\nPOST /flush_cache HTTP/1.1\r\nHost: w\r\n\r\n";
  // (JSON-escaped in the body; the parsed id holds real CR LF.)
  Response bad =
      gw.post("/v1/responses", json{{"input", "x"}, {"previous_response_id", smuggled}}.dump());
  EXPECT_EQ(bad.status, 400) << bad.body;
  EXPECT_NE(bad.body.find("previous_response_id"), std::string::npos) << bad.body;
  for (std::string result : {"found", "not_found", "refused", "owner_unavailable"}) {
    std::string series = "kvgate_response_owner_routes_total{result=\"" + result + "\"}";
    EXPECT_LE(c.metric(series), 0) << result << ": no worker was asked";
  }
  // The sims run without --enable-response-store: each refuses the lookup with SGLang's 400.
  Turn t = respond(
      gw, {{"input", "x"}, {"previous_response_id", "resp_0000000000000000000000000000beef"}});
  EXPECT_EQ(t.status, 400) << t.body;
  EXPECT_NE(t.body.find("response_lookup_refused"), std::string::npos) << t.body;
  EXPECT_NE(t.body.find("enable-response-store"), std::string::npos) << t.body;
  Response g = gw.get("/v1/responses/resp_0000000000000000000000000000beef");
  EXPECT_EQ(g.status, 400) << g.body;
  EXPECT_EQ(c.metric(R"(kvgate_response_owner_routes_total{result="refused"})"), 2);
  EXPECT_EQ(gw.get("/health").status, 200);  // and the gateway is still up
}

// The pooling and scoring routes reach an engine, routed like the other routes.
TEST(EngineApi, PoolingAndScoringRoutesReachAnEngine) {
  Cluster c(2, kFast, {"--policy", "cache_aware", "--debug-headers"});
  HttpClient gw(c.port());
  Response r = gw.post("/encode", R"({"text":"encode this text"})");
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_NE(r.body.find("embedding"), std::string::npos) << r.body;
  EXPECT_EQ(r.header("x-kvgate-route").rfind("cache_aware/", 0), 0u) << r.header("x-kvgate-route");
  r = gw.post("/encode", R"({"text":["a","b"]})");
  EXPECT_EQ(r.status, 200) << r.body;
  r = gw.post("/v1/embeddings", R"({"input":"embed this"})");
  EXPECT_EQ(r.status, 200) << r.body;
  r = gw.post("/classify", R"({"text":"classify this"})");
  EXPECT_EQ(r.status, 200) << r.body;
  r = gw.post("/v1/score", R"({"query":"is it?","items":["yes","no"],"label_token_ids":[1,2]})");
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_NE(r.body.find("scores"), std::string::npos) << r.body;
  // Requests sharing a prefix go where it is (cache_aware), whichever route.
  std::string w1 = gw.post("/encode", R"({"text":"a long shared prefix for routing, one"})")
                       .header("x-kvgate-worker");
  std::string w2 = gw.post("/encode", R"({"text":"a long shared prefix for routing, two"})")
                       .header("x-kvgate-worker");
  EXPECT_EQ(w1, w2);
}

}  // namespace
}  // namespace kvgate::testing
