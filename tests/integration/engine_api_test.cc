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
// tokens, single and batched; /v1/detokenize gives the text back.
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
    auto [ms, m] = call(gw, "/v1/tokenize",
                        {{"messages", {{{"role", "user"}, {"content", "Hi there"}}}}});
    ASSERT_EQ(ms, 200) << m.dump();
    auto [rs, rendered] = call(gw, "/v1/detokenize",
                               {{"tokens", m["tokens"]}, {"skip_special_tokens", false}});
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
  auto [ds, d] = call(gw, "/detokenize", {{"tokens", call(engine, "/tokenize", req).second["tokens"]}});
  ASSERT_EQ(ds, 200) << d.dump();
  EXPECT_EQ(d["text"], "Hello world");
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

}  // namespace
}  // namespace kvgate::testing
