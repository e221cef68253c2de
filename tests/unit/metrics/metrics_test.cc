// Tests for metrics: the text exposition format.
#include "metrics/metrics.h"

#include <gtest/gtest.h>

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

TEST(Metrics, SameLabelsSameCell) {
  Registry r;
  auto& c = r.counter("y_total", "y", {"k"});
  EXPECT_EQ(&c.with({"v"}), &c.with({"v"}));
  EXPECT_NE(&c.with({"v"}), &c.with({"w"}));
}

}  // namespace
}  // namespace kvgate::metrics
