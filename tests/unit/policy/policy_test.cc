// Tests for the policies of the request path issue (round_robin, random, power_of_two) and the
// registry.
#include <gtest/gtest.h>

#include <map>

#include "gateway/knobs.h"
#include "policy/registry.h"

namespace kvgate {
namespace {

struct Pool {
  explicit Pool(int n) {
    for (int i = 0; i < n; ++i) {
      http::Target t;
      http::parse_url("http://127.0.0.1:" + std::to_string(40000 + i), t);
      owned.push_back(std::make_shared<Worker>(i + 1, t, breaker_config(GatewayConfig{})));
      ptrs.push_back(owned.back().get());
    }
  }
  std::vector<WorkerPtr> owned;
  std::vector<Worker*> ptrs;
};

std::unique_ptr<Policy> make(const std::string& name, uint64_t seed = 42) {
  PolicyConfig c = policy_config(GatewayConfig{});
  c.name = name;
  c.seed = seed;
  std::string err;
  auto p = make_policy(c, err);
  EXPECT_TRUE(p) << err;
  return p;
}

TEST(Registry, UnbuiltAndUnknownPoliciesAreClearErrors) {
  PolicyConfig c = policy_config(GatewayConfig{});
  std::string err;
  c.name = "kv_exact";
  EXPECT_FALSE(make_policy(c, err));
  EXPECT_NE(err.find("turned on by a rule's kvExactMode 3"), std::string::npos) << err;
  c.name = "fastest";
  EXPECT_FALSE(make_policy(c, err));
  EXPECT_NE(err.find("unknown policy 'fastest'"), std::string::npos) << err;
}

TEST(RoundRobin, SpreadsExactlyEvenly) {
  Pool pool(4);
  auto p = make("round_robin");
  RouteContext ctx;
  std::map<Worker*, int> counts;
  for (int i = 0; i < 400; ++i) counts[p->select(pool.ptrs, ctx).worker]++;
  for (auto* w : pool.ptrs) EXPECT_EQ(counts[w], 100);
  EXPECT_EQ(p->select(pool.ptrs, ctx).branch, "next");
}

TEST(Random, RoughlyUniformWithFixedSeed) {
  Pool pool(4);
  auto p = make("random", 7);
  RouteContext ctx;
  std::map<Worker*, int> counts;
  for (int i = 0; i < 8000; ++i) counts[p->select(pool.ptrs, ctx).worker]++;
  for (auto* w : pool.ptrs) {
    EXPECT_GT(counts[w], 1800);
    EXPECT_LT(counts[w], 2200);
  }
}

TEST(Random, SameSeedSameSequence) {
  Pool pool(5);
  auto a = make("random", 99), b = make("random", 99);
  RouteContext ctx;
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(a->select(pool.ptrs, ctx).worker, b->select(pool.ptrs, ctx).worker);
  }
}

TEST(PowerOfTwo, PicksTheLessLoadedOfTwo) {
  Pool pool(2);
  auto p = make("power_of_two");
  RouteContext ctx;
  pool.ptrs[0]->set_reported_load(10);
  pool.ptrs[1]->set_reported_load(3);
  for (int i = 0; i < 50; ++i) {
    Decision d = p->select(pool.ptrs, ctx);
    EXPECT_EQ(d.worker, pool.ptrs[1]);
    EXPECT_EQ(d.branch, "lower_load");
  }
  // In-flight requests count too: 3 reported + 8 in flight > 10.
  for (int i = 0; i < 8; ++i) pool.ptrs[1]->begin_request();
  EXPECT_EQ(p->select(pool.ptrs, ctx).worker, pool.ptrs[0]);
  EXPECT_TRUE(p->uses_reported_load());
}

TEST(PowerOfTwo, NeverPicksTheMostLoadedOfMany) {
  Pool pool(5);
  pool.ptrs[3]->set_reported_load(1000);
  auto p = make("power_of_two", 3);
  RouteContext ctx;
  for (int i = 0; i < 500; ++i) EXPECT_NE(p->select(pool.ptrs, ctx).worker, pool.ptrs[3]);
}

TEST(PowerOfTwo, SingleCandidate) {
  Pool pool(1);
  auto p = make("power_of_two");
  RouteContext ctx;
  EXPECT_EQ(p->select(pool.ptrs, ctx).branch, "only_candidate");
}

}  // namespace
}  // namespace kvgate
