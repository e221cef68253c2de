// policy/consistent_hashing: sticky placement by key on a ring of 150 virtual nodes per worker.
// The key is X-SMG-Target-Worker (a worker index: strict, no fallback), else X-SMG-Routing-Key,
// else the Authorization, X-Forwarded-For or Cookie header; without any, a random worker. An
// unavailable owner passes its keys to the next worker clockwise; removing a worker moves only its
// keys.
#pragma once

#include "policy/common.h"
#include "policy/registry.h"
#include "policy/ring_state.h"

namespace kvgate {

class ConsistentHashingPolicy final : public Policy {
 public:
  explicit ConsistentHashingPolicy(const PolicyConfig& c) : rng_(c.seed), ring_(150) {}
  std::string_view name() const override { return "consistent_hashing"; }
  Decision select(std::span<Worker* const> available, RouteContext& ctx) override;
  void on_workers_changed(const WorkerSet& set) override { ring_.rebuild(set); }

 private:
  PolicyRng rng_;
  RingHolder ring_;
};

}  // namespace kvgate
