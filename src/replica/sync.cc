// replica/sync: see sync.h.
#include "replica/sync.h"

#include <nats/nats.h>

#include <algorithm>
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
      inventory_subject_(config_.subject + ".inventory") {
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
  messages_ = &r.counter("kvgate_replica_sync_messages_total",
                         "Replica sync messages sent and received, by kind (chains, load)",
                         {"direction", "kind"});
  bytes_ = &r.counter("kvgate_replica_sync_bytes_total",
                      "Bytes of replica sync messages sent and received (payloads)", {"direction"});
  records_ = &r.counter("kvgate_replica_sync_records_total",
                        "Peers' records (cache_aware chains, kv_exact predictions) by what became "
                        "of them: applied, or dropped (no rule of that name here, malformed, "
                        "chunk size differs, index full)",
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
  r.add_collector([this] {
    std::lock_guard lock(load_mu_);
    for (const auto& [key, t] : tracked_) {
      peer_inflight_->with({t.worker->url()}).set(static_cast<double>(t.worker->peer_inflight()));
    }
  });
  bootstraps_ = &r.counter("kvgate_replica_inventory_requests_total",
                           "kv_exact sources this replica asked its peers for (bootstrap), by "
                           "result: warm (a peer's whole inventory taken), cold (no peer had it "
                           "complete), no_peer (no other replica heard from), unavailable (NATS "
                           "not connected); and answers it served (served_warm, served_cold)",
                           {"result"});
  errors_ = &r.counter("kvgate_replica_sync_errors_total",
                       "Replica sync failures by reason (publish, decode, queue_full)", {"reason"});
}

Sync::~Sync() {
  stop();
}

std::string Sync::start() {
  natsOptions* opts = nullptr;
  natsStatus s = natsOptions_Create(&opts);
  auto fail = [&](std::string what) {
    if (opts) natsOptions_Destroy(opts);
    return what + ": " + natsStatus_GetText(s);
  };
  if (s != NATS_OK) return fail("nats options");
  if ((s = natsOptions_SetURL(opts, config_.url.c_str())) != NATS_OK) {
    return fail("--replica-sync '" + config_.url + "' is not a NATS URL list");
  }
  natsOptions_SetName(opts, config_.name.c_str());
  natsOptions_SetNoEcho(opts, true);  // this replica applied its own records already
  natsOptions_SetMaxReconnect(opts, -1);
  natsOptions_SetReconnectWait(opts, 250);
  natsOptions_SetTimeout(opts, 2000);
  natsOptions_SetPingInterval(opts, 2000);
  natsOptions_SetMaxPingsOut(opts, 2);
  natsOptions_SetDisconnectedCB(opts, &Sync::on_disconnected, this);
  natsOptions_SetReconnectedCB(opts, &Sync::on_reconnected, this);
  // Not there yet: keep trying in the background (routing does not wait for NATS).
  natsOptions_SetRetryOnFailedConnect(opts, true, &Sync::on_reconnected, this);
  s = natsConnection_Connect(&nc_, opts);
  natsOptions_Destroy(opts);
  opts = nullptr;
  if (s == NATS_OK) {
    connected_ = true;
  } else if (s != NATS_NOT_YET_CONNECTED) {
    nc_ = nullptr;
    return std::string("--replica-sync ") + config_.url + ": " + natsStatus_GetText(s);
  } else {
    log::warn("replica sync: NATS not reachable yet; routing on this replica's state until it is")
        .kv("url", config_.url);
  }
  if (connected_gauge_) connected_gauge_->set(connected_ ? 1 : 0);
  for (const std::string* subject : {&chains_subject_, &load_subject_}) {
    natsSubscription* sub = nullptr;
    s = natsConnection_Subscribe(&sub, nc_, subject->c_str(), &Sync::on_message, this);
    if (s != NATS_OK) {
      return "--replica-sync: subscribing to " + *subject + ": " + natsStatus_GetText(s);
    }
    // Bounded: a replica that cannot keep up drops (counted by libnats) rather than grow.
    natsSubscription_SetPendingLimits(sub, 65536, 64 * 1024 * 1024);
    subs_.push_back(sub);
  }
  {
    natsSubscription* sub = nullptr;
    s = natsConnection_Subscribe(&sub, nc_, inventory_subject_.c_str(), &Sync::on_inventory, this);
    if (s != NATS_OK) {
      return "--replica-sync: subscribing to " + inventory_subject_ + ": " + natsStatus_GetText(s);
    }
    natsSubscription_SetPendingLimits(sub, 1024, 16 * 1024 * 1024);
    subs_.push_back(sub);
  }
  started_at_ = Clock::now();
  thread_ = std::thread([this] { run(); });
  log::info("replica sync started")
      .kv("url", config_.url)
      .kv("subject", config_.subject)
      .kv("replica", config_.name)
      .kv("connected", connected_.load());
  return "";
}

void Sync::stop() {
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (natsSubscription* sub : subs_) {
    natsSubscription_Unsubscribe(sub);
    natsSubscription_Destroy(sub);
  }
  subs_.clear();
  if (nc_) {
    natsConnection_FlushTimeout(nc_, 500);
    natsConnection_Destroy(nc_);  // closes, and waits for its callbacks to end
    nc_ = nullptr;
  }
  std::lock_guard lock(load_mu_);
  for (auto& [key, t] : tracked_) t.worker->set_peer_inflight(0);
  peers_.clear();
  rank_sums_.clear();
}

void Sync::on_disconnected(natsConnection*, void* self) {
  auto* s = static_cast<Sync*>(self);
  if (s->connected_.exchange(false)) {
    if (s->disconnects_) s->disconnects_->inc();
    log::warn("replica sync: NATS connection lost; routing on this replica's state")
        .kv("url", s->config_.url);
  }
  if (s->connected_gauge_) s->connected_gauge_->set(0);
}

void Sync::on_reconnected(natsConnection*, void* self) {
  auto* s = static_cast<Sync*>(self);
  if (!s->connected_.exchange(true))
    log::info("replica sync: connected to NATS").kv("url", s->config_.url);
  if (s->connected_gauge_) s->connected_gauge_->set(1);
  // Peers hear this replica's load at once rather than at the next heartbeat.
  {
    std::lock_guard lock(s->mu_);
    s->last_load_ = {};
  }
  s->cv_.notify_all();
}

void Sync::on_message(natsConnection*, natsSubscription*, natsMsg* msg, void* self) {
  auto* s = static_cast<Sync*>(self);
  std::string_view data(natsMsg_GetData(msg), static_cast<size_t>(natsMsg_GetDataLength(msg)));
  s->handle(data);
  natsMsg_Destroy(msg);
}

void Sync::handle(std::string_view data) {
  if (bytes_) bytes_->with({"in"}).inc(data.size());
  Header h;
  if (std::string e = decode_header(data, h); !e.empty()) {
    if (errors_) errors_->with({"decode"}).inc();
    static log::RateLimit limit(5, std::chrono::seconds(10));
    log::warn(limit, "replica sync: message dropped").kv("error", e);
    return;
  }
  if (h.replica == id_) return;  // (no_echo makes this rare: a second connection of ours)
  if (h.kind == Kind::kLoad) {
    LoadReport report;
    if (std::string e = decode_load(data, report); !e.empty()) {
      if (errors_) errors_->with({"decode"}).inc();
      return;
    }
    if (messages_) messages_->with({"in", "load"}).inc();
    apply_load(h, std::move(report));
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
  if (messages_) messages_->with({"in", "chains"}).inc();
  const int64_t now = now_us();
  std::shared_lock lock(sinks_mu_);
  for (const ChainRecord& r : records) {
    bool applied = false;
    for (const auto& [token, entry] : sinks_) {
      if (entry.rule != r.rule) continue;
      entry.sink(r);
      applied = true;
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
    if (pending_.size() < config_.batch_records) return;
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
  auto* s = static_cast<Sync*>(self);
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
    if (answered) {
      auto parts = encode_inventory_reply(Header{.replica = s->id_, .sent_us = now_us()}, req,
                                          snap.has_value(), snap ? snap->seq : 0,
                                          snap ? snap->data : kv::SourceExport{});
      for (const auto& part : parts) {
        natsConnection_Publish(s->nc_, reply, part.data(), static_cast<int>(part.size()));
      }
      if (s->bootstraps_) s->bootstraps_->with({snap ? "served_warm" : "served_cold"}).inc();
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
  std::unique_lock lock(sinks_mu_);
  uint64_t token = next_sink_++;
  sinks_.emplace(token, SinkEntry{rule, std::move(sink)});
  return token;
}

void Sync::remove_sink(uint64_t token) {
  std::unique_lock lock(sinks_mu_);  // waits for a delivery in progress
  sinks_.erase(token);
}

void Sync::track(const WorkerPtr& w) {
  std::lock_guard lock(load_mu_);
  const uint64_t key = worker_key(w->url());
  Tracked& t = tracked_[key];
  if (t.count++ == 0) {
    t.worker = w;
    t.published = -1;
    resum({key});
  }
}

void Sync::untrack(const Worker& w) {
  std::lock_guard lock(load_mu_);
  auto it = tracked_.find(worker_key(w.url()));
  if (it == tracked_.end() || --it->second.count > 0) return;
  it->second.worker->set_peer_inflight(0);
  if (peer_inflight_) peer_inflight_->remove({it->second.worker->url()});
  tracked_.erase(it);
}

size_t Sync::peers() const {
  std::lock_guard lock(load_mu_);
  return peers_.size();
}

void Sync::apply_load(const Header& h, LoadReport report) {
  std::vector<std::pair<RankKey, RankLoad>> changed;
  {
    std::lock_guard lock(load_mu_);
    Peer& p = peers_[h.replica];
    if (p.seq != 0 && report.seq <= p.seq) return;  // an older report arriving late
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
    if (peers_gauge_) peers_gauge_->set(static_cast<double>(peers_.size()));
    resum(keys);
    resum_ranks(rank_keys, changed);
    // Told under load_mu_: two reports (or a report and an expiry) are told in the order they
    // were summed, so a stale sum never lands last.
    tell_rank_sinks(changed);
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

void Sync::tell_rank_sinks(const std::vector<std::pair<RankKey, RankLoad>>& changed) {
  if (changed.empty()) return;
  std::shared_lock lock(rank_mu_);
  for (const auto& [token, reg] : rank_regs_) {
    for (const auto& [k, sum] : changed) reg.hear(k.worker, k.rank, sum);
  }
}

uint64_t Sync::add_rank_load(RankLoadProvider provide, RankLoadSink hear) {
  std::unique_lock lock(rank_mu_);
  const uint64_t token = next_rank_reg_++;
  rank_regs_.emplace(token, RankReg{std::move(provide), std::move(hear)});
  return token;
}

void Sync::remove_rank_load(uint64_t token) {
  std::unique_lock lock(rank_mu_);
  rank_regs_.erase(token);
}

Sync::RankLoad Sync::peer_rank_load(uint64_t worker, int32_t rank) const {
  std::lock_guard lock(load_mu_);
  auto it = rank_sums_.find(RankKey{worker, rank});
  return it == rank_sums_.end() ? RankLoad{} : it->second;
}

void Sync::resum(const std::vector<uint64_t>& keys) {
  for (uint64_t key : keys) {
    auto it = tracked_.find(key);
    if (it == tracked_.end()) continue;
    int64_t sum = 0;
    for (const auto& [id, peer] : peers_) {
      auto f = peer.inflight.find(key);
      if (f != peer.inflight.end()) sum += f->second;
    }
    it->second.worker->set_peer_inflight(sum);
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
      for (const auto& [key, n] : it->second.inflight) keys.push_back(key);
      for (const auto& [key, n] : it->second.ranks) rank_keys.push_back(key);
      it = peers_.erase(it);
    }
    if (!keys.empty()) resum(keys);
    if (!rank_keys.empty()) resum_ranks(rank_keys, changed);
    if (peers_gauge_) peers_gauge_->set(static_cast<double>(peers_.size()));
    tell_rank_sinks(changed);
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
    msg.clear();
    const size_t n = std::min(rest.size(), kMaxRecords);
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
    for (auto& [key, t] : tracked_) {
      t.published = t.worker->inflight();
      report.entries.push_back({.worker = key, .rank = -1, .inflight = t.published});
    }
    report.entries.insert(report.entries.end(), merged.begin(), merged.end());
    last_ranks_ = std::move(merged);
  }
  std::string msg;
  encode_load(Header{.kind = Kind::kLoad, .replica = id_, .sent_us = now_us()}, report, msg);
  send(load_subject_, msg, "load");
}

void Sync::run() {
  std::vector<ChainRecord> batch;
  std::unique_lock lock(mu_);
  auto next_load = Clock::now();
  while (!stopping_) {
    const auto now = Clock::now();
    auto wake = next_load;
    if (!pending_.empty()) wake = std::min(wake, first_pending_ + config_.batch);
    if (pending_.size() < config_.batch_records && now < wake) {
      cv_.wait_until(lock, wake);
      continue;
    }
    if (!pending_.empty() &&
        (pending_.size() >= config_.batch_records || now >= first_pending_ + config_.batch)) {
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

std::string Sync::status_json() const {
  std::string out = "{\"url\":" + json::quote(config_.url) +
                    ",\"connected\":" + (connected() ? "true" : "false") +
                    ",\"peers\":" + std::to_string(peers()) +
                    ",\"replica\":" + json::quote(config_.name) + "}";
  return out;
}

}  // namespace kvgate::replica
