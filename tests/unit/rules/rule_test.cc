// Tests for rules/rule: parsing a rule from JSON (types, unknown fields, every error at once),
// validation of every rejected shape with its message (field, value, fix), the round trip through
// to_json, the rule table, live updates and the default rule made from flags.
#include "rules/rule.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace kvgate::rules {
namespace {

using Json = nlohmann::ordered_json;

// A valid single-pool rule: SGLang, fullproxy, cache_aware.
const char* kPool = R"({
  "name": "pool", "mode": 4, "sel": "cache_aware", "kvEngineType": "sglang",
  "tokenizerPath": "/models/qwen3",
  "endpoints": ["http://127.0.0.1:30001", "http://127.0.0.1:30002"]
})";
// A valid SGLang P/D rule with KV-exact (mode 1).
const char* kPd = R"({
  "name": "pd", "mode": 4, "kvEngineType": "sglang", "kvExactMode": 1,
  "tokenizerPath": "/models/qwen3",
  "endpoints": [{"url": "http://10.0.0.1:30000", "role": "prefill"},
                {"url": "http://10.0.0.2:30000", "role": "decode"}]
})";

// `base` with the members of `patch` set (null removes one), as JSON text.
std::string with(const char* base, const std::string& patch) {
  Json j = Json::parse(base);
  j.merge_patch(Json::parse(patch));
  return j.dump();
}

std::optional<Rule> parse(const std::string& json, std::vector<FieldError>& errors) {
  return rule_from_json(json, GatewayConfig{}, errors);
}

std::string all(const std::vector<FieldError>& errors) {
  return format_errors(errors);
}

TEST(RuleParse, ValidRulesParse) {
  std::vector<FieldError> errors;
  auto pool = parse(kPool, errors);
  ASSERT_TRUE(pool) << all(errors);
  EXPECT_EQ(pool->name, "pool");
  EXPECT_EQ(pool->mode, 4);
  EXPECT_EQ(pool->sel, "cache_aware");
  EXPECT_EQ(pool->kv_engine_type, EngineType::kSglang);
  EXPECT_EQ(pool->kv_hash_algo, "sha256_sglang");  // derived
  EXPECT_EQ(pool->kv_block_size, 16);
  EXPECT_EQ(pool->kv_zmq_port, 5557);
  EXPECT_EQ(pool->kv_warmup_sec, 30);
  ASSERT_EQ(pool->endpoints.size(), 2u);
  EXPECT_EQ(pool->endpoints[0].url, "http://127.0.0.1:30001");
  EXPECT_EQ(pool->endpoints[0].role, Role::kNone);
  EXPECT_EQ(pool->endpoints[0].weight, 1);
  EXPECT_FALSE(pool->pd());
  // policy_knobs describes the pool's policy on its own.
  EXPECT_EQ(pool->policy_knobs.policy, "cache_aware");
  EXPECT_EQ(pool->policy_knobs.tokenizer_path, "/models/qwen3");

  auto pd = parse(kPd, errors);
  ASSERT_TRUE(pd) << all(errors);
  EXPECT_TRUE(pd->pd());
  EXPECT_EQ(pd->endpoints[0].role, Role::kPrefill);
  EXPECT_EQ(pd->endpoints[1].role, Role::kDecode);
}

TEST(RuleParse, DefaultsOfAMinimalRule) {
  std::vector<FieldError> errors;
  auto r = parse(R"({"name": "r", "endpoints": ["127.0.0.1:8000"]})", errors);
  ASSERT_TRUE(r) << all(errors);
  EXPECT_EQ(r->mode, 0);  // plain proxy
  EXPECT_EQ(r->sel, "round_robin");
  EXPECT_EQ(r->kv_engine_type, EngineType::kVllm);
  EXPECT_EQ(r->kv_hash_algo, "sha256");  // vLLM's default --prefix-caching-hash-algo
  EXPECT_EQ(r->endpoints[0].url, "http://127.0.0.1:8000");  // normalized
  EXPECT_TRUE(r->models.empty());
  EXPECT_EQ(r->port, 0);
  EXPECT_EQ(r->path_prefix, "");
}

TEST(RuleParse, PolicyKnobsDefaultToTheCommandLineAndTakeTheirOwnRanges) {
  GatewayConfig base;
  base.cache_threshold = 0.7;
  base.max_tree_size = 1000;
  std::vector<FieldError> errors;
  auto r = rule_from_json(with(kPool, R"({"maxTreeSize": 42, "manualAssignmentMode": "min_load"})"),
                          base, errors);
  ASSERT_TRUE(r) << all(errors);
  EXPECT_DOUBLE_EQ(r->policy_knobs.cache_threshold, 0.7);
  EXPECT_EQ(r->policy_knobs.max_tree_size, 42);
  EXPECT_EQ(r->policy_knobs.manual_assignment_mode, "min_load");
}

