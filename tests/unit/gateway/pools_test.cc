// Tests of gateway/pools: resolving requests to rules, and applying rule changes (kept pools,
// workers taken over, retired pools, metric series removed, all-or-nothing failures), and the
// rules' history and rollback.
#include "gateway/pools.h"

#include <gtest/gtest.h>

#include "gateway/knobs.h"
#include "metrics/metrics.h"
#include "support/process.h"
#include "unit/gateway/pools_fixture.h"

namespace kvgate {
namespace {

using testing::make_rule;

class PoolsTest : public testing::PoolsFixture {
 protected:
  bool exposes(const std::string& text) {
    return registry_.expose().find(text) != std::string::npos;
  }
};

TEST_F(PoolsTest, ResolvesByModelThenCatchAllThenMostSpecific) {
  auto errors = pools_->apply({
      make_rule("llama", {"http://127.0.0.1:1"}, {"llama-3", "llama-3.1"}),
      make_rule("qwen", {"http://127.0.0.1:2"}, {"qwen3"}),
      make_rule("rest", {"http://127.0.0.1:3"}),
  });
  ASSERT_TRUE(errors.empty()) << rules::format_errors(errors);
  auto t = pools_->table();
  EXPECT_TRUE(t->needs_model(30000, "/v1/chat/completions"));
  EXPECT_EQ(t->resolve(30000, "/generate", "qwen3")->name(), "qwen");
  EXPECT_EQ(t->resolve(30000, "/generate", "llama-3.1")->name(), "llama");
  EXPECT_EQ(t->resolve(30000, "/generate", "mistral")->name(), "rest");
  EXPECT_EQ(t->resolve(30000, "/generate", "")->name(), "rest");

  // kvgate listens on one port: a rule naming another is refused (it would never be used).
  auto by_port = make_rule("port", {"http://127.0.0.1:4"});
  by_port.port = 30001;
  errors = pools_->apply({by_port});
  ASSERT_FALSE(errors.empty());
  EXPECT_NE(rules::format_errors(errors).find("listens for inference on one port (--port 30000)"),
            std::string::npos)
      << rules::format_errors(errors);
  cfg_.port = 30001;  // the table itself resolves by port (requests from 30000 are not its)
  auto by_path = make_rule("path", {"http://127.0.0.1:5"});
  by_path.path_prefix = "/v1/";
  errors =
      pools_->apply({make_rule("only-qwen", {"http://127.0.0.1:2"}, {"qwen3"}), by_port, by_path});
  ASSERT_TRUE(errors.empty()) << rules::format_errors(errors);
  t = pools_->table();
  EXPECT_EQ(t->resolve(30001, "/v1/completions", "x")->name(), "port");
  EXPECT_EQ(t->resolve(30000, "/v1/completions", "x")->name(), "path");
  EXPECT_EQ(t->resolve(30000, "/generate", "x"), nullptr);
  EXPECT_EQ(t->resolve(30000, "/generate", "qwen3")->name(), "only-qwen");
}

TEST_F(PoolsTest, WithoutModelsNoBodyIsNeeded) {
  ASSERT_TRUE(pools_->apply({make_rule("default", {"http://127.0.0.1:1"})}).empty());
  EXPECT_FALSE(pools_->table()->needs_model(0, "/generate"));
}

TEST_F(PoolsTest, UnchangedRuleKeepsItsPoolChangedRuleTakesOverItsWorkers) {
  ASSERT_TRUE(pools_
                  ->apply({make_rule("a", {"http://127.0.0.1:1", "http://127.0.0.1:2"}, {"m"}),
                           make_rule("b", {"http://127.0.0.1:3"})})
                  .empty());
  auto before = pools_->table();
  auto a0 = before->pools[0];
  auto b0 = before->pools[1];
  WorkerPtr kept = a0->workers()->workers[1];
  kept->set_healthy(true);

  ASSERT_TRUE(pools_
                  ->apply({make_rule("a", {"http://127.0.0.1:2", "http://127.0.0.1:4"}, {"m"}),
                           make_rule("b", {"http://127.0.0.1:3"})})
                  .empty());
  auto after = pools_->table();
  EXPECT_NE(after->pools[0], a0);  // changed: a new pool
  EXPECT_EQ(after->pools[1], b0);  // unchanged: the same pool
  // The worker both versions of rule a list is the same object: health carries on.
  EXPECT_EQ(after->pools[0]->workers()->workers[0], kept);
  EXPECT_TRUE(after->pools[0]->workers()->workers[0]->healthy());
  EXPECT_NE(after->pools[0]->workers()->workers[1]->id(), kept->id());
}

TEST_F(PoolsTest, RetiredPoolLivesWhileARequestHoldsItThenItsWorkersSeriesGo) {
  ASSERT_TRUE(pools_->apply({make_rule("a", {"http://127.0.0.1:1"})}).empty());
  auto pinned = pools_->table()->resolve(0, "/generate", "");  // a request in flight
  pinned->workers()->workers[0]->set_healthy(true);
  EXPECT_TRUE(exposes("kvgate_worker_health{worker=\"http://127.0.0.1:1\"} 1"));

  ASSERT_TRUE(pools_->apply({make_rule("b", {"http://127.0.0.1:2"})}).empty());
  EXPECT_EQ(pools_->table()->find("a"), nullptr);
  EXPECT_EQ(pools_->retiring(), 1u);
  // The request still routes with its pool and its worker's cells.
  pinned->workers()->workers[0]->begin_request();
  pinned->workers()->workers[0]->end_request();
  EXPECT_TRUE(exposes("worker=\"http://127.0.0.1:1\""));

  pinned.reset();  // the request completes
  EXPECT_EQ(pools_->retire(), 0u);
  // Kept a while for a rule that takes the worker back; then its series go.
  EXPECT_TRUE(exposes("worker=\"http://127.0.0.1:1\""));
  pools_->set_recent_workers_ttl(std::chrono::milliseconds(0));
  pools_->retire();
  EXPECT_FALSE(exposes("worker=\"http://127.0.0.1:1\""));
  EXPECT_TRUE(exposes("worker=\"http://127.0.0.1:2\""));
}

TEST_F(PoolsTest, SignalCellsAreMadeOnFirstUseAndGoWithTheWorkerAndTheRule) {
  ASSERT_TRUE(pools_->apply({make_rule("a", {"http://127.0.0.1:1"})}).empty());
  auto pool = pools_->table()->pools[0];
  const Worker& w = *pool->workers()->workers[0];
  EXPECT_FALSE(exposes("kvgate_time_to_first_token_seconds_count{"));  // none until used
  const SignalCells* none = pool->signals(w, std::nullopt);
  const SignalCells* rank2 = pool->signals(w, 2);
  ASSERT_NE(none, nullptr);
  ASSERT_NE(rank2, nullptr);
  EXPECT_NE(none, rank2);
  EXPECT_EQ(pool->signals(w, 2), rank2);   // made once
  EXPECT_EQ(pool->signals(w, 999), none);  // a rank past the bound: unranked
  rank2->first_token->observe(0.1);
  pool->connect_time(w)->observe(0.001);
  pool->queue_time().observe(0);
  EXPECT_TRUE(
      exposes("kvgate_time_to_first_token_seconds_count{rule=\"a\",worker=\"http://"
              "127.0.0.1:1\",rank=\"2\"} 1"));
  EXPECT_TRUE(
      exposes("kvgate_time_to_first_token_seconds_count{rule=\"a\",worker=\"http://"
              "127.0.0.1:1\",rank=\"\"} 0"));
  EXPECT_TRUE(
      exposes("kvgate_upstream_connect_seconds_count{rule=\"a\",worker=\"http://"
              "127.0.0.1:1\"} 1"));
  EXPECT_TRUE(exposes("kvgate_admission_queue_seconds_count{rule=\"a\"} 1"));
  // A worker the pool does not have has no cells.
  Worker stranger(999, http::Target{}, BreakerConfig{});
  EXPECT_EQ(pool->signals(stranger, std::nullopt), nullptr);
  EXPECT_EQ(pool->connect_time(stranger), nullptr);
  // The rule deleted, its last request done: the series go (the worker's, and the rule's).
  pool.reset();
  ASSERT_TRUE(pools_->remove("a"));
  pools_->set_recent_workers_ttl(std::chrono::milliseconds(0));
  EXPECT_EQ(pools_->retire(), 0u);
  EXPECT_FALSE(exposes("rule=\"a\""));
}

TEST_F(PoolsTest, ARuleDeletedAndCreatedAgainTakesItsWorkersBack) {
  ASSERT_TRUE(pools_->apply({make_rule("a", {"http://127.0.0.1:1"})}).empty());
  WorkerPtr w = pools_->table()->pools[0]->workers()->workers[0];
  w->set_healthy(true);
  ASSERT_TRUE(pools_->remove("a"));
  EXPECT_EQ(pools_->retire(), 0u);  // destroyed: no request held it
  ASSERT_TRUE(pools_->apply({make_rule("a", {"http://127.0.0.1:1"})}).empty());
  auto again = pools_->table()->pools[0]->workers()->workers[0];
  EXPECT_EQ(again, w);
  EXPECT_TRUE(again->healthy());  // no wait for a first probe
}

TEST_F(PoolsTest, TwoRulesListingOneServerShareItsWorker) {
  ASSERT_TRUE(pools_
                  ->apply({make_rule("a", {"http://127.0.0.1:1"}, {"m1"}),
                           make_rule("b", {"http://127.0.0.1:1"}, {"m2"})})
                  .empty());
  auto t = pools_->table();
  EXPECT_EQ(t->pools[0]->workers()->workers[0], t->pools[1]->workers()->workers[0]);
}

TEST_F(PoolsTest, AUrlStillInAnotherPoolKeepsItsSeries) {
  ASSERT_TRUE(pools_
                  ->apply({make_rule("a", {"http://127.0.0.1:1"}, {"m1"}),
                           make_rule("b", {"http://127.0.0.1:1"}, {"m2"})})
                  .empty());
  ASSERT_TRUE(pools_->remove("a"));
  pools_->set_recent_workers_ttl(std::chrono::milliseconds(0));
  EXPECT_EQ(pools_->retire(), 0u);
  EXPECT_TRUE(exposes("kvgate_worker_health{worker=\"http://127.0.0.1:1\"}"));
}

TEST_F(PoolsTest, AFailedApplyChangesNothing) {
  ASSERT_TRUE(pools_->apply({make_rule("a", {"http://127.0.0.1:1"})}).empty());
  auto before = pools_->table();
  // Valid, but its second endpoint cannot be resolved: the build fails after making a worker
  // for the first.
  auto bad = make_rule("b", {"http://127.0.0.1:2", "http://no-such-host.invalid:1"}, {"m"});
  auto errors = pools_->apply({make_rule("a", {"http://127.0.0.1:1"}), bad});
  ASSERT_FALSE(errors.empty());
  EXPECT_NE(rules::format_errors(errors).find("rules[b]"), std::string::npos)
      << rules::format_errors(errors);
  EXPECT_EQ(pools_->table(), before);
  // The worker the failed build made has no series left behind.
  EXPECT_FALSE(exposes("worker=\"http://127.0.0.1:2\""));
  // A dry run builds (and fails) the same way, and changes nothing either.
  EXPECT_FALSE(pools_->apply({make_rule("a", {"http://127.0.0.1:1"}), bad}, true).empty());
  EXPECT_TRUE(pools_
                  ->apply({make_rule("a", {"http://127.0.0.1:1"}),
                           make_rule("c", {"http://127.0.0.1:3"}, {"m"})},
                          true)
                  .empty());
  EXPECT_EQ(pools_->table(), before);
  EXPECT_FALSE(exposes("worker=\"http://127.0.0.1:3\""));

  auto engine = make_rule("a", {"http://127.0.0.1:1"});
  engine.kv_engine_type = rules::EngineType::kSglang;
  errors = pools_->apply({engine});
  ASSERT_FALSE(errors.empty());
  EXPECT_NE(rules::format_errors(errors).find("kvEngineType"), std::string::npos);
  EXPECT_EQ(pools_->table(), before);
}

TEST_F(PoolsTest, ChangingOnlyEndpointsKeepsWhatThePolicyLearned) {
  auto r = make_rule("a", {"http://127.0.0.1:1"});
  r.sel = "cache_aware";
  ASSERT_TRUE(pools_->apply({r}).empty());
  Policy* learned = &pools_->table()->pools[0]->policy();
  r.endpoints.push_back({.url = "http://127.0.0.1:2"});  // scaling out
  ASSERT_TRUE(pools_->apply({r}).empty());
  EXPECT_EQ(&pools_->table()->pools[0]->policy(), learned);
  r.policy_knobs.cache_threshold = 0.5;  // a policy knob: a new policy
  ASSERT_TRUE(pools_->apply({r}).empty());
  EXPECT_NE(&pools_->table()->pools[0]->policy(), learned);
}

// Hears of workers; routes to the first.
class CountingPolicy : public Policy {
 public:
  std::string_view name() const override { return "counting"; }
  Decision select(std::span<Worker* const> available, RouteContext&) override {
    return {.worker = available[0], .branch = "first"};
  }
  void on_workers_changed(const WorkerSet& set) override {
    ++calls;
    workers = set.workers.size();
  }
  int calls = 0;
  size_t workers = 0;
};

TEST_F(PoolsTest, ARefusedChangeLeavesTheServingPolicyUntouched) {
  CountingPolicy* made = nullptr;
  pools_->set_policy_override("a", [&] {
    auto p = std::make_unique<CountingPolicy>();
    made = p.get();
    return p;
  });
  ASSERT_TRUE(
      pools_->apply({make_rule("a", {"http://127.0.0.1:1", "http://127.0.0.1:2"})}).empty());
  CountingPolicy* serving = made;
  ASSERT_NE(serving, nullptr);
  EXPECT_EQ(serving->workers, 2u);
  int calls = serving->calls;
  // Scaling rule a in, together with a rule that cannot be built: refused as a whole, and the
  // policy serving a has heard nothing of the worker it would have lost.
  auto bad = make_rule("b", {"http://no-such-host.invalid:1"}, {"m"});
  ASSERT_FALSE(pools_->apply({make_rule("a", {"http://127.0.0.1:1"}), bad}).empty());
  EXPECT_EQ(serving->calls, calls);
  EXPECT_EQ(serving->workers, 2u);
  // Accepted alone: the same policy carries on, and hears of its one worker.
  ASSERT_TRUE(pools_->apply({make_rule("a", {"http://127.0.0.1:1"})}).empty());
  EXPECT_EQ(&pools_->table()->pools[0]->policy(), serving);
  EXPECT_EQ(serving->workers, 1u);
}

TEST_F(PoolsTest, AWorkerTakenBackAndRetiredAgainIsKeptAnotherWhile) {
  const std::string url = "http://127.0.0.1:1";
  ASSERT_TRUE(pools_->apply({make_rule("a", {url})}).empty());
  WorkerPtr first = pools_->table()->pools[0]->workers()->workers[0];
  ASSERT_TRUE(pools_->apply({}).empty());  // deleted: retired at once (no request holds it)
  auto since = pools_->recent_since(url);
  ASSERT_TRUE(since);
  ASSERT_TRUE(pools_->apply({make_rule("a", {url})}).empty());
  EXPECT_EQ(pools_->table()->pools[0]->workers()->workers[0], first);  // taken back
  ASSERT_TRUE(testing::wait_until([&] { return Clock::now() > *since; }));
  ASSERT_TRUE(pools_->apply({}).empty());  // deleted again: kept a full while from now
  auto again = pools_->recent_since(url);
  ASSERT_TRUE(again);
  EXPECT_GT(*again, *since);
}

TEST_F(PoolsTest, PolicySeriesCarryTheirRuleAndGoWithIt) {
  auto a = make_rule("a", {"http://127.0.0.1:1"});
  auto b = make_rule("b", {"http://127.0.0.1:2"}, {"m"});
  a.sel = b.sel = "manual";  // registers kvgate_manual_routing_keys{rule} when built
  ASSERT_TRUE(pools_->apply({a, b}).empty());
  EXPECT_TRUE(exposes("kvgate_manual_routing_keys{rule=\"a\"} 0"));
  EXPECT_TRUE(exposes("kvgate_manual_routing_keys{rule=\"b\"} 0"));
  // A dry run, and a refused change, leave no series of the rules they did not make.
  auto c = make_rule("c", {"http://127.0.0.1:3"}, {"n"});
  c.sel = "manual";
  ASSERT_TRUE(pools_->apply({a, b, c}, true).empty());
  auto bad = make_rule("d", {"http://no-such-host.invalid:1"}, {"o"});
  ASSERT_FALSE(pools_->apply({a, b, c, bad}).empty());
  EXPECT_FALSE(exposes("rule=\"c\""));
  // A deleted rule's series go with its last pool; the other rule's stay.
  ASSERT_TRUE(pools_->apply({a}).empty());
  EXPECT_FALSE(exposes("rule=\"b\""));
  EXPECT_TRUE(exposes("kvgate_manual_routing_keys{rule=\"a\"} 0"));
}

TEST_F(PoolsTest, PrefillDecodePoolHasAPolicyPerSideKeptWhenOnlyEndpointsChange) {
  auto pd = make_rule("pd", {"http://127.0.0.1:1", "http://127.0.0.1:2"});
  pd.kv_engine_type = rules::EngineType::kSglang;
  pd.sel = "cache_aware";
  pd.policy_knobs.decode_policy = "power_of_two";
  pd.endpoints[0].role = rules::Role::kPrefill;
  pd.endpoints[0].bootstrap_port = 9000;
  pd.endpoints[1].role = rules::Role::kDecode;
  ASSERT_TRUE(pools_->apply({pd}).empty());
  auto pool = pools_->table()->pools[0];
  ASSERT_TRUE(pool->pd());
  EXPECT_EQ(pool->policy().name(), "cache_aware");
  EXPECT_EQ(pool->decode_policy().name(), "power_of_two");
  const auto& ws = pool->workers()->workers;
  ASSERT_EQ(ws.size(), 2u);
  EXPECT_EQ(pool->role(*ws[0]), rules::Role::kPrefill);
  EXPECT_EQ(pool->role(*ws[1]), rules::Role::kDecode);
  EXPECT_EQ(pool->bootstrap_port(*ws[0]), 9000);
  EXPECT_EQ(pool->worker_ptr(*ws[1]), ws[1]);
  EXPECT_TRUE(exposes("kvgate_worker_role{worker=\"http://127.0.0.1:1\",role=\"prefill\"} 1"));
  EXPECT_TRUE(exposes("kvgate_worker_role{worker=\"http://127.0.0.1:2\",role=\"decode\"} 1"));
  Policy* prefill = &pool->policy();
  Policy* decode = &pool->decode_policy();
  // Scaling out the decode side keeps what both policies learned.
  pd.endpoints.push_back({.url = "http://127.0.0.1:3", .role = rules::Role::kDecode});
  ASSERT_TRUE(pools_->apply({pd}).empty());
  pool = pools_->table()->pools[0];
  EXPECT_EQ(&pool->policy(), prefill);
  EXPECT_EQ(&pool->decode_policy(), decode);
  EXPECT_EQ(pool->bootstrap_port(*pool->workers()->workers[0]), 9000);
  // The rule's bootstrap port stands for a prefill endpoint without one (0: SGLang's 8998).
  pd.endpoints[0].bootstrap_port.reset();
  ASSERT_TRUE(pools_->apply({pd}).empty());
  pool = pools_->table()->pools[0];
  EXPECT_EQ(pool->bootstrap_port(*pool->workers()->workers[0]), rules::kDefaultBootstrapPort);
  // The same server made a decode server: its role series follows.
  pd.endpoints[0].role = rules::Role::kDecode;
  pd.endpoints[1].role = rules::Role::kPrefill;
  ASSERT_TRUE(pools_->apply({pd}).empty());
  EXPECT_TRUE(exposes("kvgate_worker_role{worker=\"http://127.0.0.1:1\",role=\"decode\"} 1"));
  EXPECT_FALSE(exposes("kvgate_worker_role{worker=\"http://127.0.0.1:1\",role=\"prefill\"}"));
}

// The versions of `name` as "version:source:rule-or-absent[:restored]" strings, oldest first.
std::vector<std::string> versions(const PoolManager& pools, std::string_view name) {
  std::vector<std::string> out;
  auto h = pools.history(name);
  if (!h) return out;
  for (const auto& v : h->versions) {
    std::string s = std::to_string(v.version) + ":" + std::string(to_string(v.source)) + ":" +
                    (v.rule ? v.rule->sel : "absent");
    if (v.restored) s += ":" + std::to_string(*v.restored);
    out.push_back(std::move(s));
  }
  return out;
}

rules::Rule with_sel(rules::Rule r, std::string sel) {
  r.sel = sel;
  r.policy_knobs.policy = std::move(sel);
  return r;
}

using V = std::vector<std::string>;

TEST_F(PoolsTest, HistoryRecordsEachChangeButNotIdenticalDryRunOrRefusedOnes) {
  auto a = make_rule("a", {"http://127.0.0.1:1"});
  ASSERT_TRUE(pools_->apply({a}, false, RuleSource::kStartup).empty());
  EXPECT_EQ(versions(*pools_, "a"), (V{"1:startup:round_robin"}));
  auto h = pools_->history("a");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->name, "a");
  EXPECT_EQ(h->current(), 1u);
  ASSERT_TRUE(h->versions[0].rule);
  EXPECT_TRUE(rules::equivalent(*h->versions[0].rule, a));
  EXPECT_FALSE(h->versions[0].restored);
  auto before = std::chrono::system_clock::now();

