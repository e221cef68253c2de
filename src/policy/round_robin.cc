// policy/round_robin: see round_robin.h.
#include "policy/round_robin.h"

namespace kvgate {

Decision RoundRobinPolicy::select(std::span<Worker* const> available, RouteContext&) {
  uint64_t n = next_.fetch_add(1, std::memory_order_relaxed);
  return Decision{available[n % available.size()], std::nullopt, "next", 0};
}

}  // namespace kvgate
