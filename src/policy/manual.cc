// policy/manual: see manual.h.
#include "policy/manual.h"

#define XXH_INLINE_ALL  // header-only xxHash: no library to link
#include <xxhash.h>

#include <cstdio>

namespace kvgate {

ManualPolicy::ManualPolicy(const PolicyConfig& c)
    : mode_(c.manual_assignment_mode == "min_load"    ? Mode::kMinLoad
            : c.manual_assignment_mode == "min_group" ? Mode::kMinGroup
                                                      : Mode::kRandom),
      max_idle_(c.max_idle_secs),
      max_keys_(static_cast<size_t>(std::max<int64_t>(1, c.max_routing_keys))),
      rng_(c.seed) {
  if (c.registry) {
    keys_gauge_ = &c.registry
                       ->gauge("kvgate_manual_routing_keys",
                               "manual: routing keys held (at most --max-routing-keys)", {"rule"})
                       .with({c.rule});
    auto& evicted = c.registry->counter(
        "kvgate_manual_routing_keys_evicted_total",
        "manual: routing keys forgotten: capacity (--max-routing-keys held, the least recently "
        "used one made room), idle (unused for --max-idle-secs)",
        {"rule", "reason"});
    evicted_full_ = &evicted.with({c.rule, "capacity"});
    evicted_idle_ = &evicted.with({c.rule, "idle"});
  }
}

std::chrono::milliseconds ManualPolicy::period() const {
  return std::min<std::chrono::milliseconds>(max_idle_, std::chrono::seconds(60));
}

Worker* ManualPolicy::place(std::span<Worker* const> available, const RouteContext& ctx) {
  switch (mode_) {
    case Mode::kMinLoad:
      return least_inflight(available, ctx, rng_);
    case Mode::kMinGroup:
      return least_loaded(available, rng_, [this](const Worker* w) {
        auto it = group_size_.find(w->id());
        return it == group_size_.end() ? int64_t{0} : it->second;
      });
    case Mode::kRandom:
      break;
  }
  return available[rng_.below(available.size())];
}

void ManualPolicy::forget(Lru::iterator it) {
  auto group = group_size_.find(it->candidates[0]);
  if (group != group_size_.end() && --group->second <= 0) group_size_.erase(group);
  keys_.erase(std::string_view(it->key));
  lru_.erase(it);
}

void ManualPolicy::publish_size() {
  if (keys_gauge_) keys_gauge_->set(static_cast<double>(keys_.size()));
}

Decision ManualPolicy::select(std::span<Worker* const> available, RouteContext& ctx) {
  std::string_view header = routing_key(ctx);
  if (header.empty()) {
    return {available[rng_.below(available.size())], std::nullopt, "no_routing_key", 0};
  }
  // Keys are held by a fixed-size digest when long (a header may be 64 KiB): what the table can
  // hold is bounded in bytes as well as in count.
  // A digest starts with a byte no header value holds ('\n'), so no short key equals one.
  char digest[2 * sizeof(XXH128_hash_t) + 2];
  std::string_view key = header;
  if (header.size() > kMaxKeyBytes) {
    XXH128_hash_t h = XXH3_128bits(header.data(), header.size());
    std::snprintf(digest, sizeof digest, "\n%016llx%016llx",
                  static_cast<unsigned long long>(h.high64),
                  static_cast<unsigned long long>(h.low64));
    key = std::string_view(digest, 33);
  }
  std::lock_guard lock(mu_);
  auto now = Clock::now();
  auto found = keys_.find(key);
  if (found == keys_.end()) {
    if (keys_.size() >= max_keys_) {
      forget(std::prev(lru_.end()));
      if (evicted_full_) evicted_full_->inc();
    }
    Worker* w = place(available, ctx);
    lru_.push_front(Entry{.key = std::string(key), .candidates = {w->id(), 0}, .last_access = now});
    keys_.emplace(lru_.front().key, lru_.begin());
    ++group_size_[w->id()];
    publish_size();
    return {w, std::nullopt, "vacant", 0};
  }
  lru_.splice(lru_.begin(), lru_, found->second);  // now the most recently used
  Entry& e = *found->second;
  e.last_access = now;
  for (uint64_t id : e.candidates) {
    if (id == 0) continue;
    if (Worker* w = find_available(available, ctx, id)) return {w, std::nullopt, "occupied_hit", 0};
  }
  // Neither candidate is available: place again as the second candidate, keeping the first so the
  // key returns to it once it recovers.
  Worker* w = place(available, ctx);
  e.candidates[1] = w->id();
  return {w, std::nullopt, "occupied_miss", 0};
}

void ManualPolicy::expire(Clock::time_point now) {
  std::lock_guard lock(mu_);
  // Least recently used last: the idle keys are a suffix of the list.
  while (!lru_.empty() && now - lru_.back().last_access > max_idle_) {
    forget(std::prev(lru_.end()));
    if (evicted_idle_) evicted_idle_->inc();
  }
  publish_size();
}

size_t ManualPolicy::keys() const {
  std::lock_guard lock(mu_);
  return keys_.size();
}

}  // namespace kvgate
