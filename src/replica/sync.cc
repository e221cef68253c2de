// replica/sync: see sync.h.
#include "replica/sync.h"

#include <nats/nats.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <random>
#include <set>

#include "util/json.h"
#include "util/log.h"

namespace kvgate::replica {
namespace {

uint64_t random_id() {
  std::random_device rd;
  uint64_t id = 0;
  while (id == 0) id = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return id;
}

// JetStream API requests (stream info, create, consumers) wait at most this long.
constexpr int64_t kJsWaitMs = 2000;
// A chains message stays under NATS's default max_payload (1 MB) however many records waited.
constexpr size_t kMaxMessageBytes = size_t{512} * 1024;

std::string js_error(natsStatus s, jsErrCode e) {
  std::string out = natsStatus_GetText(s);
  if (e != 0) out += " (JetStream error " + std::to_string(static_cast<int>(e)) + ")";
  if (s == NATS_NO_RESPONDERS) out += ": the server has no JetStream (nats-server -js)";
  return out;
}

const char* result_name(int r) {
  static constexpr const char* kNames[] = {"ok", "timeout", "unavailable", "error"};
  return kNames[r];
}

// Sync lag buckets (seconds): from a millisecond to a minute.
std::vector<double> lag_buckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
}

}  // namespace

int64_t Sync::now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Sync::Sync(SyncConfig config, metrics::Registry* registry)
    : config_(std::move(config)),
      id_(random_id()),
      chains_subject_(config_.subject + ".chains"),
      load_subject_(config_.subject + ".load"),
      inventory_subject_(config_.subject + ".inventory"),
      stream_name_(stream_name(config_.subject)),
      with_history_(config_.history.count() > 0 && config_.history_bytes > 0) {
  if (!registry) return;
  auto& r = *registry;
  connected_gauge_ = &r.gauge("kvgate_replica_sync_connected",
                              "1 while this replica is connected to NATS (--replica-sync), 0 while "
                              "it routes on its own state only")
                          .with({});
  peers_gauge_ = &r.gauge("kvgate_replica_peers",
                          "Other kvgate replicas heard from within --replica-peer-timeout-ms")
                      .with({});
  disconnects_ =
      &r.counter("kvgate_replica_sync_disconnects_total", "Times the connection to NATS was lost")
           .with({});
  expiries_ = &r.counter("kvgate_replica_peer_expiries_total",
                         "Peers forgotten (their load no longer counted): silence (nothing for "
                         "--replica-peer-timeout-ms) or deregistered (their --replica-registry "
                         "key went)",
                         {"reason"});
  messages_ = &r.counter("kvgate_replica_sync_messages_total",
                         "Replica sync messages sent and received, by kind (chains, load)",
                         {"direction", "kind"});
  bytes_ = &r.counter("kvgate_replica_sync_bytes_total",
                      "Bytes of replica sync messages sent and received (payloads)", {"direction"});
  records_ = &r.counter("kvgate_replica_sync_records_total",
                        "Peers' records (cache_aware chains, kv_exact predictions) by what became "
                        "of them: applied (handed to the policy of a rule of that name, which "
                        "may still skip it: another chunk size, an expired record), or dropped "
                        "(no rule of that name here)",
                        {"result"});
  lag_ = &r.histogram("kvgate_replica_sync_lag_seconds",
                      "Age of peers' records when applied here (their origin time to now; "
                      "includes the sender's batching and clock skew)",
                      {}, lag_buckets())
              .with({});
  peer_inflight_ = &r.gauge("kvgate_replica_peer_inflight",
                            "Requests the other replicas last said they have in flight to each "
                            "worker (added to this replica's own in every load comparison)",
                            {"worker"});
  r.add_collector([gate = gate_] {
    // (Through the gate: an exposition after this Sync stopped finds nothing to read.)
    std::shared_lock gate_lock(gate->mu);
    Sync* s = gate->sync;
    if (s == nullptr) return;
    std::lock_guard lock(s->load_mu_);
    // The peer count with the sums it goes with (one scrape never mixes before and after).
    if (s->peers_gauge_) s->peers_gauge_->set(static_cast<double>(s->peers_.size()));
    for (const auto& [key, t] : s->tracked_) {
      s->peer_inflight_->with({t.worker->url()})
          .set(static_cast<double>(t.worker->peer_inflight()));
    }
  });
  bootstraps_ = &r.counter("kvgate_replica_inventory_requests_total",
                           "kv_exact sources this replica asked its peers for (bootstrap), by "
                           "result: warm (a peer's whole inventory taken), cold (no peer had it "
                           "complete), no_peer (no other replica heard from), unavailable (NATS "
                           "not connected); and answers it served (served_warm, served_cold)",
                           {"result"});
  history_gauge_ = &r.gauge("kvgate_replica_sync_history",
                            "1 while the fleet's JetStream history stream is there for this "
                            "connection (a new or reconnected replica replays it); 0 without "
                            "JetStream (core NATS only)")
                        .with({});
  replayed_ = &r.counter("kvgate_replica_sync_replayed_records_total",
                         "Peers' records applied from the JetStream history (on start, when a "
                         "rule's policy starts, and after a reconnection)")
                   .with({});
  replays_ = &r.counter("kvgate_replica_sync_replays_total",
                        "History replays by result: ok (caught up), timeout (stopped after the "
                        "replay timeout), unavailable (no history: no JetStream), error (the "
                        "connection or the consumer failed)",
                        {"result"});
  errors_ = &r.counter(
      "kvgate_replica_sync_errors_total",
      "Replica sync failures by reason (publish, decode, queue_full, too_many_peers)", {"reason"});
}

Sync::~Sync() {
  stop();
  if (nc_ == nullptr && !ever_connected_) {
    delete gate_;  // libnats never had it
    return;
  }
  // libnats may still call through it (see Gate): kept, reachable, for the process's life.
  static std::mutex kept_mu;
  // (Never destroyed; an allocation failure here ends the process, as any at startup would.)
  static auto* kept =
      new std::vector<std::unique_ptr<Gate>>();  // NOLINT(bugprone-unhandled-exception-at-new)
  std::lock_guard lock(kept_mu);
  kept->emplace_back(gate_);
}

std::string Sync::stream_name(std::string_view prefix) {
  std::string name = "KVGATE_";
  bool exact = true;  // the prefix can be read back from the name
  for (char c : prefix) {
    if ((c >= 'a' && c <= 'z')) {
      name.push_back(static_cast<char>(c - 'a' + 'A'));
    } else if ((c >= '0' && c <= '9') || c == '-' || c == '_') {
      name.push_back(c);
    } else {
      exact = false;
      name.push_back((c >= 'A' && c <= 'Z') ? c : '_');
    }
  }
  constexpr size_t kMaxKept = 48;  // a long prefix is cut, and named by its hash too
  if (name.size() > kMaxKept) {
    name.resize(kMaxKept);
    exact = false;
  }
  if (!exact) {
    char hash[16];
    std::snprintf(hash, sizeof hash, "_%08X",
                  static_cast<unsigned>(worker_key(prefix) & 0xffffffffULL));
    name += hash;
  }
  return name;
}

