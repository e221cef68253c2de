// kv/inventory: see inventory.h.
//
// Layout. A lookup of an 8,192-token request walks 512 keys among millions: memory latency is the
// cost (on the development VM a DRAM miss is 165-290 ns), so the layout keeps a page to at most
// one random access and lets the walk have many in flight:
//   - Table: one flat open-addressing map key -> node index (linear probing, backward-shift
//     deletion: no tombstones). A slot is 16 bytes, four to a 64-byte line, a key's home is the
//     first slot of its line, and big arrays live in transparent huge pages (see large_alloc). The
//     slot's spare 32 bits summarize the node's holders (one holder: its source and tiers), so a
//     page one source holds needs nothing but the slot.
//   - Nodes: a chunked slab indexed by uint32: stable indices, growth never copies under the
//     writer lock, freed nodes are reused. A stored event's pages get consecutive nodes, and the
//     walk uses that: see match().
//   - Holders: sorted by source, two inline (most pages are cached by one or two ranks; a shared
//     system prompt by more), more on the heap. Sorted, so a walk intersects them with the
//     still-matching sources in one merge.
//   - Per source: engine id -> {node, media bits} in the same flat map, for parents and removals.
//     The holder keeps the id too, so pruning a node erases its id entries without a search.
//   - Writes fetch ahead too: a merged BlockStored hashes all its pages first and prefetches their
//     table and id-map slots; a BlockRemoved prefetches its entries, nodes and table slots.

// Node lifetime. A node lives while some source holds it or it has children. A parent whose
// holders all removed it (events were lost: SGLang evicts children first) stays as a holderless
// link; a walk stops there (no holder: never a hit), its children stay removable by id, and it is
// freed with its last child. Freeing walks up: every holderless ancestor left childless goes too.
//
// Pruning (max_blocks). Past the bound, leaves are pruned least recently stored or matched first
// (to the batch: stamps are per batch), one at a time, so a batch pays only for what it added:
//   - a lookup, under the shared lock, touches only the deepest node it matched (an atomic stamp):
//     the nodes above it are its ancestors and cannot be pruned before it, so the touch protects
//     the whole matched prefix; stores stamp 2 x epoch, matches 2 x epoch + 1 (the epoch advances
//     per batch), so a match after a store in the same batch window still counts as newer;
//   - the childless nodes are in a list in the order they were stored (the writer's own order, so
//     keeping it costs O(1) per block), or, once found touched by a lookup, in a min-heap by the
//     stamp of that touch: pruning looks at the list's head, moves it to the heap if a lookup
//     touched it since it was queued, and prunes the older of the list's head and the heap's top.
//     Only matched leaves ever enter the heap, and only when pruning reaches them; a leaf that
//     gains a child or goes leaves a stale heap entry, skipped when it surfaces (the heap is
//     rebuilt when stale entries outnumber live ones);
//   - a parent left childless by a prune goes to the list's head with the pruned leaf's stamp (its
//     subtree's recency; its own, if newer, is found there like any touch).
// A pruned block is a miss from then on, never a wrong hit: its key leaves the table and its id
// entries leave the sources' maps, so a later store under it is an orphan and a removal of it is an
// unknown id.
//
// Concurrency. A pthread rwlock set to prefer writers (glibc): std::shared_mutex on glibc prefers
// readers, and a steady stream of lookups from many request threads could then hold off the event
// thread indefinitely while events pile up. With writer preference a lookup waits at most for the
// batch in progress. Readers touch only the table, the nodes' holders and the nodes' atomic stamps;
// the writer's own state (id maps, leaf list, free list) is never read by them.
#include "kv/inventory.h"

#include <pthread.h>
#include <sys/mman.h>

#define XXH_INLINE_ALL  // header-only xxHash: no library to link
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <random>
#include <shared_mutex>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <variant>

