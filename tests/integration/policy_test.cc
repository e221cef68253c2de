// Integration: each routing policy through the real kvgate binary in front of kvgate-sim servers:
// the decision shows in x-kvgate-route / x-kvgate-worker (--debug-headers) and in the branch
// metric.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <map>
#include <set>

#include "support/chats.h"
#include "support/cluster.h"
#include "support/models.h"

namespace kvgate::testing {
namespace {

const std::vector<std::string> kSim = {"--ttft-ms", "1", "--tpot-ms", "1"};

std::vector<std::string> gateway(const std::string& policy) {
  return {"--policy",      policy, "--debug-headers", "--health-check-interval-secs", "60",
          "--policy-seed", "11"};
}

TEST(Policies, CacheAwareKeepsAConversationOnItsWorker) {
  Cluster c(4, kSim, gateway("cache_aware"));
  HttpClient client(c.port());
  std::map<int, std::string> home;
  for (int conv = 0; conv < 8; ++conv) {
    std::vector<std::string> turns;
    for (int t = 0; t < 4; ++t) {
      turns.push_back("conversation " + std::to_string(conv) + " turn " + std::to_string(t) +
                      " with enough words to make the shared history dominate the match rate");
      auto r = client.post("/v1/chat/completions", chat_body(turns));
      ASSERT_EQ(r.status, 200) << r.body;
      std::string worker = r.header("x-kvgate-worker");
      if (t == 0) {
        EXPECT_EQ(r.header("x-kvgate-route"), "cache_aware/cache_miss_min_load");
        home[conv] = worker;
      } else {
        EXPECT_EQ(r.header("x-kvgate-route"), "cache_aware/cache_hit") << "turn " << t;
        EXPECT_EQ(worker, home[conv]) << "conversation " << conv << " turn " << t;
      }
      turns.push_back("assistant reply " + std::to_string(t));
    }
  }
  std::set<std::string> homes;
  for (const auto& [conv, w] : home) homes.insert(w);
  EXPECT_GE(homes.size(), 3u) << "new conversations spread over the workers";
  EXPECT_EQ(c.metric("kvgate_policy_branch_total{policy=\"cache_aware\",branch=\"cache_hit\"}"),
            24);
}

TEST(Policies, RoutingKeyPoliciesAreSticky) {
  for (std::string policy : {"consistent_hashing", "manual", "chwbl"}) {
    Cluster c(3, kSim, gateway(policy));
    HttpClient client(c.port());
    std::map<std::string, std::string> placed;
    for (int round = 0; round < 3; ++round) {
      for (int k = 0; k < 6; ++k) {
        std::string key = "session-" + std::to_string(k);
        auto r = client.post("/generate", R"({"text":"hi","sampling_params":{"max_new_tokens":2}})",
                             {{"X-SMG-Routing-Key", key}});
        ASSERT_EQ(r.status, 200) << policy << " " << r.body;
        if (round == 0) {
          placed[key] = r.header("x-kvgate-worker");
        } else {
          EXPECT_EQ(r.header("x-kvgate-worker"), placed[key]) << policy << " " << key;
        }
      }
    }
  }
}

// The bounds on client-grown policy state reach the policies from the command line.
TEST(Policies, StateBoundsComeFromTheCommandLine) {
  {
    auto args = gateway("manual");
    args.insert(args.end(), {"--max-routing-keys", "2"});
    Cluster c(2, kSim, args);
    HttpClient client(c.port());
    for (const char* key : {"k1", "k2", "k3"}) {
      auto r = client.post("/generate", R"({"text":"hi","sampling_params":{"max_new_tokens":2}})",
                           {{"X-SMG-Routing-Key", key}});
      ASSERT_EQ(r.status, 200) << r.body;
    }
    EXPECT_EQ(c.metric("kvgate_manual_routing_keys{rule=\"default\"}"), 2);
    EXPECT_EQ(
        c.metric("kvgate_manual_routing_keys_evicted_total{rule=\"default\",reason=\"capacity\"}"),
        1);
  }
  {
    auto args = gateway("cache_aware");
    args.insert(args.end(), {"--max-prefix-trees", "1"});
    Cluster c(2, kSim, args);
    HttpClient client(c.port());
    for (const char* model : {"a", "b", "c"}) {
      auto r =
          client.post("/generate", std::string(R"({"model":")") + model +
                                       R"(","text":"hi","sampling_params":{"max_new_tokens":2}})");
      ASSERT_EQ(r.status, 200) << r.body;
    }
    EXPECT_EQ(c.metric("kvgate_prefix_trees{rule=\"default\"}"), 1);
    EXPECT_EQ(c.metric("kvgate_prefix_tree_overflow_total{rule=\"default\"}"), 2);
  }
}

TEST(Policies, TargetWorkerHeaderIsStrict) {
  auto args = gateway("consistent_hashing");
  args.push_back("--allow-target-worker-header");
  Cluster c(2, kSim, args);
  HttpClient client(c.port());
  auto r = client.post("/generate", R"({"text":"hi","sampling_params":{"max_new_tokens":2}})",
                       {{"X-SMG-Target-Worker", "1"}});
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.header("x-kvgate-worker"), c.sim(1).url());
  r = client.post("/generate", R"({"text":"hi"})", {{"X-SMG-Target-Worker", "9"}});
  EXPECT_EQ(r.status, 503);
  EXPECT_NE(r.body.find("X-SMG-Target-Worker"), std::string::npos) << r.body;
}

