// policy/manual: sticky sessions by X-SMG-Routing-Key. A new key is placed by
// --manual-assignment-mode (random, min_load: fewest requests in flight, min_group: fewest keys);
// it keeps up to two candidate workers: while the first is unavailable requests go to the second
// (placed then), and they return to the first once it recovers. Keys idle longer than
// --max-idle-secs are forgotten, and at most --max-routing-keys are kept: a new key arriving when
// that many are held makes the policy forget the least recently used one (whose next request is
// placed again, as a new key). Requests without a key go to a random worker.
#pragma once

#include <list>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "policy/common.h"
#include "policy/registry.h"

namespace kvgate {

class ManualPolicy final : public Policy {
 public:
  explicit ManualPolicy(const PolicyConfig& c);
  std::string_view name() const override { return "manual"; }
  Decision select(std::span<Worker* const> available, RouteContext& ctx) override;
  std::chrono::milliseconds period() const override;
  void on_period() override { expire(Clock::now()); }

  void expire(Clock::time_point now);  // drops keys idle past max idle
  size_t keys() const;

 private:
  // Keys longer than this are held as a 128-bit digest (32 hex characters).
  static constexpr size_t kMaxKeyBytes = 64;
  struct Entry {
    std::string key;
    uint64_t candidates[2] = {0, 0};  // worker ids, 0 = none; [0] is the original placement
    Clock::time_point last_access{};
  };
  using Lru = std::list<Entry>;  // most recently used first
  Worker* place(std::span<Worker* const> available, const RouteContext& ctx);
  void forget(Lru::iterator it);  // under mu_
  void publish_size();            // under mu_

  enum class Mode { kRandom, kMinLoad, kMinGroup };
  Mode mode_;
  std::chrono::seconds max_idle_;
  size_t max_keys_;
  PolicyRng rng_;
  mutable std::mutex mu_;
  Lru lru_;
  std::unordered_map<std::string_view, Lru::iterator> keys_;  // views of the entries' keys
  std::unordered_map<uint64_t, int64_t> group_size_;  // keys whose first candidate is the worker
  metrics::Gauge* keys_gauge_ = nullptr;
  metrics::Counter* evicted_full_ = nullptr;
  metrics::Counter* evicted_idle_ = nullptr;
};

}  // namespace kvgate
