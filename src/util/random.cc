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

std::string random_hex(size_t digits) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id(digits, '0');
  Rng& rng = thread_rng();
  uint64_t v = 0;
  for (size_t i = 0; i < digits; ++i) {
    if (i % 16 == 0) v = rng.next();
    id[i] = kHex[(v >> (4 * (i % 16))) & 0xf];
  }
  return id;
}

}  // namespace kvgate
