// Conformance: the dashboard (GET /ui) in a real browser. Debian's Chromium, driven by
// playwright-core (tests/browser/dashboard.mjs), opens the page of a kvgate routing kv_exact over
// two kvgate-sim servers of two DP ranks each, under load: the token login, every worker and
// (endpoint, rank) shown, counters moving, a killed worker turning red within the health
// interval, no console error or CSP violation. The screenshot is left in
// build/test-artifacts/dashboard.png.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <thread>

#include "support/chats.h"
#include "support/cluster.h"
#include "support/models.h"
#include "support/temp_dir.h"

#ifndef KVGATE_SOURCE_DIR
#define KVGATE_SOURCE_DIR "."
#endif
#ifndef KVGATE_ARTIFACT_DIR
#define KVGATE_ARTIFACT_DIR "."
#endif

namespace kvgate::testing {
namespace {

using namespace std::chrono_literals;

constexpr const char* kKey = "dashboard-test-admin-key-0123456789";
constexpr int kRanks = 2;

TEST(Dashboard, ShowsEveryWorkerAndRankLiveInChromium) {
  const std::string dir = std::string(KVGATE_SOURCE_DIR) + "/tests/browser";
  ASSERT_TRUE(std::filesystem::exists(dir + "/node_modules/playwright-core"))
      << "playwright-core is missing: run scripts/setup";
  ASSERT_TRUE(std::filesystem::exists("/usr/bin/chromium"))
      << "Debian's chromium is missing: run scripts/setup";
  const std::string tokenizer = models_dir() + "/qwen3";

  TempDir tmp;
  std::string yaml =
      "rules:\n  - name: default\n    mode: 4\n    sel: round_robin\n    kvEngineType: sglang\n"
      "    kvExactMode: 3\n    kvBlockSize: 16\n    kvDpRankCount: " +
      std::to_string(kRanks) + "\n    kvWarmupSec: 0\n    tokenizerPath: " + tokenizer +
      "\n    endpoints:\n";
  std::vector<Sim> sims;
  for (int i = 0; i < 2; ++i) {
    Sim s;
    s.port = free_port();
    int events = free_ports(kRanks);
    s.args = {
        "--page-size",
        "16",
        "--dp-size",
        std::to_string(kRanks),
        "--tokenizer-path",
        tokenizer,
        "--enable-cache-report",
        "--time-scale",
        "0.02",
        "--kv-events-config",
        R"({"publisher":"zmq","endpoint":"tcp://*:)" + std::to_string(events) + R"(","topic":""})"};
    s.start();
    yaml += "      - url: " + s.url() + "\n        kvZmqPort: " + std::to_string(events) + "\n";
    sims.push_back(std::move(s));
  }
  const std::string config = tmp.write("kvgate.yaml", yaml);
  const std::string key_file = tmp.write("admin.key", std::string(kKey) + "\n");
  const int port = free_port();
  const int admin_port = free_port();
  const int health_secs = 1;
  Process gateway(
      "kvgate", {"--config", config, "--host", "127.0.0.1", "--port", std::to_string(port),
                 "--prometheus-host", "127.0.0.1", "--prometheus-port", std::to_string(free_port()),
                 "--admin-port", std::to_string(admin_port), "--admin-api-key-file", key_file,
                 "--health-check-interval-secs", std::to_string(health_secs),
                 "--health-failure-threshold", "1"});
  ASSERT_TRUE(wait_until(
      [&] {
        HttpClient c(port);
        c.set_timeout(2s);
        auto r = c.get("/readiness");
        return r.status == 200;
      },
      30s))
      << gateway.log();

  // Load: conversations growing turn by turn (their prefixes cached where they went), until the
  // browser is done. Failures are expected once a worker is killed (retries absorb most).
  std::atomic<bool> stop{false};
  std::atomic<int> answered{0};
  std::vector<std::thread> load;
  for (int t = 0; t < 2; ++t) {
    load.emplace_back([&, t] {
      HttpClient c(port);
      c.set_timeout(10s);
      for (int n = 0; !stop.load() && n < 100000; ++n) {
        int conv = t * 1000 + n / 4;
        std::vector<std::string> turns;
        for (int k = 0; k <= 2 * (n % 4); ++k) turns.push_back(turn_message(conv, k));
        std::string body = chat_body(turns);
        if (n % 2 == 1) body.insert(1, R"("stream":true,)");  // (time to first token is streams')
        if (c.post("/v1/chat/completions", body).status == 200) ++answered;
      }
    });
  }
  struct Stop {
    std::atomic<bool>& stop;
    std::vector<std::thread>& threads;
    ~Stop() {
      stop = true;
      for (auto& t : threads) t.join();
    }
  } stopper{stop, load};

  std::string ranks;
  for (const auto& s : sims) {
    for (int r = 0; r < kRanks; ++r) {
      ranks += (ranks.empty() ? "" : ",") + s.url() + "#" + std::to_string(r);
    }
  }
  std::filesystem::create_directories(KVGATE_ARTIFACT_DIR);
  const std::string shot = std::string(KVGATE_ARTIFACT_DIR) + "/dashboard.png";
  auto r = run("/usr/bin/node",
               {dir + "/dashboard.mjs", "--base", "http://127.0.0.1:" + std::to_string(admin_port),
                "--token", kKey, "--workers", sims[0].url() + "," + sims[1].url(), "--ranks", ranks,
                "--kill-pid", std::to_string(sims[1].process->pid()), "--kill-url", sims[1].url(),
                "--health-secs", std::to_string(health_secs), "--health-failures", "1",
                "--screenshot", shot});
  EXPECT_EQ(r.status, 0) << r.output << "\nkvgate:\n" << gateway.log();
  EXPECT_NE(r.output.find(R"("ok":true)"), std::string::npos) << r.output;
  EXPECT_TRUE(std::filesystem::exists(shot)) << shot;
  EXPECT_GT(answered.load(), 0);
  std::cout << "dashboard screenshot: " << shot << "\n" << r.output << std::endl;
}

}  // namespace
}  // namespace kvgate::testing
