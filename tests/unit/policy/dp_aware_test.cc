// Tests for policy/dp_aware (--dp-aware): one target per (worker, rank) for the inner policy,
// decisions mapped back to the real worker and its rank, hooks balanced (also across rebuilds and
// for decisions whose target retired before dispatch), availability following the worker, the
// targets rebuilt when a worker says another dp_size, per-rank loads, and conversations kept on
// one (worker, rank) by the inner policies that keep them.
#include "policy/dp_aware.h"

#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <set>
#include <thread>

#include "gateway/knobs.h"
#include "unit/policy/policy_fixture.h"
#include "workers/health.h"

namespace kvgate {
namespace {

using testing::Pool;
using testing::Req;

PolicyConfig config(const std::string& inner, int64_t default_ranks = 1) {
  PolicyConfig c = policy_config(GatewayConfig{});
  c.name = inner;
  c.seed = 11;
  c.dp_aware = true;
  c.dp_default_ranks = default_ranks;
  return c;
}

std::unique_ptr<DpAwarePolicy> make_dp(const PolicyConfig& c, const Pool& pool) {
  std::string err;
  auto p = make_policy(c, err);
  EXPECT_TRUE(p) << err;
  auto* dp = dynamic_cast<DpAwarePolicy*>(p.get());
  EXPECT_TRUE(dp) << "--dp-aware did not wrap " << c.name;
  if (!dp) return nullptr;
  (void)p.release();
  std::unique_ptr<DpAwarePolicy> out(dp);
  out->on_workers_changed(pool.set());
  return out;
}

// An inner policy that records what it is offered and told, and picks a target by url.
class Recorder final : public Policy {
 public:
  std::string_view name() const override { return "recorder"; }
  Decision select(std::span<Worker* const> available, RouteContext&) override {
    std::lock_guard lock(mu);
    offered.clear();
    for (Worker* w : available) offered.push_back(w->url());
    for (Worker* w : available) {
      if (w->url() == want) return {w, std::nullopt, "wanted", 0};
    }
    return {available[next++ % available.size()], std::nullopt, "next", 0};
  }
  void on_dispatched(const Decision& d, RouteContext&) override {
    std::lock_guard lock(mu);
    ++open[d.worker->url()];
    ++dispatched;
  }
  void on_completed(const Decision& d, RouteContext&, const Outcome&) override {
    std::lock_guard lock(mu);
    --open[d.worker->url()];
    ++completed;
  }
  void on_workers_changed(const WorkerSet& set) override {
    std::lock_guard lock(mu);
    told.clear();
    for (const auto& w : set.workers) told.insert(w->url());
  }
  bool balanced() {
    std::lock_guard lock(mu);
    for (const auto& [url, n] : open) {
      if (n != 0) return false;
    }
    return dispatched == completed;
  }

