// sim/sequence: one generation inside the engine, shared by the scheduler that advances it (the
// producer, on any thread) and the HTTP request coroutine that reads it (the consumer, on its own
// executor). Owns the request's prompt and sampling limits, the output tokens so far, the finish
// reason, and the wake-up of the consumer (Notifier). Stop conditions are applied here, so every
// scheduler (the fixed-delay one now, continuous batching later) shares them.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "http/io.h"
#include "sim/logprobs.h"
#include "sim/pseudo_text.h"
#include "sim/radix_cache.h"

namespace kvgate::sim {

struct SamplingParams {
  int64_t max_new_tokens = 128;
  // A stop string matches one generated word (its text without the leading space).
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
};

// Prefill/decode disaggregation fields of a request (SGLang's bootstrap_host/port/room).
struct Bootstrap {
  std::string host;
  int64_t port = 0;
  uint64_t room = 0;
};

struct GenerationRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  std::string rid;
  std::optional<int64_t> routed_dp_rank;
  CacheNamespace ns;  // cache_salt and LoRA adapter: the request's prefix namespace
  std::optional<Bootstrap> bootstrap;
  // Decode side of PD: the prompt's KV arrived from the prefill server, which found this many
  // tokens in its cache (reported as this request's cached_tokens). The scheduler skips prefill.
  std::optional<int64_t> transferred_cached_tokens;
  LogprobParams logprob;  // /generate's return_logprob and its options

  // How much of the prompt a cache match may cover (SGLang's Req._compute_max_prefix_len): at
  // most prompt_len - 1 tokens, the last one being computed for its logits; with return_logprob
  // and an explicit logprob_start_len, at most that many, as the prompt rows from there on need
  // their logits computed.
  int64_t max_prefix_len() const {
    int64_t n = static_cast<int64_t>(prompt.size()) - 1;
    if (logprob.return_logprob && logprob.start_len >= 0) n = std::min(n, logprob.start_len);
    return std::max<int64_t>(n, 0);
  }
};

struct FinishReason {
  enum class Kind { kLength, kStop, kAbort };
  Kind kind = Kind::kLength;
  int64_t length = 0;          // kLength: tokens generated
  std::string matched_text;    // kStop by a stop string
  int32_t matched_token = -1;  // kStop by a token id
  std::string message;         // kAbort
  int status_code = 0;         // kAbort: the HTTP status SGLang's abort carries (0: none)
  std::string err_type;        // kAbort: FINISH_ABORT's err_type ("": null)
  // The last output token is the matched stop and is not part of the visible text.
  bool hides_last_token() const { return kind == Kind::kStop; }
};

// Wakes one request coroutine when any of its sequences moved. notify() is thread-safe; wait()
// runs on the consumer's executor and returns at once when notified since the last wait.
class Notifier : public std::enable_shared_from_this<Notifier> {
 public:
  explicit Notifier(const Executor& ex);
  void notify();
  awaitable<void> wait();
  const Executor& executor() const { return ex_; }

 private:
  void signal();
  Executor ex_;
  Timer timer_;
  bool pending_ = false;  // consumer executor only
};

// What the consumer reads: tokens [from, end) are appended to `tokens`.
struct Progress {
  bool started = false;  // prefill done
  int64_t cached_tokens = 0;
  size_t total_tokens = 0;
  std::optional<FinishReason> finish;
  Clock::time_point first_token_at{};
  Clock::time_point finished_at{};
};

class Sequence {
 public:
  Sequence(GenerationRequest request, PseudoText::Stream stream, const Tokenizer& tokenizer,
           int dp_rank, std::shared_ptr<Notifier> notifier);

  const GenerationRequest& request() const { return request_; }
  int dp_rank() const { return dp_rank_; }
  Clock::time_point arrival() const { return arrival_; }
  const Executor& executor() const { return notifier_->executor(); }

  // --- producer side (the scheduler; any thread) ---
  // Prefill is done: `cached_tokens` of the prompt were found in the cache. With notify = false
  // the consumer is woken later by notify() (a scheduler publishes the step's KV events first).
  void mark_started(int64_t cached_tokens, bool notify = true);
  // Decodes one token and applies the stop conditions. Returns true when the sequence finished
  // (including max_new_tokens == 0, which finishes without a token).
  bool step(bool notify = true);
  // Wakes the consumer.
  void notify() { notifier_->notify(); }
  // Ends the sequence with an abort finish reason (e.g. the engine is shutting down).
  void abort(std::string message);
  bool finished() const;
  size_t output_size() const;

  // --- consumer side (the request's executor) ---
  // The client went away: the scheduler must stop advancing this sequence.
  void cancel();
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }
  // A scheduler running on the consumer's executor may register how to stop its own timer.
  void set_cancel_hook(std::function<void()> hook) { cancel_hook_ = std::move(hook); }
  // Appends tokens from index `from` to `tokens` and fills `p`.
  void read(size_t from, std::vector<int32_t>& tokens, Progress& p) const;

 private:
  void finish_locked(FinishReason reason);

  const GenerationRequest request_;
  PseudoText::Stream stream_;  // producer only
  const Tokenizer& tokenizer_;
  const int dp_rank_;
  const Clock::time_point arrival_;
  std::shared_ptr<Notifier> notifier_;
  std::function<void()> cancel_hook_;
  std::atomic<bool> cancelled_{false};

  mutable std::mutex mu_;
  bool started_ = false;
  int64_t cached_tokens_ = 0;
  std::vector<int32_t> output_;
  std::optional<FinishReason> finish_;
  Clock::time_point first_token_at_{};
  Clock::time_point finished_at_{};
};

}  // namespace kvgate::sim