namespace kvgate::kv {

// Tokens are hashed as int32 little-endian straight from memory.
static_assert(std::endian::native == std::endian::little, "chain_keys hashes tokens in place");

uint64_t chain_seed(std::optional<std::string_view> cache_salt, std::optional<int64_t> lora_id,
                    std::optional<std::string_view> lora_name) {
  if (!cache_salt && !lora_id && !lora_name) return 0;
  // A fixed 32-byte header (a domain tag, which of the three are present, the LoRA id, the salt's
  // length) hashed into the seed of a hash over the salt's bytes, then the adapter name's:
  // unambiguous (an empty salt differs from none, LoRA 0 from none, and the salt's length
  // separates salt and name), no allocation, and every bit of the inputs reaches the result.
  unsigned char header[32] = {'k', 'v', 'g', 'a', 't', 'e', 'n', 's'};
  header[8] =
      static_cast<unsigned char>((cache_salt ? 1 : 0) | (lora_id ? 2 : 0) | (lora_name ? 4 : 0));
  auto lora = static_cast<uint64_t>(lora_id.value_or(0));
  std::string_view salt = cache_salt.value_or(std::string_view{});
  uint64_t salt_len = salt.size();
  for (int i = 0; i < 8; ++i) {
    header[16 + i] = static_cast<unsigned char>(lora >> (8 * i));
    header[24 + i] = static_cast<unsigned char>(salt_len >> (8 * i));
  }
  uint64_t h = XXH3_64bits(header, sizeof header);
  h = XXH3_64bits_withSeed(salt.data(), salt.size(), h);
  if (lora_name) h = XXH3_64bits_withSeed(lora_name->data(), lora_name->size(), h);
  // 0 is the plain namespace: a namespaced chain must never start from it.
  return h != 0 ? h : 0x9e3779b97f4a7c15ull;
}

void chain_keys(std::span<const int32_t> tokens, size_t page_size, uint64_t seed,
                std::vector<BlockKey>& out) {
  if (page_size == 0) return;
  size_t pages = tokens.size() / page_size;
  out.reserve(out.size() + pages);
  for (size_t p = 0; p < pages; ++p) {
    seed = XXH3_64bits_withSeed(tokens.data() + p * page_size, page_size * sizeof(int32_t), seed);
    out.push_back(seed);
  }
}

namespace {

constexpr uint32_t kNil = UINT32_MAX;
constexpr uint32_t kInHeap = UINT32_MAX - 1;  // Node::prev of a leaf kept in the touched heap

// One bit per medium. kNone is what an engine with one tier sends: it is the GPU.
constexpr uint8_t kGpuBit = 1;
constexpr uint8_t kAllMedia = 0x1f;
uint8_t media_bit(Medium m) {
  switch (m) {
    case Medium::kNone:
    case Medium::kGpu:
      return kGpuBit;
    case Medium::kCpuPinned:
      return 2;
    case Medium::kDisk:
      return 4;
    case Medium::kExternal:
      return 8;
    case Medium::kOther:
      return 16;
  }
  return 16;
}
bool has_gpu(uint8_t media) {
  return (media & kGpuBit) != 0;
}
bool has_other(uint8_t media) {
  return (media & kAllMedia & ~kGpuBit) != 0;
}

// Stamps wrap (32 bits); compared as a signed distance, which is right for 2^31 epochs.
bool newer(uint32_t a, uint32_t b) {
  return static_cast<int32_t>(a - b) > 0;
}

// Memory for the big arrays (the key table, id maps, node chunks), which lookups hit at random:
// 64-byte aligned, and from 2 MiB up in transparent huge pages (THP runs in madvise mode on many
// hosts). With 4 KiB pages, a walk of 512 random lines over tens of MiB also misses the TLB on
// most of them; on the development VM huge pages took 512 prefetched random reads over 128 MiB
// from 11 us to 6 us.
constexpr size_t kHuge = size_t{2} << 20;
void* large_alloc(size_t bytes) {
  size_t align = bytes < kHuge ? 64 : kHuge;
  bytes = (bytes + align - 1) & ~(align - 1);
  void* p = std::aligned_alloc(align, bytes);
  if (p == nullptr) throw std::bad_alloc();
  if (align == kHuge) madvise(p, bytes, MADV_HUGEPAGE);  // advice: without THP nothing changes
  return p;
}
struct LargeDelete {
  void operator()(void* p) const { std::free(p); }  // NOLINT: pairs with aligned_alloc
};

// A flat open-addressing map from a 64-bit key to two 32-bit values; `node` == kNil marks an
// empty slot (0 is a valid key). Linear probing at most 3/4 full; erase shifts the following run
// back instead of leaving tombstones, so lookups never slow down with churn. Slots are 16 bytes in
// a 64-byte aligned array and a key's home is the first slot of its line, so a lookup nearly always
// reads one cache line, the one prefetch() fetched. The home mixes a per-map random salt in, so
// keys chosen to collide (prompts are user input) cannot pile up.
class FlatMap {
 public:
  struct Slot {
    uint64_t key;
    uint32_t node;
    uint32_t aux;  // the id map: the media bits; the key table: the holder summary
  };
  static_assert(sizeof(Slot) == 16);

  // Never without slots (16 at least), so prefetch() needs no emptiness test: GCC 12 drops a
  // __builtin_prefetch under such a test here (seen in the generated code: no prefetcht0 left).
  explicit FlatMap(uint64_t salt) : salt_(salt) { rehash(kMinCap); }

  size_t size() const { return size_; }
  size_t bytes() const { return cap_ * sizeof(Slot); }

  const Slot* find(uint64_t key) const {
    if (size_ == 0) return nullptr;
    for (size_t i = home(key);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.node == kNil) return nullptr;
      if (s.key == key) return &s;
    }
  }
  Slot* find(uint64_t key) { return const_cast<Slot*>(std::as_const(*this).find(key)); }

  void prefetch(uint64_t key) const { __builtin_prefetch(slots_.get() + home(key)); }
  // Also the next line, which an erase usually reads (it shifts the run after the slot back).
  void prefetch_erase(uint64_t key) const {
    size_t i = home(key);
    __builtin_prefetch(slots_.get() + i);
    __builtin_prefetch(slots_.get() + ((i + kLine) & mask_));
  }

  // Inserts key -> {node, aux} unless the key is there; returns its slot either way. Invalidates
  // other slot pointers.
  std::pair<Slot*, bool> insert(uint64_t key, uint32_t node, uint32_t aux) {
    if ((size_ + 1) * 4 > cap_ * 3) rehash(cap_ * 2);
    size_t i = home(key);
    for (;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.node == kNil) break;
      if (s.key == key) return {&s, false};
    }
    ++size_;
    slots_[i] = Slot{key, node, aux};
    return {&slots_[i], true};
  }

  void erase(Slot* s) {
    auto i = static_cast<size_t>(s - slots_.get());
    for (size_t j = (i + 1) & mask_; slots_[j].node != kNil; j = (j + 1) & mask_) {
      // Slot j moves back into the hole unless its home lies cyclically in (i, j].
      size_t h = home(slots_[j].key);
      if (((j - h) & mask_) >= ((j - i) & mask_)) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i].node = kNil;
    --size_;
  }
  bool erase(uint64_t key) {
    Slot* s = find(key);
    if (s == nullptr) return false;
    erase(s);
    return true;
  }

  // After mass removals: give memory back once the map is under 1/8 full.
  void maybe_shrink() {
    if (cap_ > 64 && size_ * 8 < cap_) {
      size_t cap = kMinCap;
      while (cap * 3 < size_ * 8) cap *= 2;  // at most 3/8 full after shrinking
      rehash(cap);
    }
  }

  void release() {
    slots_.reset();
    cap_ = 0;
    size_ = 0;
    rehash(kMinCap);
  }

  template <class F>
  void for_each(F&& f) const {
    for (size_t i = 0; i < cap_; ++i) {
      if (slots_[i].node != kNil) f(slots_[i]);
    }
  }

 private:
  static constexpr size_t kLine = 64 / sizeof(Slot);
  static constexpr size_t kMinCap = 16;
  using Slots = std::unique_ptr<Slot[], LargeDelete>;

  size_t home(uint64_t key) const {
    return static_cast<size_t>(((key ^ salt_) * 0x9e3779b97f4a7c15ull) >> shift_) & ~(kLine - 1);
  }

