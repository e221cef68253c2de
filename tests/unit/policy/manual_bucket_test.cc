// Tests for policy/manual (sticky keys, assignment modes, failover and return, expiry, the bound
// on keys) and policy/bucket (bands refitted to equal characters, imbalance override).
#include <gtest/gtest.h>

#include <map>

#include "gateway/knobs.h"
#include "policy/bucket.h"
#include "policy/manual.h"
#include "unit/policy/policy_fixture.h"

namespace kvgate {
namespace {

using testing::Pool;
using testing::Req;

Req& keyed(Req& r, const std::string& key) {
  r.headers = {{"x-smg-routing-key", key}};
  return r;
}

TEST(Manual, StickyKeysFailoverAndReturn) {
  Pool pool(3);
  PolicyConfig c = policy_config(GatewayConfig{});
  c.name = "manual";
  c.seed = 3;
  auto p = testing::make(c, pool);
  Req r;
  keyed(r, "session-1");
  Decision first = p->select(pool.ptrs, r.ctx);
  EXPECT_EQ(first.branch, "vacant");
  for (int i = 0; i < 5; ++i) {
    Decision d = p->select(pool.ptrs, r.ctx);
    EXPECT_EQ(d.worker, first.worker);
    EXPECT_EQ(d.branch, "occupied_hit");
  }
  std::vector<Worker*> without;
  for (Worker* w : pool.ptrs) {
    if (w != first.worker) without.push_back(w);
  }
  Decision failover = p->select(without, r.ctx);
  EXPECT_EQ(failover.branch, "occupied_miss");
  EXPECT_NE(failover.worker, first.worker);
  EXPECT_EQ(p->select(without, r.ctx).worker, failover.worker);  // sticks to the second
  EXPECT_EQ(p->select(pool.ptrs, r.ctx).worker, first.worker);   // and returns once it is back
  Req none;
  EXPECT_EQ(p->select(pool.ptrs, none.ctx).branch, "no_routing_key");
}

TEST(Manual, LongKeysAreHeldAsDigestsAndStaySticky) {
  // A 60 KiB key must not cost 60 KiB a key: long keys are held by a 128-bit digest.
  Pool pool(8);
  PolicyConfig c = policy_config(GatewayConfig{});
  c.name = "manual";
  c.seed = 5;
  auto p = testing::make(c, pool);
  std::map<std::string, Worker*> home;
  for (int k = 0; k < 16; ++k) {
    std::string key(60 * 1024, static_cast<char>('a' + k % 26));
    key += std::to_string(k);
    Req r;
    keyed(r, key);
    Decision first = p->select(pool.ptrs, r.ctx);
    EXPECT_EQ(first.branch, "vacant") << k;  // distinct long keys never collide
    home[key] = first.worker;
  }
  for (const auto& [key, w] : home) {
    Req r;
    keyed(r, key);
    Decision d = p->select(pool.ptrs, r.ctx);
    EXPECT_EQ(d.worker, w);
    EXPECT_EQ(d.branch, "occupied_hit");
  }
}

TEST(Manual, AssignmentModes) {
  Pool pool(3);
  PolicyConfig c = policy_config(GatewayConfig{});
  c.name = "manual";
  c.manual_assignment_mode = "min_load";
  auto p = testing::make(c, pool);
  pool.set_inflight(pool.ptrs[0], 3);
  pool.set_inflight(pool.ptrs[1], 1);
  pool.set_inflight(pool.ptrs[2], 2);
  Req r;
  EXPECT_EQ(p->select(pool.ptrs, keyed(r, "a").ctx).worker, pool.ptrs[1]);
  c.manual_assignment_mode = "min_group";
  auto g = testing::make(c, pool);
  std::map<Worker*, int> per;
  for (int i = 0; i < 30; ++i) {
    Req k;
    per[g->select(pool.ptrs, keyed(k, "key" + std::to_string(i)).ctx).worker]++;
  }
  for (Worker* w : pool.ptrs) EXPECT_EQ(per[w], 10);  // keys spread evenly by group size
}

TEST(Manual, IdleKeysExpire) {
  Pool pool(2);
  PolicyConfig c = policy_config(GatewayConfig{});
  c.name = "manual";
  c.max_idle_secs = 60;
  std::string err;
  auto p = std::make_unique<ManualPolicy>(c);
  Req r;
  p->select(pool.ptrs, keyed(r, "k").ctx);
  EXPECT_EQ(p->keys(), 1u);
  p->expire(Clock::now() + std::chrono::seconds(30));
  EXPECT_EQ(p->keys(), 1u);
  p->expire(Clock::now() + std::chrono::seconds(61));
  EXPECT_EQ(p->keys(), 0u);
}

// At most --max-routing-keys keys: a new key beyond that forgets the least recently used one
// (counted), whose next request is placed again as new.
TEST(Manual, KeysBeyondTheBoundEvictTheLeastRecentlyUsed) {
  metrics::Registry reg;
  Pool pool(3);
  PolicyConfig c = policy_config(GatewayConfig{});
  c.name = "manual";
  c.seed = 5;
  c.max_routing_keys = 3;
  c.registry = &reg;
  c.rule = "r";
  auto p = std::make_unique<ManualPolicy>(c);
  auto route = [&](const std::string& key) {
    Req r;
    return p->select(pool.ptrs, keyed(r, key).ctx);
  };
  auto exposed = [&](const std::string& line) {
    return reg.expose().find("\n" + line + "\n") != std::string::npos;
  };
  Worker* a = route("a").worker;
  route("b");
  route("c");
  EXPECT_EQ(route("a").branch, "occupied_hit");  // b is now the least recently used
  EXPECT_EQ(route("d").branch, "vacant");
  EXPECT_EQ(p->keys(), 3u);
  EXPECT_TRUE(exposed("kvgate_manual_routing_keys{rule=\"r\"} 3")) << reg.expose();
  EXPECT_TRUE(exposed("kvgate_manual_routing_keys_evicted_total{rule=\"r\",reason=\"capacity\"} 1"))
      << reg.expose();
  Decision again = route("a");
  EXPECT_EQ(again.branch, "occupied_hit");
  EXPECT_EQ(again.worker, a);
  EXPECT_EQ(route("c").branch, "occupied_hit");
  EXPECT_EQ(route("d").branch, "occupied_hit");
  EXPECT_EQ(route("b").branch, "vacant") << "b was forgotten";  // evicts a
  EXPECT_EQ(route("a").branch, "vacant");                       // evicts c
  EXPECT_EQ(p->keys(), 3u);
  for (int i = 0; i < 1000; ++i) route("flood-" + std::to_string(i));
  EXPECT_EQ(p->keys(), 3u);
  EXPECT_TRUE(
      exposed("kvgate_manual_routing_keys_evicted_total{rule=\"r\",reason=\"capacity\"} 1003"))
      << reg.expose();
  p->expire(Clock::now() + std::chrono::seconds(c.max_idle_secs + 1));
  EXPECT_EQ(p->keys(), 0u);
  EXPECT_TRUE(exposed("kvgate_manual_routing_keys{rule=\"r\"} 0")) << reg.expose();
  EXPECT_TRUE(exposed("kvgate_manual_routing_keys_evicted_total{rule=\"r\",reason=\"idle\"} 3"))
      << reg.expose();
}

// min_group counts the keys each worker holds; a forgotten key no longer counts.
TEST(Manual, EvictedKeysLeaveTheirGroup) {
  Pool pool(2);
  PolicyConfig c = policy_config(GatewayConfig{});
  c.name = "manual";
  c.seed = 9;
  c.manual_assignment_mode = "min_group";
  c.max_routing_keys = 2;
  auto p = std::make_unique<ManualPolicy>(c);
  auto route = [&](const std::string& key) {
    Req r;
    return p->select(pool.ptrs, keyed(r, key).ctx).worker;
  };
  Worker* first = route("k1");
  Worker* second = route("k2");
  ASSERT_NE(first, second);
  // k3 pushes out k1: the groups are then {k2} and {}, so k3 goes where k1 was.
  EXPECT_EQ(route("k3"), first);
  // k4 pushes out k2: k3 alone holds a worker, k4 takes the other.
  EXPECT_EQ(route("k4"), second);
}

TEST(Bucket, BandsRefitToEqualCharacters) {
  Pool pool(2);
  PolicyConfig c = policy_config(GatewayConfig{});
  c.name = "bucket";
  c.balance_abs_threshold = 1 << 30;  // no imbalance override in this test
  auto p = std::make_unique<BucketPolicy>(c);
  p->on_workers_changed(pool.set());
  EXPECT_EQ(p->boundaries(), std::vector<size_t>{2048});
  // 100 short requests (10 chars) and 10 long ones (100 chars): 1000 chars each side.
  for (int i = 0; i < 110; ++i) {
    Req r(std::string(i < 100 ? 10 : 100, 'x'));
    Decision d = p->select(pool.ptrs, r.ctx);
    p->on_dispatched(d, r.ctx);
  }
  p->refit(Clock::now());
  auto b = p->boundaries();
  ASSERT_EQ(b.size(), 1u);
  EXPECT_GT(b[0], 10u);
  EXPECT_LE(b[0], 100u);
  Req shortr(std::string(10, 'a')), longr(std::string(100, 'a'));
  EXPECT_EQ(p->select(pool.ptrs, shortr.ctx).worker, pool.ptrs[0]);
  EXPECT_EQ(p->select(pool.ptrs, longr.ctx).worker, pool.ptrs[1]);
}

TEST(Bucket, ImbalanceOverride) {
  Pool pool(2);
  PolicyConfig c = policy_config(GatewayConfig{});
  c.name = "bucket";
  c.balance_abs_threshold = 100;
  auto p = std::make_unique<BucketPolicy>(c);
  p->on_workers_changed(pool.set());
  // Everything short goes to worker 0's band until it is imbalanced (> 100 chars more, > 1.5x).
  int overrides = 0;
  for (int i = 0; i < 40; ++i) {
    Req r(std::string(10, 's'));
    Decision d = p->select(pool.ptrs, r.ctx);
    if (d.branch == "imbalanced") {
      ++overrides;
      EXPECT_EQ(d.worker, pool.ptrs[1]);
    }
    p->on_dispatched(d, r.ctx);
  }
  EXPECT_GT(overrides, 0);
}

}  // namespace
}  // namespace kvgate
