// Tests for metrics: the text exposition format.
#include "metrics/metrics.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace kvgate::metrics {
namespace {

TEST(Metrics, CounterGaugeHistogramExposition) {
  Registry r;
  auto& c = r.counter("x_requests_total", "Requests", {"route", "status"});
  c.with({"/a", "200"}).inc();
  c.with({"/a", "200"}).inc(2);
  c.with({"/b\"x", "500"}).inc();
  auto& g = r.gauge("x_in_flight", "In flight");
  g.with({}).set(3);
  auto& h = r.histogram("x_seconds", "Latency", {"route"}, {0.1, 1});
  h.with({"/a"}).observe(0.05);
  h.with({"/a"}).observe(0.5);
  h.with({"/a"}).observe(5);
  std::string text = r.expose();
  EXPECT_NE(text.find("# TYPE x_requests_total counter"), std::string::npos);
  EXPECT_NE(text.find("x_requests_total{route=\"/a\",status=\"200\"} 3\n"), std::string::npos);
  EXPECT_NE(text.find("route=\"/b\\\"x\""), std::string::npos);
  EXPECT_NE(text.find("x_in_flight 3\n"), std::string::npos);
  EXPECT_NE(text.find("x_seconds_bucket{route=\"/a\",le=\"0.1\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("x_seconds_bucket{route=\"/a\",le=\"1\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("x_seconds_bucket{route=\"/a\",le=\"+Inf\"} 3\n"), std::string::npos);
  EXPECT_NE(text.find("x_seconds_count{route=\"/a\"} 3\n"), std::string::npos);
  EXPECT_NE(text.find("x_seconds_sum{route=\"/a\"} 5.55"), std::string::npos);
}

TEST(Metrics, RemoveDropsTheSeries) {
  Registry r;
  auto& g = r.gauge("w_health", "h", {"worker"});
  g.with({"a"}).set(1);
  g.with({"b"}).set(1);
  g.remove({"a"});
  std::string text = r.expose();
  EXPECT_EQ(text.find("worker=\"a\""), std::string::npos);
  EXPECT_NE(text.find("worker=\"b\""), std::string::npos);
}

TEST(Metrics, ObserveNCountsNObservationsAtOnce) {
  Registry r;
  auto& h = r.histogram("n_seconds", "n", {}, {0.001, 1});
  h.with({}).observe_n(0, 3);
  h.with({}).observe_n(2, 2);
  h.with({}).observe_n(5, 0);
  const Histogram& cell = h.with({});
  EXPECT_EQ(cell.count(), 5u);
  EXPECT_EQ(cell.bucket(0), 3u);
  EXPECT_EQ(cell.bucket(2), 2u);
  EXPECT_DOUBLE_EQ(cell.sum(), 4);
}

TEST(Metrics, AnAliasExposesTheSameCellsUnderItsNameAndLosesWhatTheFamilyLoses) {
  Registry r;
  auto& g = r.gauge("w_active", "Active", {"worker"});
  r.alias(g, "other_active", "Active (w_active)");
  g.with({"a"}).set(2);
  g.with({"b"}).set(1);
  std::string text = r.expose();
  EXPECT_NE(text.find("# TYPE other_active gauge\n"), std::string::npos);
  EXPECT_NE(text.find("# HELP other_active Active (w_active)\n"), std::string::npos);
  EXPECT_NE(text.find("other_active{worker=\"a\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("w_active{worker=\"a\"} 2\n"), std::string::npos);
  r.remove_series("worker", "a");
  text = r.expose();
  EXPECT_EQ(text.find("other_active{worker=\"a\"}"), std::string::npos);
  EXPECT_NE(text.find("other_active{worker=\"b\"} 1\n"), std::string::npos);
}

TEST(Metrics, ForEachVisitsEveryCellWithItsLabels) {
  Registry r;
  auto& c = r.counter("e_total", "e", {"route", "status"});
  c.with({"/a", "200"}).inc(2);
  c.with({"/a", "500"}).inc(3);
  uint64_t sum = 0;
  int cells = 0;
  c.for_each([&](const std::vector<std::string>& v, const Counter& cell) {
    EXPECT_EQ(v[0], "/a");
    sum += cell.value();
    ++cells;
  });
  EXPECT_EQ(cells, 2);
  EXPECT_EQ(sum, 5u);
}

TEST(Metrics, SameLabelsSameCell) {
  Registry r;
  auto& c = r.counter("y_total", "y", {"k"});
  EXPECT_EQ(&c.with({"v"}), &c.with({"v"}));
  EXPECT_NE(&c.with({"v"}), &c.with({"w"}));
}

// Request threads create cells and update them while the control thread scrapes (collectors
// included) and drops a series, as kvgate's metrics listener does; make check-tsan watches the
// interleaving. The totals come out exact.
TEST(Metrics, UpdatesCreationAndScrapesFromManyThreads) {
  Registry r;
  auto& c = r.counter("z_total", "z", {"thread", "route"});
  auto& g = r.gauge("z_in_flight", "z");
  auto& h = r.histogram("z_seconds", "z", {"route"}, {0.1, 1});
  auto& gone = r.gauge("z_gone", "z", {"worker"});
  auto& mirrored = r.counter("z_mirrored_total", "z");
  std::atomic<uint64_t> source{0};
  r.add_collector([&] { mirrored.with({}).mirror(source.load()); });
  constexpr int kThreads = 4, kIterations = 2000;
  std::atomic<int> running{kThreads};
  std::vector<std::thread> threads;
  for (int k = 0; k < kThreads; ++k) {
    threads.emplace_back([&, k] {
      for (int i = 0; i < kIterations; ++i) {
        std::string route = "/r" + std::to_string(i % 5);
        c.with({std::to_string(k), route}).inc();
        g.with({}).add(1);
        h.with({route}).observe(i % 3 == 0 ? 0.05 : 2);
        g.with({}).add(-1);
        source.fetch_add(1);
      }
      running.fetch_sub(1);
    });
  }
  int scrapes = 0;
  while (running.load() > 0) {
    gone.with({"w" + std::to_string(scrapes % 3)}).set(1);
    if (scrapes % 2 == 1) gone.remove({"w" + std::to_string((scrapes - 1) % 3)});
    EXPECT_NE(r.expose().find("# TYPE z_total counter"), std::string::npos);
    ++scrapes;
  }
  for (auto& t : threads) t.join();
  uint64_t total = 0;
  for (int k = 0; k < kThreads; ++k) {
    for (int i = 0; i < 5; ++i)
      total += c.with({std::to_string(k), "/r" + std::to_string(i)}).value();
  }
  EXPECT_EQ(total, uint64_t{kThreads} * kIterations);
  EXPECT_EQ(g.with({}).value(), 0);
  uint64_t observed = 0;
  for (int i = 0; i < 5; ++i) observed += h.with({"/r" + std::to_string(i)}).count();
  EXPECT_EQ(observed, uint64_t{kThreads} * kIterations);
  EXPECT_NE(r.expose().find("z_mirrored_total " + std::to_string(kThreads * kIterations)),
            std::string::npos);
}

}  // namespace
}  // namespace kvgate::metrics