  void rehash(size_t cap) {
    Slots old(static_cast<Slot*>(large_alloc(cap * sizeof(Slot))));
    old.swap(slots_);
    size_t old_cap = cap_;
    std::uninitialized_fill_n(slots_.get(), cap, Slot{0, kNil, 0});
    cap_ = cap;
    mask_ = cap - 1;
    shift_ = 64 - std::countr_zero(cap);
    for (size_t k = 0; k < old_cap; ++k) {
      const Slot& s = old[k];
      if (s.node == kNil) continue;
      size_t i = home(s.key);
      while (slots_[i].node != kNil) i = (i + 1) & mask_;
      slots_[i] = s;
    }
  }

  Slots slots_;
  size_t cap_ = 0;
  size_t size_ = 0;
  size_t mask_ = 0;
  int shift_ = 64;
  uint64_t salt_;
};

struct Holder {
  uint64_t id;  // the engine id the source stored this node under (the first, if several)
  SourceId source;
  uint8_t media;        // the media of `id`
  uint8_t extra_media;  // the union of the media of the source's further ids for this node
  uint16_t unused;
  uint8_t tiers() const { return media | extra_media; }
};
static_assert(sizeof(Holder) == 16);

constexpr uint32_t kInline = 2;

struct Node {
  // What a lookup reads, first.
  uint32_t nholders = 0;
  uint32_t cap = kInline;  // kInline: the holders are `inl`; more: `heap`
  union {
    Holder inl[kInline];
    Holder* heap;
  };
  BlockKey key = 0;
  uint32_t parent = kNil;
  uint32_t children = 0;
  // The leaf list: a live childless node is in it, or in the heap (prev == kInHeap); `next` also
  // links the free list.
  uint32_t prev = kNil;
  uint32_t next = kNil;
  // The last store or match. Lookups write it under the shared lock, hence atomic and mutable.
  mutable std::atomic<uint32_t> stamp{0};
  uint32_t queued = 0;  // the stamp it is ordered by in the leaf list or heap

  Node() : inl{} {}
  Holder* holders() { return cap == kInline ? inl : heap; }
  const Holder* holders() const { return cap == kInline ? inl : heap; }
};

// The key table's spare 32 bits summarize a node's holders, so a walk reads the node itself only
// for pages several sources hold: 0 = none (a link); a single holder = its source (24 bits) and
// its tiers (bits 24-28, never 0); kSummaryMany = read the node (several holders, or one whose
// source id does not fit).
constexpr uint32_t kSummaryMany = 1u << 31;
constexpr uint32_t kSummarySource = (1u << 24) - 1;
uint32_t summary(const Node& nd) {
  if (nd.nholders == 0) return 0;
  const Holder& h = nd.holders()[0];
  if (nd.nholders == 1 && h.source <= kSummarySource) {
    return (static_cast<uint32_t>(h.tiers()) << 24) | h.source;
  }
  return kSummaryMany;
}

// Nodes in fixed chunks: indices stay valid, growth never moves a node.
class Slab {
 public:
  static constexpr uint32_t kChunkBits = 12;
  static constexpr uint32_t kChunk = 1u << kChunkBits;

  Node& operator[](uint32_t i) { return chunks_[i >> kChunkBits][i & (kChunk - 1)]; }
  const Node& operator[](uint32_t i) const { return chunks_[i >> kChunkBits][i & (kChunk - 1)]; }

  uint32_t alloc() {
    if (free_ != kNil) {
      uint32_t i = free_;
      free_ = (*this)[i].next;
      return i;
    }
    if (used_ == chunks_.size() * kChunk) chunks_.push_back(std::make_unique<Node[]>(kChunk));
    return used_++;
  }
  void release(uint32_t i) {
    (*this)[i].next = free_;
    free_ = i;
  }
  size_t bytes() const {
    return chunks_.size() * kChunk * sizeof(Node) + chunks_.capacity() * sizeof(void*);
  }
  uint32_t size() const { return used_; }  // indices handed out so far (live or free)

 private:
  std::vector<std::unique_ptr<Node[]>> chunks_;
  uint32_t used_ = 0;
  uint32_t free_ = kNil;
};

// A pthread rwlock that prefers writers (see the file comment), usable with std::unique_lock and
// std::shared_lock.
class RwLock {
 public:
  RwLock() {
    pthread_rwlockattr_t attr;
    pthread_rwlockattr_init(&attr);
#ifdef __GLIBC__
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
#endif
    pthread_rwlock_init(&lock_, &attr);
    pthread_rwlockattr_destroy(&attr);
  }
  ~RwLock() {
    pthread_rwlock_destroy(&lock_);
  }
  RwLock(const RwLock&) = delete;
  RwLock& operator=(const RwLock&) = delete;
  void lock() {
    pthread_rwlock_wrlock(&lock_);
  }
  void unlock() {
    pthread_rwlock_unlock(&lock_);
  }
  void lock_shared() {
    pthread_rwlock_rdlock(&lock_);
  }
  void unlock_shared() {
    pthread_rwlock_unlock(&lock_);
  }

 private:
  pthread_rwlock_t lock_;
};

uint64_t random_salt() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

}  // namespace

struct Inventory::Impl {
  struct SourceState {
    explicit SourceState(uint64_t salt) : ids(salt) {}
    FlatMap ids;  // engine id -> {node, media bits}
    // A node the source holds under more than one engine id (an engine whose hash covers more than
    // the tokens, e.g. vLLM's multimodal extra keys): the ids past the holder's own. Rare.
    std::unordered_multimap<uint32_t, uint64_t> extras;
    size_t gpu_blocks = 0;
    size_t other_blocks = 0;
  };

  explicit Impl(InventoryOptions o) : opt(o), salt(random_salt()), table(salt) {}
  ~Impl() {
    // Heap holder arrays are the only memory nodes own; free every live node's.
    table.for_each([&](const FlatMap::Slot& s) {
      Node& nd = slab[s.node];
      if (nd.cap != kInline) delete[] nd.heap;
    });
  }

