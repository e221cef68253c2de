// sim/batch_scheduler: see batch_scheduler.h.
#include "sim/batch_scheduler.h"

#include <algorithm>
#include <limits>

#include "sim/kv_events.h"
#include "sim/pd.h"
#include "sim/sim_metrics.h"

namespace kvgate::sim {

struct BatchCore::Req {
  enum class State { kWaiting, kPrefill, kPrebuilt, kDecode, kTransfer, kDone };

  std::shared_ptr<Sequence> seq;
  State state = State::kWaiting;
  RadixCache::Handle h;
  int64_t prompt_len = 0;
  int64_t max_new = 0;
  int64_t cached = 0;     // prompt tokens found in the cache at admission
  int64_t prefilled = 0;  // prompt tokens with KV (cached ones included)
  int64_t outputs = 0;    // tokens generated
  Clock::time_point transfer_done{};

  std::span<const int32_t> prompt() const { return seq->request().prompt; }
  // KV slots it may still allocate: the rest of its prompt and one per token to come.
  int64_t remaining() const {
    return (prompt_len - prefilled) + std::max<int64_t>(0, max_new - outputs);
  }
};

namespace {

double seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

Clock::duration scaled(std::chrono::nanoseconds d, double scale) {
  return std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double, std::nano>(static_cast<double>(d.count()) * scale));
}

}  // namespace

BatchCore::BatchCore(const RankSetup& setup, BatchTiming timing, BatchLimits limits)
    : setup_(setup), timing_(timing), limits_(limits), cache_([&] {
        RadixCacheConfig c = setup.cache;
        c.events = c.events && setup.events != nullptr && setup.caching;
        return c;
      }()) {
  // SGLang's cache records AllBlocksCleared when it is built: the first batch a rank publishes.
  cache_.record_all_cleared();
}

BatchCore::~BatchCore() = default;

void BatchCore::enqueue(std::shared_ptr<Sequence> seq) {
  auto r = std::make_unique<Req>();
  r->prompt_len = static_cast<int64_t>(seq->request().prompt.size());
  r->max_new = seq->request().sampling.max_new_tokens;
  r->seq = std::move(seq);
  waiting_.push_back(std::move(r));
}

int64_t BatchCore::reserved() const {
  int64_t sum = 0;
  for (const auto& r : running_) sum += r->remaining();
  return sum;
}

void BatchCore::fail(Req& r, std::string_view message) {
  r.seq->abort(std::string(message));
  finish(r, Clock::now(), false);
}

void BatchCore::finish(Req& r, Clock::time_point now, bool completed) {
  if (r.state == Req::State::kDone) return;
  if (r.state == Req::State::kTransfer && setup_.rooms && r.seq->request().bootstrap) {
    setup_.rooms->room_failed(r.seq->request().bootstrap->room, setup_.dp_rank,
                              "the prefill request was cancelled");
  }
  if (setup_.caching && r.h.kv_len > r.h.tree_len) {
    // Prompt + output with KV (the last generated token has none), as cache_finished_req.
    std::vector<int32_t> tokens(r.prompt().begin(), r.prompt().end());
    if (r.h.kv_len > r.prompt_len) {
      Progress p;
      r.seq->read(0, tokens, p);
    }
    cache_.release(r.h, tokens, true);
  } else {
    cache_.release(r.h, r.prompt(), setup_.caching);
  }
  if (completed && setup_.metrics) {
    setup_.metrics->requests->inc();
    setup_.metrics->e2e->observe(seconds(now - r.seq->arrival()));
  }
  r.state = Req::State::kDone;
}

void BatchCore::reap_cancelled() {
  auto cancelled = [](const std::unique_ptr<Req>& r) { return r->seq->cancelled(); };
  for (auto& r : running_) {
    if (cancelled(r)) finish(*r, Clock::now(), false);
  }
  for (auto& r : transferring_) {
    if (cancelled(r)) finish(*r, Clock::now(), false);
  }
  std::erase_if(running_, cancelled);
  std::erase_if(transferring_, cancelled);
  std::erase_if(waiting_, cancelled);
}

