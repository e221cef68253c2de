// Integration: prefill/decode disaggregation through kvgate, with kvgate-sim servers in prefill
// and decode modes (2 prefill servers running 2 DP ranks each, 2 decode servers). kvgate chooses a
// prefill (server, rank) and a decode server, adds SGLang's bootstrap fields, sends both halves at
// once and relays the decode half's answer. Covered: every API shape streamed and not; the prefill
// rank reaching the engine both ways SGLang takes it (the room, or disagg_prefill_dp_rank);
// multi-turn chats staying on the prefill rank holding their history (kvExactMode 1) where round
// robin scatters them; a dead or dying prefill server: no decode left waiting, clear errors,
// recovery; /readiness and the role label.
#include <gtest/gtest.h>

#include <algorithm>
#include <future>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "support/chats.h"
#include "support/cluster.h"
#include "support/models.h"
#include "support/process.h"
#include "support/temp_dir.h"

namespace kvgate::testing {
namespace {

using namespace std::chrono_literals;

constexpr int kRanks = 2;

struct PdOptions {
  // "" : the command line (--pd-disaggregation --prefill ... --decode ...); else a rule's YAML
  // head (fields before endpoints), for kvExactMode 1.
  std::string rule;
  std::vector<std::string> gateway_args;
  std::string tokenizer;      // the sims tokenize as this model (and publish events) when given
  double time_scale = 0;      // the sims' --time-scale
  int decode_room_secs = 60;  // the decode sims' wait for a room (SGLang: 300 s)
};

struct PdCluster {
  explicit PdCluster(const PdOptions& o) {
    std::string endpoints;
    std::vector<std::string> flags;
    for (int i = 0; i < 2; ++i) {
      Sim s;
      s.port = free_port();
      int bootstrap = free_port();
      int events = free_ports(kRanks);
      s.args = {"--disaggregation-mode",
                "prefill",
                "--disaggregation-bootstrap-port",
                std::to_string(bootstrap),
                "--page-size",
                "16",
                "--dp-size",
                std::to_string(kRanks),
                "--enable-cache-report",
                "--time-scale",
                std::to_string(o.time_scale)};
      if (!o.tokenizer.empty()) {
        s.args.insert(s.args.end(), {"--tokenizer-path", o.tokenizer, "--kv-events-config",
                                     R"({"publisher":"zmq","endpoint":"tcp://*:)" +
                                         std::to_string(events) + R"(","topic":""})"});
      }
      s.start();
      endpoints += "      - {url: " + s.url() +
                   ", role: prefill, bootstrapPort: " + std::to_string(bootstrap) +
                   ", kvZmqPort: " + std::to_string(events) + "}\n";
      flags.insert(flags.end(), {"--prefill", s.url(), std::to_string(bootstrap)});
      prefill.push_back(std::move(s));
    }
    for (int i = 0; i < 2; ++i) {
      Sim s;
      s.port = free_port();
      s.args = {"--disaggregation-mode",
                "decode",
                "--page-size",
                "16",
                "--enable-cache-report",
                "--time-scale",
                std::to_string(o.time_scale),
                "--pd-room-timeout-secs",
                std::to_string(o.decode_room_secs)};
      if (!o.tokenizer.empty()) s.args.insert(s.args.end(), {"--tokenizer-path", o.tokenizer});
      s.start();
      endpoints += "      - {url: " + s.url() + ", role: decode}\n";
      flags.insert(flags.end(), {"--decode", s.url()});
      decode.push_back(std::move(s));
    }
    port = free_port();
    metrics_port = free_port();
    std::vector<std::string> a = {"--host",
                                  "127.0.0.1",
                                  "--port",
                                  std::to_string(port),
                                  "--prometheus-host",
                                  "127.0.0.1",
                                  "--prometheus-port",
                                  std::to_string(metrics_port),
                                  "--admin-port",
                                  "0",
                                  "--debug-headers",
                                  "--shutdown-grace-period-secs",
                                  "2",
                                  "--health-check-interval-secs",
                                  "1"};
    if (o.rule.empty()) {
      a.emplace_back("--pd-disaggregation");
      a.insert(a.end(), flags.begin(), flags.end());
    } else {
      a.insert(a.end(),
               {"--config", dir.write("kvgate.yaml", o.rule + "    endpoints:\n" + endpoints)});
    }
    a.insert(a.end(), o.gateway_args.begin(), o.gateway_args.end());
    gateway = std::make_unique<Process>("kvgate", a);
    ready = wait_until(
        [&] {
          if (!gateway->running()) return true;
          HttpClient c(port);
          c.set_timeout(500ms);
          return c.get("/readiness").body.find("\"healthy_workers\":4") != std::string::npos;
        },
        20s);
    ready = ready && gateway->running();
  }
  ~PdCluster() {
    if (gateway) {
      int status = gateway->stop(20s);
      EXPECT_EQ(status, 0) << gateway->log();
    }
  }
  double metric(const std::string& series) {
    HttpClient c(metrics_port);
    auto r = c.get("/metrics");
    size_t at = r.body.find("\n" + series + " ");
    if (at == std::string::npos) return -1;
    return std::stod(r.body.substr(at + series.size() + 2));
  }
  // Requests a server is running or queueing now (all its ranks), from its /get_load.
  static double load(const Sim& s) {
    HttpClient c(s.port);
    auto r = c.get("/get_load");
    if (r.status != 200) return -1;
    double sum = 0;
    for (size_t at = r.body.find("\"num_reqs\":"); at != std::string::npos;
         at = r.body.find("\"num_reqs\":", at + 1)) {
      sum += std::stod(r.body.substr(at + 11));
    }
    return sum;
  }
  TempDir dir;
  std::vector<Sim> prefill, decode;
  int port = 0, metrics_port = 0;
  bool ready = false;
  std::unique_ptr<Process> gateway;
};

const std::string kGenerate =
    R"({"text":"Tell me about the history of the printing press in Europe",)"
    R"("sampling_params":{"max_new_tokens":6}})";
const std::string kGenerateStream =
    R"({"text":"Tell me about the history of the printing press in Europe",)"
    R"("sampling_params":{"max_new_tokens":6},"stream":true})";

std::string chat(bool stream) {
  return R"({"model":"m","max_tokens":5,"stream":)" + std::string(stream ? "true" : "false") +
         R"(,"messages":[{"role":"user","content":"What is a bootstrap room?"}]})";
}

TEST(Pd, EveryApiShapeStreamedAndNotGoesThroughBothHalves) {
  PdCluster c(PdOptions{.gateway_args = {"--policy", "round_robin"}});
  ASSERT_TRUE(c.ready) << c.gateway->log();
  HttpClient client(c.port);
  std::set<std::string> prefills, decodes;
  auto note = [&](const Response& r) {
    prefills.insert(r.header("x-kvgate-prefill-worker"));
    decodes.insert(r.header("x-kvgate-worker"));
  };
  // A batch goes as one request (SGLang gives prompt i the room room + i): one answer per prompt.
  auto batch = client.post("/generate", R"({"text":["First prompt here","Second prompt there",)"
                                        R"("Third one"],"sampling_params":{"max_new_tokens":2}})");
  ASSERT_EQ(batch.status, 200) << batch.body;
  EXPECT_EQ(batch.body.front(), '[') << batch.body;
  size_t answers = 0;
  for (size_t at = batch.body.find("\"completion_tokens\":2"); at != std::string::npos;
       at = batch.body.find("\"completion_tokens\":2", at + 1)) {
    ++answers;
  }
  EXPECT_EQ(answers, 3u) << batch.body;
  // Embeddings are not generation: a prefill/decode pool refuses them.
  EXPECT_EQ(client.post("/v1/embeddings", R"({"model":"m","input":"x"})").status, 400);
  // A client's own rid is the engine's request id on its first attempt.
  auto own = client.post("/generate", R"({"text":"Hello there","rid":"client-rid-1",)"
                                      R"("sampling_params":{"max_new_tokens":2}})");
  ASSERT_EQ(own.status, 200) << own.body;
  EXPECT_EQ(json_string_field(own.body, "id"), "client-rid-1") << own.body;
  for (int i = 0; i < 3; ++i) {
    auto g = client.post("/generate", kGenerate);
    ASSERT_EQ(g.status, 200) << g.body;
    EXPECT_EQ(json_number_field(g.body, "completion_tokens"), 6) << g.body;
    note(g);

    auto gs = client.post("/generate", kGenerateStream);
    ASSERT_EQ(gs.status, 200) << gs.body;
    note(gs);
    EXPECT_NE(gs.body.find("data: [DONE]"), std::string::npos) << gs.body;
    EXPECT_EQ(gs.body.find("\"abort\""), std::string::npos) << gs.body;

    auto ch = client.post("/v1/chat/completions", chat(false));
    ASSERT_EQ(ch.status, 200) << ch.body;
    note(ch);
    EXPECT_EQ(json_string_field(ch.body, "object"), "chat.completion");
    EXPECT_EQ(json_number_field(ch.body, "completion_tokens"), 5) << ch.body;

    auto cs = client.post("/v1/chat/completions", chat(true));
    ASSERT_EQ(cs.status, 200) << cs.body;
    note(cs);
    EXPECT_NE(cs.body.find("chat.completion.chunk"), std::string::npos) << cs.body;
    EXPECT_NE(cs.body.find("data: [DONE]"), std::string::npos) << cs.body;
  }
  // Both servers of each role took requests (round robin on each side).
  EXPECT_EQ(prefills.size(), 2u);
  EXPECT_EQ(decodes.size(), 2u);
  for (const auto& s : c.prefill) EXPECT_TRUE(prefills.contains(s.url()));
  for (const auto& s : c.decode) EXPECT_TRUE(decodes.contains(s.url()));

  // Readiness counts each role; kvgate_worker_role says each worker's.
  auto r = client.get("/readiness");
  EXPECT_EQ(r.status, 200);
  EXPECT_NE(r.body.find("\"healthy_prefill\":2,\"healthy_decode\":2"), std::string::npos) << r.body;
  EXPECT_EQ(c.metric("kvgate_worker_role{worker=\"" + c.prefill[0].url() + "\",role=\"prefill\"}"),
            1);
  EXPECT_EQ(c.metric("kvgate_worker_role{worker=\"" + c.decode[1].url() + "\",role=\"decode\"}"),
            1);
  EXPECT_EQ(c.metric("kvgate_worker_health{worker=\"" + c.decode[1].url() + "\"}"), 1);
  EXPECT_GE(c.metric("kvgate_worker_requests_total{worker=\"" + c.decode[0].url() + "\"}"), 1);
  EXPECT_EQ(c.metric("kvgate_pd_prefill_failures_total{worker=\"" + c.prefill[0].url() + "\"}"),
            -1);
}

// A dp-aware prefill policy's rank, both shapes SGLang takes: a room with room % dp_size == rank
// (every build), or a pin with disagg_prefill_dp_rank sent to both servers (newer builds). The sims
// hold SGLang's rules (a pin other than the room's rank is refused without the field; the decode
// looks for the KV on the field's rank, else the room's), so a wrong shape fails here: the prefill
// refuses, or the decode waits out its room timeout. (That the engine ran each prefill on the rank
// chosen is what the kvExactMode 1 tests below show, through the engine's own cache hits.)
void dp_aware_prefill_ranks(const std::string& shape) {
  PdCluster c(PdOptions{
      .gateway_args = {"--policy", "round_robin", "--dp-aware", "--pd-prefill-rank", shape},
      .decode_room_secs = 5});
  ASSERT_TRUE(c.ready) << c.gateway->log();
  // kvgate learned each prefill server's dp_size.
  ASSERT_TRUE(wait_until(
      [&] {
        return c.metric("kvgate_dp_ranks{rule=\"default\",worker=\"" + c.prefill[1].url() +
                        "\"}") == kRanks;
      },
      15s))
      << c.gateway->log();
  HttpClient client(c.port);
  std::set<std::string> ranks;
  for (int i = 0; i < 8; ++i) {
    auto r = client.post("/generate", i % 2 ? kGenerateStream : kGenerate);
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.body.find("\"abort\""), std::string::npos) << r.body;
    EXPECT_EQ(r.body.find("conflict"), std::string::npos) << r.body;
    ranks.insert(r.header("x-kvgate-prefill-worker") + "@" + r.header("x-kvgate-prefill-dp-rank"));
  }
  EXPECT_EQ(ranks.size(), 4u) << "round robin over 2 prefill servers x 2 ranks";
}

TEST(Pd, DpAwarePrefillRankByRoom) {
  dp_aware_prefill_ranks("room");
}

TEST(Pd, DpAwarePrefillRankByPinAndField) {
  dp_aware_prefill_ranks("field");
}

// Multi-turn chats: the share of later turns' prompt tokens the prefill servers had cached (the
// decode servers report the prefill's hit), and the (prefill server, rank) of each conversation.
struct Turns {
  double cached = 0, prompt = 0;
  std::map<int, std::set<std::string>> placed;
  double rate() const { return prompt > 0 ? cached / prompt : 0; }
};

Turns multiturn(PdCluster& c, int conversations, int turns_per,
                const std::vector<std::string>& preface = {}) {
  HttpClient client(c.port);
  std::vector<std::vector<std::string>> turns(static_cast<size_t>(conversations), preface);
  Turns out;
  for (int t = 0; t < turns_per; ++t) {
    for (int conv = 0; conv < conversations; ++conv) {
      auto& history = turns[static_cast<size_t>(conv)];
      history.push_back(turn_message(conv, t, "pd chat"));
      auto r = client.post("/v1/chat/completions", chat_body(history, "m"));
      EXPECT_EQ(r.status, 200) << r.body;
      if (t > 0) {
        out.cached += std::max(0.0, json_number_field(r.body, "cached_tokens"));
        out.prompt += std::max(0.0, json_number_field(r.body, "prompt_tokens"));
        out.placed[conv].insert(r.header("x-kvgate-prefill-worker") + "@" +
                                r.header("x-kvgate-prefill-dp-rank"));
      }
      history.push_back("reply " + std::to_string(t) + " of chat " + std::to_string(conv));
    }
  }
  return out;
}

std::string pd_rule(const std::string& tok, int kv_exact_mode, const std::string& sel) {
  return "rules:\n  - name: default\n    mode: 4\n    sel: " + sel +
         "\n    kvEngineType: sglang\n    kvExactMode: " + std::to_string(kv_exact_mode) +
         "\n    kvBlockSize: 16\n    kvDpRankCount: 2\n    kvWarmupSec: 0\n"
         "    tokenizerPath: " +
         tok + "\n";
}

// kvExactMode 1 over 2 prefill servers x 2 DP ranks: multi-turn chats once every (server, rank)
// is subscribed and its parity probe (sent as a prefill/decode pair) found the same token ids.
// The engine decides where a prefill runs (room % dp_size, or the pin): the hits it reports show
// that the rank kv_exact chose is the one that ran it.
Turns kv_mode1(const std::string& tok, const std::string& rank_shape) {
  PdCluster c(PdOptions{.rule = pd_rule(tok, 1, "round_robin"),
                        .gateway_args = {"--pd-prefill-rank", rank_shape},
                        .tokenizer = tok});
  EXPECT_TRUE(c.ready) << c.gateway->log();
  if (!c.ready) return {};
  EXPECT_TRUE(wait_until(
      [&] {
        for (const auto& s : c.prefill) {
          for (int r = 0; r < kRanks; ++r) {
            std::string labels = "{rule=\"default\",endpoint=\"" + s.url() + "\",rank=\"" +
                                 std::to_string(r) + "\"}";
            if (c.metric("kvgate_kv_subscriber_connected" + labels) != 1 ||
                c.metric("kvgate_kv_tokenizer_parity" + labels) != 1) {
              return false;
            }
          }
        }
        return true;
      },
      30s))
      << c.gateway->log();
  // An odd number of chats: round robin then moves each one between the prefill servers.
  Turns kv = multiturn(c, 5, 4);
  EXPECT_GE(c.metric("kvgate_kv_exact_hits_total{rule=\"default\"}"), 10) << rank_shape;
  std::set<std::string> used;
  for (const auto& [conv, where] : kv.placed) {
    EXPECT_EQ(where.size(), 1u) << "conversation " << conv << " moved between prefill ranks";
    used.insert(where.begin(), where.end());
  }
  EXPECT_GE(used.size(), 2u) << "the conversations spread over the prefill servers";
  return kv;
}

TEST(Pd, KvExactMode1KeepsConversationsOnThePrefillRankHoldingThem) {
  KVGATE_REQUIRE_MODEL("qwen3");
  const std::string tok = models_dir() + "/qwen3";
  Turns kv = kv_mode1(tok, "room");
  Turns rr;
  {
    PdCluster c(PdOptions{.rule = pd_rule(tok, 0, "round_robin"), .tokenizer = tok});
    ASSERT_TRUE(c.ready) << c.gateway->log();
    rr = multiturn(c, 5, 4);
  }
  std::cout << "prefill hit rate of later turns: kvExactMode 1 " << kv.rate() << ", round_robin "
            << rr.rate() << "\n";
  EXPECT_GE(kv.rate(), 0.6);
  EXPECT_GE(kv.rate(), 2 * rr.rate());
}

// The other shape SGLang takes: a random room, the prefill pinned with routed_dp_rank and both
// servers told disagg_prefill_dp_rank (without it the prefill refuses the pin, or the decode looks
// for the KV on the room's rank and times out).
TEST(Pd, KvExactMode1PinnedPrefillRankWithDisaggPrefillDpRank) {
  KVGATE_REQUIRE_MODEL("qwen3");
  Turns kv = kv_mode1(models_dir() + "/qwen3", "field");
  EXPECT_GE(kv.rate(), 0.6);
}

// The prefill policy routes a chat on its whole conversation: cache_aware keeps each conversation
// on the prefill server that has its history, behind a long opening every conversation shares.
TEST(Pd, CacheAwarePrefillKeepsEachConversationOnOneServer) {
  PdCluster c(PdOptions{.gateway_args = {"--policy", "round_robin", "--prefill-policy",
                                         "cache_aware", "--decode-policy", "power_of_two"}});
  ASSERT_TRUE(c.ready) << c.gateway->log();
  // Every conversation opens with the same long exchange: its first message says nothing of it.
  std::string shared = "You are a careful assistant for a team of librarians.";
  for (int w = 0; w < 150; ++w) shared += " rule" + std::to_string(w);
  Turns t = multiturn(c, 5, 4, {shared, "Understood."});
  for (const auto& [conv, where] : t.placed) {
    EXPECT_EQ(where.size(), 1u) << "conversation " << conv << " moved between prefill servers";
  }
  EXPECT_GT(t.rate(), 0.5) << "later turns find their history cached on the prefill server";
  // The prompt's figures are counted once, on the prefill server that computed it, with the
  // prefill policy's prediction beside them; the decode servers count none.
  HttpClient m(c.metrics_port);
  const std::string text = m.get("/metrics").body;
  auto sum = [&](const std::string& family, const std::string& url) {
    double total = 0;
    const std::string head = family + "{rule=\"default\",worker=\"" + url + "\"";
    for (size_t at = text.find(head); at != std::string::npos; at = text.find(head, at + 1)) {
      size_t sp = text.find(' ', at + head.size());
      total += std::stod(text.substr(sp + 1));
    }
    return total;
  };
  double prefill_prompt = 0, prefill_predicted = 0;
  for (const auto& p : c.prefill) {
    prefill_prompt += sum("kvgate_prompt_tokens_total", p.url());
    prefill_predicted += sum("kvgate_predicted_cached_tokens_total", p.url());
  }
  EXPECT_GT(prefill_prompt, 0) << text;
  EXPECT_GT(prefill_predicted, 0) << "cache_aware predicted the later turns' history";
  for (const auto& d : c.decode) {
    EXPECT_EQ(sum("kvgate_prompt_tokens_total", d.url()), 0) << d.url() << "\n" << text;
    EXPECT_EQ(sum("kvgate_cached_tokens_total", d.url()), 0) << d.url();
    EXPECT_GT(sum("kvgate_generated_tokens_total", d.url()) +
                  sum("kvgate_e2e_request_duration_seconds_count", d.url()),
              0)
        << "the decode servers still count what they did";
  }
}

// /generate with return_logprob: SGLang's decode computes no prompt rows, its prefill does; the
// client gets the decode's answer with the prefill's rows in front, the same rows a server without
// disaggregation answers (the sims' logprobs depend on the token, its position and the seed).
TEST(Pd, PromptLogprobsComeFromThePrefill) {
  PdCluster c(PdOptions{.gateway_args = {"--policy", "round_robin"}});
  ASSERT_TRUE(c.ready) << c.gateway->log();
  Sim plain;
  plain.port = free_port();
  plain.args = {"--page-size", "16", "--enable-cache-report", "--time-scale", "0"};
  plain.start();
  const std::string base =
      R"({"text":"Tell me about the history of the printing press in Europe and Asia",)"
      R"("sampling_params":{"max_new_tokens":3},"return_logprob":true,"logprob_start_len":0,)"
      R"("top_logprobs_num":2)";
  auto meta = [](const std::string& answer) {
    auto j = nlohmann::json::parse(answer, nullptr, false);
    return j.is_object() && j.contains("meta_info") ? j["meta_info"] : nlohmann::json();
  };
  // The last data event of a stream (it carries every row so far).
  auto last_event = [](const std::string& body) {
    std::string last;
    for (size_t at = body.find("data: {"); at != std::string::npos;
         at = body.find("data: {", at + 1)) {
      last = body.substr(at + 6, body.find("\n\n", at) - at - 6);
    }
    return last;
  };
  auto want = meta(HttpClient(plain.port).post("/generate", base + "}").body);
  ASSERT_TRUE(want.is_object());
  ASSERT_GT(want["input_token_logprobs"].size(), 5u);
  HttpClient client(c.port);
  for (bool stream : {false, true}) {
    auto r = client.post("/generate", base + (stream ? R"(,"stream":true})" : "}"));
    ASSERT_EQ(r.status, 200) << r.body;
    auto got = meta(stream ? last_event(r.body) : r.body);
    ASSERT_TRUE(got.is_object()) << r.body;
    EXPECT_EQ(got["input_token_logprobs"], want["input_token_logprobs"]) << stream;
    EXPECT_EQ(got["input_top_logprobs"], want["input_top_logprobs"]) << stream;
    EXPECT_EQ(got["output_token_logprobs"].size(), 3u) << stream;
  }
}

// A prefill server that answers an error status, or aborts its stream in the first event: its
// decode request is aborted at once (the decode servers' room timeout here is a minute), and the
// pair is chosen again: the client gets the other prefill server's answer.
TEST(Pd, PrefillErrorsAbortTheirDecodeAndThePairIsChosenAgain) {
  PdCluster c(PdOptions{.gateway_args = {"--policy", "round_robin"}});
  ASSERT_TRUE(c.ready) << c.gateway->log();
  HttpClient client(c.port);
  HttpClient bad(c.prefill[0].port);
  for (const std::string faults : {R"({"fail_rate":1.0,"fail_status":503})",
                                   R"({"fail_rate":0,"abort_first_event_rate":1.0})"}) {
    ASSERT_EQ(bad.post("/sim/faults", faults).status, 200);
    for (int i = 0; i < 4; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      auto r = client.post(i % 2 ? "/generate" : "/v1/chat/completions",
                           i % 2 ? kGenerateStream : chat(true));
      EXPECT_EQ(r.status, 200) << faults << r.body;
      EXPECT_EQ(r.body.find("\"error\""), std::string::npos) << faults << r.body;
      EXPECT_EQ(r.body.find("\"abort\""), std::string::npos) << faults << r.body;
      EXPECT_EQ(r.header("x-kvgate-prefill-worker"), c.prefill[1].url());
      EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s) << faults;
    }
  }
  EXPECT_GE(c.metric("kvgate_pd_prefill_failures_total{worker=\"" + c.prefill[0].url() + "\"}"), 2);
  // The aborted decodes hold nothing.
  EXPECT_TRUE(wait_until([&] { return PdCluster::load(c.decode[0]) == 0; }, 5s));
  EXPECT_TRUE(wait_until([&] { return PdCluster::load(c.decode[1]) == 0; }, 5s));