  InventoryOptions opt;
  uint64_t salt;
  mutable RwLock lock;
  FlatMap table;  // key -> node
  Slab slab;
  uint32_t lru_head = kNil;
  uint32_t lru_tail = kNil;
  struct HeapEntry {
    uint32_t stamp;
    uint32_t node;
  };
  std::vector<HeapEntry> touched;  // min-heap by stamp, stale entries included
  size_t touched_live = 0;
  std::unordered_map<SourceId, std::unique_ptr<SourceState>> sources;
  std::atomic<uint32_t> epoch{1};
  uint32_t store_stamp = 2;
  std::atomic<size_t> node_count{0};
  std::atomic<uint64_t> pruned{0};
  size_t heap_holder_bytes = 0;
  std::vector<BlockKey> scratch_keys;  // store(): one event's keys

  // Counters readers may read without the lock. Only the writer changes them, under the lock, so a
  // plain load and store do: an atomic increment (a locked instruction) would wait for every
  // store before it, misses included, and serialize the misses a stored event overlaps.
  template <class T>
  static void bump(std::atomic<T>& c, int d) {
    c.store(c.load(std::memory_order_relaxed) + static_cast<T>(d), std::memory_order_relaxed);
  }

  // ---- leaf list ----
  void lru_push_tail(uint32_t n, uint32_t q) {
    Node& nd = slab[n];
    nd.queued = q;
    nd.prev = lru_tail;
    nd.next = kNil;
    if (lru_tail != kNil) {
      slab[lru_tail].next = n;
    } else {
      lru_head = n;
    }
    lru_tail = n;
  }
  void lru_push_head(uint32_t n, uint32_t q) {
    Node& nd = slab[n];
    nd.queued = q;
    nd.prev = kNil;
    nd.next = lru_head;
    if (lru_head != kNil) {
      slab[lru_head].prev = n;
    } else {
      lru_tail = n;
    }
    lru_head = n;
  }
  void lru_unlink(uint32_t n) {
    Node& nd = slab[n];
    if (nd.prev == kInHeap) {
      // Its heap entry goes stale (queued no longer matches or prev is no longer kInHeap).
      --touched_live;
      nd.prev = kNil;
      return;
    }
    if (nd.prev != kNil) {
      slab[nd.prev].next = nd.next;
    } else {
      lru_head = nd.next;
    }
    if (nd.next != kNil) {
      slab[nd.next].prev = nd.prev;
    } else {
      lru_tail = nd.prev;
    }
    nd.prev = nd.next = kNil;
  }
  void lru_move_to_tail(uint32_t n, uint32_t q) {
    if (lru_tail != n) {
      lru_unlink(n);
      lru_push_tail(n, q);
    } else {
      slab[n].queued = q;
    }
  }

  static bool heap_after(const HeapEntry& a, const HeapEntry& b) { return newer(a.stamp, b.stamp); }
  bool heap_entry_live(const HeapEntry& e) const {
    const Node& nd = slab[e.node];
    return nd.prev == kInHeap && nd.queued == e.stamp;
  }
  void heap_push(uint32_t n, uint32_t stamp) {
    Node& nd = slab[n];
    nd.prev = kInHeap;
    nd.next = kNil;
    nd.queued = stamp;
    ++touched_live;
    touched.push_back(HeapEntry{stamp, n});
    std::push_heap(touched.begin(), touched.end(), heap_after);
    if (touched.size() > 2 * touched_live + 1024) {
      std::erase_if(touched, [&](const HeapEntry& e) { return !heap_entry_live(e); });
      std::make_heap(touched.begin(), touched.end(), heap_after);
    }
  }
  // The heap's oldest live leaf (kNil: none), stale entries dropped and re-touched ones re-keyed.
  uint32_t heap_top() {
    while (!touched.empty()) {
      HeapEntry top = touched.front();
      if (!heap_entry_live(top)) {
        std::pop_heap(touched.begin(), touched.end(), heap_after);
        touched.pop_back();
        continue;
      }
      uint32_t s = slab[top.node].stamp.load(std::memory_order_relaxed);
      if (newer(s, top.stamp)) {
        std::pop_heap(touched.begin(), touched.end(), heap_after);
        touched.pop_back();
        --touched_live;
        heap_push(top.node, s);
        continue;
      }
      return top.node;
    }
    return kNil;
  }
  // The list's oldest untouched leaf (kNil: none), touched ones moved to the heap on the way.
  uint32_t list_top() {
    while (lru_head != kNil) {
      uint32_t h = lru_head;
      uint32_t s = slab[h].stamp.load(std::memory_order_relaxed);
      if (!newer(s, slab[h].queued)) return h;
      lru_unlink(h);
      heap_push(h, s);
    }
    return kNil;
  }

  // ---- holders ----
  static Holder* find_holder(Node& nd, SourceId s) {
    Holder* hs = nd.holders();
    Holder* it = std::lower_bound(hs, hs + nd.nholders, s,
                                  [](const Holder& h, SourceId v) { return h.source < v; });
    return it != hs + nd.nholders && it->source == s ? it : nullptr;
  }
  void insert_holder(Node& nd, const Holder& h) {
    if (nd.nholders == nd.cap) {
      uint32_t cap = nd.cap * 2;
      auto* grown = new Holder[cap];
      std::copy_n(nd.holders(), nd.nholders, grown);
      if (nd.cap != kInline) {
        delete[] nd.heap;
        heap_holder_bytes -= nd.cap * sizeof(Holder);
      }
      nd.heap = grown;
      nd.cap = cap;
      heap_holder_bytes += cap * sizeof(Holder);
    }
    Holder* hs = nd.holders();
    Holder* it = std::lower_bound(hs, hs + nd.nholders, h.source,
                                  [](const Holder& x, SourceId v) { return x.source < v; });
    std::copy_backward(it, hs + nd.nholders, hs + nd.nholders + 1);
    *it = h;
    ++nd.nholders;
  }
  void erase_holder(Node& nd, Holder* h) {
    Holder* hs = nd.holders();
    std::copy(h + 1, hs + nd.nholders, h);
    --nd.nholders;
    if (nd.cap != kInline && nd.nholders <= kInline) {
      Holder* old = nd.heap;  // `inl` overlays the pointer: keep it before copying back
      Holder keep[kInline] = {};
      std::copy_n(old, nd.nholders, keep);
      heap_holder_bytes -= nd.cap * sizeof(Holder);
      delete[] old;
      nd.cap = kInline;
      std::copy_n(keep, kInline, nd.inl);
    }
  }