std::string Sync::start() {
  natsOptions* opts = nullptr;
  natsStatus s = natsOptions_Create(&opts);
  auto fail = [&](const std::string& what) {
    if (opts) natsOptions_Destroy(opts);
    return what + ": " + natsStatus_GetText(s);
  };
  if (s != NATS_OK) return fail("nats options");
  if ((s = natsOptions_SetURL(opts, config_.url.c_str())) != NATS_OK) {
    return fail("--replica-sync '" + redact_url(config_.url) + "' is not a NATS URL list");
  }
  natsOptions_SetName(opts, config_.name.c_str());
  // Echo stays on: this replica's own load reports come back as its peers get them, and count
  // here when they count there (add_rank_load's `hear_own`); its own records are skipped.
  natsOptions_SetMaxReconnect(opts, -1);
  natsOptions_SetReconnectWait(opts, 250);
  natsOptions_SetTimeout(opts, 2000);
  natsOptions_SetPingInterval(opts, 2000);
  natsOptions_SetMaxPingsOut(opts, 2);
  natsOptions_SetDisconnectedCB(opts, &Sync::on_disconnected, gate_);
  natsOptions_SetReconnectedCB(opts, &Sync::on_reconnected, gate_);
  // Not there yet: keep trying in the background (routing does not wait for NATS).
  natsOptions_SetRetryOnFailedConnect(opts, true, &Sync::on_reconnected, gate_);
  ever_connected_ = true;  // (libnats has the gate from here on, connected or not)
  s = natsConnection_Connect(&nc_, opts);
  natsOptions_Destroy(opts);
  opts = nullptr;
  if (s == NATS_OK) {
    connected_ = true;
    std::lock_guard lock(hist_mu_);
    conn_epoch_ = 1;
  } else if (s != NATS_NOT_YET_CONNECTED) {
    nc_ = nullptr;
    return std::string("--replica-sync ") + redact_url(config_.url) + ": " + natsStatus_GetText(s);
  } else {
    log::warn("replica sync: NATS not reachable yet; routing on this replica's state until it is")
        .kv("url", redact_url(config_.url));
  }
  if (connected_gauge_) connected_gauge_->set(connected_ ? 1 : 0);
  for (const std::string* subject : {&chains_subject_, &load_subject_}) {
    natsSubscription* sub = nullptr;
    s = natsConnection_Subscribe(&sub, nc_, subject->c_str(), &Sync::on_message, gate_);
    if (s != NATS_OK) {
      return "--replica-sync: subscribing to " + *subject + ": " + natsStatus_GetText(s);
    }
    // Bounded: a replica that cannot keep up drops (counted by libnats) rather than grow.
    natsSubscription_SetPendingLimits(sub, 65536, 64 * 1024 * 1024);
    subs_.push_back(sub);
  }
  {
    natsSubscription* sub = nullptr;
    s = natsConnection_Subscribe(&sub, nc_, inventory_subject_.c_str(), &Sync::on_inventory, gate_);
    if (s != NATS_OK) {
      return "--replica-sync: subscribing to " + inventory_subject_ + ": " + natsStatus_GetText(s);
    }
    natsSubscription_SetPendingLimits(sub, 1024, 16 * 1024 * 1024);
    subs_.push_back(sub);
  }
  started_at_ = Clock::now();
  // Without history records leave as soon as connected; with it once the stream is ensured.
  if (!with_history_) set_ready(connected_);
  thread_ = std::thread([this] { run(); });
  if (with_history_) hist_thread_ = std::thread([this] { history_run(); });
  log::info("replica sync started")
      .kv("url", redact_url(config_.url))
      .kv("subject", config_.subject)
      .kv("replica", config_.name)
      .kv("id", id_)
      .kv("connected", connected_.load())
      .kv("history", with_history_ ? stream_name_ : std::string("off"));
  return "";
}

void Sync::stop() {
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  {
    std::lock_guard lock(hist_mu_);
    hist_stopping_ = true;
  }
  hist_cv_.notify_all();
  if (hist_thread_.joinable()) hist_thread_.join();
  if (thread_.joinable()) thread_.join();
  {
    // libnats may still be inside a callback (Unsubscribe and Destroy do not wait for them), or
    // call one after (the closing connection's disconnected callback): from here on they find
    // the gate shut, and this waits for any running one to return.
    std::unique_lock lock(gate_->mu);
    gate_->sync = nullptr;
  }
  for (natsSubscription* sub : subs_) {
    natsSubscription_Unsubscribe(sub);
    natsSubscription_Destroy(sub);
  }
  subs_.clear();
  if (nc_) {
    natsConnection_FlushTimeout(nc_, 500);
    natsConnection_Destroy(nc_);
    nc_ = nullptr;
  }
  // Stopped, the policies weigh their live counts (own_view() false) and no peer's per worker
  // (kv_exact's per-rank sums are not told: stop() comes after the pools are gone).
  own_fresh_ = false;
  std::lock_guard lock(load_mu_);
  const int64_t now = now_us();
  for (auto& [key, t] : tracked_) {
    t.worker->set_peer_inflight(0, now);
    t.worker->set_echoed_inflight(0, now);
  }
  peers_.clear();
  rank_sums_.clear();
  own_ranks_.clear();
}

void Sync::set_ready(bool ready) {
  {
    std::lock_guard lock(mu_);
    ready_ = ready;
  }
  cv_.notify_all();
}

void Sync::on_disconnected(natsConnection*, void* self) {
  auto* gate = static_cast<Gate*>(self);
  std::shared_lock gate_lock(gate->mu);
  Sync* s = gate->sync;
  if (s == nullptr) return;
  s->own_fresh_ = false;
  if (s->connected_.exchange(false)) {
    if (s->disconnects_) s->disconnects_->inc();
    log::warn("replica sync: NATS connection lost; routing on this replica's state")
        .kv("url", redact_url(s->config_.url));
  }
  {
    // (Under hist_mu_: the history thread, which lets records go, sees connected_ false first.)
    std::lock_guard lock(s->hist_mu_);
    if (s->lost_us_ == 0 || s->lost_us_ < s->found_us_) s->lost_us_ = now_us();
    s->set_ready(false);
  }
  if (s->connected_gauge_) s->connected_gauge_->set(0);
}

