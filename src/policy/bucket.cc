// policy/bucket: see bucket.h.
#include "policy/bucket.h"

#include <algorithm>

#include "prefix/approx_tree.h"

namespace kvgate {
namespace {
constexpr size_t kInitialMaxLength = 4096;  // initial bands split [0, 4096) evenly, as sgl does
}

BucketPolicy::BucketPolicy(const PolicyConfig& c)
    : abs_(c.balance_abs_threshold),
      rel_(c.balance_rel_threshold),
      window_(std::chrono::seconds(c.bucket_refit_secs)),
      rng_(c.seed) {}

void BucketPolicy::on_workers_changed(const WorkerSet& set) {
  std::lock_guard lock(mu_);
  levels_.clear();
  level_slot_.clear();
  levels_generation_ = 0;
  ids_.clear();
  for (const auto& w : set.workers) ids_.push_back(w->id());
  upper_.clear();
  if (ids_.size() > 1) {
    size_t gap = kInitialMaxLength / ids_.size();
    for (size_t i = 1; i < ids_.size(); ++i) upper_.push_back(i * gap);
  }
}

uint64_t BucketPolicy::band_owner(size_t chars) const {
  if (ids_.empty()) return 0;
  size_t band =
      static_cast<size_t>(std::upper_bound(upper_.begin(), upper_.end(), chars) - upper_.begin());
  return ids_[std::min(band, ids_.size() - 1)];
}

void BucketPolicy::expire(Clock::time_point now) {
  while (!sent_.empty() && now - sent_.front().at > window_) {
    add_chars(sent_.front().worker, -static_cast<int64_t>(sent_.front().chars));
    sent_.pop_front();
  }
}

void BucketPolicy::add_chars(uint64_t worker, int64_t delta) {
  int64_t& c = chars_[worker];
  const int64_t from = c;
  c += delta;
  auto slot = level_slot_.find(worker);
  if (delta == 0 || slot == level_slot_.end()) return;
  auto level = levels_.find(from);
  std::vector<uint64_t>& v = level->second;
  level_slot_[v.back()] = slot->second;
  v[slot->second] = v.back();
  v.pop_back();
  if (v.empty()) levels_.erase(level);
  std::vector<uint64_t>& to = levels_[c];
  slot->second = to.size();
  to.push_back(worker);
}

void BucketPolicy::index_levels(const AvailableSet& set) {
  if (levels_generation_ == set.generation) return;
  levels_.clear();
  level_slot_.clear();
  for (Worker* w : set.workers) {
    auto it = chars_.find(w->id());
    std::vector<uint64_t>& v = levels_[it == chars_.end() ? 0 : it->second];
    level_slot_[w->id()] = v.size();
    v.push_back(w->id());
  }
  levels_generation_ = set.generation;
}

Decision BucketPolicy::select(std::span<Worker* const> available, RouteContext& ctx) {
  size_t len = ctx.request ? prefix::count_chars(ctx.request->text) : 0;
  std::lock_guard lock(mu_);
  expire(Clock::now());
  if (ctx.candidates.describes(available)) {
    // The same decisions by the workers' levels of characters (no look at every worker).
    const AvailableSet& set = *ctx.candidates.set;
    index_levels(set);
    if (imbalanced({levels_.begin()->first, levels_.rbegin()->first}, abs_, rel_)) {
      const std::vector<uint64_t>& fewest = levels_.begin()->second;
      return {set.find(fewest[rng_.below(fewest.size())]), std::nullopt, "imbalanced", 0};
    }
    if (Worker* w = set.find(band_owner(len))) return {w, std::nullopt, "band", 0};
    return {least_inflight(available, ctx, rng_), std::nullopt, "band_unavailable", 0};
  }
  auto window_chars = [this](const Worker* w) {
    auto it = chars_.find(w->id());
    return it == chars_.end() ? int64_t{0} : it->second;
  };
  if (imbalanced(load_spread(available, window_chars), abs_, rel_)) {
    return {least_loaded(available, rng_, window_chars), std::nullopt, "imbalanced", 0};
  }
  if (Worker* w = find_available(available, band_owner(len))) return {w, std::nullopt, "band", 0};
  return {least_loaded(available, rng_, inflight_load), std::nullopt, "band_unavailable", 0};
}

void BucketPolicy::on_dispatched(const Decision& d, RouteContext& ctx) {
  size_t len = ctx.request ? prefix::count_chars(ctx.request->text) : 0;
  std::lock_guard lock(mu_);
  sent_.push_back({Clock::now(), len, d.worker->id()});
  add_chars(d.worker->id(), static_cast<int64_t>(len));
}

void BucketPolicy::refit(Clock::time_point now) {
  std::lock_guard lock(mu_);
  expire(now);
  if (ids_.size() < 2 || sent_.empty()) return;
  std::vector<size_t> lengths;
  lengths.reserve(sent_.size());
  size_t total = 0;
  for (const auto& s : sent_) {
    lengths.push_back(s.chars);
    total += s.chars;
  }
  if (total == 0) return;
  std::sort(lengths.begin(), lengths.end());
  // Cut where the cumulative characters reach k/n of the total: each band gets an equal share.
  std::vector<size_t> cuts;
  size_t cumulative = 0, k = 1;
  for (size_t len : lengths) {
    cumulative += len;
    while (k < ids_.size() && cumulative * ids_.size() >= total * k) {
      cuts.push_back(len + 1);  // this length still belongs to band k-1
      ++k;
    }
  }
  while (cuts.size() < ids_.size() - 1) cuts.push_back(cuts.empty() ? 1 : cuts.back() + 1);
  for (size_t i = 1; i < cuts.size(); ++i) cuts[i] = std::max(cuts[i], cuts[i - 1] + 1);
  upper_ = std::move(cuts);
}

std::vector<size_t> BucketPolicy::boundaries() const {
  std::lock_guard lock(mu_);
  return upper_;
}

}  // namespace kvgate