std::optional<Clock::duration> BatchCore::begin_step(Clock::time_point now) {
  (void)now;
  reap_cancelled();
  plan_.prefill.clear();
  plan_.decode.clear();
  int64_t budget = limits_.chunked_prefill_size > 0 ? limits_.chunked_prefill_size
                                                    : std::numeric_limits<int64_t>::max();
  int64_t prefill_tokens = 0;

  // Chunked prefills in progress go first, in admission order.
  for (auto& r : running_) {
    if (r->state != Req::State::kPrefill || budget <= 0) continue;
    int64_t c = std::min(r->prompt_len - r->prefilled, budget);
    if (!cache_.allocate(r->h, c)) {
      fail(*r, "KV cache out of memory");
      continue;
    }
    plan_.prefill.emplace_back(r.get(), c);
    budget -= c;
    prefill_tokens += c;
  }
  std::erase_if(running_, [](const auto& r) { return r->state == Req::State::kDone; });

  // Admission, first come first served: stop at the first request that does not fit.
  int64_t reserved_kv = reserved();
  for (auto& [r, c] : plan_.prefill) reserved_kv -= c;  // allocated above, counted in remaining()
  while (!waiting_.empty() && static_cast<int64_t>(running_.size() + transferring_.size()) <
                                  limits_.max_running_requests) {
    Req& r = *waiting_.front();
    if (r.seq->request().transferred_cached_tokens) {
      // PD decode: the prompt's KV arrived; it needs slots, not a prefill.
      const int64_t need = r.prompt_len + r.max_new;
      if (need > cache_.free_tokens() + cache_.evictable_tokens() - reserved_kv) break;
      if (!cache_.allocate(r.h, r.prompt_len)) break;
      r.prefilled = r.prompt_len;
      r.cached = *r.seq->request().transferred_cached_tokens;
      r.state = Req::State::kPrebuilt;
      reserved_kv += r.max_new;
    } else {
      if (budget <= 0) break;
      // SGLang matches at most prompt_len - 1 tokens (the last one must be computed for logits),
      // and no further than an explicit logprob_start_len of a return_logprob request.
      RadixCache::Handle h;
      const int64_t limit = r.seq->request().max_prefix_len();
      if (setup_.caching && limit > 0) {
        h = cache_.acquire(r.prompt().first(static_cast<size_t>(limit)), r.seq->request().ns);
      }
      const int64_t need = (r.prompt_len - h.tree_len) + r.max_new;
      if (need > cache_.free_tokens() + cache_.evictable_tokens() - reserved_kv) {
        cache_.release(h, {}, false);
        break;
      }
      r.h = h;
      r.cached = h.tree_len;
      r.prefilled = h.tree_len;
      const int64_t c = std::min(r.prompt_len - r.prefilled, budget);
      if (!cache_.allocate(r.h, c)) {
        cache_.release(r.h, {}, false);
        break;
      }
      r.state = Req::State::kPrefill;
      plan_.prefill.emplace_back(&r, c);
      budget -= c;
      prefill_tokens += c;
      reserved_kv += need - c;
      prompt_seen_ += r.prompt_len;
      cached_seen_ += r.cached;
      if (setup_.metrics) setup_.metrics->cached_tokens->inc(static_cast<uint64_t>(r.cached));
    }
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }

  // Decode: one token for every request past its prefill (KV for the token it feeds back).
  for (auto& r : running_) {
    if (r->state == Req::State::kDecode) {
      if (!cache_.allocate(r->h, 1)) {
        fail(*r, "KV cache out of memory");
        continue;
      }
      plan_.decode.push_back(r.get());
    } else if (r->state == Req::State::kPrebuilt) {
      plan_.decode.push_back(r.get());
    }
  }
  std::erase_if(running_, [](const auto& r) { return r->state == Req::State::kDone; });

  if (plan_.prefill.empty() && plan_.decode.empty()) return std::nullopt;
  ++steps_;
  const auto batch = static_cast<int64_t>(plan_.prefill.size() + plan_.decode.size());
  auto d = timing_.step_fixed + timing_.per_prefill_token * prefill_tokens +
           timing_.per_running_request * batch;
  return scaled(d, timing_.time_scale);
}