  // A prefill's refusal of the request itself (a 4xx) is the client's answer, not retried.
  ASSERT_EQ(
      bad.post("/sim/faults", R"({"fail_rate":1.0,"fail_status":400,"abort_first_event_rate":0})")
          .status,
      200);
  ASSERT_EQ(HttpClient(c.prefill[1].port)
                .post("/sim/faults", R"({"fail_rate":1.0,"fail_status":400})")
                .status,
            200);
  const double retries = c.metric("kvgate_retries_total{route=\"/generate\"}");
  auto r = client.post("/generate", kGenerate);
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_NE(r.body.find("error"), std::string::npos) << r.body;
  EXPECT_EQ(c.metric("kvgate_retries_total{route=\"/generate\"}"), retries);
  EXPECT_TRUE(wait_until([&] { return PdCluster::load(c.decode[0]) == 0; }, 5s));
  EXPECT_TRUE(wait_until([&] { return PdCluster::load(c.decode[1]) == 0; }, 5s));
}

// The only prefill server dies: requests fail at once with one clear error (no decode waits for a
// room: the decode servers' room timeout here is a minute), and recover when it returns.
TEST(Pd, DeadPrefillGivesClearErrorsLeavesNoDecodeWaitingAndRecovers) {
  PdCluster c(PdOptions{.gateway_args = {"--policy", "round_robin", "--retry-max-retries", "2"}});
  ASSERT_TRUE(c.ready) << c.gateway->log();
  HttpClient client(c.port);
  c.prefill[0].kill();
  c.prefill[1].kill();
  for (int i = 0; i < 4; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    auto r = client.post("/generate", i % 2 ? kGenerateStream : kGenerate);
    auto took = std::chrono::steady_clock::now() - t0;
    EXPECT_TRUE(r.status == 502 || r.status == 503) << r.status << r.body;
    EXPECT_NE(r.body.find("prefill"), std::string::npos) << r.body;
    EXPECT_LT(took, 10s) << "a request waited on a room that could not come";
  }
  // No decode server is left holding a request.
  EXPECT_TRUE(wait_until([&] { return PdCluster::load(c.decode[0]) == 0; }, 5s));
  EXPECT_TRUE(wait_until([&] { return PdCluster::load(c.decode[1]) == 0; }, 5s));
  EXPECT_GE(c.metric("kvgate_pd_prefill_failures_total{worker=\"" + c.prefill[0].url() + "\"}") +
                c.metric("kvgate_pd_prefill_failures_total{worker=\"" + c.prefill[1].url() + "\"}"),
            1);
  // Readiness says no prefill server is healthy once the health checks see it.
  EXPECT_TRUE(wait_until([&] { return client.get("/readiness").status == 503; }, 10s));
  // Back: requests succeed again.
  c.prefill[0].start();
  c.prefill[1].start();
  EXPECT_TRUE(wait_until([&] { return client.get("/readiness").status == 200; }, 15s));
  EXPECT_TRUE(wait_until([&] { return client.post("/generate", kGenerate).status == 200; }, 15s));
  auto r = client.post("/v1/chat/completions", chat(true));
  EXPECT_EQ(r.status, 200) << r.body;
}

