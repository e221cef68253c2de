// Every policy used as kvgate uses it: request threads select, dispatch and complete at once, while
// the control thread runs the policy's upkeep (on_period), scrapes its metrics and tells it of a
// new worker set (rings rebuilt and swapped under the readers). The checks are
// loose; the point is the interleaving, which ThreadSanitizer (make check-tsan) and ASan (make
// test) watch.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "gateway/knobs.h"
#include "policy/registry.h"
#include "unit/policy/policy_fixture.h"

namespace kvgate {
namespace {

using testing::Pool;
using testing::Req;

class PolicyConcurrency : public ::testing::TestWithParam<std::string> {};

TEST_P(PolicyConcurrency, RequestThreadsAndUpkeepAtOnce) {
  Pool pool(4);
  metrics::Registry registry;
  PolicyConfig c = policy_config(GatewayConfig{});
  c.name = GetParam();
  c.seed = 0;  // each thread's own generator, as kvgate runs
  c.registry = &registry;
  c.max_tree_size = 200;  // small enough that every upkeep evicts
  c.max_prefix_trees = 2;
  c.max_routing_keys = 8;
  c.max_idle_secs = 1;
  c.manual_assignment_mode = "min_group";
  auto p = testing::make(c, pool);
  ASSERT_TRUE(p);

  constexpr int kThreads = 4;
  std::atomic<int> running{kThreads};
  // The request threads start once the control thread runs (else, on a loaded machine, they
  // may all finish before its first upkeep: nothing concurrent tested).
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int k = 0; k < kThreads; ++k) {
    threads.emplace_back([&, k] {
      while (!go.load()) std::this_thread::yield();
      for (int i = 0; i < 2000; ++i) {
        Req r("conversation " + std::to_string(i % 23) + " turn " + std::to_string(i % 5),
              "model-" + std::to_string((i + k) % 3));
        r.headers = {{"x-smg-routing-key", "key-" + std::to_string(i % 11)},
                     {"authorization", "Bearer user-" + std::to_string(i % 7)}};
        Decision d = p->select(pool.ptrs, r.ctx);
        if (!d.worker) continue;
        p->on_dispatched(d, r.ctx);
        d.worker->begin_request();
        Outcome o{.status = 200, .ok = true, .cached_tokens = i % 4, .prompt_tokens = 8};
        if (i % 9 == 0) o = Outcome{.status = 503, .ok = false, .started = false};
        p->on_completed(d, r.ctx, o);
        d.worker->end_request();
      }
      running.fetch_sub(1);
    });
  }
  // The control thread: upkeep and scrapes, until the request threads are done.
  int periods = 0;
  do {
    p->on_period();
    go.store(true);
    registry.expose();
    if (periods % 4 == 0) p->on_workers_changed(pool.set());
    ++periods;
  } while (running.load() > 0);
  for (auto& t : threads) t.join();
  p->on_period();
  EXPECT_GT(periods, 0);
  for (Worker* w : pool.ptrs) EXPECT_EQ(w->inflight(), 0);
}

std::vector<std::string> built_policies() {
  std::vector<std::string> names;
  for (const auto& info : all_policies()) {
    if (info.factory) names.emplace_back(info.name);
  }
  return names;
}

INSTANTIATE_TEST_SUITE_P(All, PolicyConcurrency, ::testing::ValuesIn(built_policies()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kvgate
