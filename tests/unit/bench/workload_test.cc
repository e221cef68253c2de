// Tests for bench/workload, bench/oracle and bench/report: determinism, shapes, trace parsing,
// the upper bound on hand-computed cases, stream event parsing.
#include "bench/workload.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "bench/driver.h"
#include "bench/oracle.h"
#include "bench/report.h"

namespace kvgate::bench {
namespace {

TEST(Workload, MultiturnIsDeterministic) {
  MultiturnOptions o;
  o.users = 3;
  o.turns = 2;
  o.seed = 42;
  Workload a = multiturn(o), b = multiturn(o);
  ASSERT_EQ(a.sessions.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_EQ(a.sessions[i].turns.size(), 2u);
    for (size_t t = 0; t < 2; ++t)
      EXPECT_EQ(a.sessions[i].turns[t].user, b.sessions[i].turns[t].user);
  }
  EXPECT_NE(a.sessions[0].turns[0].user, a.sessions[1].turns[0].user);
  o.seed = 43;
  EXPECT_NE(multiturn(o).sessions[0].turns[0].user, a.sessions[0].turns[0].user);
  EXPECT_EQ(a.requests(), 6u);
  EXPECT_FALSE(a.open_loop);
  o.rate = 2;
  Workload open = multiturn(o);
  EXPECT_TRUE(open.open_loop);
  EXPECT_EQ(open.sessions[0].arrival_s, 0);
  EXPECT_GT(open.sessions[2].arrival_s, open.sessions[1].arrival_s);
}

TEST(Workload, ThinkTimeIsExponentialAroundTheMean) {
  MultiturnOptions o;
  o.users = 200;
  o.turns = 6;
  o.think_s = 0.05;
  Workload a = multiturn(o), b = multiturn(o);
  double sum = 0;
  size_t n = 0, distinct = 0;
  for (size_t i = 0; i < a.sessions.size(); ++i) {
    EXPECT_EQ(a.sessions[i].turns[0].think_s, 0) << "no pause before the first turn";
    for (size_t t = 1; t < a.sessions[i].turns.size(); ++t) {
      double th = a.sessions[i].turns[t].think_s;
      EXPECT_EQ(th, b.sessions[i].turns[t].think_s) << "deterministic";
      EXPECT_GE(th, 0);
      sum += th;
      ++n;
      if (th != a.sessions[i].turns[1].think_s) ++distinct;
    }
  }
  EXPECT_NEAR(sum / static_cast<double>(n), 0.05, 0.01);  // 1,000 draws: mean within ~6 sigma
  EXPECT_GT(distinct, n / 2) << "users do not pause in lockstep";
  o.think_s = 0;
  EXPECT_EQ(multiturn(o).sessions[3].turns[2].think_s, 0);
}

TEST(Workload, WordTextHasTheAskedLength) {
  std::string t = word_text(7, 50);
  EXPECT_EQ(std::count(t.begin(), t.end(), ' '), 49);
  EXPECT_EQ(word_text(7, 50), t);
}

TEST(Workload, SharedPrefixGroupsShareTheirSystemPrompt) {
  SharedPrefixOptions o;
  o.groups = 4;
  o.prompts = 3;
  o.scale = 16;
  Workload w = shared_prefix(o);
  ASSERT_EQ(w.sessions.size(), 12u);
  std::map<std::string, int> systems;
  for (const auto& s : w.sessions) {
    systems[s.system]++;
    EXPECT_EQ(s.turns[0].max_tokens, 16);  // 256 / 16
  }
  EXPECT_EQ(systems.size(), 4u);
  for (const auto& [sys, n] : systems) {
    EXPECT_EQ(n, 3);
    EXPECT_EQ(std::count(sys.begin(), sys.end(), ' ') + 1, 128);  // 2048 / 16 words
  }
}

std::string write_trace(const std::string& lines) {
  char path[] = "/tmp/kvgate-trace-XXXXXX";
  int fd = mkstemp(path);
  close(fd);
  std::ofstream(path) << lines;
  return path;
}

TEST(Workload, TraceBlocksBecomeSharedText) {
  std::string path = write_trace(
      R"({"timestamp": 0, "input_length": 10, "output_length": 4, "hash_ids": [1, 2, 3]})"
      "\n"
      R"({"timestamp": 2000, "input_length": 7, "output_length": 2, "hash_ids": [1, 2, 9]})"
      "\n"
      R"({"timestamp": 3000, "input_length": 6, "output_length": 1, "hash_ids": [5, 2]})"
      "\n");
  TraceOptions o;
  o.path = path;
  o.block_tokens = 4;
  o.time_scale = 2;
  Workload w;
  ASSERT_EQ(trace(o, w), "");
  ASSERT_EQ(w.sessions.size(), 3u);
  EXPECT_TRUE(w.open_loop);
  EXPECT_DOUBLE_EQ(w.sessions[1].arrival_s, 1.0);
  auto words = [](const std::string& s) { return std::count(s.begin(), s.end(), ' ') + 1; };
  EXPECT_EQ(words(w.sessions[0].turns[0].user), 10);
  EXPECT_EQ(words(w.sessions[1].turns[0].user), 7);
  // Request 2 is blocks 1 and 2 cut to 7 words: the same words as the start of request 1.
  const std::string& a = w.sessions[0].turns[0].user;
  const std::string& b = w.sessions[1].turns[0].user;
  EXPECT_EQ(a.substr(0, b.size()), b);
  EXPECT_NE(w.sessions[2].turns[0].user.substr(0, 20), a.substr(0, 20));  // starts with block 5
  EXPECT_EQ(w.sessions[0].turns[0].max_tokens, 4);
  // Bound by hand: request 2 reuses blocks 1,2 (8 of 7 capped: 4 + 3 = 7 tokens), request 3
  // reuses nothing (block 5 is new, so block 2 after it does not count): 7 / 23.
  std::string err;
  EXPECT_NEAR(trace_upper_bound(o, err), 7.0 / 23.0, 1e-9);
  EXPECT_EQ(err, "");
  std::remove(path.c_str());
}

TEST(Workload, TraceErrorsNameTheLine) {
  std::string path = write_trace("{\"timestamp\": 0, \"input_length\": 5, \"hash_ids\": [1]}\n");
  TraceOptions o;
  o.path = path;
  Workload w;
  std::string e = trace(o, w);
  EXPECT_NE(e.find(":1: missing \"output_length\""), std::string::npos) << e;
  o.path = "/nonexistent/trace.jsonl";
  EXPECT_NE(trace(o, w).find("cannot open"), std::string::npos);
  std::remove(path.c_str());
}

TEST(Oracle, CountsReusableFullPagesOnly) {
  std::string note, err;
  PrefixOracle o(sim::make_tokenizer("", note, err), sim::make_chat_template(""), 4);
  std::vector<int32_t> a{1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  EXPECT_EQ(o.arrive(a), 0u);  // nothing seen yet
  std::vector<int32_t> b{1, 2, 3, 4, 5, 6, 7, 99, 9, 10};
  EXPECT_EQ(o.arrive(b), 4u);  // page 2 differs at its 4th token
  std::vector<int32_t> c{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  EXPECT_EQ(o.arrive(c), 8u);  // 2 full pages of a
  EXPECT_EQ(o.prompt_tokens(), 32u);
  EXPECT_EQ(o.reusable_tokens(), 12u);
  EXPECT_NEAR(o.upper_bound(), 12.0 / 32.0, 1e-9);
}

TEST(Oracle, OutputsBecomeReusable) {
  std::string note, err;
  PrefixOracle o(sim::make_tokenizer("", note, err), sim::make_chat_template(""), 1);
  auto p1 = o.text_tokens("hello there");
  o.arrive(p1);
  o.finish(p1, " the reply");
  auto p2 = o.text_tokens("hello there the reply and more");
  EXPECT_EQ(o.arrive(p2), o.text_tokens("hello there the reply").size());
}

TEST(Events, ChatCompletionsAndGenerate) {
  RequestRecord r;
  EXPECT_EQ(apply_event(Api::kChat, R"({"choices":[{"delta":{"content":"Hi"}}]})", "", r), "Hi");
  EXPECT_EQ(
      apply_event(
          Api::kChat,
          R"({"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":3,"prompt_tokens_details":null}})",
          "Hi", r),
      "");
  EXPECT_EQ(r.prompt_tokens, 10);
  EXPECT_EQ(r.cached_tokens, 0);  // null details on an OpenAI route means none cached
  RequestRecord c;
  apply_event(
      Api::kCompletions,
      R"({"choices":[],"usage":{"prompt_tokens":8,"prompt_tokens_details":{"cached_tokens":4}}})",
      "", c);
  EXPECT_EQ(c.cached_tokens, 4);
  RequestRecord g;
  EXPECT_EQ(apply_event(Api::kGenerate,
                        R"({"text":"one two","meta_info":{"prompt_tokens":5,"cached_tokens":2}})",
                        "one", g),
            " two");
  EXPECT_EQ(g.cached_tokens, 2);
  RequestRecord e;
  apply_event(Api::kChat, R"({"error":{"message":"worker failed"}})", "", e);
  EXPECT_EQ(e.error, "worker failed");
}

TEST(Report, SummaryAndTable) {
  RunResult run;
  run.wall_s = 2;
  for (int i = 0; i < 10; ++i) {
    RequestRecord r;
    r.status = 200;
    r.ttft_ms = 10 + i;
    r.e2e_ms = 100;
    r.completion_tokens = 10;
    r.prompt_tokens = 100;
    r.cached_tokens = i < 5 ? 50 : 0;
    r.worker = i < 6 ? "a" : "b";
    run.records.push_back(r);
  }
  RequestRecord failed;
  failed.error = "boom";
  run.records.push_back(failed);
  Summary s = summarize("cache_aware", run, 0.5, -1);
  EXPECT_EQ(s.requests, 11u);
  EXPECT_EQ(s.errors, 1u);
  EXPECT_DOUBLE_EQ(s.hit_rate, 0.25);
  EXPECT_DOUBLE_EQ(s.output_tokens_per_s, 50);
  EXPECT_DOUBLE_EQ(s.spread_requests, 1.2);
  EXPECT_NEAR(s.ttft_p50, 14.5, 1e-9);
  std::string t = table({s}, true);
  EXPECT_NE(t.find("cache_aware"), std::string::npos);
  EXPECT_NE(t.find("25.0%"), std::string::npos);  // hit rate
  EXPECT_NE(t.find("50.0%"), std::string::npos);  // of the bound
  EXPECT_NE(to_svg({s}, "t").find("<svg"), std::string::npos);
  EXPECT_NE(to_json({s}, "w", "d").find("\"hit_rate\":0.25"), std::string::npos);
}

}  // namespace
}  // namespace kvgate::bench