  std::string want;  // the target to choose; else each in turn
  size_t next = 0;
  std::vector<std::string> offered;
  std::mutex mu;
  std::map<std::string, int> open;
  std::set<std::string> told;
  int64_t dispatched = 0, completed = 0;
};

struct Wrapped {
  explicit Wrapped(const Pool& pool, int64_t default_ranks = 1) {
    auto r = std::make_unique<Recorder>();
    rec = r.get();
    dp = std::make_unique<DpAwarePolicy>(config("round_robin", default_ranks), std::move(r));
    dp->on_workers_changed(pool.set());
  }
  Recorder* rec;
  std::unique_ptr<DpAwarePolicy> dp;
};

std::string at(const Worker* w, int rank) {
  return w->url() + "@" + std::to_string(rank);
}

TEST(DpAware, OneTargetPerRankFromServerInfoElseTheDefault) {
  Pool pool(2);
  pool.ptrs[0]->set_dp_size(4);  // as /server_info said
  Wrapped w(pool, 2);            // the other worker did not say: kvDpRankCount 2
  EXPECT_EQ(w.dp->ranks_of(1), 4);
  EXPECT_EQ(w.dp->ranks_of(2), 2);
  EXPECT_EQ(w.dp->targets(), 6u);
  EXPECT_EQ(w.rec->told.size(), 6u);
  EXPECT_TRUE(w.rec->told.contains(at(pool.ptrs[0], 3)));
  EXPECT_TRUE(w.rec->told.contains(at(pool.ptrs[1], 1)));
  EXPECT_TRUE(w.dp->wants_dp_size());
  EXPECT_EQ(w.dp->name(), "recorder");  // metrics and debug headers keep the policy's name
}

TEST(DpAware, DecisionIsTheRealWorkerWithTheRank) {
  Pool pool(2);
  pool.ptrs[1]->set_dp_size(2);
  Wrapped w(pool);
  w.rec->want = at(pool.ptrs[1], 1);
  Req r("hello");
  Decision d = w.dp->select(pool.ptrs, r.ctx);
  EXPECT_EQ(d.worker, pool.ptrs[1]);
  ASSERT_TRUE(d.dp_rank);
  EXPECT_EQ(*d.dp_rank, 1);
  EXPECT_EQ(d.branch, "wanted");
  EXPECT_NE(d.target_id, 0u);
  // The inner policy hears its own target; the target counts the request in flight.
  w.dp->on_dispatched(d, r.ctx);
  EXPECT_EQ(w.rec->open[at(pool.ptrs[1], 1)], 1);
  EXPECT_EQ(w.dp->target(2, 1)->inflight(), 1);
  EXPECT_EQ(w.dp->target(2, 0)->inflight(), 0);
  w.dp->on_completed(d, r.ctx, Outcome{.status = 200, .ok = true});
  EXPECT_EQ(w.dp->target(2, 1)->inflight(), 0);
  EXPECT_TRUE(w.rec->balanced());
}

TEST(DpAware, OnlyRanksOfAvailableWorkersAreOffered) {
  Pool pool(3);
  for (Worker* x : pool.ptrs) x->set_dp_size(2);
  Wrapped w(pool);
  Req r("x");
  // The gateway lists the available workers (healthy, breaker passing): the second is not.
  std::vector<Worker*> available = {pool.ptrs[0], pool.ptrs[2]};
  w.dp->select(available, r.ctx);
  std::set<std::string> offered(w.rec->offered.begin(), w.rec->offered.end());
  EXPECT_EQ(offered, (std::set<std::string>{at(pool.ptrs[0], 0), at(pool.ptrs[0], 1),
                                            at(pool.ptrs[2], 0), at(pool.ptrs[2], 1)}));
}

TEST(DpAware, RebuiltWhenAWorkerSaysAnotherDpSizeKeepingSurvivingRanks) {
  Pool pool(1);
  Worker* x = pool.ptrs[0];
  x->set_dp_size(2);
  Wrapped w(pool);
  WorkerPtr rank0 = w.dp->target(1, 0);
  // A request in flight on rank 1 when the worker restarts with one rank.
  w.rec->want = at(x, 1);
  Req r("a");
  Decision d = w.dp->select(pool.ptrs, r.ctx);
  w.dp->on_dispatched(d, r.ctx);
  x->set_dp_size(1);
  w.dp->on_period();
  EXPECT_EQ(w.dp->ranks_of(1), 1);
  EXPECT_EQ(w.dp->target(1, 0), rank0);  // the surviving rank keeps its target (and its tree)
  EXPECT_EQ(w.dp->draining(), 1u);       // rank 1 drains
  EXPECT_EQ(w.rec->told, (std::set<std::string>{at(x, 0)}));
  // Its completion still reaches the inner policy, with the same target.
  w.dp->on_completed(d, r.ctx, Outcome{.status = 200, .ok = true});
  EXPECT_TRUE(w.rec->balanced());
  w.dp->on_period();
  EXPECT_EQ(w.dp->draining(), 0u);
  // Growing again: a new target for rank 1 (never the retired one's identity).
  x->set_dp_size(3);
  w.dp->on_period();
  EXPECT_EQ(w.dp->ranks_of(1), 3);
  EXPECT_NE(w.dp->target(1, 1)->id(), d.target_id);
  // Nothing changed: nothing rebuilt.
  WorkerPtr rank2 = w.dp->target(1, 2);
  w.dp->on_period();
  EXPECT_EQ(w.dp->target(1, 2), rank2);
}

TEST(DpAware, ATargetRetiredBeforeItsDispatchIsHiddenFromTheInnerPolicy) {
  Pool pool(2);
  Wrapped w(pool);
  w.rec->want = at(pool.ptrs[1], 0);
  Req r("a");
  Decision d = w.dp->select(pool.ptrs, r.ctx);
  ASSERT_EQ(d.worker, pool.ptrs[1]);
  // The worker leaves the pool between the choice and the dispatch (the gateway keeps it alive).
  Pool rest(0);
  rest.owned.push_back(pool.owned[0]);
  w.dp->on_workers_changed(rest.set());
  w.dp->on_period();
  EXPECT_EQ(w.dp->draining(), 0u);
  w.dp->on_dispatched(d, r.ctx);
  w.dp->on_completed(d, r.ctx, Outcome{.status = 200, .ok = true});
  EXPECT_EQ(w.rec->dispatched, 0);
  EXPECT_TRUE(w.rec->balanced());
}

TEST(DpAware, WorkersItHasNotHeardOfAreSentWhole) {
  Pool pool(1);
  Wrapped w(pool);
  Pool other(1, 9);
  Req r("a");
  Decision d = w.dp->select(other.ptrs, r.ctx);
  EXPECT_EQ(d.worker, other.ptrs[0]);
  EXPECT_FALSE(d.dp_rank);
  EXPECT_EQ(d.branch, "dp_aware_unlisted");
  w.dp->on_dispatched(d, r.ctx);
  w.dp->on_completed(d, r.ctx, Outcome{});
  EXPECT_EQ(w.rec->dispatched, 0);
}

TEST(DpAware, RoundRobinSpreadsOverEveryRank) {
  Pool pool(2);
  pool.ptrs[0]->set_dp_size(3);
  pool.ptrs[1]->set_dp_size(1);
  auto p = make_dp(config("round_robin"), pool);
  std::map<std::pair<uint64_t, int>, int> counts;
  for (int i = 0; i < 400; ++i) {
    Req r;
    Decision d = p->select(pool.ptrs, r.ctx);
    counts[{d.worker->id(), d.dp_rank.value_or(-1)}]++;
  }
  EXPECT_EQ(counts, (std::map<std::pair<uint64_t, int>, int>{
                        {{1, 0}, 100}, {{1, 1}, 100}, {{1, 2}, 100}, {{2, 0}, 100}}));
}

TEST(DpAware, PowerOfTwoComparesRanksInFlightAndReportedLoads) {
  Pool pool(1);
  Worker* x = pool.ptrs[0];
  x->set_dp_size(2);
  auto p = make_dp(config("power_of_two"), pool);
  EXPECT_TRUE(p->uses_reported_load());
  // Rank 0 busy in flight: every choice goes to rank 1.
  Req busy("b");
  Decision held{x, 0, "held", 0, 0, p->target(1, 0)->id()};
  p->on_dispatched(held, busy.ctx);
  p->on_dispatched(held, busy.ctx);
  EXPECT_EQ(p->target(1, 0)->inflight(), 2);
  for (int i = 0; i < 50; ++i) {
    Req r;
    EXPECT_EQ(p->select(pool.ptrs, r.ctx).dp_rank, 1);
  }
  p->on_completed(held, busy.ctx, Outcome{.status = 200, .ok = true});
  p->on_completed(held, busy.ctx, Outcome{.status = 200, .ok = true});
  // Rank 1 reported busy on /get_load (per rank): every choice goes to rank 0.
  x->set_reported_load(30);
  x->set_rank_loads({0, 30});
  p->on_period();
  EXPECT_EQ(p->target(1, 1)->reported_load(), 30);
  for (int i = 0; i < 50; ++i) {
    Req r;
    EXPECT_EQ(p->select(pool.ptrs, r.ctx).dp_rank, 0);
  }
  // A report without ranks: each rank carries an even share.
  x->set_rank_loads({});
  p->on_period();
  EXPECT_EQ(p->target(1, 0)->reported_load(), 15);
  EXPECT_EQ(p->target(1, 1)->reported_load(), 15);
}

// Multi-turn conversations: each turn's text extends the previous one.
std::vector<std::string> conversation(int id, int turns) {
  std::vector<std::string> out;
  std::string text = "system: you are assistant number " + std::to_string(id * 7919) + ". ";
  for (int t = 0; t < turns; ++t) {
    text += "user " + std::to_string(id) + " turn " + std::to_string(t) +
            " asks something long enough to matter for the tree. assistant answers. ";
    out.push_back(text);
  }
  return out;
}

TEST(DpAware, CacheAwareKeepsEachConversationOnOneRank) {
  Pool pool(2);
  for (Worker* x : pool.ptrs) x->set_dp_size(2);
  auto p = make_dp(config("cache_aware"), pool);
  constexpr int kConversations = 16, kTurns = 5;
  std::map<int, std::set<std::pair<uint64_t, int>>> placed;
  std::set<std::pair<uint64_t, int>> used;
  for (int t = 0; t < kTurns; ++t) {
    // A turn of every conversation at once (in flight together: the first turns spread over the
    // least loaded targets).
    std::vector<std::unique_ptr<Req>> reqs;
    std::vector<Decision> ds;
    for (int c = 0; c < kConversations; ++c) {
      reqs.push_back(std::make_unique<Req>(conversation(c, kTurns)[static_cast<size_t>(t)]));
      Decision d = p->select(pool.ptrs, reqs.back()->ctx);
      ASSERT_TRUE(d.dp_rank);
      p->on_dispatched(d, reqs.back()->ctx);
      ds.push_back(d);
      placed[c].insert({d.worker->id(), *d.dp_rank});
      used.insert({d.worker->id(), *d.dp_rank});
    }
    for (size_t i = 0; i < ds.size(); ++i) {
      p->on_completed(ds[i], reqs[i]->ctx, Outcome{.status = 200, .ok = true});
    }
  }
  for (const auto& [c, targets] : placed) EXPECT_EQ(targets.size(), 1u) << "conversation " << c;
  EXPECT_EQ(used.size(), 4u);  // and the conversations spread over every (worker, rank)
}

TEST(DpAware, RoutingKeysStickToOneRank) {
  Pool pool(2);
  for (Worker* x : pool.ptrs) x->set_dp_size(4);
  for (const char* inner : {"manual", "consistent_hashing", "chwbl"}) {
    auto p = make_dp(config(inner), pool);
    for (int k = 0; k < 8; ++k) {
      std::set<std::pair<uint64_t, int>> seen;
      for (int i = 0; i < 5; ++i) {
        Req r("same first message " + std::to_string(k));
        r.headers.emplace_back("x-smg-routing-key", "user-" + std::to_string(k));
        Decision d = p->select(pool.ptrs, r.ctx);
        ASSERT_TRUE(d.dp_rank) << inner;
        p->on_dispatched(d, r.ctx);
        p->on_completed(d, r.ctx, Outcome{.status = 200, .ok = true});
        seen.insert({d.worker->id(), *d.dp_rank});
      }
      EXPECT_EQ(seen.size(), 1u) << inner << " key " << k;
    }
  }
}

TEST(DpAware, UnknownInnerPoliciesAreErrorsAndOffMeansUnwrapped) {
  std::string err;
  PolicyConfig c = config("fastest");
  EXPECT_FALSE(make_policy(c, err));
  EXPECT_NE(err.find("unknown policy 'fastest'"), std::string::npos) << err;
  c = config("round_robin");
  c.dp_aware = false;
  auto plain = make_policy(c, err);
  EXPECT_FALSE(dynamic_cast<DpAwarePolicy*>(plain.get()));
}

TEST(DpAware, ConcurrentRequestsAndRebuildsKeepHooksBalanced) {
  Pool pool(3);
  for (Worker* x : pool.ptrs) x->set_dp_size(2);
  auto rec_owned = std::make_unique<Recorder>();
  Recorder* rec = rec_owned.get();
  DpAwarePolicy dp(config("round_robin"), std::move(rec_owned));
  dp.on_workers_changed(pool.set());
  std::atomic<bool> stop{false};
  std::atomic<int> requests{0};
  std::vector<std::thread> threads;
  threads.reserve(3);
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&] {
      while (!stop.load()) {
        Req r("t");
        Decision d = dp.select(pool.ptrs, r.ctx);
        dp.on_dispatched(d, r.ctx);
        dp.on_completed(d, r.ctx, Outcome{.status = 200, .ok = true});
        requests.fetch_add(1);
      }
    });
  }
  // The control thread: dp sizes change, workers leave and come back; it goes on until the
  // request threads have run a while too (on a loaded machine they may start late).
  for (int i = 0; i < 300 || requests.load() < 300; ++i) {
    pool.ptrs[static_cast<size_t>(i) % 3]->set_dp_size(1 + i % 4);
    if (i % 50 == 25) {
      Pool some(0);
      some.owned = {pool.owned[0], pool.owned[2]};
      dp.on_workers_changed(some.set());
    } else if (i % 50 == 40) {
      dp.on_workers_changed(pool.set());
    }
    dp.on_period();
  }
  stop = true;
  for (auto& t : threads) t.join();
  EXPECT_TRUE(rec->balanced());
  EXPECT_GT(rec->dispatched, 0);
  dp.on_period();
  EXPECT_EQ(dp.draining(), 0u);
}