  static void account(SourceState& st, uint8_t before, uint8_t after) {
    st.gpu_blocks += static_cast<size_t>(has_gpu(after)) - static_cast<size_t>(has_gpu(before));
    st.other_blocks +=
        static_cast<size_t>(has_other(after)) - static_cast<size_t>(has_other(before));
  }

  // The union of the media of the source's extra ids for node n.
  static uint8_t extra_media_of(SourceState& st, uint32_t n) {
    uint8_t m = 0;
    auto [b, e] = st.extras.equal_range(n);
    for (auto it = b; it != e; ++it) {
      if (const FlatMap::Slot* s = st.ids.find(it->second)) m |= static_cast<uint8_t>(s->aux);
    }
    return m;
  }

  // After any change to n's holders: its summary in the table.
  void sync(uint32_t n) {
    const Node& nd = slab[n];
    table.find(nd.key)->aux = summary(nd);
  }

  SourceState& source(SourceId s) {
    auto& p = sources[s];
    if (!p) p = std::make_unique<SourceState>(salt ^ (0x9e3779b97f4a7c15ull * (s + 1)));
    return *p;
  }

  // ---- nodes ----
  uint32_t get_or_create(BlockKey key, uint32_t parent) {
    if (const FlatMap::Slot* slot = table.find(key)) {
      // Stored again: as recent as a new block. (Same key, so same parent key: a different
      // parent would take a 64-bit collision.)
      uint32_t n = slot->node;
      Node& nd = slab[n];
      nd.stamp.store(store_stamp, std::memory_order_relaxed);
      if (nd.children == 0) lru_move_to_tail(n, store_stamp);
      return n;
    }
    uint32_t n = slab.alloc();
    table.insert(key, n, 0);
    Node& nd = slab[n];
    nd.key = key;
    nd.parent = parent;
    nd.children = 0;
    nd.nholders = 0;
    nd.cap = kInline;
    nd.stamp.store(store_stamp, std::memory_order_relaxed);
    if (parent != kNil && slab[parent].children++ == 0) lru_unlink(parent);
    lru_push_tail(n, store_stamp);
    bump(node_count, 1);
    return n;
  }

  // Frees n (childless, no holders) and every ancestor that is left holderless and childless. A
  // held ancestor left childless becomes a leaf: after a prune at the head of the list (its
  // subtree's recency is the pruned leaf's), otherwise at the tail.
  void free_up(uint32_t n, bool pruning) {
    uint32_t queued = slab[n].queued;
    lru_unlink(n);  // childless and live: in the list or the heap
    for (;;) {
      Node& nd = slab[n];
      uint32_t p = nd.parent;
      table.erase(nd.key);
      if (nd.cap != kInline) {
        heap_holder_bytes -= nd.cap * sizeof(Holder);
        delete[] nd.heap;
        nd.cap = kInline;
      }
      nd.nholders = 0;
      nd.parent = kNil;
      slab.release(n);
      bump(node_count, -1);
      if (p == kNil) return;
      Node& pn = slab[p];
      if (--pn.children != 0) return;
      if (pn.nholders != 0) {
        if (pruning) {
          lru_push_head(p, queued);
        } else {
          lru_push_tail(p, store_stamp);
        }
        return;
      }
      n = p;  // a holderless link: it goes too (it was never listed: it had a child)
    }
  }

  // Takes media bits `m` (a subset of what the id holds) of source S's id at slot e away from its
  // node.
  void unhold(SourceState& st, SourceId s, uint64_t id, FlatMap::Slot* e, uint8_t m) {
    uint32_t n = e->node;
    e->aux &= ~static_cast<uint32_t>(m);
    bool gone = e->aux == 0;
    if (gone) st.ids.erase(e);
    Node& nd = slab[n];
    Holder* h = find_holder(nd, s);
    if (h == nullptr) return;  // cannot happen: holders and id entries are kept together
    uint8_t before = h->tiers();
    if (h->id == id) {
      h->media &= static_cast<uint8_t>(~m);
      if (h->media == 0 && h->extra_media != 0) {
        // The holder's own id is gone but others remain: one of them becomes the holder's id.
        auto it = st.extras.find(n);
        h->id = it->second;
        st.extras.erase(it);
        const FlatMap::Slot* x = st.ids.find(h->id);
        h->media = x != nullptr ? static_cast<uint8_t>(x->aux) : 0;
        h->extra_media = extra_media_of(st, n);
      }
    } else {
      if (gone) {
        auto [b, end] = st.extras.equal_range(n);
        for (auto it = b; it != end; ++it) {
          if (it->second == id) {
            st.extras.erase(it);
            break;
          }
        }
      }
      h->extra_media = extra_media_of(st, n);
    }
    uint8_t after = h->tiers();
    account(st, before, after);
    if (after == 0) {
      erase_holder(nd, h);
      if (nd.nholders == 0 && nd.children == 0) {
        free_up(n, false);
        return;
      }
    }
    sync(n);
  }

  void add_holding(SourceState& st, SourceId s, uint64_t id, uint32_t n, uint8_t m) {
    if (FlatMap::Slot* e = st.ids.find(id)) {
      if (e->node == n) {
        if ((e->aux & m) != 0) return;  // already held there, in that medium
        e->aux |= m;
        Holder* h = find_holder(slab[n], s);
        uint8_t before = h->tiers();
        if (h->id == id) {
          h->media |= m;
        } else {
          h->extra_media |= m;
        }
        account(st, before, h->tiers());
        sync(n);
        return;
      }
      // The engine reused the id for other content: its old holding goes first. Freeing the old
      // node walks up through holderless links, and n may be one (an existing node no one holds
      // whose only child was the old node): pinned by a child count meanwhile, so it stays.
      Node& target = slab[n];
      bool was_leaf = target.children == 0;
      ++target.children;
      unhold(st, s, id, e, static_cast<uint8_t>(e->aux));
      if (--target.children == 0 && !was_leaf) lru_push_tail(n, store_stamp);
    }
    st.ids.insert(id, n, m);
    Node& nd = slab[n];
    if (Holder* h = find_holder(nd, s)) {
      st.extras.emplace(n, id);
      uint8_t before = h->tiers();
      h->extra_media |= m;
      account(st, before, h->tiers());
    } else {
      insert_holder(nd, Holder{id, s, m, 0, 0});
      account(st, 0, m);
    }
    sync(n);
  }

