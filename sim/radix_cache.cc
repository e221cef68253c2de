// sim/radix_cache: see radix_cache.h.
#include "sim/radix_cache.h"

#include <algorithm>
#include <cassert>
#include <optional>
#include <string>
#include <utility>

namespace kvgate::sim {

struct RadixCache::Node {
  std::vector<int32_t> key;         // a whole number of pages
  std::vector<kv::Digest> digests;  // one per page (events only)
  Node* parent = nullptr;
  Space* space = nullptr;                        // the namespace (null: the default one)
  std::unordered_map<uint64_t, Node*> children;  // by child_key() of the child's first page
  int64_t lock_ref = 0;
  uint64_t access = 0;
  bool in_leaves = false;
  bool is_root = false;

  int64_t size() const { return static_cast<int64_t>(key.size()); }
};

// A namespace other than the default one: its own subtree, and what its blocks' events carry.
struct RadixCache::Space {
  std::string cache_salt;  // "" = none
  std::string lora;        // "" = none
  kv::Digest salt_seed{};  // the parent digest of the first page (salted chains)
  kv::Digest lora_seed{};
  Node* root = nullptr;
  int64_t handles = 0;  // requests holding a handle in this namespace
};

namespace {

bool same(std::span<const int32_t> a, std::span<const int32_t> b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

}  // namespace

RadixCache::RadixCache(RadixCacheConfig config)
    : config_(config), hasher_(config.scheme), root_(new Node) {
  assert(config_.page_size > 0);
  root_->is_root = true;
}

RadixCache::~RadixCache() {
  destroy(root_);
  for (auto& [k, sp] : spaces_) destroy(sp->root);
}

void RadixCache::destroy(Node* n) {
  std::vector<Node*> stack{n};
  while (!stack.empty()) {
    Node* x = stack.back();
    stack.pop_back();
    for (auto& [k, c] : x->children) stack.push_back(c);
    delete x;
  }
}

RadixCache::Space* RadixCache::space_of(const CacheNamespace& ns, bool create) {
  if (ns.empty()) return nullptr;
  auto key = std::make_pair(ns.cache_salt, ns.lora);
  auto it = spaces_.find(key);
  if (it != spaces_.end()) return it->second.get();
  if (!create) return nullptr;
  auto sp = std::make_unique<Space>();
  sp->cache_salt = ns.cache_salt;
  sp->lora = ns.lora;
  if (!ns.cache_salt.empty()) sp->salt_seed = kv::sglang_salt_seed(ns.cache_salt);
  if (!ns.lora.empty()) sp->lora_seed = kv::sglang_lora_seed(ns.lora);
  sp->root = new Node;
  sp->root->is_root = true;
  sp->root->space = sp.get();
  Space* out = sp.get();
  spaces_.emplace(std::move(key), std::move(sp));
  return out;
}

RadixCache::Node* RadixCache::root_of(const Space* sp) const {
  return sp ? sp->root : root_;
}

// A namespace with no pages and no request holding it is forgotten (a salt per user must not grow
// the cache without bound).
void RadixCache::drop_if_unused(Space* sp) {
  if (!sp || sp->handles > 0 || !sp->root->children.empty()) return;
  delete sp->root;
  spaces_.erase({sp->cache_salt, sp->lora});
}

uint64_t RadixCache::child_key(std::span<const int32_t> page) const {
  if (page.size() == 1) return static_cast<uint32_t>(page[0]);
  uint64_t h = 0x9e3779b97f4a7c15ull ^ page.size();
  for (int32_t t : page) {
    h ^= static_cast<uint32_t>(t);
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 29;
  }
  return h;
}

RadixCache::Node* RadixCache::find_child(const Node* node, std::span<const int32_t> page) const {
  auto it = node->children.find(child_key(page));
  if (it == node->children.end()) return nullptr;
  Node* c = it->second;
  // Two different pages with the same 64-bit key: treated as a miss (and never cached).
  if (!same(std::span<const int32_t>(c->key).first(page.size()), page)) return nullptr;
  return c;
}

void RadixCache::touch(Node* n) {
  if (n->in_leaves) leaves_.erase({n->access, n});
  n->access = ++tick_;
  if (n->in_leaves) leaves_.emplace(n->access, n);
}

void RadixCache::update_leaf(Node* n) {
  bool evictable = !n->is_root && n->lock_ref == 0 && n->children.empty();
  if (evictable && !n->in_leaves) {
    leaves_.emplace(n->access, n);
    n->in_leaves = true;
  } else if (!evictable && n->in_leaves) {
    leaves_.erase({n->access, n});
    n->in_leaves = false;
  }
}

void RadixCache::lock(Node* n) {
  for (Node* x = n; x != nullptr && !x->is_root; x = x->parent) {
    if (x->lock_ref == 0) {
      evictable_ -= x->size();
      locked_ += x->size();
    }
    ++x->lock_ref;
    update_leaf(x);
  }
}

void RadixCache::unlock(Node* n) {
  for (Node* x = n; x != nullptr && !x->is_root; x = x->parent) {
    assert(x->lock_ref > 0);
    if (x->lock_ref == 1) {
      evictable_ += x->size();
      locked_ -= x->size();
    }
    --x->lock_ref;
    update_leaf(x);
  }
}

int64_t RadixCache::match(Node* root, std::span<const int32_t> tokens, Node*& last,
                          bool touch_path) {
  const auto page = static_cast<size_t>(config_.page_size);
  const size_t n = tokens.size() / page * page;
  Node* node = root;
  size_t pos = 0;
  while (pos + page <= n) {
    Node* child = find_child(node, tokens.subspan(pos, page));
    if (child == nullptr) break;
    if (touch_path) touch(child);
    const size_t klen = child->key.size();
    size_t m = page;
    while (m < klen && pos + m + page <= n &&
           same(std::span<const int32_t>(child->key).subspan(m, page),
                tokens.subspan(pos + m, page))) {
      m += page;
    }
    pos += m;
    if (m < klen) {
      // The match ends inside the node: split it so a lock can end exactly there.
      if (touch_path) node = split(child, static_cast<int64_t>(m));
      break;
    }
    node = child;
  }
  last = node;
  return static_cast<int64_t>(pos);
}

RadixCache::Node* RadixCache::split(Node* child, int64_t at) {
  auto* n = new Node;
  ++nodes_;
  const auto a = static_cast<size_t>(at);
  n->key.assign(child->key.begin(), child->key.begin() + static_cast<std::ptrdiff_t>(a));
  child->key.erase(child->key.begin(), child->key.begin() + static_cast<std::ptrdiff_t>(a));
  if (!child->digests.empty()) {
    auto pages = static_cast<std::ptrdiff_t>(a / static_cast<size_t>(config_.page_size));
    n->digests.assign(child->digests.begin(), child->digests.begin() + pages);
    child->digests.erase(child->digests.begin(), child->digests.begin() + pages);
  }
  Node* parent = child->parent;
  n->parent = parent;
  n->space = child->space;
  n->lock_ref = child->lock_ref;
  n->access = child->access;
  const auto page = static_cast<size_t>(config_.page_size);
  parent->children[child_key(std::span<const int32_t>(n->key).first(page))] = n;
  n->children.emplace(child_key(std::span<const int32_t>(child->key).first(page)), child);
  child->parent = n;
  return n;
}

RadixCache::Node* RadixCache::insert(Node* root, std::span<const int32_t> tokens,
                                     int64_t& prefix_len, int64_t& end_len) {
  const auto page = static_cast<size_t>(config_.page_size);
  const size_t n = tokens.size() / page * page;
  Node* node = root;
  size_t pos = 0;
  while (pos < n) {
    auto page_tokens = tokens.subspan(pos, page);
    auto it = node->children.find(child_key(page_tokens));
    if (it == node->children.end()) break;
    Node* child = it->second;
    if (!same(std::span<const int32_t>(child->key).first(page), page_tokens)) {
      prefix_len = end_len = static_cast<int64_t>(pos);  // a key collision: cache no further
      return node;
    }
    touch(child);
    const size_t klen = child->key.size();
    size_t m = page;
    while (m < klen && pos + m < n &&
           same(std::span<const int32_t>(child->key).subspan(m, page),
                tokens.subspan(pos + m, page))) {
      m += page;
    }
    if (m < klen) child = split(child, static_cast<int64_t>(m));
    node = child;
    pos += m;
  }
  prefix_len = static_cast<int64_t>(pos);
  if (pos < n) {
    auto* leaf = new Node;
    ++nodes_;
    leaf->key.assign(tokens.begin() + static_cast<std::ptrdiff_t>(pos),
                     tokens.begin() + static_cast<std::ptrdiff_t>(n));
    leaf->parent = node;
    leaf->space = root->space;
    leaf->access = ++tick_;
    node->children.emplace(child_key(tokens.subspan(pos, page)), leaf);
    evictable_ += leaf->size();
    hash_pages(leaf);
    record_stored(leaf);
    update_leaf(node);
    update_leaf(leaf);
    node = leaf;
  }
  end_len = static_cast<int64_t>(n);
  return node;
}

RadixCache::Handle RadixCache::acquire(std::span<const int32_t> tokens, const CacheNamespace& ns) {
  Space* sp = space_of(ns, true);
  if (sp) ++sp->handles;
  Node* last = nullptr;
  int64_t m = match(root_of(sp), tokens, last, true);
  lock(last);
  return Handle{last, sp, m, m};
}

int64_t RadixCache::peek_match(std::span<const int32_t> tokens, const CacheNamespace& ns) const {
  auto* self = const_cast<RadixCache*>(this);
  Space* sp = self->space_of(ns, false);
  if (!ns.empty() && !sp) return 0;
  Node* last = nullptr;
  return self->match(root_of(sp), tokens, last, false);
}

bool RadixCache::allocate(Handle& h, int64_t n) {
  if (n <= 0) return true;
  if (free_tokens() < n) evict(n - free_tokens());
  if (free_tokens() < n) return false;
  private_ += n;
  h.kv_len += n;
  return true;
}

void RadixCache::commit(Handle& h, std::span<const int32_t> seq) {
  const int64_t page = config_.page_size;
  const int64_t len = std::min<int64_t>(h.kv_len, static_cast<int64_t>(seq.size())) / page * page;
  if (len <= h.tree_len) return;
  int64_t prefix_len = 0, end_len = 0;
  Node* last = insert(root_of(h.space), seq.first(static_cast<size_t>(len)), prefix_len, end_len);
  if (end_len <= h.tree_len) return;
  // [tree_len, prefix_len): pages someone else cached meanwhile, the request's copies are freed;
  // [prefix_len, end_len): moved into the tree by insert(). Both leave the private slots.
  private_ -= end_len - h.tree_len;
  lock(last);
  unlock(h.node);
  h.node = last;
  h.tree_len = end_len;
}

void RadixCache::release(Handle& h, std::span<const int32_t> seq, bool insert_seq) {
  if (insert_seq) commit(h, seq);
  private_ -= h.kv_len - h.tree_len;
  unlock(h.node);
  if (h.space) {
    --h.space->handles;
    drop_if_unused(h.space);
  }
  h = Handle{};
}

int64_t RadixCache::evict(int64_t n) {
  int64_t freed = 0;
  while (freed < n && !leaves_.empty()) {
    Node* x = leaves_.begin()->second;
    leaves_.erase(leaves_.begin());
    x->in_leaves = false;
    record_removed(x);
    Node* parent = x->parent;
    const auto page = static_cast<size_t>(config_.page_size);
    parent->children.erase(child_key(std::span<const int32_t>(x->key).first(page)));
    evictable_ -= x->size();
    freed += x->size();
    delete x;
    --nodes_;
    update_leaf(parent);
    if (parent->is_root) drop_if_unused(parent->space);
  }
  return freed;
}

void RadixCache::reset() {
  for (auto& [k, c] : root_->children) destroy(c);
  root_->children.clear();
  // Only requests hold namespaces, and none may run during a reset.
  for (auto& [k, sp] : spaces_) destroy(sp->root);
  spaces_.clear();
  leaves_.clear();
  evictable_ = 0;
  locked_ = 0;
  nodes_ = 0;
  record_all_cleared();
}

void RadixCache::record_all_cleared() {
  if (config_.events) enqueue(kv::AllBlocksCleared{});
}

void RadixCache::hash_pages(Node* n) {
  if (!config_.events) return;
  const auto page = static_cast<size_t>(config_.page_size);
  const size_t pages = n->key.size() / page;
  n->digests.reserve(pages);
  const kv::Digest* parent = nullptr;
  if (!n->parent->is_root && !n->parent->digests.empty()) {
    parent = &n->parent->digests.back();
  } else if (n->space && !n->space->cache_salt.empty() &&
             config_.scheme == kv::HashScheme::kSglang) {
    parent = &n->space->salt_seed;  // a salted chain starts from the salt's seed
  }
  for (size_t i = 0; i < pages; ++i) {
    n->digests.push_back(
        hasher_.page(parent, std::span<const int32_t>(n->key).subspan(i * page, page)));
    parent = &n->digests.back();
  }
}

uint64_t RadixCache::published_id(const Node* n, const kv::Digest& d) const {
  const uint64_t id = hasher_.id(d);
  if (n->space && !n->space->lora.empty() && config_.scheme == kv::HashScheme::kSglang) {
    return kv::sglang_lora_block_id(n->space->lora_seed, id);
  }
  return id;
}

void RadixCache::enqueue(kv::Event e) {
  if (config_.grouping == EventGrouping::kMerged && !events_.empty()) {
    kv::Event& tail = events_.back();
    if (auto* s = std::get_if<kv::BlockStored>(&e)) {
      auto* t = std::get_if<kv::BlockStored>(&tail);
      // SGLang's KVCacheEventRecorder.enqueue: a store continuing the tail's chain joins it.
      if (t && t->medium == s->medium && t->lora_id == s->lora_id &&
          t->block_size == s->block_size && t->cache_salt == s->cache_salt &&
          t->lora_name == s->lora_name && !t->block_hashes.empty() &&
          s->parent_block_hash == t->block_hashes.back()) {
        t->block_hashes.insert(t->block_hashes.end(), s->block_hashes.begin(),
                               s->block_hashes.end());
        t->token_ids.insert(t->token_ids.end(), s->token_ids.begin(), s->token_ids.end());
        return;
      }
    } else if (auto* r = std::get_if<kv::BlockRemoved>(&e)) {
      auto* t = std::get_if<kv::BlockRemoved>(&tail);
      if (t && t->medium == r->medium) {
        t->block_hashes.insert(t->block_hashes.end(), r->block_hashes.begin(),
                               r->block_hashes.end());
        return;
      }
    }
  }
  events_.push_back(std::move(e));
}

void RadixCache::record_stored(const Node* n) {
  if (!config_.events) return;
  const auto page = static_cast<size_t>(config_.page_size);
  std::optional<uint64_t> parent;
  if (!n->parent->is_root && !n->parent->digests.empty()) {
    parent = published_id(n->parent, n->parent->digests.back());
  }
  std::optional<std::string> salt;
  if (n->space && !n->space->cache_salt.empty()) salt = n->space->cache_salt;
  // SGLang's recorder names the adapter of a LoRA namespace in every store (lora_name).
  std::optional<std::string> lora;
  if (n->space && !n->space->lora.empty()) lora = n->space->lora;
  if (config_.grouping == EventGrouping::kPerNode) {
    kv::BlockStored s;
    s.block_hashes.reserve(n->digests.size());
    for (const auto& d : n->digests) s.block_hashes.push_back(published_id(n, d));
    s.parent_block_hash = parent;
    s.token_ids = n->key;
    s.block_size = config_.page_size;
    s.medium = kv::Medium::kGpu;
    s.cache_salt = salt;
    s.lora_name = lora;
    enqueue(std::move(s));
    return;
  }
  // One BlockStored per page, as SGLang records them (merged by enqueue() in kMerged).
  for (size_t i = 0; i < n->digests.size(); ++i) {
    kv::BlockStored s;
    const uint64_t id = published_id(n, n->digests[i]);
    s.block_hashes.push_back(id);
    s.parent_block_hash = parent;
    auto tokens = std::span<const int32_t>(n->key).subspan(i * page, page);
    s.token_ids.assign(tokens.begin(), tokens.end());
    s.block_size = config_.page_size;
    s.medium = kv::Medium::kGpu;
    s.cache_salt = salt;
    s.lora_name = lora;
    enqueue(std::move(s));
    parent = id;
  }
}

void RadixCache::record_removed(const Node* n) {
  if (!config_.events) return;
  if (config_.grouping != EventGrouping::kPerPage) {
    // One BlockRemoved per node (vLLM; SGLang's record_remove, merged by enqueue()).
    kv::BlockRemoved r;
    for (const auto& d : n->digests) r.block_hashes.push_back(published_id(n, d));
    r.medium = kv::Medium::kGpu;
    enqueue(std::move(r));
    return;
  }
  for (const auto& d : n->digests) {
    kv::BlockRemoved r;
    r.block_hashes.push_back(published_id(n, d));
    r.medium = kv::Medium::kGpu;
    enqueue(std::move(r));
  }
}

std::vector<kv::Event> RadixCache::take_events() {
  std::vector<kv::Event> out;
  out.swap(events_);
  return out;
}

}  // namespace kvgate::sim
