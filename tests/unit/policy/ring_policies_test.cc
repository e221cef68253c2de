// Tests for the ring policies (consistent_hashing, chwbl, prefix_hash) and the ring itself: key
// stability when workers come and go, header priority, the CHWBL bound.
#include <gtest/gtest.h>

#include <map>

#include "gateway/knobs.h"
#include "policy/chwbl.h"
#include "prefix/hash_ring.h"
#include "unit/policy/policy_fixture.h"

namespace kvgate {
namespace {

using testing::Pool;
using testing::Req;

TEST(HashRing, AddingOneOfTenMovesAboutOneEleventh) {
  std::vector<std::string> ten, eleven;
  for (int i = 0; i < 10; ++i) ten.push_back("http://w" + std::to_string(i));
  eleven = ten;
  eleven.push_back("http://w10");
  for (int vnodes : {150, 256}) {
    prefix::HashRing a(ten, vnodes), b(eleven, vnodes);
    int moved = 0, to_new = 0;
    const int keys = 20000;
    for (int k = 0; k < keys; ++k) {
      uint64_t h = prefix::hash64("key-" + std::to_string(k));
      size_t x = a.owner(h), y = b.owner(h);
      if (x != y) {
        ++moved;
        if (y == 10) ++to_new;
      }
    }
    EXPECT_EQ(moved, to_new) << "keys only move to the new worker";
    double frac = static_cast<double>(moved) / keys;
    EXPECT_GT(frac, 1.0 / 11 * 0.7) << vnodes;
    EXPECT_LT(frac, 1.0 / 11 * 1.3) << vnodes;
  }
}

PolicyConfig cfg(const std::string& name) {
  PolicyConfig c = policy_config(GatewayConfig{});
  c.name = name;
  c.seed = 5;
  return c;
}

TEST(ConsistentHashing, HeaderPriorityAndStickiness) {
  Pool pool(4);
  auto p = testing::make(cfg("consistent_hashing"), pool);
  Req r;
  r.headers = {{"x-smg-routing-key", "user-42"}, {"authorization", "Bearer abc"}};
  Decision d = p->select(pool.ptrs, r.ctx);
  EXPECT_EQ(d.branch, "routing_key");
  for (int i = 0; i < 10; ++i) EXPECT_EQ(p->select(pool.ptrs, r.ctx).worker, d.worker);
  Req a;
  a.headers = {{"authorization", "Bearer abc"}};
  EXPECT_EQ(p->select(pool.ptrs, a.ctx).branch, "authorization");
  Req f;
  f.headers = {{"x-forwarded-for", "10.1.2.3"}};
  EXPECT_EQ(p->select(pool.ptrs, f.ctx).branch, "forwarded_for");
  Req c;
  c.headers = {{"cookie", "session=1"}};
  EXPECT_EQ(p->select(pool.ptrs, c.ctx).branch, "cookie");
  Req none;
  EXPECT_EQ(p->select(pool.ptrs, none.ctx).branch, "random");
}

TEST(ConsistentHashing, TargetWorkerIsStrict) {
  Pool pool(3);
  auto p = testing::make(cfg("consistent_hashing"), pool);
  Req r;
  r.headers = {{"x-smg-target-worker", "2"}};
  Decision d = p->select(pool.ptrs, r.ctx);
  EXPECT_EQ(d.worker, pool.ptrs[2]);
  Worker* two_only[] = {pool.ptrs[0], pool.ptrs[1]};
  Decision u = p->select(two_only, r.ctx);
  EXPECT_EQ(u.worker, nullptr);
  EXPECT_EQ(u.branch, "target_unavailable");
  Req bad;
  bad.headers = {{"x-smg-target-worker", "7"}};
  EXPECT_EQ(p->select(pool.ptrs, bad.ctx).branch, "target_invalid");
}

TEST(ConsistentHashing, UnavailableOwnerMovesOnlyItsKeys) {
  Pool pool(5);
  auto p = testing::make(cfg("consistent_hashing"), pool);
  std::map<std::string, Worker*> before;
  for (int k = 0; k < 2000; ++k) {
    Req r;
    r.headers = {{"x-smg-routing-key", "k" + std::to_string(k)}};
    before[r.headers[0].second] = p->select(pool.ptrs, r.ctx).worker;
  }
  std::vector<Worker*> without(pool.ptrs.begin() + 1, pool.ptrs.end());
  int moved = 0;
  for (const auto& [key, w] : before) {
    Req r;
    r.headers = {{"x-smg-routing-key", key}};
    Worker* now = p->select(without, r.ctx).worker;
    if (w != pool.ptrs[0]) {
      EXPECT_EQ(now, w) << key;
    } else {
      ++moved;
    }
  }
  EXPECT_GT(moved, 250);
}

TEST(Chwbl, SameKeySameWorkerWhileUnderTheBound) {
  Pool pool(4);
  auto p = testing::make(cfg("chwbl"), pool);
  Req r("long system prompt ...", "qwen");
  r.info.first_user_message = "What is the capital of France? Please answer briefly.";
  Decision d = p->select(pool.ptrs, r.ctx);
  EXPECT_EQ(d.branch, "owner");
  for (int i = 0; i < 5; ++i) EXPECT_EQ(p->select(pool.ptrs, r.ctx).worker, d.worker);
  // The key is the model + the first 100 characters: a different tail is the same key.
  Req r2("other text", "qwen");
  r2.info.first_user_message = r.info.first_user_message;
  EXPECT_EQ(p->select(pool.ptrs, r2.ctx).worker, d.worker);
}

TEST(Chwbl, BoundIsNeverExceeded) {
  for (double factor : {1.0, 1.25, 2.0}) {
    Pool pool(8);
    PolicyConfig c = cfg("chwbl");
    c.chwbl_load_factor = factor;
    auto p = testing::make(c, pool);
    // Every request has the same key (the worst case for hashing): the bound spreads them.
    for (int i = 0; i < 400; ++i) {
      Req r;
      r.headers = {{"x-smg-routing-key", "hot-key"}};
      int64_t total = 0;
      for (Worker* w : pool.ptrs) total += w->inflight();
      int64_t cap = ChwblPolicy::capacity(total, pool.ptrs.size(), factor);
      Decision d = p->select(pool.ptrs, r.ctx);
      ASSERT_NE(d.worker, nullptr);
      EXPECT_LT(d.worker->inflight(), cap) << "factor " << factor << " request " << i;
      d.worker->begin_request();
      // Now and then a request finishes somewhere, so loads move both ways.
      Worker* done = pool.ptrs[static_cast<size_t>(i) % pool.ptrs.size()];
      if (i % 3 == 2 && done->inflight() > 0) done->end_request();
    }
  }
}

TEST(Chwbl, AddingOneOfTenMovesAboutOneEleventh) {
  Pool pool(10);
  auto p = testing::make(cfg("chwbl"), pool);
  std::vector<Worker*> before;
  for (int k = 0; k < 3000; ++k) {
    Req r;
    r.headers = {{"x-smg-routing-key", "key" + std::to_string(k)}};
    before.push_back(p->select(pool.ptrs, r.ctx).worker);
  }
  Worker* added = pool.add(11);
  p->on_workers_changed(pool.set());
  int moved = 0;
  for (int k = 0; k < 3000; ++k) {
    Req r;
    r.headers = {{"x-smg-routing-key", "key" + std::to_string(k)}};
    Worker* now = p->select(pool.ptrs, r.ctx).worker;
    if (now != before[static_cast<size_t>(k)]) {
      ++moved;
      EXPECT_EQ(now, added);
    }
  }
  EXPECT_GT(moved, 3000 / 11 * 0.7);
  EXPECT_LT(moved, 3000 / 11 * 1.3);
}

TEST(PrefixHash, SamePrefixSameWorkerAndBoundedLoad) {
  Pool pool(4);
  PolicyConfig c = cfg("prefix_hash");
  c.prefix_token_count = 20;
  auto p = testing::make(c, pool);
  Req a("The same first twenty characters, then anything");
  Decision d = p->select(pool.ptrs, a.ctx);
  EXPECT_EQ(d.branch, "ring");
  Req b("The same first twenty characters, but another tail");
  EXPECT_EQ(p->select(pool.ptrs, b.ctx).worker, d.worker);
  // Overload the owner: total 10, n 4 -> bound (10 + 1) / 4 * 1.25 = 3.4.
  pool.set_inflight(d.worker, 10);
  Decision o = p->select(pool.ptrs, a.ctx);
  EXPECT_EQ(o.branch, "overloaded");
  EXPECT_NE(o.worker, d.worker);
  Req empty("");
  EXPECT_EQ(p->select(pool.ptrs, empty.ctx).branch, "no_text");
  // Only the hashed ids are asked of the tokenizer.
  ParseOptions opts = p->parse_options();
  EXPECT_TRUE(opts.want_tokens);
  EXPECT_EQ(opts.max_tokens, 20u);
}

}  // namespace
}  // namespace kvgate
