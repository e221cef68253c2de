// workers/availability: which workers of a pool (or of one side of a prefill/decode pool) could
// take a request now, kept as an immutable list that changes only when a worker's health or
// breaker does, so a request's first attempt lists its candidates without looking at every
// worker. Alongside it, the in-flight counts of the available workers (total, lowest, highest,
// and the least loaded with random ties), kept as dispatches open and close, so the policies that
// compare loads do not scan either.
//
// The list is what Worker::available(now) gives for each worker, in pool order, as of the last
// change: a worker tells the index (WorkerListener) when its health flips, its breaker changes
// state, and when a half-open breaker's trial slot is taken or freed; an open breaker's timeout
// passing is the one change that happens by the clock alone, so the index keeps the earliest such
// time and rebuilds once it is reached. Rebuilds are lazy (the first request after a change does
// it, O(workers)); a request between a change and its rebuild sees the list as it was, which is
// the same race as reading each worker's atomics a moment before the change (the breaker's pass,
// taken after the choice, stays the authority).
//
// Threads: any. One mutex guards the list and the loads (held for a rebuild, an in-flight move,
// or one load query).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "workers/worker.h"

namespace kvgate {

// The available workers as of one change, in pool order.
struct AvailableSet {
  std::vector<Worker*> workers;
  std::unordered_map<uint64_t, Worker*> by_id;
  uint64_t generation = 0;  // unique in the process: names this set (0: none)
  Worker* find(uint64_t id) const {
    auto it = by_id.find(id);
    return it == by_id.end() ? nullptr : it->second;
  }
};

class AvailabilityIndex final : private WorkerListener {
 public:
  // Listens to every worker of `workers` from here until destroyed. The workers may be any
  // Worker (a pool's servers, or dp_aware's rank targets).
  explicit AvailabilityIndex(std::shared_ptr<const WorkerSet> workers);
  ~AvailabilityIndex();
  AvailabilityIndex(const AvailabilityIndex&) = delete;
  AvailabilityIndex& operator=(const AvailabilityIndex&) = delete;

  // The available workers at `now` (rebuilt first when a worker changed since the last rebuild
  // or an open breaker's timeout has passed).
  std::shared_ptr<const AvailableSet> current(Clock::time_point now);
  const WorkerSet& workers() const { return *workers_; }

  // The in-flight requests of the workers of the available set `generation`: nullopt when the
  // index has been rebuilt since (the caller then counts them itself).
  struct Spread {
    int64_t min = 0;
    int64_t max = 0;
    int64_t total = 0;
  };
  std::optional<Spread> inflight(uint64_t generation) const;
  // One of the available workers with the fewest requests in flight, uniformly among equals
  // (`below(n)`: a random number in [0, n)); null when the index has moved past `generation`.
  template <class Below>
  Worker* least_inflight(uint64_t generation, Below&& below) const {
    std::lock_guard lock(mu_);
    if (current_->generation != generation || current_->workers.empty()) return nullptr;
    // (Levels move by one and never go negative, so the lowest level's bucket is not empty; if
    // that ever broke, the caller scans instead of indexing out of range.)
    if (min_ < 0 || static_cast<size_t>(min_) >= bucket_.size()) return nullptr;
    const std::vector<uint32_t>& b = bucket_[static_cast<size_t>(min_)];
    if (b.empty()) return nullptr;
    return workers_->workers[b[static_cast<size_t>(below(b.size()))]].get();
  }

 private:
  void availability_changed(uint32_t cookie) override;
  void inflight_changed(uint32_t pos, int64_t delta) override;
  void rebuild(Clock::time_point now);  // mu_ held
  void place(uint32_t pos);             // into its level's bucket (mu_ held)
  void unplace(uint32_t pos);           // out of it (mu_ held)

  static constexpr int64_t kNever = INT64_MAX;
  std::shared_ptr<const WorkerSet> workers_;
  std::atomic<bool> dirty_{true};
  std::atomic<int64_t> deadline_{kNever};  // an open breaker's timeout ends (steady ticks)
  mutable std::mutex mu_;
  std::shared_ptr<const AvailableSet> current_;
  // In-flight counts, per worker of the pool (by position), as the workers told them.
  std::vector<int64_t> level_;
  std::vector<bool> available_;                // by position, as of current_
  std::vector<uint32_t> slot_;                 // by position: its index in its level's bucket
  std::vector<std::vector<uint32_t>> bucket_;  // level -> positions of available workers
  int64_t min_ = 0, max_ = 0, total_ = 0;      // over the available workers
};

// What a policy's select() may use of the index (RouteContext::candidates): set by the gateway
// when the span it passes is the available set's own list (a first attempt), so lookups by id and
// load figures need no scan.
struct Candidates {
  const AvailableSet* set = nullptr;
  const AvailabilityIndex* index = nullptr;
  // True when `available` is this set's list (not a retry's filtered copy, nor a list a wrapper
  // built).
  bool describes(std::span<Worker* const> available) const {
    return set != nullptr && available.data() == set->workers.data() &&
           available.size() == set->workers.size();
  }
};

// One request's candidates for one attempt, on one side of its pool (what
// Gateway::Request::list_candidates makes): the index's available set as it stands (a first
// attempt: nothing copied, and the policy may use the index), or that set minus the workers that
// already failed the request (a retry; when every available worker failed once, all of them are
// tried again).
class CandidateList {
 public:
  void list(AvailabilityIndex& index, std::span<const uint64_t> failed, Clock::time_point now);
  void clear();
  std::span<Worker* const> workers() const { return list_; }
  bool empty() const { return list_.empty(); }
  // For RouteContext::candidates: describes workers() only when nothing was left out.
  Candidates view() const { return Candidates{set_.get(), index_}; }

 private:
  std::shared_ptr<const AvailableSet> set_;
  AvailabilityIndex* index_ = nullptr;
  std::vector<Worker*> filtered_;
  std::span<Worker* const> list_;
};

}  // namespace kvgate
