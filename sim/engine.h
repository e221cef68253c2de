// sim/engine: the simulated inference engine behind the HTTP layer. Owns the model stand-in
// (PseudoText), one Scheduler per DP rank (each with its own radix cache and KV event publisher),
// and the DP dispatch (routed_dp_rank, else bootstrap_room % dp_size on a PD prefill server, else
// round robin as SGLang's default controller does). The HTTP layer hands it GenerationRequests and
// reads the returned Sequences; it never sees timing, caches or ranks' internals.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sim/batch_scheduler.h"
#include "sim/fixed_delay_scheduler.h"
#include "sim/kv_events.h"
#include "sim/logprobs.h"
#include "sim/pd.h"
#include "sim/pseudo_text.h"
#include "sim/scheduler.h"
#include "sim/sim_metrics.h"
#include "sim/tokenizer.h"

namespace kvgate::sim {

struct SimConfig;

enum class SchedulerKind { kBatch, kFixed };

struct EngineConfig {
  int dp_size = 1;
  int64_t max_total_tokens = 400000;
  int64_t page_size = 1;
  uint64_t seed = 0;
  SchedulerKind scheduler = SchedulerKind::kFixed;
  double time_scale = 1.0;
  // kFixed (unscaled)
  std::chrono::nanoseconds ttft{std::chrono::milliseconds(20)};
  std::chrono::nanoseconds tpot{std::chrono::milliseconds(5)};
  // kBatch (unscaled; BatchTiming::time_scale is taken from time_scale)
  BatchTiming batch;
  BatchLimits limits;
  int64_t max_queued_requests = 0;  // 0: unlimited
  // KV events: the block hash scheme follows the wire format; vLLM groups per node, SGLang merges
  // contiguous stores (newest builds) or sends one event per page (older builds).
  kv::WireFormat event_format = kv::WireFormat::kSglang;
  bool events_per_page = false;
  // PD
  PdRole role = PdRole::kNone;
  std::chrono::nanoseconds transfer_fixed{std::chrono::milliseconds(2)};
  std::chrono::nanoseconds transfer_per_token{std::chrono::microseconds(5)};
};

// The engine configuration of validated flags.
EngineConfig engine_config(const SimConfig& c);

class Engine {
 public:
  // `sinks`: one KV event publisher per DP rank, or empty. `rooms`: the bootstrap server of a PD
  // prefill server (null otherwise). Both must outlive the engine.
  Engine(EngineConfig config, const Tokenizer& tokenizer, SimMetrics& metrics,
         std::vector<std::unique_ptr<RankEventSink>> sinks = {}, RoomListener* rooms = nullptr);
  ~Engine();

  // "" when `rank` (a request's routed_dp_rank) can be served, else the 400 message
  // (tokenizer_manager.generate_request: rank 0 is ignored with dp_size 1).
  std::string check_rank(std::optional<int64_t> rank) const;
  // "" when `n` more requests may queue (--max-queued-requests), else the 503 message.
  std::string check_queue(std::optional<int64_t> rank, size_t n) const;
  // The rank a request goes to: its routed_dp_rank; else, on a PD prefill server, its
  // bootstrap_room % dp_size (SGLang's prefill DP controller defaults to follow_bootstrap_room);
  // else the next in round robin.
  int pick_rank(std::optional<int64_t> routed, std::optional<uint64_t> room = std::nullopt);
  // meta_info.dp_rank of a request served by `rank`: -1 (null) with dp_size 1, where SGLang's
  // scheduler runs without a DP rank.
  int meta_dp_rank(int rank) const { return config_.dp_size > 1 ? rank : -1; }
  // Starts a generation on its rank; `notifier` is woken whenever it moves. The rank must have
  // passed check_rank. max_new_tokens is clipped so prompt + output fit the KV capacity (and is 1
  // on a PD prefill server, which only prefills).
  std::shared_ptr<Sequence> submit(GenerationRequest request, std::shared_ptr<Notifier> notifier);

  std::vector<RankLoad> loads() const;
  // Flushes every rank's cache, or none when any rank has requests (returns false).
  bool flush_cache();
  // Stops the schedulers' threads (running sequences are aborted). Call before the executors the
  // sequences notify are destroyed.
  void stop();

  int dp_size() const { return config_.dp_size; }
  uint64_t seed() const { return config_.seed; }
  PdRole role() const { return config_.role; }
  const EngineConfig& config() const { return config_; }
  const Tokenizer& tokenizer() const { return tokenizer_; }
  const PseudoText& model() const { return model_; }
  // The model's log-probabilities (/generate's return_logprob), seeded by --seed.
  const LogprobModel& logprob_model() const { return logprobs_; }
  RankMetrics& rank_metrics(int rank) { return metrics_.rank(rank); }
  // PD decode: the rank's prealloc and transfer queues (reported by loads()).
  DecodeQueues& decode_queues(int rank) { return *decode_queues_[static_cast<size_t>(rank)]; }

 private:
  EngineConfig config_;
  const Tokenizer& tokenizer_;
  SimMetrics& metrics_;
  PseudoText model_;
  LogprobModel logprobs_;
  std::vector<std::unique_ptr<RankEventSink>> sinks_;
  std::vector<std::unique_ptr<Scheduler>> ranks_;
  std::vector<std::unique_ptr<DecodeQueues>> decode_queues_;
  std::atomic<uint64_t> next_rank_{0};
};

}  // namespace kvgate::sim
