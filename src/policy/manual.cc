// policy/manual: see manual.h.
#include "policy/manual.h"

namespace kvgate {

ManualPolicy::ManualPolicy(const PolicyConfig& c)
    : mode_(c.manual_assignment_mode == "min_load"    ? Mode::kMinLoad
            : c.manual_assignment_mode == "min_group" ? Mode::kMinGroup
                                                      : Mode::kRandom),
      max_idle_(c.max_idle_secs),
      rng_(c.seed) {}

std::chrono::milliseconds ManualPolicy::period() const {
  return std::min<std::chrono::milliseconds>(max_idle_, std::chrono::seconds(60));
}

Worker* ManualPolicy::place(std::span<Worker* const> available) {
  switch (mode_) {
    case Mode::kMinLoad:
      return least_loaded(available, rng_, inflight_load);
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

Decision ManualPolicy::select(std::span<Worker* const> available, RouteContext& ctx) {
  std::string_view key = routing_key(ctx);
  if (key.empty()) {
    return {available[rng_.below(available.size())], std::nullopt, "no_routing_key", 0};
  }
  std::lock_guard lock(mu_);
  auto now = Clock::now();
  auto it = keys_.find(std::string(key));
  if (it == keys_.end()) {
    Worker* w = place(available);
    Entry e;
    e.candidates[0] = w->id();
    e.last_access = now;
    keys_.emplace(std::string(key), e);
    ++group_size_[w->id()];
    return {w, std::nullopt, "vacant", 0};
  }
  Entry& e = it->second;
  e.last_access = now;
  for (uint64_t id : e.candidates) {
    if (id == 0) continue;
    for (Worker* w : available) {
      if (w->id() == id) return {w, std::nullopt, "occupied_hit", 0};
    }
  }
  // Neither candidate is available: place again as the second candidate, keeping the first so the
  // key returns to it once it recovers.
  Worker* w = place(available);
  e.candidates[1] = w->id();
  return {w, std::nullopt, "occupied_miss", 0};
}

void ManualPolicy::expire(Clock::time_point now) {
  std::lock_guard lock(mu_);
  for (auto it = keys_.begin(); it != keys_.end();) {
    if (now - it->second.last_access > max_idle_) {
      --group_size_[it->second.candidates[0]];
      it = keys_.erase(it);
    } else {
      ++it;
    }
  }
}

size_t ManualPolicy::keys() const {
  std::lock_guard lock(mu_);
  return keys_.size();
}

}  // namespace kvgate
