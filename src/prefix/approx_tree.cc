// prefix/approx_tree: see approx_tree.h.
#include "prefix/approx_tree.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <queue>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace kvgate::prefix {
namespace {

struct Tenant {
  Slot slot;
  uint64_t last;  // epoch of the last insert through this node for this slot
};

bool is_continuation(unsigned char c) {
  return (c & 0xc0) == 0x80;
}

// First code point of s (s non-empty). Invalid bytes count as one code point each.
uint32_t first_code_point(std::string_view s) {
  auto b = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  unsigned char c = b(0);
  if (c < 0x80) return c;
  size_t n = (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 1;
  if (n == 1 || n > s.size()) return 0x110000u + c;  // outside Unicode: an invalid byte
  uint32_t cp = c & (0x7f >> n);
  for (size_t i = 1; i < n; ++i) {
    if (!is_continuation(b(i))) return 0x110000u + c;
    cp = (cp << 6) | (b(i) & 0x3f);
  }
  return cp;
}

// Length in bytes of the longest common prefix of a and b that ends on a character boundary.
// Compares sixteen bytes at a time (SSE2, every x86-64), then eight: prompts share thousands of
// characters.
size_t common_prefix(std::string_view a, std::string_view b) {
  size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  bool found = false;
#if defined(__SSE2__)
  // Sixty-four bytes per step while they all match (one mask for four compares), then sixteen.
  auto eq16 = [&](size_t at) {
    return _mm_cmpeq_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a.data() + at)),
                          _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.data() + at)));
  };
  while (i + 64 <= n) {
    __m128i all = _mm_and_si128(_mm_and_si128(eq16(i), eq16(i + 16)),
                                _mm_and_si128(eq16(i + 32), eq16(i + 48)));
    if (_mm_movemask_epi8(all) != 0xffff) break;
    i += 64;
  }
  while (!found && i + 16 <= n) {
    __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a.data() + i));
    __m128i y = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.data() + i));
    auto equal = static_cast<unsigned>(_mm_movemask_epi8(_mm_cmpeq_epi8(x, y)));
    if (equal != 0xffffu) {
      i += static_cast<size_t>(__builtin_ctz(~equal));  // the first differing byte
      found = true;
    } else {
      i += 16;
    }
  }
#endif
  while (!found && i + 8 <= n) {
    uint64_t x, y;
    std::memcpy(&x, a.data() + i, 8);
    std::memcpy(&y, b.data() + i, 8);
    if (x != y) {
      i += static_cast<size_t>(__builtin_ctzll(x ^ y)) / 8;  // little-endian: first differing byte
      found = true;
    } else {
      i += 8;
    }
  }
  while (!found && i < n && a[i] == b[i]) ++i;
  if (i < a.size() && i < b.size()) {
    while (i > 0 && is_continuation(static_cast<unsigned char>(a[i]))) --i;
  }
  return i;
}

// Byte offset of the character number `chars` in s (or s.size()).
size_t byte_offset(std::string_view s, size_t chars) {
  size_t i = 0;
  while (i < s.size() && chars > 0) {
    ++i;
    while (i < s.size() && is_continuation(static_cast<unsigned char>(s[i]))) ++i;
    --chars;
  }
  return i;
}

}  // namespace

size_t count_chars(std::string_view s) {
  // Characters = bytes - continuation bytes (10xxxxxx).
  const char* p = s.data();
  const size_t n = s.size();
  size_t continuation = 0;
  size_t i = 0;
#if defined(__SSE2__)
  // Sixteen bytes at a time: a byte counter per lane (at most 255 rounds), summed by psadbw.
  const __m128i top = _mm_set1_epi8(static_cast<char>(0xc0));
  const __m128i cont = _mm_set1_epi8(static_cast<char>(0x80));
  while (i + 16 <= n) {
    __m128i counts = _mm_setzero_si128();
    for (int round = 0; round < 255 && i + 16 <= n; ++round, i += 16) {
      __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i));
      // 0xff where a continuation byte: subtracting it adds one.
      counts = _mm_sub_epi8(counts, _mm_cmpeq_epi8(_mm_and_si128(v, top), cont));
    }
    __m128i sums = _mm_sad_epu8(counts, _mm_setzero_si128());
    continuation += static_cast<size_t>(_mm_cvtsi128_si32(sums)) +
                    static_cast<size_t>(_mm_extract_epi16(sums, 4));
  }
