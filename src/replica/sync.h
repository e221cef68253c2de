// replica/sync: what several kvgate replicas share through NATS (--replica-sync nats://...), so
// that each decides as if it were the only one: no protocol of kvgate's own, only NATS subjects.
//
//   <subject>.chains   cache_aware's records (the chunk chain of each dispatched prompt, the
//                      worker, the origin time) and kv_exact's predicted pages, batched: a
//                      message leaves at most --replica-sync-batch-ms after its first record, or
//                      at 256 records. Peers apply them to the policy of the same rule name
//                      (ChainSink); the sender applied its own already.
//   <subject>.load     each replica's own load, absolute: requests in flight per worker (and
//                      kv_exact's per rank, with the prefill tokens queued there), sent when it
//                      changed (at most every --replica-load-interval-ms) and at least every
//                      second. A worker's fleet load is its own count plus the latest of each peer
//                      (Worker::peer_inflight); a peer silent for --replica-peer-timeout-ms is
//                      forgotten, so a lost message heals with the next and a dead replica books
//                      nothing.
//
// NATS down: the client reconnects forever in the background (libnats), publications wait in its
// reconnect buffer (8 MB) and go when it returns; routing meanwhile runs on what this replica
// knows (peers' loads expire), and /readiness details and kvgate_replica_sync_connected say it.
//
// Threads: libnats delivers each subscription's messages on a thread of its own; one thread of
// this class's batches records and publishes loads. The public methods are thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "metrics/metrics.h"
#include "replica/wire.h"
#include "workers/worker.h"

struct __natsConnection;
struct __natsSubscription;
struct __natsMsg;

namespace kvgate::replica {

struct SyncConfig {
  std::string url;                 // nats://host:port[,nats://...]
  std::string subject = "kvgate";  // subject prefix
  std::string name;                // this replica's name (NATS connection name, logs)
  std::chrono::milliseconds batch{5};
  size_t batch_records = 256;
  std::chrono::milliseconds load_interval{10};
  std::chrono::milliseconds load_heartbeat{1000};
  std::chrono::milliseconds peer_timeout{3000};
  // cache_aware's chunk index (prefix/chunk_index.h): chunk size (every replica must use the same;
  // records of another size are dropped) and entries kept per rule.
  size_t chunk_bytes = 0;
  size_t max_chunks = 0;
  bool operator==(const SyncConfig&) const = default;
};

// A rule's policy hears peers' records for its rule here (on a libnats thread).
using ChainSink = std::function<void(const ChainRecord&)>;

class Sync {
 public:
  Sync(SyncConfig config, metrics::Registry* registry);
  ~Sync();
  Sync(const Sync&) = delete;
  Sync& operator=(const Sync&) = delete;

  // Connects (in the background when NATS is not there yet) and starts the threads. Returns ""
  // or what is wrong with the configuration.
  std::string start();
  void stop();

  uint64_t id() const { return id_; }
  const SyncConfig& config() const { return config_; }
  bool connected() const { return connected_.load(std::memory_order_relaxed); }
  size_t peers() const;
  // Wall-clock microseconds since the epoch (what origin times are in).
  static int64_t now_us();

  // Queues a record for the next batch (at most kMaxPending wait: past that, while NATS does not
  // take them, records are dropped and counted).
  void publish(ChainRecord record);
  static constexpr size_t kMaxPending = 65536;
  // The records waiting for the next batch, taken (tests: a Sync never started keeps them).
  std::vector<ChainRecord> take_pending();
  // Peers' records of `rule` go to `sink` until remove_sink(token), which returns once no call
  // of that sink is running.
  uint64_t add_sink(const std::string& rule, ChainSink sink);
  void remove_sink(uint64_t token);

  // Workers whose load this replica publishes and whose peers' loads it adds up (each pool's,
  // counted: a worker listed by two pools is tracked until both untrack it).
  void track(const WorkerPtr& w);
  void untrack(const Worker& w);

  // kv_exact's per-rank load: `provide` appends this replica's own entries (rank >= 0: requests
  // active and prefill tokens queued per (worker key, rank)) to each load report; `hear` is told
  // the sum of the peers' latest for every (worker key, rank) whose sum changed (on a libnats
  // thread or this class's, in the order the sums were made; it must not call into Sync).
  // remove_rank_load returns once no call of either is running.
  struct RankLoad {
    int64_t active = 0;
    int64_t prefill_tokens = 0;
    bool operator==(const RankLoad&) const = default;
  };
  using RankLoadProvider = std::function<void(std::vector<LoadEntry>& out)>;
  using RankLoadSink = std::function<void(uint64_t worker, int32_t rank, RankLoad peers)>;
  uint64_t add_rank_load(RankLoadProvider provide, RankLoadSink hear);
  void remove_rank_load(uint64_t token);
  // The peers' sum for one (worker key, rank) now (a source made after the last report).
  RankLoad peer_rank_load(uint64_t worker, int32_t rank) const;

