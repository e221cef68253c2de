// workers/availability: see availability.h.
#include "workers/availability.h"

#include <algorithm>

namespace kvgate {
namespace {
std::atomic<uint64_t> next_generation{1};
}  // namespace

AvailabilityIndex::AvailabilityIndex(std::shared_ptr<const WorkerSet> workers)
    : workers_(std::move(workers)), current_(std::make_shared<const AvailableSet>()) {
  const size_t n = workers_->workers.size();
  level_.assign(n, 0);
  available_.assign(n, false);
  slot_.assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    int64_t inflight = 0;
    workers_->workers[i]->add_listener(this, static_cast<uint32_t>(i), inflight);
    std::lock_guard lock(mu_);
    level_[i] += inflight;  // a move told before this line is already in level_[i]
  }
}

AvailabilityIndex::~AvailabilityIndex() {
  for (const auto& w : workers_->workers) w->remove_listener(this);
}

void AvailabilityIndex::availability_changed(uint32_t) {
  dirty_.store(true, std::memory_order_release);
}

void AvailabilityIndex::inflight_changed(uint32_t pos, int64_t delta) {
  std::lock_guard lock(mu_);
  if (!available_[pos]) {
    level_[pos] += delta;
    return;
  }
  const int64_t from = level_[pos];
  unplace(pos);
  level_[pos] = from + delta;
  place(pos);
  total_ += delta;
  const int64_t to = level_[pos];
  if (to < min_) min_ = to;
  if (to > max_) max_ = to;
  if (delta == 1 || delta == -1) {
    // A move by one: an emptied extreme level's neighbour is the new extreme.
    if (from == min_ && bucket_[static_cast<size_t>(from)].empty()) min_ = to;
    if (from == max_ && bucket_[static_cast<size_t>(from)].empty()) max_ = to;
    return;
  }
  // Peers' loads (replica/sync.h) move by any amount: find the extremes again.
  bool first = true;
  for (size_t i = 0; i < level_.size(); ++i) {
    if (!available_[i]) continue;
    const int64_t l = std::max<int64_t>(0, level_[i]);
    min_ = first ? l : std::min(min_, l);
    max_ = first ? l : std::max(max_, l);
    first = false;
  }
}

void AvailabilityIndex::place(uint32_t pos) {
  // Levels are never negative: every move down follows one up, and the first level is the
  // worker's count when the index registered.
  auto level = static_cast<size_t>(std::max<int64_t>(0, level_[pos]));
  if (bucket_.size() <= level) bucket_.resize(level + 1);
  slot_[pos] = static_cast<uint32_t>(bucket_[level].size());
  bucket_[level].push_back(pos);
}

void AvailabilityIndex::unplace(uint32_t pos) {
  auto& b = bucket_[static_cast<size_t>(std::max<int64_t>(0, level_[pos]))];
  uint32_t last = b.back();
  b[slot_[pos]] = last;
  slot_[last] = slot_[pos];
  b.pop_back();
}

std::shared_ptr<const AvailableSet> AvailabilityIndex::current(Clock::time_point now) {
  const int64_t ticks = now.time_since_epoch().count();
  std::lock_guard lock(mu_);
  if (dirty_.load(std::memory_order_acquire) ||
      ticks >= deadline_.load(std::memory_order_relaxed)) {
    rebuild(now);
  }
  return current_;
}

void AvailabilityIndex::rebuild(Clock::time_point now) {
  // Cleared first: a change while this runs marks it again, and the next request rebuilds.
  dirty_.store(false, std::memory_order_release);
  auto set = std::make_shared<AvailableSet>();
  set->generation = next_generation.fetch_add(1, std::memory_order_relaxed);
  int64_t deadline = kNever;
  const auto& all = workers_->workers;
  for (auto& b : bucket_) b.clear();
  min_ = max_ = total_ = 0;
  bool first = true;
  for (size_t i = 0; i < all.size(); ++i) {
    Worker* w = all[i].get();
    bool up = w->available(now);
    available_[i] = up;
    if (!up) {
      if (w->healthy()) {
        if (auto from = w->breaker().passes_from()) {
          deadline = std::min<int64_t>(deadline, from->time_since_epoch().count());
        }
      }
      continue;
    }
    set->workers.push_back(w);
    set->by_id.emplace(w->id(), w);
    place(static_cast<uint32_t>(i));
    const int64_t l = level_[i];
    total_ += l;
    min_ = first ? l : std::min(min_, l);
    max_ = first ? l : std::max(max_, l);
    first = false;
  }
  deadline_.store(deadline, std::memory_order_relaxed);
  current_ = std::move(set);
}

std::optional<AvailabilityIndex::Spread> AvailabilityIndex::inflight(uint64_t generation) const {
  std::lock_guard lock(mu_);
  if (current_->generation != generation || current_->workers.empty()) return std::nullopt;
  return Spread{min_, max_, total_};
}

void CandidateList::list(AvailabilityIndex& index, std::span<const uint64_t> failed,
                         Clock::time_point now) {
  index_ = &index;
  set_ = index.current(now);
  list_ = set_->workers;
  if (failed.empty()) return;
  filtered_.clear();
  for (Worker* w : set_->workers) {
    if (std::find(failed.begin(), failed.end(), w->id()) == failed.end()) filtered_.push_back(w);
  }
  if (!filtered_.empty()) list_ = filtered_;  // else every worker failed once: all again
}

void CandidateList::clear() {
  set_.reset();
  list_ = {};
}

}  // namespace kvgate
