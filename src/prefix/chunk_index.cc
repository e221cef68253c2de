// prefix/chunk_index: see chunk_index.h.
#include "prefix/chunk_index.h"

#define XXH_INLINE_ALL  // header-only xxHash: no library to link
#include <xxhash.h>

#include <algorithm>
#include <mutex>

namespace kvgate::prefix {

void chunk_chain(std::string_view model, std::string_view text, size_t chunk_bytes,
                 std::vector<uint64_t>& out) {
  out.clear();
  if (text.empty() || chunk_bytes == 0) return;
  constexpr uint64_t kDomain = 0x6b76676174652d63ULL;  // "kvgate-c"
  uint64_t h = XXH3_64bits_withSeed(model.data(), model.size(), kDomain);
  out.reserve((text.size() + chunk_bytes - 1) / chunk_bytes);
  for (size_t at = 0; at < text.size(); at += chunk_bytes) {
    const size_t n = std::min(chunk_bytes, text.size() - at);
    // A short last chunk is its own kind of link: it matches only a prompt ending the same way,
    // never the start of a longer chunk.
    const uint64_t seed = n == chunk_bytes ? h : h ^ 0x9e3779b97f4a7c15ULL;
    h = XXH3_64bits_withSeed(text.data() + at, n, seed);
    out.push_back(h);
  }
}

ChunkIndex::ChunkIndex(size_t max_entries)
    : max_entries_(std::max<size_t>(max_entries, kShards)), shard_cap_(max_entries_ / kShards) {}

size_t ChunkIndex::apply(std::span<const uint64_t> chain, uint64_t worker, int64_t expiry_us) {
  size_t dropped = 0;
  for (uint64_t h : chain) {
    Shard& s = shard(h);
    std::unique_lock lock(s.mu);
    auto it = s.entries.find(h);
    if (it == s.entries.end()) {
      if (s.entries.size() >= shard_cap_) {
        ++dropped;
        continue;
      }
      it = s.entries.emplace(h, std::vector<Holder>{}).first;
      size_.fetch_add(1, std::memory_order_relaxed);
    }
    auto& holders = it->second;
    auto hit = std::find_if(holders.begin(), holders.end(),
                            [worker](const Holder& x) { return x.worker == worker; });
    if (hit == holders.end()) {
      Holder h{worker, {}};
      h.expiries[0] = expiry_us;
      holders.push_back(h);
      continue;
    }
    auto& e = hit->expiries;
    if (std::find(e.begin(), e.end(), expiry_us) != e.end()) continue;  // applied already
    keep(e, expiry_us);
  }
  return dropped;
}

void ChunkIndex::keep(std::array<int64_t, kKept>& e, int64_t expiry_us) const {
  if (settle_us_ > 0) {
    // One record per span of two settle times, the earliest of each (it counts first; a later one
    // would replace a record that counts with one that does not yet), the 4 latest spans kept: a
    // holder's records arriving faster than they settle never push out all that count; with
    // records in three spans one counts from a settle time before the newest one's origin, with
    // four from three settle times before (a decision asked a little late, a peer's clock a
    // little ahead); and which are kept is a function of the records applied, not of their
    // order.
    const int64_t width = 2 * settle_us_;
    const int64_t span = expiry_us / width;
    for (size_t i = 0; i < kKept && e[i] != 0; ++i) {
      if (e[i] / width != span) continue;
      if (expiry_us < e[i]) e[i] = expiry_us;  // the earliest of its span (order kept: same span)
      return;
    }
  }
  if (expiry_us <= e[kKept - 1]) return;  // older than all kept (a full holder)
  // Inserted in order, the earliest falling off.
  size_t at = kKept - 1;
  while (at > 0 && e[at - 1] < expiry_us) {
    e[at] = e[at - 1];
    --at;
  }
  e[at] = expiry_us;
}

void ChunkIndex::retract(std::span<const uint64_t> chain, uint64_t worker, int64_t expiry_us) {
  for (uint64_t h : chain) {
    Shard& s = shard(h);
    std::unique_lock lock(s.mu);
    auto it = s.entries.find(h);
    if (it == s.entries.end()) continue;
    for (Holder& x : it->second) {
      if (x.worker != worker) continue;
      auto& e = x.expiries;
      auto at = std::find(e.begin(), e.end(), expiry_us);
      if (at == e.end()) continue;
      std::move(at + 1, e.end(), at);
      e[kKept - 1] = 0;
    }
    std::erase_if(it->second, [](const Holder& x) { return x.latest() == 0; });
    if (it->second.empty()) {
      s.entries.erase(it);
      size_.fetch_sub(1, std::memory_order_relaxed);
    }
  }
}

void ChunkIndex::set_settle(int64_t ttl_us, int64_t settle_us) {
  window_us_ = settle_us > 0 && ttl_us > settle_us ? ttl_us - settle_us : 0;
  settle_us_ = window_us_ > 0 ? settle_us : 0;
}

bool ChunkIndex::counts(const Holder& x, int64_t now_us) const {
  for (const int64_t e : x.expiries) {
    if (e <= now_us) return false;  // latest first: the rest expired too (or none: 0)
    if (window_us_ == 0 || e - window_us_ <= now_us) return true;
  }
  return false;
}

size_t ChunkIndex::match(std::span<const uint64_t> chain, std::span<const uint64_t> workers,
                         std::span<size_t> matched, int64_t now_us) const {
  std::fill(matched.begin(), matched.end(), 0);
  size_t best = 0;
  for (size_t i = 0; i < chain.size(); ++i) {
    const Shard& s = shard(chain[i]);
    std::shared_lock lock(s.mu);
    auto it = s.entries.find(chain[i]);
    if (it == s.entries.end()) break;  // nobody holds it, so nobody holds what follows it
    for (const Holder& x : it->second) {
      if (!counts(x, now_us)) continue;
      for (size_t k = 0; k < workers.size(); ++k) {
        if (workers[k] == x.worker) {
          matched[k] = i + 1;
          best = i + 1;
        }
      }
    }
  }
  return best;
}

size_t ChunkIndex::held(std::span<const uint64_t> chain, uint64_t worker, int64_t now_us) const {
  size_t m = 0;
  match(chain, std::span<const uint64_t>(&worker, 1), std::span<size_t>(&m, 1), now_us);
  return m;
}

size_t ChunkIndex::expire(int64_t now_us) {
  size_t removed = 0;
  for (Shard& s : shards_) {
    std::unique_lock lock(s.mu);
    for (auto it = s.entries.begin(); it != s.entries.end();) {
      std::erase_if(it->second, [now_us](const Holder& x) { return x.latest() <= now_us; });
      if (it->second.empty()) {
        it = s.entries.erase(it);
        ++removed;
      } else {
        ++it;
      }
    }
    if (s.entries.size() * 10 > shard_cap_ * 9) {
      // Oldest first: the entries whose latest expiry is earliest go, down to 75% of the cap.
      std::vector<std::pair<int64_t, uint64_t>> by_expiry;
      by_expiry.reserve(s.entries.size());
      for (const auto& [h, holders] : s.entries) {
        int64_t last = 0;
        for (const Holder& x : holders) last = std::max(last, x.latest());
        by_expiry.emplace_back(last, h);
      }
      const size_t keep = shard_cap_ * 3 / 4;
      const size_t drop = by_expiry.size() - std::min(keep, by_expiry.size());
      std::nth_element(by_expiry.begin(), by_expiry.begin() + static_cast<ptrdiff_t>(drop),
                       by_expiry.end());
      for (size_t i = 0; i < drop; ++i) s.entries.erase(by_expiry[i].second);
      removed += drop;
    }
  }
  size_.fetch_sub(removed, std::memory_order_relaxed);
  return removed;
}

void ChunkIndex::remove_worker(uint64_t worker) {
  size_t removed = 0;
  for (Shard& s : shards_) {
    std::unique_lock lock(s.mu);
    for (auto it = s.entries.begin(); it != s.entries.end();) {
      std::erase_if(it->second, [worker](const Holder& x) { return x.worker == worker; });
      if (it->second.empty()) {
        it = s.entries.erase(it);
        ++removed;
      } else {
        ++it;
      }
    }
  }
  size_.fetch_sub(removed, std::memory_order_relaxed);
}

}  // namespace kvgate::prefix