#endif
  for (; i < n; ++i) continuation += (static_cast<unsigned char>(p[i]) & 0xc0) == 0x80;
  return n - continuation;
}

struct ApproxTree::Node {
  std::string label;
  uint32_t chars = 0;
  Node* parent = nullptr;
  std::vector<uint32_t> keys;  // first code point of each child, parallel to children
  std::vector<std::unique_ptr<Node>> children;
  std::vector<Tenant> tenants;  // by slot: a lookup is a binary search, however many workers

  int child_index(uint32_t cp) const {
    for (size_t i = 0; i < keys.size(); ++i) {
      if (keys[i] == cp) return static_cast<int>(i);
    }
    return -1;
  }
  std::vector<Tenant>::const_iterator lower(Slot s) const {
    return std::lower_bound(tenants.begin(), tenants.end(), s,
                            [](const Tenant& t, Slot x) { return t.slot < x; });
  }
  Tenant* tenant(Slot s) {
    auto it = lower(s);
    if (it == tenants.end() || it->slot != s) return nullptr;
    return &tenants[static_cast<size_t>(it - tenants.begin())];
  }
  bool holds(Slot s) const {
    auto it = lower(s);
    return it != tenants.end() && it->slot == s;
  }
  void add_tenant(Slot s, uint64_t now) { tenants.insert(lower(s), Tenant{s, now}); }
  bool child_holds(Slot s) const {
    return std::any_of(children.begin(), children.end(),
                       [s](const auto& c) { return c->holds(s); });
  }
  void drop_tenant(Slot s) {
    tenants.erase(std::remove_if(tenants.begin(), tenants.end(),
                                 [s](const Tenant& t) { return t.slot == s; }),
                  tenants.end());
  }
  std::unique_ptr<Node> detach(Node* child) {
    for (size_t i = 0; i < children.size(); ++i) {
      if (children[i].get() == child) {
        std::unique_ptr<Node> out = std::move(children[i]);
        children.erase(children.begin() + static_cast<ptrdiff_t>(i));
        keys.erase(keys.begin() + static_cast<ptrdiff_t>(i));
        return out;
      }
    }
    return nullptr;
  }
};

namespace {
std::atomic<uint64_t> next_tree_id{1};
}  // namespace

ApproxTree::ApproxTree()
    : id_(next_tree_id.fetch_add(1, std::memory_order_relaxed)), root_(std::make_unique<Node>()) {}

ApproxTree::~ApproxTree() {
  // Iterative teardown: a deep tree must not recurse once per level.
  std::vector<std::unique_ptr<Node>> stack;
  stack.push_back(std::move(root_));
  while (!stack.empty()) {
    std::unique_ptr<Node> n = std::move(stack.back());
    stack.pop_back();
    for (auto& c : n->children) stack.push_back(std::move(c));
  }
}

size_t& ApproxTree::count_of(Slot slot) {
  if (slot >= slot_chars_.size()) slot_chars_.resize(size_t{slot} + 1, 0);
  return slot_chars_[slot];
}

template <class Visit>
void ApproxTree::walk(std::string_view text, Visit&& visit) const {
  const Node* n = root_.get();
  size_t pos = 0, depth = 0;
  while (pos < text.size()) {
    int i = n->child_index(first_code_point(text.substr(pos)));
    if (i < 0) return;
    const Node* c = n->children[static_cast<size_t>(i)].get();
    size_t common = common_prefix(text.substr(pos), c->label);
    bool whole = common == c->label.size();
    depth += whole ? c->chars : count_chars(c->label.substr(0, common));
    if (!visit(c, depth, whole) || !whole) return;
    pos += common;
    n = c;
  }
}

size_t ApproxTree::match(std::string_view text, std::span<const Slot> slots,
                         std::span<size_t> matched) const {
  std::fill(matched.begin(), matched.end(), 0);
  std::shared_lock lock(mu_);
  size_t pos = 0, whole_depth = 0;
  walk(text, [&](const Node* c, size_t depth, bool whole) {
    for (size_t k = 0; k < slots.size(); ++k) {
      if (c->holds(slots[k])) matched[k] = depth;
    }
    if (whole) {
      pos += c->label.size();
      whole_depth = depth;
    }
    return true;
  });
  lock.unlock();
  // The characters of the path are known: only the rest of the text needs counting.
  return whole_depth + count_chars(text.substr(pos));
}