  ASSERT_TRUE(pools_->apply({a}, false, RuleSource::kReload).empty());  // identical: nothing
  ASSERT_TRUE(pools_->apply({with_sel(a, "random")}, true).empty());    // a dry run: nothing
  auto bad = make_rule("b", {"http://no-such-host.invalid:1"}, {"m"});
  ASSERT_FALSE(pools_->apply({with_sel(a, "random"), bad}).empty());  // refused: nothing
  auto conflict = make_rule("c", {"http://127.0.0.1:2"});             // a second catch-all
  ASSERT_FALSE(pools_->upsert(conflict).empty());
  EXPECT_EQ(versions(*pools_, "a"), (V{"1:startup:round_robin"}));
  EXPECT_FALSE(pools_->history("b"));
  EXPECT_FALSE(pools_->history("c"));
  EXPECT_EQ(pools_->history_versions(), 1u);

  // Changed, and created (after startup: first "absent", so the creation can be undone).
  auto b = make_rule("b", {"http://127.0.0.1:2"}, {"m"});
  ASSERT_TRUE(pools_->apply({with_sel(a, "random"), b}, false, RuleSource::kReload).empty());
  EXPECT_EQ(versions(*pools_, "a"), (V{"1:startup:round_robin", "2:reload:random"}));
  EXPECT_EQ(versions(*pools_, "b"), (V{"1:reload:absent", "2:reload:round_robin"}));
  h = pools_->history("b");
  EXPECT_GE(h->versions[1].time, before);
  EXPECT_LE(h->versions[1].time, std::chrono::system_clock::now());
  // Endpoints only (the worker API), then deleted.
  b.endpoints.push_back({.url = "http://127.0.0.1:3"});
  ASSERT_TRUE(pools_->upsert(b, nullptr, RuleSource::kWorkers).empty());
  ASSERT_TRUE(pools_->remove("a"));
  EXPECT_EQ(versions(*pools_, "a"),
            (V{"1:startup:round_robin", "2:reload:random", "3:api:absent"}));
  EXPECT_EQ(versions(*pools_, "b"),
            (V{"1:reload:absent", "2:reload:round_robin", "3:workers:round_robin"}));
  EXPECT_EQ(pools_->history("b")->versions[2].rule->endpoints.size(), 2u);
  EXPECT_EQ(pools_->history_versions(), 6u);
  EXPECT_FALSE(pools_->history("never"));
}

TEST_F(PoolsTest, RollbackReplacesThenTogglesBack) {
  auto a = make_rule("a", {"http://127.0.0.1:1"}, {"m"});
  a.policy_knobs.max_tree_size = 1234;  // a knob the rule sets: restored with the rest
  ASSERT_TRUE(pools_->apply({a}, false, RuleSource::kStartup).empty());
  RollbackResult res;
  auto errors = pools_->rollback("a", std::nullopt, &res);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(res.status, RollbackResult::Status::kNothingToDo);
  EXPECT_NE(errors[0].message.find("one version only"), std::string::npos) << errors[0].message;

  auto a2 = with_sel(make_rule("a", {"http://127.0.0.1:2", "http://127.0.0.1:3"}, {"m", "n"}),
                     "power_of_two");
  a2.path_prefix = "/v1/";
  ASSERT_TRUE(pools_->upsert(a2).empty());
  auto applied = pools_->applied();
  errors = pools_->rollback("a", std::nullopt, &res);
  ASSERT_TRUE(errors.empty()) << rules::format_errors(errors);
  EXPECT_EQ(res.status, RollbackResult::Status::kDone);
  EXPECT_EQ(res.action, RollbackResult::Action::kReplaced);
  EXPECT_EQ(res.restored, 1u);
  EXPECT_EQ(res.version, 3u);
  ASSERT_TRUE(res.rule);
  EXPECT_EQ(rules::to_json(*res.rule), rules::to_json(a));
  EXPECT_EQ(rules::to_json(*pools_->rule("a")), rules::to_json(a));  // every field
  EXPECT_EQ(pools_->rule("a")->policy_knobs.max_tree_size, 1234);
  EXPECT_EQ(pools_->table()->resolve(0, "/generate", "m")->workers()->workers[0]->url(),
            "http://127.0.0.1:1");
  EXPECT_EQ(pools_->applied(), applied + 1);
  // Again: back to what the first rollback replaced.
  ASSERT_TRUE(pools_->rollback("a", std::nullopt, &res).empty());
  EXPECT_EQ(res.restored, 2u);
  EXPECT_EQ(res.version, 4u);
  EXPECT_EQ(rules::to_json(*pools_->rule("a")), rules::to_json(a2));
  EXPECT_EQ(versions(*pools_, "a"), (V{"1:startup:round_robin", "2:api:power_of_two",
                                       "3:rollback:round_robin:1", "4:rollback:power_of_two:2"}));
  // Without `out`, too.
  ASSERT_TRUE(pools_->rollback("a", std::nullopt).empty());
  EXPECT_EQ(pools_->rule("a")->sel, "round_robin");
}

TEST_F(PoolsTest, RollbackOfACreationDeletesAndOfADeletionCreates) {
  ASSERT_TRUE(
      pools_->apply({make_rule("x", {"http://127.0.0.1:9"})}, false, RuleSource::kStartup).empty());
  auto b = make_rule("b", {"http://127.0.0.1:2"}, {"m"});
  ASSERT_TRUE(pools_->upsert(b).empty());
  RollbackResult res;
  ASSERT_TRUE(pools_->rollback("b", std::nullopt, &res).empty());
  EXPECT_EQ(res.action, RollbackResult::Action::kDeleted);
  EXPECT_EQ(res.restored, 1u);
  EXPECT_EQ(res.version, 3u);
  EXPECT_FALSE(res.rule);
  EXPECT_FALSE(pools_->rule("b"));
  EXPECT_EQ(pools_->table()->resolve(0, "/generate", "m")->name(), "x");
  ASSERT_TRUE(pools_->rollback("b", std::nullopt, &res).empty());
  EXPECT_EQ(res.action, RollbackResult::Action::kCreated);
  EXPECT_EQ(res.restored, 2u);
  EXPECT_EQ(rules::to_json(*pools_->rule("b")), rules::to_json(b));
  EXPECT_EQ(pools_->table()->resolve(0, "/generate", "m")->name(), "b");

  // A rule deleted (by name) comes back whole; the rule it was deleted beside is untouched.
  auto x = pools_->table()->find("x");
  ASSERT_TRUE(pools_->remove("b"));
  ASSERT_TRUE(pools_->rollback("b", std::nullopt, &res).empty());
  EXPECT_EQ(res.action, RollbackResult::Action::kCreated);
  EXPECT_EQ(res.restored, 4u);
  EXPECT_EQ(rules::to_json(*pools_->rule("b")), rules::to_json(b));
  EXPECT_EQ(pools_->table()->find("x"), x);  // the same pool
  EXPECT_EQ(versions(*pools_, "x"), (V{"1:startup:round_robin"}));
  EXPECT_EQ(versions(*pools_, "b"),
            (V{"1:api:absent", "2:api:round_robin", "3:rollback:absent:1",
               "4:rollback:round_robin:2", "5:api:absent", "6:rollback:round_robin:4"}));
}

TEST_F(PoolsTest, RollbackToAGivenVersion) {
  auto a = make_rule("a", {"http://127.0.0.1:1"});
  ASSERT_TRUE(pools_->apply({a}, false, RuleSource::kStartup).empty());
  ASSERT_TRUE(pools_->upsert(with_sel(a, "random")).empty());
  ASSERT_TRUE(pools_->upsert(with_sel(a, "power_of_two")).empty());
  RollbackResult res;
  ASSERT_TRUE(pools_->rollback("a", 1, &res).empty());
  EXPECT_EQ(res.restored, 1u);
  EXPECT_EQ(res.version, 4u);
  EXPECT_EQ(pools_->rule("a")->sel, "round_robin");
  // The version in force, one the same as it, and one never made: nothing to do / unknown.
  for (uint64_t to : {4, 1}) {
    auto errors = pools_->rollback("a", to, &res);
    ASSERT_EQ(errors.size(), 1u) << to;
    EXPECT_EQ(res.status, RollbackResult::Status::kNothingToDo) << errors[0].message;
  }
  auto errors = pools_->rollback("a", 9, &res);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(res.status, RollbackResult::Status::kUnknownVersion);
  EXPECT_NE(errors[0].message.find("versions kept: 1 to 4"), std::string::npos)
      << errors[0].message;
  errors = pools_->rollback("nope", std::nullopt, &res);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(res.status, RollbackResult::Status::kUnknownRule);
  ASSERT_TRUE(pools_->rollback("a", 3, &res).empty());
  EXPECT_EQ(pools_->rule("a")->sel, "power_of_two");
  EXPECT_EQ(pools_->history("a")->current(), 5u);
}

TEST_F(PoolsTest, ARollbackThatNoLongerValidatesChangesNothing) {
  auto a = make_rule("a", {"http://127.0.0.1:1"}, {"m1"});
  ASSERT_TRUE(pools_->apply({a}, false, RuleSource::kStartup).empty());
  auto a2 = make_rule("a", {"http://127.0.0.1:1"}, {"m2"});
  ASSERT_TRUE(pools_->upsert(a2).empty());
  ASSERT_TRUE(pools_->upsert(make_rule("b", {"http://127.0.0.1:2"}, {"m1"})).empty());
  auto table = pools_->table();
  auto refused = pools_->refused();
  RollbackResult res;
  auto errors = pools_->rollback("a", std::nullopt, &res);  // m1 is b's now
  ASSERT_FALSE(errors.empty());
  EXPECT_EQ(res.status, RollbackResult::Status::kInvalid);
  EXPECT_NE(rules::format_errors(errors).find("m1"), std::string::npos)
      << rules::format_errors(errors);
  EXPECT_EQ(pools_->table(), table);
  EXPECT_EQ(pools_->refused(), refused + 1);
  EXPECT_EQ(pools_->history("a")->current(), 2u);
  EXPECT_EQ(pools_->history_versions(), 4u);
  // Nor may a rollback change a rule's engine (delete and create it again instead).
  auto c = make_rule("c", {"http://127.0.0.1:3"}, {"m3"});
  ASSERT_TRUE(pools_->upsert(c).empty());
  ASSERT_TRUE(pools_->remove("c"));
  c.kv_engine_type = rules::EngineType::kSglang;
  c.kv_hash_algo = "sha256_sglang";
  ASSERT_TRUE(pools_->upsert(c).empty());
  errors = pools_->rollback("c", 2, &res);
  EXPECT_EQ(res.status, RollbackResult::Status::kInvalid);
  EXPECT_NE(rules::format_errors(errors).find("kvEngineType"), std::string::npos)
      << rules::format_errors(errors);
}

TEST_F(PoolsTest, HistoryKeepsSixteenVersionsPerName) {
  auto a = make_rule("a", {"http://127.0.0.1:1"});
  ASSERT_TRUE(pools_->apply({a}, false, RuleSource::kStartup).empty());
  for (int i = 2; i <= 20; ++i) {
    a.policy_knobs.max_tree_size = 1000 + i;
    ASSERT_TRUE(pools_->upsert(a).empty());
  }
  auto h = pools_->history("a");
  ASSERT_EQ(h->versions.size(), PoolManager::kMaxVersionsPerRule);
  EXPECT_EQ(h->versions.front().version, 5u);
  EXPECT_EQ(h->current(), 20u);
  EXPECT_EQ(pools_->history_versions(), 16u);
  RollbackResult res;
  pools_->rollback("a", 4, &res);
  EXPECT_EQ(res.status, RollbackResult::Status::kUnknownVersion);
  ASSERT_TRUE(pools_->rollback("a", 5, &res).empty());
  EXPECT_EQ(pools_->rule("a")->policy_knobs.max_tree_size, 1005);
  EXPECT_EQ(pools_->history("a")->versions.front().version, 6u);
}

TEST_F(PoolsTest, HistoryForgetsTheRulesDeletedLongestAgoFirst) {
  auto batch = [](const std::string& prefix, int n) {
    std::vector<rules::Rule> out;
    out.reserve(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      out.push_back(make_rule(prefix + std::to_string(i), {"http://127.0.0.1:1"},
                              {prefix + "-model-" + std::to_string(i)}));
    }
    return out;
  };
  auto count = [&](const std::string& prefix, int n) {
    int kept = 0;
    for (int i = 0; i < n; ++i) kept += pools_->history(prefix + std::to_string(i)) ? 1 : 0;
    return kept;
  };
  ASSERT_TRUE(pools_->apply(batch("x", 600)).empty());
  ASSERT_TRUE(pools_->apply({}).empty());  // every x deleted
  EXPECT_EQ(count("x", 600), 600);
  EXPECT_EQ(pools_->history_versions(), 1800u);
  // 1,100 names: 76 deleted ones go; the rules in force all stay.
  ASSERT_TRUE(pools_->apply(batch("y", 500)).empty());
  EXPECT_EQ(count("x", 600), 524);
  EXPECT_EQ(count("y", 500), 500);
  ASSERT_TRUE(pools_->apply({}).empty());  // every y deleted, after the x's
  ASSERT_TRUE(pools_->apply({make_rule("z", {"http://127.0.0.1:1"})}).empty());
  EXPECT_EQ(count("x", 600), 523);  // the x's were deleted first
  EXPECT_EQ(count("y", 500), 500);
  EXPECT_TRUE(pools_->history("z"));
  EXPECT_EQ(pools_->history_versions(), 523u * 3 + 500 * 3 + 2);
}

TEST_F(PoolsTest, UpsertAndRemove) {
  bool created = false;
  ASSERT_TRUE(pools_->upsert(make_rule("a", {"http://127.0.0.1:1"}), &created).empty());
  EXPECT_TRUE(created);
  ASSERT_TRUE(pools_->upsert(make_rule("a", {"http://127.0.0.1:2"}), &created).empty());
  EXPECT_FALSE(created);
  EXPECT_EQ(pools_->rule("a")->endpoints[0].url, "http://127.0.0.1:2");
  EXPECT_TRUE(pools_->remove("a"));
  EXPECT_FALSE(pools_->remove("a"));
  EXPECT_TRUE(pools_->table()->pools.empty());
}

}  // namespace
}  // namespace kvgate