void Sync::on_reconnected(natsConnection*, void* self) {
  auto* gate = static_cast<Gate*>(self);
  std::shared_lock gate_lock(gate->mu);
  Sync* s = gate->sync;
  if (s == nullptr) return;
  s->own_fresh_ = false;
  if (!s->connected_.exchange(true))
    log::info("replica sync: connected to NATS").kv("url", redact_url(s->config_.url));
  if (s->connected_gauge_) s->connected_gauge_->set(1);
  if (s->with_history_) {
    // The history thread ensures the stream for this connection, then lets records leave; every
    // sink is owed what peers sent while this replica was away (the first connection owes
    // nothing more: the sinks were owed everything when added).
    std::vector<uint64_t> tokens;
    {
      std::shared_lock lock(s->sinks_mu_);
      for (const auto& [token, entry] : s->sinks_) tokens.push_back(token);
    }
    {
      std::lock_guard lock(s->hist_mu_);
      ++s->conn_epoch_;
      s->found_us_ = now_us();
      if (s->lost_us_ > 0) {
        const int64_t since = std::max<int64_t>(
            1, s->lost_us_ -
                   std::chrono::duration_cast<std::chrono::microseconds>(kReplayMargin).count());
        for (uint64_t token : tokens) {
          auto [it, fresh] = s->owed_.try_emplace(token, since);
          if (!fresh) it->second = std::min(it->second, since);
        }
      }
    }
    s->hist_cv_.notify_all();
  } else {
    s->set_ready(true);
  }
  // Peers hear this replica's load at once rather than at the next heartbeat.
  {
    std::lock_guard lock(s->mu_);
    s->last_load_ = {};
  }
  s->cv_.notify_all();
}

void Sync::on_message(natsConnection*, natsSubscription*, natsMsg* msg, void* self) {
  auto* gate = static_cast<Gate*>(self);
  {
    std::shared_lock gate_lock(gate->mu);
    if (Sync* s = gate->sync) {
      std::string_view data(natsMsg_GetData(msg), static_cast<size_t>(natsMsg_GetDataLength(msg)));
      s->handle(data);
    }
  }
  natsMsg_Destroy(msg);
}

void Sync::handle(std::string_view data, ReplayTarget* replay) {
  Header h;
  const std::string header_error = decode_header(data, h);
  // (the echo of this replica's own messages is not counted in)
  if (!replay && bytes_ && (!header_error.empty() || h.replica != id_)) {
    bytes_->with({"in"}).inc(data.size());
  }
  if (!header_error.empty()) {
    if (errors_) errors_->with({"decode"}).inc();
    static log::RateLimit limit(5, std::chrono::seconds(10));
    log::warn(limit, "replica sync: message dropped").kv("error", header_error);
    return;
  }
  // Our own messages, live: the echo of what this replica sent. Its records were applied when
  // made; its load reports count here from the moment they count on the peers (settle). In a
  // replay own records are given to every sink: a policy built since (a rule changed) has none
  // of them, and applying a record again changes nothing.
  const bool own = h.replica == id_ && !replay;
  if (h.kind == Kind::kLoad) {
    if (replay) return;  // (the history holds records only)
    LoadReport report;
    if (std::string e = decode_load(data, report); !e.empty()) {
      if (errors_) errors_->with({"decode"}).inc();
      return;
    }
    if (!own && messages_) messages_->with({"in", "load"}).inc();
    // A report counts from its sending + settle() on every replica alike, this one included
    // (the run thread applies it then; one heard later at once, one from a clock ahead of ours
    // at most settle() from now): the figures every replica weighs change at one moment, and
    // never before the predictions of the dispatches they count (records leave first).
    const int64_t settle_us =
        std::chrono::duration_cast<std::chrono::microseconds>(settle()).count();
    const int64_t now = now_us();
    // (Compared before adding: a sending time from the far future must not overflow.)
    const int64_t due = h.sent_us >= now ? now + settle_us : h.sent_us + settle_us;
    if (due > now) {
      std::lock_guard lock(mu_);
      if (due_loads_.size() < kMaxDueLoads) {
        due_loads_.push(DueLoad{due, own, h, std::move(report)});
        cv_.notify_all();
        return;
      }
    }
    apply_report(own, h, report, due);
    return;
  }
  if (h.kind != Kind::kChains) return;
  std::vector<ChainRecord> records;
  if (std::string e = decode_chains(data, records); !e.empty()) {
    if (errors_) errors_->with({"decode"}).inc();
    static log::RateLimit limit(5, std::chrono::seconds(10));
    log::warn(limit, "replica sync: message dropped").kv("error", e);
    return;
  }
  if (own) return;  // applied when made
  if (!replay && messages_) messages_->with({"in", "chains"}).inc();
  const int64_t now = now_us();
  std::shared_lock lock(sinks_mu_);
  for (const ChainRecord& r : records) {
    // An origin no clock gives (before 1970) is malformed; one over a minute ahead of ours is a
    // clock gone wrong (NTP): dropped, so that the sinks' origin + TTL arithmetic stays in range
    // and a record stamped far ahead does not outlive the others in the index.
    if (r.origin_us < 0) {
      if (errors_) errors_->with({"decode"}).inc();
      continue;
    }
    if (r.origin_us > now + kMaxOriginAheadUs) {
      if (errors_) errors_->with({"clock_ahead"}).inc();
      static log::RateLimit limit(1, std::chrono::seconds(60));
      log::warn(limit,
                "replica sync: a peer's record is stamped over a minute ahead of this clock; "
                "dropped (check NTP on every replica)")
          .kv("ahead_ms", (r.origin_us - now) / 1000);
      continue;
    }
    bool applied = false;
    for (const auto& [token, entry] : sinks_) {
      if (entry.rule != r.rule) continue;
      if (replay && !std::binary_search(replay->sinks.begin(), replay->sinks.end(), token))
        continue;
      entry.sink(r);
      applied = true;
    }
    if (replay) {
      // Counted apart: the live counters and the lag say how the fleet keeps up now.
      if (applied) {
        ++replay->applied;
        if (replayed_) replayed_->inc();
      }
      continue;
    }
    if (records_) records_->with({applied ? "applied" : "dropped"}).inc();
    if (applied && lag_)
      lag_->observe(static_cast<double>(std::max<int64_t>(0, now - r.origin_us)) / 1e6);
  }
}

void Sync::publish(ChainRecord record) {
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    if (pending_.size() >= kMaxPending) {
      if (errors_) errors_->with({"queue_full"}).inc();
      return;
    }
    if (pending_.empty()) first_pending_ = Clock::now();
    pending_.push_back(std::move(record));
    if (pending_.size() < config_.batch_records || !ready_) return;
  }
  cv_.notify_all();
}

std::vector<ChainRecord> Sync::take_pending() {
  std::lock_guard lock(mu_);
  std::vector<ChainRecord> out;
  out.swap(pending_);
  return out;
}

