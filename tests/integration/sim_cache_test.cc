// Integration: the kvgate-sim binary's prefix cache as a client observes it. cached_tokens on
// scripted multi-turn conversations must be exact (SGLang's rule: the cache holds prompt + output
// minus the last token, whole pages only, and a match stops one token before the prompt's end),
// /metrics and /v1/loads report hits, /flush_cache refuses while a request runs and empties the
// cache after, and a cache miss costs its prefill time while a hit does not.
#include <gtest/gtest.h>

#include <thread>

#include "support/cluster.h"

namespace kvgate::testing {
namespace {

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out.push_back('\\');
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out.push_back(c);
  }
  return out;
}

struct Turn {
  std::string role, content;
};

std::string chat_body(const std::vector<Turn>& turns, int max_tokens) {
  std::string b = R"({"model":"m","max_tokens":)" + std::to_string(max_tokens) + R"(,"messages":[)";
  for (size_t i = 0; i < turns.size(); ++i) {
    if (i) b += ",";
    b += R"({"role":")" + turns[i].role + R"(","content":")" + escape(turns[i].content) + "\"}";
  }
  return b + "]}";
}

int64_t num(const std::string& body, const std::string& key) {
  return static_cast<int64_t>(json_number_field(body, key));
}

// Runs a conversation of `users` turns; checks each turn's cached_tokens against the rule.
void conversation(int port, int64_t page, const std::vector<std::string>& users) {
  HttpClient c(port);
  std::vector<Turn> turns = {{"system", "You are a terse assistant. Answer in a few words."}};
  int64_t expected = 0;
  for (size_t i = 0; i < users.size(); ++i) {
    turns.push_back({"user", users[i]});
    auto r = c.post("/v1/chat/completions", chat_body(turns, 6 + static_cast<int>(i)));
    ASSERT_EQ(r.status, 200) << r.body;
    const int64_t prompt = num(r.body, "prompt_tokens");
    const int64_t completion = num(r.body, "completion_tokens");
    const int64_t cached = num(r.body, "cached_tokens");  // -1: prompt_tokens_details is null
    if (expected == 0) {
      EXPECT_NE(r.body.find(R"("prompt_tokens_details":null)"), std::string::npos)
          << "no hit: null details, as SGLang answers";
    } else {
      EXPECT_EQ(cached, expected) << "turn " << i + 1 << ": " << r.body;
    }
    // What this turn leaves cached: prompt + completion - 1 tokens (the last one has no KV),
    // whole pages only. The next prompt starts with all of it (the reply re-tokenizes exactly).
    expected = (prompt + completion - 1) / page * page;
    turns.push_back({"assistant", json_string_field(r.body, "content")});
  }
}

TEST(SimCache, MultiTurnChatCachedTokensAreExact) {
  const std::vector<std::string> users = {"What is the capital of France?",
                                          "And how many people live there?",
                                          "Name one museum there.", "Thanks!"};
  for (int64_t page : {1, 16}) {
    Sim s = Sim::launch(
        {"--page-size", std::to_string(page), "--enable-cache-report", "--time-scale", "0.02"});
    conversation(s.port, page, users);
  }
}

TEST(SimCache, RepeatedPromptMatchesAllButItsLastToken) {
  Sim s = Sim::launch({"--page-size", "8", "--time-scale", "0.02", "--enable-metrics"});
  HttpClient c(s.port);
  const std::string body =
      R"({"text":"The quick brown fox jumps over the lazy dog again and again","sampling_params":{"max_new_tokens":1}})";
  auto first = c.post("/generate", body);
  ASSERT_EQ(first.status, 200) << first.body;
  EXPECT_EQ(num(first.body, "cached_tokens"), 0);
  const int64_t prompt = num(first.body, "prompt_tokens");
  auto second = c.post("/generate", body);
  EXPECT_EQ(num(second.body, "cached_tokens"), (prompt - 1) / 8 * 8) << second.body;

  std::string metrics = c.get("/metrics").body;
  EXPECT_NE(metrics.find("sglang:cached_tokens_total{model_name=\"kvgate-sim\",dp_rank=\"0\"} " +
                         std::to_string((prompt - 1) / 8 * 8)),
            std::string::npos)
      << metrics;
  EXPECT_EQ(metrics.find("sglang:cache_hit_rate{model_name=\"kvgate-sim\",dp_rank=\"0\"} 0\n"),
            std::string::npos)
      << "a hit rate above 0";
  EXPECT_GT(json_number_field(c.get("/v1/loads").body, "cache_hit_rate"), 0.2);
}

TEST(SimCache, FlushRefusedWhileRunningThenEmptiesTheCache) {
  Sim s = Sim::launch({"--time-scale", "0.05"});
  HttpClient c(s.port);
  const std::string body =
      R"({"text":"flush me please, I am a prompt","sampling_params":{"max_new_tokens":2}})";
  ASSERT_EQ(c.post("/generate", body).status, 200);
  EXPECT_GT(num(c.post("/generate", body).body, "cached_tokens"), 0);

  std::thread slow([port = s.port] {
    HttpClient c2(port);
    c2.post("/generate", R"({"text":"a long one","sampling_params":{"max_new_tokens":400}})");
  });
  ASSERT_TRUE(
      wait_until([&] { return json_number_field(c.get("/get_load").body, "num_reqs") > 0; }));
  auto refused = c.post("/flush_cache", "");
  EXPECT_EQ(refused.status, 400) << "SGLang refuses while requests run";
  slow.join();
  EXPECT_EQ(c.post("/flush_cache", "").status, 200);
  EXPECT_EQ(num(c.post("/generate", body).body, "cached_tokens"), 0) << "flushed";
}

TEST(SimCache, AMissCostsItsPrefillAndAHitDoesNot) {
  // Default timing (an 8B model on one H100): 55 us per uncached prompt token.
  Sim s = Sim::launch({"--page-size", "16"});
  HttpClient c(s.port);
  std::string ids;
  for (int i = 0; i < 3000; ++i) ids += (i ? "," : "") + std::to_string(i % 250);
  const std::string body =
      R"({"input_ids":[)" + ids + R"(],"sampling_params":{"max_new_tokens":1}})";
  auto miss = c.post("/generate", body);
  auto hit = c.post("/generate", body);
  ASSERT_EQ(miss.status, 200);
  const double t_miss = json_number_field(miss.body, "e2e_latency");
  const double t_hit = json_number_field(hit.body, "e2e_latency");
  EXPECT_GE(t_miss, 0.16) << "8 ms + 3000 x 55 us of prefill";
  EXPECT_LT(t_hit, 0.08) << "2992 tokens cached: one page to prefill";
  EXPECT_EQ(num(hit.body, "cached_tokens"), 2992);
}

}  // namespace
}  // namespace kvgate::testing
