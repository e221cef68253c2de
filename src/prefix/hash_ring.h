// prefix/hash_ring: a consistent-hash ring with virtual nodes, shared by prefix_hash,
// consistent_hashing and chwbl. Members are placed by hashing "<name>#<i>" (xxHash64), so a
// member's points do not depend on the others: adding or removing one moves only its keys.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvgate::prefix {

uint64_t hash64(std::string_view data, uint64_t seed = 0);

class HashRing {
 public:
  HashRing() = default;
  // `members` are stable names (worker URLs); lookups return their index in this span.
  HashRing(std::span<const std::string> members, int vnodes_per_member);

  bool empty() const { return points_.empty(); }
  size_t members() const { return members_; }
  // The member owning `hash` (first point clockwise).
  size_t owner(uint64_t hash) const;
  // Visits distinct members clockwise from `hash` until `accept(index)` returns true; returns that
  // index, or nullopt when no member was accepted.
  template <class Accept>
  std::optional<size_t> walk(uint64_t hash, Accept&& accept) const {
    if (points_.empty()) return std::nullopt;
    size_t start = lower(hash);
    // The members seen so far: a short list while the walk is short (it usually stops at the
    // first or second member), a bitmap of every member once it is not: no allocation and no
    // work proportional to the ring's size for a walk that stops early.
    constexpr size_t kInline = 16;
    uint32_t recent[kInline];
    std::vector<bool> seen;
    size_t distinct = 0;
    for (size_t k = 0; k < points_.size() && distinct < members_; ++k) {
      uint32_t m = points_[(start + k) % points_.size()].member;
      if (seen.empty()) {
        if (std::find(recent, recent + distinct, m) != recent + distinct) continue;
        if (distinct < kInline) {
          recent[distinct] = m;
        } else {
          seen.assign(members_, false);
          for (uint32_t r : recent) seen[r] = true;
          seen[m] = true;
        }
      } else {
        if (seen[m]) continue;
        seen[m] = true;
      }
      ++distinct;
      if (accept(static_cast<size_t>(m))) return m;
    }
    return std::nullopt;
  }

 private:
  struct Point {
    uint64_t hash;
    uint32_t member;
  };
  size_t lower(uint64_t hash) const;
  std::vector<Point> points_;
  size_t members_ = 0;
};

}  // namespace kvgate::prefix