void Sync::on_inventory(natsConnection*, natsSubscription*, natsMsg* msg, void* self) {
  auto* gate = static_cast<Gate*>(self);
  std::shared_lock gate_lock(gate->mu);
  Sync* s = gate->sync;
  if (s == nullptr) {
    natsMsg_Destroy(msg);
    return;
  }
  std::string_view data(natsMsg_GetData(msg), static_cast<size_t>(natsMsg_GetDataLength(msg)));
  const char* reply = natsMsg_GetReply(msg);
  Header h;
  InventoryRequest req;
  if (reply != nullptr && decode_header(data, h).empty() && h.replica != s->id_ &&
      decode_inventory_request(data, req).empty()) {
    std::optional<Snapshot> snap;
    bool answered = false;
    {
      std::shared_lock lock(s->responders_mu_);
      for (const auto& [token, e] : s->responders_) {
        if (e.rule != req.rule) continue;
        snap = e.respond(req);
        answered = true;
        break;
      }
    }
    // A replica without the rule says so too: the asker stops waiting once every peer answered.
    if (true) {
      auto parts = encode_inventory_reply(Header{.replica = s->id_, .sent_us = now_us()}, req,
                                          snap.has_value(), snap ? snap->seq : 0,
                                          snap ? snap->data : kv::SourceExport{});
      for (const auto& part : parts) {
        natsConnection_Publish(s->nc_, reply, part.data(), static_cast<int>(part.size()));
      }
      if (s->bootstraps_ && answered) {
        s->bootstraps_->with({snap ? "served_warm" : "served_cold"}).inc();
      }
    }
  }
  natsMsg_Destroy(msg);
}

uint64_t Sync::add_responder(const std::string& rule, Responder respond) {
  std::unique_lock lock(responders_mu_);
  const uint64_t token = next_responder_++;
  responders_.emplace(token, ResponderEntry{rule, std::move(respond)});
  return token;
}

void Sync::remove_responder(uint64_t token) {
  std::unique_lock lock(responders_mu_);
  responders_.erase(token);
}

std::optional<Sync::Snapshot> Sync::request_inventory(const InventoryRequest& r,
                                                      std::chrono::milliseconds timeout) {
  auto count = [&](std::string_view result) {
    if (bootstraps_) bootstraps_->with({result}).inc();
  };
  if (nc_ == nullptr || !connected()) {
    count("unavailable");
    return std::nullopt;
  }
  // Just started: the peers are known from their load reports (at least one a second); without
  // any there is no one to ask.
  while (peers() == 0 &&
         Clock::now() < started_at_ + config_.load_heartbeat + std::chrono::milliseconds(300)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (peers() == 0) {
    count("no_peer");
    return std::nullopt;
  }
  natsInbox* inbox = nullptr;
  if (natsInbox_Create(&inbox) != NATS_OK) {
    count("unavailable");
    return std::nullopt;
  }
  natsSubscription* sub = nullptr;
  std::string msg;
  encode_inventory_request(Header{.replica = id_, .sent_us = now_us()}, r, msg);
  const size_t peers_known = peers();
  std::optional<Snapshot> out;
  if (natsConnection_SubscribeSync(&sub, nc_, inbox) == NATS_OK &&
      natsSubscription_SetPendingLimits(sub, 65536, 256 * 1024 * 1024) == NATS_OK &&
      natsConnection_PublishRequest(nc_, inventory_subject_.c_str(), inbox, msg.data(),
                                    static_cast<int>(msg.size())) == NATS_OK) {
    // Answers of every peer that has the rule arrive here; the first warm one is taken whole
    // (its parts in order), not-warm ones are counted until every known peer has answered.
    struct Partial {
      uint32_t next = 0;
      Snapshot snap;
    };
    std::map<uint64_t, Partial> partial;
    std::set<uint64_t> cold;
    const auto end = Clock::now() + timeout;
    while (!out && Clock::now() < end) {
      natsMsg* m = nullptr;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now());
      if (natsSubscription_NextMsg(&m, sub, std::max<int64_t>(1, left.count())) != NATS_OK) break;
      std::string_view data(natsMsg_GetData(m), static_cast<size_t>(natsMsg_GetDataLength(m)));
      Header h;
      InventoryPart part;
      const bool ok = decode_header(data, h).empty() && decode_inventory_part(data, part).empty() &&
                      part.source == r;
      natsMsg_Destroy(m);
      if (!ok) continue;
      if (!part.warm) {
        cold.insert(h.replica);
        if (peers_known > 0 && cold.size() >= peers_known) break;
        continue;
      }
      Partial& p = partial[h.replica];
      if (part.part != p.next) {  // a part lost: this peer's answer cannot be used
        partial.erase(h.replica);
        continue;
      }
      ++p.next;
      p.snap.seq = part.seq;
      auto& d = p.snap.data;
      d.links.insert(d.links.end(), part.data.links.begin(), part.data.links.end());
      d.holdings.insert(d.holdings.end(), part.data.holdings.begin(), part.data.holdings.end());
      if (p.next == part.parts) out = std::move(p.snap);
    }
  }
  if (sub) {
    natsSubscription_Unsubscribe(sub);
    natsSubscription_Destroy(sub);
  }
  natsInbox_Destroy(inbox);
  count(out ? "warm" : "cold");
  return out;
}

uint64_t Sync::add_sink(const std::string& rule, ChainSink sink) {
  uint64_t token = 0;
  {
    std::unique_lock lock(sinks_mu_);
    token = next_sink_++;
    sinks_.emplace(token, SinkEntry{rule, std::move(sink)});
  }
  if (with_history_) {
    {
      std::lock_guard lock(hist_mu_);
      owed_[token] = 0;  // the whole history
    }
    hist_cv_.notify_all();
  }
  return token;
}

void Sync::remove_sink(uint64_t token) {
  {
    std::unique_lock lock(sinks_mu_);  // waits for a delivery in progress
    sinks_.erase(token);
  }
  std::lock_guard lock(hist_mu_);
  owed_.erase(token);
}

void Sync::track(const WorkerPtr& w) {
  std::lock_guard lock(load_mu_);
  const uint64_t key = w->url_key();
  Tracked& t = tracked_[key];
  if (t.count++ == 0) {
    t.worker = w;
    t.published = -1;
    const int64_t now = now_us();
    resum({key}, now);
    auto own = own_ranks_.find(RankKey{key, -1});
    w->set_echoed_inflight(own == own_ranks_.end() ? 0 : own->second.active, now);
  }
}

void Sync::untrack(const Worker& w) {
  std::lock_guard lock(load_mu_);
  auto it = tracked_.find(w.url_key());
  if (it == tracked_.end() || --it->second.count > 0) return;
  const int64_t now = now_us();
  it->second.worker->set_peer_inflight(0, now);
  it->second.worker->set_echoed_inflight(0, now);
  if (peer_inflight_) peer_inflight_->remove({it->second.worker->url()});
  tracked_.erase(it);
}

size_t Sync::peers() const {
  std::lock_guard lock(load_mu_);
  return peers_.size();
}

