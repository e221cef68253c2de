// kv_exact end to end: kvgate-sim servers with two DP ranks each publish their KV events; kvgate
// follows every (server, rank) and sends each turn of a conversation to the rank that holds its
// earlier turns, which the servers' own cached_tokens confirm.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "support/chats.h"
#include "support/cluster.h"
#include "support/http_client.h"
#include "support/models.h"
#include "support/process.h"
#include "support/temp_dir.h"

namespace kvgate::testing {
namespace {

using namespace std::chrono_literals;

struct KvCluster {
  static constexpr int kRanks = 2;
  // `discover`: the rule names neither the servers' event ports nor their rank count (a wrong
  // kvZmqPort and kvDpRankCount 1): kvgate must learn them from each server's /server_info.
  KvCluster(int n, const std::string& tokenizer, const std::string& fallback = "round_robin",
            const std::string& rule_extra = "", const std::vector<std::string>& sim_extra = {},
            bool discover = false) {
    std::string yaml = "rules:\n  - name: default\n    mode: 4\n    sel: " + fallback +
                       "\n    kvEngineType: sglang\n    kvExactMode: 3\n    kvBlockSize: 16\n"
                       "    kvDpRankCount: " +
                       std::to_string(discover ? 1 : kRanks) +
                       (discover ? "\n    kvZmqPort: " + std::to_string(free_port()) : "") +
                       "\n    kvWarmupSec: 0\n    tokenizerPath: " + tokenizer + "\n" + rule_extra +
                       "    endpoints:\n";
    for (int i = 0; i < n; ++i) {
      Sim s;
      s.port = free_port();
      int events = free_ports(kRanks);
      s.args = {"--page-size",
                "16",
                "--dp-size",
                std::to_string(kRanks),
                "--tokenizer-path",
                tokenizer,
                "--enable-cache-report",
                "--time-scale",
                "0",
                "--kv-events-config",
                R"({"publisher":"zmq","endpoint":"tcp://*:)" + std::to_string(events) +
                    R"(","topic":""})"};
      s.args.insert(s.args.end(), sim_extra.begin(), sim_extra.end());
      s.start();
      yaml += "      - url: " + s.url() + "\n";
      if (!discover) yaml += "        kvZmqPort: " + std::to_string(events) + "\n";
      sims.push_back(std::move(s));
    }
    config = dir.write("kvgate.yaml", yaml);
    port = free_port();
    metrics_port = free_port();
    admin_port = free_port();
    gateway = std::make_unique<Process>(
        "kvgate",
        std::vector<std::string>{"--config", config, "--host", "127.0.0.1", "--port",
                                 std::to_string(port), "--prometheus-host", "127.0.0.1",
                                 "--prometheus-port", std::to_string(metrics_port), "--admin-port",
                                 std::to_string(admin_port), "--debug-headers",
                                 // one request thread: each routing decision sees the last one's
                                 "--threads", "1"});
  }
  // Blocks kvgate applied as stored, all servers and ranks.
  double stored_total() {
    double sum = 0;
    for (const auto& s : sims) {
      for (int r = 0; r < kRanks; ++r) {
        double v = metric("kvgate_kv_events_total{rule=\"default\",endpoint=\"" + s.url() +
                          "\",rank=\"" + std::to_string(r) + "\",type=\"stored\"}");
        if (v > 0) sum += v;
      }
    }
    return sum;
  }
  // A wait for the events of the request just answered (each stores new pages).
  std::function<void()> events_in() {
    auto seen = std::make_shared<double>(stored_total());
    return [this, seen] {
      EXPECT_TRUE(wait_until([&] { return stored_total() > *seen; }, 20s)) << gateway->log();
      *seen = stored_total();
    };
  }
  // Blocks kvgate applied as stored for rank `rank` of the first server.
  double stored(int rank) {
    return metric("kvgate_kv_events_total{rule=\"default\",endpoint=\"" + sims[0].url() +
                  "\",rank=\"" + std::to_string(rank) + "\",type=\"stored\"}");
  }
  double metric(const std::string& series) {
    HttpClient c(metrics_port);
    auto r = c.get("/metrics");
    if (r.status != 200) return -1;
    size_t at = r.body.find("\n" + series + " ");
    if (at == std::string::npos) return -1;
    return std::stod(r.body.substr(at + series.size() + 2));
  }
  // Every (server, rank) subscriber connected and trusted (kvWarmupSec 0), and its tokenizer
  // parity probe done with `parity` (1: same ids; 0: they differ; none: not probed, e.g. left out
  // for its page size): the probes' own events are in before a test counts events.
  bool wait_subscribed(std::optional<double> parity = 1) {
    return wait_until(
        [&] {
          for (const auto& s : sims) {
            for (int r = 0; r < kRanks; ++r) {
              std::string labels = "{rule=\"default\",endpoint=\"" + s.url() + "\",rank=\"" +
                                   std::to_string(r) + "\"}";
              if (metric("kvgate_kv_subscriber_connected" + labels) != 1 ||
                  (parity && metric("kvgate_kv_tokenizer_parity" + labels) != *parity)) {
                return false;
              }
            }
          }
          return true;
        },
        30s);
  }
  // The admin API's inventory view of the rule.
  std::string inventory() {
    HttpClient c(admin_port);
    return c.get("/v1/rules/default/inventory").body;
  }
  TempDir dir;
  std::vector<Sim> sims;
  std::string config;
  int port = 0;
  int metrics_port = 0;
  int admin_port = 0;
  std::unique_ptr<Process> gateway;
};

// Multi-turn chats through kvgate at `port`: the share of later turns' prompt tokens the servers
// reported cached. `after` runs after each request (kv_exact: wait for its events).
double conversation_hit_rate(int port, int conversations = 6, int turns_per = 4,
                             const std::function<void()>& after = {}) {
  HttpClient client(port);
  std::vector<std::vector<std::string>> turns(static_cast<size_t>(conversations));
  double cached = 0, prompt = 0;
  for (int t = 0; t < turns_per; ++t) {
    for (int conv = 0; conv < conversations; ++conv) {
      auto& history = turns[static_cast<size_t>(conv)];
      std::string msg = turn_message(conv, t, "chat");
      history.push_back(msg);
      auto r = client.post("/v1/chat/completions", chat_body(history, "m"));
      EXPECT_EQ(r.status, 200) << r.body;
      if (after) after();
      if (t > 0) {
        cached += std::max(0.0, json_number_field(r.body, "cached_tokens"));
        prompt += std::max(0.0, json_number_field(r.body, "prompt_tokens"));
      }
      history.push_back("reply " + std::to_string(t) + " of chat " + std::to_string(conv));
    }
  }
  return prompt > 0 ? cached / prompt : 0;
}

// The engine's own DP controller (round robin over ranks) splits a conversation over its ranks:
// cache_aware, which only chooses the server, loses hits; kv_exact chooses the rank too. One
// server and an odd number of chats, so that the split is certain (with several servers it
// depends on how cache_aware happened to place the chats).
TEST(KvExact, BeatsCacheAwareWhenEnginesRunTwoDpRanks) {
  KVGATE_REQUIRE_MODEL("qwen3");
  std::string tok = models_dir() + "/qwen3";
  double kv = 0, ca = 0;
  {
    // Without predict on route: the hits come from the engines' events alone.
    KvCluster c(1, tok, "round_robin", "    kvPredictTtlMs: 0\n");
    ASSERT_TRUE(c.wait_subscribed()) << c.gateway->log();
    kv = conversation_hit_rate(c.port, 5, 4, c.events_in());
    EXPECT_GE(c.metric("kvgate_kv_exact_hits_total{rule=\"default\"}"), 10);
    // Each later turn finds the earlier messages' ids in the tokenizer's piece cache.
    EXPECT_GT(c.metric("kvgate_tokenizer_cache_lookups_total{result=\"hit\"}"), 0);
    EXPECT_GT(c.metric("kvgate_tokenizer_cache_entries"), 0);
  }
  {
    Cluster c(1,
              {"--page-size", "16", "--dp-size", "2", "--tokenizer-path", tok,
               "--enable-cache-report", "--time-scale", "0"},
              {"--policy", "cache_aware", "--tokenizer-path", tok});
    ca = conversation_hit_rate(c.port(), 5);
  }
  std::cout << "hit rate with --dp-size 2: kv_exact " << kv << ", cache_aware " << ca << "\n";
  EXPECT_GE(kv, 1.3 * ca) << "kv_exact " << kv << " cache_aware " << ca;
}

// A burst of requests sharing a new prefix, all sent before the engine's first events for it:
// with predict on route they land on one (server, rank); without, each misses and the fallback
// scatters them. `predict_ms` is the rule's kvPredictTtlMs.
std::set<std::string> burst_targets(int predict_ms) {
  std::string tok = models_dir() + "/qwen3";
  // Cheap load (kvLoadTokens 8): the shared prefix outweighs the burst's own load.
  KvCluster c(3, tok, "round_robin",
              "    kvLoadTokens: 8\n    kvPredictTtlMs: " + std::to_string(predict_ms) + "\n",
              {"--time-scale", "1"});
  EXPECT_TRUE(c.wait_subscribed()) << c.gateway->log();
  std::string prefix = "shared system prompt";
  for (int w = 0; w < 300; ++w) prefix += " rule" + std::to_string(w % 53);
  // Sent at once (the sims take ~80 ms to prefill the ~1,500 tokens and only then publish them):
  // every request is routed before the engine says anything of the prefix.
  std::set<std::string> targets;
  std::mutex mu;
  std::vector<std::thread> clients;
  clients.reserve(6);
  for (int i = 0; i < 6; ++i) {
    clients.emplace_back([&, i] {
      HttpClient client(c.port);
      auto r = client.post("/generate", R"({"text":")" + prefix + " question " + std::to_string(i) +
                                            R"(","sampling_params":{"max_new_tokens":1}})");
      EXPECT_EQ(r.status, 200) << r.body;
      std::lock_guard lock(mu);
      targets.insert(r.header("x-kvgate-worker") + "#" +
                     std::to_string(static_cast<int>(json_number_field(r.body, "dp_rank"))));
    });
  }
  for (auto& t : clients) t.join();
  return targets;
}

