// policy/power_of_two: see power_of_two.h.
#include "policy/power_of_two.h"

namespace kvgate {

Decision PowerOfTwoPolicy::select(std::span<Worker* const> available, RouteContext&) {
  if (available.size() == 1) return Decision{available[0], std::nullopt, "only_candidate", 0};
  uint64_t a = rng_.below(available.size());
  uint64_t b = rng_.below(available.size() - 1);
  if (b >= a) ++b;
  Worker* x = available[a];
  Worker* y = available[b];
  int64_t lx = x->load(), ly = y->load();
  if (lx == ly) return Decision{x, std::nullopt, "tie", 0};
  return Decision{lx < ly ? x : y, std::nullopt, "lower_load", 0};
}

}  // namespace kvgate
