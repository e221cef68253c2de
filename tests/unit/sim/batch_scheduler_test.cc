// Tests for sim/batch_scheduler: BatchCore driven step by step with explicit time (no sleeping):
// step durations of the timing model, chunked prefill under the token budget, one decode token per
// running request, admission by batch size and KV room, cached_tokens from the radix cache
// (including prompts inserted while their request still decodes), cancellation, flush, and the PD
// roles (prefill: transfer then one token; decode: no prefill). Plus BatchScheduler on its thread.
#include "sim/batch_scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <thread>

#include "sim/pd.h"
#include "sim/sim_metrics.h"

namespace kvgate::sim {
namespace {

using namespace std::chrono_literals;

std::vector<int32_t> seq(int from, int n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), from);
  return v;
}

struct Rooms final : RoomListener {
  std::vector<std::pair<uint64_t, RoomInfo>> ready;
  std::vector<uint64_t> failed;
  std::vector<int> ranks;
  void room_ready(uint64_t room, int rank, RoomInfo info) override {
    ready.emplace_back(room, info);
    ranks.push_back(rank);
  }
  void room_failed(uint64_t room, int rank, std::string) override {
    failed.push_back(room);
    ranks.push_back(rank);
  }
};

class BatchCoreTest : public ::testing::Test {
 protected:
  void TearDown() override {
    ctx.restart();
    ctx.poll();
  }
  RankSetup setup(int64_t page = 1, int64_t capacity = 100000) {
    RankSetup s;
    s.cache = RadixCacheConfig{.page_size = page, .capacity = capacity};
    s.metrics = &metrics.rank(0);
    return s;
  }
  std::shared_ptr<Sequence> make(std::vector<int32_t> prompt, int64_t max_new,
                                 std::optional<int64_t> transferred = std::nullopt,
                                 std::optional<uint64_t> room = std::nullopt) {
    GenerationRequest r;
    r.prompt = std::move(prompt);
    r.sampling.max_new_tokens = max_new;
    r.transferred_cached_tokens = transferred;
    if (room) r.bootstrap = Bootstrap{.host = "h", .port = 1, .room = *room};
    auto stream = model.start(r.prompt, 0);
    return std::make_shared<Sequence>(std::move(r), stream, tok, 0, n);
  }
  // Runs one step; returns its duration (0 when there was nothing to do).
  Clock::duration step(BatchCore& core) {
    auto d = core.begin_step(now);
    if (!d) return Clock::duration{};
    now += *d;
    core.end_step(now);
    return *d;
  }
  Progress progress(const Sequence& s) {
    Progress p;
    std::vector<int32_t> out;
    s.read(0, out, p);
    return p;
  }

  asio::io_context ctx{1};
  StandInTokenizer tok;
  PseudoText model{tok};
  std::shared_ptr<Notifier> n = std::make_shared<Notifier>(ctx.get_executor());
  SimMetrics metrics{"m", 1};
  Clock::time_point now = Clock::now();
  const BatchTiming timing{
      .step_fixed = 10ms, .per_prefill_token = 100us, .per_running_request = 1ms, .time_scale = 1};
};

TEST_F(BatchCoreTest, StepTimeIsFixedPlusPrefillPlusBatch) {
  BatchCore core(setup(), timing, BatchLimits{});
  auto a = make(seq(1, 200), 3);
  core.enqueue(a);
  EXPECT_EQ(step(core), 10ms + 200 * 100us + 1ms) << "prefill of 200 uncached tokens";
  EXPECT_EQ(a->output_size(), 1u) << "the prefill step yields the first token";
  EXPECT_TRUE(progress(*a).started);
  EXPECT_EQ(step(core), 10ms + 1ms) << "one decode step";
  EXPECT_EQ(step(core), 11ms);
  EXPECT_TRUE(a->finished());
  EXPECT_EQ(step(core), 0ms) << "idle";
  EXPECT_EQ(core.steps(), 3u);
}