void Sync::apply_report(bool own, const Header& h, const LoadReport& report, int64_t from_us) {
  if (own) {
    apply_own_load(report, from_us);
  } else {
    apply_load(h, report, from_us);
  }
}

void Sync::apply_load(const Header& h, const LoadReport& report, int64_t from_us) {
  std::vector<std::pair<RankKey, RankLoad>> changed;
  {
    std::lock_guard lock(load_mu_);
    if (auto d = deregistered_.find(h.replica); d != deregistered_.end()) {
      if (Clock::now() - d->second < config_.peer_timeout) return;
      deregistered_.erase(d);
    }
    if (peers_.size() >= kMaxPeers && !peers_.contains(h.replica)) {
      // A fleet this large is a misconfiguration (or someone else's traffic on our subject).
      if (errors_) errors_->with({"too_many_peers"}).inc();
      return;
    }
    {
      // All peers' entries together are bounded too (each report is, by the wire's bound).
      auto known = peers_.find(h.replica);
      const size_t before =
          known == peers_.end() ? 0 : known->second.inflight.size() + known->second.ranks.size();
      if (peer_entries_ - before + report.entries.size() > kMaxPeerEntries) {
        if (errors_) errors_->with({"too_many_peers"}).inc();
        return;
      }
    }
    Peer& p = peers_[h.replica];
    if (p.seq != 0 && report.seq <= p.seq) return;  // an older report arriving late
    peer_entries_ -= p.inflight.size() + p.ranks.size();
    p.seq = report.seq;
    p.seen = Clock::now();
    std::vector<uint64_t> keys;
    std::vector<RankKey> rank_keys;
    keys.reserve(p.inflight.size() + report.entries.size());
    for (const auto& [key, n] : p.inflight) keys.push_back(key);
    for (const auto& [key, n] : p.ranks) rank_keys.push_back(key);
    p.inflight.clear();
    p.ranks.clear();
    for (const LoadEntry& e : report.entries) {
      if (e.rank == -1) {
        p.inflight[e.worker] = e.inflight;
        keys.push_back(e.worker);
      } else {
        const RankKey k{e.worker, e.rank};
        p.ranks[k] = RankLoad{e.inflight, e.prefill_tokens};
        rank_keys.push_back(k);
      }
    }
    peer_entries_ += p.inflight.size() + p.ranks.size();
    resum(keys, from_us);
    resum_ranks(rank_keys, changed);
    // Told under load_mu_: two reports (or a report and an expiry) are told in the order they
    // were summed, so a stale sum never lands last.
    tell_rank_sinks(changed, from_us);
  }
}

void Sync::resum_ranks(const std::vector<RankKey>& keys,
                       std::vector<std::pair<RankKey, RankLoad>>& changed) {
  for (const RankKey& k : keys) {
    RankLoad sum;
    for (const auto& [id, peer] : peers_) {
      auto f = peer.ranks.find(k);
      if (f == peer.ranks.end()) continue;
      sum.active += f->second.active;
      sum.prefill_tokens += f->second.prefill_tokens;
    }
    auto it = rank_sums_.find(k);
    const RankLoad old = it == rank_sums_.end() ? RankLoad{} : it->second;
    if (old == sum) continue;
    if (sum == RankLoad{}) {
      rank_sums_.erase(it);
    } else {
      rank_sums_[k] = sum;
    }
    changed.emplace_back(k, sum);
  }
}

void Sync::tell_rank_sinks(const std::vector<std::pair<RankKey, RankLoad>>& changed,
                           int64_t from_us) {
  if (changed.empty()) return;
  std::shared_lock lock(rank_mu_);
  for (const auto& [token, reg] : rank_regs_) {
    for (const auto& [k, sum] : changed) reg.hear(k.worker, k.rank, sum, from_us);
  }
}

uint64_t Sync::add_rank_load(RankLoadProvider provide, RankLoadSink hear, RankLoadSink hear_own) {
  uint64_t token = 0;
  {
    std::unique_lock lock(rank_mu_);
    token = next_rank_reg_++;
    rank_regs_.emplace(token, RankReg{std::move(provide), std::move(hear), std::move(hear_own)});
  }
  // A registration made after the last echo hears its figures with the next one: the next report
  // is sent at once.
  {
    std::lock_guard lock(mu_);
    last_load_ = {};
  }
  cv_.notify_all();
  return token;
}

void Sync::apply_own_load(const LoadReport& report, int64_t from_us) {
  std::lock_guard lock(load_mu_);
  if (own_seq_ != 0 && report.seq <= own_seq_) return;
  own_seq_ = report.seq;
  std::unordered_map<RankKey, RankLoad, RankKeyHash> now;
  for (const LoadEntry& e : report.entries) {
    now[RankKey{e.worker, e.rank}] = RankLoad{e.inflight, e.prefill_tokens};
  }
  // What changed (an entry left out of the report is zero: idle).
  std::vector<std::pair<RankKey, RankLoad>> changed;
  for (const auto& [k, v] : own_ranks_) {
    if (!now.contains(k)) changed.emplace_back(k, RankLoad{});
  }
  for (const auto& [k, v] : now) {
    auto it = own_ranks_.find(k);
    if (it == own_ranks_.end() || it->second != v) changed.emplace_back(k, v);
  }
  own_ranks_ = std::move(now);
  // Per worker (rank -1: Worker::shared_inflight, every policy's), per rank (kv_exact's sinks).
  {
    std::shared_lock rank_lock(rank_mu_);
    for (const auto& [k, v] : changed) {
      if (k.rank >= 0) {
        for (const auto& [token, reg] : rank_regs_) {
          if (reg.hear_own) reg.hear_own(k.worker, k.rank, v, from_us);
        }
      } else if (auto t = tracked_.find(k.worker); t != tracked_.end()) {
        t->second.worker->set_echoed_inflight(v.active, from_us);
      }
    }
  }
  // The figures told, the policies may weigh them (own_view()).
  own_fresh_ = true;
}

void Sync::retell(uint64_t token) {
  std::lock_guard lock(load_mu_);
  std::shared_lock rank_lock(rank_mu_);
  auto it = rank_regs_.find(token);
  if (it == rank_regs_.end()) return;
  const int64_t now = now_us();
  for (const auto& [k, sum] : rank_sums_) it->second.hear(k.worker, k.rank, sum, now);
  if (it->second.hear_own) {
    for (const auto& [k, v] : own_ranks_) {
      if (k.rank >= 0) it->second.hear_own(k.worker, k.rank, v, now);
    }
  }
}

void Sync::remove_rank_load(uint64_t token) {
  std::unique_lock lock(rank_mu_);
  rank_regs_.erase(token);
}

