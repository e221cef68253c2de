// sim/radix_cache: one DP rank's KV cache, as SGLang's RadixCache keeps it. A radix tree of token
// ids in pages of page_size tokens (only full pages are cached), a capacity in tokens shared with
// the KV slots running requests hold privately, lock counts that pin the pages running requests
// use, and LRU eviction of unlocked leaves. With events on, every page carries its block hash
// (kv::BlockHasher) and the tree records BlockStored / BlockRemoved / AllBlocksCleared events
// exactly as SGLang emits them (one event per page), or grouped per tree node as vLLM emits them.
// Not thread-safe: one scheduler owns it.
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/block_hash.h"
#include "kv/events.h"

namespace kvgate::sim {

struct RadixCacheConfig {
  int64_t page_size = 1;
  int64_t capacity = 400000;  // KV slots (tokens) of the rank
  bool events = false;        // hash pages and record KV events
  kv::HashScheme scheme = kv::HashScheme::kSglang;
  bool group_blocks = false;  // one event per tree node (vLLM) instead of one per page (SGLang)
};

class RadixCache {
 public:
  struct Node;

  // What one request holds in the cache (SGLang's req.last_node / cache_protected_len / KV len).
  struct Handle {
    Node* node = nullptr;  // the locked end of its cached prefix (null: nothing locked)
    int64_t tree_len = 0;  // tokens of its sequence held in the tree under that lock
    int64_t kv_len = 0;    // tokens of its sequence with KV (tree_len of them in the tree)
  };

  explicit RadixCache(RadixCacheConfig config);
  ~RadixCache();
  RadixCache(const RadixCache&) = delete;
  RadixCache& operator=(const RadixCache&) = delete;

  const RadixCacheConfig& config() const { return config_; }

  // Starts a request: matches the longest cached run of whole pages of `tokens` (the caller limits
  // it, as SGLang matches at most prompt_len - 1 tokens), locks it, and returns the handle with
  // kv_len = tree_len = the matched length. Refreshes the LRU order of the matched path.
  Handle acquire(std::span<const int32_t> tokens);
  // The length acquire() would match, without locking or touching anything.
  int64_t peek_match(std::span<const int32_t> tokens) const;

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

  // The events recorded since the last call, in order.
  std::vector<kv::Event> take_events();
  bool has_events() const { return !events_.empty(); }

 private:
  int64_t match(std::span<const int32_t> tokens, Node*& last, bool touch);
  Node* insert(std::span<const int32_t> tokens, int64_t& prefix_len, int64_t& end_len);
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
  std::vector<kv::Event> events_;
};

}  // namespace kvgate::sim