TEST_F(BatchCoreTest, TimeScaleShrinksSteps) {
  BatchTiming t = timing;
  t.time_scale = 0.05;
  BatchCore core(setup(), t, BatchLimits{});
  core.enqueue(make(seq(1, 100), 1));
  EXPECT_EQ(step(core), std::chrono::duration_cast<Clock::duration>((10ms + 10ms + 1ms) * 0.05));
}

TEST_F(BatchCoreTest, ChunkedPrefillSharesTheBudgetWithDecodes) {
  BatchCore core(setup(), timing, BatchLimits{.chunked_prefill_size = 64});
  auto a = make(seq(1000, 10), 50);
  core.enqueue(a);
  step(core);  // a prefilled, now decoding
  auto b = make(seq(1, 150), 2);
  core.enqueue(b);
  EXPECT_EQ(step(core), 10ms + 64 * 100us + 2ms) << "64 tokens of b's prompt + a's decode";
  EXPECT_FALSE(progress(*b).started);
  EXPECT_EQ(step(core), 10ms + 64 * 100us + 2ms);
  EXPECT_EQ(step(core), 10ms + 22 * 100us + 2ms) << "the last chunk";
  EXPECT_TRUE(progress(*b).started);
  EXPECT_EQ(b->output_size(), 1u);
  EXPECT_EQ(a->output_size(), 4u) << "a kept decoding through b's prefill";
}

TEST_F(BatchCoreTest, CachedTokensComeFromTheRadixCache) {
  BatchCore core(setup(4), timing, BatchLimits{});
  auto prompt = seq(1, 22);
  auto a = make(prompt, 4);
  core.enqueue(a);
  step(core);
  // While a decodes, its prompt pages are already cached (SGLang's cache_unfinished_req).
  auto b = make(prompt, 1);
  core.enqueue(b);
  EXPECT_EQ(step(core), 10ms + 2 * 100us + 2ms) << "20 of 22 cached: 2 uncached tokens to prefill";
  EXPECT_EQ(progress(*b).cached_tokens, 20);
  while (!a->finished()) step(core);
  EXPECT_EQ(progress(*a).cached_tokens, 0);
  // Prompt + output of a are cached when it finishes (minus the last token, which has no KV).
  auto follow = prompt;
  std::vector<int32_t> out;
  Progress p;
  a->read(0, out, p);
  follow.insert(follow.end(), out.begin(), out.end());
  follow.push_back(7);
  auto c = make(follow, 1);
  core.enqueue(c);
  step(core);
  EXPECT_EQ(progress(*c).cached_tokens, 24) << "22 + 3 tokens with KV, page-aligned";
  RankLoad l = core.load();
  EXPECT_GT(l.cache_hit_rate, 0.5);
  EXPECT_EQ(l.used_tokens, 0) << "nothing running: cached pages are evictable, not used";
  EXPECT_GE(l.cached_tokens, 24);
}

TEST_F(BatchCoreTest, AdmissionRespectsMaxRunningAndKvRoom) {
  BatchCore core(setup(1, 100), timing, BatchLimits{.max_running_requests = 2});
  auto a = make(seq(1, 10), 5), b = make(seq(100, 10), 5), c = make(seq(200, 10), 5);
  core.enqueue(a);
  core.enqueue(b);
  core.enqueue(c);
  step(core);
  EXPECT_EQ(core.load().running, 2);
  EXPECT_EQ(core.load().waiting, 1);
  while (!a->finished()) step(core);
  step(core);
  EXPECT_TRUE(progress(*c).started) << "admitted when a slot freed";

  // KV room: 100 slots; a request needs its uncached prompt + max_new_tokens.
  BatchCore small(setup(1, 100), timing, BatchLimits{});
  auto d = make(seq(1, 40), 20), e = make(seq(300, 40), 20);
  small.enqueue(d);
  small.enqueue(e);
  step(small);
  EXPECT_EQ(small.load().running, 1) << "60 + 60 > 100: e waits";
  EXPECT_EQ(small.load().waiting, 1);
  while (!d->finished()) step(small);
  step(small);
  EXPECT_TRUE(progress(*e).started) << "d's cached pages count as room: they are evictable";
}

