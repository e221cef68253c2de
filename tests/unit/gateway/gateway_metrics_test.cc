// Unit tests: gateway/gateway_metrics: LabelLimiter (bounded label values, cached per thread), the
// request signal cells and the --metrics-compat smg series.
#include "gateway/gateway_metrics.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>

namespace kvgate {
namespace {

TEST(LabelLimiter, AdmitsUpToItsLimitThenSaysOther) {
  LabelLimiter limiter(2);
  EXPECT_EQ(limiter.admit("a"), "a");
  EXPECT_EQ(limiter.admit("b"), "b");
  EXPECT_EQ(limiter.admit("c"), "other");
  EXPECT_EQ(limiter.admit("a"), "a");  // seen before the limit: still itself
  EXPECT_EQ(limiter.admit("c"), "other");
}

TEST(LabelLimiter, ReturnsItsOwnCopyThatOutlivesTheRequest) {
  LabelLimiter limiter(4);
  std::string_view first;
  {
    std::string body_model = "qwen3";
    first = limiter.admit(body_model);
    EXPECT_NE(first.data(), body_model.data());
    body_model.assign("xxxxx");  // the request's text changes: the label does not
  }
  EXPECT_EQ(first, "qwen3");
  EXPECT_EQ(limiter.admit(std::string("qwen3")).data(), first.data());  // the cached copy
}

TEST(LabelLimiter, EachLimiterCountsItsOwnValuesWhateverThisThreadCached) {
  auto full = std::make_unique<LabelLimiter>(1);
  EXPECT_EQ(full->admit("x"), "x");
  EXPECT_EQ(full->admit("y"), "other");
  LabelLimiter other(1);
  EXPECT_EQ(other.admit("y"), "y");  // not "other": x was cached for the first limiter only
  EXPECT_EQ(other.admit("x"), "other");
  full.reset();  // its cached entries must never match a later limiter
  LabelLimiter later(1);
  EXPECT_EQ(later.admit("z"), "z");
  EXPECT_EQ(later.admit("x"), "other");
}

TEST(LabelLimiter, ThreadsAgreeOnTheLimit) {
  LabelLimiter limiter(3);
  std::thread t([&] {
    for (int i = 0; i < 3; ++i)
      EXPECT_EQ(limiter.admit("t" + std::to_string(i)), "t" + std::to_string(i));
  });
  t.join();
  EXPECT_EQ(limiter.admit("main"), "other");
  EXPECT_EQ(limiter.admit("t1"), "t1");
}

}  // namespace
}  // namespace kvgate

