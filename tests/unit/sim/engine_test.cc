// Tests for sim/engine, sim/sequence and sim/fixed_delay_scheduler: timing, stop conditions, DP
// dispatch, cancellation and load accounting, on a real io_context.
#include "sim/engine.h"

#include <gtest/gtest.h>

#include <boost/asio/as_tuple.hpp>

namespace kvgate::sim {
namespace {

using namespace std::chrono_literals;

class SimEngine : public ::testing::Test {
 protected:
  std::unique_ptr<Engine> make(int dp, std::chrono::nanoseconds ttft,
                               std::chrono::nanoseconds tpot) {
    metrics = std::make_unique<SimMetrics>("m", dp);
    return std::make_unique<Engine>(
        EngineConfig{
            .dp_size = dp, .max_total_tokens = 1000, .seed = 0, .ttft = ttft, .tpot = tpot},
        tok, *metrics);
  }
  GenerationRequest request(std::string_view prompt, int64_t max_new) {
    GenerationRequest r;
    tok.encode(prompt, r.prompt);
    r.sampling.max_new_tokens = max_new;
    return r;
  }
  // Runs the loop for `d` (restarting it if it ran out of work before).
  void run_for(std::chrono::milliseconds d) {
    ctx.restart();
    ctx.run_for(d);
  }
  // Runs the loop until `seq` finished (or the deadline).
  void run_until_finished(const std::shared_ptr<Sequence>& seq,
                          std::chrono::milliseconds limit = 5s) {
    auto until = Clock::now() + limit;
    while (!seq->finished() && Clock::now() < until) run_for(5ms);
  }
  std::vector<int32_t> tokens(const Sequence& seq, Progress& p) {
    std::vector<int32_t> out;
    seq.read(0, out, p);
    return out;
  }