size_t ApproxTree::match_one(std::string_view text, Slot slot) const {
  std::shared_lock lock(mu_);
  size_t matched = 0;
  walk(text, [&](const Node* c, size_t depth, bool) {
    // A slot on a node is on all its ancestors: below the first node without it, none has it.
    if (!c->holds(slot)) return false;
    matched = depth;
    return true;
  });
  return matched;
}

size_t ApproxTree::match_best(std::string_view text, const SlotFilter& accept,
                              std::vector<Slot>& slots, size_t& total, PathHint* hint) const {
  // The nodes on the text's path and their depths; then, from the deepest, the first holding a
  // slot `accept` takes (depths grow strictly along a path, so its slots are all the slots whose
  // match is the longest).
  thread_local std::vector<std::pair<const Node*, size_t>> path;
  path.clear();
  size_t best = 0, pos = 0, whole_depth = 0;
  if (hint) {
    hint->node_count = hint->pos = hint->depth = 0;
  }
  {
    std::shared_lock lock(mu_);
    walk(text, [&](const Node* c, size_t depth, bool whole) {
      path.emplace_back(c, depth);
      if (whole) {
        pos += c->label.size();
        whole_depth = depth;
        if (hint && hint->node_count < PathHint::kMaxNodes) {
          // Read while the lock is held: once it is released a writer may split or free them.
          hint->nodes[hint->node_count++] = c;
          hint->pos = pos;
          hint->depth = depth;
        }
      }
      return true;
    });
    for (auto it = path.rbegin(); it != path.rend() && best == 0; ++it) {
      for (const Tenant& t : it->first->tenants) {
        if (accept.fn(accept.self, t.slot)) {
          slots.push_back(t.slot);
          best = it->second;
        }
      }
    }
    if (hint) {
      hint->tree = id_;
      hint->version = shape_version_;
    }
  }
  // The characters of the path are known: only the rest of the text needs counting.
  total = whole_depth + count_chars(text.substr(pos));
  if (hint) {
    hint->text = text.data();
    hint->text_size = text.size();
    hint->total_chars = total;
  }
  return best;
}

bool PathHint::matches(const ApproxTree& t, std::string_view s) const {
  return for_text(s) && tree == t.id();
}

