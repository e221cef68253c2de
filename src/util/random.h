// util/random: a small fast PRNG (xoshiro256**) seeded by splitmix64, and a per-thread instance.
// Not for secrets. Policies take a seed so tests are reproducible.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvgate {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0x9e3779b97f4a7c15ull) { reseed(seed); }
  void reseed(uint64_t seed) {
    for (auto& s : s_) {
      seed += 0x9e3779b97f4a7c15ull;
      uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      s = z ^ (z >> 31);
    }
  }
  uint64_t next() {
    uint64_t result = rotl(s_[1] * 5, 7) * 9;
    uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  // Uniform in [0, n); n > 0.
  uint64_t below(uint64_t n) {
    __extension__ using u128 = unsigned __int128;
    return static_cast<uint64_t>((static_cast<u128>(next()) * n) >> 64);
  }
  // Uniform in [0, 1).
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

// A generator private to the calling thread, seeded from the OS once per thread.
Rng& thread_rng();

// `digits` random lowercase hex digits (ids: SGLang's are uuid4().hex, 32 of them).
std::string random_hex(size_t digits = 32);

}  // namespace kvgate
