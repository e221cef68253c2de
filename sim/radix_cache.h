// sim/radix_cache: one DP rank's KV cache, as SGLang's RadixCache keeps it. A radix tree of token
// ids in pages of page_size tokens (only full pages are cached), a capacity in tokens shared with
// the KV slots running requests hold privately, lock counts that pin the pages running requests
// use, and LRU eviction of unlocked leaves.
//
// Namespaces: a request's cache_salt and LoRA adapter (SGLang's RadixKey cache_salt and extra_key,
// which carries the adapter's id) put its prefix in a subtree of its own, so a salted or adapter
// request never matches another namespace's pages (mem_cache/radix_cache.py match_prefix).
//
// With events on, every page carries its block hash (kv::BlockHasher; a salted chain starts from
// the salt's seed, an adapter's ids are mixed with the adapter's seed, see kv/block_hash.h) and the
// tree records BlockStored / BlockRemoved / AllBlocksCleared events as SGLang does:
//   kMerged  (newest SGLang, mem_cache/events.py KVCacheEventRecorder.enqueue): each page's store
//            is merged into the previous event when it continues that event's chain (n hashes,
//            n x page_size tokens); one BlockRemoved per evicted node, merged with a BlockRemoved
//            right before it.
//   kPerPage (older SGLang builds): one BlockStored and one BlockRemoved per page.
//   kPerNode (vLLM): one event per tree node.
// Salted blocks carry their salt (the BlockStored metadata element).
// Not thread-safe: one scheduler owns it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kv/block_hash.h"
#include "kv/events.h"

namespace kvgate::sim {

enum class EventGrouping : uint8_t { kMerged, kPerPage, kPerNode };

struct RadixCacheConfig {
  int64_t page_size = 1;
  int64_t capacity = 400000;  // KV slots (tokens) of the rank
  bool events = false;        // hash pages and record KV events
  kv::HashScheme scheme = kv::HashScheme::kSglang;
  EventGrouping grouping = EventGrouping::kMerged;
};

// The namespace of a request's prefix: its cache_salt ("" = none; SGLang treats an empty salt as
// none) and LoRA adapter name ("" = the base model).
struct CacheNamespace {
  std::string cache_salt;
  std::string lora;
  bool empty() const { return cache_salt.empty() && lora.empty(); }
  bool operator==(const CacheNamespace&) const = default;
};

class RadixCache {
 public:
  struct Node;
  struct Space;

  // What one request holds in the cache (SGLang's req.last_node / cache_protected_len / KV len).
  struct Handle {
    Node* node = nullptr;    // the locked end of its cached prefix (null: nothing locked)
    Space* space = nullptr;  // its namespace (null: the default one)
    int64_t tree_len = 0;    // tokens of its sequence held in the tree under that lock
    int64_t kv_len = 0;      // tokens of its sequence with KV (tree_len of them in the tree)
  };

  explicit RadixCache(RadixCacheConfig config);
  ~RadixCache();
  RadixCache(const RadixCache&) = delete;
  RadixCache& operator=(const RadixCache&) = delete;

  const RadixCacheConfig& config() const { return config_; }

  // Starts a request: matches the longest cached run of whole pages of `tokens` (the caller limits
  // it, as SGLang matches at most prompt_len - 1 tokens), locks it, and returns the handle with
  // kv_len = tree_len = the matched length. Refreshes the LRU order of the matched path.
  // `ns` picks the request's namespace.
  Handle acquire(std::span<const int32_t> tokens, const CacheNamespace& ns = {});
  // The length acquire() would match, without locking or touching anything.
  int64_t peek_match(std::span<const int32_t> tokens, const CacheNamespace& ns = {}) const;

  // Allocates `n` private KV slots for a request (evicting unlocked leaves when needed).
  // False when even eviction cannot make room (nothing is allocated then).
  bool allocate(Handle& h, int64_t n);
  // SGLang's cache_unfinished_req: inserts the full pages of `seq[0:h.kv_len]` into the tree and
  // moves the request's lock to their end (their private slots become tree pages, duplicates of
  // pages already cached are freed).
  void commit(Handle& h, std::span<const int32_t> seq);
  // SGLang's cache_finished_req: commit() when `insert`, then frees the request's private slots
  // (the unaligned tail) and drops its lock.
  void release(Handle& h, std::span<const int32_t> seq, bool insert);

  // Evicts unlocked leaves, least recently used first, until `n` tokens are freed or none is left.
  int64_t evict(int64_t n);
  // Empties the tree (no request may hold a handle) and records AllBlocksCleared.
  void reset();
  // Records AllBlocksCleared without touching the tree (SGLang's first event after start).
  void record_all_cleared();

  int64_t capacity() const { return config_.capacity; }
  int64_t tree_tokens() const { return evictable_ + locked_; }
  int64_t evictable_tokens() const { return evictable_; }
  int64_t locked_tokens() const { return locked_; }
  int64_t private_tokens() const { return private_; }
  int64_t free_tokens() const { return config_.capacity - tree_tokens() - private_; }
  // SGLang's num_used_tokens: capacity - (free + evictable) = locked pages + private slots.
  int64_t used_tokens() const { return locked_ + private_; }
  size_t node_count() const { return nodes_; }
  // Namespaces other than the default one that hold pages or requests.
  size_t namespace_count() const { return spaces_.size(); }

  // The events recorded since the last call, in order.
  std::vector<kv::Event> take_events();
  bool has_events() const { return !events_.empty(); }

 private:
  int64_t match(Node* root, std::span<const int32_t> tokens, Node*& last, bool touch);
  Node* insert(Node* root, std::span<const int32_t> tokens, int64_t& prefix_len, int64_t& end_len);
  Space* space_of(const CacheNamespace& ns, bool create);
  Node* root_of(const Space* sp) const;
  void drop_if_unused(Space* sp);
  uint64_t published_id(const Node* n, const kv::Digest& d) const;
  void enqueue(kv::Event e);
  Node* split(Node* child, int64_t at);
  Node* find_child(const Node* node, std::span<const int32_t> page) const;
  uint64_t child_key(std::span<const int32_t> page) const;
  void lock(Node* n);
  void unlock(Node* n);
  void touch(Node* n);
  void update_leaf(Node* n);
  void hash_pages(Node* n);
  void record_stored(const Node* n);
  void record_removed(const Node* n);
  void destroy(Node* n);

  RadixCacheConfig config_;
  kv::BlockHasher hasher_;
  Node* root_;
  int64_t evictable_ = 0;
  int64_t locked_ = 0;
  int64_t private_ = 0;
  size_t nodes_ = 0;
  uint64_t tick_ = 0;
  std::set<std::pair<uint64_t, Node*>> leaves_;  // evictable leaves by last access
  std::map<std::pair<std::string, std::string>, std::unique_ptr<Space>> spaces_;  // salt, lora
  std::vector<kv::Event> events_;
};

}  // namespace kvgate::sim
