// prefix/chunk_index: cache_aware's approximate state when several kvgate replicas share it
// (--replica-sync). The character tree (approx_tree.h) needs a request's text; what replicas send
// each other is only the chain of hashes of the prompt's fixed-size chunks (chunk i's hash covers
// bytes [0, (i + 1) x chunk) of the prompt, seeded by the model), so this index holds, per chain
// hash, the workers it was sent to and until when. A worker holding hash i was sent a prompt
// whose first i + 1 chunks equal this one's: its match is the deepest hash of the request's chain
// it holds.
//
// A holder keeps the expiries of the records that named it (a record is known by its expiry, its
// origin time in microseconds plus the TTL): the 4 latest, or, with a settle time (set_settle():
// replicas that must agree on the moment a record counts from, its origin + settle), the
// earliest of each of the 4 latest spans of two settle times, so that records arriving faster
// than they settle never leave it holding nothing (it may then stop counting up to two settle
// times before its latest record's expiry). It counts while one of them does. A record applied
// twice is applied once; a retraction removes its own expiry only, so another record of the same
// worker keeps it held. Applying the same records in any order leaves every replica with the same
// holders and expiries; a retraction (after its record, as NATS delivers one publisher's messages)
// can leave replicas that kept different records of its span differing (a record not started:
// rare). Expiry does not depend on when a replica heard the record.
//
// Bounded: at most `max_entries` hashes (16 shards, each capped at a 16th; an insert into a full
// shard is dropped and counted); expired holders are swept by expire(), which also trims a shard
// above 90% of its cap back to 75%, oldest expiry first.
//
// Threads: any. Each shard has a reader-writer lock held for one hash's update or lookup.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <shared_mutex>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kvgate::prefix {

// The chain of `text`'s chunks of `chunk_bytes` (the last one may be shorter), seeded by `model`,
// appended to `out` (cleared first).
void chunk_chain(std::string_view model, std::string_view text, size_t chunk_bytes,
                 std::vector<uint64_t>& out);
// Bytes of a `text_bytes` prompt the first `chunks` hashes of its chain cover.
inline size_t chunk_bytes_covered(size_t chunks, size_t chunk_bytes, size_t text_bytes) {
  return std::min(text_bytes, chunks * chunk_bytes);
}

class ChunkIndex {
 public:
  explicit ChunkIndex(size_t max_entries);

  // `worker` was sent a prompt with this chain; it counts until `expiry_us`. Returns the hashes
  // not recorded because their shard was full.
  size_t apply(std::span<const uint64_t> chain, uint64_t worker, int64_t expiry_us);
  // Undoes apply(chain, worker, expiry_us) where no later record of the worker refreshed it.
  void retract(std::span<const uint64_t> chain, uint64_t worker, int64_t expiry_us);
  // Records count from their origin + `settle_us` (their expiry - `ttl_us` + `settle_us`), not
  // from when this replica applied them: every replica's match at a moment is the same once each
  // has heard the records of that moment (replica::Sync::settle()). Default: at once. Set before
  // use (not synchronised with match()).
  void set_settle(int64_t ttl_us, int64_t settle_us);
  // For each of `workers`, how many leading hashes of `chain` it holds at `now_us` (into
  // `matched`, same size). Returns the largest.
  size_t match(std::span<const uint64_t> chain, std::span<const uint64_t> workers,
               std::span<size_t> matched, int64_t now_us) const;
  size_t held(std::span<const uint64_t> chain, uint64_t worker, int64_t now_us) const;
  // Drops expired holders (and trims full shards); returns the entries removed.
  size_t expire(int64_t now_us);
  void remove_worker(uint64_t worker);
  size_t size() const { return size_.load(std::memory_order_relaxed); }
  size_t max_entries() const { return max_entries_; }

 private:
  static constexpr size_t kKept = 4;  // record expiries kept per holder
  struct Holder {
    uint64_t worker;
    std::array<int64_t, kKept> expiries;  // latest first; 0: none
    int64_t latest() const { return expiries[0]; }
  };
  struct Shard {
    mutable std::shared_mutex mu;
    std::unordered_map<uint64_t, std::vector<Holder>> entries;
  };
  static constexpr size_t kShards = 16;
  // Adds `expiry_us` to a holder's kept expiries (one falls off when full).
  void keep(std::array<int64_t, kKept>& e, int64_t expiry_us) const;
  // Whether a record of `x` counts at `now_us`.
  bool counts(const Holder& x, int64_t now_us) const;
  Shard& shard(uint64_t h) { return shards_[(h >> 60) & (kShards - 1)]; }
  const Shard& shard(uint64_t h) const { return shards_[(h >> 60) & (kShards - 1)]; }

  size_t max_entries_;
  size_t shard_cap_;
  int64_t window_us_ = 0;  // how long before its expiry a record counts (0: all of its life)
  int64_t settle_us_ = 0;
  std::array<Shard, kShards> shards_;
  std::atomic<size_t> size_{0};
};

}  // namespace kvgate::prefix
