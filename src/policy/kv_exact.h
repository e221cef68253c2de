// policy/kv_exact: routing on what the engines really cache. The pool's endpoints publish their
// KV events over ZeroMQ (one publisher per DP rank); a kv::Subscriber of the policy's own follows
// every (endpoint, rank) and a kv::Inventory holds what each one stores, keyed by kvgate's chained
// block keys. A request's tokens (rendered and tokenized as the engine does) are keyed the same
// way and matched; the (endpoint, rank) with the lowest cost wins:
//   cost = tokens it would prefill for this request (those not cached there)
//        + prefill tokens already dispatched there and not finished
//        + load_tokens x requests active there
// Ties go to the less loaded, then to a hash of the request and the source (deterministic: two
// gateways with the same inventory choose the same). No page matched anywhere, a request without
// tokens, or no source ready (its subscriber connected for kvWarmupSec, or holding blocks): the
// fallback policy chooses (the rule's sel), and the branch says why (kv_exact_miss,
// kv_exact_not_ready, kv_exact_no_tokens, kv_exact_lora), never silently.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "kv/block_hash.h"
#include "kv/inventory.h"
#include "kv/subscriber.h"
#include "metrics/metrics.h"
#include "policy/kv_parity.h"
#include "policy/policy.h"
#include "replica/sync.h"
#include "util/shared_snapshot.h"

namespace kvgate {

namespace http {
struct FetchResult;
}  // namespace http

struct PolicyConfig;

class KvExactPolicy final : public Policy, private kv::EventSink {
 public:
  // A prediction record (another replica's, or one of this replica's heard again: a replay), as
  // the --replica-sync sink hands it: applied once however often it is heard.
  void apply_peer(const replica::ChainRecord& r);
  // `fallback` decides misses; it hears on_dispatched/on_completed for its own decisions only.
  KvExactPolicy(const PolicyConfig& config, std::unique_ptr<Policy> fallback);
  ~KvExactPolicy() override;

  std::string_view name() const override { return "kv_exact"; }
  Decision select(std::span<Worker* const> available, RouteContext& ctx) override;
  void on_dispatched(const Decision& d, RouteContext& ctx) override;
  void on_completed(const Decision& d, RouteContext& ctx, const Outcome& o) override;
  void on_first_token(const Decision& d, RouteContext& ctx) override;
  void on_workers_changed(const WorkerSet& set) override;
  ParseOptions parse_options() const override;
  bool uses_reported_load() const override { return fallback_->uses_reported_load(); }
  bool wants_kv_events() const override { return true; }
  bool wants_usage() const override { return true; }
  std::chrono::milliseconds period() const override { return std::chrono::seconds(1); }
  void on_period() override;
  void start() override;
  void stop() override;
  void attach(const PolicyRuntime& runtime) override;
  std::string readiness_details() const override;

  // Tokenizer parity (see kv_parity.h): every (endpoint, rank) is probed once its subscriber is
  // connected, again after its engine restarts, and when this asks (the admin API).
  void request_parity_probes() const;
  struct Parity {
    std::string state;  // untested, pending, match, mismatch, not_found, error, skipped
    std::string detail;
    uint64_t probes_done = 0;  // results so far: a newer one answers a request made after it
  };
  Parity parity(kv::SourceId id) const;
  // Per (endpoint, rank) routing counts for the inventory view.
  struct SourceCounts {
    uint64_t hits = 0;              // requests kv_exact routed there
    uint64_t predicted_tokens = 0;  // what it expected cached there (with a reported count)
    uint64_t cached_tokens = 0;     // what the engine reported cached
    bool page_size_mismatch = false;
    int64_t engine_block_size = 0;  // the size its events carried, when it was not the rule's
    uint64_t map_batches = 0;       // its event batches that came as maps (vLLM's shape)
    uint64_t hash_checked = 0;      // engine block ids recomputed from their tokens (hasher)
    uint64_t hash_mismatched = 0;   // of those, ids that were not what kvHashAlgo gives
    int64_t active = 0;             // requests dispatched there, not completed
    int64_t pending_prefill = 0;    // their uncached prompt tokens, until their first event
    int64_t peer_active = 0;        // the same two as the other replicas last reported them
    int64_t peer_pending = 0;
  };
  SourceCounts counts(kv::SourceId id) const;

  // The leading full pages of `ids` (kvgate's keys) each (endpoint, rank) holds on its GPU.
  std::vector<std::pair<kv::SourceId, size_t>> held_pages(std::span<const int32_t> ids) const;
  int64_t page_size() const { return page_size_; }
  // For tests and the inventory view.
  const kv::Inventory& inventory() const { return inventory_; }
  std::vector<std::pair<kv::SourceSpec, kv::SourceStatus>> sources() const {
    return subscriber_.status();
  }
  bool ready(kv::SourceId s) const;

