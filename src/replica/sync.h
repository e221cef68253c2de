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
//                      (Worker::peer_inflight; cache_aware weighs Worker::shared_inflight: its own
//                      as echoed, each counting from the report's sending + settle()); a peer
//                      silent for --replica-peer-timeout-ms is forgotten, so a lost message heals
//                      with the next and a dead replica books nothing.
//
// History (a NATS server with JetStream, `nats-server -js`; SyncConfig::history > 0): on every
// (re)connection the history thread makes sure a memory stream (stream_name(): KVGATE_<PREFIX>)
// captures <subject>.chains for `history` (cache_aware's TTL, --eviction-interval) and at most
// --replica-sync-history-bytes. Publishing stays core NATS (the stream captures it; nothing
// waits for acks). A new or restarted replica replays it, so it routes follow-ups of
// conversations its peers served before it came; a reconnected one replays what it missed.
// Replays: an ephemeral ordered consumer from a start time (or the beginning), each message fed
// to handle() as the live subscription's are, up to the stream's last message when the replay
// began (later ones arrive live) or SyncConfig::replay_timeout; own records are given too (a
// policy built since a rule changed has none of them; a record applied twice changes nothing).
// The trigger is per sink: a sink (a rule's policy, added after start(): pools start after
// Sync) is owed the whole history when added, and every sink is owed what was sent since the
// connection was lost (minus kReplayMargin) when it returns. The history thread pays what is owed
// once connected and the stream is ensured, one replay for all sinks owed at that moment (from
// the earliest start any of them is owed), each record delivered only to those sinks. Records
// are idempotent (prefix/chunk_index.h), so overlap with the live subscription, or a sink given
// more than it was owed, is harmless. Without JetStream (or with its API failing) the replicas
// run on core NATS exactly as before: logged once at info, counted (replays "unavailable").
//
// NATS down: the client reconnects forever in the background (libnats). Records wait in this
// class's queue (kMaxPending; past it dropped and counted) and leave after the reconnection once
// the stream is ensured, so they reach the history too (a memory stream is new after a NATS
// restart) and a peer that reconnects after them still replays them; load reports wait in
// libnats's reconnect buffer (8 MB). Routing meanwhile runs on what this replica knows (peers'
// loads expire), and /readiness details and kvgate_replica_sync_connected say it.
//
// Threads: libnats delivers each subscription's messages on a thread of its own; one thread of
// this class's batches records and publishes loads; one (with history) ensures the stream and
// replays. The public methods are thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <queue>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "metrics/metrics.h"
#include "replica/wire.h"
#include "workers/worker.h"

// libnats's own struct tags (natsConnection and the others are typedefs of them).
struct __natsConnection;    // NOLINT(bugprone-reserved-identifier)
struct __natsSubscription;  // NOLINT(bugprone-reserved-identifier)
struct __natsMsg;           // NOLINT(bugprone-reserved-identifier)

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
  // JetStream history: the stream's MaxAge (0: no history, core NATS only) and MaxBytes (0: no
  // history), and how long one replay may take.
  std::chrono::seconds history{0};
  int64_t history_bytes = 64 << 20;
  std::chrono::milliseconds replay_timeout{5000};
  bool operator==(const SyncConfig&) const = default;
};

