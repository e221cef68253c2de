// prefix/approx_tree: cache_aware's approximate radix tree of request text. It records which
// workers ("slots", small integers chosen by the policy) were sent which text, character by
// character (Unicode code points; edges are stored as UTF-8 and split only at code point
// boundaries), with a last-access epoch per slot per node for LRU eviction. A slot present on a
// node is present on all its ancestors, so a slot's match length is the depth of the deepest node
// on the text's path that holds it.
//
// Thread-safe: matches share a reader lock, changes take the writer lock, each for the length of
// one walk down the tree (microseconds), never across a request.
#pragma once

#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <span>
#include <string_view>
#include <vector>

namespace kvgate::prefix {

using Slot = uint32_t;  // a worker id

class ApproxTree;

// Where a match of a text ended, so that recording the same text under the chosen slot
// (ApproxTree::insert) starts there instead of comparing the whole text again: a long prompt is
// walked once per request, not twice. Only valid while the tree has not changed shape since the
// match (checked by insert: the tree's id and its version of the shape); otherwise insert walks
// from the root as without one. Also carries the text's length in characters.
struct PathHint {
  static constexpr size_t kMaxNodes = 8;
  uint64_t tree = 0;     // ApproxTree::id() of the tree matched; 0: no hint
  uint64_t version = 0;  // the tree's shape version at the match
  const char* text = nullptr;
  size_t text_size = 0;
  size_t total_chars = 0;  // characters of the text
  // The nodes the text covers whole, from the root's child down (at most kMaxNodes of them), the
  // bytes and characters of the text they cover.
  const void* nodes[kMaxNodes] = {};
  size_t node_count = 0;
  size_t pos = 0;
  size_t depth = 0;
  // Whether this is a hint (of some tree's match) of this very text (its bytes, where they lie).
  bool for_text(std::string_view s) const {
    return tree != 0 && text == s.data() && text_size == s.size();
  }
  bool matches(const ApproxTree& t, std::string_view s) const;  // ... of a match on t
};

class ApproxTree {
 public:
  ApproxTree();
  ~ApproxTree();
  ApproxTree(const ApproxTree&) = delete;
  ApproxTree& operator=(const ApproxTree&) = delete;

  // For each slot in `slots`, the number of characters of `text` it matches (written to
  // `matched`, same order). Returns the number of characters in `text`.
  size_t match(std::string_view text, std::span<const Slot> slots, std::span<size_t> matched) const;
  // The same for one slot (a binary search per node on the path: no work per other slot).
  size_t match_one(std::string_view text, Slot slot) const;
  // The longest match of `text` among the slots `accept` takes, without looking at each of them:
  // returns its length in characters (0: none of them holds any of it) and appends to `slots`
  // every slot `accept` takes that matches that much (none when 0). `total` gets the number of
  // characters of `text`. Cost: the path, plus the slots of the nodes looked at from its deepest
  // up to the first one holding a slot `accept` takes.
  struct SlotFilter {
    bool (*fn)(const void* self, Slot slot);
    const void* self;
  };
  size_t match_best(std::string_view text, const SlotFilter& accept, std::vector<Slot>& slots,
                    size_t& total, PathHint* hint = nullptr) const;
  // Records `text` as sent to `slot` (now the most recently used). With the hint a match of the
  // same text on this tree left, the walk starts where the match ended if the tree's shape has
  // not changed since (same result either way).
  // Returns whether the walk started from the hint.
  bool insert(std::string_view text, Slot slot, const PathHint* hint = nullptr);
  // `slot` does not hold `text` beyond its first `keep_chars` characters: it is removed from that
  // point of the path on, with everything below it (a cache cannot hold an extension of a prefix
  // it lost).
  void truncate(std::string_view text, Slot slot, size_t keep_chars);
  // Removes least-recently-used leaves of every slot holding more than `max_chars` characters
  // until it holds at most that many. Returns the characters removed.
  size_t evict(size_t max_chars);
  // Forgets a slot entirely (its worker left the pool).
  void remove_slot(Slot slot);

  size_t chars_of(Slot slot) const;  // characters attributed to slot
  size_t stored_chars() const;       // characters in all edges (each stored once)
  size_t node_count() const;
  bool empty() const;                  // no text recorded (only the root)
  uint64_t id() const { return id_; }  // unique among the process's trees (never 0)
  size_t memory_bytes() const;         // approximate heap bytes held

  struct Node;

 private:
  void remove_from_subtree(Node* top, Slot slot);
  void prune(Node* n);  // deletes n (and empty ancestors) when it holds no slot and no children
  size_t& count_of(Slot slot);
  // Calls visit(node, depth, whole) for each node on `text`'s path from the root (depth: the
  // characters matched down to and into it; whole: the text covers the node's whole label) until
  // visit returns false or the text leaves the tree. mu_ held.
  template <class Visit>
  void walk(std::string_view text, Visit&& visit) const;

  mutable std::shared_mutex mu_;
  const uint64_t id_;
  // Changes whenever a node may have been freed, split or relabelled (a hint's node pointers and
  // byte positions stay true while it does not). New leaves leave it alone.
  uint64_t shape_version_ = 0;
  std::unique_ptr<Node> root_;
  std::vector<size_t> slot_chars_;
  uint64_t epoch_ = 0;
  size_t nodes_ = 1;
  size_t stored_chars_ = 0;
};

// Number of code points in UTF-8 text (continuation bytes are not counted).
size_t count_chars(std::string_view s);

}  // namespace kvgate::prefix