 private:
  struct Source;  // per (endpoint, rank): load counters, readiness
  struct Sources;
  struct ProbePoll;  // a parity probe waiting for its events (control thread)
  void on_batch(kv::SourceId source, uint64_t seq, const kv::EventBatch& batch) override;
  void on_reset(kv::SourceId source, kv::ResetReason why) override;
  // Replica bootstrap: a beginning source filled from a warm peer's inventory (subscriber
  // thread), and this replica's answer to a peer asking for one of its sources.
  std::optional<uint64_t> seed(kv::SourceId id) override;
  std::optional<replica::Sync::Snapshot> snapshot_for_peer(
      const replica::InventoryRequest& req) const;
  // Returns {checked, mismatched} block ids.
  std::pair<uint64_t, uint64_t> check_hashes(kv::SourceId source, const kv::EventBatch& batch);
  // The keys of the request's full pages (cached in the context: select, dispatch, completion
  // and retries key them once).
  const std::vector<kv::BlockKey>& request_keys(RouteContext& ctx) const;
  // The zero-hit watchdog's count of one lookup that matched nothing.
  void count_zero_hit();
  // `counted`: the misses counter of `why` (null without metrics).
  Decision fall_back(std::span<Worker* const> available, RouteContext& ctx, std::string_view why,
                     metrics::Counter* counted, const Sources& sources);
  // Rebuilds the sources of `workers_` (from each worker's /server_info kv_events when known,
  // else the rule's kvZmqPort and kvDpRankCount) and hands them to the subscriber. Needs
  // change_mu_ held.
  void rebuild_sources();
  // Tokenizer parity probes, from on_period (control thread).
  void launch_probes(const std::unordered_map<kv::SourceId, kv::SourceStatus>& status);
  void finish_probe(Source& s, const kv_parity::Probe& probe, size_t matched_pages,
                    const std::string& error);
  size_t probe_matched_pages(const Source& s, const kv_parity::Probe& probe) const;
  void capture_probe_stores(Source& s, const kv::EventBatch& batch);
  struct Life;
  void probe_answered(const std::shared_ptr<Source>& source,
                      const std::shared_ptr<const kv_parity::Probe>& probe,
                      const http::FetchResult& r, const std::shared_ptr<Life>& life,
                      boost::asio::io_context& control);

  std::string rule_;
  int64_t page_size_;
  int64_t dp_ranks_;
  int64_t zmq_port_;
  std::map<std::string, int64_t, std::less<>> endpoint_ports_;  // url -> its rank-0 port
  std::chrono::seconds warmup_;
  double load_tokens_;
  std::unique_ptr<Policy> fallback_;
  // Predict on route: the pages of each dispatched request, as held by its (endpoint, rank)
  // until they expire (the engine's events then say the truth). Last dispatch wins a page.
  struct Prediction {
    kv::SourceId source = 0;
    int64_t origin_us = 0;   // the dispatch that made it (unix microseconds, its replica's clock)
    int64_t expires_us = 0;  // origin + kvPredictTtlMs
    // Dispatches to `source` that rely on it, by origin: one that never ran withdraws only its
    // own share (a sibling sent there on the prediction is still prefilling those pages). A set,
    // not a count, so that one dispatch heard twice (applied while NATS was away, then echoed;
    // a history replay) holds once. Past kMaxHolders the prediction stays until it expires.
    static constexpr size_t kMaxHolders = 8;
    std::array<int64_t, kMaxHolders> holders{};
    uint8_t held = 0;
    bool overflow = false;
    bool holds(int64_t origin) const {
      return std::find(holders.begin(), holders.begin() + held, origin) != holders.begin() + held;
    }
    void hold(int64_t origin) {
      if (holds(origin)) return;
      if (held < kMaxHolders) {
        holders[held++] = origin;
      } else {
        overflow = true;
      }
    }
    // Whether nothing relies on it any more.
    bool release(int64_t origin) {
      auto end = holders.begin() + held;
      auto at = std::find(holders.begin(), end, origin);
      if (at != end) {
        *at = *(end - 1);
        --held;
      }
      return held == 0 && !overflow;
    }
  };
  static Prediction make_prediction(kv::SourceId source, int64_t origin_us, int64_t expires_us) {
    Prediction p{.source = source, .origin_us = origin_us, .expires_us = expires_us};
    p.hold(origin_us);
    return p;
  }
  static constexpr size_t kMaxPredicted = 1 << 16;
  static constexpr size_t kMaxPredictedPerRequest = 1024;
  // Applies one dispatch's predicted pages (or, `retract`, withdraws its share), this replica's
  // or a peer's: the same result in any order of arrival (the earliest dispatch wins a page).
  void predict(std::span<const kv::BlockKey> keys, const Source& s, int64_t origin_us,
               bool retract);
  std::chrono::milliseconds predict_ttl_;
  // With replicas: how long after its origin a prediction counts (Sync::settle(): every replica
  // has heard it by then, and its load reports count from then too); 0 alone.
  int64_t settle_us_ = 0;
  // The origin of a dispatch (Decision::origin_us): unique on this replica.
  int64_t next_origin();
  std::atomic<int64_t> last_origin_{0};
  bool parity_probe_;
  mutable std::mutex predict_mu_;
  std::unordered_map<kv::BlockKey, Prediction> predicted_;
  kv::Inventory inventory_;
  kv::Subscriber subscriber_;
  SharedSnapshot<const Sources> sources_;
  std::mutex change_mu_;  // on_workers_changed / on_period (control thread) vs start/stop
  std::map<std::pair<uint64_t, int>, kv::SourceId> ids_;  // (worker id, rank) -> source
  std::vector<WorkerPtr> workers_;                        // the pool's, as last told
  // The kv_events each worker's sources were built from (to rebuild when one changes).
  std::map<uint64_t, std::optional<KvEventsInfo>> built_from_;
  std::set<std::string> warned_;  // one warning per (worker, kind) of discovery mismatch
  struct RetiredSeries {
    std::string url;
    int rank = 0;
    std::chrono::steady_clock::time_point due;
  };
  static constexpr std::chrono::seconds kSeriesGrace{60};
  std::vector<RetiredSeries> retired_series_;  // change_mu_
  kv::SourceId next_id_ = 1;
  int starts_ = 0;
  // Replica sync (--replica-sync; null: alone): fleet loads per rank and predictions shared.
  replica::Sync* replica_ = nullptr;
  uint64_t rank_token_ = 0, chain_token_ = 0, responder_token_ = 0;
  std::chrono::steady_clock::time_point
      next_fallback_period_{};  // control thread only  // start/stop are balanced per pool; a kept
                                // policy serves two pools a moment