bool ApproxTree::insert(std::string_view text, Slot slot, const PathHint* hint) {
  std::unique_lock lock(mu_);
  uint64_t now = ++epoch_;
  size_t& held = count_of(slot);
  Node* n = root_.get();
  size_t pos = 0;
  // The characters of the text before `pos` when its total is known (from the hint): a new
  // leaf's count is then the difference, not a count of the rest.
  size_t depth = 0;
  const bool known = hint && hint->matches(*this, text);
  const bool from_hint = known && hint->version == shape_version_;
  if (from_hint) {
    // The tree has the shape the match saw: the nodes it covered whole are still the path.
    for (size_t k = 0; k < hint->node_count; ++k) {
      // NOLINTNEXTLINE(cppcoreguidelines-pro-type-const-cast): the tree's own node, lock held
      Node* c = const_cast<Node*>(static_cast<const Node*>(hint->nodes[k]));
      if (Tenant* t = c->tenant(slot)) {
        t->last = now;
      } else {
        c->add_tenant(slot, now);
        held += c->chars;
      }
      n = c;
    }
    pos = hint->pos;
    depth = hint->depth;
  }
  while (pos < text.size()) {
    std::string_view rest = text.substr(pos);
    uint32_t cp = first_code_point(rest);
    int i = n->child_index(cp);
    // A child under the same key the text shares no character with: only invalid UTF-8 does that
    // (a lead byte without its continuation bytes is one character to the key, the start of one
    // to the compare). The text gets a leaf of its own there (no later walk reaches it; eviction
    // does) rather than an empty split, which would never make progress.
    size_t common = i < 0 ? 0 : common_prefix(rest, n->children[static_cast<size_t>(i)]->label);
    for (size_t j = static_cast<size_t>(i) + 1; i >= 0 && common == 0 && j < n->keys.size(); ++j) {
      // A leaf made for such a text before (one per distinct text, not one per insert).
      if (n->keys[j] != cp) continue;
      common = common_prefix(rest, n->children[j]->label);
      if (common > 0) i = static_cast<int>(j);
    }
    if (common == 0) {
      auto leaf = std::make_unique<Node>();
      leaf->label.assign(rest);
      leaf->chars = static_cast<uint32_t>(known ? hint->total_chars - depth : count_chars(rest));
      leaf->parent = n;
      leaf->tenants.push_back({slot, now});
      held += leaf->chars;
      stored_chars_ += leaf->chars;
      ++nodes_;
      n->keys.push_back(cp);
      n->children.push_back(std::move(leaf));
      return from_hint;
    }
    auto& owned = n->children[static_cast<size_t>(i)];
    Node* c = owned.get();
    if (common < c->label.size()) {
      // Split c: the shared part becomes a new node holding c's tenants, c keeps the rest.
      auto mid = std::make_unique<Node>();
      mid->label.assign(c->label, 0, common);
      mid->chars = static_cast<uint32_t>(count_chars(mid->label));
      mid->parent = n;
      mid->tenants = c->tenants;
      c->label.erase(0, common);
      c->chars -= mid->chars;
      c->parent = mid.get();
      mid->keys.push_back(first_code_point(c->label));
      mid->children.push_back(std::move(owned));
      owned = std::move(mid);
      c = owned.get();
      ++nodes_;
      ++shape_version_;
    }
    if (Tenant* t = c->tenant(slot)) {
      t->last = now;
    } else {
      c->add_tenant(slot, now);
      held += c->chars;
    }
    pos += common;
    depth += c->chars;
    n = c;
  }
  return from_hint;
}

void ApproxTree::remove_from_subtree(Node* top, Slot slot) {
  // Remove the slot everywhere below (and at) top. A node left with no slot at all has no slot
  // below it either, so each such node whose parent keeps a slot is cut off with its subtree.
  std::vector<std::pair<Node*, bool>> stack{{top, false}};  // node, an ancestor is being cut
  std::vector<Node*> cut;
  size_t& held = count_of(slot);
  while (!stack.empty()) {
    auto [n, below_cut] = stack.back();
    stack.pop_back();
    if (!n->holds(slot)) continue;  // the slot is on no node below either
    n->drop_tenant(slot);
    held -= n->chars;
    bool cut_here = n->tenants.empty() && !below_cut;
    if (cut_here) cut.push_back(n);
    for (auto& c : n->children) stack.emplace_back(c.get(), below_cut || cut_here);
  }
  for (Node* n : cut) prune(n);
}

void ApproxTree::prune(Node* n) {
  while (n != root_.get() && n->tenants.empty()) {
    Node* parent = n->parent;
    std::unique_ptr<Node> gone = parent->detach(n);
    // Count what goes with it (its subtree holds no tenant either).
    std::vector<Node*> stack{gone.get()};
    while (!stack.empty()) {
      Node* x = stack.back();
      stack.pop_back();
      stored_chars_ -= x->chars;
      --nodes_;
      for (auto& c : x->children) stack.push_back(c.get());
    }
    std::vector<std::unique_ptr<Node>> drop;
    drop.push_back(std::move(gone));
    while (!drop.empty()) {
      std::unique_ptr<Node> x = std::move(drop.back());
      drop.pop_back();
      for (auto& c : x->children) drop.push_back(std::move(c));
    }
    if (!parent->children.empty()) break;
    n = parent;
  }
}