TEST(HealthParse, DpSizeFromServerInfo) {
  EXPECT_EQ(parse_dp_size(R"({"dp_size": 4, "tp_size": 1})"), 4);
  EXPECT_EQ(parse_dp_size(R"({"kv_events": {"publisher": "zmq", "dp_size": 2}})"), 2);
  EXPECT_EQ(parse_dp_size(R"({"dp_size": 1, "kv_events": {"dp_size": 2}})"), 1);
  EXPECT_FALSE(parse_dp_size(R"({"tp_size": 1})"));
  EXPECT_FALSE(parse_dp_size(R"({"dp_size": 0})"));
  EXPECT_FALSE(parse_dp_size(R"({"dp_size": 65})"));
  EXPECT_FALSE(parse_dp_size(R"({"dp_size": "2"})"));
  EXPECT_FALSE(parse_dp_size("not json"));
}

TEST(HealthParse, LoadReportPerRank) {
  std::vector<int64_t> ranks;
  EXPECT_EQ(parse_load_report(R"([{"dp_rank":1,"num_reqs":3,"num_waiting_reqs":2},
                                  {"dp_rank":0,"num_reqs":1,"num_waiting_reqs":0}])",
                              &ranks),
            6);
  EXPECT_EQ(ranks, (std::vector<int64_t>{1, 5}));
  EXPECT_EQ(
      parse_load_report(R"({"loads":[{"num_running_reqs":2},{"num_running_reqs":4}]})", &ranks), 6);
  EXPECT_EQ(ranks, (std::vector<int64_t>{2, 4}));  // by position when ranks are not said
  EXPECT_EQ(parse_load_report(R"({"load": 7})", &ranks), 7);
  EXPECT_TRUE(ranks.empty());
  // A rank past the bound is counted in the total, not kept per rank.
  EXPECT_EQ(parse_load_report(R"([{"dp_rank":1000,"num_reqs":3}])", &ranks), 3);
  EXPECT_TRUE(ranks.size() <= static_cast<size_t>(Worker::kMaxDpRanks));
}

}  // namespace
}  // namespace kvgate
