// util/random: see random.h.
#include "util/random.h"

#include <random>

namespace kvgate {

Rng& thread_rng() {
  thread_local Rng rng([] {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }());
  return rng;
}

}  // namespace kvgate
