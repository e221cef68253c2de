// tokenizer/piece_cache: see piece_cache.h.
#include "tokenizer/piece_cache.h"

#include <list>
#include <mutex>
#include <string>

namespace kvgate::tokenizer {

namespace {

struct Entry {
  uint64_t key;  // the slot: the piece's hash mixed with its owner
  uint64_t owner;
  std::string piece;
  std::vector<int32_t> ids;
  size_t bytes;  // accounted
};

// Mixes the owner into the piece's hash, so two tokenizers' entries for the same text take
// different slots (the stored owner is still compared on every hit).
uint64_t slot_key(uint64_t owner, uint64_t hash) {
  uint64_t x = owner * 0x9E3779B97F4A7C15ull;
  x ^= x >> 29;
  return hash ^ x;
}

using EntryIt = std::list<Entry>::iterator;

// Slot key -> entry, open addressing with linear probing at most half full: a lookup reads one or
// two adjacent slots (a node-based map would also read neighbouring nodes of other entries, cold
// in a large cache). Erasing shifts the following slots back, so there are no tombstones.
class Index {
 public:
  bool find(uint64_t key, EntryIt& out) const {
    if (slots_.empty()) return false;
    for (size_t i = key & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (!s.used) return false;
      if (s.key == key) {
        out = s.it;
        return true;
      }
    }
  }
  // `key` must not be present.
  void insert(uint64_t key, EntryIt it) {
    if ((n_ + 1) * 2 > slots_.size()) grow();
    place(Slot{key, it, true});
    ++n_;
  }
  // `key` must be present.
  void erase(uint64_t key) {
    size_t i = key & mask_;
    while (slots_[i].key != key || !slots_[i].used) i = (i + 1) & mask_;
    // Backward shift: move each following slot whose home is not in (i, j] into the hole.
    for (size_t j = (i + 1) & mask_; slots_[j].used; j = (j + 1) & mask_) {
      const size_t home = slots_[j].key & mask_;
      const bool stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
      if (stays) continue;
      slots_[i] = slots_[j];
      i = j;
    }
    slots_[i].used = false;
    --n_;
  }
  size_t size() const { return n_; }
  void clear() {
    std::vector<Slot>().swap(slots_);
    mask_ = 0;
    n_ = 0;
  }

 private:
  struct Slot {
    uint64_t key = 0;
    EntryIt it{};
    bool used = false;
  };
  void place(const Slot& s) {
    size_t i = s.key & mask_;
    while (slots_[i].used) i = (i + 1) & mask_;
    slots_[i] = s;
  }
  void grow() {
    std::vector<Slot> old(std::max<size_t>(64, slots_.size() * 2));
    old.swap(slots_);
    mask_ = slots_.size() - 1;
    for (const Slot& s : old) {
      if (s.used) place(s);
    }
  }
  std::vector<Slot> slots_;
  size_t mask_ = 0;
  size_t n_ = 0;
};

}  // namespace

struct alignas(64) PieceCache::Shard {
  std::mutex mu;
  std::list<Entry> lru;  // front: most recently used
  Index index;
  size_t bytes = 0;
  size_t capacity = 0;
  uint64_t hits = 0, misses = 0, inserts = 0, evictions = 0, too_large = 0;

  void erase(EntryIt it) {
    bytes -= it->bytes;
    index.erase(it->key);
    lru.erase(it);
  }
};

PieceCache::PieceCache(size_t capacity_bytes)
    : capacity_bytes_(capacity_bytes), shards_(std::make_unique<Shard[]>(kShards)) {
  for (size_t i = 0; i < kShards; ++i) shards_[i].capacity = capacity_bytes / kShards;
}

PieceCache::~PieceCache() = default;

PieceCache::Shard& PieceCache::shard_of(uint64_t key) {
  return shards_[static_cast<size_t>(key >> 60) % kShards];
}

bool PieceCache::get(uint64_t owner, std::string_view piece, uint64_t hash,
                     std::vector<int32_t>& out) {
  const uint64_t key = slot_key(owner, hash);
  Shard& s = shard_of(key);
  std::lock_guard lock(s.mu);
  EntryIt it;
  if (!s.index.find(key, it) || it->owner != owner || it->piece != piece) {
    ++s.misses;
    return false;
  }
  ++s.hits;
  s.lru.splice(s.lru.begin(), s.lru, it);
  const auto& ids = it->ids;
  out.insert(out.end(), ids.begin(), ids.end());
  return true;
}

void PieceCache::put(uint64_t owner, std::string_view piece, uint64_t hash,
                     std::span<const int32_t> ids) {
  const size_t bytes = entry_bytes(piece.size(), ids.size());
  const uint64_t key = slot_key(owner, hash);
  Shard& s = shard_of(key);
  if (bytes > s.capacity / 8) {  // capacity is set once, before any thread shares the cache
    std::lock_guard lock(s.mu);
    ++s.too_large;
    return;
  }
  // Built outside the lock: the copies are the costly part.
  Entry e{key, owner, std::string(piece), std::vector<int32_t>(ids.begin(), ids.end()), bytes};
  std::lock_guard lock(s.mu);
  if (EntryIt it; s.index.find(key, it)) {
    if (it->owner == owner && it->piece == piece) {  // another thread's insert
      s.lru.splice(s.lru.begin(), s.lru, it);
      return;
    }
    s.erase(it);  // a collision: the newer piece takes the slot
  }
  s.lru.push_front(std::move(e));
  s.index.insert(key, s.lru.begin());
  s.bytes += bytes;
  ++s.inserts;
  while (s.bytes > s.capacity && !s.lru.empty()) {
    s.erase(std::prev(s.lru.end()));
    ++s.evictions;
  }
}

void PieceCache::clear() {
  for (size_t i = 0; i < kShards; ++i) {
    Shard& s = shards_[i];
    std::list<Entry> dropped;
    {
      std::lock_guard lock(s.mu);
      dropped.swap(s.lru);
      s.index.clear();
      s.bytes = 0;
    }
  }
}

PieceCache::Stats PieceCache::stats() const {
  Stats st;
  st.capacity_bytes = capacity_bytes_;
  for (size_t i = 0; i < kShards; ++i) {
    Shard& s = shards_[i];
    std::lock_guard lock(s.mu);
    st.hits += s.hits;
    st.misses += s.misses;
    st.inserts += s.inserts;
    st.evictions += s.evictions;
    st.too_large += s.too_large;
    st.entries += s.index.size();
    st.bytes += s.bytes;
  }
  return st;
}

}  // namespace kvgate::tokenizer
