// Tests for policy/manual (sticky keys, assignment modes, failover and return, expiry) and
// policy/bucket (bands refitted to equal characters, imbalance override).
#include <gtest/gtest.h>

#include <map>

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
  PolicyConfig c;
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

TEST(Manual, AssignmentModes) {
  Pool pool(3);
  PolicyConfig c;
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
  PolicyConfig c;
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

TEST(Bucket, BandsRefitToEqualCharacters) {
  Pool pool(2);
  PolicyConfig c;
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
  PolicyConfig c;
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
