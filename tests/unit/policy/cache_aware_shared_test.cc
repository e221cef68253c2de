// Tests for cache_aware shared by replicas (PolicyConfig::replica): two policies standing for two
// kvgate replicas, each with its own (never started) replica::Sync whose queued records the test
// hands to the other, as NATS would. A follow-up turn asked of the replica that did not see the
// conversation goes where the first turn went; the same request is decided alike on both, ties
// included, and spread over workers across requests; a withdrawal travels as a retraction; fleet
// loads decide the least loaded.
#include <gtest/gtest.h>

#include <set>

#include "gateway/knobs.h"
#include "policy/cache_aware.h"
#include "replica/sync.h"
#include "unit/policy/policy_fixture.h"
#include "workers/availability.h"

namespace kvgate {
namespace {

using testing::Pool;
using testing::Req;

struct Replica {
  explicit Replica(const Pool& pool) : sync(sync_config(GatewayConfig{}), nullptr) {
    PolicyConfig c = policy_config(GatewayConfig{});
    c.name = "cache_aware";
    c.rule = "default";
    c.replica = &sync;
    policy = testing::make(c, pool);
    shared = dynamic_cast<CacheAwarePolicy*>(policy.get());
  }
  Decision route(Pool& pool, const std::string& text) {
    Req r(text);
    Decision d = policy->select(pool.ptrs, r.ctx);
    policy->on_dispatched(d, r.ctx);
    return d;
  }
  // Decides as of `after` from now (route-only's ?at=): by default once what was dispatched until
  // now counts on every replica (its origin + settle).
  Decision ask(Pool& pool, const std::string& text, std::chrono::microseconds after = settled()) {
    Req r(text);
    r.ctx.at_us = replica::Sync::now_us() + after.count();
    return policy->select(pool.ptrs, r.ctx);
  }
  Decision ask_at(Pool& pool, const std::string& text, int64_t at_us) {
    Req r(text);
    r.ctx.at_us = at_us;
    return policy->select(pool.ptrs, r.ctx);
  }
  static std::chrono::microseconds settled() {
    return replica::Sync(sync_config(GatewayConfig{}), nullptr).settle() +
           std::chrono::milliseconds(1);
  }
  // What this replica published, applied by `peer`.
  void deliver_to(Replica& peer) {
    for (const auto& r : sync.take_pending()) peer.shared->apply_peer(r);
  }
  replica::Sync sync;
  std::unique_ptr<Policy> policy;
  CacheAwarePolicy* shared = nullptr;
};

std::string conversation(int i) {
  // A system prompt all share (the first 64-byte chunk), then one of the user's own longer than
  // a chunk.
  return "You are a helpful assistant. Answer briefly and precisely. User " + std::to_string(i) +
         " asks: tell me about the history of the number " + std::to_string(i * 7919) +
         ", who used it first, and why.";
}

TEST(CacheAwareShared, AFollowUpOnAnotherReplicaGoesWhereItsConversationIs) {
  Pool pool(4);
  Replica a(pool), b(pool);
  ASSERT_TRUE(a.shared->shared());
  std::vector<Worker*> first(20);
  for (int i = 0; i < 20; ++i)
    first[static_cast<size_t>(i)] = a.route(pool, conversation(i)).worker;
  a.deliver_to(b);
  for (int i = 0; i < 20; ++i) {
    const std::string turn2 = conversation(i) + " Assistant: it is old. User: and then?";
    Decision d = b.ask(pool, turn2);
    EXPECT_EQ(d.branch, "cache_hit") << i;
    EXPECT_EQ(d.worker, first[static_cast<size_t>(i)]) << i;
    EXPECT_EQ(d.worker, a.ask(pool, turn2).worker) << i;
  }
  // Without the records, b would have decided on its own (some elsewhere).
  Replica c(pool);
  int elsewhere = 0;
  for (int i = 0; i < 20; ++i) {
    Decision d = c.ask(pool, conversation(i) + " Assistant: it is old. User: and then?");
    elsewhere += d.branch != "cache_hit";
  }
  EXPECT_EQ(elsewhere, 20);
}

TEST(CacheAwareShared, TiesAreBrokenAlikeOnEveryReplicaAndSpreadRequests) {
  Pool pool(4);
  Replica a(pool), b(pool);
  std::set<Worker*> used;
  for (int i = 0; i < 64; ++i) {
    Decision da = a.ask(pool, conversation(i));
    Decision db = b.ask(pool, conversation(i));
    EXPECT_EQ(da.worker, db.worker) << i;
    EXPECT_EQ(da.branch, "cache_miss_min_load");
    used.insert(da.worker);
  }
  EXPECT_EQ(used.size(), 4u);  // a hash, not always the first worker
}

TEST(CacheAwareShared, FleetLoadsDecideTheLeastLoaded) {
  Pool pool(2);
  Replica a(pool), b(pool);
  // Replica b's peers say worker 0 is busy: b's new conversations go to worker 1.
  pool.ptrs[0]->set_peer_inflight(5);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(b.ask(pool, conversation(i)).worker, pool.ptrs[1]);
  // The fleet load crosses the imbalance test: 70 in flight elsewhere on worker 0.
  pool.ptrs[0]->set_peer_inflight(70);
  a.route(pool, conversation(1));
  a.deliver_to(b);
  Decision d = b.ask(pool, conversation(1) + " more");
  EXPECT_EQ(d.branch, "imbalanced");
  EXPECT_EQ(d.worker, pool.ptrs[1]);
  pool.ptrs[0]->set_peer_inflight(0);
}

TEST(CacheAwareShared, WorkersWithinOneRequestOfTheLeastAreTiedAndTheHashPicks) {
  Pool pool(2);
  Replica a(pool);
  auto spread = [&] {
    std::set<Worker*> used;
    for (int i = 0; i < 32; ++i) used.insert(a.ask(pool, conversation(i)).worker);
    return used;
  };
  // One request apart: both take new conversations, by their hash.
  pool.ptrs[0]->set_peer_inflight(1);
  EXPECT_EQ(spread().size(), 2u);
  // Two apart: the less loaded only.
  pool.ptrs[0]->set_peer_inflight(2);
  EXPECT_EQ(spread(), std::set<Worker*>{pool.ptrs[1]});
  pool.ptrs[0]->set_peer_inflight(0);
}

TEST(CacheAwareShared, AWithdrawalIsPublishedAsTheRetractionOfItsRecord) {
  Pool pool(3);
  Replica a(pool), b(pool);
  const std::string text = conversation(3);
  Req r(text);
  Decision d = a.policy->select(pool.ptrs, r.ctx);
  ASSERT_NE(d.origin_us, 0);
  a.policy->on_dispatched(d, r.ctx);
  a.deliver_to(b);
  EXPECT_EQ(b.ask(pool, text + " again").branch, "cache_hit");
  // The worker never ran it (connect failure, 503...): both replicas forget it.
  a.policy->on_completed(d, r.ctx, Outcome{.status = 503, .ok = false, .started = false});
  a.deliver_to(b);
  EXPECT_EQ(a.ask(pool, text + " again").branch, "cache_miss_min_load");
  EXPECT_EQ(b.ask(pool, text + " again").branch, "cache_miss_min_load");
}

TEST(CacheAwareShared, RecordsOfAnotherChunkSizeOrRuleAreNotApplied) {
  Pool pool(2);
  Replica a(pool), b(pool);
  a.route(pool, conversation(1));
  auto records = a.sync.take_pending();
  ASSERT_EQ(records.size(), 1u);
  replica::ChainRecord other = records[0];
  other.chunk_bytes = 128;
  b.shared->apply_peer(other);
  EXPECT_EQ(b.ask(pool, conversation(1)).branch, "cache_miss_min_load");
  b.shared->apply_peer(records[0]);
  EXPECT_EQ(b.ask(pool, conversation(1)).branch, "cache_hit");
}

TEST(CacheAwareShared, ARecordCountsFromItsOriginPlusSettleOnEveryReplicaAlike) {
  Pool pool(4);
  Replica a(pool), b(pool);
  const std::string text = conversation(5);
  const Decision d = a.route(pool, text);
  a.deliver_to(b);
  const std::string turn2 = text + " Assistant: yes. User: and?";
  // Asked for the moment of the dispatch, neither replica counts it yet (the peers may not have
  // heard it): both decide as if it had not been sent, alike.
  const Decision early_a = a.ask_at(pool, turn2, d.origin_us);
  const Decision early_b = b.ask_at(pool, turn2, d.origin_us);
  EXPECT_EQ(early_a.branch, "cache_miss_min_load");
  EXPECT_EQ(early_a.worker, early_b.worker);
  EXPECT_EQ(early_a.branch, early_b.branch);
  // From its origin + settle on, both count it.
  EXPECT_EQ(a.ask(pool, turn2).worker, d.worker);
  EXPECT_EQ(b.ask(pool, turn2).worker, d.worker);
  EXPECT_EQ(b.ask(pool, turn2).branch, "cache_hit");
}

TEST(CacheAwareShared, LoadsAreWeighedAsOfTheMomentAsked) {
  Pool pool(2);
  Replica a(pool);
  const int64_t t0 = replica::Sync::now_us();
  // The peers' sum for worker 0 becomes 9 at t0 + 50 ms (a report's sending + settle).
  pool.ptrs[0]->set_peer_inflight(9, t0 + 50'000);
  Req after(conversation(1));
  after.ctx.at_us = t0 + 60'000;
  EXPECT_EQ(a.policy->select(pool.ptrs, after.ctx).worker, pool.ptrs[1]);
  // Before the change the request went where its hash sends it (worker 0 for some requests).
  int zero_before = 0;
  for (int i = 0; i < 16; ++i) {
    Req r(conversation(i));
    r.ctx.at_us = t0 + 10'000;
    zero_before += a.policy->select(pool.ptrs, r.ctx).worker == pool.ptrs[0];
  }
  EXPECT_GT(zero_before, 0);
  pool.ptrs[0]->set_peer_inflight(0);
}

TEST(FleetLoad, TheAvailabilityIndexCountsPeersInFlight) {
  Pool pool(3);
  auto set = std::make_shared<WorkerSet>(pool.set());
  for (Worker* w : pool.ptrs) w->set_healthy(true);
  AvailabilityIndex index(set);
  auto avail = index.current(Clock::now());
  pool.set_inflight(pool.ptrs[0], 2);
  pool.ptrs[1]->set_peer_inflight(40);
  pool.ptrs[2]->set_peer_inflight(1);
  auto s = index.inflight(avail->generation);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->min, 1);
  EXPECT_EQ(s->max, 40);
  EXPECT_EQ(s->total, 43);
  Worker* least = index.least_inflight(avail->generation, [](size_t) { return 0; });
  EXPECT_EQ(least, pool.ptrs[2]);
  pool.ptrs[1]->set_peer_inflight(0);
  pool.ptrs[2]->set_peer_inflight(0);
  s = index.inflight(avail->generation);
  EXPECT_EQ(s->min, 0);
  EXPECT_EQ(s->max, 2);
  EXPECT_EQ(pool.ptrs[0]->fleet_inflight(), 2);
  pool.set_inflight(pool.ptrs[0], 0);
}

}  // namespace
}  // namespace kvgate
