// workers/worker: see worker.h.
#include "workers/worker.h"

#define XXH_INLINE_ALL  // header-only xxHash: no library to link
#include <xxhash.h>

#include "util/log.h"

namespace kvgate {

Worker::Worker(uint64_t id, http::Target target, BreakerConfig breaker)
    : id_(id),
      target_(std::move(target)),
      url_key_(XXH3_64bits(target_.url.data(), target_.url.size())),
      breaker_(breaker) {}

void Worker::set_healthy(bool h) {
  bool was = healthy_.exchange(h, std::memory_order_acq_rel);
  if (metrics_.health) metrics_.health->set(h ? 1 : 0);
  if (was != h) availability_changed();
}

void Worker::availability_changed() {
  std::lock_guard lock(listeners_mu_);
  for (const Listener& l : listeners_) l.l->availability_changed(l.cookie);
}

void Worker::begin_request() {
  {
    std::lock_guard lock(listeners_mu_);
    inflight_.fetch_add(1, std::memory_order_relaxed);
    for (const Listener& l : listeners_) l.l->inflight_changed(l.cookie, 1);
  }
  if (metrics_.inflight) metrics_.inflight->add(1);
  if (metrics_.requests) metrics_.requests->inc();
}

void Worker::end_request() {
  {
    std::lock_guard lock(listeners_mu_);
    inflight_.fetch_sub(1, std::memory_order_relaxed);
    for (const Listener& l : listeners_) l.l->inflight_changed(l.cookie, -1);
  }
  if (metrics_.inflight) metrics_.inflight->add(-1);
}

void Worker::set_echoed_inflight(int64_t n, int64_t from_us) {
  echoed_inflight_.set({std::max<int64_t>(0, n)}, from_us);
}

void Worker::set_peer_inflight(int64_t n, int64_t from_us) {
  n = std::max<int64_t>(0, n);
  std::lock_guard lock(listeners_mu_);
  const int64_t delta = n - peer_inflight();
  if (delta == 0) return;
  peer_inflight_.set({n}, from_us);
  for (const Listener& l : listeners_) l.l->inflight_changed(l.cookie, delta);
}

void Worker::add_listener(WorkerListener* l, uint32_t cookie, int64_t& inflight) {
  std::lock_guard lock(listeners_mu_);
  listeners_.push_back({l, cookie});
  inflight = fleet_inflight();
}

void Worker::remove_listener(WorkerListener* l) {
  std::lock_guard lock(listeners_mu_);
  std::erase_if(listeners_, [l](const Listener& x) { return x.l == l; });
}

CircuitBreaker::Pass Worker::admit(Clock::time_point now) {
  CircuitBreaker::Pass pass = breaker_.admit(now);
  // A trial taken (and an open breaker turned half-open by it): no other request can pass now.
  if (pass == CircuitBreaker::Pass::kTrial) availability_changed();
  return pass;
}

void Worker::set_reported_load(int64_t v) {
  reported_load_.store(v, std::memory_order_relaxed);
  if (metrics_.reported_load) metrics_.reported_load->set(static_cast<double>(v));
}

void Worker::publish_breaker(std::optional<BreakerState> changed) {
  if (!changed) return;
  availability_changed();
  if (metrics_.cb_state) metrics_.cb_state->set(static_cast<double>(*changed));
  log::Line(*changed == BreakerState::kOpen ? log::Level::kWarn : log::Level::kInfo,
            "circuit breaker changed")
      .kv("worker", url())
      .kv("state", to_string(*changed));
}

// A trial's outcome frees the half-open trial slot: another request may pass again.
void Worker::record_success(CircuitBreaker::Pass pass) {
  auto changed = breaker_.record_success(pass);
  publish_breaker(changed);
  if (!changed && pass == CircuitBreaker::Pass::kTrial) availability_changed();
}

void Worker::record_failure(CircuitBreaker::Pass pass, Clock::time_point now) {
  if (metrics_.failures) metrics_.failures->inc();
  auto changed = breaker_.record_failure(pass, now);
  publish_breaker(changed);
  if (!changed && pass == CircuitBreaker::Pass::kTrial) availability_changed();
}

void Worker::record_neutral(CircuitBreaker::Pass pass) {
  breaker_.record_neutral(pass);
  if (pass == CircuitBreaker::Pass::kTrial) availability_changed();
}

std::vector<std::string> Worker::models() const {
  std::lock_guard lock(models_mu_);
  return models_;
}

void Worker::set_models(std::vector<std::string> models) {
  std::lock_guard lock(models_mu_);
  models_ = std::move(models);
}

std::optional<KvEventsInfo> Worker::kv_events() const {
  std::lock_guard lock(models_mu_);
  return kv_events_;
}

void Worker::set_kv_events(std::optional<KvEventsInfo> info) {
  std::lock_guard lock(models_mu_);
  kv_events_ = std::move(info);
}

std::optional<int64_t> Worker::dp_size() const {
  std::lock_guard lock(models_mu_);
  return dp_size_;
}

void Worker::set_dp_size(std::optional<int64_t> n) {
  if (n && (*n < 1 || *n > kMaxDpRanks)) n.reset();
  std::lock_guard lock(models_mu_);
  dp_size_ = n;
}

std::vector<int64_t> Worker::rank_loads() const {
  std::lock_guard lock(models_mu_);
  return rank_loads_;
}

void Worker::set_rank_loads(std::vector<int64_t> loads) {
  if (loads.size() > static_cast<size_t>(kMaxDpRanks)) loads.resize(kMaxDpRanks);
  std::lock_guard lock(models_mu_);
  rank_loads_ = std::move(loads);
}

void Worker::attach_metrics(WorkerMetrics m) {
  metrics_ = m;
  if (metrics_.health) metrics_.health->set(healthy() ? 1 : 0);
  if (metrics_.cb_state) metrics_.cb_state->set(static_cast<double>(breaker_.state()));
}

size_t WorkerRegistry::healthy_count() const {
  auto set = snapshot();
  size_t n = 0;
  for (const auto& w : set->workers) n += w->healthy() ? 1 : 0;
  return n;
}

}  // namespace kvgate