void ApproxTree::truncate(std::string_view text, Slot slot, size_t keep_chars) {
  std::unique_lock lock(mu_);
  ++shape_version_;
  Node* n = root_.get();
  size_t pos = 0, depth = 0;
  while (pos < text.size()) {
    int i = n->child_index(first_code_point(text.substr(pos)));
    if (i < 0) return;
    Node* c = n->children[static_cast<size_t>(i)].get();
    if (!c->holds(slot)) return;  // the slot's part of this path ends before the cut
    size_t common = common_prefix(text.substr(pos), c->label);
    bool whole = common == c->label.size();
    size_t covered = whole ? c->chars : count_chars(c->label.substr(0, common));
    if (depth + covered <= keep_chars) {
      // The text leaves the tree inside c before the cut: nothing of it lies beyond.
      if (!whole) return;
      depth += c->chars;
      pos += common;
      n = c;
      continue;
    }
    // The cut falls inside the part of c the text covers (depth <= keep_chars here): c is split
    // there (the kept part is less than c, so both parts are non-empty).
    size_t keep_here = keep_chars - depth;
    if (keep_here > 0) {
      // Split c so the kept part stays attributed to the slot.
      size_t bytes = byte_offset(c->label, keep_here);
      auto& owned = n->children[static_cast<size_t>(i)];
      auto mid = std::make_unique<Node>();
      mid->label.assign(c->label, 0, bytes);
      mid->chars = static_cast<uint32_t>(keep_here);
      mid->parent = n;
      mid->tenants = c->tenants;
      c->label.erase(0, bytes);
      c->chars -= mid->chars;
      c->parent = mid.get();
      mid->keys.push_back(first_code_point(c->label));
      mid->children.push_back(std::move(owned));
      owned = std::move(mid);
      ++nodes_;
    }
    remove_from_subtree(c, slot);
    return;
  }
}

size_t ApproxTree::evict(size_t max_chars) {
  std::unique_lock lock(mu_);
  ++shape_version_;
  size_t removed = 0;
  for (size_t s = 0; s < slot_chars_.size(); ++s) {
    if (slot_chars_[s] <= max_chars) continue;
    Slot slot = static_cast<Slot>(s);
    using Entry = std::pair<uint64_t, Node*>;
    std::priority_queue<Entry, std::vector<Entry>, std::greater<>> leaves;
    std::vector<Node*> stack;
    for (auto& c : root_->children) stack.push_back(c.get());
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      const Tenant* t = n->tenant(slot);
      if (!t) continue;
      if (!n->child_holds(slot)) leaves.push({t->last, n});
      for (auto& c : n->children) stack.push_back(c.get());
    }
    while (slot_chars_[s] > max_chars && !leaves.empty()) {
      Node* n = leaves.top().second;
      leaves.pop();
      Node* parent = n->parent;
      n->drop_tenant(slot);
      slot_chars_[s] -= n->chars;
      removed += n->chars;
      if (n->tenants.empty() && n->children.empty()) prune(n);
      if (parent != root_.get()) {
        if (const Tenant* pt = parent->tenant(slot); pt && !parent->child_holds(slot)) {
          leaves.push({pt->last, parent});
        }
      }
    }
  }
  return removed;
}

void ApproxTree::remove_slot(Slot slot) {
  std::unique_lock lock(mu_);
  ++shape_version_;
  std::vector<Node*> tops;
  for (auto& c : root_->children) tops.push_back(c.get());
  for (Node* t : tops) remove_from_subtree(t, slot);
  if (slot < slot_chars_.size()) slot_chars_[slot] = 0;
}

size_t ApproxTree::chars_of(Slot slot) const {
  std::shared_lock lock(mu_);
  return slot < slot_chars_.size() ? slot_chars_[slot] : 0;
}

size_t ApproxTree::stored_chars() const {
  std::shared_lock lock(mu_);
  return stored_chars_;
}

size_t ApproxTree::node_count() const {
  std::shared_lock lock(mu_);
  return nodes_;
}

bool ApproxTree::empty() const {
  std::shared_lock lock(mu_);
  return root_->children.empty();
}

size_t ApproxTree::memory_bytes() const {
  std::shared_lock lock(mu_);
  size_t bytes = 0;
  std::vector<const Node*> stack{root_.get()};
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    bytes += sizeof(Node) + sizeof(std::unique_ptr<Node>);
    if (n->label.capacity() > 15) bytes += n->label.capacity() + 1;
    bytes += n->keys.capacity() * sizeof(uint32_t) +
             n->children.capacity() * sizeof(std::unique_ptr<Node>) +
             n->tenants.capacity() * sizeof(Tenant);
    for (const auto& c : n->children) stack.push_back(c.get());
  }
  return bytes;
}

}  // namespace kvgate::prefix
