// policy/common: pieces several policies share: reproducible randomness, least-loaded choice with
// random tie-breaking, the imbalance test of cache_aware and bucket, the routing-key header.
#pragma once

#include <cstdint>
#include <mutex>
#include <span>
#include <string_view>

#include "policy/policy.h"
#include "util/random.h"

namespace kvgate {

// Random numbers for a policy: a fixed seed gives one reproducible sequence (tests, benchmarks);
// seed 0 uses the calling thread's generator (no lock).
class PolicyRng {
 public:
  explicit PolicyRng(uint64_t seed) : seed_(seed), seeded_(seed) {}
  uint64_t below(uint64_t n) {
    if (seed_ == 0) return thread_rng().below(n);
    std::lock_guard lock(mu_);
    return seeded_.below(n);
  }

 private:
  uint64_t seed_;
  std::mutex mu_;
  Rng seeded_;
};

// The first `chars` Unicode characters of UTF-8 text (the key prefix of chwbl and prefix_hash).
inline std::string_view first_chars(std::string_view s, size_t chars) {
  size_t i = 0;
  while (i < s.size() && chars > 0) {
    ++i;
    while (i < s.size() && (static_cast<unsigned char>(s[i]) & 0xc0) == 0x80) ++i;
    --chars;
  }
  return s.substr(0, i);
}

// Load as cache_aware and friends count it: requests in flight through this gateway and, with
// --replica-sync, through its peers (Worker::fleet_inflight).
inline int64_t inflight_load(const Worker* w) {
  return w->fleet_inflight();
}

struct LoadSpread {
  int64_t min = 0;
  int64_t max = 0;
};
template <class LoadFn>
LoadSpread load_spread(std::span<Worker* const> workers, LoadFn load) {
  LoadSpread s{load(workers[0]), load(workers[0])};
  for (Worker* w : workers) {
    int64_t l = load(w);
    s.min = std::min(s.min, l);
    s.max = std::max(s.max, l);
  }
  return s;
}

// sgl-model-gateway's imbalance test: both the absolute gap and the ratio must be exceeded.
inline bool imbalanced(LoadSpread s, int64_t abs_threshold, double rel_threshold) {
  return s.max - s.min > abs_threshold &&
         static_cast<double>(s.max) > static_cast<double>(s.min) * rel_threshold;
}

// The least loaded worker; among equals a random one (never always the first). Each load is
// read once, so a load changing meanwhile cannot leave nothing picked.
template <class LoadFn>
Worker* least_loaded(std::span<Worker* const> workers, PolicyRng& rng, LoadFn load) {
  Worker* pick = nullptr;
  int64_t best = 0;
  uint64_t ties = 0;
  for (Worker* w : workers) {
    int64_t l = load(w);
    if (pick == nullptr || l < best) {
      pick = w;
      best = l;
      ties = 1;
    } else if (l == best && rng.below(++ties) == 0) {
      pick = w;  // reservoir sampling: uniform among the ties
    }
  }
  return pick;
}

// The available worker with this id, or null.
inline Worker* find_available(std::span<Worker* const> available, uint64_t id) {
  for (Worker* w : available) {
    if (w->id() == id) return w;
  }
  return nullptr;
}

// The same, by the pool's availability index when `ctx` has it for this span (no scan).
inline Worker* find_available(std::span<Worker* const> available, const RouteContext& ctx,
                              uint64_t id) {
  if (ctx.candidates.describes(available)) return ctx.candidates.set->find(id);
  return find_available(available, id);
}

// The lowest, highest and total in-flight requests of the available workers (the index's
// figures when it has them for this span, else counted).
struct InflightSpread {
  LoadSpread spread;
  int64_t total = 0;
};
inline InflightSpread inflight_spread(std::span<Worker* const> available, const RouteContext& ctx) {
  if (ctx.candidates.describes(available)) {
    if (auto s = ctx.candidates.index->inflight(ctx.candidates.set->generation)) {
      return {{s->min, s->max}, s->total};
    }
  }
  InflightSpread out{load_spread(available, inflight_load), 0};
  for (Worker* w : available) out.total += w->fleet_inflight();
  return out;
}

// least_loaded by requests in flight (the index's when it has them for this span).
inline Worker* least_inflight(std::span<Worker* const> available, const RouteContext& ctx,
                              PolicyRng& rng) {
  if (ctx.candidates.describes(available)) {
    Worker* w = ctx.candidates.index->least_inflight(ctx.candidates.set->generation,
                                                     [&](size_t n) { return rng.below(n); });
    if (w) return w;
  }
  return least_loaded(available, rng, inflight_load);
}

// X-SMG-Routing-Key, the sticky-session header of sgl-model-gateway.
inline std::string_view routing_key(const RouteContext& ctx) {
  return ctx.header("x-smg-routing-key");
}

}  // namespace kvgate
