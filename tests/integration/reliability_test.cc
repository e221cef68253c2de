// Integration: what kvgate does when workers fail: a killed worker's in-flight requests end with
// one clear error each (never resent: the worker had them) and new ones go elsewhere; a stream
// broken mid-way ends with an error event; the circuit breaker opens and recovers; timeouts,
// unreachable workers and client disconnects. Errors name workers by id, never by URL.
#include <gtest/gtest.h>

#include <future>
#include <map>
#include <thread>

#include "support/cluster.h"

namespace kvgate::testing {
namespace {

using namespace std::chrono_literals;

const char* kGenerate = R"({"text":"hello","sampling_params":{"max_new_tokens":4}})";
const char* kChatStream =
    R"({"model":"m","messages":[{"role":"user","content":"Hi"}],"max_tokens":20,"stream":true})";

Response post_once(int port, const std::string& path, const std::string& body) {
  HttpClient c(port);
  c.set_timeout(30s);
  return c.post(path, body);
}

// sglang:num_running_reqs of a sim started with --enable-metrics (-1 when unreadable).
double sim_running(const Sim& sim) {
  HttpClient h(sim.port);
  std::string m = h.get("/metrics").body;
  auto pos = m.find("\nsglang:num_running_reqs{");
  if (pos == std::string::npos) return -1;
  return std::atof(m.c_str() + m.find("} ", pos) + 2);
}

TEST(Reliability, KilledWorkerEndsItsRequestsClearlyThenIsExcluded) {
  Cluster c(2, {"--ttft-ms", "5", "--tpot-ms", "100", "--enable-metrics"},
            {"--policy", "round_robin", "--debug-headers", "--health-check-interval-secs", "1",
             "--health-failure-threshold", "1", "--retry-initial-backoff-ms", "10"});
  std::vector<std::future<Response>> inflight;
  for (int i = 0; i < 6; ++i) {
    inflight.push_back(std::async(std::launch::async, [&] {
      return post_once(c.port(), "/generate",
                       R"({"text":"hello","sampling_params":{"max_new_tokens":40}})");
    }));
  }
  // Every request reached a worker (three each, round robin) before the kill.
  ASSERT_TRUE(wait_until([&] { return sim_running(c.sim(0)) == 3 && sim_running(c.sim(1)) == 3; }));
  std::string killed = c.sim(0).url();
  c.sim(0).kill();
  int ok = 0, failed = 0;
  for (auto& f : inflight) {
    Response r = f.get();
    if (r.status == 200) {
      ++ok;
      EXPECT_EQ(r.header("x-kvgate-worker"), c.sim(1).url());
    } else {
      // The killed worker had these whole: resending could run them twice. One clear error each.
      ++failed;
      EXPECT_EQ(r.status, 502) << r.body;
      EXPECT_NE(r.body.find("upstream_no_answer"), std::string::npos) << r.body;
      EXPECT_EQ(r.body.find(killed), std::string::npos) << r.body;
    }
  }
  EXPECT_EQ(ok, 3);
  EXPECT_EQ(failed, 3);
  EXPECT_EQ(c.metric("kvgate_retries_denied_total{reason=\"unsafe\"}"), 3) << c.metrics();
  ASSERT_TRUE(c.wait_healthy(1)) << c.gateway().log();
  HttpClient client(c.port());
  for (int i = 0; i < 6; ++i) {
    auto r = client.post("/generate", kGenerate);
    EXPECT_EQ(r.status, 200);
    EXPECT_EQ(r.header("x-kvgate-worker"), c.sim(1).url());
    EXPECT_EQ(r.header("x-kvgate-attempts"), "1");
  }
  EXPECT_EQ(c.metric("kvgate_worker_health{worker=\"" + killed + "\"}"), 0);
  // It comes back: traffic returns once it passes health checks again.
  c.sim(0).start();
  ASSERT_TRUE(c.wait_healthy(2, 20s)) << c.gateway().log();
}

TEST(Reliability, MidStreamFailureEndsWithErrorEventNotAHang) {
  Cluster c(1,
            {"--ttft-ms", "5", "--tpot-ms", "5", "--drop-mid-stream-rate", "1",
             "--drop-after-chunks", "2"},
            {"--policy", "round_robin", "--health-check-interval-secs", "60"});
  HttpClient client(c.port());
  client.set_timeout(10s);
  auto r = client.post("/v1/chat/completions", kChatStream);
  ASSERT_EQ(r.status, 200);
  EXPECT_FALSE(r.truncated) << r.body;  // the chunked body was terminated properly
  auto events = sse_data(r.body);
  ASSERT_GE(events.size(), 2u) << r.body;
  EXPECT_EQ(events.back(), "[DONE]");
  EXPECT_NE(events[events.size() - 2].find("\"upstream_failed\""), std::string::npos) << r.body;
  EXPECT_NE(events[events.size() - 2].find("worker #1"), std::string::npos) << r.body;
  EXPECT_EQ(r.body.find(c.sim(0).url()), std::string::npos) << r.body;
}

TEST(Reliability, BreakerOpensAndRecovers) {
  Cluster c(2, {"--ttft-ms", "1", "--tpot-ms", "1"},
            {"--policy", "round_robin", "--debug-headers", "--health-check-interval-secs", "60",
             "--cb-failure-threshold", "3", "--cb-success-threshold", "2",
             "--cb-timeout-duration-secs", "1", "--retry-initial-backoff-ms", "1"});
  std::string bad = c.sim(0).url();
  std::string cb = "kvgate_worker_cb_state{worker=\"" + bad + "\"}";
  HttpClient sim0(c.sim(0).port);
  ASSERT_EQ(sim0.post("/sim/faults", R"({"fail_rate":1.0,"fail_status":500})").status, 200);
  HttpClient client(c.port());
  for (int i = 0; i < 8; ++i) {
    auto r = client.post("/generate", kGenerate);
    EXPECT_EQ(r.status, 200) << r.body;  // retried on the good worker
    EXPECT_EQ(r.header("x-kvgate-worker"), c.sim(1).url());
  }
  EXPECT_EQ(c.metric(cb), 1) << c.metrics();  // open
  // While open, nothing is sent to the bad worker: every request succeeds at the first attempt.
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(client.post("/generate", kGenerate).header("x-kvgate-attempts"), "1");
  ASSERT_EQ(sim0.post("/sim/faults", R"({"fail_rate":0.0})").status, 200);
  // After the open timeout, trial requests (half-open) succeed and close it again.
  ASSERT_TRUE(wait_until(
      [&] {
        client.post("/generate", kGenerate);
        return c.metric(cb) == 0;
      },
      10s))
      << c.metrics();
  std::map<std::string, int> spread;
  for (int i = 0; i < 10; ++i)
    spread[client.post("/generate", kGenerate).header("x-kvgate-worker")]++;
  EXPECT_EQ(spread.size(), 2u);
}

TEST(Reliability, UpstreamTimeoutIs504) {
  Cluster c(1, {"--hang-rate", "1"},
            {"--policy", "round_robin", "--request-timeout-secs", "1",
             "--health-check-interval-secs", "60"});
  auto r = post_once(c.port(), "/generate", kGenerate);
  EXPECT_EQ(r.status, 504) << r.body;
  EXPECT_NE(r.body.find("upstream_timeout"), std::string::npos);
  EXPECT_EQ(r.body.find(c.sim(0).url()), std::string::npos) << r.body;
}

TEST(Reliability, UnreachableAfterRetriesIs502WithoutInternalDetails) {
  Cluster c(1, {},
            {"--policy", "round_robin", "--health-check-interval-secs", "60",
             "--retry-initial-backoff-ms", "1", "--retry-max-retries", "3"});
  c.sim(0).kill();
  auto r = post_once(c.port(), "/generate", kGenerate);
  EXPECT_EQ(r.status, 502) << r.body;
  EXPECT_NE(r.body.find("upstream_unreachable"), std::string::npos) << r.body;
  EXPECT_EQ(r.body.find(c.sim(0).url()), std::string::npos) << r.body;
  EXPECT_EQ(r.body.find("refused"), std::string::npos) << r.body;  // no socket error text
  EXPECT_NE(r.body.find("3 attempts"), std::string::npos) << r.body;
  // The log has what the client does not: the worker's URL and the socket error.
  EXPECT_NE(c.gateway().log().find(c.sim(0).url()), std::string::npos);
}

TEST(Reliability, NoHealthyWorkerIs503AndNotReady) {
  Cluster c(1, {"--start-unhealthy-secs", "600"},
            {"--policy", "round_robin", "--health-check-interval-secs", "1"}, false);
  HttpClient client(c.port());
  EXPECT_EQ(client.get("/readiness").status, 503);
  EXPECT_EQ(client.get("/liveness").status, 200);
  auto r = client.post("/generate", kGenerate);
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_NE(r.body.find("no_available_workers"), std::string::npos);
  // The worker turns healthy later: the gateway starts routing without a restart.
  HttpClient sim(c.sim(0).port);
  ASSERT_EQ(sim.post("/sim/faults", R"({"unhealthy":false})").status, 200);
  ASSERT_TRUE(c.wait_healthy(1));
  EXPECT_EQ(client.post("/generate", kGenerate).status, 200);
}

TEST(Reliability, ClientDisconnectCancelsUpstream) {
  Cluster c(1, {"--ttft-ms", "5", "--tpot-ms", "100", "--enable-metrics"},
            {"--policy", "round_robin", "--health-check-interval-secs", "60"});
  {
    HttpClient client(c.port());
    int chunks = 0;
    client.stream("POST", "/generate",
                  R"({"text":"hi","sampling_params":{"max_new_tokens":100},"stream":true})", {},
                  [&](std::string_view) { return ++chunks < 2; });
  }  // closed after the first chunks; the generation had ~10 s to go
  EXPECT_TRUE(wait_until([&] { return sim_running(c.sim(0)) == 0; }, 3s));
  EXPECT_TRUE(wait_until([&] { return c.metric("kvgate_client_disconnects_total") == 1; }, 3s));
}

}  // namespace
}  // namespace kvgate::testing