TEST_F(BatchCoreTest, CancelledRequestsLeaveAtTheNextStep) {
  BatchCore core(setup(), timing, BatchLimits{});
  auto a = make(seq(1, 10), 100), b = make(seq(50, 10), 100);
  core.enqueue(a);
  core.enqueue(b);
  step(core);
  EXPECT_FALSE(core.flush_cache()) << "refused while requests run";
  a->cancel();
  b->cancel();
  EXPECT_EQ(step(core), 0ms);
  EXPECT_EQ(core.load().running, 0);
  EXPECT_EQ(core.load().used_tokens, 0);
  EXPECT_GT(core.load().cached_tokens, 0) << "what was computed stays cached";
  EXPECT_TRUE(core.flush_cache());
  EXPECT_EQ(core.load().cached_tokens, 0);
}

TEST_F(BatchCoreTest, PrefillRoleTransfersThenAnswersOneToken) {
  Rooms rooms;
  RankSetup s = setup();
  s.role = PdRole::kPrefill;
  s.rooms = &rooms;
  s.transfer_fixed = 2ms;
  s.transfer_per_token = 10us;
  BatchCore core(s, timing, BatchLimits{});
  auto a = make(seq(1, 100), 1, std::nullopt, 77);
  core.enqueue(a);
  step(core);
  EXPECT_FALSE(progress(*a).started) << "held until its KV left";
  auto due = core.next_transfer();
  ASSERT_TRUE(due);
  EXPECT_EQ(*due - now, 2ms + 100 * 10us);
  core.complete_transfers(now);
  EXPECT_TRUE(rooms.ready.empty());
  core.complete_transfers(*due);
  ASSERT_EQ(rooms.ready.size(), 1u);
  EXPECT_EQ(rooms.ready[0].first, 77u);
  EXPECT_EQ(rooms.ready[0].second.prompt_tokens, 100);
  EXPECT_TRUE(a->finished());
  EXPECT_EQ(a->output_size(), 1u);
  EXPECT_FALSE(core.has_requests());
  // A cancelled transfer fails its room.
  auto b = make(seq(500, 10), 1, std::nullopt, 78);
  core.enqueue(b);
  step(core);
  b->cancel();
  step(core);
  EXPECT_EQ(rooms.failed, std::vector<uint64_t>{78});
}

TEST_F(BatchCoreTest, DecodeRoleSkipsPrefill) {
  RankSetup s = setup();
  s.role = PdRole::kDecode;
  s.caching = false;
  BatchCore core(s, timing, BatchLimits{});
  auto a = make(seq(1, 1000), 3, 600);
  core.enqueue(a);
  EXPECT_EQ(step(core), 10ms + 1ms) << "no prefill tokens: the KV arrived";
  EXPECT_EQ(progress(*a).cached_tokens, 600) << "the prefill server's hit";
  EXPECT_EQ(core.load().used_tokens, 1000);
  while (!a->finished()) step(core);
  EXPECT_EQ(core.load().used_tokens, 0);
  EXPECT_EQ(core.load().cached_tokens, 0) << "a decode server caches nothing";
}

TEST_F(BatchCoreTest, SchedulerThreadRunsRequestsToTheEnd) {
  BatchTiming t = timing;
  t.time_scale = 0.01;
  BatchScheduler sched(setup(), t, BatchLimits{});
  std::vector<std::shared_ptr<Sequence>> seqs;
  for (int i = 0; i < 20; ++i) {
    seqs.push_back(make(seq(i * 100, 50), 10));
    sched.submit(seqs.back());
  }
  auto until = Clock::now() + 10s;
  while (Clock::now() < until &&
         !std::all_of(seqs.begin(), seqs.end(), [](auto& s) { return s->finished(); })) {
    std::this_thread::sleep_for(1ms);
  }
  for (auto& s : seqs) EXPECT_TRUE(s->finished());
  EXPECT_EQ(sched.load().running, 0);
  EXPECT_TRUE(sched.flush_cache());
  sched.stop();
}

}  // namespace
}  // namespace kvgate::sim
