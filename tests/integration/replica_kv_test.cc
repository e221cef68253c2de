// kv_exact across kvgate replicas sharing state through NATS (--replica-sync): a replica that
// joins late, or restarts, while the engines have been storing pages takes a warm peer's
// inventory of every (engine, rank) with the sequence it covers, and continues from the live
// stream (bootstrap "peer", trusted at once); every replica then decides every request alike.
// The engines' own replay is asked first: here it buffers 4 batches, enough for the first
// replica (which joins fresh engines: engine_replay) and long gone when the next one joins.
// Alone, with no replay, a late replica begins mid-stream (cold) and says so in /readiness.
#include <gtest/gtest.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "support/chats.h"
#include "support/cluster.h"
#include "support/http_client.h"
#include "support/models.h"
#include "support/nats.h"
#include "support/process.h"
#include "support/temp_dir.h"

namespace kvgate::testing {
namespace {

using namespace std::chrono_literals;

constexpr int kRanks = 2;

struct KvReplica {
  int port = free_port(), admin = free_port(), metrics = free_port();
  std::unique_ptr<Process> process;
  void start(const std::string& config, const std::string& nats) {
    process = std::make_unique<Process>(
        "kvgate", std::vector<std::string>{
                      "--config", config, "--host", "127.0.0.1", "--port", std::to_string(port),
                      "--admin-port", std::to_string(admin), "--prometheus-host", "127.0.0.1",
                      "--prometheus-port", std::to_string(metrics), "--replica-sync", nats,
                      "--debug-headers", "--threads", "1"});
  }
  std::string readiness() { return HttpClient(port).get("/readiness").body; }
  std::string inventory() { return HttpClient(admin).get("/v1/rules/default/inventory").body; }
  // Occurrences of `needle` in the inventory view.
  size_t count(const std::string& needle) {
    const std::string body = inventory();
    size_t n = 0;
    for (size_t at = body.find(needle); at != std::string::npos; at = body.find(needle, at + 1))
      ++n;
    return n;
  }
  std::string route(const std::string& body) {
    Response r = HttpClient(admin).post("/v1/route?path=/v1/chat/completions", body,
                                        {{"content-type", "application/json"}});
    EXPECT_EQ(r.status, 200) << r.body;
    return json_string_field(r.body, "worker") + "#" +
           std::to_string(json_number_field(r.body, "dp_rank"));
  }
};

struct KvFleet {
  // `replay`: the engines offer a replay endpoint, buffering 4 batches.
  explicit KvFleet(bool replay) {
    const std::string tok = models_dir() + "/qwen3";
    // Misses go to cache_aware, which replicas decide alike (round_robin's cursor is each
    // replica's own: two would agree on a miss by accident only).
    std::string yaml =
        "rules:\n  - name: default\n    mode: 4\n    sel: cache_aware\n"
        "    kvEngineType: sglang\n    kvExactMode: 3\n    kvBlockSize: 16\n    kvDpRankCount: " +
        std::to_string(kRanks) + "\n    kvWarmupSec: 30\n    tokenizerPath: " + tok +
        "\n    endpoints:\n";
    for (int i = 0; i < 2; ++i) {
      Sim s;
      s.port = free_port();
      const int events = free_ports(kRanks);
      const std::string replay_conf = replay ? R"(,"replay_endpoint":"tcp://*:)" +
                                                   std::to_string(free_ports(kRanks)) +
                                                   R"(","buffer_steps":4)"
                                             : "";
      s.args = {"--page-size",
                "16",
                "--dp-size",
                std::to_string(kRanks),
                "--tokenizer-path",
                tok,
                "--enable-cache-report",
                "--time-scale",
                "0",
                "--kv-events-config",
                R"({"publisher":"zmq","endpoint":"tcp://*:)" + std::to_string(events) +
                    R"(","topic":"")" + replay_conf + "}"};
      s.start();
      yaml += "      - url: " + s.url() + "\n        kvZmqPort: " + std::to_string(events) + "\n";
      sims.push_back(std::move(s));
    }
    config = dir.write("kvgate.yaml", yaml);
  }
  TempDir dir;
  std::vector<Sim> sims;
  std::string config;
};

// Every rank of `r` trusted.
bool all_trusted(KvReplica& r) {
  return r.readiness().find(R"("trusted":)" + std::to_string(2 * kRanks)) != std::string::npos;
}

