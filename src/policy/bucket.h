// policy/bucket: each worker owns a band of request lengths (characters), so similar-length
// requests batch together. Every --bucket-refit-secs the bands are refitted from the requests of
// the last window so each worker receives an equal share of characters. When the characters sent in
// the window are imbalanced (the abs/rel test of cache_aware), the worker with the fewest takes the
// request instead.
#pragma once

#include <deque>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "policy/common.h"
#include "policy/registry.h"

namespace kvgate {

class BucketPolicy final : public Policy {
 public:
  explicit BucketPolicy(const PolicyConfig& c);
  std::string_view name() const override { return "bucket"; }
  Decision select(std::span<Worker* const> available, RouteContext& ctx) override;
  void on_dispatched(const Decision& d, RouteContext& ctx) override;
  void on_workers_changed(const WorkerSet& set) override;
  ParseOptions parse_options() const override { return {.want_text = true}; }
  std::chrono::milliseconds period() const override { return window_; }
  void on_period() override { refit(Clock::now()); }

  void refit(Clock::time_point now);
  // Upper bounds (exclusive) of each worker's band, in worker order; the last band is unbounded.
  std::vector<size_t> boundaries() const;

 private:
  struct Sent {
    Clock::time_point at;
    size_t chars;
    uint64_t worker;
  };
  void expire(Clock::time_point now);
  uint64_t band_owner(size_t chars) const;
  // The characters of `worker` in the window move by `delta` (chars_ and levels_).
  void add_chars(uint64_t worker, int64_t delta);
  // levels_ for the available set `set` (when built for another).
  void index_levels(const AvailableSet& set);

  int64_t abs_;
  double rel_;
  std::chrono::milliseconds window_;
  PolicyRng rng_;
  mutable std::mutex mu_;
  std::vector<uint64_t> ids_;                    // workers in band order
  std::vector<size_t> upper_;                    // ids_.size() - 1 cut points
  std::deque<Sent> sent_;                        // the window
  std::unordered_map<uint64_t, int64_t> chars_;  // characters per worker in the window
  // The workers of one available set (the pool's index's: levels_generation_) by their
  // characters in the window, so the imbalance test and the fewest-characters choice need no
  // look at every worker; with a position in their level for removal.
  std::map<int64_t, std::vector<uint64_t>> levels_;
  std::unordered_map<uint64_t, size_t> level_slot_;
  uint64_t levels_generation_ = 0;
};

}  // namespace kvgate