namespace kvgate {
namespace {

bool has(const std::string& text, const std::string& line) {
  return text.find(line) != std::string::npos;
}

TEST(GatewayMetrics, WithoutCompatThereIsNoSmgSeries) {
  metrics::Registry r;
  GatewayMetrics m(r, metrics::latency_buckets());
  EXPECT_FALSE(m.smg());
  EXPECT_EQ(m.smg_router_request("", "/generate", false, false), nullptr);
  EXPECT_EQ(m.smg_selection("regular", "", "round_robin"), nullptr);
  EXPECT_EQ(m.smg_http_request("GET", "/health"), nullptr);
  m.smg_retry("regular", "generate");
  EXPECT_EQ(r.expose().find("smg_"), std::string::npos);
}

TEST(GatewayMetrics, SmgSeriesMirrorKvgatesOwnCells) {
  metrics::Registry r;
  GatewayMetrics m(r, metrics::latency_buckets(), metrics::short_latency_buckets(),
                   MetricsCompat::kSmg);
  ASSERT_TRUE(m.smg());
  m.smg_http_request("POST", "/generate")->inc(4);
  m.smg_http_request("PUT", "/generate")->inc();  // answered 405: the method refused
  m.smg_http_request("GET", "/health")->inc(2);
  m.smg_http_request("GET", "/v1/responses/{id}")->inc();
  m.smg_http_request("DELETE", "/v1/responses/{id}")->inc();
  m.smg_http_request("BREW", "unknown")->inc();
  m.branch_counter("cache_aware", "cache_hit").inc(4);
  m.branch_counter("cache_aware", "cache_miss_min_load").inc(1);
  m.branch_counter("cache_aware", "imbalanced").inc(2);
  m.branch_counter("round_robin", "next").inc(9);
  m.worker_health.with({"http://w:1"}).set(1);
  m.worker_cb_state.with({"http://w:1"}).set(2);
  m.worker_active.with({"http://w:1"}).set(5);
  m.smg_router_request("m", "/v1/chat/completions", true, false)->inc();
  m.smg_router_request("m", "/v1/chat/completions", true, false)->inc();
  m.smg_selection("decode", "m", "cache_aware")->inc();
  m.smg_retry("regular", "chat");
  std::string text = r.expose();
  EXPECT_TRUE(has(text, "smg_http_requests_total{method=\"POST\",path=\"/generate\"} 4\n"));
  EXPECT_TRUE(has(text, "smg_http_requests_total{method=\"PUT\",path=\"/generate\"} 1\n"));
  EXPECT_TRUE(has(text, "smg_http_requests_total{method=\"GET\",path=\"/health\"} 2\n"));
  EXPECT_TRUE(has(text, "smg_http_requests_total{method=\"GET\",path=\"/v1/responses/{id}\"} 1\n"));
  EXPECT_TRUE(
      has(text, "smg_http_requests_total{method=\"DELETE\",path=\"/v1/responses/{id}\"} 1\n"));
  EXPECT_TRUE(has(text, "smg_http_requests_total{method=\"OTHER\",path=\"unknown\"} 1\n"));
  // smg v1.11.0's tree-mode branches; imbalanced decisions are not among them (not counted).
  EXPECT_TRUE(has(text, "smg_cache_aware_policy_branch_total{branch=\"tree_match\"} 4\n"));
  EXPECT_TRUE(
      has(text, "smg_cache_aware_policy_branch_total{branch=\"expected_wait_fallback\"} 1\n"));
  EXPECT_FALSE(has(text, "smg_cache_aware_policy_branch_total{branch=\"next\"}"));
  EXPECT_FALSE(has(text, "smg_cache_aware_policy_branch_total{branch=\"load_balance\"}"));
  EXPECT_FALSE(has(text, "smg_cache_aware_policy_branch_total{branch=\"imbalanced\"}"));
  EXPECT_TRUE(has(text, "smg_worker_health{worker=\"http://w:1\"} 1\n"));
  EXPECT_TRUE(has(text, "smg_worker_cb_state{worker=\"http://w:1\"} 2\n"));
  EXPECT_TRUE(has(text, "smg_worker_requests_active{worker=\"http://w:1\"} 5\n"));
  EXPECT_TRUE(
      has(text,
          "smg_router_requests_total{router_type=\"http\",backend_type=\"regular\","
          "connection_mode=\"http\",model=\"m\",endpoint=\"chat\",streaming=\"true\"} 2\n"));
  EXPECT_TRUE(has(text,
                  "smg_worker_selection_total{worker_type=\"decode\",connection_mode=\"http\","
                  "model=\"m\",policy=\"cache_aware\"} 1\n"));
  EXPECT_TRUE(has(text, "smg_worker_retries_total{worker_type=\"regular\",endpoint=\"chat\"} 1\n"));
  // Scraped again after more traffic: the sums follow.
  m.branch_counter("cache_aware", "cache_hit").inc(2);
  text = r.expose();
  EXPECT_TRUE(has(text, "smg_cache_aware_policy_branch_total{branch=\"tree_match\"} 6\n"));
}

TEST(GatewayMetrics, SignalCellsCarryRuleWorkerAndRank) {
  metrics::Registry r;
  GatewayMetrics m(r, metrics::latency_buckets());
  SignalCells c = m.signal_cells("chat", "http://w:1", "3");
  c.first_token->observe(0.2);
  c.generated_tokens->inc(7);
  SignalCells none = m.signal_cells("chat", "http://w:1", "");
  EXPECT_NE(none.first_token, c.first_token);
  std::string text = r.expose();
  EXPECT_TRUE(has(text,
                  "kvgate_time_to_first_token_seconds_count{rule=\"chat\",worker=\"http://"
                  "w:1\",rank=\"3\"} 1\n"));
  EXPECT_TRUE(has(text,
                  "kvgate_generated_tokens_total{rule=\"chat\",worker=\"http://w:1\","
                  "rank=\"3\"} 7\n"));
  // A worker's removal takes its signal series too (remove_worker_metrics: label "worker").
  r.remove_series("worker", "http://w:1");
  EXPECT_FALSE(has(r.expose(), "http://w:1"));
}

TEST(SmgEndpoint, NamesTheRoutesAsSglModelGatewayDoes) {
  EXPECT_EQ(smg_endpoint("/v1/chat/completions"), "chat");
  EXPECT_EQ(smg_endpoint("/generate"), "generate");
  EXPECT_EQ(smg_endpoint("/v1/completions"), "completions");
  EXPECT_EQ(smg_endpoint("/v1/embeddings"), "embeddings");
  EXPECT_EQ(smg_endpoint("/v1/rerank"), "rerank");
  EXPECT_EQ(smg_endpoint("/health"), "other");
}

}  // namespace
}  // namespace kvgate