void BatchCore::emit(Req& r, Clock::time_point now) {
  const bool first = r.outputs == 0;
  const bool done = r.seq->step(false);
  woken_.push_back(r.seq);
  if (r.max_new > 0) {
    ++r.outputs;
    if (setup_.metrics) setup_.metrics->generation_tokens->inc();
  }
  if (first && setup_.metrics) setup_.metrics->ttft->observe(seconds(now - r.seq->arrival()));
  if (done) {
    finish(r, now, true);
  } else {
    r.state = Req::State::kDecode;
  }
}

void BatchCore::end_step(Clock::time_point now) {
  for (auto& [r, c] : plan_.prefill) {
    if (r->state != Req::State::kPrefill) continue;
    r->prefilled += c;
    // cache_unfinished_req: the prompt's full pages so far join the tree (and other requests can
    // match them while this one still runs).
    if (setup_.caching) cache_.commit(r->h, r->prompt());
    if (r->prefilled < r->prompt_len) continue;
    if (setup_.metrics) setup_.metrics->prompt_tokens->inc(static_cast<uint64_t>(r->prompt_len));
    if (setup_.role == PdRole::kPrefill && r->seq->request().bootstrap) {
      r->state = Req::State::kTransfer;
      r->transfer_done = now + scaled(setup_.transfer_time(r->prompt_len), timing_.time_scale);
      continue;
    }
    r->seq->mark_started(r->cached, false);
    emit(*r, now);
  }
  for (Req* r : plan_.decode) {
    if (r->state == Req::State::kPrebuilt) {
      r->seq->mark_started(r->cached, false);
      if (setup_.metrics) setup_.metrics->prompt_tokens->inc(static_cast<uint64_t>(r->prompt_len));
    }
    if (r->state == Req::State::kPrebuilt || r->state == Req::State::kDecode) emit(*r, now);
  }
  plan_.prefill.clear();
  plan_.decode.clear();
  for (auto& r : running_) {
    if (r->state == Req::State::kTransfer) transferring_.push_back(std::move(r));
  }
  std::erase_if(running_,
                [](const auto& r) { return r == nullptr || r->state == Req::State::kDone; });
  publish_events();
}

std::optional<Clock::time_point> BatchCore::next_transfer() const {
  std::optional<Clock::time_point> next;
  for (const auto& r : transferring_) {
    if (!next || r->transfer_done < *next) next = r->transfer_done;
  }
  return next;
}

void BatchCore::complete_transfers(Clock::time_point now) {
  for (auto& r : transferring_) {
    if (r->transfer_done > now || r->seq->cancelled()) continue;
    if (setup_.rooms) {
      setup_.rooms->room_ready(
          r->seq->request().bootstrap->room, setup_.dp_rank,
          RoomInfo{.prompt_tokens = r->prompt_len, .cached_tokens = r->cached});
    }
    r->seq->mark_started(r->cached, false);
    r->state = Req::State::kDecode;
    emit(*r, now);  // the prefill server's one token; max_new_tokens is 1 there
    if (r->state != Req::State::kDone) finish(*r, now, true);
  }
  std::erase_if(transferring_, [](const auto& r) { return r->state == Req::State::kDone; });
  publish_events();
}

void BatchCore::publish_events() {
  if (cache_.has_events()) {
    auto events = cache_.take_events();
    if (setup_.events) setup_.events->publish(std::move(events));
  }
  // The step's tokens become visible once its KV events are out.
  for (auto& s : woken_) s->notify();
  woken_.clear();
}

bool BatchCore::has_requests() const {
  return !waiting_.empty() || !running_.empty() || !transferring_.empty();
}

