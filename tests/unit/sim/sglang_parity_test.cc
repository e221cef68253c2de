// Tests for the SGLang behaviours a router observes that kvgate-sim reproduces on its HTTP side
// (REFERENCE.md section 8): cache_salt and LoRA namespaces, the DP rank from the body or the
// X-Data-Parallel-Rank header, /server_info's tokenizer_path and max_req_input_len,
// meta_info.dp_rank, /get_load and /v1/loads with their query parameters.
#include <gtest/gtest.h>
#include <simdjson.h>

#include <memory>
#include <string>
#include <vector>

#include "sim/info.h"
#include "sim/request.h"
#include "sim_harness.h"
#include "support/http_client.h"

namespace kvgate::sim {
namespace {

using simdjson::dom::element;
using testing::HttpClient;

const std::vector<std::string> kFast = {"--ttft-ms", "1", "--tpot-ms", "1"};

class SimSglangParity : public ::testing::Test {
 public:
  element parse(const std::string& json) {
    docs.push_back(std::make_unique<simdjson::dom::parser>());
    element e;
    EXPECT_FALSE(docs.back()->parse(json).get(e)) << json;
    return e;
  }

 private:
  std::vector<std::unique_ptr<simdjson::dom::parser>> docs;
};

std::string str(element e) {
  return std::string(std::string_view(e));
}

int64_t cached(SimSglangParity& t, HttpClient& c, const std::string& extra) {
  auto r = c.post("/generate", R"({"text":"one two three four five six seven eight nine ten",)"
                               R"("sampling_params":{"max_new_tokens":1})" +
                                   extra + "}");
  EXPECT_EQ(r.status, 200) << r.body;
  return int64_t(t.parse(r.body)["meta_info"]["cached_tokens"]);
}

TEST_F(SimSglangParity, CacheSaltAndAdaptersGetTheirOwnPrefixes) {
  auto args = kFast;
  args.insert(args.end(), {"--lora-paths", "sql=/adapters/sql", "chat"});
  Sim s(args);
  HttpClient c(s.port);
  EXPECT_EQ(cached(*this, c, ""), 0);
  EXPECT_GT(cached(*this, c, ""), 0) << "the plain prefix is cached";
  EXPECT_EQ(cached(*this, c, R"(,"cache_salt":"tenant-a")"), 0)
      << "a salted request never matches an unsalted prefix";
  EXPECT_GT(cached(*this, c, R"(,"cache_salt":"tenant-a")"), 0) << "but matches its own salt";
  EXPECT_EQ(cached(*this, c, R"(,"cache_salt":"tenant-b")"), 0);
  EXPECT_GT(cached(*this, c, R"(,"cache_salt":"")"), 0) << "an empty salt is no salt";
  EXPECT_EQ(cached(*this, c, R"(,"lora_path":"sql")"), 0) << "an adapter's prefixes are apart";
  EXPECT_GT(cached(*this, c, R"(,"lora_path":"sql")"), 0);

  // OpenAI routes: cache_salt, and the adapter named in the model ("base:adapter").
  const std::string chat =
      R"({"messages":[{"role":"user","content":"a fairly long question about caches"}],)"
      R"("max_tokens":1,"model":)";
  EXPECT_EQ(c.post("/v1/chat/completions", chat + R"("kvgate-sim:chat"})").status, 200);
  auto unknown = c.post("/v1/chat/completions", chat + R"("kvgate-sim:nope"})");
  EXPECT_EQ(unknown.status, 400);
  EXPECT_NE(unknown.body.find("Got LoRA adapter that has never been loaded: nope"),
            std::string::npos)
      << unknown.body;
  EXPECT_NE(unknown.body.find(R"(dict_keys(['sql', 'chat']))"), std::string::npos);
  auto salted = c.post("/v1/chat/completions", chat + R"("m","cache_salt":"x"})");
  EXPECT_EQ(salted.status, 200) << salted.body;
  auto bad_salt = c.post("/v1/chat/completions", chat + R"("m","cache_salt":["x"]})");
  EXPECT_EQ(bad_salt.status, 400) << "the OpenAI routes take one salt string";
}

TEST_F(SimSglangParity, AdaptersNeedEnableLora) {
  Sim s(kFast);
  HttpClient c(s.port);
  auto r = c.post("/generate", R"({"text":"hi","lora_path":"sql"})");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(str(parse(r.body)["error"]["message"]),
            "LoRA adapter 'sql' was requested, but LoRA is not enabled. Please launch the server "
            "with --enable-lora flag and preload adapters using --lora-paths or "
            "/load_lora_adapter endpoint.");
  auto m = c.post("/v1/completions", R"({"model":"base:sql","prompt":"hi","max_tokens":1})");
  EXPECT_EQ(m.status, 400) << "a model \"base:adapter\" names an adapter";
}

TEST_F(SimSglangParity, DpRankFromBodyAliasAndHeader) {
  auto args = kFast;
  args.insert(args.end(), {"--dp-size", "3"});
  Sim s(args);
  HttpClient c(s.port);
  auto rank = [&](const testing::Response& r) {
    EXPECT_EQ(r.status, 200) << r.body;
    return int64_t(parse(r.body)["meta_info"]["dp_rank"]);
  };
  const std::string gen = R"({"text":"hi","sampling_params":{"max_new_tokens":1})";
  EXPECT_EQ(rank(c.post("/generate", gen + R"(,"routed_dp_rank":2})")), 2);
  EXPECT_EQ(rank(c.post("/generate", gen + R"(,"data_parallel_rank":1})")), 1)
      << "the deprecated alias";
  EXPECT_EQ(rank(c.post("/generate", gen + R"(,"data_parallel_rank":1,"routed_dp_rank":2})")), 2)
      << "routed_dp_rank wins over the alias";
  auto out = c.post("/generate", gen + R"(,"routed_dp_rank":3})");
  EXPECT_EQ(out.status, 400);
  EXPECT_EQ(str(parse(out.body)["error"]["message"]), "routed_dp_rank=3 out of range [0, 3)");

  // OpenAI routes: the header overrides the body; /generate does not read it.
  const std::string cmpl = R"({"model":"m","prompt":"hi","max_tokens":1)";
  auto prefilled = [&](size_t rank) {
    return int64_t(
        parse(c.get("/v1/loads").body)["loads"].at(rank)["total_prefill_uncached_tokens"]);
  };
  const int64_t before0 = prefilled(0), before2 = prefilled(2);
  for (int i = 0; i < 3; ++i) {
    auto r = c.post("/v1/completions", cmpl + R"(,"routed_dp_rank":0})",
                    {{"X-Data-Parallel-Rank", "2"}});
    EXPECT_EQ(r.status, 200) << r.body;
  }
  EXPECT_EQ(prefilled(0), before0) << "the body's rank is overridden";
  EXPECT_GT(prefilled(2), before2) << "the header's rank served the completions";
  auto bad = c.post("/v1/completions", cmpl + "}", {{"x-data-parallel-rank", "two"}});
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(str(parse(bad.body)["message"]),
            "Invalid X-Data-Parallel-Rank header: must be an integer, got 'two'");
  auto range = c.post("/v1/completions", cmpl + "}", {{"X-Data-Parallel-Rank", "7"}});
  EXPECT_EQ(range.status, 400);
  EXPECT_EQ(rank(c.post("/generate", gen + "}", {{"X-Data-Parallel-Rank", "9"}})) >= 0, true)
      << "/generate ignores the header";
}

TEST_F(SimSglangParity, DpRankIsNullWithOneRank) {
  Sim s(kFast);
  HttpClient c(s.port);
  auto r = c.post("/generate", R"({"text":"hi","sampling_params":{"max_new_tokens":1},)"
                               R"("routed_dp_rank":0})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_TRUE(parse(r.body)["meta_info"]["dp_rank"].is_null())
      << "SGLang's scheduler has no DP rank with dp_size 1 (and ignores rank 0)";
  EXPECT_EQ(c.post("/generate", R"({"text":"hi","routed_dp_rank":1})").status, 400);
}

TEST_F(SimSglangParity, ServerInfoDefaults) {
  Sim s(
      {"--model-path", "/models/qwen", "--context-length", "4096", "--max-total-tokens", "100000"});
  HttpClient c(s.port);
  element e = parse(c.get("/server_info").body);
  EXPECT_EQ(str(e["tokenizer_path"]), "/models/qwen") << "defaults to the model path";
  EXPECT_EQ(int64_t(e["max_req_input_len"]), 4090) << "min(4096 - 1, 100000 - 1) - 5";
  EXPECT_EQ(int64_t(e["internal_states"].at(0)["max_req_input_len"]), 4090);
  EXPECT_EQ(str(parse(c.get("/get_model_info").body)["tokenizer_path"]), "/models/qwen");
}

TEST_F(SimSglangParity, GetLoadCountsTheWaitingQueue) {
  RankLoad l;
  l.dp_rank = 1;
  l.running = 2;
  l.waiting = 3;
  l.used_tokens = 100;
  l.waiting_tokens = 40;
  std::vector<RankLoad> loads{l};
  element a = parse(get_load_json(loads, 12.5));
  element r = a.at(0);
  EXPECT_EQ(int64_t(r["dp_rank"]), 1);
  EXPECT_EQ(int64_t(r["num_reqs"]), 5) << "running + waiting";
  EXPECT_EQ(int64_t(r["num_waiting_reqs"]), 3);
  EXPECT_EQ(int64_t(r["num_tokens"]), 140) << "used + waiting-queue tokens";
  EXPECT_EQ(int64_t(r["num_pending_tokens"]), 40);
  EXPECT_DOUBLE_EQ(double(r["ts_tic"]), 12.5);
}

TEST_F(SimSglangParity, V1LoadsSectionsRankFilterAndPrometheus) {
  SimConfig cfg;
  RankLoad l0, l1;
  l0.dp_rank = 0;
  l0.used_tokens = 10;
  l0.max_total_tokens = 100;
  l0.waiting = 1;
  l0.waiting_tokens = 7;
  l1.dp_rank = 1;
  std::vector<RankLoad> loads{l0, l1};
  LoadsAnswer all = v1_loads(cfg, loads, "", 1.5);
  ASSERT_EQ(all.status, 200);
  element e = parse(all.body);
  for (const char* k : {"timestamp", "version", "accelerator", "num_accelerators", "loads"}) {
    EXPECT_FALSE(e[k].error()) << k;
  }
  element r0 = e["loads"].at(0);
  EXPECT_EQ(int64_t(r0["num_total_tokens"]), 17);
  EXPECT_DOUBLE_EQ(double(r0["token_usage"]), 0.1);
  EXPECT_FALSE(r0["memory"].error());
  EXPECT_EQ(int64_t(r0["queues"]["waiting"]), 1);
  EXPECT_TRUE(r0["disaggregation"].error()) << "no PD role, no disaggregation section";

  element core = parse(v1_loads(cfg, loads, "include=core", 1.5).body);
  EXPECT_TRUE(core["loads"].at(0)["memory"].error()) << "core: the scalars only";
  element some = parse(v1_loads(cfg, loads, "include=core%2C%20queues", 1.5).body);
  EXPECT_FALSE(some["loads"].at(0)["queues"].error());
  EXPECT_TRUE(some["loads"].at(0)["memory"].error());
  element one = parse(v1_loads(cfg, loads, "dp_rank=1", 1.5).body);
  ASSERT_EQ(one["loads"].get_array().size(), 1u);
  EXPECT_EQ(int64_t(one["loads"].at(0)["dp_rank"]), 1);
  EXPECT_EQ(parse(v1_loads(cfg, loads, "dp_rank=5", 1.5).body)["loads"].get_array().size(), 0u)
      << "a rank out of range: no loads";

  LoadsAnswer bad = v1_loads(cfg, loads, "include=core,bogus", 1.5);
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(str(parse(bad.body)["detail"]),
            "Invalid include sections: {'bogus'}. Valid options: ['all', 'core', 'disagg', "
            "'lora', 'memory', 'queues', 'spec']");
  EXPECT_EQ(v1_loads(cfg, loads, "dp_rank=x", 1.5).status, 422);

  LoadsAnswer prom = v1_loads(cfg, loads, "format=prometheus&include=core", 1.5);
  EXPECT_TRUE(prom.prometheus);
  EXPECT_NE(prom.body.find("# TYPE sglang_num_used_tokens gauge\n"
                           "sglang_num_used_tokens{dp_rank=\"0\"} 10\n"
                           "sglang_num_used_tokens{dp_rank=\"1\"} 0\n"),
            std::string::npos)
      << prom.body;
  EXPECT_EQ(prom.body.find("decode_moments"), std::string::npos) << "null fields are skipped";
  EXPECT_EQ(query_param("a=1&include=core%2Cmemory&b", "include"), "core,memory");
  EXPECT_FALSE(query_param("a=1", "include"));
}

TEST_F(SimSglangParity, V1LoadsOverHttp) {
  Sim s({"--dp-size", "2"});
  HttpClient c(s.port);
  auto r = c.get("/v1/loads?include=bogus");
  EXPECT_EQ(r.status, 400);
  auto p = c.get("/v1/loads?format=prometheus");
  EXPECT_EQ(p.status, 200);
  EXPECT_NE(p.header("content-type").find("text/plain"), std::string::npos);
  EXPECT_NE(p.body.find("sglang_memory_token_capacity{dp_rank=\"1\"} 400000"), std::string::npos);
  EXPECT_EQ(c.post("/v1/loads", "").status, 405);
}

TEST(SimRequestNamespaces, CacheSaltLoraAndHeaderParsing) {
  ParsedRequest r;
  EXPECT_EQ(apply_dp_rank_header(std::nullopt, r), "");
  EXPECT_FALSE(r.routed_dp_rank);
  EXPECT_EQ(apply_dp_rank_header(" 3 ", r), "");
  EXPECT_EQ(r.routed_dp_rank, 3);
  EXPECT_EQ(apply_dp_rank_header("-1", r), "");
  EXPECT_EQ(r.routed_dp_rank, -1);
  EXPECT_NE(apply_dp_rank_header("", r), "");
  EXPECT_NE(apply_dp_rank_header("1.5", r), "");
  r.loras = {"", "b"};
  const std::vector<std::string> served{"a"};
  EXPECT_NE(check_loras(r, true, served), "");
  r.loras = {"", "a"};
  EXPECT_EQ(check_loras(r, true, served), "");
  r.cache_salts = {"s0", "s1"};
  EXPECT_EQ(r.cache_namespace(1).cache_salt, "s1");
  EXPECT_EQ(r.cache_namespace(1).lora, "a");
  EXPECT_EQ(r.cache_namespace(0).lora, "");
}

}  // namespace
}  // namespace kvgate::sim
