// policy/random: a uniformly random available worker.
#pragma once

#include "policy/common.h"

namespace kvgate {

class RandomPolicy final : public Policy {
 public:
  explicit RandomPolicy(uint64_t seed) : rng_(seed) {}
  std::string_view name() const override { return "random"; }
  Decision select(std::span<Worker* const> available, RouteContext&) override {
    return Decision{available[rng_.below(available.size())], std::nullopt, "random", 0};
  }

 private:
  PolicyRng rng_;
};

}  // namespace kvgate
