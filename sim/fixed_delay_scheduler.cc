// sim/fixed_delay_scheduler: see fixed_delay_scheduler.h.
#include "sim/fixed_delay_scheduler.h"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/this_coro.hpp>

#include "sim/kv_events.h"
#include "sim/pd.h"
#include "sim/sim_metrics.h"

namespace kvgate::sim {
namespace {

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

RadixCacheConfig cache_config(const RankSetup& s) {
  RadixCacheConfig c = s.cache;
  c.events = c.events && s.events != nullptr && s.caching;
  return c;
}

}  // namespace

FixedDelayScheduler::FixedDelayScheduler(const RankSetup& setup, FixedDelayTiming timing)
    : setup_(setup), timing_(timing), cache_(cache_config(setup)) {
  cache_.record_all_cleared();
  if (setup_.events) setup_.events->publish(cache_.take_events());
}

void FixedDelayScheduler::submit(std::shared_ptr<Sequence> seq) {
  auto ex = seq->executor();
  asio::co_spawn(ex, run(std::move(seq)), asio::detached);
}

RadixCache::Handle FixedDelayScheduler::admit(const Sequence& seq) {
  std::lock_guard lock(mu_);
  running_.fetch_add(1, std::memory_order_relaxed);  // under mu_: flush_cache checks it there
  const auto& prompt = seq.request().prompt;
  const auto n = static_cast<int64_t>(prompt.size());
  RadixCache::Handle h;
  if (seq.request().transferred_cached_tokens) {
    // PD decode: the prompt's KV arrived from the prefill server.
  } else if (const int64_t limit = seq.request().max_prefix_len(); setup_.caching && limit > 0) {
    // At most prompt_len - 1 tokens (and no further than return_logprob's logprob_start_len).
    h = cache_.acquire(std::span<const int32_t>(prompt).first(static_cast<size_t>(limit)),
                       seq.request().ns);
  }
  // No admission control here: when even eviction leaves no room the slots are not counted.
  cache_.allocate(h, n - h.tree_len);
  if (!seq.request().transferred_cached_tokens) {
    prompt_seen_ += n;
    cached_seen_ += h.tree_len;
    if (setup_.metrics) setup_.metrics->cached_tokens->inc(static_cast<uint64_t>(h.tree_len));
  }
  if (setup_.events) setup_.events->publish(cache_.take_events());
  return h;
}

void FixedDelayScheduler::prefilled(RadixCache::Handle& h, const Sequence& seq) {
  std::lock_guard lock(mu_);
  if (setup_.caching) cache_.commit(h, seq.request().prompt);
  if (setup_.events) setup_.events->publish(cache_.take_events());
}

void FixedDelayScheduler::grow(RadixCache::Handle& h) {
  std::lock_guard lock(mu_);
  cache_.allocate(h, 1);
}

void FixedDelayScheduler::release(RadixCache::Handle& h, const Sequence& seq, bool computed) {
  std::vector<int32_t> tokens(seq.request().prompt);
  Progress p;
  seq.read(0, tokens, p);
  std::lock_guard lock(mu_);
  // KV allocated for a prefill that never ran (cancelled during the TTFT) is not cached.
  cache_.release(h, tokens, setup_.caching && computed);
  if (setup_.events) setup_.events->publish(cache_.take_events());
  running_.fetch_sub(1, std::memory_order_relaxed);
}

awaitable<void> FixedDelayScheduler::run(std::shared_ptr<Sequence> seq) {
  if (seq->cancelled()) co_return;
  Timer timer(co_await asio::this_coro::executor);
  const auto prompt = static_cast<int64_t>(seq->request().prompt.size());
  const auto& transferred = seq->request().transferred_cached_tokens;
  RadixCache::Handle handle = admit(*seq);
  const int64_t cached = transferred ? *transferred : handle.tree_len;
  seq->set_cancel_hook([&timer] { timer.cancel(); });
  // Runs on finish, cancel, and when the frame is destroyed at shutdown.
  struct Release {
    FixedDelayScheduler* self;
    Sequence* seq;
    RadixCache::Handle* handle;
    bool prefilled = false;
    bool released = false;
    void release_now() {
      if (released) return;
      released = true;
      self->release(*handle, *seq, prefilled);
    }
    ~Release() {
      seq->set_cancel_hook(nullptr);
      release_now();
    }
  } release{this, seq.get(), &handle};

  // Prefill (none on a PD decode server: the KV arrived with the request).
  auto deadline = seq->arrival() + (transferred ? Clock::duration{} : timing_.ttft);
  timer.expires_at(deadline);
  co_await timer.async_wait(asio::as_tuple(use_awaitable));
  if (seq->cancelled()) co_return;
  prefilled(handle, *seq);
  release.prefilled = true;
  if (setup_.role == PdRole::kPrefill && seq->request().bootstrap) {
    // The KV leaves for the decode server before the prefill request answers.
    timer.expires_after(setup_.transfer_time(prompt));
    co_await timer.async_wait(asio::as_tuple(use_awaitable));
    if (seq->cancelled()) {
      if (setup_.rooms) {
        setup_.rooms->room_failed(seq->request().bootstrap->room, setup_.dp_rank,
                                  "the prefill request was cancelled");
      }
      co_return;
    }
    if (setup_.rooms) {
      setup_.rooms->room_ready(seq->request().bootstrap->room, setup_.dp_rank,
                               RoomInfo{.prompt_tokens = prompt, .cached_tokens = cached});
    }
    deadline = Clock::now();
  }
  seq->mark_started(cached);
  if (setup_.metrics) setup_.metrics->prompt_tokens->inc(static_cast<uint64_t>(prompt));
  for (bool first = true;; first = false) {
    if (!first) grow(handle);
    size_t before = seq->output_size();
    bool done = seq->step(false);
    size_t produced = seq->output_size() - before;
    if (setup_.metrics) {
      setup_.metrics->generation_tokens->inc(produced);
      if (before == 0) setup_.metrics->ttft->observe(seconds_since(seq->arrival()));
    }
    if (done) {
      // Prompt + output join the cache (and their KV events go out) before the answer does.
      release.release_now();
      seq->notify();
      break;
    }
    seq->notify();
    deadline += timing_.tpot;
    timer.expires_at(deadline);
    co_await timer.async_wait(asio::as_tuple(use_awaitable));
    if (seq->cancelled()) co_return;
  }
  if (setup_.metrics) {
    setup_.metrics->requests->inc();
    setup_.metrics->e2e->observe(seconds_since(seq->arrival()));
  }
}

RankLoad FixedDelayScheduler::load() const {
  RankLoad l;
  l.dp_rank = setup_.dp_rank;
  l.running = running_.load(std::memory_order_relaxed);
  std::lock_guard lock(mu_);
  l.used_tokens = cache_.used_tokens();
  l.cached_tokens = cache_.tree_tokens();
  l.max_total_tokens = cache_.capacity();
  l.prefilled_tokens = prompt_seen_ - cached_seen_;
  l.cache_hit_rate =
      prompt_seen_ > 0 ? static_cast<double>(cached_seen_) / static_cast<double>(prompt_seen_) : 0;
  return l;
}

bool FixedDelayScheduler::flush_cache() {
  std::lock_guard lock(mu_);
  // SGLang refuses while requests run.
  if (running_.load(std::memory_order_relaxed) != 0) return false;
  cache_.reset();
  if (setup_.events) setup_.events->publish(cache_.take_events());
  return true;
}

}  // namespace kvgate::sim
