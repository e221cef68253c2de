// sim/sequence: see sequence.h.
#include "sim/sequence.h"

#include <algorithm>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/dispatch.hpp>

namespace kvgate::sim {

Notifier::Notifier(const Executor& ex) : ex_(ex), timer_(ex) {}

void Notifier::notify() {
  asio::dispatch(ex_, [self = shared_from_this()] { self->signal(); });
}

void Notifier::signal() {
  pending_ = true;
  timer_.cancel();
}

awaitable<void> Notifier::wait() {
  if (!pending_) {
    timer_.expires_at(Clock::time_point::max());
    co_await timer_.async_wait(asio::as_tuple(use_awaitable));
  }
  pending_ = false;
}

Sequence::Sequence(GenerationRequest request, PseudoText::Stream stream, const Tokenizer& tokenizer,
                   int dp_rank, std::shared_ptr<Notifier> notifier)
    : request_(std::move(request)),
      stream_(stream),
      tokenizer_(tokenizer),
      dp_rank_(dp_rank),
      arrival_(Clock::now()),
      notifier_(std::move(notifier)) {}

void Sequence::mark_started(int64_t cached_tokens, bool notify) {
  {
    std::lock_guard lock(mu_);
    started_ = true;
    cached_tokens_ = cached_tokens;
  }
  if (notify) notifier_->notify();
}

bool Sequence::step(bool notify) {
  const SamplingParams& sp = request_.sampling;
  std::optional<FinishReason> done;
  int32_t id = -1;
  if (sp.max_new_tokens > 0) {
    id = stream_.next();
    if (std::find(sp.stop_token_ids.begin(), sp.stop_token_ids.end(), id) !=
        sp.stop_token_ids.end()) {
      done = FinishReason{.kind = FinishReason::Kind::kStop, .matched_token = id};
    } else if (!sp.stop.empty()) {
      std::string word;
      tokenizer_.decode_token(id, word);
      std::string_view w(word);
      if (w.starts_with(' ')) w.remove_prefix(1);
      for (const auto& s : sp.stop) {
        if (s == w) {
          done = FinishReason{.kind = FinishReason::Kind::kStop, .matched_text = s};
          break;
        }
      }
    }
  }
  {
    std::lock_guard lock(mu_);
    if (finish_) return true;
    if (id >= 0) {
      output_.push_back(id);
      if (output_.size() == 1) first_token_at_ = Clock::now();
    }
    if (!done && static_cast<int64_t>(output_.size()) >= sp.max_new_tokens) {
      done = FinishReason{.kind = FinishReason::Kind::kLength,
                          .length = static_cast<int64_t>(output_.size())};
    }
    if (done) finish_locked(std::move(*done));
  }
  if (notify) notifier_->notify();
  return finished();
}

void Sequence::abort(std::string message) {
  {
    std::lock_guard lock(mu_);
    if (finish_) return;
    finish_locked(FinishReason{.kind = FinishReason::Kind::kAbort, .message = std::move(message)});
  }
  notifier_->notify();
}

void Sequence::finish_locked(FinishReason reason) {
  finish_ = std::move(reason);
  finished_at_ = Clock::now();
  if (first_token_at_ == Clock::time_point{}) first_token_at_ = finished_at_;
}

bool Sequence::finished() const {
  std::lock_guard lock(mu_);
  return finish_.has_value();
}

size_t Sequence::output_size() const {
  std::lock_guard lock(mu_);
  return output_.size();
}

void Sequence::cancel() {
  cancelled_.store(true, std::memory_order_release);
  if (cancel_hook_) cancel_hook_();
}

void Sequence::read(size_t from, std::vector<int32_t>& tokens, Progress& p) const {
  std::lock_guard lock(mu_);
  p.started = started_;
  p.cached_tokens = cached_tokens_;
  p.total_tokens = output_.size();
  if (from < output_.size()) tokens.insert(tokens.end(), output_.begin() + from, output_.end());
  p.finish = finish_;
  p.first_token_at = first_token_at_;
  p.finished_at = finished_at_;
}

}  // namespace kvgate::sim
