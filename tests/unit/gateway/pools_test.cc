// Tests of gateway/pools: resolving requests to rules, and applying rule changes (kept pools,
// workers taken over, retired pools, metric series removed, all-or-nothing failures).
#include "gateway/pools.h"

#include <gtest/gtest.h>

#include "gateway/knobs.h"
#include "metrics/metrics.h"
#include "support/process.h"

namespace kvgate {
namespace {

rules::Rule make_rule(std::string name, std::vector<std::string> urls,
                      std::vector<std::string> models = {}) {
  rules::Rule r;
  r.name = std::move(name);
  r.mode = 4;
  r.sel = "round_robin";
  r.models = std::move(models);
  for (auto& u : urls) r.endpoints.push_back({.url = std::move(u)});
  return r;
}

class PoolsTest : public ::testing::Test {
 protected:
  PoolsTest() {
    env_.config = &cfg_;
    env_.metrics = &metrics_;
    env_.registry = &registry_;
    env_.control = &control_;
    env_.next_worker_id = &next_id_;
    env_.health = health_config(cfg_);
    pools_ = std::make_unique<PoolManager>(env_);
  }
  bool exposes(const std::string& text) {
    return registry_.expose().find(text) != std::string::npos;
  }

  GatewayConfig cfg_;
  metrics::Registry registry_;
  GatewayMetrics metrics_{registry_, metrics::latency_buckets()};
  asio::io_context control_;
  std::atomic<uint64_t> next_id_{1};
  PoolEnv env_;
  std::unique_ptr<PoolManager> pools_;
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