TEST(RuleParse, AcceptedSpellings) {
  struct Case {
    const char* what;
    std::string json;
    std::function<void(const Rule&)> check;
  };
  std::vector<Case> cases = {
      {"sel 0 is round_robin", with(kPool, R"({"sel": 0})"),
       [](const Rule& r) { EXPECT_EQ(r.sel, "round_robin"); }},
      {"sel 8 is chwbl", with(kPool, R"({"sel": 8})"),
       [](const Rule& r) { EXPECT_EQ(r.sel, "chwbl"); }},
      {"engine names in any case", with(kPool, R"({"kvEngineType": "SGLang"})"),
       [](const Rule& r) { EXPECT_EQ(r.kv_engine_type, EngineType::kSglang); }},
      {"roles as numbers",
       with(
           kPd,
           R"({"endpoints": [{"url": "http://p:1", "role": 1}, {"url": "http://d:1", "role": 2}]})"),
       [](const Rule& r) {
         EXPECT_EQ(r.endpoints[0].role, Role::kPrefill);
         EXPECT_EQ(r.endpoints[1].role, Role::kDecode);
       }},
      {"null is the default", with(kPool, R"({"kvBlockSize": null})"),
       [](const Rule& r) { EXPECT_EQ(r.kv_block_size, 16); }},
      {"vLLM KV-exact with sha256_cbor",
       with(kPool, R"({"kvEngineType": "vllm", "kvExactMode": 3, "kvHashAlgo": "sha256_cbor"})"),
       [](const Rule& r) { EXPECT_EQ(r.kv_hash_algo, "sha256_cbor"); }},
      {"sglang with its own hash named", with(kPool, R"({"kvHashAlgo": "sha256_sglang"})"),
       [](const Rule& r) { EXPECT_EQ(r.kv_hash_algo, "sha256_sglang"); }},
      {"trtllm without KV-exact", with(kPool, R"({"kvEngineType": "trtllm"})"),
       [](const Rule& r) { EXPECT_EQ(r.kv_hash_algo, ""); }},
      {"mode 0 with a policy that reads nothing",
       with(kPool, R"({"mode": 0, "sel": "power_of_two", "tokenizerPath": null})"),
       [](const Rule& r) { EXPECT_EQ(r.mode, 0); }},
      {"the last rank port is 65535", with(kPool, R"({"kvZmqPort": 65528, "kvDpRankCount": 8})"),
       [](const Rule& r) { EXPECT_EQ(r.kv_dp_rank_count, 8); }},
      {"pdBootstrapPort in SGLang P/D", with(kPd, R"({"pdBootstrapPort": 9000})"),
       [](const Rule& r) { EXPECT_EQ(r.pd_bootstrap_port, 9000); }},
      {"an endpoint's bootstrapPort on a prefill endpoint",
       with(kPd,
            R"({"endpoints": [{"url": "http://p:1", "role": "prefill", "bootstrapPort": 8999},
                              {"url": "http://d:1", "role": "decode"}]})"),
       [](const Rule& r) { EXPECT_EQ(r.endpoints[0].bootstrap_port, 8999); }},
      {"base P/D without KV-exact", with(kPd, R"({"kvExactMode": 0, "tokenizerPath": null})"),
       [](const Rule& r) { EXPECT_TRUE(r.pd()); }},
      {"the seed guide's base P/D: pd_disagg_mode and roles 1/2",
       with(kPd, R"({"pd_disagg_mode": true, "kvExactMode": 0, "tokenizerPath": null,
                     "endpoints": [{"url": "http://p:1", "role": 1}, {"url": "http://d:1", "role": 2}]})"),
       [](const Rule& r) {
         EXPECT_TRUE(r.pd());
         EXPECT_NE(to_json(r).find("\"pd_disagg_mode\":true"), std::string::npos) << to_json(r);
       }},
      {"a policy per side", with(kPd, R"({"sel": "round_robin", "prefillPolicy": "cache_aware",
                     "decodePolicy": "power_of_two"})"),
       [](const Rule& r) {
         EXPECT_EQ(r.policy_knobs.prefill_policy, "cache_aware");
         EXPECT_EQ(r.policy_knobs.decode_policy, "power_of_two");
       }},
      {"models, port and path",
       with(kPool, R"({"models": ["a", "b"], "port": 8080, "pathPrefix": "/v1"})"),
       [](const Rule& r) { EXPECT_EQ(r.models.size(), 2u); }},
  };
  for (const auto& c : cases) {
    std::vector<FieldError> errors;
    auto r = parse(c.json, errors);
    ASSERT_TRUE(r) << c.what << ":\n" << all(errors);
    c.check(*r);
  }
}

