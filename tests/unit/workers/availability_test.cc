// Tests for workers/availability: the available set follows health and breaker changes (the
// open timeout by the clock, half-open trials), the in-flight figures follow dispatches, a
// retry's candidates leave out failed workers, and every index over a worker (two pools, two
// sides) hears it. Times are passed to the index, never waited for.
#include "workers/availability.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <thread>

#include "gateway/knobs.h"

namespace kvgate {
namespace {

using namespace std::chrono_literals;

BreakerConfig breaker(uint32_t failures = 1, uint32_t successes = 2) {
  BreakerConfig bc = breaker_config(GatewayConfig{});
  bc.failure_threshold = failures;
  bc.success_threshold = successes;
  bc.open_timeout = 10s;
  return bc;
}

std::shared_ptr<WorkerSet> workers(int n, BreakerConfig bc = breaker(), uint64_t first_id = 1) {
  auto set = std::make_shared<WorkerSet>();
  for (int i = 0; i < n; ++i) {
    http::Target t;
    http::parse_url("http://127.0.0.1:" + std::to_string(42000 + first_id + i), t);
    auto w = std::make_shared<Worker>(first_id + i, t, bc);
    w->set_healthy(true);
    set->workers.push_back(std::move(w));
  }
  return set;
}

std::vector<uint64_t> ids(const AvailableSet& s) {
  std::vector<uint64_t> out;
  for (Worker* w : s.workers) out.push_back(w->id());
  return out;
}

// What Worker::available() says of each, in order: the list the index must give.
std::vector<uint64_t> scanned(const WorkerSet& set, Clock::time_point now) {
  std::vector<uint64_t> out;
  for (const auto& w : set.workers) {
    if (w->available(now)) out.push_back(w->id());
  }
  return out;
}

TEST(AvailabilityIndex, FollowsHealth) {
  auto set = workers(4);
  AvailabilityIndex index(set);
  const auto now = Clock::now();
  auto first = index.current(now);
  EXPECT_EQ(ids(*first), (std::vector<uint64_t>{1, 2, 3, 4}));
  EXPECT_EQ(index.current(now), first) << "nothing changed: the same set";

  set->workers[1]->set_healthy(false);
  auto second = index.current(now);
  EXPECT_EQ(ids(*second), (std::vector<uint64_t>{1, 3, 4}));
  EXPECT_NE(second->generation, first->generation);
  EXPECT_EQ(second->find(2), nullptr);
  EXPECT_EQ(second->find(3), set->workers[2].get());
  EXPECT_EQ(ids(*first), (std::vector<uint64_t>{1, 2, 3, 4})) << "a set taken never changes";

  set->workers[1]->set_healthy(false);  // no change: no rebuild
  EXPECT_EQ(index.current(now), second);
  set->workers[1]->set_healthy(true);
  EXPECT_EQ(ids(*index.current(now)), (std::vector<uint64_t>{1, 2, 3, 4}));
}

TEST(AvailabilityIndex, BreakerOpensThenPassesAgainByTheClock) {
  auto set = workers(3);
  AvailabilityIndex index(set);
  Worker& w = *set->workers[0];
  const auto t0 = Clock::now();
  EXPECT_EQ(index.current(t0)->workers.size(), 3u);
  auto pass = w.admit(t0);
  w.record_failure(pass, t0);  // threshold 1: open
  ASSERT_EQ(w.breaker_state(), BreakerState::kOpen);
  EXPECT_EQ(ids(*index.current(t0)), (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(ids(*index.current(t0 + 9s)), (std::vector<uint64_t>{2, 3}));
  // The open timeout over: it may take a trial (nothing told the index; the clock did).
  EXPECT_EQ(ids(*index.current(t0 + 10s)), (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(ids(*index.current(t0 + 10s)), scanned(*set, t0 + 10s));
}

TEST(AvailabilityIndex, HalfOpenAdmitsOneTrialAtATime) {
  auto set = workers(2);
  AvailabilityIndex index(set);
  Worker& w = *set->workers[1];
  const auto t0 = Clock::now();
  w.record_failure(w.admit(t0), t0);
  const auto t1 = t0 + 10s;
  ASSERT_EQ(index.current(t1)->workers.size(), 2u);

  auto trial = w.admit(t1);  // open -> half-open, the trial slot taken
  ASSERT_EQ(trial, CircuitBreaker::Pass::kTrial);
  EXPECT_EQ(ids(*index.current(t1)), (std::vector<uint64_t>{1})) << "its one trial is out";
  w.record_neutral(trial);  // the slot back
  EXPECT_EQ(ids(*index.current(t1)), (std::vector<uint64_t>{1, 2}));

  trial = w.admit(t1);
  w.record_success(trial);  // 1 of 2 successes: still half-open, free again
  EXPECT_EQ(w.breaker_state(), BreakerState::kHalfOpen);
  EXPECT_EQ(ids(*index.current(t1)), (std::vector<uint64_t>{1, 2}));
  trial = w.admit(t1);
  EXPECT_EQ(ids(*index.current(t1)), (std::vector<uint64_t>{1}));
  w.record_failure(trial, t1);  // a failed trial opens it again
  EXPECT_EQ(ids(*index.current(t1)), (std::vector<uint64_t>{1}));
  EXPECT_EQ(ids(*index.current(t1 + 10s)), (std::vector<uint64_t>{1, 2}));
  for (int i = 0; i < 2; ++i) w.record_success(w.admit(t1 + 10s));
  EXPECT_EQ(w.breaker_state(), BreakerState::kClosed);
  EXPECT_EQ(ids(*index.current(t1 + 10s)), (std::vector<uint64_t>{1, 2}));
}

TEST(AvailabilityIndex, AnUnhealthyWorkersOpenBreakerSetsNoDeadline) {
  auto set = workers(2);
  AvailabilityIndex index(set);
  Worker& w = *set->workers[0];
  const auto t0 = Clock::now();
  w.record_failure(w.admit(t0), t0);
  w.set_healthy(false);
  EXPECT_EQ(ids(*index.current(t0 + 20s)), (std::vector<uint64_t>{2}));
  w.set_healthy(true);
  EXPECT_EQ(ids(*index.current(t0 + 20s)), (std::vector<uint64_t>{1, 2}));
}

TEST(AvailabilityIndex, EveryIndexOverAWorkerHearsIt) {
  // Two pools (or the two sides of a prefill/decode pool) sharing a server.
  auto a = workers(3);
  auto b = std::make_shared<WorkerSet>();
  b->workers = {a->workers[2]};
  auto extra = workers(1, breaker(), 10);
  b->workers.push_back(extra->workers[0]);
  AvailabilityIndex ia(a), ib(b);
  const auto now = Clock::now();
  a->workers[2]->set_healthy(false);
  EXPECT_EQ(ids(*ia.current(now)), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(ids(*ib.current(now)), (std::vector<uint64_t>{10}));
  a->workers[2]->begin_request();
  a->workers[2]->set_healthy(true);
  auto sa = ia.current(now);
  auto sb = ib.current(now);
  EXPECT_EQ(ia.inflight(sa->generation)->total, 1);
  EXPECT_EQ(ib.inflight(sb->generation)->total, 1);
  a->workers[2]->end_request();
  EXPECT_EQ(ia.inflight(sa->generation)->total, 0);
  EXPECT_EQ(ib.inflight(sb->generation)->total, 0);
}

TEST(AvailabilityIndex, AWorkerOutlivesItsIndex) {
  // A rule's endpoints changed: the new pool's index has no place for the removed worker, and
  // the old index, destroyed with its pool, no longer listens.
  auto set = workers(3);
  auto index = std::make_unique<AvailabilityIndex>(set);
  auto kept = std::make_shared<WorkerSet>();
  kept->workers = {set->workers[0], set->workers[2]};
  AvailabilityIndex next(kept);
  index.reset();
  for (const auto& w : set->workers) {
    w->begin_request();
    w->set_healthy(false);
    w->set_healthy(true);
    w->end_request();
  }
  auto s = next.current(Clock::now());
  EXPECT_EQ(ids(*s), (std::vector<uint64_t>{1, 3}));
  EXPECT_EQ(next.inflight(s->generation)->total, 0);
}

TEST(AvailabilityIndex, InflightFiguresMatchAScan) {
  auto set = workers(16);
  for (int i = 0; i < 5; ++i) set->workers[3]->begin_request();  // before the index exists
  AvailabilityIndex index(set);
  std::mt19937 rng(5);
  std::vector<int> held(set->workers.size(), 0);
  held[3] = 5;
  for (int step = 0; step < 5000; ++step) {
    size_t i = rng() % set->workers.size();
    Worker& w = *set->workers[i];
    switch (rng() % 5) {
      case 0:
      case 1:
        w.begin_request();
        ++held[i];
        break;
      case 2:
      case 3:
        if (held[i] > 0) {
          w.end_request();
          --held[i];
        }
        break;
      case 4:
        w.set_healthy(rng() % 3 != 0);
        break;
    }
    auto s = index.current(Clock::now());
    if (s->workers.empty()) continue;
    int64_t lo = INT64_MAX, hi = INT64_MIN, total = 0;
    for (Worker* x : s->workers) {
      lo = std::min(lo, x->inflight());
      hi = std::max(hi, x->inflight());
      total += x->inflight();
    }
    auto f = index.inflight(s->generation);
    ASSERT_TRUE(f);
    ASSERT_EQ(f->min, lo) << "step " << step;
    ASSERT_EQ(f->max, hi) << "step " << step;
    ASSERT_EQ(f->total, total) << "step " << step;
    Worker* least = index.least_inflight(s->generation, [&](size_t n) { return rng() % n; });
    ASSERT_TRUE(least);
    ASSERT_EQ(least->inflight(), lo);
    ASSERT_TRUE(s->find(least->id()));
  }
  for (size_t i = 0; i < held.size(); ++i) {
    for (; held[i] > 0; --held[i]) set->workers[i]->end_request();
  }
}

TEST(AvailabilityIndex, LeastInflightIsUniformAmongEquals) {
  auto set = workers(4);
  AvailabilityIndex index(set);
  set->workers[0]->begin_request();
  auto s = index.current(Clock::now());
  std::mt19937 rng(1);
  std::map<uint64_t, int> picked;
  for (int i = 0; i < 3000; ++i) {
    ++picked[index.least_inflight(s->generation, [&](size_t n) { return rng() % n; })->id()];
  }
  EXPECT_EQ(picked.count(1), 0u);
  for (uint64_t id : {2, 3, 4}) EXPECT_GT(picked[id], 800) << id;
  set->workers[0]->end_request();
}

TEST(AvailabilityIndex, StaleGenerationsGetNoFigures) {
  auto set = workers(2);
  AvailabilityIndex index(set);
  auto s = index.current(Clock::now());
  set->workers[0]->set_healthy(false);
  index.current(Clock::now());
  EXPECT_FALSE(index.inflight(s->generation));
  EXPECT_EQ(index.least_inflight(s->generation, [](size_t) { return size_t{0}; }), nullptr);
}

TEST(CandidateList, ARetryLeavesOutTheWorkersThatFailedIt) {
  auto set = workers(4);
  AvailabilityIndex index(set);
  CandidateList c;
  const auto now = Clock::now();
  c.list(index, {}, now);
  ASSERT_EQ(c.workers().size(), 4u);
  EXPECT_TRUE(c.view().describes(c.workers())) << "a first attempt: the index's own list";

  const std::vector<uint64_t> failed = {2, 4};
  c.list(index, failed, now);
  std::vector<uint64_t> got;
  for (Worker* w : c.workers()) got.push_back(w->id());
  EXPECT_EQ(got, (std::vector<uint64_t>{1, 3}));
  EXPECT_FALSE(c.view().describes(c.workers())) << "a filtered copy: policies scan it";

  // Every available worker failed once: all of them again.
  set->workers[0]->set_healthy(false);
  set->workers[2]->set_healthy(false);
  c.list(index, failed, now);
  got.clear();
  for (Worker* w : c.workers()) got.push_back(w->id());
  EXPECT_EQ(got, (std::vector<uint64_t>{2, 4}));

  for (const auto& w : set->workers) w->set_healthy(false);
  c.list(index, failed, now);
  EXPECT_TRUE(c.empty());
}

// Request threads dispatching while the control thread flips health: the figures stay
// consistent (ThreadSanitizer watches the rest).
TEST(AvailabilityIndex, RequestThreadsAndHealthChangesAtOnce) {
  auto set = workers(8);
  AvailabilityIndex index(set);
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  threads.reserve(2);
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t));
      CandidateList c;
      while (!stop.load()) {
        c.list(index, {}, Clock::now());
        if (c.empty()) continue;
        Worker* w = c.workers()[rng() % c.workers().size()];
        w->begin_request();
        index.inflight(c.view().set->generation);
        w->end_request();
      }
    });
  }
  for (int i = 0; i < 2000; ++i) set->workers[static_cast<size_t>(i % 8)]->set_healthy(i % 3 != 0);
  stop.store(true);
  for (auto& t : threads) t.join();
  for (const auto& w : set->workers) w->set_healthy(true);
  auto s = index.current(Clock::now());
  auto f = index.inflight(s->generation);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->total, 0);
  EXPECT_EQ(f->min, 0);
  EXPECT_EQ(f->max, 0);
}

}  // namespace
}  // namespace kvgate
