// Tests of gateway/stats: GET /v1/stats, the dashboard's JSON, built from the same cells /metrics
// exposes (requests by status class, time-to-first-token buckets summed over workers, decisions
// per policy branch, each worker's usage per DP rank) and the decision log.
#include "gateway/stats.h"

#include <gtest/gtest.h>

#include "unit/gateway/pools_fixture.h"

namespace kvgate {
namespace {

using Json = nlohmann::ordered_json;

using testing::make_rule;

class StatsTest : public testing::PoolsFixture {
 protected:
  Json stats() {
    StatsInput in{.table = pools_->table(),
                  .metrics = &metrics_,
                  .decisions = &log_,
                  .in_flight = 3,
                  .queue_depth = 1,
                  .health_interval = std::chrono::seconds(10),
                  .started = std::chrono::system_clock::now() - std::chrono::seconds(5)};
    return stats_json(in);
  }

  DecisionLog log_;
};

TEST_F(StatsTest, CountsRequestsByStatusClassAndSumsTimeToFirstToken) {
  metrics_.requests.with({"/generate", "200", "", "false"}).inc(7);
  metrics_.requests.with({"/generate", "503", "", "false"}).inc(2);
  metrics_.requests.with({"/v1/chat/completions", "429", "m", "true"}).inc(1);
  metrics_.requests.with({"/readiness", "503", "", "false"}).inc(5);  // probes are not traffic
  metrics_.requests.with({"/health", "200", "", "false"}).inc(5);
  metrics_.time_to_first_token.with({"a", "http://w1", ""}).observe(0.003);
  metrics_.time_to_first_token.with({"a", "http://w2", "0"}).observe(0.003);
  metrics_.time_to_first_token.with({"a", "http://w2", "1"}).observe(20);
  Json s = stats();
  EXPECT_EQ(s["requests"]["total"], 10);
  EXPECT_EQ(s["requests"]["errors"], 2);
  EXPECT_EQ(s["requests"]["client_errors"], 1);
  EXPECT_EQ(s["requests"]["in_flight"], 3);
  EXPECT_EQ(s["requests"]["queue_depth"], 1);
  EXPECT_EQ(s["health_interval_secs"], 10);
  EXPECT_GE(s["uptime_secs"].get<double>(), 5.0);
  const Json& ttft = s["ttft"];
  EXPECT_EQ(ttft["count"], 3);
  ASSERT_EQ(ttft["buckets"].size(), ttft["bounds"].size() + 1);
  uint64_t total = 0;
  for (const auto& b : ttft["buckets"]) total += b.get<uint64_t>();
  EXPECT_EQ(total, 3u);
  // 0.003 s twice in the bucket bounded by 0.005 (not cumulative).
  const auto& bounds = ttft["bounds"];
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (bounds[i].get<double>() == 0.005) {
      EXPECT_EQ(ttft["buckets"][i], 2);
    }
  }
}

TEST_F(StatsTest, ListsBranchesPerPolicy) {
  metrics_.branch_counter("cache_aware", "cache_hit").inc(4);
  metrics_.branch_counter("cache_aware", "cache_miss_min_load").inc(1);
  metrics_.branch_counter("kv_exact", "kv_exact_hit").inc(2);
  Json s = stats();
  ASSERT_EQ(s["branches"].size(), 3u);
  EXPECT_EQ(s["branches"][0]["policy"], "cache_aware");
  EXPECT_EQ(s["branches"][0]["branch"], "cache_hit");
  EXPECT_EQ(s["branches"][0]["count"], 4);
  EXPECT_EQ(s["branches"][2]["branch"], "kv_exact_hit");
}

TEST_F(StatsTest, ShowsEveryRuleAndWorkerWithItsUsagePerRank) {
  auto errors = pools_->apply({make_rule("a", {"http://127.0.0.1:1", "http://127.0.0.1:2"}),
                               make_rule("b", {"http://127.0.0.1:2"}, {"m"})});
  ASSERT_TRUE(errors.empty()) << rules::format_errors(errors);
  metrics_.prompt_tokens.with({"a", "http://127.0.0.1:1", "0"}).inc(100);
  metrics_.prompt_tokens.with({"a", "http://127.0.0.1:1", "1"}).inc(50);
  metrics_.cached_tokens.with({"a", "http://127.0.0.1:1", "1"}).inc(40);
  metrics_.predicted_tokens.with({"a", "http://127.0.0.1:1", "1"}).inc(48);
  metrics_.prompt_tokens.with({"b", "http://127.0.0.1:2", ""}).inc(7);
  metrics_.worker_requests.with({"http://127.0.0.1:2"}).inc(9);
  metrics_.worker_failures.with({"http://127.0.0.1:2"}).inc(1);
  Json s = stats();
  ASSERT_EQ(s["rules"].size(), 2u);
  const Json& a = s["rules"][0];
  EXPECT_EQ(a["name"], "a");
  EXPECT_EQ(a["policy"], "round_robin");
  EXPECT_EQ(s["rules"][1]["models"], Json::array({"m"}));
  EXPECT_TRUE(a["kv"].is_null());
  ASSERT_EQ(a["workers"].size(), 2u);
  const Json& w1 = a["workers"][0];
  EXPECT_EQ(w1["url"], "http://127.0.0.1:1");
  EXPECT_EQ(w1["role"], "regular");
  EXPECT_EQ(w1["breaker"], "closed");
  EXPECT_EQ(w1["prompt_tokens"], 150);
  EXPECT_EQ(w1["cached_tokens"], 40);
  EXPECT_EQ(w1["predicted_tokens"], 48);
  ASSERT_EQ(w1["ranks"].size(), 2u);
  EXPECT_EQ(w1["ranks"][1]["rank"], 1);
  EXPECT_EQ(w1["ranks"][1]["cached_tokens"], 40);
  // A worker in two rules: its usage per rule, its attempts (per worker) in both.
  const Json& b = s["rules"][1];
  EXPECT_EQ(b["workers"][0]["prompt_tokens"], 7);
  EXPECT_EQ(b["workers"][0]["ranks"].size(), 0u);  // no rank named
  EXPECT_EQ(b["workers"][0]["requests"], 9);
  EXPECT_EQ(b["workers"][0]["failures"], 1);
  EXPECT_EQ(a["workers"][1]["prompt_tokens"], 0);
}

TEST_F(StatsTest, TextThatIsNotUtf8IsReplacedNotThrown) {
  DecisionRecord r;
  r.rid = "abc";
  r.worker = "http://w\xff\xfe/";  // bytes an engine or a client could bring in
  r.branch = "next";
  log_.add(r);
  StatsInput in{.table = pools_->table(), .metrics = &metrics_, .decisions = &log_};
  EXPECT_THROW((void)stats_json(in).dump(), nlohmann::json::type_error);
  std::string text;
  ASSERT_NO_THROW(text = stats_text(in));
  EXPECT_NE(text.find("http://w\xef\xbf\xbd\xef\xbf\xbd/"), std::string::npos) << text;
}

TEST_F(StatsTest, ExplainsTheRecentDecisionsNewestFirst) {
  for (int i = 0; i < 150; ++i) {
    DecisionRecord r;
    r.rid = "rid-" + std::to_string(i);
    r.rule = "a";
    r.worker = "http://127.0.0.1:1";
    r.policy = "kv_exact";
    r.branch = "kv_exact_hit";
    r.page_size = 16;
    r.predicted_tokens = 32;
    r.request_tokens = 70;
    r.rank = 0;
    r.status = 200;
    log_.add(r);
  }
  Json s = stats();
  EXPECT_EQ(s["decisions"]["total"], 150);
  const Json& recent = s["decisions"]["recent"];
  ASSERT_EQ(recent.size(), 100u);
  EXPECT_EQ(recent[0]["rid"], "rid-149");
  EXPECT_EQ(recent[0]["matched_pages"], 2);
  EXPECT_EQ(recent[0]["prompt_pages"], 4);
  EXPECT_TRUE(recent[0]["matched_chars"].is_null());
  EXPECT_TRUE(recent[0]["cached_tokens"].is_null());
  EXPECT_EQ(recent[0]["rank"], 0);
  EXPECT_NE(recent[0]["explain"].get<std::string>().find("holds 2 of the prompt's 4 full pages"),
            std::string::npos)
      << recent[0]["explain"];
}

}  // namespace
}  // namespace kvgate