void Sync::set_registered(std::vector<uint64_t> ids) {
  std::sort(ids.begin(), ids.end());
  std::vector<std::pair<RankKey, RankLoad>> changed;
  std::lock_guard lock(load_mu_);
  std::vector<uint64_t> keys;
  std::vector<RankKey> rank_keys;
  for (auto it = peers_.begin(); it != peers_.end();) {
    const uint64_t id = it->first;
    // Only a key seen and then gone says the peer is: one never registered (no registry, a
    // registration not yet made) keeps its reports until silence.
    if (!std::binary_search(registered_.begin(), registered_.end(), id) ||
        std::binary_search(ids.begin(), ids.end(), id)) {
      ++it;
      continue;
    }
    log::info("replica sync: peer deregistered, its load forgotten").kv("peer", id);
    if (expiries_) expiries_->with({"deregistered"}).inc();
    // Its reports still on their way (or a last heartbeat before it stopped) do not bring it
    // back: ignored until its key is there again, or for a peer timeout.
    if (deregistered_.size() < kMaxPeers) deregistered_[id] = Clock::now();
    for (const auto& [key, n] : it->second.inflight) keys.push_back(key);
    for (const auto& [key, n] : it->second.ranks) rank_keys.push_back(key);
    peer_entries_ -= it->second.inflight.size() + it->second.ranks.size();
    it = peers_.erase(it);
  }
  for (uint64_t id : ids) deregistered_.erase(id);
  registered_ = std::move(ids);
  const int64_t now = now_us();
  if (!keys.empty()) resum(keys, now);
  if (!rank_keys.empty()) resum_ranks(rank_keys, changed);
  tell_rank_sinks(changed, now);
}

Sync::RankLoad Sync::own_rank_load(uint64_t worker, int32_t rank) const {
  std::lock_guard lock(load_mu_);
  auto it = own_ranks_.find(RankKey{worker, rank});
  return it == own_ranks_.end() ? RankLoad{} : it->second;
}

void Sync::resum(const std::vector<uint64_t>& keys, int64_t from_us) {
  for (uint64_t key : keys) {
    auto it = tracked_.find(key);
    if (it == tracked_.end()) continue;
    int64_t sum = 0;
    for (const auto& [id, peer] : peers_) {
      auto f = peer.inflight.find(key);
      if (f != peer.inflight.end()) sum += f->second;
    }
    it->second.worker->set_peer_inflight(std::min(sum, kMaxPeerLoad), from_us);
  }
}

void Sync::expire_peers() {
  std::vector<std::pair<RankKey, RankLoad>> changed;
  {
    std::lock_guard lock(load_mu_);
    const auto now = Clock::now();
    std::vector<uint64_t> keys;
    std::vector<RankKey> rank_keys;
    for (auto it = peers_.begin(); it != peers_.end();) {
      if (now - it->second.seen < config_.peer_timeout) {
        ++it;
        continue;
      }
      log::info("replica sync: peer silent, its load forgotten").kv("peer", it->first);
      if (expiries_) expiries_->with({"silence"}).inc();
      for (const auto& [key, n] : it->second.inflight) keys.push_back(key);
      for (const auto& [key, n] : it->second.ranks) rank_keys.push_back(key);
      peer_entries_ -= it->second.inflight.size() + it->second.ranks.size();
      it = peers_.erase(it);
    }
    const int64_t unix_now = now_us();
    if (!keys.empty()) resum(keys, unix_now);
    if (!rank_keys.empty()) resum_ranks(rank_keys, changed);
    tell_rank_sinks(changed, unix_now);
  }
}

void Sync::send(const std::string& subject, const std::string& data, std::string_view kind) {
  natsStatus s =
      natsConnection_Publish(nc_, subject.c_str(), data.data(), static_cast<int>(data.size()));
  if (s != NATS_OK) {
    if (errors_) errors_->with({"publish"}).inc();
    static log::RateLimit limit(5, std::chrono::seconds(10));
    log::warn(limit, "replica sync: publish failed").kv("error", natsStatus_GetText(s));
    return;
  }
  if (messages_) messages_->with({"out", kind}).inc();
  if (bytes_) bytes_->with({"out"}).inc(data.size());
}

void Sync::flush_records(std::vector<ChainRecord>& batch) {
  Header h{.kind = Kind::kChains, .replica = id_, .sent_us = now_us()};
  std::span<const ChainRecord> rest(batch);
  std::string msg;
  while (!rest.empty()) {
    // At most kMaxRecords, and kMaxMessageBytes (one record always goes): after an outage the
    // queue holds many batches.
    size_t n = 0, bytes = kHeaderBytes + 4;
    while (n < rest.size() && n < kMaxRecords) {
      const size_t b = chain_record_bytes(rest[n]) + 1 + kMaxRuleBytes;
      if (n > 0 && bytes + b > kMaxMessageBytes) break;
      bytes += b;
      ++n;
    }
    msg.clear();
    encode_chains(h, rest.first(n), msg);
    send(chains_subject_, msg, "chains");
    rest = rest.subspan(n);
  }
  batch.clear();
}

void Sync::publish_load(bool force) {
  LoadReport report;
  std::vector<LoadEntry> ranks;
  {
    std::shared_lock lock(rank_mu_);
    for (const auto& [token, reg] : rank_regs_) reg.provide(ranks);
  }
  // Two rules over one server report its ranks once, summed.
  std::sort(ranks.begin(), ranks.end(), [](const LoadEntry& a, const LoadEntry& b) {
    return a.worker != b.worker ? a.worker < b.worker : a.rank < b.rank;
  });
  std::vector<LoadEntry> merged;
  for (const LoadEntry& e : ranks) {
    if (!merged.empty() && merged.back().worker == e.worker && merged.back().rank == e.rank) {
      merged.back().inflight += e.inflight;
      merged.back().prefill_tokens += e.prefill_tokens;
    } else {
      merged.push_back(e);
    }
  }
  {
    std::lock_guard lock(load_mu_);
    bool changed = merged != last_ranks_;
    for (auto& [key, t] : tracked_) {
      const int64_t n = t.worker->inflight();
      changed = changed || n != t.published;
    }
    if (!changed && !force) return;
    report.seq = ++load_seq_;
    report.entries.reserve(tracked_.size());
    // Absolute, and a peer takes a report as the whole of this replica's load: an entry left out
    // is zero there, so idle workers and ranks are not sent (most of them, most of the time).
    for (auto& [key, t] : tracked_) {
      t.published = t.worker->inflight();
      if (t.published != 0) {
        report.entries.push_back({.worker = key, .rank = -1, .inflight = t.published});
      }
    }
    for (const LoadEntry& e : merged) {
      if (e.inflight != 0 || e.prefill_tokens != 0) report.entries.push_back(e);
    }
    last_ranks_ = std::move(merged);
  }
  std::string msg;
  encode_load(Header{.kind = Kind::kLoad, .replica = id_, .sent_us = now_us()}, report, msg);
  send(load_subject_, msg, "load");
}