  // ---- events ----
  void store(SourceState& st, SourceId s, const BlockStored& ev, ApplyStats& stats) {
    size_t n = ev.block_hashes.size();
    size_t ps = opt.page_size;
    if (ev.block_size <= 0 || static_cast<uint64_t>(ev.block_size) != ps ||
        ev.token_ids.size() != n * ps) {
      ++stats.page_size_mismatches;
      return;
    }
    if (n == 0) return;
    uint32_t parent = kNil;
    uint64_t seed = 0;
    if (ev.parent_block_hash) {
      const FlatMap::Slot* p = st.ids.find(*ev.parent_block_hash);
      if (p == nullptr) {
        ++stats.orphans;
        // Ids this source holds elsewhere now name blocks we cannot place: what they named is
        // gone. (Engines' ids are content hashes, so this takes lost events or an id reused by an
        // engine; forgetting is a miss, keeping would be a wrong hit.)
        for (uint64_t id : ev.block_hashes) {
          if (FlatMap::Slot* e = st.ids.find(id))
            unhold(st, s, id, e, static_cast<uint8_t>(e->aux));
        }
        return;
      }
      parent = p->node;
      seed = slab[parent].key;
    } else {
      auto view = [](const std::optional<std::string>& v) {
        return v ? std::optional<std::string_view>(*v) : std::nullopt;
      };
      seed = chain_seed(view(ev.cache_salt), ev.lora_id, view(ev.lora_name));
    }
    uint8_t m = media_bit(ev.medium);
    // Keys first, then every slot this event will touch is fetched at once: the table and id map
    // misses of a merged event overlap instead of being paid one after the other.
    const int32_t* tokens = ev.token_ids.data();
    scratch_keys.resize(n);
    for (size_t i = 0; i < n; ++i) {
      seed = XXH3_64bits_withSeed(tokens + i * ps, ps * sizeof(int32_t), seed);
      scratch_keys[i] = seed;
    }
    for (size_t i = 0; i < n; ++i) {
      table.prefetch(scratch_keys[i]);
      st.ids.prefetch(ev.block_hashes[i]);
    }
    for (size_t i = 0; i < n; ++i) {
      uint32_t node = get_or_create(scratch_keys[i], parent);
      add_holding(st, s, ev.block_hashes[i], node, m);
      ++stats.stored;
      parent = node;
    }
  }

  void remove(SourceState& st, SourceId s, const BlockRemoved& ev, ApplyStats& stats) {
    uint8_t m = media_bit(ev.medium);
    // In groups, what each removal will touch is fetched first, in the order it is found: the id
    // entries, then their nodes, then the nodes' key-table slots (a freed node leaves the table).
    // The misses of a group overlap instead of being paid one after the other.
    constexpr size_t kGroup = 64;
    const std::vector<uint64_t>& ids = ev.block_hashes;
    for (size_t g = 0; g < ids.size(); g += kGroup) {
      const size_t end = std::min(ids.size(), g + kGroup);
      for (size_t i = g; i < end; ++i) st.ids.prefetch_erase(ids[i]);
      for (size_t i = g; i < end; ++i) {
        if (const FlatMap::Slot* e = st.ids.find(ids[i])) __builtin_prefetch(&slab[e->node]);
      }
      for (size_t i = g; i < end; ++i) {
        if (const FlatMap::Slot* e = st.ids.find(ids[i])) table.prefetch_erase(slab[e->node].key);
      }
      for (size_t i = g; i < end; ++i) remove_one(st, s, ids[i], m, stats);
    }
  }

  void remove_one(SourceState& st, SourceId s, uint64_t id, uint8_t m, ApplyStats& stats) {
    FlatMap::Slot* e = st.ids.find(id);
    if (e == nullptr || (e->aux & m) == 0) {
      ++stats.unknown_removals;
      return;
    }
    unhold(st, s, id, e, m);
    ++stats.removed;
  }

  void clear_source(SourceState& st, SourceId s) {
    // Every id entry of the source names a live node holding it, except extra ids of a node
    // already let go: those find no holder (or one under another id) and are skipped. Nothing is
    // allocated meanwhile, so a node freed here is not reused under the walk.
    st.ids.for_each([&](const FlatMap::Slot& e) {
      Node& nd = slab[e.node];
      Holder* h = find_holder(nd, s);
      if (h == nullptr || h->id != e.key) return;
      erase_holder(nd, h);
      if (nd.nholders == 0 && nd.children == 0) {
        free_up(e.node, false);
      } else {
        sync(e.node);
      }
    });
    st.ids.release();
    st.extras = {};
    st.gpu_blocks = 0;
    st.other_blocks = 0;
  }

  void prune_node(uint32_t n) {
    Node& nd = slab[n];
    const Holder* hs = nd.holders();
    for (uint32_t i = 0; i < nd.nholders; ++i) {
      const Holder& h = hs[i];
      SourceState& st = *sources.at(h.source);
      st.ids.erase(h.id);
      if (h.extra_media != 0) {
        auto [b, e] = st.extras.equal_range(n);
        for (auto it = b; it != e; ++it) st.ids.erase(it->second);
        st.extras.erase(n);
      }
      account(st, h.tiers(), 0);
    }
    nd.nholders = 0;
    bump(pruned, 1);
    free_up(n, true);
  }

  void prune_to_bound() {
    // Readers cannot touch stamps meanwhile (the writer holds the lock), so each leaf moves to the
    // heap at most once here.
    while (node_count.load(std::memory_order_relaxed) > opt.max_blocks) {
      uint32_t a = list_top();
      uint32_t b = heap_top();
      if (a == kNil && b == kNil) break;
      prune_node(b == kNil || (a != kNil && !newer(slab[a].queued, slab[b].queued)) ? a : b);
    }
  }