TEST(ReplicasKvExact, ALateReplicaTakesAWarmPeersInventoryAndDecidesAlike) {
  KVGATE_REQUIRE_MODEL("qwen3");
  Nats nats;
  KvFleet fleet(true);
  KvReplica a;
  a.start(fleet.config, nats.url());
  // A alone: the engines just started, their replay gives every batch from 0.
  ASSERT_TRUE(wait_until([&] { return all_trusted(a); }, 30s)) << a.readiness() << a.process->log();
  // Traffic: conversations whose pages the engines store (and publish) before B exists.
  std::vector<std::vector<std::string>> convs(8);
  for (size_t c = 0; c < convs.size(); ++c) {
    for (int t = 0; t < 2; ++t) {
      convs[c].push_back(turn_message(static_cast<int>(c), t));
      Response r = HttpClient(a.port).post("/v1/chat/completions", chat_body(convs[c]),
                                           {{"content-type", "application/json"}});
      ASSERT_EQ(r.status, 200) << r.body;
      convs[c].push_back(json_string_field(r.body, "content"));
    }
  }
  ASSERT_EQ(a.count(R"("bootstrap":"live")") + a.count(R"("bootstrap":"engine_replay")"),
            static_cast<size_t>(2 * kRanks))
      << a.inventory();

  // B joins now: the engines' replay no longer holds batch 0, so only a peer can give it what
  // they stored.
  KvReplica b;
  b.start(fleet.config, nats.url());
  ASSERT_TRUE(wait_until([&] { return b.count(R"("bootstrap":"peer")") == 2 * kRanks; }, 30s))
      << b.inventory() << b.process->log();
  ASSERT_TRUE(wait_until([&] { return all_trusted(b); }, 10s)) << b.readiness();
  // The same blocks per rank as A's.
  auto blocks = [](KvReplica& r) {
    std::vector<double> out;
    const std::string body = r.inventory();
    for (size_t at = body.find(R"("blocks_gpu":)"); at != std::string::npos;
         at = body.find(R"("blocks_gpu":)", at + 1)) {
      out.push_back(json_number_field(body.substr(at), "blocks_gpu"));
    }
    return out;
  };
  EXPECT_EQ(blocks(a), blocks(b));
  double total = 0;
  for (double n : blocks(b)) total += n;
  EXPECT_GT(total, 0);
  // Both decide every next turn (and new conversations) alike.
  for (size_t c = 0; c < convs.size(); ++c) {
    auto next = convs[c];
    next.push_back(turn_message(static_cast<int>(c), 2));
    EXPECT_EQ(a.route(chat_body(next)), b.route(chat_body(next))) << c;
    EXPECT_EQ(a.route(chat_body({turn_message(50 + static_cast<int>(c), 0)})),
              b.route(chat_body({turn_message(50 + static_cast<int>(c), 0)})));
  }
  // And B routes a follow-up to where its conversation is cached (the engine confirms it).
  auto next = convs[0];
  next.push_back(turn_message(0, 2));
  Response r = HttpClient(b.port).post("/v1/chat/completions", chat_body(next),
                                       {{"content-type", "application/json"}});
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.header("x-kvgate-route"), "kv_exact/kv_exact_hit");
  EXPECT_GT(json_number_field(r.body, "cached_tokens"), 0);

  // B killed and restarted: the same again.
  b.process->kill_now();
  b.start(fleet.config, nats.url());
  ASSERT_TRUE(wait_until([&] { return b.count(R"("bootstrap":"peer")") == 2 * kRanks; }, 30s))
      << b.inventory() << b.process->log();
  EXPECT_EQ(blocks(a), blocks(b));
  const std::string metrics = HttpClient(b.metrics).get("/metrics").body;
  EXPECT_NE(metrics.find(R"(kvgate_replica_inventory_requests_total{result="warm"})"),
            std::string::npos);
}

TEST(ReplicasKvExact, ALateReplicaWithNoPeerBeginsColdAndSaysSo) {
  KVGATE_REQUIRE_MODEL("qwen3");
  Nats nats;
  KvFleet fleet(false);
  // Pages stored before any kvgate listens (the engines' parity-free traffic: direct requests).
  for (auto& s : fleet.sims) {
    for (int c = 0; c < 3; ++c) {
      ASSERT_EQ(HttpClient(s.port)
                    .post("/v1/chat/completions", chat_body({turn_message(c, 0)}),
                          {{"content-type", "application/json"}})
                    .status,
                200);
    }
  }
  KvReplica a;
  a.start(fleet.config, nats.url());
  // Its first batches are mid-stream (a probe's, a request's): cold, untrusted for kvWarmupSec.
  for (int c = 0; c < 4; ++c) {
    HttpClient(a.port).post("/v1/chat/completions", chat_body({turn_message(20 + c, 0)}),
                            {{"content-type", "application/json"}});
  }
  ASSERT_TRUE(wait_until(
      [&] { return a.readiness().find(R"("bootstrap":"cold")") != std::string::npos; }, 30s))
      << a.readiness() << a.inventory() << a.process->log();
  EXPECT_EQ(a.readiness().find(R"("trusted":4)"), std::string::npos) << a.readiness();
  const std::string metrics = HttpClient(a.metrics).get("/metrics").body;
  EXPECT_NE(metrics.find(R"(kvgate_replica_inventory_requests_total{result="no_peer"})"),
            std::string::npos);
}

}  // namespace
}  // namespace kvgate::testing