  // kv_exact's bootstrap from a warm peer (<subject>.inventory, request-reply). A policy answers
  // for its rule with `respond` (on a libnats thread): nullopt when its view of that source is not
  // complete (it began mid-stream) or it has no such source. remove_responder returns once no
  // call is running.
  struct Snapshot {
    uint64_t seq = 0;  // the last batch applied when exported
    kv::SourceExport data;
  };
  using Responder = std::function<std::optional<Snapshot>(const InventoryRequest&)>;
  uint64_t add_responder(const std::string& rule, Responder respond);
  void remove_responder(uint64_t token);
  // Asks the peers for a source (blocking, up to `timeout`): the first warm answer, whole; nullopt
  // when none is (every peer said not warm, none answered, or NATS is not there).
  std::optional<Snapshot> request_inventory(const InventoryRequest& r,
                                            std::chrono::milliseconds timeout);

  // For /readiness and /v1/stats: {"connected":..,"peers":..,...}.
  std::string status_json() const;

 private:
  static void on_message(__natsConnection*, __natsSubscription*, __natsMsg* msg, void* self);
  static void on_inventory(__natsConnection*, __natsSubscription*, __natsMsg* msg, void* self);
  static void on_disconnected(__natsConnection*, void* self);
  static void on_reconnected(__natsConnection*, void* self);
  void handle(std::string_view data);
  void apply_load(const Header& h, LoadReport report);
  void run();  // the batching / load thread
  void flush_records(std::vector<ChainRecord>& batch);
  void publish_load(bool force);
  void expire_peers();
  // Sets every tracked worker's peer sum from peers_ (load_mu_ held) for the given keys.
  void resum(const std::vector<uint64_t>& keys);
  void send(const std::string& subject, const std::string& data, std::string_view kind);

  SyncConfig config_;
  uint64_t id_;
  std::string chains_subject_, load_subject_, inventory_subject_;
  mutable std::shared_mutex responders_mu_;
  struct ResponderEntry {
    std::string rule;
    Responder respond;
  };
  std::map<uint64_t, ResponderEntry> responders_;
  uint64_t next_responder_ = 1;
  metrics::CounterFamily* bootstraps_ = nullptr;  // {result}
  __natsConnection* nc_ = nullptr;
  std::vector<__natsSubscription*> subs_;
  std::atomic<bool> connected_{false};
  Clock::time_point started_at_{};

  // Records waiting for the next batch.
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<ChainRecord> pending_;
  Clock::time_point first_pending_{};
  bool stopping_ = false;
  std::thread thread_;

  // Sinks by rule.
  mutable std::shared_mutex sinks_mu_;
  struct SinkEntry {
    std::string rule;
    ChainSink sink;
  };
  std::map<uint64_t, SinkEntry> sinks_;
  uint64_t next_sink_ = 1;

  // Load: tracked workers by key, and each peer's latest report.
  mutable std::mutex load_mu_;
  struct Tracked {
    WorkerPtr worker;
    int count = 0;
    int64_t published = -1;  // the in-flight count last published
  };
  std::unordered_map<uint64_t, Tracked> tracked_;
  struct RankKey {
    uint64_t worker;
    int32_t rank;
    bool operator==(const RankKey&) const = default;
  };
  struct RankKeyHash {
    size_t operator()(const RankKey& k) const {
      return static_cast<size_t>(k.worker ^
                                 (static_cast<uint64_t>(k.rank) * 0x9e3779b97f4a7c15ULL));
    }
  };
  struct Peer {
    Clock::time_point seen;
    uint64_t seq = 0;
    std::unordered_map<uint64_t, int64_t> inflight;  // worker key -> requests (rank -1 entries)
    std::unordered_map<RankKey, RankLoad, RankKeyHash> ranks;  // rank >= 0 entries
  };
  // The peers' sums per (worker, rank) as last told to the sinks (load_mu_).
  std::unordered_map<RankKey, RankLoad, RankKeyHash> rank_sums_;
  // Rank-load registrations (their own lock: providers run while publishing, sinks while a
  // report is applied; neither under load_mu_).
  mutable std::shared_mutex rank_mu_;
  struct RankReg {
    RankLoadProvider provide;
    RankLoadSink hear;
  };
  std::map<uint64_t, RankReg> rank_regs_;
  uint64_t next_rank_reg_ = 1;
  // The rank entries last published, to send only on a change.
  std::vector<LoadEntry> last_ranks_;
  // Sums changed by apply_load / expire_peers, told to the sinks (load_mu_ held).
  void tell_rank_sinks(const std::vector<std::pair<RankKey, RankLoad>>& changed);
  // Recomputes rank_sums_ for `keys` (load_mu_ held); appends what changed.
  void resum_ranks(const std::vector<RankKey>& keys,
                   std::vector<std::pair<RankKey, RankLoad>>& changed);
  std::unordered_map<uint64_t, Peer> peers_;
  uint64_t load_seq_ = 0;
  Clock::time_point last_load_{};

  // Metrics (null without a registry).
  metrics::Gauge* connected_gauge_ = nullptr;
  metrics::Gauge* peers_gauge_ = nullptr;
  metrics::Counter* disconnects_ = nullptr;
  metrics::CounterFamily* messages_ = nullptr;     // {direction, kind}
  metrics::CounterFamily* bytes_ = nullptr;        // {direction}
  metrics::CounterFamily* records_ = nullptr;      // {result}
  metrics::Histogram* lag_ = nullptr;              // origin age of applied records
  metrics::CounterFamily* errors_ = nullptr;       // {reason}
  metrics::GaugeFamily* peer_inflight_ = nullptr;  // {worker}, set by a collector
};

}  // namespace kvgate::replica
