// Tests of gateway/decision_log: the ring of the last routing decisions (bounded, newest first),
// the explanation of one, and the prediction in tokens comparable with the engine's count.
#include "gateway/decision_log.h"

#include <gtest/gtest.h>

#include <thread>

namespace kvgate {
namespace {

DecisionRecord record(int n) {
  DecisionRecord r;
  r.rid = "r" + std::to_string(n);
  r.rule = "default";
  r.worker = "http://127.0.0.1:1";
  r.policy = "round_robin";
  r.branch = "round_robin";
  r.status = 200;
  return r;
}

TEST(DecisionLog, KeepsTheNewestFirstAndAtMostItsCapacity) {
  DecisionLog log;
  EXPECT_TRUE(log.recent(10).empty());
  for (int i = 0; i < 3; ++i) log.add(record(i));
  auto three = log.recent(10);
  ASSERT_EQ(three.size(), 3u);
  EXPECT_EQ(three[0].rid, "r2");
  EXPECT_EQ(three[2].rid, "r0");
  EXPECT_EQ(three[0].seq, 3u);
  EXPECT_EQ(three[2].seq, 1u);
  for (int i = 3; i < static_cast<int>(DecisionLog::kCapacity) + 50; ++i) log.add(record(i));
  EXPECT_EQ(log.total(), DecisionLog::kCapacity + 50);
  auto all = log.recent(100000);
  ASSERT_EQ(all.size(), DecisionLog::kCapacity);
  EXPECT_EQ(all.front().rid, "r" + std::to_string(DecisionLog::kCapacity + 49));
  EXPECT_EQ(all.back().rid, "r50");  // the 50 oldest were overwritten
  EXPECT_EQ(log.recent(1).size(), 1u);
}

TEST(DecisionLog, CutsARequestIdAClientChose) {
  DecisionLog log;
  DecisionRecord r = record(0);
  r.rid = std::string(10000, 'x');
  log.add(r);
  EXPECT_EQ(log.recent(1)[0].rid.size(), DecisionLog::kMaxRid);
}

TEST(DecisionLog, ThreadsAddingWhileOneReadsLoseNothing) {
  DecisionLog log;
  constexpr int kPerThread = 2000;
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&log] {
      for (int i = 0; i < kPerThread; ++i) log.add(record(i));
    });
  }
  size_t seen = 0;
  while (log.total() < 3u * kPerThread) seen = std::max(seen, log.recent(50).size());
  for (auto& t : threads) t.join();
  EXPECT_LE(seen, 50u);
  EXPECT_EQ(log.total(), 3u * kPerThread);
  EXPECT_EQ(log.recent(1000).size(), DecisionLog::kCapacity);
}

TEST(DecisionLog, PredictionInTokensComparesWithTheEnginesCount) {
  DecisionRecord kv = record(0);
  kv.predicted_tokens = 192;
  EXPECT_EQ(predicted_cached_tokens(kv), 192u);
  // cache_aware: characters matched, scaled by the prompt's tokens per character.
  DecisionRecord ca = record(0);
  ca.predicted_chars = 300;
  ca.request_chars = 400;
  EXPECT_EQ(predicted_cached_tokens(ca), 0u);  // no prompt_tokens reported: nothing to scale by
  ca.prompt_tokens = 100;
  EXPECT_EQ(predicted_cached_tokens(ca), 75u);
  ca.predicted_chars = 900;  // never more than the prompt
  EXPECT_EQ(predicted_cached_tokens(ca), 100u);
  EXPECT_EQ(predicted_cached_tokens(record(0)), 0u);
}

TEST(DecisionLog, ExplainsKvExactHitsInPagesAndTheEnginesVerdict) {
  DecisionRecord r = record(0);
  r.policy = "kv_exact";
  r.branch = "kv_exact_hit";
  r.rank = 1;
  r.page_size = 16;
  r.predicted_tokens = 192;
  r.request_tokens = 330;
  r.prompt_tokens = 330;
  r.cached_tokens = 176;
  EXPECT_EQ(explain(r),
            "kv_exact_hit: rank 1 of http://127.0.0.1:1 holds 12 of the prompt's 20 full pages "
            "(192 of 330 tokens); the engine reported 176 of 330 prompt tokens cached "
            "(predicted 192)");
}

TEST(DecisionLog, ExplainsFallbacksCacheAwareRetriesAndRequestsNotRun) {
  DecisionRecord fb = record(0);
  fb.policy = "kv_exact";
  fb.branch = "kv_exact_miss";
  fb.fallback_branch = "round_robin";
  fb.page_size = 16;
  EXPECT_EQ(explain(fb),
            "kv_exact_miss (the fallback chose: round_robin): sent to http://127.0.0.1:1; the "
            "engine reported no cache figures");
  DecisionRecord ca = record(0);
  ca.branch = "cache_hit";
  ca.predicted_chars = 50;
  ca.request_chars = 200;
  ca.attempt = 2;
  ca.status = 503;
  ca.started = false;
  EXPECT_EQ(explain(ca),
            "cache_hit: http://127.0.0.1:1 was believed to hold 50 of the 200 characters (25%); "
            "attempt 2; the worker did not run it (status 503)");
  DecisionRecord failed = record(0);
  failed.status = 500;
  EXPECT_EQ(explain(failed), "round_robin: sent to http://127.0.0.1:1; status 500");
}

}  // namespace
}  // namespace kvgate
