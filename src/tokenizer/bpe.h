// tokenizer/bpe: the BPE model of a tokenizer.json (vocabulary, ranked merges, byte fallback,
// unknown token), the flat hash tables behind it, and the per-thread word -> ids cache.
//
// Byte-level models (a ByteLevel pre-tokenizer in front) are run on raw bytes: the vocabulary is
// re-keyed at load time from the GPT-2 byte alphabet ("Ġhello") to the bytes it stands for
// (" hello"), so encoding never maps bytes to alphabet characters and back. Merges work on ids.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvgate::tokenizer::detail {

// Byte <-> GPT-2 byte-level alphabet character (the printable Latin-1 bytes stand for themselves,
// the rest map to U+0100..U+0143).
char32_t byte_to_char(uint8_t b);
// The byte a character stands for, or -1 when it is not in the alphabet.
int char_to_byte(char32_t c);
// Rewrites `token` (UTF-8) from alphabet characters to bytes; false when a character is outside
// the alphabet.
bool unmap_byte_level(std::string_view token, std::string& out);

uint64_t hash_bytes(std::string_view s);

// String -> id, open addressing over an arena of keys. Build once, then read-only.
class StringIdMap {
 public:
  void reserve(size_t n);
  // Adds key -> id; a repeated key keeps its last id.
  void insert(std::string_view key, int32_t id);
  void finish();  // builds the table
  std::optional<int32_t> find(std::string_view key) const;
  size_t size() const { return ids_.size(); }
  size_t memory_bytes() const;

 private:
  struct Slot {
    uint32_t entry_plus_one;
    uint32_t hash;
  };
  std::string arena_;
  std::vector<uint32_t> offsets_;  // entry i: arena_[offsets_[i], offsets_[i+1])
  std::vector<int32_t> ids_;
  std::vector<Slot> slots_;
  uint64_t mask_ = 0;
  std::string_view key(uint32_t entry) const {
    return std::string_view(arena_).substr(offsets_[entry], offsets_[entry + 1] - offsets_[entry]);
  }
};

// (left id, right id) -> (rank, merged id).
class PairMap {
 public:
  void build(const std::vector<std::array<int32_t, 4>>& merges);  // {left, right, rank, merged}
  // Rank and merged id of a pair, or rank = UINT32_MAX when the pair does not merge.
  struct Hit {
    uint32_t rank;
    int32_t merged;
  };
  Hit find(int32_t left, int32_t right) const {
    uint64_t key =
        (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
    for (uint64_t i = slot_of(key);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) return {s.rank, s.merged};
      if (s.key == kEmpty) return {UINT32_MAX, -1};
    }
  }
  size_t memory_bytes() const { return slots_.capacity() * sizeof(Slot); }

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  struct Slot {
    uint64_t key;
    uint32_t rank;
    int32_t merged;
  };
  uint64_t slot_of(uint64_t key) const { return (key * 0x9E3779B97F4A7C15ull) >> shift_; }
  std::vector<Slot> slots_;
  uint64_t mask_ = 0;
  int shift_ = 63;
};

// Direct-mapped cache of word -> ids for one tokenizer on one thread (no locks: every thread has
// its own). Words longer than kMaxKey bytes or of more than kMaxIds tokens are not cached.
class WordCache {
 public:
  static constexpr size_t kSlots = 8192;
  static constexpr size_t kMaxKey = 30;
  static constexpr size_t kMaxIds = 8;
  WordCache();
  // Appends the cached ids of `word` to `out`; false on a miss.
  bool get(std::string_view word, uint64_t hash, std::vector<int32_t>& out) const;
  void put(std::string_view word, uint64_t hash, const int32_t* ids, size_t n);

 private:
  struct Entry {
    uint64_t hash;
    uint8_t key_len;
    uint8_t n_ids;
    char key[kMaxKey];
    int32_t ids[kMaxIds];
  };
  std::vector<Entry> entries_;
};

struct BpeOptions {
  bool byte_level = false;  // a ByteLevel pre-tokenizer feeds the model
};

class Bpe {
 public:
  // `model` is the tokenizer.json "model" object as JSON text.
  static std::unique_ptr<Bpe> load(std::string_view model_json, const BpeOptions& options,
                                   std::string& error);

  // Appends the ids of one pre-token. `cache` may be null.
  void tokenize(std::string_view word, std::vector<int32_t>& out, WordCache* cache) const;
  // Heap bytes of the calling thread's merge scratch (at most ~1 MiB between words).
  static size_t thread_scratch_bytes();

  std::optional<int32_t> token_to_id(std::string_view token) const;  // as written in the vocab
  // The vocabulary string of an id ("" when unknown).
  std::string_view id_to_token(int32_t id) const;
  // The bytes an id stands for (byte-level models: the unmapped bytes; others: the token text).
  std::string_view id_to_bytes(int32_t id) const;
  int32_t max_id() const { return max_id_; }
  bool byte_level() const { return byte_level_; }
  size_t memory_bytes() const;

 private:
  Bpe() = default;
  void merge_small(std::vector<int32_t>& syms) const;
  void merge_large(std::vector<int32_t>& syms) const;
  void initial_symbols(std::string_view word, std::vector<int32_t>& syms) const;

  bool byte_level_ = false;
  bool ignore_merges_ = false;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  int32_t unk_id_ = -1;
  int32_t max_id_ = -1;
  std::array<int32_t, 256> byte_ids_{};      // byte-level: id of each single byte
  std::array<int32_t, 256> fallback_ids_{};  // byte_fallback: id of <0xXX>
  StringIdMap vocab_;                        // key: bytes (byte-level) or token text
  StringIdMap text_vocab_;                   // byte-level only: key: token text
  PairMap merges_;
  // id -> token text and id -> bytes, as arenas.
  std::string text_arena_;
  std::vector<uint32_t> text_offsets_;
  std::string bytes_arena_;
  std::vector<uint32_t> bytes_offsets_;
};

}  // namespace kvgate::tokenizer::detail
