// policy/random: a uniformly random available worker.
#pragma once

#include <mutex>

#include "policy/policy.h"
#include "util/random.h"

namespace kvgate {

class RandomPolicy final : public Policy {
 public:
  explicit RandomPolicy(uint64_t seed) : seed_(seed) {}
  std::string_view name() const override { return "random"; }
  Decision select(std::span<Worker* const> available, RouteContext& ctx) override;

 private:
  uint64_t seed_;
  std::mutex mu_;  // only with a fixed seed (tests): one reproducible sequence
  Rng seeded_{seed_};
};

}  // namespace kvgate
