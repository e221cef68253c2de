// Tests for policy/cache_aware: the imbalance test at its exact edges, cache hits above the
// threshold, least-loaded random ties below it, insertion, the ground-truth correction, eviction
// and worker removal, the bound on model trees.
#include "policy/cache_aware.h"

#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <thread>

#include "gateway/knobs.h"
#include "unit/policy/policy_fixture.h"

namespace kvgate {
namespace {

using testing::Pool;
using testing::Req;

PolicyConfig config(uint64_t seed = 7) {
  PolicyConfig c = policy_config(GatewayConfig{});
  c.name = "cache_aware";
  c.seed = seed;
  return c;
}

Decision route(Policy& p, Pool& pool, const std::string& text) {
  Req r(text);
  Decision d = p.select(pool.ptrs, r.ctx);
  p.on_dispatched(d, r.ctx);
  return d;
}

TEST(CacheAware, ImbalanceEdgesAbs64Rel1_5) {
  Pool pool(2);
  auto p = testing::make(config(), pool);
  Worker* a = pool.ptrs[0];
  Worker* b = pool.ptrs[1];
  // Give b the cache so that, balanced, it would win.
  for (int i = 0; i < 3; ++i) {
    Req r("a long shared system prompt that b has seen many times before");
    p->on_dispatched(Decision{b, std::nullopt, "x", 0}, r.ctx);
  }
  auto pick = [&] {
    Req r("a long shared system prompt that b has seen many times before, and more");
    return p->select(pool.ptrs, r.ctx);
  };
  // Gap 64 (not > 64): balanced, the cache wins.
  pool.set_inflight(a, 0);
  pool.set_inflight(b, 64);
  EXPECT_EQ(pick().branch, "cache_hit");
  // Gap 65 and 65 > 0 * 1.5: imbalanced, least loaded.
  pool.set_inflight(b, 65);
  Decision d = pick();
  EXPECT_EQ(d.branch, "imbalanced");
  EXPECT_EQ(d.worker, a);
  // Gap 100 but ratio 200 / 100 = 2 > 1.5: imbalanced.
  pool.set_inflight(a, 100);
  pool.set_inflight(b, 200);
  EXPECT_EQ(pick().branch, "imbalanced");
  // Gap 100 but ratio 300 / 200 = 1.5 (not > 1.5): balanced.
  pool.set_inflight(a, 200);
  pool.set_inflight(b, 300);
  EXPECT_EQ(pick().branch, "cache_hit");
}

TEST(CacheAware, HitAboveThresholdMissBelow) {
  Pool pool(3);
  auto p = testing::make(config(), pool);
  Decision first =
      route(*p, pool, "You are a helpful assistant. User: what is the capital of France?");
  EXPECT_EQ(first.branch, "cache_miss_min_load");
  // Turn 2 of the same conversation: most of the text matches -> the same worker.
  Decision second = route(*p, pool,
                          "You are a helpful assistant. User: what is the capital of France? "
                          "Assistant: Paris. User: and Italy?");
  EXPECT_EQ(second.branch, "cache_hit");
  EXPECT_EQ(second.worker, first.worker);
  EXPECT_EQ(second.predicted_chars, 65u);
  // Match rate exactly at the threshold is not above it: 3 of 10 characters = 0.3.
  Pool pool2(2);
  auto q = testing::make(config(), pool2);
  route(*q, pool2, "abc");
  Req r("abcdefghij");
  EXPECT_EQ(q->select(pool2.ptrs, r.ctx).branch, "cache_miss_min_load");
  Req r2("abcdefghi");  // 3 / 9 > 0.3
  EXPECT_EQ(q->select(pool2.ptrs, r2.ctx).branch, "cache_hit");
}

TEST(CacheAware, MissTiesAreRandomNotAlwaysTheFirst) {
  Pool pool(4);
  auto p = testing::make(config(123), pool);
  std::map<Worker*, int> counts;
  for (int i = 0; i < 4000; ++i) {
    Req r("unique request " + std::to_string(i));
    counts[p->select(pool.ptrs, r.ctx).worker]++;  // not dispatched: loads stay equal
  }
  ASSERT_EQ(counts.size(), 4u);
  for (const auto& [w, n] : counts) {
    EXPECT_GT(n, 850) << w->url();
    EXPECT_LT(n, 1150) << w->url();
  }
}

TEST(CacheAware, MissPicksTheLeastLoaded) {
  Pool pool(3);
  auto p = testing::make(config(), pool);
  pool.set_inflight(pool.ptrs[0], 5);
  pool.set_inflight(pool.ptrs[1], 2);
  pool.set_inflight(pool.ptrs[2], 9);
  Req r("never seen");
  EXPECT_EQ(p->select(pool.ptrs, r.ctx).worker, pool.ptrs[1]);
}

TEST(CacheAware, OnlyAvailableWorkersCount) {
  Pool pool(2);
  auto p = testing::make(config(), pool);
  Decision d = route(*p, pool, "a conversation that lives on one worker only");
  Worker* other = d.worker == pool.ptrs[0] ? pool.ptrs[1] : pool.ptrs[0];
  Worker* only[] = {other};
  Req r("a conversation that lives on one worker only, continued");
  Decision e = p->select(only, r.ctx);
  EXPECT_EQ(e.worker, other);
  EXPECT_EQ(e.branch, "cache_miss_min_load");
}

TEST(CacheAware, GroundTruthCorrectsTheTree) {
  metrics::Registry reg;
  Pool pool(2);
  PolicyConfig c = config();
  c.registry = &reg;
  auto p = testing::make(c, pool);
  auto& ca = static_cast<CacheAwarePolicy&>(*p);
  std::string turn1(400, 'x');
  Decision d1 = route(*p, pool, turn1);
  std::string other = turn1 + std::string(400, 'o');
  route(*p, pool, other);  // another branch below turn1 on the same worker
  std::string turn2 = turn1 + std::string(400, 'y');
  Req r(turn2);
  Decision d2 = p->select(pool.ptrs, r.ctx);
  ASSERT_EQ(d2.worker, d1.worker);
  ASSERT_EQ(d2.predicted_chars, 400u);
  p->on_dispatched(d2, r.ctx);
  // The worker reports a miss: 0 of 200 prompt tokens cached (4 chars per token).
  p->on_completed(d2, r.ctx, Outcome{200, true, 0, 200});
  std::vector<prefix::Slot> slots{static_cast<prefix::Slot>(d1.worker->id())};
  std::vector<size_t> m(1);
  ca.tree("m")->match(other, slots, m);
  EXPECT_EQ(m[0], 400u) << "the stale branch below the lost prefix is gone (only the part "
                           "shared with the prompt just computed is held)";
  ca.tree("m")->match(turn2, slots, m);
  EXPECT_EQ(m[0], 800u) << "the prompt just computed is held again";
  std::string text = reg.expose();
  std::string url = d1.worker->url();
  EXPECT_NE(text.find("kvgate_prefix_predicted_tokens_total{rule=\"\",worker=\"" + url + "\"} 100"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("kvgate_prefix_cached_tokens_total{rule=\"\",worker=\"" + url + "\"} 0"),
            std::string::npos);
  EXPECT_NE(text.find("kvgate_prefix_tree_corrections_total{rule=\"\",worker=\"" + url + "\"} 1"),
            std::string::npos);
  // A report that matches the prediction corrects nothing.
  Req r3(turn2 + "z");
  Decision d3 = p->select(pool.ptrs, r3.ctx);
  p->on_completed(d3, r3.ctx, Outcome{200, true, 200, 201});
  EXPECT_NE(
      reg.expose().find("kvgate_prefix_tree_corrections_total{rule=\"\",worker=\"" + url + "\"} 1"),
      std::string::npos);
}

// The worker never ran the request (connect failure, 429/503/408, client gone while queued): the
// text recorded under it at dispatch is withdrawn back to what it held before, on every branch.
TEST(CacheAware, ClaimWithdrawnWhenTheWorkerDidNotRun) {
  Pool pool(2);
  auto p = testing::make(config(), pool);
  auto& ca = static_cast<CacheAwarePolicy&>(*p);
  auto held = [&](Worker* w, const std::string& text) {
    std::vector<prefix::Slot> slots{static_cast<prefix::Slot>(w->id())};
    std::vector<size_t> m(1);
    ca.tree("m")->match(text, slots, m);
    return m[0];
  };
  Outcome not_started{503, false, std::nullopt, std::nullopt, false};
  std::string turn1(400, 'x');
  Decision d1 = route(*p, pool, turn1);
  Worker* w = d1.worker;
  Worker* other = w == pool.ptrs[0] ? pool.ptrs[1] : pool.ptrs[0];

  // cache_hit: the tree believed the worker held turn1; after a 503 it holds turn1 again, no more.
  std::string turn2 = turn1 + std::string(400, 'y');
  Req r2(turn2);
  Decision d2 = p->select(pool.ptrs, r2.ctx);
  ASSERT_EQ(d2.branch, "cache_hit");
  ASSERT_EQ(d2.worker, w);
  p->on_dispatched(d2, r2.ctx);
  ASSERT_EQ(held(w, turn2), 800u);
  p->on_completed(d2, r2.ctx, not_started);
  EXPECT_EQ(held(w, turn2), 400u);
  EXPECT_EQ(held(w, turn1), 400u) << "what the worker held before the dispatch stays";

  // A request that started and failed keeps its claim (the worker may have computed it).
  Req r3(turn2);
  Decision d3 = p->select(pool.ptrs, r3.ctx);
  p->on_dispatched(d3, r3.ctx);
  p->on_completed(d3, r3.ctx, Outcome{500, false, std::nullopt, std::nullopt, true});
  EXPECT_EQ(held(w, turn2), 800u);

  // imbalanced: the least-loaded pick is the worker holding turn1; withdrawing the new text must
  // not take turn1 away with it.
  std::string turn3 = turn1 + std::string(400, 'z');
  pool.set_inflight(other, 100);
  Req r4(turn3);
  Decision d4 = p->select(pool.ptrs, r4.ctx);
  ASSERT_EQ(d4.branch, "imbalanced");
  ASSERT_EQ(d4.worker, w);
  EXPECT_EQ(d4.predicted_chars, 400u);
  p->on_dispatched(d4, r4.ctx);
  ASSERT_EQ(held(w, turn3), 800u);
  p->on_completed(d4, r4.ctx, not_started);
  EXPECT_EQ(held(w, turn3), 400u);
  EXPECT_EQ(held(w, turn2), 800u);
  pool.set_inflight(other, 0);

  // A first request to a worker that never ran it leaves nothing behind.
  std::string fresh(300, 'f');
  Req r5(fresh);
  Decision d5 = p->select(pool.ptrs, r5.ctx);
  ASSERT_EQ(d5.predicted_chars, 0u);
  p->on_dispatched(d5, r5.ctx);
  p->on_completed(d5, r5.ctx, not_started);
  EXPECT_EQ(held(d5.worker, fresh), 0u);
}

TEST(CacheAware, PeriodicEvictionAndWorkerRemoval) {
  Pool pool(2);
  PolicyConfig c = config();
  c.max_tree_size = 100;
  auto p = testing::make(c, pool);
  auto& ca = static_cast<CacheAwarePolicy&>(*p);
  for (int i = 0; i < 20; ++i)
    route(*p, pool, "text number " + std::to_string(i) + std::string(50, 'q'));
  p->on_period();
  for (Worker* w : pool.ptrs)
    EXPECT_LE(ca.tree("m")->chars_of(static_cast<prefix::Slot>(w->id())), 100u);
  Worker* gone = pool.ptrs[0];
  auto id = static_cast<prefix::Slot>(gone->id());
  pool.remove(gone);
  p->on_workers_changed(pool.set());
  EXPECT_EQ(ca.tree("m")->chars_of(id), 0u);
}

TEST(CacheAware, OneTreePerModel) {
  Pool pool(2);
  auto p = testing::make(config(), pool);
  Req a("same text", "model-a");
  Decision d = p->select(pool.ptrs, a.ctx);
  p->on_dispatched(d, a.ctx);
  Req b("same text", "model-b");
  EXPECT_EQ(p->select(pool.ptrs, b.ctx).branch, "cache_miss_min_load");
  Req a2("same text", "model-a");
  EXPECT_EQ(p->select(pool.ptrs, a2.ctx).branch, "cache_hit");
}

// At most --max-prefix-trees model trees: further models share the overflow tree (counted); trees
// left empty are removed at the next eviction, and a tree in use survives its removal.
TEST(CacheAware, ModelTreesAreBoundedAndEmptyOnesRemoved) {
  metrics::Registry reg;
  Pool pool(1);
  PolicyConfig c = config();
  c.max_prefix_trees = 2;
  c.registry = &reg;
  c.rule = "r";
  auto p = testing::make(c, pool);
  auto& ca = static_cast<CacheAwarePolicy&>(*p);
  auto dispatch = [&](const std::string& model) {
    Req r("the same prompt", model);
    Decision d = p->select(pool.ptrs, r.ctx);
    p->on_dispatched(d, r.ctx);
    return d;
  };
  auto exposed = [&](const std::string& line) {
    std::string text = reg.expose();
    return text.find("\n" + line + "\n") != std::string::npos;
  };
  dispatch("model-a");
  dispatch("model-b");
  EXPECT_EQ(ca.tree_count(), 2u);
  EXPECT_EQ(dispatch("model-c").branch, "cache_miss_min_load");
  EXPECT_EQ(dispatch("model-d").branch, "cache_hit") << "models past the bound share one tree";
  for (int i = 0; i < 100; ++i) dispatch("junk-" + std::to_string(i));
  EXPECT_EQ(ca.tree_count(), 2u);
  EXPECT_TRUE(exposed("kvgate_prefix_tree_overflow_total{rule=\"r\"} 102")) << reg.expose();
  EXPECT_TRUE(exposed("kvgate_prefix_trees{rule=\"r\"} 2")) << reg.expose();

  std::shared_ptr<prefix::ApproxTree> in_use = ca.tree("model-a");
  // The only worker leaves and another joins: every tree empties, the next eviction removes them.
  Worker* gone = pool.ptrs[0];
  pool.add(2);
  pool.remove(gone);
  p->on_workers_changed(pool.set());
  p->on_period();
  EXPECT_EQ(ca.tree_count(), 0u);
  EXPECT_TRUE(exposed("kvgate_prefix_trees{rule=\"r\"} 0")) << reg.expose();
  EXPECT_TRUE(in_use->empty());
  std::vector<prefix::Slot> slots{2};
  std::vector<size_t> m(1);
  EXPECT_EQ(in_use->match("the same prompt", slots, m), 15u);
  // Room again: the next model gets a tree of its own.
  dispatch("model-e");
  EXPECT_EQ(ca.tree_count(), 1u);
  EXPECT_TRUE(exposed("kvgate_prefix_tree_overflow_total{rule=\"r\"} 102")) << reg.expose();
}

// Request threads route, record and withdraw on more models than the bound while the control
// thread evicts and removes emptied trees (run under ASan in make test).
TEST(CacheAware, TreesRemovedWhileRequestsUseThem) {
  Pool pool(3);
  PolicyConfig c = config(0);
  c.max_prefix_trees = 4;
  auto p = testing::make(c, pool);
  auto& ca = static_cast<CacheAwarePolicy&>(*p);
  std::atomic<int> running{4};
  std::vector<std::thread> threads;
  threads.reserve(4);
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      for (int i = 0; i < 2000; ++i) {
        Req r("prompt " + std::to_string(i % 50), "model-" + std::to_string((i + k) % 8));
        Decision d = p->select(pool.ptrs, r.ctx);
        p->on_dispatched(d, r.ctx);
        p->on_completed(d, r.ctx, Outcome{503, false, std::nullopt, std::nullopt, false});
      }
      running.fetch_sub(1);
    });
  }
  while (running.load() > 0) {
    p->on_period();
    EXPECT_LE(ca.tree_count(), 4u);
  }
  for (auto& t : threads) t.join();
  EXPECT_LE(ca.tree_count(), 4u);
}

}  // namespace
}  // namespace kvgate
