// tokenizer/piece_cache: a bounded cache of the ids of text pieces, shared by the request threads
// (and by every tokenizer of a process: entries are keyed on the tokenizer too).
//
// Why it is exact: a tokenizer first splits its input on the added tokens that are matched in
// raw text (<|im_start|>, <|eot_id|>, <s>, ...); each piece between two of them then goes through
// the normalizer, the pre-tokenizer and the model on its own, so its ids are a function of its
// bytes alone (Tokenizer::Impl::encode_text; the tokenizer refuses the cache for the one HF
// component whose output depends on where a piece sits in the whole text: a Metaspace
// pre-tokenizer with prepend_scheme "first"). A chat's rendered prompt is mostly such pieces, one
// or two per message, and the prompt of turn N+1 repeats those of turn N: the engines' prefix
// caches reuse their KV, this cache reuses their ids.
//
// Keys are verified byte for byte (the 64-bit hash only finds the slot); a hash collision is a
// miss, never wrong ids. Bounded by the accounted bytes of its entries (the text, the ids and
// kEntryOverheadBytes each for the nodes and the index), split over shards, each with its own
// mutex and least-recently-used list: request threads rarely meet on one shard, and a hit holds it
// for a hash lookup and a copy of the ids.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

namespace kvgate::tokenizer {

class PieceCache {
 public:
  // Pieces shorter than this are tokenized every time. Every non-empty piece is looked up: even
  // the "\n" between two chat turns costs ~2,000 instructions through the pipeline (normalizer
  // check, regex calls) against ~200 for a hit, and such pieces are few and shared by every chat.
  static constexpr size_t kMinPieceBytes = 1;
  // What an entry costs beyond its text and ids, as glibc's allocator sees it: the LRU list node
  // with the entry (112), the index node (32) and its share of the buckets (up to 16), the
  // headers of the text's and the ids' allocations (16 each).
  static constexpr size_t kEntryOverheadBytes = 192;
  static constexpr size_t kShards = 16;

  // `capacity_bytes` bounds the accounted bytes of all entries (each shard holds a sixteenth). A
  // piece whose entry would take more than an eighth of a shard is not cached (one huge document
  // would otherwise flush a shard for an entry that is rarely asked again).
  explicit PieceCache(size_t capacity_bytes);
  ~PieceCache();
  PieceCache(const PieceCache&) = delete;
  PieceCache& operator=(const PieceCache&) = delete;

  // Appends to `out` the ids cached for `piece` under `owner` (a tokenizer's identity) and
  // returns true; false on a miss. `hash` is detail::hash_bytes(piece).
  bool get(uint64_t owner, std::string_view piece, uint64_t hash, std::vector<int32_t>& out);
  // Caches `ids` as the ids of `piece` under `owner` (replacing an entry of the same slot),
  // evicting the least recently used entries of its shard beyond the bound.
  void put(uint64_t owner, std::string_view piece, uint64_t hash, std::span<const int32_t> ids);
  // Drops every entry (the counters stay).
  void clear();

  // Whether a piece of this many bytes is looked up at all.
  static bool cacheable(size_t piece_bytes) { return piece_bytes >= kMinPieceBytes; }
  static size_t entry_bytes(size_t piece_bytes, size_t n_ids) {
    return piece_bytes + n_ids * sizeof(int32_t) + kEntryOverheadBytes;
  }

  struct Stats {
    uint64_t hits = 0;
    uint64_t misses = 0;
    uint64_t inserts = 0;
    uint64_t evictions = 0;  // entries dropped to stay within the bound
    uint64_t too_large = 0;  // pieces not cached because their entry exceeds the per-entry bound
    uint64_t entries = 0;    // held now
    uint64_t bytes = 0;      // accounted bytes held now (<= capacity_bytes)
    uint64_t capacity_bytes = 0;
  };
  // A consistent view of each shard (summed one shard at a time).
  Stats stats() const;
  size_t capacity_bytes() const { return capacity_bytes_; }

 private:
  struct Shard;
  Shard& shard_of(uint64_t key);
  size_t capacity_bytes_;
  std::unique_ptr<Shard[]> shards_;
};

}  // namespace kvgate::tokenizer
