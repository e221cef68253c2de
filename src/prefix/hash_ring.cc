// prefix/hash_ring: see hash_ring.h.
#include "prefix/hash_ring.h"

#define XXH_INLINE_ALL  // header-only xxHash: no library to link
#include <xxhash.h>

#include <algorithm>

namespace kvgate::prefix {

uint64_t hash64(std::string_view data, uint64_t seed) {
  return XXH64(data.data(), data.size(), seed);
}

HashRing::HashRing(std::span<const std::string> members, int vnodes) : members_(members.size()) {
  points_.reserve(members.size() * static_cast<size_t>(vnodes));
  for (size_t m = 0; m < members.size(); ++m) {
    for (int i = 0; i < vnodes; ++i) {
      std::string key = members[m] + "#" + std::to_string(i);
      points_.push_back({hash64(key), static_cast<uint32_t>(m)});
    }
  }
  std::sort(points_.begin(), points_.end(), [](const Point& a, const Point& b) {
    return a.hash != b.hash ? a.hash < b.hash : a.member < b.member;
  });
}

size_t HashRing::lower(uint64_t hash) const {
  auto it = std::lower_bound(points_.begin(), points_.end(), hash,
                             [](const Point& p, uint64_t h) { return p.hash < h; });
  return it == points_.end() ? 0 : static_cast<size_t>(it - points_.begin());
}

size_t HashRing::owner(uint64_t hash) const {
  return points_[lower(hash)].member;
}

}  // namespace kvgate::prefix