bool BatchCore::flush_cache() {
  if (has_requests()) return false;
  cache_.reset();
  publish_events();
  return true;
}

RankLoad BatchCore::load() const {
  RankLoad l;
  l.dp_rank = setup_.dp_rank;
  l.running = static_cast<int64_t>(running_.size() + transferring_.size());
  l.waiting = static_cast<int64_t>(waiting_.size());
  l.prefill_inflight = static_cast<int64_t>(transferring_.size());
  l.used_tokens = cache_.used_tokens();
  l.cached_tokens = cache_.tree_tokens();
  l.max_total_tokens = cache_.capacity();
  for (const auto& r : waiting_) {
    l.waiting_tokens += r->prompt_len;
    const int64_t limit = r->seq->request().max_prefix_len();
    const int64_t hit =
        setup_.caching && limit > 0
            ? cache_.peek_match(r->prompt().first(static_cast<size_t>(limit)), r->seq->request().ns)
            : 0;
    l.waiting_uncached_tokens += r->prompt_len - hit;
  }
  l.prefilled_tokens = prompt_seen_ - cached_seen_;
  l.cache_hit_rate =
      prompt_seen_ > 0 ? static_cast<double>(cached_seen_) / static_cast<double>(prompt_seen_) : 0;
  return l;
}

void BatchCore::abort_all(std::string_view message) {
  for (auto* list : {&running_, &transferring_}) {
    for (auto& r : *list) {
      r->seq->abort(std::string(message));
      finish(*r, Clock::now(), false);
    }
    list->clear();
  }
  for (auto& r : waiting_) r->seq->abort(std::string(message));
  waiting_.clear();
}

// ---------------------------------------------------------------- the thread

BatchScheduler::BatchScheduler(const RankSetup& setup, BatchTiming timing, BatchLimits limits)
    : core_(setup, timing, limits) {
  // The startup AllBlocksCleared goes out before anything can reach the rank (a /flush_cache
  // racing the thread's start would otherwise share its batch).
  core_.publish_events();
  thread_ = std::thread([this] { run(); });
}

BatchScheduler::~BatchScheduler() {
  stop();
}

void BatchScheduler::stop() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void BatchScheduler::submit(std::shared_ptr<Sequence> seq) {
  // A cancelled request is reaped at once, not at the next step: the scheduler may be idle until a
  // KV transfer ends, and the decode waiting for that room must hear of it now. (submit and cancel
  // both run on the request's executor.)
  seq->set_cancel_hook([this] {
    {
      std::lock_guard lock(mu_);
      new_work_ = true;
    }
    cv_.notify_one();
  });
  {
    std::lock_guard lock(mu_);
    if (stop_) {
      seq->abort("the server is shutting down");
      return;
    }
    core_.enqueue(std::move(seq));
    new_work_ = true;
  }
  cv_.notify_one();
}

RankLoad BatchScheduler::load() const {
  std::lock_guard lock(mu_);
  return core_.load();
}

int64_t BatchScheduler::waiting() const {
  std::lock_guard lock(mu_);
  return static_cast<int64_t>(core_.waiting());
}

bool BatchScheduler::flush_cache() {
  std::lock_guard lock(mu_);
  return core_.flush_cache();
}

void BatchScheduler::run() {
  std::unique_lock lock(mu_);
  core_.publish_events();
  while (!stop_) {
    new_work_ = false;
    auto now = Clock::now();
    core_.complete_transfers(now);
    auto duration = core_.begin_step(now);
    if (!duration) {
      core_.publish_events();
      auto wake = [this] { return stop_ || new_work_; };
      if (auto next = core_.next_transfer()) {
        cv_.wait_until(lock, *next, wake);
      } else {
        cv_.wait(lock, wake);
      }
      continue;
    }
    if (duration->count() > 0) {
      cv_.wait_until(lock, now + *duration, [this] { return stop_; });
      if (stop_) break;
    }
    core_.end_step(Clock::now());
  }
  core_.abort_all("the server is shutting down");
  core_.publish_events();
}

}  // namespace kvgate::sim
