// Integration: kvgate in front of real kvgate-sim servers on loopback. Every proxied route, stream
// and non-stream; how round_robin spreads; /v1/models merged from workers.
#include <gtest/gtest.h>

#include <map>

#include "support/cluster.h"

namespace kvgate::testing {
namespace {

const std::vector<std::string> kFastSim = {"--ttft-ms", "5", "--tpot-ms", "1"};
const std::vector<std::string> kRoundRobin = {"--policy", "round_robin", "--debug-headers",
                                              "--health-check-interval-secs", "1"};

const char* kChat =
    R"({"model":"kvgate-sim","messages":[{"role":"user","content":"Hello there"}],"max_tokens":8})";
const char* kChatStream =
    R"({"model":"kvgate-sim","messages":[{"role":"user","content":"Hello"}],"max_tokens":8,"stream":true,"stream_options":{"include_usage":true}})";
const char* kCompletion = R"({"model":"kvgate-sim","prompt":"Once upon a time","max_tokens":8})";
const char* kCompletionStream =
    R"({"model":"kvgate-sim","prompt":"Once upon a time","max_tokens":8,"stream":true})";
const char* kGenerate =
    R"({"text":"The capital of France is","sampling_params":{"max_new_tokens":8}})";
const char* kGenerateStream =
    R"({"text":"The capital of France is","sampling_params":{"max_new_tokens":8},"stream":true})";

TEST(Routing, EveryRouteNonStreamAndStream) {
  Cluster c(2, kFastSim, kRoundRobin);
  HttpClient client(c.port());
  struct Case {
    std::string path, body;
    bool stream;
    std::string expect;
  };
  std::vector<Case> cases = {
      {"/v1/chat/completions", kChat, false, "\"chat.completion\""},
      {"/v1/chat/completions", kChatStream, true, "chat.completion.chunk"},
      {"/v1/completions", kCompletion, false, "\"text_completion\""},
      {"/v1/completions", kCompletionStream, true, "\"text\""},
      {"/generate", kGenerate, false, "\"meta_info\""},
      {"/generate", kGenerateStream, true, "\"meta_info\""},
      {"/v1/embeddings", R"({"model":"kvgate-sim","input":"hello"})", false, "\"embedding\""},
      {"/v1/rerank", R"({"model":"kvgate-sim","query":"q","documents":["a","b"]})", false,
       "\"score\""},
  };
  for (const auto& k : cases) {
    auto r = client.post(k.path, k.body);
    ASSERT_EQ(r.status, 200) << k.path << " " << r.body;
    EXPECT_NE(r.body.find(k.expect), std::string::npos) << k.path << ": " << r.body;
    EXPECT_FALSE(r.header("x-request-id").empty());
    EXPECT_FALSE(r.header("x-kvgate-worker").empty());
    if (k.stream) {
      EXPECT_EQ(r.header("content-type").rfind("text/event-stream", 0), 0u) << k.path;
      auto events = sse_data(r.body);
      ASSERT_FALSE(events.empty()) << k.path;
      EXPECT_EQ(events.back(), "[DONE]") << k.path;
    }
  }
}

TEST(Routing, StreamArrivesIncrementally) {
  Cluster c(1, {"--ttft-ms", "5", "--tpot-ms", "30"}, kRoundRobin);
  HttpClient client(c.port());
  std::vector<std::chrono::steady_clock::time_point> arrivals;
  auto r = client.stream("POST", "/generate",
                         R"({"text":"hi","sampling_params":{"max_new_tokens":6},"stream":true})",
                         {}, [&](std::string_view) {
                           arrivals.push_back(std::chrono::steady_clock::now());
                           return true;
                         });
  ASSERT_EQ(r.status, 200);
  ASSERT_GE(arrivals.size(), 4u);  // relayed piece by piece, not buffered into one
}

TEST(Routing, RoundRobinSpreadsEvenly) {
  Cluster c(4, kFastSim, kRoundRobin);
  HttpClient client(c.port());
  std::map<std::string, int> per_worker;
  for (int i = 0; i < 40; ++i) {
    auto r = client.post("/v1/chat/completions", kChat);
    ASSERT_EQ(r.status, 200) << r.body;
    per_worker[r.header("x-kvgate-worker")]++;
  }
  ASSERT_EQ(per_worker.size(), 4u);
  for (const auto& [w, n] : per_worker) EXPECT_EQ(n, 10) << w;
  EXPECT_EQ(c.metric("kvgate_policy_branch_total{policy=\"round_robin\",branch=\"next\"}"), 40);
}

TEST(Routing, ModelsMergedFromWorkers) {
  Cluster c(2, {"--served-model-name", "m-one"}, kRoundRobin);
  HttpClient client(c.port());
  // The health plane asks a worker for its models just after the probe that made it healthy, so
  // right after the cluster turns ready the list may still be empty (seen under TSan's slowdown).
  Response r;
  wait_until([&] {
    r = client.get("/v1/models");
    return r.body.find("\"m-one\"") != std::string::npos;
  });
  ASSERT_EQ(r.status, 200);
  EXPECT_NE(r.body.find("\"object\":\"list\""), std::string::npos) << r.body;
  // Both workers serve m-one: it is listed once.
  auto first = r.body.find("\"m-one\"");
  ASSERT_NE(first, std::string::npos) << r.body;
  EXPECT_EQ(r.body.find("\"m-one\"", first + 1), std::string::npos) << r.body;
}

TEST(Routing, PowerOfTwoAndRandomServe) {
  for (std::string policy : {"power_of_two", "random"}) {
    Cluster c(3, kFastSim,
              {"--policy", policy, "--debug-headers", "--health-check-interval-secs", "1"});
    HttpClient client(c.port());
    std::map<std::string, int> per_worker;
    for (int i = 0; i < 30; ++i) {
      auto r = client.post("/generate", kGenerate);
      ASSERT_EQ(r.status, 200) << policy;
      per_worker[r.header("x-kvgate-worker")]++;
      EXPECT_EQ(r.header("x-kvgate-route").rfind(policy + "/", 0), 0u)
          << r.header("x-kvgate-route");
    }
    EXPECT_GE(per_worker.size(), 2u) << policy;
  }
}

}  // namespace
}  // namespace kvgate::testing