  ApplyStats apply(SourceId s, const EventBatch& batch) {
    ApplyStats stats;
    std::unique_lock guard(lock);
    uint32_t e = epoch.load(std::memory_order_relaxed) + 1;
    epoch.store(e, std::memory_order_relaxed);
    store_stamp = 2 * e;
    SourceState& st = source(s);
    for (const Event& ev : batch.events) {
      if (const auto* bs = std::get_if<BlockStored>(&ev)) {
        store(st, s, *bs, stats);
        prune_to_bound();  // per event: the bound is exceeded by one event's blocks at most
      } else if (const auto* br = std::get_if<BlockRemoved>(&ev)) {
        remove(st, s, *br, stats);
      } else {
        clear_source(st, s);
        ++stats.cleared;
      }
    }
    st.ids.maybe_shrink();
    table.maybe_shrink();
    return stats;
  }

  // ---- lookup ----
  // The walk. Page i's node comes from one of two places:
  //   - the slab slot after page i-1's node, when that node is page i-1's child with page i's key:
  //     a stored event's pages get consecutive nodes, so along a chain this is a sequential read
  //     the hardware prefetcher streams (a freed node has no parent, so it never passes). Tried
  //     only while the chain has been consecutive (pages i-2 and i-1) or at its start: a wrong
  //     guess is a cache miss of its own;
  //   - otherwise the key table, whose slots are prefetched kAhead pages ahead of any table
  //     lookup (not while the slab keeps answering: those would be wasted misses).
  // Counts are settled lazily: a source's run is recorded when it ends, and a page several
  // sources hold whose holders and tiers equal the previous page's changes nothing, so only its
  // holder list is compared.
  size_t match(std::span<const BlockKey> keys, std::vector<SourceMatch>& out) const {
    const bool other = opt.other_tier_weight > 0;
    const uint8_t counted = other ? kAllMedia : kGpuBit;
    constexpr uint32_t kRun = UINT32_MAX;  // gpu_pages while the GPU run goes on
    // Indices into `out` of the sources still matching, in source order. Per thread, so a
    // lookup allocates nothing once warm.
    thread_local std::vector<uint32_t> alive;
    alive.clear();
    constexpr size_t kAhead = 32;
    const size_t n = keys.size();
    const uint32_t slab_size = slab.size();
    size_t prefetched = 0;            // table slots of pages below this were prefetched
    uint32_t prev = kNil;             // page i-1's node
    uint32_t prev2 = kNil;            // page i-2's node
    const Holder* prev_hs = nullptr;  // page i-1's holders when several held it
    uint32_t prev_k = 0;
    // A source that stops at page i: its counts are final.
    auto settle = [&](SourceMatch& m, size_t i) {
      m.pages = static_cast<double>(i);
      if (m.gpu_pages == kRun) m.gpu_pages = static_cast<uint32_t>(i);
    };
    size_t i = 0;
    for (; i < n; ++i) {
      uint32_t node = kNil;
      uint32_t sum = 0;
      if (prev != kNil && prev + 1 < slab_size && (prev2 == kNil || prev == prev2 + 1)) {
        const Node& c = slab[prev + 1];
        if (c.parent == prev && c.key == keys[i]) {
          node = prev + 1;
          sum = summary(c);
        }
      }
      if (node == kNil) {
        prefetched = std::max(prefetched, i + 1);
        for (size_t end = std::min(n, i + 1 + kAhead); prefetched < end; ++prefetched) {
          table.prefetch(keys[prefetched]);
        }
        const FlatMap::Slot* slot = table.find(keys[i]);
        if (slot == nullptr) break;
        node = slot->node;
        sum = slot->aux;
      }
      if (sum == 0) break;  // a link no one holds
      if ((sum & kSummaryMany) == 0) {
        // One holder: at most one source goes on.
        const SourceId src = sum & kSummarySource;
        const uint8_t t = static_cast<uint8_t>(sum >> 24) & counted;
        if (t == 0) break;
        if (i == 0) {
          alive.push_back(0);
          out.push_back(SourceMatch{src, has_gpu(t) ? kRun : 0u, 0});
        } else {
          uint32_t keep = kNil;
          for (uint32_t a : alive) {
            if (out[a].source == src) {
              keep = a;
            } else {
              settle(out[a], i);
            }
          }
          alive.clear();
          if (keep == kNil) break;
          SourceMatch& m = out[keep];
          if (m.gpu_pages == kRun && !has_gpu(t)) m.gpu_pages = static_cast<uint32_t>(i);
          alive.push_back(keep);
        }
        prev_hs = nullptr;
      } else {
        const Node& nd = slab[node];
        const Holder* hs = nd.holders();
        const uint32_t k = nd.nholders;
        if (i == 0) {
          for (uint32_t j = 0; j < k; ++j) {
            uint8_t t = hs[j].tiers() & counted;
            if (t == 0) continue;
            alive.push_back(static_cast<uint32_t>(out.size()));
            out.push_back(SourceMatch{hs[j].source, has_gpu(t) ? kRun : 0u, 0});
          }
        } else if (!same_holders(hs, k, prev_hs, prev_k, counted)) {
          // Merge the node's holders with the matching sources (both sorted by source).
          size_t w = 0;
          uint32_t j = 0;
          for (uint32_t a : alive) {
            SourceMatch& m = out[a];
            while (j < k && hs[j].source < m.source) ++j;
            uint8_t t = j < k && hs[j].source == m.source ? hs[j].tiers() & counted : 0;
            if (t == 0) {
              settle(m, i);
              continue;
            }
            if (m.gpu_pages == kRun && !has_gpu(t)) m.gpu_pages = static_cast<uint32_t>(i);
            alive[w++] = a;
          }
          alive.resize(w);
        }
        prev_hs = hs;
        prev_k = k;
      }
      if (alive.empty()) break;
      prev2 = prev;
      prev = node;
    }
    for (uint32_t a : alive) settle(out[a], i);
    if (prev != kNil) {
      // Only the deepest matched node: its ancestors cannot be pruned before it (file comment).
      uint32_t t = 2 * epoch.load(std::memory_order_relaxed) + 1;
      auto& stamp = slab[prev].stamp;
      if (stamp.load(std::memory_order_relaxed) != t) stamp.store(t, std::memory_order_relaxed);
    }
    size_t best = 0;
    const double w = opt.other_tier_weight;
    for (SourceMatch& m : out) {
      // `pages` holds the leading pages held in any counted tier.
      double g = m.gpu_pages;
      m.pages = other ? g + w * (m.pages - g) : g;
      best = std::max<size_t>(best, m.gpu_pages);
    }
    return best;
  }