  // Metrics (null without a registry).
  metrics::Counter* hits_ = nullptr;
  metrics::Counter* miss_ = nullptr;  // kvgate_kv_exact_misses_total by reason
  metrics::Counter* miss_not_ready_ = nullptr;
  metrics::Counter* miss_no_tokens_ = nullptr;
  metrics::Counter* miss_lora_ = nullptr;
  metrics::CounterFamily* events_ = nullptr;
  metrics::GaugeFamily* connected_ = nullptr;
  metrics::GaugeFamily* blocks_ = nullptr;
  metrics::CounterFamily* resets_ = nullptr;
  metrics::Counter* orphans_ = nullptr;
  metrics::Counter* page_size_mismatches_ = nullptr;
  metrics::Counter* miss_unrendered_ = nullptr;
  // Ground truth per (endpoint, rank): what kv_exact expected cached there vs what the engine
  // reported (counted together, for requests whose worker reported cached_tokens).
  metrics::CounterFamily* predicted_tokens_ = nullptr;
  metrics::CounterFamily* cached_tokens_ = nullptr;
  // Routing overhead by stage: render, tokenize (the request's parse), keys, match, select.
  metrics::Histogram* t_render_ = nullptr;
  metrics::Histogram* t_tokenize_ = nullptr;
  metrics::Histogram* t_keys_ = nullptr;
  metrics::Histogram* t_match_ = nullptr;
  metrics::Histogram* t_select_ = nullptr;
  metrics::Counter* watchdog_ = nullptr;
  metrics::Counter* hash_checked_ = nullptr;
  metrics::Counter* hash_mismatches_ = nullptr;
  // Hash parity: the engine's ids recomputed from the tokens of root events (parent nil).
  std::unique_ptr<kv::BlockHasher> hasher_;
  std::atomic<bool> hash_warned_{false};
  metrics::GaugeFamily* excluded_ = nullptr;
  // Zero-hit watchdog: lookups in a row that matched nothing while the inventory held blocks.
  std::atomic<int64_t> zero_hits_{0};
  // Some source has been ready (set before its flag): false means none is, so a request matching
  // nothing needs no look at the sources to know kv_exact is not ready.
  std::atomic<bool> any_ready_{false};
  // Parity probes: the pool's runtime, and a lifeline the probes' coroutines check (under its
  // lock) before touching the policy after each wait.
  PolicyRuntime runtime_;
  struct Life {
    std::mutex mu;
    bool alive = true;
  };
  std::shared_ptr<Life> life_ = std::make_shared<Life>();
  int probes_running_ = 0;                    // control thread
  std::atomic<bool> probes_possible_{false};  // probes on, with a tokenizer and chat template
  std::atomic<bool> lora_names_seen_{false};  // an event named an adapter (lora_name)
  uint64_t probe_nonce_ = 0;
  metrics::GaugeFamily* parity_ = nullptr;
  metrics::GaugeFamily* bootstrap_ = nullptr;
  metrics::Counter* parity_mismatches_ = nullptr;
};

}  // namespace kvgate