// `urls` (a --replica-sync list) with any user:password@ shown as ***@ (logs, /readiness,
// /v1/config).
std::string redact_url(std::string_view urls);

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

  // The JetStream stream of a subject prefix: "KVGATE_" and the prefix upper-cased, any character
  // but letters, digits, '-' and '_' as '_' (a stream name may not hold '.', '*', '>', spaces or
  // slashes). When the prefix holds anything but lower-case letters, digits, '-' and '_', or is
  // long (cut at 48 characters), 8 hex digits of its hash follow: two prefixes never share one.
  static std::string stream_name(std::string_view subject_prefix);
  // A reconnection's replay starts this long before the connection was lost (clock skew between
  // this host and NATS, messages in flight then).
  static constexpr std::chrono::seconds kReplayMargin{10};
  // How long after its origin a change of the fleet's shared state counts, on every replica
  // alike: load reports (own, echoed by NATS, and peers'), kv_exact's predictions. The batch
  // interval (a record may wait that long to leave) and kSettleMargin (NATS's delivery, a
  // scheduling delay; the replicas' clocks must agree within it: NTP).
  static constexpr std::chrono::milliseconds kSettleMargin{2};
  std::chrono::milliseconds settle() const { return config_.batch + kSettleMargin; }

  uint64_t id() const { return id_; }
  const SyncConfig& config() const { return config_; }
  bool connected() const { return connected_.load(std::memory_order_relaxed); }
  // Connected, and a load report of this replica came back since it connected: the own figures
  // told to add_rank_load's hear_own are what the peers weigh now.
  bool own_view() const { return connected() && own_fresh_.load(std::memory_order_relaxed); }
  // The history stream is there for this connection.
  bool history() const { return history_ok_.load(std::memory_order_relaxed); }
  size_t peers() const;
  // Wall-clock microseconds since the epoch (what origin times are in).
  static int64_t now_us();

  // Queues a record for the next batch (at most kMaxPending wait: past that, while NATS does not
  // take them, records are dropped and counted).
  void publish(ChainRecord record);
  static constexpr size_t kMaxPending = 65536;
  // Bounds on what peers' load reports may add: replicas heard from, and requests in flight one
  // peer (or all of them together) may book on a worker.
  static constexpr size_t kMaxPeers = 1024;
  static constexpr int64_t kMaxPeerLoad = 100000;
  // Load entries (per worker, per rank) of every peer together.
  static constexpr size_t kMaxPeerEntries = size_t{1} << 20;
  // A record whose origin is further ahead of this replica's clock is dropped (and counted).
  static constexpr int64_t kMaxOriginAheadUs = int64_t{60} * 1000000;
  // The records waiting for the next batch, taken (tests: a Sync never started keeps them).
  std::vector<ChainRecord> take_pending();
  // Peers' records of `rule` go to `sink` until remove_sink(token), which returns once no call
  // of that sink is running. With history, the sink is also given the stream's records (on the
  // history thread, soon after; see the header comment).
  uint64_t add_sink(const std::string& rule, ChainSink sink);
  void remove_sink(uint64_t token);

  // Workers whose load this replica publishes and whose peers' loads it adds up (each pool's,
  // counted: a worker listed by two pools is tracked until both untrack it).
  void track(const WorkerPtr& w);
  void untrack(const Worker& w);

  // kv_exact's per-rank load: `provide` appends this replica's own entries (rank >= 0: requests
  // active and prefill tokens queued per (worker key, rank)) to each load report; `hear` is told
  // the sum of the peers' latest for every (worker key, rank) whose sum changed (on a libnats
  // thread, this class's, or the registry's watcher (set_registered), in the order the sums were
  // made; it must not call into Sync).
  // `hear_own` (optional) is told this replica's own entries as NATS echoes its report, at the
  // moment it counts on the peers (sent + settle()), for every (worker key, rank) whose figures
  // changed (zero for one no longer reported), so every replica weighs the same figures for this
  // one (own_view() says when they are current). Reports count at sent + settle() for `hear` as
  // well. The first report after a registration leaves at once. remove_rank_load returns once
  // no call of any is running.
  struct RankLoad {
    int64_t active = 0;
    int64_t prefill_tokens = 0;
    bool operator==(const RankLoad&) const = default;
  };
  using RankLoadProvider = std::function<void(std::vector<LoadEntry>& out)>;
  // `from_us`: the moment the figures count from (a report's sending + settle(), unix us).
  using RankLoadSink =
      std::function<void(uint64_t worker, int32_t rank, RankLoad load, int64_t from_us)>;
  uint64_t add_rank_load(RankLoadProvider provide, RankLoadSink hear, RankLoadSink hear_own = {});
  void remove_rank_load(uint64_t token);
  // Tells registration `token` every (worker key, rank) whose figures are not zero now: the
  // peers' sums to `hear`, this replica's echoed ones to `hear_own` (a policy whose sources were
  // made since, which start at zero). Under the same lock as the reports' telling: in order.
  void retell(uint64_t token);
  // This replica's own figures for one (worker key, rank) as last echoed.
  RankLoad own_rank_load(uint64_t worker, int32_t rank) const;

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

  // The replica ids registered now (--replica-registry: the keys under
  // /kvgate/v1/gateways/<subject>/). A peer whose key was there and is gone is forgotten at once,
  // as after silence (a replica that still sends is heard again with its next report).
  void set_registered(std::vector<uint64_t> ids);

  // For /readiness and /v1/stats: {"connected":..,"peers":..,...}.
  std::string status_json() const;

 private:
  static void on_message(__natsConnection*, __natsSubscription*, __natsMsg* msg, void* self);
  static void on_inventory(__natsConnection*, __natsSubscription*, __natsMsg* msg, void* self);
  static void on_disconnected(__natsConnection*, void* self);
  static void on_reconnected(__natsConnection*, void* self);
  // A replay's audience: the sinks it is for, and what it applied.
  struct ReplayTarget {
    std::vector<uint64_t> sinks;  // sorted
    uint64_t applied = 0;
  };
  // A message of the fleet's subjects: live (replay null) or from the history.
  void handle(std::string_view data, ReplayTarget* replay = nullptr);
  void history_run();                    // the history thread
  bool ensure_stream(std::string& why);  // false: no history (why says so)
  enum class ReplayResult { kOk, kTimeout, kUnavailable, kError };
  ReplayResult replay(int64_t since_us, ReplayTarget& target);
  void set_ready(bool ready);
  void count_replay(ReplayResult r);
  // A load report, own (echoed) or a peer's, counting from `from_us`.
  void apply_report(bool own, const Header& h, const LoadReport& report, int64_t from_us);
  void apply_load(const Header& h, const LoadReport& report, int64_t from_us);
  void run();  // the batching / load thread
  void flush_records(std::vector<ChainRecord>& batch);
  void publish_load(bool force);
  void expire_peers();
  // Sets every tracked worker's peer sum from peers_ (load_mu_ held) for the given keys.
  void resum(const std::vector<uint64_t>& keys, int64_t from_us);
  void send(const std::string& subject, const std::string& data, std::string_view kind);

  // What libnats' callbacks are given instead of `this`: it may call one after Unsubscribe or
  // Destroy returned (they do not wait), so the gate outlives the Sync (one small object per
  // started Sync, kept to the process's end) and stop() shuts it, waiting for a callback that is
  // running.
  struct Gate {
    std::shared_mutex mu;
    Sync* sync = nullptr;
  };
  // Freed with the Sync when libnats never had it, else kept for the process's life.
  Gate* gate_ = new Gate{{}, this};  // NOLINT(cppcoreguidelines-owning-memory)
  bool ever_connected_ = false;

  SyncConfig config_;
  uint64_t id_;
  std::string chains_subject_, load_subject_, inventory_subject_, stream_name_;
  const bool with_history_;
  __natsConnection* nc_ = nullptr;
  std::vector<__natsSubscription*> subs_;
  std::atomic<bool> connected_{false};
  std::atomic<bool> own_fresh_{false};  // an own report echoed since the last (re)connection
  // Records may leave (connected, and with history the stream ensured for this connection).
  std::atomic<bool> ready_{false};
  std::atomic<bool> history_ok_{false};

  // History (hist_mu_): the connection's epoch (one more at every connection) and the one whose
  // stream was ensured; when the connection was last lost and last found (unix us); what each
  // sink is owed (a start time in unix us, 0: everything).
  std::mutex hist_mu_;
  std::condition_variable hist_cv_;
  bool hist_stopping_ = false;
  uint64_t conn_epoch_ = 0, ensured_epoch_ = 0;
  int64_t lost_us_ = 0, found_us_ = 0;
  std::map<uint64_t, int64_t> owed_;
  int history_logged_ = -1;  // availability last logged (-1: never)
  std::thread hist_thread_;
  mutable std::shared_mutex responders_mu_;
  struct ResponderEntry {
    std::string rule;
    Responder respond;
  };
  std::map<uint64_t, ResponderEntry> responders_;
  uint64_t next_responder_ = 1;
  metrics::CounterFamily* bootstraps_ = nullptr;  // {result}
  Clock::time_point started_at_{};

  // Load reports heard, waiting for their moment (sent + settle()), earliest first (mu_). Past
  // kMaxDueLoads (a flood of reports) one is applied when heard.
  struct DueLoad {
    int64_t due_us = 0;
    bool own = false;
    Header header;
    LoadReport report;
    bool operator>(const DueLoad& o) const { return due_us > o.due_us; }
  };
  static constexpr size_t kMaxDueLoads = 65536;
  std::priority_queue<DueLoad, std::vector<DueLoad>, std::greater<>> due_loads_;

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
  // Rank-load registrations (their own lock: providers run while publishing, outside load_mu_;
  // sinks while a report is applied, under load_mu_).
  mutable std::shared_mutex rank_mu_;
  struct RankReg {
    RankLoadProvider provide;
    RankLoadSink hear;
    RankLoadSink hear_own;
  };
  std::map<uint64_t, RankReg> rank_regs_;
  uint64_t next_rank_reg_ = 1;
  // The rank entries last published, to send only on a change.
  std::vector<LoadEntry> last_ranks_;
  // Sums changed by apply_load / expire_peers, told to the sinks (load_mu_ held).
  void tell_rank_sinks(const std::vector<std::pair<RankKey, RankLoad>>& changed, int64_t from_us);
  // Recomputes rank_sums_ for `keys` (load_mu_ held); appends what changed.
  void resum_ranks(const std::vector<RankKey>& keys,
                   std::vector<std::pair<RankKey, RankLoad>>& changed);
  std::unordered_map<uint64_t, Peer> peers_;
  size_t peer_entries_ = 0;           // entries in peers_ (load_mu_)
  std::vector<uint64_t> registered_;  // sorted (set_registered)
  // Peers forgotten because their key went, and when: their reports are ignored for a peer
  // timeout unless the key comes back (at most kMaxPeers).
  std::unordered_map<uint64_t, Clock::time_point> deregistered_;
  // This replica's own entries as last echoed (rank -1: requests in flight per worker), and that
  // report's sequence (load_mu_).
  std::unordered_map<RankKey, RankLoad, RankKeyHash> own_ranks_;
  uint64_t own_seq_ = 0;
  void apply_own_load(const LoadReport& report, int64_t from_us);
  uint64_t load_seq_ = 0;
  Clock::time_point last_load_{};

  // Metrics (null without a registry).
  metrics::Gauge* connected_gauge_ = nullptr;
  metrics::Gauge* peers_gauge_ = nullptr;
  metrics::Counter* disconnects_ = nullptr;
  metrics::CounterFamily* expiries_ = nullptr;     // {reason}
  metrics::CounterFamily* messages_ = nullptr;     // {direction, kind}
  metrics::CounterFamily* bytes_ = nullptr;        // {direction}
  metrics::CounterFamily* records_ = nullptr;      // {result}
  metrics::Histogram* lag_ = nullptr;              // origin age of applied records
  metrics::CounterFamily* errors_ = nullptr;       // {reason}
  metrics::GaugeFamily* peer_inflight_ = nullptr;  // {worker}, set by a collector
  metrics::Gauge* history_gauge_ = nullptr;
  metrics::Counter* replayed_ = nullptr;       // records applied from the history
  metrics::CounterFamily* replays_ = nullptr;  // {result}
};

}  // namespace kvgate::replica