// A prefill server dies while it prefills: the client's request is retried on the other pair (or
// ends with a clear error), never left hanging, and the decode servers hold nothing afterwards.
TEST(Pd, PrefillKilledMidRequestLeavesNoHungDecode) {
  // Slow sims (each request's prefill takes long enough to kill the server during it).
  PdCluster c(PdOptions{.gateway_args = {"--policy", "round_robin"}, .time_scale = 4});
  ASSERT_TRUE(c.ready) << c.gateway->log();
  std::string long_prompt = "Describe in detail";
  for (int i = 0; i < 400; ++i) long_prompt += " and more " + std::to_string(i);
  const std::string body =
      R"({"text":")" + long_prompt + R"(","sampling_params":{"max_new_tokens":4},"stream":true})";
  std::vector<std::future<Response>> running;
  running.reserve(4);
  for (int i = 0; i < 4; ++i) {
    running.push_back(std::async(std::launch::async, [&] {
      HttpClient client(c.port);
      client.set_timeout(60s);
      return client.post("/generate", body);
    }));
  }
  // Kill one prefill server once it runs a request.
  ASSERT_TRUE(wait_until([&] { return PdCluster::load(c.prefill[0]) > 0; }, 10s));
  c.prefill[0].kill();
  int ok = 0;
  for (auto& f : running) {
    ASSERT_EQ(f.wait_for(30s), std::future_status::ready) << "a request hung";
    Response r = f.get();
    if (r.status == 200 && r.body.find("\"abort\"") == std::string::npos &&
        r.body.find("\"error\"") == std::string::npos) {
      ++ok;
    } else {
      EXPECT_NE(r.body.find("prefill"), std::string::npos) << r.status << r.body;
    }
  }
  EXPECT_GE(ok, 2) << "the other prefill server's requests, at least, succeed";
  EXPECT_TRUE(wait_until([&] { return PdCluster::load(c.decode[0]) == 0; }, 10s));
  EXPECT_TRUE(wait_until([&] { return PdCluster::load(c.decode[1]) == 0; }, 10s));
}

}  // namespace
}  // namespace kvgate::testing
