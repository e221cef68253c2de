// policy/power_of_two: two distinct random candidates; the one with the lower load wins
// (load = requests in flight through this gateway + the load the worker reports on /get_load).
#pragma once

#include "policy/common.h"

namespace kvgate {

class PowerOfTwoPolicy final : public Policy {
 public:
  explicit PowerOfTwoPolicy(uint64_t seed) : rng_(seed) {}
  std::string_view name() const override { return "power_of_two"; }
  Decision select(std::span<Worker* const> available, RouteContext& ctx) override;
  bool uses_reported_load() const override { return true; }

 private:
  PolicyRng rng_;
};

}  // namespace kvgate
