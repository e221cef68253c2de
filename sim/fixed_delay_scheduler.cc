// sim/fixed_delay_scheduler: see fixed_delay_scheduler.h.
#include "sim/fixed_delay_scheduler.h"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/this_coro.hpp>

namespace kvgate::sim {
namespace {

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

FixedDelayScheduler::FixedDelayScheduler(int dp_rank, FixedDelayTiming timing,
                                         int64_t max_total_tokens, RankMetrics& metrics)
    : dp_rank_(dp_rank), timing_(timing), max_total_tokens_(max_total_tokens), metrics_(metrics) {}

void FixedDelayScheduler::submit(std::shared_ptr<Sequence> seq) {
  auto ex = seq->executor();
  asio::co_spawn(ex, run(std::move(seq)), asio::detached);
}

awaitable<void> FixedDelayScheduler::run(std::shared_ptr<Sequence> seq) {
  if (seq->cancelled()) co_return;
  asio::steady_timer timer(co_await asio::this_coro::executor);
  const auto prompt = static_cast<int64_t>(seq->request().prompt.size());
  running_.fetch_add(1, std::memory_order_relaxed);
  used_tokens_.fetch_add(prompt, std::memory_order_relaxed);
  seq->set_cancel_hook([&timer] { timer.cancel(); });
  // Runs on finish, cancel, and when the frame is destroyed at shutdown.
  struct Release {
    FixedDelayScheduler* self;
    Sequence* seq;
    ~Release() {
      seq->set_cancel_hook(nullptr);
      self->release(*seq);
    }
  } release{this, seq.get()};

  auto deadline = seq->arrival() + timing_.ttft;
  timer.expires_at(deadline);
  co_await timer.async_wait(asio::as_tuple(asio::use_awaitable));
  if (seq->cancelled()) co_return;
  seq->mark_started(0);
  metrics_.prompt_tokens->inc(static_cast<uint64_t>(prompt));
  for (;;) {
    size_t before = seq->output_size();
    bool done = seq->step();
    size_t produced = seq->output_size() - before;
    used_tokens_.fetch_add(static_cast<int64_t>(produced), std::memory_order_relaxed);
    metrics_.generation_tokens->inc(produced);
    if (before == 0) metrics_.ttft->observe(seconds_since(seq->arrival()));
    if (done) break;
    deadline += timing_.tpot;
    timer.expires_at(deadline);
    co_await timer.async_wait(asio::as_tuple(asio::use_awaitable));
    if (seq->cancelled()) co_return;
  }
  metrics_.requests->inc();
  metrics_.e2e->observe(seconds_since(seq->arrival()));
}

void FixedDelayScheduler::release(const Sequence& seq) {
  auto held = static_cast<int64_t>(seq.request().prompt.size() + seq.output_size());
  used_tokens_.fetch_sub(held, std::memory_order_relaxed);
  running_.fetch_sub(1, std::memory_order_relaxed);
}

RankLoad FixedDelayScheduler::load() const {
  RankLoad l;
  l.dp_rank = dp_rank_;
  l.running = running_.load(std::memory_order_relaxed);
  l.used_tokens = used_tokens_.load(std::memory_order_relaxed);
  l.max_total_tokens = max_total_tokens_;
  return l;
}

bool FixedDelayScheduler::flush_cache() {
  // Nothing is cached yet; SGLang still refuses while requests run.
  return running_.load(std::memory_order_relaxed) == 0;
}

}  // namespace kvgate::sim
