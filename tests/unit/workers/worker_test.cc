// Tests for workers/worker: the request threads' side (breaker passes and outcomes, in-flight
// counts, the model list) racing the control thread's (health, reported load, models, a new
// snapshot, metric scrapes), as in kvgate. Loose checks; ThreadSanitizer (make check-tsan) and
// ASan (make test) watch the interleaving.
#include "workers/worker.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "gateway/knobs.h"

namespace kvgate {
namespace {

using namespace std::chrono_literals;

TEST(Worker, RequestThreadsAndTheControlThreadAtOnce) {
  metrics::Registry registry;
  auto& health = registry.gauge("health", "h", {"worker"});
  auto& cb = registry.gauge("cb", "c", {"worker"});
  auto& inflight = registry.gauge("inflight", "i", {"worker"});
  auto& load = registry.gauge("load", "l", {"worker"});
  auto& requests = registry.counter("requests", "r", {"worker"});
  auto& failures = registry.counter("failures", "f", {"worker"});
  BreakerConfig bc = breaker_config(GatewayConfig{});
  bc.failure_threshold = 2;
  bc.success_threshold = 1;
  bc.open_timeout = 1ms;  // open, half-open and closed again many times
  WorkerRegistry workers;
  auto set = std::make_shared<WorkerSet>();
  for (int i = 0; i < 2; ++i) {
    http::Target t;
    http::parse_url("http://127.0.0.1:" + std::to_string(41000 + i), t);
    auto w = std::make_shared<Worker>(i + 1, t, bc);
    WorkerMetrics m;
    m.health = &health.with({w->url()});
    m.cb_state = &cb.with({w->url()});
    m.inflight = &inflight.with({w->url()});
    m.reported_load = &load.with({w->url()});
    m.requests = &requests.with({w->url()});
    m.failures = &failures.with({w->url()});
    w->attach_metrics(m);
    w->set_healthy(true);
    set->workers.push_back(std::move(w));
  }
  workers.publish(set);

  constexpr int kThreads = 3;
  std::atomic<int> running{kThreads};
  // The request threads start once the control thread has run a round, so the two overlap even
  // when the control thread is descheduled at first (a loaded machine).
  std::atomic<int> rounds{0};
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int k = 0; k < kThreads; ++k) {
    threads.emplace_back([&, k] {
      while (rounds.load() == 0) std::this_thread::yield();
      for (int i = 0; i < 3000; ++i) {
        auto snapshot = workers.snapshot();
        Worker& w = *snapshot->workers[static_cast<size_t>(i + k) % snapshot->workers.size()];
        auto now = Clock::now();
        if (!w.available(now)) continue;
        auto pass = w.admit(now);
        if (pass == CircuitBreaker::Pass::kDenied) continue;
        w.begin_request();
        (void)w.load();
        (void)w.models();
        if (i % 3 == 0) {
          w.record_failure(pass, Clock::now());
        } else if (i % 3 == 1) {
          w.record_success(pass);
        } else {
          w.record_neutral(pass);
        }
        w.end_request();
      }
      running.fetch_sub(1);
    });
  }
  do {
    int r = rounds.load();
    for (const auto& w : set->workers) {
      w->set_healthy(r % 4 != 0);
      w->set_reported_load(r % 7);
      w->set_models({"{\"id\":\"m" + std::to_string(r % 3) + "\"}"});
    }
    workers.publish(std::make_shared<WorkerSet>(*set));
    (void)workers.healthy_count();
    (void)registry.expose();
    rounds.fetch_add(1);
  } while (running.load() > 0);
  for (auto& t : threads) t.join();
  for (const auto& w : set->workers) EXPECT_EQ(w->inflight(), 0);
  EXPECT_GE(rounds.load(), 1);
}

}  // namespace
}  // namespace kvgate