TEST(Policies, TargetWorkerHeaderIgnoredUnlessAllowed) {
  // A client cannot pin a worker unless the operator allows it: without the flag the header is
  // not seen by the policy (an invalid index does not even fail).
  Cluster c(2, kSim, gateway("consistent_hashing"));
  HttpClient client(c.port());
  auto r = client.post("/generate", R"({"text":"hi"})", {{"X-SMG-Target-Worker", "9"}});
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.header("x-kvgate-route"), "consistent_hashing/random") << r.body;
}

TEST(Policies, PrefixHashAndBucketServe) {
  for (std::string policy : {"prefix_hash", "bucket"}) {
    Cluster c(3, kSim, gateway(policy));
    HttpClient client(c.port());
    std::string worker;
    for (int i = 0; i < 5; ++i) {
      auto r = client.post(
          "/v1/completions",
          R"({"model":"kvgate-sim","prompt":"The same prompt every time","max_tokens":2})");
      ASSERT_EQ(r.status, 200) << policy;
      EXPECT_EQ(r.header("x-kvgate-route").rfind(policy + "/", 0), 0u);
      if (i == 0) worker = r.header("x-kvgate-worker");
      // prefix_hash keeps a prompt on its worker; bucket moves it once one worker's share of
      // characters is imbalanced (more than --balance-abs-threshold ahead).
      if (policy == "prefix_hash") {
        EXPECT_EQ(r.header("x-kvgate-worker"), worker);
      }
    }
  }
}

// Multi-turn chats through kvgate to 4 sims with their prefix caches: the hit rate the sims
// report (cached_tokens / prompt_tokens) under cache_aware is far above round_robin's. Seven
// conversations take turns (round_robin then moves each one to another worker every turn).
struct HitRate {
  double cached = 0;
  double prompt = 0;
  double rate() const { return prompt > 0 ? cached / prompt : 0; }
};

HitRate multiturn_hit_rate(const std::string& policy, const std::vector<std::string>& extra_gw,
                           const std::vector<std::string>& extra_sim) {
  std::vector<std::string> sim = {"--page-size", "16", "--enable-cache-report", "--time-scale",
                                  "0"};
  sim.insert(sim.end(), extra_sim.begin(), extra_sim.end());
  auto gw = gateway(policy);
  gw.insert(gw.end(), extra_gw.begin(), extra_gw.end());
  Cluster c(4, sim, gw);
  HttpClient client(c.port());
  const int kConversations = 7;
  const int kTurns = 4;
  std::vector<std::vector<std::string>> turns(kConversations);
  HitRate h;
  for (int t = 0; t < kTurns; ++t) {
    for (int conv = 0; conv < kConversations; ++conv) {
      std::string msg = turn_message(conv, t);
      turns[conv].push_back(msg);
      auto r = client.post("/v1/chat/completions", chat_body(turns[conv]));
      EXPECT_EQ(r.status, 200) << r.body;
      double cached = json_number_field(r.body, "cached_tokens");
      double prompt = json_number_field(r.body, "prompt_tokens");
      EXPECT_GT(prompt, 0) << r.body;
      h.cached += std::max(0.0, cached);
      h.prompt += std::max(0.0, prompt);
      turns[conv].push_back("reply " + std::to_string(t) + " of conversation " +
                            std::to_string(conv));
    }
  }
  return h;
}

TEST(Policies, CacheAwareHitRateFarAboveRoundRobin) {
  HitRate rr = multiturn_hit_rate("round_robin", {}, {});
  HitRate ca = multiturn_hit_rate("cache_aware", {}, {});
  std::cout << "hit rate: cache_aware " << ca.rate() << ", round_robin " << rr.rate() << "\n";
  // Perfect routing reuses every earlier turn: about 60% of these prompts' tokens.
  EXPECT_GT(ca.rate(), 0.5) << "cache_aware " << ca.rate() << " round_robin " << rr.rate();
  EXPECT_GT(ca.rate(), 3 * rr.rate())
      << "cache_aware " << ca.rate() << " round_robin " << rr.rate();
}

// The same with the model's real tokenizer and chat template on both sides (--tokenizer-path):
// kvgate's tree then holds the prompt exactly as the engines render it.
TEST(Policies, CacheAwareWithTheModelTokenizer) {
  KVGATE_REQUIRE_MODEL("qwen3");
  std::string dir = models_dir() + "/qwen3";
  HitRate rr = multiturn_hit_rate("round_robin", {}, {"--tokenizer-path", dir});
  HitRate ca =
      multiturn_hit_rate("cache_aware", {"--tokenizer-path", dir}, {"--tokenizer-path", dir});
  std::cout << "hit rate: cache_aware " << ca.rate() << ", round_robin " << rr.rate() << "\n";
  EXPECT_GT(ca.rate(), 0.5) << "cache_aware " << ca.rate() << " round_robin " << rr.rate();
  EXPECT_GT(ca.rate(), 3 * rr.rate())
      << "cache_aware " << ca.rate() << " round_robin " << rr.rate();
}

}  // namespace
}  // namespace kvgate::testing
