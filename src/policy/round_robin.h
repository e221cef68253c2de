// policy/round_robin: the next available worker in turn (one shared atomic counter).
#pragma once

#include <atomic>

#include "policy/policy.h"

namespace kvgate {

class RoundRobinPolicy final : public Policy {
 public:
  std::string_view name() const override { return "round_robin"; }
  Decision select(std::span<Worker* const> available, RouteContext& ctx) override;

 private:
  std::atomic<uint64_t> next_{0};
};

}  // namespace kvgate