void Sync::run() {
  std::vector<ChainRecord> batch;
  std::vector<DueLoad> loads;
  std::unique_lock lock(mu_);
  auto next_load = Clock::now();
  while (!stopping_) {
    const auto now = Clock::now();
    // Load reports whose moment came, in the order of their moments.
    const int64_t unix_now = now_us();
    while (!due_loads_.empty() && due_loads_.top().due_us <= unix_now) {
      loads.push_back(due_loads_.top());
      due_loads_.pop();
    }
    if (!loads.empty()) {
      lock.unlock();
      for (const DueLoad& d : loads) apply_report(d.own, d.header, d.report, d.due_us);
      loads.clear();
      lock.lock();
      continue;
    }
    // Not ready (disconnected, or the history stream not yet ensured): records wait here.
    const bool may_send = ready_ && !pending_.empty();
    // Records go before a load report that counts their dispatches (a peer must never weigh a
    // dispatch's load without its prediction).
    const bool due = may_send && (pending_.size() >= config_.batch_records ||
                                  now >= first_pending_ + config_.batch || now >= next_load);
    if (!due && now < next_load) {
      auto until = may_send ? std::min(next_load, first_pending_ + config_.batch) : next_load;
      if (!due_loads_.empty()) {
        until =
            std::min(until, now + std::chrono::microseconds(due_loads_.top().due_us - unix_now));
      }
      cv_.wait_until(lock, until);
      continue;
    }
    if (due) {
      batch.swap(pending_);
      lock.unlock();
      flush_records(batch);
      lock.lock();
    }
    if (Clock::now() >= next_load) {
      const bool force = Clock::now() - last_load_ >= config_.load_heartbeat;
      lock.unlock();
      publish_load(force);
      expire_peers();
      lock.lock();
      if (force) last_load_ = Clock::now();
      next_load = Clock::now() + config_.load_interval;
    }
  }
  // Whatever is queued goes before the connection closes.
  batch.swap(pending_);
  lock.unlock();
  if (!batch.empty()) flush_records(batch);
}

void Sync::history_run() {
  std::unique_lock lock(hist_mu_);
  while (!hist_stopping_) {
    const bool up = connected_.load();
    if (up && ensured_epoch_ != conn_epoch_) {
      const uint64_t epoch = conn_epoch_;
      lock.unlock();
      std::string why;
      bool ok = ensure_stream(why);
      if (!ok && connected_.load()) {
        // Once more a moment later: a server just started, or another replica creating the
        // stream at the same instant, fails the first try.
        std::this_thread::sleep_for(std::chrono::milliseconds(250));
        ok = ensure_stream(why);
      }
      lock.lock();
      if (epoch != conn_epoch_) continue;  // connected again meanwhile: ensure it again
      ensured_epoch_ = epoch;
      history_ok_ = ok;
      if (history_gauge_) history_gauge_->set(ok ? 1 : 0);
      if (history_logged_ != static_cast<int>(ok)) {
        history_logged_ = static_cast<int>(ok);
        if (ok) {
          log::info("replica sync: history stream ready; new and reconnected replicas replay it")
              .kv("stream", stream_name_)
              .kv("max_age_secs", config_.history.count())
              .kv("max_bytes", config_.history_bytes);
        } else {
          log::info("replica sync: no history to replay (core NATS only)")
              .kv("stream", stream_name_)
              .kv("reason", why);
        }
      }
      // Records held while disconnected leave now: into the history too.
      set_ready(connected_.load());
      continue;
    }
    if (up && ensured_epoch_ == conn_epoch_ && !owed_.empty()) {
      ReplayTarget target;
      int64_t since = INT64_MAX;
      for (const auto& [token, from] : owed_) {
        target.sinks.push_back(token);  // (sorted: a map's keys)
        since = std::min(since, from);
      }
      std::map<uint64_t, int64_t> owed;
      owed.swap(owed_);
      const uint64_t epoch = conn_epoch_;
      const bool available = history_ok_;
      lock.unlock();
      const auto began = Clock::now();
      const ReplayResult r = available ? replay(since, target) : ReplayResult::kUnavailable;
      count_replay(r);
      if (r != ReplayResult::kUnavailable) {
        const bool done = r == ReplayResult::kOk;
        log::Line(
            done ? log::Level::kInfo : log::Level::kWarn,
            done ? "replica sync: history replayed" : "replica sync: history replay incomplete")
            .kv("result", result_name(static_cast<int>(r)))
            .kv("records", target.applied)
            .kv("sinks", target.sinks.size())
            .kv("since_us", since)
            .kv("ms", std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - began)
                          .count());
      }
      lock.lock();
      // Broken off by a lost connection: owed again (a reconnection adds what it missed).
      if (r == ReplayResult::kError && (epoch != conn_epoch_ || !connected_.load())) {
        for (const auto& [token, from] : owed) {
          auto [it, fresh] = owed_.try_emplace(token, from);
          if (!fresh) it->second = std::min(it->second, from);
        }
      }
      continue;
    }
    hist_cv_.wait(lock);
  }
}

void Sync::count_replay(ReplayResult r) {
  if (replays_) replays_->with({result_name(static_cast<int>(r))}).inc();
}