  // Whether a page's holders, as a walk sees them (source and counted tiers), are the previous
  // page's.
  static bool same_holders(const Holder* hs, uint32_t k, const Holder* prev, uint32_t prev_k,
                           uint8_t counted) {
    if (prev == nullptr || k != prev_k) return false;
    bool same = true;
    for (uint32_t j = 0; j < k; ++j) {
      same &= hs[j].source == prev[j].source &&
              (hs[j].tiers() & counted) == (prev[j].tiers() & counted);
    }
    return same;
  }

  size_t bytes() const {
    size_t b = sizeof(Impl) + table.bytes() + slab.bytes() + heap_holder_bytes +
               touched.capacity() * sizeof(HeapEntry) + scratch_keys.capacity() * sizeof(BlockKey);
    for (const auto& [id, st] : sources) {
      // An unordered_map node is a pointer, the pair and a cached hash; a bucket is a pointer.
      b += sizeof(SourceState) + 4 * sizeof(void*) + st->ids.bytes() +
           st->extras.size() * (sizeof(void*) * 2 + 16) + st->extras.bucket_count() * sizeof(void*);
    }
    return b;
  }
};

Inventory::Inventory(InventoryOptions options) : impl_(std::make_unique<Impl>(options)) {}
Inventory::~Inventory() = default;

const InventoryOptions& Inventory::options() const {
  return impl_->opt;
}

ApplyStats Inventory::apply(SourceId source, const EventBatch& batch) {
  return impl_->apply(source, batch);
}

void Inventory::clear(SourceId source) {
  std::unique_lock guard(impl_->lock);
  auto it = impl_->sources.find(source);
  if (it == impl_->sources.end()) return;
  impl_->clear_source(*it->second, source);
  impl_->table.maybe_shrink();
}

void Inventory::remove_source(SourceId source) {
  std::unique_lock guard(impl_->lock);
  auto it = impl_->sources.find(source);
  if (it == impl_->sources.end()) return;
  impl_->clear_source(*it->second, source);
  impl_->sources.erase(it);
  impl_->table.maybe_shrink();
}

size_t Inventory::match(std::span<const BlockKey> keys, std::vector<SourceMatch>& out) const {
  out.clear();
  if (keys.empty()) return 0;
  std::shared_lock guard(impl_->lock);
  return impl_->match(keys, out);
}

SourceExport Inventory::export_source(SourceId source) const {
  SourceExport out;
  std::shared_lock guard(impl_->lock);
  auto it = impl_->sources.find(source);
  if (it == impl_->sources.end()) return out;
  const Impl::SourceState& st = *it->second;
  const Slab& slab = impl_->slab;
  // Every node on the way to a held one, once, parents first: a walk up from each held node
  // collects its missing ancestors, then they are emitted top-down.
  std::unordered_set<uint32_t> seen;
  std::vector<uint32_t> path;
  st.ids.for_each([&](const FlatMap::Slot& e) {
    path.clear();
    for (uint32_t n = e.node; n != kNil && !seen.contains(n); n = slab[n].parent) {
      path.push_back(n);
      seen.insert(n);
    }
    for (size_t i = path.size(); i-- > 0;) {  // top-down
      const Node& nd = slab[path[i]];
      out.links.push_back({.key = nd.key,
                           .parent = nd.parent == kNil ? 0 : slab[nd.parent].key,
                           .root = nd.parent == kNil});
    }
    out.holdings.push_back(
        {.id = e.key, .key = slab[e.node].key, .media = static_cast<uint8_t>(e.aux)});
  });
  return out;
}

void Inventory::import_source(SourceId source, const SourceExport& in) {
  std::unique_lock guard(impl_->lock);
  Impl& im = *impl_;
  uint32_t e = im.epoch.load(std::memory_order_relaxed) + 1;
  im.epoch.store(e, std::memory_order_relaxed);
  im.store_stamp = 2 * e;
  Impl::SourceState& st = im.source(source);
  im.clear_source(st, source);
  for (const SourceExport::Link& l : in.links) {
    uint32_t parent = kNil;
    if (!l.root) {
      const FlatMap::Slot* p = im.table.find(l.parent);
      if (p == nullptr) continue;  // its parent was skipped: so is it
      parent = p->node;
    }
    im.get_or_create(l.key, parent);
  }
  for (const SourceExport::Holding& h : in.holdings) {
    const FlatMap::Slot* n = im.table.find(h.key);
    const uint8_t media = static_cast<uint8_t>(h.media & kAllMedia);
    if (n == nullptr || media == 0) continue;
    im.add_holding(st, source, h.id, n->node, media);
  }
  // Links no holding kept (skipped ones below) are childless and holderless: freed.
  for (size_t i = in.links.size(); i-- > 0;) {  // children first
    const FlatMap::Slot* n = im.table.find(in.links[i].key);
    if (n == nullptr) continue;
    const uint32_t node = n->node;
    if (im.slab[node].nholders == 0 && im.slab[node].children == 0) im.free_up(node, false);
  }
  im.prune_to_bound();
}

size_t Inventory::blocks(SourceId source, bool gpu) const {
  std::shared_lock guard(impl_->lock);
  auto it = impl_->sources.find(source);
  if (it == impl_->sources.end()) return 0;
  return gpu ? it->second->gpu_blocks : it->second->other_blocks;
}

size_t Inventory::nodes() const {
  return impl_->node_count.load(std::memory_order_relaxed);
}

size_t Inventory::bytes() const {
  std::shared_lock guard(impl_->lock);
  return impl_->bytes();
}

uint64_t Inventory::pruned() const {
  return impl_->pruned.load(std::memory_order_relaxed);
}

}  // namespace kvgate::kv