// Every rejected shape: the field, the value and (part of) the fix the message must name.
TEST(RuleValidation, EveryRejectedShapeSaysWhatToDo) {
  struct Case {
    std::string json;
    std::string field;
    std::string value;
    std::string message;
  };
  std::string long_name(65, 'a');
  std::vector<Case> cases = {
      // The seed guide's rejected shapes.
      {with(kPd, R"({"kvExactMode": 3})"), "kvExactMode", "3",
       "use kvExactMode 1 for prefill/decode"},
      {with(kPool, R"({"kvExactMode": 3, "mode": 0, "sel": "round_robin"})"), "kvExactMode", "3",
       "set mode: 4"},
      // Fields that would be silently unused.
      {with(kPool, R"({"mode": 0, "sel": "round_robin"})"), "tokenizerPath", "\"/models/qwen3\"",
       "is used only in mode 4"},
      {with(kPool, R"({"pathPrefix": "/team-a"})"), "pathPrefix", "\"/team-a\"",
       "matches no path kvgate proxies"},
      {with(kPool, R"({"kvExactMode": 1})"), "kvExactMode", "1", "needs a role-partitioned pool"},
      {with(kPool, R"({"kvEngineType": "tensorrt"})"), "kvEngineType", "\"tensorrt\"",
       "use one of vllm, sglang, trtllm, llamacpp"},
      {with(kPool, R"({"kvDpRankCount": 9})"), "kvDpRankCount", "9", "split the deployment"},
      {with(kPool, R"({"kvDpRankCount": 0})"), "kvDpRankCount", "0", "between 1 and 8"},
      {with(kPool, R"({"kvZmqPort": 65535, "kvDpRankCount": 2})"), "kvZmqPort", "65535",
       "choose a base port of at most 65534"},
      {with(kPool,
            R"({"kvDpRankCount": 4, "endpoints": [{"url": "http://a:1", "kvZmqPort": 65534}]})"),
       "endpoints[0].kvZmqPort", "65534", "at most 65532"},
      {with(kPool, R"({"kvHashAlgo": "sha256_cbor"})"), "kvHashAlgo", "\"sha256_cbor\"",
       "remove kvHashAlgo (it is derived from the engine) or set sha256_sglang"},
      {with(kPool, R"({"pdBootstrapPort": 9000})"), "pdBootstrapPort", "9000", "remove the field"},
      // kvgate's own.
      {with(kPool, R"({"kvExactMode": 3, "kvEngineType": "trtllm"})"), "kvExactMode", "3",
       "kvgate cannot read trtllm's KV events"},
      {with(kPool, R"({"kvExactMode": 3, "kvEngineType": "llamacpp"})"), "kvExactMode", "3",
       "set kvExactMode 0, or run SGLang or vLLM"},
      {with(kPool, R"({"kvExactMode": 3, "tokenizerPath": null})"), "tokenizerPath", "\"\"",
       "set tokenizerPath"},
      {with(kPool, R"({"kvExactMode": 2})"), "kvExactMode", "2", "must be one of 0, 1, 3"},
      {with(kPool, R"({"mode": 1})"), "mode", "1", "use 4 for AI-aware routing"},
      {with(kPool, R"({"mode": 3})"), "mode", "3", "mode 0 (plain proxy) and mode 4"},
      {with(kPool, R"({"mode": 0})"), "sel", "\"cache_aware\"", "set mode: 4, or use round_robin"},
      {with(kPool, R"({"mode": 0, "sel": "manual"})"), "sel", "\"manual\"", "set mode: 4"},
      {with(kPool, R"({"mode": 0, "sel": "consistent_hashing"})"), "sel", "\"consistent_hashing\"",
       "set mode: 4"},
      {with(kPool, R"({"mode": 0, "sel": "random", "models": ["m"]})"), "models", "[...]",
       "set mode: 4, or remove models"},
      {with(kPool, R"({"sel": "kv_exact"})"), "sel", "\"kv_exact\"",
       "kv_exact is turned on by kvExactMode 3; sel names the policy for its misses: choose one "
       "of: round_robin"},
      {with(kPool, R"({"sel": "fastest"})"), "sel", "\"fastest\"", "unknown policy; choose one of"},
      {with(kPool, R"({"sel": 3})"), "sel", "3", "only 0 (round_robin) and 8 (chwbl)"},
      {with(kPool, R"({"name": "a b"})"), "name", "\"a b\"", "A-Z a-z 0-9 _ . -"},
      {with(kPool, R"({"name": ""})"), "name", "\"\"", "needs a name"},
      {with(kPool, R"({"name": ")" + long_name + R"("})"), "name", "", "1 to 64 characters"},
      {with(kPool, R"({"models": [""]})"), "models[0]", "\"\"", "1 to 256 bytes"},
      {with(kPool, R"({"models": ["m", "m"]})"), "models[1]", "\"m\"", "listed twice"},
      {with(kPool, R"({"port": 70000})"), "port", "70000", "between 0 and 65535"},
      {with(kPool, R"({"pathPrefix": "v1"})"), "pathPrefix", "\"v1\"", "must start with '/'"},
      {with(kPool, R"({"pathPrefix": "/a b"})"), "pathPrefix", "\"/a b\"", "no spaces"},
      {with(kPool, R"({"kvBlockSize": 0})"), "kvBlockSize", "0", "the engine's page size"},
      {with(kPool, R"({"kvBlockSize": 8192})"), "kvBlockSize", "8192", "between 1 and 4096"},
      {with(kPool, R"({"kvWarmupSec": 4000})"), "kvWarmupSec", "4000", "between 0 and 3600"},
      {with(kPool, R"({"kvZmqPort": 0})"), "kvZmqPort", "0", "between 1 and 65535"},
      {with(kPool, R"({"kvEngineType": "vllm", "kvHashAlgo": "sha256_sglang"})"), "kvHashAlgo",
       "\"sha256_sglang\"", "one of sha256, sha256_cbor, xxhash, xxhash_cbor"},
      {with(kPool, R"({"kvEngineType": "trtllm", "kvHashAlgo": "sha256"})"), "kvHashAlgo",
       "\"sha256\"", "remove kvHashAlgo"},
      {with(kPool, R"({"cacheThreshold": 1.5})"), "cacheThreshold", "1.5", "between 0 and 1"},
      {with(kPool, R"({"balanceRelThreshold": 0.5})"), "balanceRelThreshold", "0.5", ">= 1"},
      {with(kPool, R"({"manualAssignmentMode": "nearest"})"), "manualAssignmentMode", "\"nearest\"",
       "choose one of: random, min_load, min_group"},
      // Endpoints.
      {with(kPool, R"({"endpoints": []})"), "endpoints", "[]", "at least one endpoint"},
      {with(kPool, R"({"endpoints": ["ftp://a:1"]})"), "endpoints[0].url", "\"ftp://a:1\"",
       "unsupported scheme"},
      {with(kPool, R"({"endpoints": ["http://user:pw@a:1"]})"), "endpoints[0].url", "",
       "give the worker's address only"},
      {with(kPool, R"({"endpoints": ["http://a:1/", "a:1"]})"), "endpoints[1].url", "",
       "the same server as endpoints[0]"},
      {with(kPool, R"({"endpoints": ["http://A:1", "http://a:1"]})"), "endpoints[1].url", "",
       "list each server once"},
      {with(kPool, R"({"endpoints": [{"url": "http://a:1", "weight": 0}]})"), "endpoints[0].weight",
       "0", "between 1 and 1000"},
      {with(kPool, R"({"endpoints": [{"url": "http://a:1", "weight": 1001}]})"),
       "endpoints[0].weight", "1001", "between 1 and 1000"},
      {with(kPd, R"({"endpoints": [{"url": "http://p:1", "role": "prefill"}, "http://n:1",
                                   {"url": "http://d:1", "role": "decode"}]})"),
       "endpoints", "", "give every endpoint a role"},
      {with(kPd, R"({"kvExactMode": 0, "endpoints": [{"url": "http://p:1", "role": "prefill"}]})"),
       "endpoints", "", "at least one of each (role: decode)"},
      {with(kPd, R"({"kvExactMode": 0, "endpoints": [{"url": "http://d:1", "role": "decode"}]})"),
       "endpoints", "", "at least one of each (role: prefill)"},
      {with(kPool, R"({"pd_disagg_mode": true})"), "pd_disagg_mode", "true",
       "needs prefill and decode endpoints"},
      {with(kPd, R"({"pd_disagg_mode": false})"), "pd_disagg_mode", "false",
       "set pd_disagg_mode: true, or drop the roles"},
      {with(kPool, R"({"prefillPolicy": "cache_aware"})"), "prefillPolicy", "\"cache_aware\"",
       "applies to prefill/decode pools only"},
      {with(kPool, R"({"decodePolicy": "power_of_two"})"), "decodePolicy", "\"power_of_two\"",
       "applies to prefill/decode pools only"},
      {with(kPd, R"({"endpoints": [{"url": "http://p:1", "role": "prefill", "kvZmqPort": 5557},
                                   {"url": "http://d:1", "role": "decode", "kvZmqPort": 5560}]})"),
       "endpoints[1].kvZmqPort", "5560", "reads the prefill servers' events"},
      {with(kPd, R"({"prefillPolicy": "kv_exact"})"), "prefillPolicy", "\"kv_exact\"",
       "set kvExactMode: 1 and a policy here"},
      {with(kPd, R"({"decodePolicy": "kv_exact"})"), "decodePolicy", "\"kv_exact\"",
       "choose another decode policy"},
      {with(kPd, R"({"prefillPolicy": "fastest"})"), "prefillPolicy", "\"fastest\"", "one of"},
      {with(kPd, R"({"kvEngineType": "vllm"})"), "kvEngineType", "\"vllm\"",
       "set kvEngineType: sglang, or drop the roles"},
      {with(kPd, R"({"mode": 0, "kvExactMode": 0})"), "mode", "0",
       "adds the bootstrap fields to each request body"},
      {with(kPd, R"({"endpoints": [{"url": "http://p:1", "role": "prefill"},
                                   {"url": "http://d:1", "role": "decode", "bootstrapPort": 8998}]})"),
       "endpoints[1].bootstrapPort", "8998", "prefill endpoints of SGLang prefill/decode only"},
      {with(kPd, R"({"endpoints": [{"url": "http://p:1", "role": "prefill", "bootstrapPort": 0},
                                   {"url": "http://d:1", "role": "decode"}]})"),
       "endpoints[0].bootstrapPort", "0", "between 1 and 65535"},
      {with(kPool, R"({"endpoints": [{"url": "http://a:1", "kvZmqPort": 70000}]})"),
       "endpoints[0].kvZmqPort", "70000", "between 1 and 65535"},
  };
  for (const auto& c : cases) {
    std::vector<FieldError> errors;
    auto r = parse(c.json, errors);
    EXPECT_FALSE(r) << c.json;
    bool found = false;
    for (const auto& e : errors) {
      if (e.field == c.field && e.value.find(c.value) != std::string::npos &&
          e.message.find(c.message) != std::string::npos) {
        found = true;
      }
    }
    EXPECT_TRUE(found) << "expected " << c.field << ": " << c.value << ": ..." << c.message
                       << "...\nfor " << c.json << "\ngot:\n"
                       << all(errors);
  }
}

TEST(RuleValidation, ValidateChecksRulesBuiltInCode) {
  Rule r;
  r.name = "code";
  r.mode = 4;
  r.sel = "cache_aware";
  r.endpoints.push_back({.url = "http://127.0.0.1:1"});
  std::vector<FieldError> errors;
  validate(r, errors);
  EXPECT_TRUE(errors.empty()) << all(errors);
  r.kv_exact_mode = 3;
  r.kv_engine_type = EngineType::kLlamacpp;
  r.policy_knobs.chwbl_load_factor = 0.5;
  validate(r, errors);
  EXPECT_NE(all(errors).find("kvExactMode: 3: kvgate cannot read llamacpp's KV events"),
            std::string::npos)
      << all(errors);
  EXPECT_NE(all(errors).find("chwblLoadFactor: 0.5: out of range: it must be >= 1"),
            std::string::npos)
      << all(errors);
}

TEST(RuleParse, UnknownFieldsSuggestTheRightName) {
  struct Case {
    std::string patch;
    std::string field;
    std::string suggestion;
  };
  std::vector<Case> cases = {
      {R"({"kvExactMod": 3})", "kvExactMod", "did you mean 'kvExactMode'?"},
      {R"({"kv_exact_mode": 3})", "kv_exact_mode", "did you mean 'kvExactMode'?"},
      {R"({"cache-threshold": 0.5})", "cache-threshold", "did you mean 'cacheThreshold'?"},
      {R"({"KVBLOCKSIZE": 16})", "KVBLOCKSIZE", "did you mean 'kvBlockSize'?"},
      {R"({"endpoints": [{"urll": "http://a:1", "url": "http://b:1"}]})", "endpoints[0].urll",
       "did you mean 'url'?"},
      {R"({"endpoints": [{"url": "http://a:1", "rol": "decode"}]})", "endpoints[0].rol",
       "did you mean 'role'?"},
  };
  for (const auto& c : cases) {
    std::vector<FieldError> errors;
    EXPECT_FALSE(parse(with(kPool, c.patch), errors));
    ASSERT_FALSE(errors.empty()) << c.patch;
    EXPECT_EQ(errors[0].field, c.field) << all(errors);
    EXPECT_NE(errors[0].message.find(c.suggestion), std::string::npos) << all(errors);
  }
  // Only `models`: `model` is not a field.
  std::vector<FieldError> errors;
  EXPECT_FALSE(parse(with(kPool, R"({"model": "m"})"), errors));
  EXPECT_NE(all(errors).find("model: unknown field; did you mean 'models'?"), std::string::npos)
      << all(errors);
}

TEST(RuleParse, WrongTypesNameTheExpectedType) {
  struct Case {
    std::string patch;
    std::string field;
    std::string message;
  };
  std::vector<Case> cases = {
      {R"({"port": "8080"})", "port", "expected an integer, got a string; write it without quotes"},
      {R"({"kvBlockSize": 16.5})", "kvBlockSize", "expected an integer, got a number"},
      {R"({"name": 5})", "name", "expected a string, got an integer"},
      {R"({"models": "m"})", "models", "expected a list of strings, got a string; write [\"m\"]"},
      {R"({"models": ["a", 1]})", "models[1]", "expected a string, got an integer"},
      {R"({"cacheThreshold": "high"})", "cacheThreshold", "expected a number, got a string"},
      {R"({"maxTreeSize": true})", "maxTreeSize", "expected an integer, got a boolean"},
      {R"({"endpoints": {"url": "http://a:1"}})", "endpoints",
       "expected a list of endpoints ([{url: http://host:port}, ...]), got a mapping"},
      {R"({"endpoints": [5]})", "endpoints[0]", "expected an endpoint"},
      {R"({"endpoints": [{"role": "prefill"}]})", "endpoints[0].url", "every endpoint needs a url"},
      {R"({"endpoints": [{"url": "http://a:1", "role": "leader"}]})", "endpoints[0].role",
       "none, prefill or decode"},
      {R"({"endpoints": [{"url": "http://a:1", "weight": "2"}]})", "endpoints[0].weight",
       "write it without quotes"},
      {R"({"sel": ["cache_aware"]})", "sel", "expected a string, got a list"},
      {R"({"kvEngineType": 1})", "kvEngineType", "expected a string, got an integer"},
  };
  for (const auto& c : cases) {
    std::vector<FieldError> errors;
    EXPECT_FALSE(parse(with(kPool, c.patch), errors)) << c.patch;
    bool found = false;
    for (const auto& e : errors) {
      found |= e.field == c.field && e.message.find(c.message) != std::string::npos;
    }
    EXPECT_TRUE(found) << c.patch << "\n" << all(errors);
  }
}

TEST(RuleParse, EveryErrorAtOnce) {
  std::vector<FieldError> errors;
  auto r = parse(R"({
    "nme": "x", "port": "80", "mode": 2, "sel": "nope", "kvDpRankCount": 12,
    "cacheThreshold": -1, "endpoints": ["ftp://a"], "kvBlockSize": 0
  })",
                 errors);
  EXPECT_FALSE(r);
  std::string text = all(errors);
  for (const char* expect : {"nme: unknown field; did you mean 'name'?", "name: missing",
                             "port: \"80\": expected an integer", "mode: 2: must be one of 0, 4",
                             "sel: \"nope\": unknown policy", "kvDpRankCount: 12: out of range",
                             "cacheThreshold: -1: out of range", "endpoints[0].url: \"ftp://a\"",
                             "kvBlockSize: 0: out of range"}) {
    EXPECT_NE(text.find(expect), std::string::npos) << expect << "\n" << text;
  }
}

