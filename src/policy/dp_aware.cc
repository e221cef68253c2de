// policy/dp_aware: see dp_aware.h.
#include "policy/dp_aware.h"

#include <algorithm>

#include "policy/common.h"
#include "policy/registry.h"
#include "util/log.h"

namespace kvgate {

DpAwarePolicy::DpAwarePolicy(const PolicyConfig& config, std::unique_ptr<Policy> inner)
    : rule_(config.rule),
      default_ranks_(std::clamp<int64_t>(config.dp_default_ranks, 1, Worker::kMaxDpRanks)),
      inner_(std::move(inner)) {
  if (config.registry) {
    dispatched_ = &config.registry->counter(
        "kvgate_dp_rank_dispatched_total",
        "Attempts dispatched to each data-parallel rank of each worker (--dp-aware)",
        {"rule", "worker", "rank"});
    ranks_gauge_ = &config.registry->gauge(
        "kvgate_dp_ranks",
        "Data-parallel ranks kvgate routes to on each worker (--dp-aware): its /server_info "
        "dp_size, else kvDpRankCount",
        {"rule", "worker"});
  }
}

int64_t DpAwarePolicy::ranks_wanted(const Worker& w) const {
  return std::clamp<int64_t>(w.dp_size().value_or(default_ranks_), 1, Worker::kMaxDpRanks);
}

std::shared_ptr<DpAwarePolicy::Offer> DpAwarePolicy::offer_for(uint64_t generation,
                                                               std::span<Worker* const> available) {
  {
    std::lock_guard lock(offer_mu_);
    if (offer_ && offer_->generation == generation && offer_->version == version_.load()) {
      return offer_;
    }
  }
  auto offer = std::make_shared<Offer>();
  offer->generation = generation;
  auto targets = std::make_shared<WorkerSet>();
  {
    std::shared_lock lock(mu_);
    offer->version = version_.load();
    for (Worker* w : available) {
      auto it = ranks_.find(w->id());
      if (it == ranks_.end()) continue;
      for (const auto& t : it->second) targets->workers.push_back(t);
    }
  }
  if (targets->workers.empty()) return nullptr;
  offer->index = std::make_unique<AvailabilityIndex>(std::move(targets));
  offer->set = offer->index->current(Clock::now());
  std::lock_guard lock(offer_mu_);
  offer_ = offer;
  return offer;
}

Decision DpAwarePolicy::select(std::span<Worker* const> available, RouteContext& ctx) {
  if (ctx.candidates.describes(available)) {
    // The pool's index gave the workers: the rank targets offered for that set are kept (one
    // list and index of their own per set of available workers, not one per request).
    std::shared_ptr<Offer> offer = offer_for(ctx.candidates.set->generation, available);
    // As below, the inner policy decides while the targets hold still; an offer older than the
    // targets (rebuilt since it was taken) is not used: its targets may be gone from by_id_.
    std::shared_lock lock(mu_);
    if (offer && offer->version == version_.load() &&
        offer->set->workers.size() == offer->index->workers().workers.size()) {
      struct Restore {
        RouteContext& ctx;
        Candidates outer;
        ~Restore() { ctx.candidates = outer; }
      } restore{ctx, ctx.candidates};
      ctx.candidates = Candidates{offer->set.get(), offer->index.get()};
      Decision inner = inner_->select(offer->set->workers, ctx);
      ctx.candidates = restore.outer;
      return from_inner(inner, available, ctx);
    }
  }
  // The rank targets of the available workers (reused per thread: no allocation per request).
  thread_local std::vector<Worker*> offered;
  offered.clear();
  std::shared_lock lock(mu_);
  for (Worker* w : available) {
    auto it = ranks_.find(w->id());
    if (it == ranks_.end()) continue;
    for (const auto& t : it->second) offered.push_back(t.get());
  }
  if (offered.empty()) {
    // Workers published before this policy heard of them (a rule's endpoints changing): sent
    // whole, the engine picks the rank; the inner policy hears nothing of it.
    lock.unlock();
    thread_local PolicyRng rng(0);
    return {least_inflight(available, ctx, rng), std::nullopt, "dp_aware_unlisted", 0};
  }
  Decision inner = inner_->select(offered, ctx);
  return from_inner(inner, available, ctx);
}

Decision DpAwarePolicy::from_inner(const Decision& inner, std::span<Worker* const> available,
                                   const RouteContext& ctx) const {
  if (inner.worker == nullptr) return inner;
  auto it = by_id_.find(inner.worker->id());
  if (it == by_id_.end()) return {nullptr, std::nullopt, "dp_aware_unknown_target", 0};
  const Target& t = it->second;
  Decision d = inner;
  d.worker = find_available(available, ctx, t.worker_id);
  d.dp_rank = t.rank;
  d.target_id = t.target->id();
  d.inner_branch = {};
  return d;
}

WorkerPtr DpAwarePolicy::find(uint64_t target_id) const {
  if (target_id == 0) return nullptr;
  std::shared_lock lock(mu_);
  auto it = by_id_.find(target_id);
  if (it == by_id_.end()) return nullptr;
  return it->second.target;
}

void DpAwarePolicy::on_dispatched(const Decision& d, RouteContext& ctx) {
  WorkerPtr t;
  {
    // Counted in flight under the lock the pruning takes: a target found here is not dropped
    // until its on_completed.
    std::shared_lock lock(mu_);
    auto it = by_id_.find(d.target_id);
    if (d.target_id == 0 || it == by_id_.end()) return;
    t = it->second.target;
    t->begin_request();
  }
  Decision inner = d;
  inner.worker = t.get();
  inner.dp_rank.reset();
  inner.target_id = 0;
  try {
    inner_->on_dispatched(inner, ctx);
  } catch (...) {
    t->end_request();  // the gateway calls no on_completed for a dispatch that did not open
    throw;
  }
  if (dispatched_ && d.dp_rank) {
    dispatched_->with({rule_, d.worker->url(), std::to_string(*d.dp_rank)}).inc();
  }
}

void DpAwarePolicy::on_completed(const Decision& d, RouteContext& ctx, const Outcome& o) {
  WorkerPtr t = find(d.target_id);
  if (!t) return;  // never dispatched to the inner policy (see on_dispatched)
  Decision inner = d;
  inner.worker = t.get();
  inner.dp_rank.reset();
  inner.target_id = 0;
  struct End {  // whatever the inner policy does, the target leaves flight
    Worker& w;
    ~End() { w.end_request(); }
  } end{*t};
  inner_->on_completed(inner, ctx, o);
}

void DpAwarePolicy::on_first_token(const Decision& d, RouteContext& ctx) {
  WorkerPtr t = find(d.target_id);
  if (!t) return;
  Decision inner = d;
  inner.worker = t.get();
  inner.dp_rank.reset();
  inner.target_id = 0;
  inner_->on_first_token(inner, ctx);
}

void DpAwarePolicy::on_workers_changed(const WorkerSet& set) {
  std::lock_guard lock(change_mu_);
  workers_ = set.workers;
  refresh(true);
}

void DpAwarePolicy::on_period() {
  {
    std::lock_guard lock(change_mu_);
    refresh(false);
  }
  auto inner_period = inner_->period();
  if (inner_period.count() <= 0) return;
  auto now = std::chrono::steady_clock::now();
  bool due = false;
  {
    std::lock_guard lock(change_mu_);
    if (next_inner_period_ == std::chrono::steady_clock::time_point{}) {
      next_inner_period_ = now + inner_period;  // as often as the inner policy alone would run
    } else if (now >= next_inner_period_) {
      next_inner_period_ = now + inner_period;
      due = true;
    }
  }
  if (due) inner_->on_period();
}

void DpAwarePolicy::refresh(bool force) {
  // Does any worker want another number of ranks than its targets have?
  bool rebuild = force;
  if (!rebuild) {
    std::shared_lock lock(mu_);
    for (const auto& w : workers_) {
      auto it = ranks_.find(w->id());
      if (it == ranks_.end() || static_cast<int64_t>(it->second.size()) != ranks_wanted(*w)) {
        rebuild = true;
        break;
      }
    }
  }
  if (rebuild) {
    // The new targets: a rank that still exists keeps its target (and the inner policy's state
    // of it); new ranks get new targets; the rest retire.
    std::unordered_map<uint64_t, std::vector<WorkerPtr>> next;
    std::vector<Target> created;
    std::unordered_map<uint64_t, int64_t> built;  // worker id -> ranks
    {
      std::shared_lock lock(mu_);
      for (const auto& w : workers_) {
        int64_t n = ranks_wanted(*w);
        built[w->id()] = n;
        auto& v = next[w->id()];
        auto old = ranks_.find(w->id());
        for (int64_t r = 0; r < n; ++r) {
          if (old != ranks_.end() && r < static_cast<int64_t>(old->second.size())) {
            v.push_back(old->second[static_cast<size_t>(r)]);
            continue;
          }
          http::Target t = w->target();
          t.url = w->url() + "@" + std::to_string(r);
          auto target = std::make_shared<Worker>(next_id_++, std::move(t), BreakerConfig{});
          target->set_healthy(true);  // its worker's availability is checked, not its own
          created.push_back({target, w->id(), w->url(), static_cast<int>(r), true});
          v.push_back(std::move(target));
        }
        if (old == ranks_.end() || static_cast<int64_t>(old->second.size()) != n) {
          log::info("dp-aware: worker targets rebuilt")
              .kv("worker", w->url())
              .kv("ranks", n)
              .kv("from", w->dp_size() ? "server_info dp_size" : "default (kvDpRankCount)");
        }
      }
    }
    // The inner policy learns the new targets before requests are offered them.
    WorkerSet inner_set;
    for (const auto& w : workers_) {
      for (const auto& t : next[w->id()]) inner_set.workers.push_back(t);
    }
    inner_->on_workers_changed(inner_set);
    std::unique_lock lock(mu_);
    for (auto& t : created) {
      uint64_t id = t.target->id();
      by_id_.emplace(id, std::move(t));
    }
    ranks_ = std::move(next);
    version_.fetch_add(1);  // the offers made from the old targets are stale
    for (auto& [id, t] : by_id_) {
      auto it = ranks_.find(t.worker_id);
      t.live = it != ranks_.end() && t.rank < static_cast<int>(it->second.size()) &&
               it->second[static_cast<size_t>(t.rank)]->id() == id;
    }
    lock.unlock();
    if (ranks_gauge_) {
      std::unordered_map<uint64_t, std::string> now;
      for (const auto& w : workers_) {
        now[w->id()] = w->url();
        ranks_gauge_->with({rule_, w->url()}).set(static_cast<double>(built[w->id()]));
      }
      for (const auto& [id, url] : gauged_) {
        if (!now.contains(id)) ranks_gauge_->remove({rule_, url});
      }
      gauged_ = std::move(now);
    }
  }
  std::vector<WorkerPtr> dropped;  // destroyed after the lock is released
  {
    std::unique_lock lock(mu_);
    for (auto it = by_id_.begin(); it != by_id_.end();) {
      if (!it->second.live && it->second.target->inflight() == 0) {
        dropped.push_back(std::move(it->second.target));
        it = by_id_.erase(it);
      } else {
        ++it;
      }
    }
  }
  // The ranks' reported load: each rank's own from /get_load, else an even share of its worker's.
  if (inner_->uses_reported_load()) {
    std::shared_lock lock(mu_);
    for (const auto& w : workers_) {
      auto it = ranks_.find(w->id());
      if (it == ranks_.end() || it->second.empty()) continue;
      const std::vector<WorkerPtr>& targets = it->second;
      std::vector<int64_t> loads = w->rank_loads();
      auto n = static_cast<int64_t>(targets.size());
      bool own = loads.size() >= targets.size();  // the worker reported every rank's load
      for (size_t r = 0; r < targets.size(); ++r) {
        targets[r]->set_reported_load(own ? loads[r] : w->reported_load() / n);
      }
    }
  }
}

std::optional<int64_t> DpAwarePolicy::ranks_of(uint64_t worker_id) const {
  std::shared_lock lock(mu_);
  auto it = ranks_.find(worker_id);
  if (it == ranks_.end()) return std::nullopt;
  return static_cast<int64_t>(it->second.size());
}

size_t DpAwarePolicy::targets() const {
  std::shared_lock lock(mu_);
  size_t n = 0;
  for (const auto& [id, v] : ranks_) n += v.size();
  return n;
}

size_t DpAwarePolicy::draining() const {
  std::shared_lock lock(mu_);
  size_t n = 0;
  for (const auto& [id, t] : by_id_) n += t.live ? 0 : 1;
  return n;
}

WorkerPtr DpAwarePolicy::target(uint64_t worker_id, int rank) const {
  std::shared_lock lock(mu_);
  auto it = ranks_.find(worker_id);
  if (it == ranks_.end() || rank < 0 || rank >= static_cast<int>(it->second.size())) return nullptr;
  return it->second[static_cast<size_t>(rank)];
}

}  // namespace kvgate