  asio::io_context ctx{1};
  StandInTokenizer tok;
  std::unique_ptr<SimMetrics> metrics;
};

TEST_F(SimEngine, GeneratesThePseudoTextOfThePrompt) {
  auto engine = make(1, 0ms, 0ms);
  auto n = std::make_shared<Notifier>(ctx.get_executor());
  auto req = request("hello there", 12);
  auto expected = engine->model().generate(req.prompt, 0, 12);
  auto seq = engine->submit(req, n);
  run_until_finished(seq);
  Progress p;
  EXPECT_EQ(tokens(*seq, p), expected);
  ASSERT_TRUE(p.finish);
  EXPECT_EQ(p.finish->kind, FinishReason::Kind::kLength);
  EXPECT_EQ(p.finish->length, 12);
  EXPECT_TRUE(p.started);
  EXPECT_EQ(p.cached_tokens, 0);
  EXPECT_EQ(metrics->rank(0).generation_tokens->value(), 12u);
  EXPECT_EQ(metrics->rank(0).prompt_tokens->value(), req.prompt.size());
  EXPECT_EQ(metrics->rank(0).requests->value(), 1u);
  EXPECT_EQ(engine->loads()[0].running, 0);
  EXPECT_EQ(engine->loads()[0].used_tokens, 0);
}

TEST_F(SimEngine, TimingFollowsTtftAndTpot) {
  auto engine = make(1, 40ms, 10ms);
  auto n = std::make_shared<Notifier>(ctx.get_executor());
  auto seq = engine->submit(request("hi", 5), n);
  run_until_finished(seq);
  Progress p;
  tokens(*seq, p);
  auto ttft = p.first_token_at - seq->arrival();
  auto total = p.finished_at - seq->arrival();
  EXPECT_GE(ttft, 40ms);
  EXPECT_GE(total, 80ms);  // 40 + 4 x 10
  EXPECT_LT(total, 2s);
}

TEST_F(SimEngine, LoadCountsRunningRequestsAndTheirTokens) {
  auto engine = make(1, 10s, 10ms);
  auto n = std::make_shared<Notifier>(ctx.get_executor());
  auto a = engine->submit(request("abc", 5), n);
  auto b = engine->submit(request("de", 5), n);
  run_for(20ms);
  RankLoad l = engine->loads()[0];
  EXPECT_EQ(l.running, 2);
  EXPECT_EQ(l.used_tokens, 5);
  EXPECT_DOUBLE_EQ(l.token_usage(), 0.005);
  EXPECT_FALSE(engine->flush_cache());  // refused while requests run
  a->cancel();
  b->cancel();
  run_for(20ms);
  EXPECT_EQ(engine->loads()[0].running, 0);
  EXPECT_EQ(engine->loads()[0].used_tokens, 0);
  EXPECT_TRUE(engine->flush_cache());
  EXPECT_FALSE(a->finished());  // cancelled, never advanced again
}

TEST_F(SimEngine, CancelStopsTheTimers) {
  auto engine = make(1, 0ms, 5ms);
  auto n = std::make_shared<Notifier>(ctx.get_executor());
  auto seq = engine->submit(request("hi", 1000), n);
  run_for(30ms);
  seq->cancel();
  run_for(5ms);
  size_t at_cancel = seq->output_size();
  run_for(50ms);
  EXPECT_EQ(seq->output_size(), at_cancel);
  EXPECT_LT(at_cancel, 1000u);
  EXPECT_EQ(engine->loads()[0].running, 0);
}

TEST_F(SimEngine, StopStringsAndStopTokens) {
  auto engine = make(1, 0ms, 0ms);
  auto n = std::make_shared<Notifier>(ctx.get_executor());
  auto req = request("a prompt", 50);
  auto expected = engine->model().generate(req.prompt, 0, 50);
  // Stop at the fifth generated word, by token id and by its text.
  std::string word;
  tok.decode_token(expected[4], word);
  auto by_id = req;
  by_id.sampling.stop_token_ids = {expected[4]};
  auto by_text = req;
  by_text.sampling.stop = {word.substr(1)};
  for (auto& r : {by_id, by_text}) {
    auto seq = engine->submit(r, n);
    run_until_finished(seq);
    Progress p;
    auto out = tokens(*seq, p);
    ASSERT_TRUE(p.finish);
    EXPECT_EQ(p.finish->kind, FinishReason::Kind::kStop);
    EXPECT_TRUE(p.finish->hides_last_token());
    // The first occurrence of that word ends it.
    size_t first = std::find(expected.begin(), expected.end(), expected[4]) - expected.begin();
    EXPECT_EQ(out.size(), first + 1);
  }
}

TEST_F(SimEngine, ZeroNewTokensFinishesAfterPrefill) {
  auto engine = make(1, 0ms, 0ms);
  auto n = std::make_shared<Notifier>(ctx.get_executor());
  auto seq = engine->submit(request("x", 0), n);
  run_until_finished(seq);
  Progress p;
  EXPECT_TRUE(tokens(*seq, p).empty());
  ASSERT_TRUE(p.finish);
  EXPECT_EQ(p.finish->length, 0);
}

TEST_F(SimEngine, DpRoundRobinAndRoutedRank) {
  auto engine = make(3, 0ms, 0ms);
  auto n = std::make_shared<Notifier>(ctx.get_executor());
  std::vector<int> ranks;
  for (int i = 0; i < 6; ++i) ranks.push_back(engine->submit(request("x", 1), n)->dp_rank());
  EXPECT_EQ(ranks, (std::vector<int>{0, 1, 2, 0, 1, 2}));
  auto req = request("x", 1);
  req.routed_dp_rank = 2;
  EXPECT_EQ(engine->submit(req, n)->dp_rank(), 2);
  EXPECT_EQ(engine->check_rank(2), "");
  EXPECT_EQ(engine->check_rank(std::nullopt), "");
  EXPECT_EQ(engine->check_rank(3), "routed_dp_rank=3 out of range [0, 3)");
  EXPECT_NE(engine->check_rank(-1), "");
  run_for(20ms);
  EXPECT_EQ(engine->loads().size(), 3u);
}

TEST_F(SimEngine, NotifierWakesTheConsumer) {
  auto n = std::make_shared<Notifier>(ctx.get_executor());
  int woke = 0;
  asio::co_spawn(
      ctx,
      [&]() -> awaitable<void> {
        co_await n->wait();
        ++woke;
        co_await n->wait();
        ++woke;
      },
      asio::detached);
  run_for(5ms);
  EXPECT_EQ(woke, 0);
  n->notify();
  run_for(5ms);
  EXPECT_EQ(woke, 1);
  std::thread([&] { n->notify(); }).join();  // from another thread
  run_for(5ms);
  EXPECT_EQ(woke, 2);
}

}  // namespace
}  // namespace kvgate::sim