TEST(RuleParse, CrossChecksDoNotReportFieldsThatFailedToParse) {
  // kvEngineType could not be read: no "kvHashAlgo is another engine's" on top of it.
  std::vector<FieldError> errors;
  EXPECT_FALSE(parse(with(kPool, R"({"kvEngineType": "sglng", "kvHashAlgo": "sha256"})"), errors));
  ASSERT_EQ(errors.size(), 1u) << all(errors);
  EXPECT_EQ(errors[0].field, "kvEngineType");
  // The endpoints could not be read: no "needs at least one endpoint".
  errors.clear();
  EXPECT_FALSE(parse(with(kPool, R"({"endpoints": "http://a:1"})"), errors));
  ASSERT_EQ(errors.size(), 1u) << all(errors);
}

TEST(RuleParse, MalformedJson) {
  struct Case {
    std::string json;
    std::string message;
  };
  std::string deep(200, '[');
  std::vector<Case> cases = {
      {"{", "not valid JSON: line 1, column 2"},
      {"", "not valid JSON"},
      {"[]", "a rule is a mapping"},
      {"\"rule\"", "a rule is a mapping"},
      {R"({"name": "a", "name": "b", "endpoints": ["http://a:1"]})", "written twice"},
      {deep, "nested more than 32 levels deep"},
      {R"({"name": "a", "endpoints": ["http://a:1"]} trailing)", "not valid JSON"},
  };
  for (const auto& c : cases) {
    std::vector<FieldError> errors;
    EXPECT_FALSE(parse(c.json, errors)) << c.json;
    EXPECT_NE(all(errors).find(c.message), std::string::npos) << c.json << "\n" << all(errors);
  }
}

std::vector<std::string> some_rules() {
  return {
      kPool,
      kPd,
      with(kPd, R"({"pdBootstrapPort": 9000, "endpoints": [
         {"url": "http://p:1", "role": "prefill", "bootstrapPort": 8999, "weight": 3,
          "kvZmqPort": 6000},
         {"url": "https://d:2/base", "role": "decode"}]})"),
      with(kPool, R"({"models": ["m1", "m2"], "port": 8080, "pathPrefix": "/v1", "sel": 8,
                      "chwblLoadFactor": 1.5, "policySeed": 7, "kvExactMode": 3,
                      "kvDpRankCount": 4, "kvWarmupSec": 0, "kvBlockSize": 64})"),
      R"({"name": "plain", "endpoints": ["127.0.0.1:1"]})",
      with(kPool, R"({"kvEngineType": "llamacpp", "manualAssignmentMode": "min_group"})"),
  };
}

TEST(RuleJson, RoundTrip) {
  for (const auto& json : some_rules()) {
    std::vector<FieldError> errors;
    auto r = parse(json, errors);
    ASSERT_TRUE(r) << json << "\n" << all(errors);
    std::string out = to_json(*r);
    auto back = parse(out, errors);
    ASSERT_TRUE(back) << out << "\n" << all(errors);
    EXPECT_TRUE(equivalent(*r, *back)) << out;
    EXPECT_EQ(to_json(*back), out);
  }
}

TEST(RuleJson, EveryFieldInTheTablesOrder) {
  std::vector<FieldError> errors;
  auto r = parse(R"({"name": "plain", "endpoints": ["127.0.0.1:1"]})", errors);
  ASSERT_TRUE(r);
  Json j = Json::parse(to_json(*r));
  auto table = rule_fields(GatewayConfig{});
  ASSERT_EQ(j.size(), table.size());
  size_t i = 0;
  for (const auto& [key, value] : j.items()) EXPECT_EQ(key, table[i++].name);
  EXPECT_EQ(j["kvHashAlgo"], "sha256");
  EXPECT_EQ(j["cacheThreshold"], 0.3);
  EXPECT_EQ(j["policySeed"], 0);
  EXPECT_EQ(j["endpoints"][0],
            Json::parse(R"({"url": "http://127.0.0.1:1", "role": "none", "bootstrapPort": null,
                            "kvZmqPort": null, "weight": 1})"));
  // The knobs that make no sense per rule are not rule fields.
  for (const char* absent : {"policy", "modelPath", "tokenizer-path"}) {
    EXPECT_FALSE(j.contains(absent)) << absent;
  }
  // DP awareness is per rule (a rule's endpoints may run with --dp-size, another's not).
  EXPECT_EQ(j["dpAware"], false);
}

TEST(RuleValidation, DpAwareNeedsTheBodyRead) {
  std::vector<FieldError> errors;
  auto r = parse(with(kPool, R"({"mode": 0, "sel": "round_robin", "dpAware": true})"), errors);
  EXPECT_FALSE(r);
  bool named = false;
  for (const auto& e : errors) {
    if (e.field == "dpAware") {
      named = true;
      EXPECT_NE(e.message.find("routed_dp_rank"), std::string::npos) << e.message;
    }
  }
  EXPECT_TRUE(named);
  errors.clear();
  auto ok = parse(with(kPool, R"({"dpAware": true, "kvDpRankCount": 2})"), errors);
  ASSERT_TRUE(ok) << (errors.empty() ? "" : errors[0].message);
  EXPECT_TRUE(ok->policy_knobs.dp_aware);
}

TEST(RuleJson, EquivalentComparesEveryField) {
  std::vector<FieldError> errors;
  auto a = parse(kPool, errors);
  auto b = parse(with(kPool, R"({"cacheThreshold": 0.31})"), errors);
  ASSERT_TRUE(a && b);
  EXPECT_TRUE(equivalent(*a, *a));
  EXPECT_FALSE(equivalent(*a, *b));
}

Rule named(const std::string& name, std::vector<std::string> models, int64_t port = 0,
           std::string path = "") {
  Rule r;
  r.name = name;
  r.models = std::move(models);
  r.port = port;
  r.path_prefix = std::move(path);
  r.mode = 4;
  r.endpoints.push_back({.url = "http://127.0.0.1:1"});
  return r;
}

TEST(RuleTable, NamesModelsAndCatchAlls) {
  struct Case {
    std::vector<Rule> rules;
    std::string expect;  // "" : valid
  };
  std::vector<Case> cases = {
      {{named("a", {"m"}), named("b", {"n"}), named("c", {})}, ""},
      {{named("a", {"m"}), named("a", {"n"})},
       "rules[1].name: \"a\": two rules are named \"a\" (also rules[0]); give each rule its own "
       "name"},
      {{named("a", {"m", "x"}), named("b", {"y", "x"})},
       "rules[1].models[1]: \"x\": also claimed by rule \"a\" on port 0 (any), pathPrefix \"\" "
       "(any); a request must match one rule"},
      {{named("a", {"m"}), named("b", {"m"}, 8080)}, ""},
      {{named("a", {"m"}), named("b", {"m"}, 0, "/v2")}, ""},
      {{named("a", {}), named("b", {})},
       "rules[1].models: []: rules \"a\" and \"b\" both take every model on port 0 (any), "
       "pathPrefix \"\" (any); at most one catch-all per port and path"},
      {{named("a", {}, 8080), named("b", {}, 8081), named("c", {}, 8080, "/x")}, ""},
  };
  for (const auto& c : cases) {
    std::vector<FieldError> errors;
    validate_table(c.rules, errors);
    if (c.expect.empty()) {
      EXPECT_TRUE(errors.empty()) << all(errors);
    } else {
      EXPECT_NE(all(errors).find(c.expect), std::string::npos) << all(errors);
    }
  }
}

TEST(RuleTable, AServerHasOneRoleInEveryRule) {
  Rule plain = named("a", {"m"});
  plain.endpoints = {{.url = "http://10.0.0.1:30000"}};
  Rule pd = named("b", {"n"});
  pd.endpoints = {{.url = "http://10.0.0.1:30000/", .role = Role::kPrefill},
                  {.url = "http://10.0.0.2:30000", .role = Role::kDecode}};
  std::vector<FieldError> errors;
  validate_table(std::vector<Rule>{plain, pd}, errors);
  EXPECT_NE(
      all(errors).find("rules[1].endpoints[0].role: prefill: the server "
                       "http://10.0.0.1:30000/ is none in rule \"a\"; a server runs in one role"),
      std::string::npos)
      << all(errors);
  errors.clear();
  pd.endpoints[0].url = "http://10.0.0.3:30000";
  validate_table(std::vector<Rule>{plain, pd}, errors);
  EXPECT_TRUE(errors.empty()) << all(errors);
}

TEST(RuleUpdate, EngineAndNameCannotChangeLive) {
  Rule a = named("a", {"m"});
  a.kv_engine_type = EngineType::kVllm;
  Rule b = a;
  b.kv_block_size = 32;
  b.endpoints.push_back({.url = "http://127.0.0.1:2"});
  std::vector<FieldError> errors;
  validate_update(a, b, errors);
  EXPECT_TRUE(errors.empty()) << all(errors);
  b.kv_engine_type = EngineType::kSglang;
  validate_update(a, b, errors);
  EXPECT_NE(all(errors).find("kvEngineType: \"sglang\": cannot change from vllm on a live rule"),
            std::string::npos)
      << all(errors);
  EXPECT_NE(all(errors).find("delete the rule and create it again"), std::string::npos);
  errors.clear();
  Rule c = a;
  c.name = "z";
  validate_update(a, c, errors);
  EXPECT_NE(all(errors).find("a rule keeps its name"), std::string::npos) << all(errors);
}

TEST(RuleFromFlags, TheDefaultRule) {
  GatewayConfig c;
  c.worker_urls = {"http://127.0.0.1:30001", "127.0.0.1:30002/"};
  c.policy = "prefix_hash";
  c.prefix_token_count = 64;
  c.tokenizer_path = "/models/qwen3";
  Rule r = rule_from_flags(c);
  EXPECT_EQ(r.name, "default");
  EXPECT_EQ(r.mode, 4);
  EXPECT_EQ(r.sel, "prefix_hash");
  EXPECT_EQ(r.kv_engine_type, EngineType::kSglang);  // --backend sglang
  EXPECT_EQ(r.kv_hash_algo, "sha256_sglang");
  EXPECT_EQ(r.tokenizer_path, "/models/qwen3");
  EXPECT_EQ(r.policy_knobs.prefix_token_count, 64);
  ASSERT_EQ(r.endpoints.size(), 2u);
  EXPECT_EQ(r.endpoints[1].url, "http://127.0.0.1:30002");
  EXPECT_TRUE(r.models.empty());
  std::vector<FieldError> errors;
  validate(r, errors);
  EXPECT_TRUE(errors.empty()) << all(errors);

  c.backend = "vllm";
  EXPECT_EQ(rule_from_flags(c).kv_engine_type, EngineType::kVllm);
  EXPECT_EQ(rule_from_flags(c).kv_hash_algo, "sha256");
}

TEST(RuleFromFlags, PrefillDecodeServersAndKvExactOverThePrefillSide) {
  GatewayConfig c;
  c.pd_disaggregation = true;
  c.prefill = {{"http://127.0.0.1:30001", 9001}, {"http://127.0.0.1:30002", std::nullopt}};
  c.decode = {"http://127.0.0.1:30010"};
  c.policy = "cache_aware";
  c.decode_policy = "power_of_two";
  c.tokenizer_path = "/models/qwen3";
  Rule r = rule_from_flags(c);
  ASSERT_EQ(r.endpoints.size(), 3u);
  EXPECT_TRUE(r.pd());
  EXPECT_EQ(r.endpoints[0].role, Role::kPrefill);
  EXPECT_EQ(r.endpoints[0].bootstrap_port, 9001);
  EXPECT_FALSE(r.endpoints[1].bootstrap_port.has_value());  // the rule's: 8998
  EXPECT_EQ(r.endpoints[2].role, Role::kDecode);
  EXPECT_EQ(r.kv_exact_mode, 0);
  EXPECT_EQ(r.policy_knobs.decode_policy, "power_of_two");
  std::vector<FieldError> errors;
  validate(r, errors);
  EXPECT_TRUE(errors.empty()) << all(errors);

  // --prefill-policy kv_exact: kvExactMode 1, its misses to --kv-fallback-policy.
  c.prefill_policy = "kv_exact";
  c.kv_fallback_policy = "chwbl";
  r = rule_from_flags(c);
  EXPECT_EQ(r.kv_exact_mode, 1);
  EXPECT_EQ(r.policy_knobs.prefill_policy, "chwbl");
  EXPECT_EQ(r.sel, "cache_aware");
  validate(r, errors);
  EXPECT_TRUE(errors.empty()) << all(errors);

  // --policy kv_exact with prefill/decode: kvExactMode 1 as well (3 is a single pool's).
  c.prefill_policy.clear();
  c.policy = "kv_exact";
  r = rule_from_flags(c);
  EXPECT_EQ(r.kv_exact_mode, 1);
  EXPECT_EQ(r.sel, "chwbl");
  validate(r, errors);
  EXPECT_TRUE(errors.empty()) << all(errors);
}

TEST(RuleFromFlags, ModelPathWithATokenizerIsTheTokenizer) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("kvgate-rule-test-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  GatewayConfig c;
  c.worker_urls = {"http://127.0.0.1:1"};
  c.model_path = dir.string();
  EXPECT_EQ(rule_from_flags(c).tokenizer_path, "");  // no tokenizer.json yet
  std::ofstream(dir / "tokenizer.json") << "{}";
  EXPECT_EQ(rule_from_flags(c).tokenizer_path, dir.string());
  c.tokenizer_path = "/other";
  EXPECT_EQ(rule_from_flags(c).tokenizer_path, "/other");  // --tokenizer-path wins
  fs::remove_all(dir);
}

TEST(RuleFields, TableAndMarkdown) {
  auto table = rule_fields(GatewayConfig{});
  std::string md = rule_fields_markdown();
  for (const auto& f : table) {
    EXPECT_NE(md.find("| `" + f.name + "` |"), std::string::npos) << f.name;
    EXPECT_FALSE(f.help.empty()) << f.name;
    EXPECT_FALSE(f.default_text.empty()) << f.name;
  }
  for (const char* f : {"url", "role", "bootstrapPort", "weight"}) {
    EXPECT_NE(md.find(std::string("| `") + f + "` |"), std::string::npos) << f;
  }
  // The policy knobs come from the knob table, with its ranges and the command line's defaults.
  GatewayConfig base;
  base.cache_threshold = 0.6;
  bool seen = false;
  for (const auto& f : rule_fields(base)) {
    if (f.name != "cacheThreshold") continue;
    seen = true;
    EXPECT_EQ(f.default_text, "0.6");
    EXPECT_EQ(f.range_text, "0..1");
    EXPECT_EQ(f.type, "number");
  }
  EXPECT_TRUE(seen);
}

TEST(RuleErrors, Format) {
  std::vector<FieldError> errors = {{"kvExactMode", "3", "set mode: 4", 12},
                                    {"", "", "not valid YAML", 0},
                                    {"name", "", "missing", 0}};
  EXPECT_EQ(format_errors(errors, "gw.yaml"),
            "gw.yaml:12: kvExactMode: 3: set mode: 4\n"
            "gw.yaml: not valid YAML\n"
            "gw.yaml: name: missing\n");
  EXPECT_EQ(format_errors(errors),
            "line 12: kvExactMode: 3: set mode: 4\nnot valid YAML\nname: missing\n");
}

TEST(RuleParse, DiscoveryMakesEndpointsOptionalAndItsUriIsChecked) {
  std::vector<FieldError> errors;
  auto r = rule_from_json(R"({"name":"d","discovery":"dns://workers.svc:8000"})", GatewayConfig{},
                          errors);
  ASSERT_TRUE(r) << (errors.empty() ? "" : errors[0].message);
  EXPECT_EQ(r->discovery, "dns://workers.svc:8000");
  EXPECT_TRUE(r->endpoints.empty());
  errors.clear();
  EXPECT_FALSE(rule_from_json(R"({"name":"d","discovery":"consul://x"})", GatewayConfig{}, errors));
  ASSERT_FALSE(errors.empty());
  EXPECT_EQ(errors[0].field, "discovery");
  EXPECT_NE(errors[0].message.find("etcd://HOST:PORT"), std::string::npos);
  errors.clear();
  EXPECT_FALSE(
      rule_from_json(R"({"name":"d","discovery":"etcd://host"})", GatewayConfig{}, errors));
  errors.clear();
  // Without discovery, endpoints are still required.
  EXPECT_FALSE(rule_from_json(R"({"name":"d"})", GatewayConfig{}, errors));
}

}  // namespace
}  // namespace kvgate::rules