TEST(KvExact, ABurstSharingANewPrefixLandsTogetherWithPredictOnRoute) {
  KVGATE_REQUIRE_MODEL("qwen3");
  auto predicted = burst_targets(2000);
  auto scattered = burst_targets(0);
  std::cout << "burst of 6: " << predicted.size() << " targets with predict on route, "
            << scattered.size() << " without\n";
  EXPECT_EQ(predicted.size(), 1u);  // (one request thread: each decision sees the last)
  EXPECT_GE(scattered.size(), 3u);  // every one a miss: the fallback's round robin
}

// An engine whose pages are not kvBlockSize long is named and left out, not silently missed.
TEST(KvExact, APageSizeMismatchIsDetectedAndNamed) {
  KVGATE_REQUIRE_MODEL("qwen3");
  KvCluster c(1, models_dir() + "/qwen3", "round_robin", "", {"--page-size", "32"});
  ASSERT_TRUE(c.wait_subscribed(std::nullopt)) << c.gateway->log();
  HttpClient client(c.port);
  std::string text = "a prompt long enough to fill several pages of thirty-two tokens:";
  for (int w = 0; w < 80; ++w) text += " word" + std::to_string(w);
  for (int i = 0; i < 2; ++i) {  // the fallback's round robin over the ranks: both store pages
    auto r = client.post("/generate",
                         R"({"text":")" + text + R"(","sampling_params":{"max_new_tokens":1}})");
    ASSERT_EQ(r.status, 200) << r.body;
  }
  std::string series = "kvgate_kv_source_excluded{rule=\"default\",endpoint=\"" + c.sims[0].url() +
                       "\",rank=\"0\",reason=\"page_size\"}";
  EXPECT_TRUE(wait_until([&] { return c.metric(series) == 1; })) << c.gateway->log();
  // (The exclusion may come first from the server's /server_info; the events' pages follow.)
  EXPECT_TRUE(wait_until([&] {
    return c.metric("kvgate_kv_page_size_mismatches_total{rule=\"default\"}") > 0;
  })) << c.gateway->log();
  EXPECT_NE(c.gateway->log().find("engine_block_size=32"), std::string::npos) << c.gateway->log();
  // Once excluded, the rank is not chosen on its (wrong) pages, nor on pages predicted there.
  auto r = client.post("/generate",
                       R"({"text":")" + text + R"(","sampling_params":{"max_new_tokens":1}})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.header("x-kvgate-route").find("kv_exact_hit"), std::string::npos)
      << r.header("x-kvgate-route");
}

// An engine hashing blocks another way than the rule says (here vLLM's sha256_cbor under a rule
// for SGLang) is named at once; routing itself still works (kvgate keys pages itself).
TEST(KvExact, AnotherEnginesBlockHashIsDetected) {
  KVGATE_REQUIRE_MODEL("qwen3");
  KvCluster c(1, models_dir() + "/qwen3", "round_robin", "", {"--kv-events-format", "vllm"});
  ASSERT_TRUE(c.wait_subscribed()) << c.gateway->log();
  double rate = conversation_hit_rate(c.port, 3, 3, c.events_in());
  EXPECT_TRUE(wait_until([&] {
    return c.metric("kvgate_kv_hash_mismatches_total{rule=\"default\"}") > 0;
  })) << c.gateway->log();
  EXPECT_NE(c.gateway->log().find("the engine's block ids are not the ones"), std::string::npos);
  EXPECT_GT(rate, 0.5);
}

// The servers' /server_info (kv_events) says where each DP rank publishes: a rule with the wrong
// port and rank count still follows every rank, and the rank count mismatch is named.
TEST(KvExact, EventPortsAndRanksAreDiscoveredFromServerInfo) {
  KVGATE_REQUIRE_MODEL("qwen3");
  KvCluster c(2, models_dir() + "/qwen3", "round_robin", "", {}, /*discover=*/true);
  ASSERT_TRUE(c.wait_subscribed()) << c.gateway->log();  // both ranks of both servers
  EXPECT_NE(c.gateway->log().find("another number of DP ranks than kvDpRankCount"),
            std::string::npos)
      << c.gateway->log();
  EXPECT_GT(conversation_hit_rate(c.port, 3, 3, c.events_in()), 0.5);
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Every (server, rank) gets a probe chat once its events flow; its BlockStored events carry the
// engine's token ids, which are kvgate's here. The admin API runs the probes again on demand.
TEST(KvExact, TokenizerParityIsCheckedOnEveryRank) {
  KVGATE_REQUIRE_MODEL("qwen3");
  KvCluster c(2, models_dir() + "/qwen3");
  ASSERT_TRUE(c.wait_subscribed(1)) << c.gateway->log();
  EXPECT_EQ(count(c.inventory(), R"("state":"match")"), 4u) << c.inventory();
  HttpClient admin(c.admin_port);
  auto r = admin.post("/v1/rules/default/parity", "");
  EXPECT_EQ(r.status, 202) << r.body;
  EXPECT_TRUE(wait_until([&] {
    return count(c.inventory(), R"("state":"match")") == 4 &&
           c.metric("kvgate_kv_tokenizer_mismatches_total{rule=\"default\"}") == 0 &&
           count(c.gateway->log(), "tokenizer parity holds") >= 8;
  })) << c.inventory()
      << c.gateway->log();
  EXPECT_EQ(admin.get("/v1/rules/default/parity").status, 405);
}

// Servers whose chat template differs from the one kvgate renders (here a system message they
// add): every rank is named, with the first differing token, instead of silently missing.
TEST(KvExact, ATokenizerMismatchIsDetectedAndNamed) {
  KVGATE_REQUIRE_MODEL("qwen3");
  TempDir other;
  std::string qwen3 = models_dir() + "/qwen3";
  std::ifstream in(qwen3 + "/tokenizer_config.json", std::ios::binary);
  std::string config((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string key = R"("chat_template": ")";
  size_t at = config.find(key);
  ASSERT_NE(at, std::string::npos);
  config.insert(at + key.size(), R"(<|im_start|>system\nYou are a test.<|im_end|>\n)");
  other.write("tokenizer_config.json", config);
  ASSERT_EQ(::symlink((qwen3 + "/tokenizer.json").c_str(), (other / "tokenizer.json").c_str()), 0);
  KvCluster c(1, qwen3, "round_robin", "", {"--tokenizer-path", other.path()});
  ASSERT_TRUE(c.wait_subscribed(0)) << c.inventory() << c.gateway->log();
  EXPECT_EQ(c.metric("kvgate_kv_tokenizer_mismatches_total{rule=\"default\"}"), 2);
  EXPECT_EQ(count(c.inventory(), R"("state":"mismatch")"), 2u) << c.inventory();
  EXPECT_NE(c.inventory().find("differ from kvgate's at token 1 of the probe"), std::string::npos)
      << c.inventory();
  EXPECT_NE(c.gateway->log().find("the engine tokenizes differently from kvgate"),
            std::string::npos)
      << c.gateway->log();
}

// An adapter's pages live in their own namespace on the engine (SGLang seeds its chain and
// names the adapter in its events): a LoRA request matches only pages stored for that adapter,
// and a base request never the adapter's.
TEST(KvExact, LoraRequestsMatchOnlyTheirAdaptersPages) {
  KVGATE_REQUIRE_MODEL("qwen3");
  KvCluster c(1, models_dir() + "/qwen3", "round_robin", "    kvPredictTtlMs: 0\n",
              {"--lora-paths", "ad=/adapters/ad"});
  ASSERT_TRUE(c.wait_subscribed()) << c.gateway->log();
  HttpClient client(c.port);
  std::string text = "an adapter's conversation:";
  for (int w = 0; w < 80; ++w) text += " word" + std::to_string(w);
  auto send = [&](const std::string& model, const std::string& t) {
    auto wait = c.events_in();
    auto r = client.post("/v1/chat/completions",
                         R"({"model":")" + model +
                             R"(","max_tokens":1,"messages":[{"role":"user","content":")" + t +
                             R"("}]})");
    EXPECT_EQ(r.status, 200) << r.body;
    wait();
    return r.header("x-kvgate-route");
  };
  send("m:ad", text);
  EXPECT_NE(send("m:ad", text + " more").find("kv_exact_hit"), std::string::npos);
  // The same text for the base model: the adapter's pages are no hit.
  EXPECT_EQ(send("m", text + " and more").find("kv_exact_hit"), std::string::npos);
  // The adapter's pages still answer the adapter.
  EXPECT_NE(send("m:ad", text + " more and more").find("kv_exact_hit"), std::string::npos);
}

// One server's rank holds a prefix (a later request on it is a kv_exact hit); `lose` takes that
// cache away and waits until kvgate heard of it; a request on the same prefix is then not routed
// on the stale pages.
void expect_stale_pages_forgotten(const std::function<void(KvCluster&)>& lose) {
  KvCluster c(1, models_dir() + "/qwen3", "round_robin", "    kvPredictTtlMs: 0\n");
  ASSERT_TRUE(c.wait_subscribed()) << c.gateway->log();
  HttpClient client(c.port);
  std::string text = "a conversation the engine will lose:";
  for (int w = 0; w < 80; ++w) text += " word" + std::to_string(w);
  auto gen = [&](const std::string& t) {
    return client.post("/generate",
                       R"({"text":")" + t + R"(","sampling_params":{"max_new_tokens":1}})");
  };
  // Its own events (the parity probe stored pages before it: a count above 0 is not enough).
  double before = c.stored(0);
  ASSERT_EQ(gen(text).status, 200);
  ASSERT_TRUE(wait_until([&] { return c.stored(0) > before; })) << c.gateway->log();
  auto again = gen(text + " more");
  ASSERT_EQ(again.status, 200);
  EXPECT_NE(again.header("x-kvgate-route").find("kv_exact_hit"), std::string::npos)
      << again.header("x-kvgate-route");
  lose(c);
  auto after = gen(text + " more and more");
  ASSERT_EQ(after.status, 200) << after.body;
  EXPECT_EQ(after.header("x-kvgate-route").find("kv_exact_hit"), std::string::npos)
      << after.header("x-kvgate-route");
}

// An engine that restarts comes back with an empty cache: kvgate forgets what it held when its
// publishers go away, and routes nothing there on stale pages.
TEST(KvExact, ARestartedEngineIsNotRoutedToOnStalePages) {
  KVGATE_REQUIRE_MODEL("qwen3");
  expect_stale_pages_forgotten([](KvCluster& c) {
    c.sims[0].kill();
    c.sims[0].start();  // same ports, empty cache
    ASSERT_TRUE(wait_until([&] {
      return c.metric("kvgate_kv_resyncs_total{rule=\"default\",reason=\"disconnected\"}") >= 1;
    })) << c.gateway->log();
    ASSERT_TRUE(c.wait_subscribed()) << c.gateway->log();
  });
}

// A flushed engine (POST /flush_cache: AllBlocksCleared) stops attracting its old prefixes.
TEST(KvExact, AFlushedEngineStopsAttractingItsOldPrefixes) {
  KVGATE_REQUIRE_MODEL("qwen3");
  expect_stale_pages_forgotten([](KvCluster& c) {
    auto cleared = [&] {
      return c.metric("kvgate_kv_events_total{rule=\"default\",endpoint=\"" + c.sims[0].url() +
                      "\",rank=\"0\",type=\"cleared\"}");
    };
    double before = cleared();
    HttpClient sim(c.sims[0].port);
    ASSERT_EQ(sim.post("/flush_cache", "").status, 200);
    ASSERT_TRUE(wait_until([&] { return cleared() > before; })) << c.gateway->log();
  });
}

TEST(KvExact, ConversationsLandOnTheRankHoldingThemAndCachedTokensConfirmIt) {
  KVGATE_REQUIRE_MODEL("qwen3");
  // Without predict on route: the engines' events alone put later turns where they are cached.
  KvCluster c(3, models_dir() + "/qwen3", "round_robin", "    kvPredictTtlMs: 0\n");
  ASSERT_TRUE(c.wait_subscribed()) << c.gateway->log();
  HttpClient client(c.port);
  auto wait_events = c.events_in();
  const int kConversations = 6;
  const int kTurns = 4;
  std::vector<std::vector<std::string>> turns(kConversations);
  double cached = 0, prompt = 0;
  int hits = 0, later_turns = 0;
  for (int t = 0; t < kTurns; ++t) {
    for (int conv = 0; conv < kConversations; ++conv) {
      std::string msg = turn_message(conv, t);
      turns[conv].push_back(msg);
      auto r = client.post("/v1/chat/completions", chat_body(turns[conv], "m"));
      ASSERT_EQ(r.status, 200) << r.body;
      if (t > 0) {
        ++later_turns;
        if (r.header("x-kvgate-route").find("kv_exact_hit") != std::string::npos) ++hits;
        cached += std::max(0.0, json_number_field(r.body, "cached_tokens"));
        prompt += std::max(0.0, json_number_field(r.body, "prompt_tokens"));
      }
      turns[conv].push_back("reply " + std::to_string(t) + " of conversation " +
                            std::to_string(conv));
      wait_events();
    }
  }
  std::cout << "kv_exact: " << hits << "/" << later_turns << " later turns routed to a holder; "
            << "cached " << cached << " of " << prompt << " prompt tokens\n";
  EXPECT_GE(hits, later_turns * 3 / 4) << c.gateway->log();
  EXPECT_GT(cached / prompt, 0.5);
  EXPECT_EQ(c.metric("kvgate_kv_page_size_mismatches_total{rule=\"default\"}"), 0);
  // Hash parity: the engines' ids were recomputed from their tokens, and all agreed.
  EXPECT_GT(c.metric("kvgate_kv_hash_checked_total{rule=\"default\"}"), 0);
  EXPECT_EQ(c.metric("kvgate_kv_hash_mismatches_total{rule=\"default\"}"), 0);
  // The inventory view (admin listener): every (server, rank), connected, most holding blocks.
  HttpClient admin(c.admin_port);
  auto inv = admin.get("/v1/rules/default/inventory");
  ASSERT_EQ(inv.status, 200) << inv.body;
  size_t sources = 0, connected = 0;
  for (size_t at = 0; (at = inv.body.find("\"endpoint\"", at)) != std::string::npos; ++at) {
    ++sources;
  }
  for (size_t at = 0; (at = inv.body.find("\"connected\":true", at)) != std::string::npos; ++at) {
    ++connected;
  }
  EXPECT_EQ(sources, 3u * KvCluster::kRanks) << inv.body;
  EXPECT_EQ(connected, sources) << inv.body;
  EXPECT_GT(json_number_field(inv.body, "nodes"), 0) << inv.body;
}

}  // namespace
}  // namespace kvgate::testing