namespace kvgate {
namespace {

using testing::make_rule;
using DiscoveredPools = testing::PoolsFixture;

// Discovery: what a rule's discovery URI finds joins its endpoints live, its policy carries on,
// the rule as written (the admin API's, the history's) stays without them, and found endpoints
// that would make the rule invalid are refused without touching what is in force.
TEST_F(DiscoveredPools, FoundEndpointsJoinTheRuleAndTheWrittenRuleStays) {
  auto r = make_rule("d", {"http://127.0.0.1:1"});
  r.discovery = "dns://workers.test:80";
  ASSERT_TRUE(pools_->apply({r}, false, RuleSource::kStartup).empty());
  auto table = pools_->table();
  const Policy* policy = &table->find("d")->policy();
  EXPECT_EQ(table->find("d")->workers()->workers.size(), 1u);
  std::vector<rules::Endpoint> found{{.url = "http://127.0.0.2:80"}, {.url = "http://127.0.0.1:1"}};
  ASSERT_TRUE(pools_->set_discovered(r.discovery, found).empty());
  table = pools_->table();
  const Pool* p = table->find("d");
  EXPECT_EQ(p->workers()->workers.size(), 2u);  // the listed one once
  EXPECT_EQ(&p->policy(), policy);              // what the policy learned carries on
  EXPECT_EQ(p->configured().endpoints.size(), 1u);
  EXPECT_EQ(pools_->rule("d")->endpoints.size(), 1u);
  EXPECT_EQ(pools_->history("d")->versions.size(), 1u);  // no version for a discovery change
  // The same answer again changes nothing.
  ASSERT_TRUE(pools_->set_discovered(r.discovery, found).empty());
  EXPECT_EQ(pools_->table()->find("d"), p);
  // A found prefill server among role-less ones is refused; the pool in force stays.
  std::vector<rules::Endpoint> mixed{{.url = "http://127.0.0.3:80", .role = rules::Role::kPrefill}};
  EXPECT_FALSE(pools_->set_discovered(r.discovery, mixed).empty());
  EXPECT_EQ(pools_->table()->find("d"), p);
  EXPECT_EQ(pools_->discovered(r.discovery), found);  // what is in force
  // A rule changed through the API keeps what discovery found.
  auto r2 = r;
  r2.sel = "random";
  ASSERT_TRUE(pools_->apply({r2}).empty());
  EXPECT_EQ(pools_->table()->find("d")->workers()->workers.size(), 2u);
  // Nothing found, no endpoint of its own: a pool of no worker (requests get 503), valid.
  auto bare = make_rule("bare", {}, {"bare-model"});
  bare.discovery = "etcd://127.0.0.1:2379/m";
  ASSERT_TRUE(pools_->apply({r2, bare}).empty());
  EXPECT_EQ(pools_->table()->find("bare")->workers()->workers.size(), 0u);
}

}  // namespace
}  // namespace kvgate
