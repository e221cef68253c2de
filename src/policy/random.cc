// policy/random: see random.h.
#include "policy/random.h"

namespace kvgate {

Decision RandomPolicy::select(std::span<Worker* const> available, RouteContext&) {
  uint64_t i;
  if (seed_ != 0) {
    std::lock_guard lock(mu_);
    i = seeded_.below(available.size());
  } else {
    i = thread_rng().below(available.size());
  }
  return Decision{available[i], std::nullopt, "random", 0};
}

}  // namespace kvgate
