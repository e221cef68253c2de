// Integration: the gateway's own answers: 4xx cases, admission (429/408), API key, request ids,
// and the Prometheus exposition checked by promtool.
#include <gtest/gtest.h>

#include <future>

#include "support/cluster.h"

namespace kvgate::testing {
namespace {

using namespace std::chrono_literals;

const char* kGenerate = R"({"text":"hello","sampling_params":{"max_new_tokens":4}})";
const std::vector<std::string> kFast = {"--ttft-ms", "1", "--tpot-ms", "1"};

TEST(Api, ClientErrors) {
  Cluster c(1, kFast, {"--policy", "round_robin", "--max-payload-size", "1000"});
  HttpClient client(c.port());
  auto r = client.post("/generate", std::string(2000, ' '));
  EXPECT_EQ(r.status, 413);
  EXPECT_NE(r.body.find("--max-payload-size"), std::string::npos) << r.body;

  HttpClient client2(c.port());
  r = client2.post("/v1/chat/completions", R"({"model": "m", "messages": [)");
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("not valid JSON"), std::string::npos) << r.body;
  r = client2.post("/v1/chat/completions", R"(["not", "an", "object"])");
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("must be a JSON object"), std::string::npos) << r.body;
  r = client2.post("/v1/chat/completions", R"({"stream": "yes"})");
  EXPECT_EQ(r.status, 400);
  r = client2.get("/v2/unknown");
  EXPECT_EQ(r.status, 404);
  EXPECT_NE(r.body.find("\"code\":\"not_found\""), std::string::npos) << r.body;
  r = client2.get("/generate");
  EXPECT_EQ(r.status, 405);
  EXPECT_EQ(client2.get("/health").status, 200);  // the connection survived every error
}

TEST(Api, QueueFullIs429AndQueueTimeoutIs408) {
  Cluster c(1, {"--ttft-ms", "2000", "--tpot-ms", "1"},
            {"--policy", "round_robin", "--max-concurrent-requests", "1", "--queue-size", "1",
             "--queue-timeout-secs", "1"});
  auto slow = std::async(std::launch::async, [&] {
    HttpClient h(c.port());
    h.set_timeout(30s);
    return h.post("/generate", kGenerate).status;
  });
  ASSERT_TRUE(wait_until([&] {
    return c.metric("kvgate_worker_requests_active{worker=\"" + c.sim(0).url() + "\"}") == 1;
  }));
  auto queued = std::async(std::launch::async, [&] {
    HttpClient h(c.port());
    h.set_timeout(30s);
    return h.post("/generate", kGenerate);
  });
  ASSERT_TRUE(wait_until([&] { return c.metric("kvgate_admission_queue_depth") == 1; }));
  HttpClient third(c.port());
  auto r = third.post("/generate", kGenerate);
  EXPECT_EQ(r.status, 429) << r.body;
  EXPECT_NE(r.body.find("queue_full"), std::string::npos);
  auto q = queued.get();
  EXPECT_EQ(q.status, 408) << q.body;
  EXPECT_NE(q.body.find("queue_timeout"), std::string::npos);
  EXPECT_EQ(slow.get(), 200);
  EXPECT_EQ(c.metric("kvgate_admission_rejected_total{reason=\"queue_full\"}"), 1);
  EXPECT_EQ(c.metric("kvgate_admission_rejected_total{reason=\"timeout\"}"), 1);
}

TEST(Api, ApiKeyRequiredExceptOnProbes) {
  Cluster c(1, kFast, {"--policy", "round_robin", "--api-key", "s3cret"});
  HttpClient client(c.port());
  EXPECT_EQ(client.post("/generate", kGenerate).status, 401);
  EXPECT_EQ(client.post("/generate", kGenerate, {{"Authorization", "Bearer wrong"}}).status, 401);
  EXPECT_EQ(client.post("/generate", kGenerate, {{"Authorization", "Bearer s3cret"}}).status, 200);
  EXPECT_EQ(client.get("/health").status, 200);
  EXPECT_EQ(client.get("/readiness").status, 200);
}

TEST(Api, RequestIdIsKeptOrGenerated) {
  Cluster c(1, kFast, {"--policy", "round_robin"});
  HttpClient client(c.port());
  auto r = client.post("/generate", kGenerate, {{"X-Request-Id", "abc-123"}});
  EXPECT_EQ(r.header("x-request-id"), "abc-123");
  r = client.post("/generate", kGenerate);
  EXPECT_EQ(r.header("x-request-id").size(), 32u);
  r = client.get("/nope");
  EXPECT_EQ(r.header("x-request-id").size(), 32u);  // errors carry one too
}

// The exposition passes promtool, with sgl-model-gateway's names too (--metrics-compat smg).
TEST(Api, MetricsPassPromtool) {
  for (bool smg : {false, true}) {
    SCOPED_TRACE(smg ? "--metrics-compat smg" : "kvgate's names only");
    std::vector<std::string> args = {"--policy", "power_of_two", "--load-check-interval-ms", "100"};
    if (smg) args.insert(args.end(), {"--metrics-compat", "smg"});
    Cluster c(2, kFast, args);
    HttpClient client(c.port());
    for (int i = 0; i < 5; ++i) client.post("/generate", kGenerate);
    client.post("/generate", "{bad");
    client.get("/nope");
    // A request is counted once its answer is written: the client can read the 404 before
    // kvgate has counted it.
    std::string text;
    wait_until([&] {
      text = c.metrics();
      return text.find("kvgate_requests_total{route=\"unknown\",status=\"404\"") !=
             std::string::npos;
    });
    const std::string ok_generate =
        "kvgate_requests_total{route=\"/generate\",status=\"200\",model=\"\",streaming="
        "\"false\"} 5";
    for (const char* name :
         {ok_generate.c_str(), "kvgate_requests_total{route=\"/generate\",status=\"400\"",
          "kvgate_requests_total{route=\"unknown\",status=\"404\"",
          "kvgate_request_duration_seconds_bucket", "kvgate_worker_requests_active",
          "kvgate_worker_health", "kvgate_worker_cb_state", "kvgate_worker_reported_load",
          "kvgate_worker_selection_total", "kvgate_policy_branch_total{policy=\"power_of_two\"",
          "kvgate_e2e_request_duration_seconds_bucket{rule=\"default\"",
          "kvgate_time_to_first_byte_seconds_bucket{rule=\"default\""}) {
      EXPECT_NE(text.find(name), std::string::npos) << name << "\n" << text;
    }
    const char* smg_names[] = {
        "smg_http_requests_total{method=\"POST\",path=\"/generate\"} 6",
        "smg_router_requests_total{router_type=\"http\",backend_type=\"regular\","
        "connection_mode=\"http\",model=\"\",endpoint=\"generate\",streaming=\"false\"} 6",
        "smg_worker_requests_active{worker=",
        "smg_worker_health{worker=",
        "smg_worker_cb_state{worker=",
        "smg_worker_selection_total{worker_type=\"regular\",connection_mode=\"http\",model=\"\","
        "policy=\"power_of_two\"} 5"};
    for (const char* name : smg_names) {
      EXPECT_EQ(text.find(name) != std::string::npos, smg) << name << "\n" << text;
    }
    EXPECT_EQ(text.find("smg_") != std::string::npos, smg);
    auto r = run("/usr/bin/promtool", {"check", "metrics"}, text);
    EXPECT_EQ(r.status, 0) << r.output;
  }
}

}  // namespace
}  // namespace kvgate::testing