bool Sync::ensure_stream(std::string& why) {
  jsOptions o;
  jsOptions_Init(&o);
  o.Wait = kJsWaitMs;
  jsCtx* js = nullptr;
  natsStatus s = natsConnection_JetStream(&js, nc_, &o);
  if (s != NATS_OK) {
    why = std::string("JetStream context: ") + natsStatus_GetText(s);
    return false;
  }
  const char* subjects[] = {chains_subject_.c_str()};
  jsStreamConfig sc;
  jsStreamConfig_Init(&sc);
  sc.Name = stream_name_.c_str();
  sc.Description = "kvgate --replica-sync history: the fleet's recent routing records";
  sc.Subjects = subjects;
  sc.SubjectsLen = 1;
  sc.Retention = js_LimitsPolicy;
  sc.Storage = js_MemoryStorage;
  sc.Discard = js_DiscardOld;
  sc.MaxAge = std::chrono::duration_cast<std::chrono::nanoseconds>(config_.history).count();
  sc.MaxBytes = config_.history_bytes;
  jsStreamInfo* si = nullptr;
  jsErrCode jerr = static_cast<jsErrCode>(0);
  // Creating a stream that exists with the same configuration is fine (the server says so).
  s = js_AddStream(&si, js, &sc, nullptr, &jerr);
  bool ok = s == NATS_OK;
  // (Two replicas creating it at once: the second may hear "subjects overlap" instead.)
  if (!ok && (jerr == JSStreamNameExistErr || jerr == JSStreamSubjectOverlapErr)) {
    // There with another configuration: a replica with another --eviction-interval or
    // --replica-sync-history-bytes made it. Ours replaces it, if it is the fleet's stream.
    jsStreamInfo* cur = nullptr;
    jsErrCode cur_err = static_cast<jsErrCode>(0);
    s = js_GetStreamInfo(&cur, js, stream_name_.c_str(), nullptr, &cur_err);
    bool ours = false;
    int64_t old_age = 0, old_bytes = 0;
    if (s == NATS_OK && cur && cur->Config) {
      for (int i = 0; i < cur->Config->SubjectsLen; ++i)
        ours = ours || chains_subject_ == cur->Config->Subjects[i];
      old_age = cur->Config->MaxAge;
      old_bytes = cur->Config->MaxBytes;
    }
    if (cur) jsStreamInfo_Destroy(cur);
    if (!ours) {
      why = s == NATS_OK ? "a stream of this name holds other subjects than " + chains_subject_
                         : js_error(s, cur_err);
      static log::RateLimit limit(1, std::chrono::seconds(60));
      log::error(limit, "replica sync: the history stream's name is taken; no history")
          .kv("stream", stream_name_)
          .kv("subject", chains_subject_)
          .kv("error", why);
    } else {
      jerr = static_cast<jsErrCode>(0);
      s = js_UpdateStream(&si, js, &sc, nullptr, &jerr);
      ok = true;  // it captures the fleet's records either way
      if (s == NATS_OK) {
        log::warn(
            "replica sync: history stream reconfigured to this replica's settings "
            "(replicas disagree on --eviction-interval or --replica-sync-history-bytes?)")
            .kv("stream", stream_name_)
            .kv("old_max_age_secs", old_age / 1000000000)
            .kv("max_age_secs", config_.history.count())
            .kv("old_max_bytes", old_bytes)
            .kv("max_bytes", config_.history_bytes);
      } else {
        log::warn("replica sync: history stream kept as it is (not updated)")
            .kv("stream", stream_name_)
            .kv("error", js_error(s, jerr));
      }
    }
  } else if (!ok) {
    why = js_error(s, jerr);
  }
  if (si) jsStreamInfo_Destroy(si);
  jsCtx_Destroy(js);
  return ok;
}

Sync::ReplayResult Sync::replay(int64_t since_us, ReplayTarget& target) {
  jsOptions o;
  jsOptions_Init(&o);
  o.Wait = kJsWaitMs;
  jsCtx* js = nullptr;
  if (natsConnection_JetStream(&js, nc_, &o) != NATS_OK) return ReplayResult::kError;
  ReplayResult result = ReplayResult::kOk;
  // Where the history ends now: what comes later reaches this replica live.
  jsStreamInfo* si = nullptr;
  jsErrCode jerr = static_cast<jsErrCode>(0);
  natsStatus s = js_GetStreamInfo(&si, js, stream_name_.c_str(), nullptr, &jerr);
  if (s != NATS_OK) {
    jsCtx_Destroy(js);
    log::warn("replica sync: history stream info").kv("error", js_error(s, jerr));
    return jerr == JSStreamNotFoundErr ? ReplayResult::kUnavailable : ReplayResult::kError;
  }
  const uint64_t last_seq = si->State.LastSeq;
  const bool nothing =
      si->State.Msgs == 0 || (since_us > 0 && si->State.LastTime < since_us * 1000);
  jsStreamInfo_Destroy(si);
  if (nothing) {
    jsCtx_Destroy(js);
    return ReplayResult::kOk;
  }
  jsSubOptions so;
  jsSubOptions_Init(&so);
  so.Stream = stream_name_.c_str();
  so.Ordered = true;  // ephemeral, in order, no acks
  if (since_us > 0) {
    so.Config.DeliverPolicy = js_DeliverByStartTime;
    so.Config.OptStartTime = since_us * 1000;
  } else {
    so.Config.DeliverPolicy = js_DeliverAll;
  }
  natsSubscription* sub = nullptr;
  s = js_SubscribeSync(&sub, js, chains_subject_.c_str(), &o, &so, &jerr);
  if (s != NATS_OK) {
    jsCtx_Destroy(js);
    log::warn("replica sync: history consumer").kv("error", js_error(s, jerr));
    return ReplayResult::kError;
  }
  natsSubscription_SetPendingLimits(sub, 65536, 64 * 1024 * 1024);
  const auto deadline = Clock::now() + config_.replay_timeout;
  for (;;) {
    {
      std::lock_guard lock(hist_mu_);
      if (hist_stopping_) {
        result = ReplayResult::kError;
        break;
      }
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      result = ReplayResult::kTimeout;
      break;
    }
    natsMsg* msg = nullptr;
    s = natsSubscription_NextMsg(&msg, sub, std::min<int64_t>(left, 250));
    if (s == NATS_TIMEOUT) {
      if (!connected_.load()) {
        result = ReplayResult::kError;
        break;
      }
      continue;
    }
    if (s != NATS_OK) {
      result = ReplayResult::kError;
      break;
    }
    uint64_t seq = 0, pending = 1;
    jsMsgMetaData* meta = nullptr;
    if (natsMsg_GetMetaData(&meta, msg) == NATS_OK) {
      seq = meta->Sequence.Stream;
      pending = meta->NumPending;
      jsMsgMetaData_Destroy(meta);
    }
    const int len = natsMsg_GetDataLength(msg);
    if (len > 0) handle(std::string_view(natsMsg_GetData(msg), static_cast<size_t>(len)), &target);
    natsMsg_Destroy(msg);
    if (seq >= last_seq || pending == 0) break;  // caught up
  }
  natsSubscription_Unsubscribe(sub);  // (deletes the ephemeral consumer)
  natsSubscription_Destroy(sub);
  jsCtx_Destroy(js);
  return result;
}

std::string redact_url(std::string_view urls) {
  // nats://user:password@host:4222,... -> nats://***@host:4222,...
  std::string out;
  size_t at = 0;
  while (at <= urls.size()) {
    size_t comma = urls.find(',', at);
    std::string_view one = urls.substr(at, comma == std::string_view::npos ? comma : comma - at);
    const size_t scheme = one.find("://");
    const size_t amp = one.rfind('@');
    if (!out.empty()) out += ",";
    if (scheme != std::string_view::npos && amp != std::string_view::npos && amp > scheme) {
      out += std::string(one.substr(0, scheme + 3)) + "***" + std::string(one.substr(amp));
    } else {
      out += std::string(one);
    }
    if (comma == std::string_view::npos) break;
    at = comma + 1;
  }
  return out;
}

std::string Sync::status_json() const {
  std::string out = "{\"url\":" + json::quote(redact_url(config_.url)) +
                    ",\"connected\":" + (connected() ? "true" : "false") +
                    ",\"history\":" + (history() ? "true" : "false") +
                    ",\"peers\":" + std::to_string(peers()) +
                    ",\"replica\":" + json::quote(config_.name) + "}";
  return out;
}

}  // namespace kvgate::replica
