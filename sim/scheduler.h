// sim/scheduler: the per-DP-rank scheduler interface and what every rank is built from. A scheduler
// decides WHEN a sequence gets its prefill and each output token (the Sequence decides WHICH token
// and when it stops), keeps the rank's load (what /get_load, /v1/loads and /metrics report), and
// owns the rank's KV cache (sim/radix_cache.h) and its KV event publishing.
// Two implementations: BatchScheduler (continuous batching with a timing model, the default) and
// FixedDelayScheduler (--ttft-ms / --tpot-ms per request, for tests that want exact delays).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>

#include "sim/radix_cache.h"
#include "sim/sequence.h"

namespace kvgate::sim {

class RankEventSink;
class RoomListener;
struct RankMetrics;

enum class PdRole { kNone, kPrefill, kDecode };

struct RankLoad {
  int dp_rank = 0;
  int64_t running = 0;        // requests in the running batch (prefill, decode or KV transfer)
  int64_t waiting = 0;        // requests queued for admission
  int64_t used_tokens = 0;    // SGLang's num_used: KV slots of running requests (pinned pages +
                              // private slots); unpinned cached pages do not count
  int64_t cached_tokens = 0;  // tokens held by the radix tree (pinned or not)
  int64_t max_total_tokens = 0;
  int64_t max_running_requests = 0;
  double cache_hit_rate = 0;  // cached / prompt tokens of admitted requests
  // SGLang's load inquirer: the waiting requests' sequence lengths (num_total_tokens = used +
  // these) and the part of them not in the cache now.
  int64_t waiting_tokens = 0;
  int64_t waiting_uncached_tokens = 0;
  int64_t prefilled_tokens = 0;  // uncached prompt tokens computed so far (cumulative)
  // PD queues (SGLang's disaggregation load section): prefill requests whose KV is leaving, decode
  // requests in the handshake with the prefill server (prealloc) and waiting for their KV
  // (transfer).
  int64_t prefill_inflight = 0;
  int64_t decode_prealloc = 0;
  int64_t decode_transfer = 0;
  int64_t total_tokens() const { return used_tokens + waiting_tokens; }
  double token_usage() const {
    return max_total_tokens > 0 ? static_cast<double>(used_tokens) / max_total_tokens : 0;
  }
};

// What a rank's scheduler is built from (the Engine fills it per rank).
struct RankSetup {
  int dp_rank = 0;
  RadixCacheConfig cache;
  bool caching = true;              // prefix caching (off on a PD decode server)
  RankEventSink* events = nullptr;  // the rank's KV event publisher (null: none)
  RankMetrics* metrics = nullptr;
  PdRole role = PdRole::kNone;
  RoomListener* rooms = nullptr;  // prefill role: where finished transfers are announced
  // PD: modelled KV transfer time of a prompt (already scaled by --time-scale).
  std::chrono::nanoseconds transfer_fixed{0};
  std::chrono::nanoseconds transfer_per_token{0};
  std::chrono::nanoseconds transfer_time(int64_t tokens) const {
    return transfer_fixed + transfer_per_token * tokens;
  }
};

class Scheduler {
 public:
  virtual ~Scheduler() = default;
  // Takes a new sequence and runs it to its end (finish or cancel). Thread-safe.
  virtual void submit(std::shared_ptr<Sequence> seq) = 0;
  // A consistent-enough snapshot of the rank's load. Thread-safe.
  virtual RankLoad load() const = 0;
  // Requests waiting for admission: what load() reports, without the rest of its work (the queue
  // limit asks it for every request). Thread-safe.
  virtual int64_t waiting() const { return load().waiting; }
  // Empties the KV cache (publishing AllBlocksCleared). Returns false (and does nothing) while
  // requests run or wait.
  virtual bool flush_cache() = 0;
  // Stops the scheduler's own thread, if any; sequences still running are aborted. Idempotent.
  virtual void stop() {}
};

}  // namespace kvgate::sim
