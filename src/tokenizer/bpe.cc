// tokenizer/bpe: see bpe.h.
#include "tokenizer/bpe.h"

#include <simdjson.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <queue>

#include "tokenizer/unicode.h"

namespace kvgate::tokenizer::detail {
namespace {

struct ByteTables {
  std::array<char32_t, 256> to_char{};
  std::array<int, 0x144> to_byte{};
  ByteTables() {
    to_byte.fill(-1);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      to_char[b] = printable ? static_cast<char32_t>(b) : next++;
      to_byte[to_char[b]] = b;
    }
  }
};

const ByteTables& byte_tables() {
  static const ByteTables t;
  return t;
}

uint64_t next_pow2(uint64_t n) {
  uint64_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

}  // namespace

char32_t byte_to_char(uint8_t b) {
  return byte_tables().to_char[b];
}

int char_to_byte(char32_t c) {
  if (c >= 0x144) return -1;
  return byte_tables().to_byte[c];
}

bool unmap_byte_level(std::string_view token, std::string& out) {
  size_t i = 0;
  while (i < token.size()) {
    char32_t c = unicode::next_code_point(token, i);
    int b = char_to_byte(c);
    if (b < 0) return false;
    out.push_back(static_cast<char>(b));
  }
  return true;
}

uint64_t hash_bytes(std::string_view s) {
  return XXH3_64bits(s.data(), s.size());
}

// ---- StringIdMap ----

void StringIdMap::reserve(size_t n) {
  offsets_.reserve(n + 1);
  ids_.reserve(n);
}

void StringIdMap::insert(std::string_view key, int32_t id) {
  if (offsets_.empty()) offsets_.push_back(0);
  arena_.append(key);
  offsets_.push_back(static_cast<uint32_t>(arena_.size()));
  ids_.push_back(id);
}

void StringIdMap::finish() {
  if (offsets_.empty()) offsets_.push_back(0);
  uint64_t cap = next_pow2(std::max<uint64_t>(16, ids_.size() * 2));
  slots_.assign(cap, Slot{0, 0});
  mask_ = cap - 1;
  for (uint32_t e = 0; e < ids_.size(); ++e) {
    uint64_t h = hash_bytes(key(e));
    auto h32 = static_cast<uint32_t>(h >> 32);
    for (uint64_t i = h & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.entry_plus_one == 0) {
        s = Slot{e + 1, h32};
        break;
      }
      if (s.hash == h32 && key(s.entry_plus_one - 1) == key(e)) {
        s.entry_plus_one = e + 1;  // a repeated key: the last one wins
        break;
      }
    }
  }
}

std::optional<int32_t> StringIdMap::find(std::string_view k) const {
  if (slots_.empty()) return std::nullopt;
  uint64_t h = hash_bytes(k);
  auto h32 = static_cast<uint32_t>(h >> 32);
  for (uint64_t i = h & mask_;; i = (i + 1) & mask_) {
    const Slot& s = slots_[i];
    if (s.entry_plus_one == 0) return std::nullopt;
    if (s.hash == h32 && key(s.entry_plus_one - 1) == k) return ids_[s.entry_plus_one - 1];
  }
}

size_t StringIdMap::memory_bytes() const {
  return arena_.capacity() + offsets_.capacity() * 4 + ids_.capacity() * 4 +
         slots_.capacity() * sizeof(Slot);
}

// ---- PairMap ----

void PairMap::build(const std::vector<std::array<int32_t, 4>>& merges) {
  uint64_t cap = next_pow2(std::max<uint64_t>(16, merges.size() * 2));
  slots_.assign(cap, Slot{kEmpty, 0, 0});
  mask_ = cap - 1;
  shift_ = 64 - std::countr_zero(cap);
  for (const auto& m : merges) {
    uint64_t key =
        (static_cast<uint64_t>(static_cast<uint32_t>(m[0])) << 32) | static_cast<uint32_t>(m[1]);
    for (uint64_t i = slot_of(key);; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.key == kEmpty || s.key == key) {  // a repeated pair: the later line wins (as HF)
        s = Slot{key, static_cast<uint32_t>(m[2]), m[3]};
        break;
      }
    }
  }
}

// ---- WordCache ----

WordCache::WordCache() : entries_(kSlots) {
  for (auto& e : entries_) {
    e.hash = 0;
    e.key_len = 0xFF;  // never matches
    e.n_ids = 0;
  }
}

bool WordCache::get(std::string_view word, uint64_t hash, std::vector<int32_t>& out) const {
  if (word.size() > kMaxKey) return false;
  const Entry& e = entries_[hash & (kSlots - 1)];
  if (e.hash != hash || e.key_len != word.size() ||
      std::memcmp(e.key, word.data(), word.size()) != 0) {
    return false;
  }
  out.insert(out.end(), e.ids, e.ids + e.n_ids);
  return true;
}

void WordCache::put(std::string_view word, uint64_t hash, const int32_t* ids, size_t n) {
  if (word.size() > kMaxKey || n > kMaxIds) return;
  Entry& e = entries_[hash & (kSlots - 1)];
  e.hash = hash;
  e.key_len = static_cast<uint8_t>(word.size());
  e.n_ids = static_cast<uint8_t>(n);
  std::memcpy(e.key, word.data(), word.size());
  std::memcpy(e.ids, ids, n * sizeof(int32_t));
}

// ---- Bpe ----

std::unique_ptr<Bpe> Bpe::load(std::string_view model_json, const BpeOptions& options,
                               std::string& error) {
  simdjson::dom::parser parser;
  simdjson::padded_string padded(model_json);
  simdjson::dom::element model;
  if (auto e = parser.parse(padded).get(model); e) {
    error = std::string("model: invalid JSON: ") + simdjson::error_message(e);
    return nullptr;
  }
  std::unique_ptr<Bpe> bpe(new Bpe());
  bpe->byte_level_ = options.byte_level;

  // Options the model can carry; anything that changes tokenization and is not handled is refused.
  if (auto d = model["dropout"]; !d.error() && !d.is_null()) {
    double v = 0;
    if (d.get(v) || v != 0.0) {
      error = "model: BPE dropout is not supported (non-deterministic tokenization)";
      return nullptr;
    }
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (auto v = model[key]; !v.error() && !v.is_null()) {
      std::string_view s;
      if (v.get(s) || !s.empty()) {
        error = std::string("model: BPE ") + key + " is not supported";
        return nullptr;
      }
    }
  }
  auto flag = [&](const char* key) {
    bool b = false;
    if (auto v = model[key]; !v.error() && !v.is_null() && v.get(b)) b = false;
    return b;
  };
  bpe->ignore_merges_ = flag("ignore_merges");
  bpe->byte_fallback_ = flag("byte_fallback");
  bpe->fuse_unk_ = flag("fuse_unk");

  simdjson::dom::object vocab;
  if (model["vocab"].get(vocab)) {
    error = "model: BPE without a vocab object";
    return nullptr;
  }
  const size_t n = vocab.size();
  std::vector<std::pair<int32_t, std::string_view>> entries;
  entries.reserve(n);
  for (auto [key, value] : vocab) {
    int64_t id = 0;
    if (value.get(id) || id < 0 || id > (1 << 30)) {
      error = "model: vocab id of '" + std::string(key) + "' is not a valid integer";
      return nullptr;
    }
    entries.emplace_back(static_cast<int32_t>(id), key);
    bpe->max_id_ = std::max(bpe->max_id_, static_cast<int32_t>(id));
  }
  // id -> text / bytes arenas.
  const auto slots = static_cast<size_t>(bpe->max_id_) + 1;
  std::vector<std::string_view> text_of(slots);
  for (auto& [id, text] : entries) text_of[static_cast<size_t>(id)] = text;
  bpe->text_offsets_.reserve(slots + 1);
  bpe->bytes_offsets_.reserve(slots + 1);
  bpe->text_offsets_.push_back(0);
  bpe->bytes_offsets_.push_back(0);
  std::string raw;
  for (size_t id = 0; id < slots; ++id) {
    bpe->text_arena_.append(text_of[id]);
    bpe->text_offsets_.push_back(static_cast<uint32_t>(bpe->text_arena_.size()));
    raw.clear();
    if (!options.byte_level || !unmap_byte_level(text_of[id], raw)) {
      raw.assign(text_of[id]);
    }
    bpe->bytes_arena_.append(raw);
    bpe->bytes_offsets_.push_back(static_cast<uint32_t>(bpe->bytes_arena_.size()));
  }
  bpe->vocab_.reserve(n);
  if (options.byte_level) bpe->text_vocab_.reserve(n);
  for (auto& [id, text] : entries) {
    if (options.byte_level) {
      raw.clear();
      // A token outside the byte alphabet can never come out of byte-level pre-tokens.
      if (unmap_byte_level(text, raw)) bpe->vocab_.insert(raw, id);
      bpe->text_vocab_.insert(text, id);
    } else {
      bpe->vocab_.insert(text, id);
    }
  }
  bpe->vocab_.finish();
  if (options.byte_level) bpe->text_vocab_.finish();

  bpe->byte_ids_.fill(-1);
  bpe->fallback_ids_.fill(-1);
  for (int b = 0; b < 256; ++b) {
    char one = static_cast<char>(b);
    if (options.byte_level) {
      if (auto id = bpe->vocab_.find(std::string_view(&one, 1))) bpe->byte_ids_[b] = *id;
    }
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    if (auto id = bpe->token_to_id(name)) bpe->fallback_ids_[b] = *id;
  }
  if (auto u = model["unk_token"]; !u.error() && !u.is_null()) {
    std::string_view unk;
    if (!u.get(unk)) {
      auto id = bpe->token_to_id(unk);
      if (!id) {
        error = "model: unk_token '" + std::string(unk) + "' is not in the vocab";
        return nullptr;
      }
      bpe->unk_id_ = *id;
    }
  }

  // Merges: ["a b", ...] or [["a", "b"], ...]; rank = position.
  simdjson::dom::array merges;
  if (model["merges"].get(merges)) {
    error = "model: BPE without a merges array";
    return nullptr;
  }
  std::vector<std::array<int32_t, 4>> table;
  table.reserve(merges.size());
  int32_t rank = 0;
  std::string joined;
  for (auto m : merges) {
    std::string_view a, b;
    if (m.is_string()) {
      std::string_view line = m.get_string().value_unsafe();
      size_t sp = line.find(' ');
      if (sp == std::string_view::npos || line.find(' ', sp + 1) != std::string_view::npos) {
        error = "model: merge '" + std::string(line) + "' is not two tokens";
        return nullptr;
      }
      a = line.substr(0, sp);
      b = line.substr(sp + 1);
    } else {
      simdjson::dom::array pair;
      if (m.get(pair) || pair.size() != 2 || pair.at(0).get(a) || pair.at(1).get(b)) {
        error = "model: a merge is neither \"a b\" nor [\"a\", \"b\"]";
        return nullptr;
      }
    }
    joined.assign(a).append(b);
    auto ia = bpe->token_to_id(a), ib = bpe->token_to_id(b), ij = bpe->token_to_id(joined);
    if (!ia || !ib || !ij) {
      error = "model: merge '" + std::string(a) + " " + std::string(b) +
              "' uses a token that is not in the vocab";
      return nullptr;
    }
    table.push_back({*ia, *ib, rank++, *ij});
  }
  bpe->merges_.build(table);
  return bpe;
}

std::optional<int32_t> Bpe::token_to_id(std::string_view token) const {
  return byte_level_ ? text_vocab_.find(token) : vocab_.find(token);
}

std::string_view Bpe::id_to_token(int32_t id) const {
  if (id < 0 || id > max_id_) return {};
  auto i = static_cast<size_t>(id);
  return std::string_view(text_arena_)
      .substr(text_offsets_[i], text_offsets_[i + 1] - text_offsets_[i]);
}

std::string_view Bpe::id_to_bytes(int32_t id) const {
  if (id < 0 || id > max_id_) return {};
  auto i = static_cast<size_t>(id);
  return std::string_view(bytes_arena_)
      .substr(bytes_offsets_[i], bytes_offsets_[i + 1] - bytes_offsets_[i]);
}

size_t Bpe::memory_bytes() const {
  return sizeof(*this) + vocab_.memory_bytes() + text_vocab_.memory_bytes() +
         merges_.memory_bytes() + text_arena_.capacity() + bytes_arena_.capacity() +
         (text_offsets_.capacity() + bytes_offsets_.capacity()) * 4;
}

void Bpe::initial_symbols(std::string_view word, std::vector<int32_t>& syms) const {
  if (byte_level_) {
    for (char c : word) {
      int32_t id = byte_ids_[static_cast<unsigned char>(c)];
      if (id >= 0) syms.push_back(id);  // a byte outside the vocab is dropped (as HF without unk)
    }
    return;
  }
  // Character-level start (SentencePiece-style BPE): one symbol per code point, else its bytes
  // as <0xXX> tokens (byte_fallback), else the unknown token (fused when fuse_unk).
  bool pending_unk = false;
  size_t i = 0;
  while (i < word.size()) {
    size_t len = unicode::sequence_length(static_cast<unsigned char>(word[i]));
    len = std::min(len, word.size() - i);
    std::string_view ch = word.substr(i, len);
    i += len;
    if (auto id = vocab_.find(ch)) {
      if (pending_unk) syms.push_back(unk_id_);
      pending_unk = false;
      syms.push_back(*id);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (char c : ch) all = all && fallback_ids_[static_cast<unsigned char>(c)] >= 0;
      if (all) {
        // HF keeps a pending unknown token until the next known symbol.
        for (char c : ch) syms.push_back(fallback_ids_[static_cast<unsigned char>(c)]);
        continue;
      }
    }
    if (unk_id_ >= 0) {
      if (pending_unk && !fuse_unk_) syms.push_back(unk_id_);
      pending_unk = true;
    }
  }
  if (pending_unk) syms.push_back(unk_id_);
}

// Lowest rank first, leftmost on ties: the same result as HF's heap of (rank, position).
void Bpe::merge_small(std::vector<int32_t>& syms) const {
  size_t n = syms.size();
  if (n < 2) return;
  uint32_t ranks[64];
  int32_t merged[64];
  for (size_t i = 0; i + 1 < n; ++i) {
    auto h = merges_.find(syms[i], syms[i + 1]);
    ranks[i] = h.rank;
    merged[i] = h.merged;
  }
  while (n > 1) {
    size_t best = 0;
    uint32_t best_rank = ranks[0];
    for (size_t i = 1; i + 1 < n; ++i) {
      if (ranks[i] < best_rank) {
        best_rank = ranks[i];
        best = i;
      }
    }
    if (best_rank == UINT32_MAX) break;
    syms[best] = merged[best];
    // Remove symbol best+1 and pair best+1.
    for (size_t i = best + 1; i + 1 < n; ++i) syms[i] = syms[i + 1];
    for (size_t i = best + 1; i + 2 < n; ++i) {
      ranks[i] = ranks[i + 1];
      merged[i] = merged[i + 1];
    }
    --n;
    if (best > 0) {
      auto h = merges_.find(syms[best - 1], syms[best]);
      ranks[best - 1] = h.rank;
      merged[best - 1] = h.merged;
    }
    if (best + 1 < n) {
      auto h = merges_.find(syms[best], syms[best + 1]);
      ranks[best] = h.rank;
      merged[best] = h.merged;
    }
  }
  syms.resize(n);
}

// Long words: a heap of candidate merges over a linked list of symbols, O(n log n).
void Bpe::merge_large(std::vector<int32_t>& syms) const {
  const size_t n = syms.size();
  struct Cand {
    uint32_t rank;
    uint32_t pos;
    int32_t merged;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::vector<int32_t> prev(n), next(n);
  std::vector<uint8_t> alive(n, 1);
  for (size_t i = 0; i < n; ++i) {
    prev[i] = static_cast<int32_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
  }
  std::priority_queue<Cand, std::vector<Cand>, std::greater<>> heap;
  for (size_t i = 0; i + 1 < n; ++i) {
    auto h = merges_.find(syms[i], syms[i + 1]);
    if (h.rank != UINT32_MAX) heap.push({h.rank, static_cast<uint32_t>(i), h.merged});
  }
  while (!heap.empty()) {
    Cand top = heap.top();
    heap.pop();
    size_t p = top.pos;
    if (!alive[p] || next[p] < 0) continue;
    auto q = static_cast<size_t>(next[p]);
    auto h = merges_.find(syms[p], syms[q]);
    if (h.rank == UINT32_MAX || h.merged != top.merged) continue;  // stale entry
    syms[p] = top.merged;
    alive[q] = 0;
    next[p] = next[q];
    if (next[q] >= 0) prev[static_cast<size_t>(next[q])] = static_cast<int32_t>(p);
    if (prev[p] >= 0) {
      auto l = static_cast<size_t>(prev[p]);
      auto hl = merges_.find(syms[l], syms[p]);
      if (hl.rank != UINT32_MAX) heap.push({hl.rank, static_cast<uint32_t>(l), hl.merged});
    }
    if (next[p] >= 0) {
      auto r = static_cast<size_t>(next[p]);
      auto hr = merges_.find(syms[p], syms[r]);
      if (hr.rank != UINT32_MAX) heap.push({hr.rank, static_cast<uint32_t>(p), hr.merged});
    }
  }
  size_t w = 0;
  for (size_t i = 0; i < n; ++i) {
    if (alive[i]) syms[w++] = syms[i];
  }
  syms.resize(w);
}

namespace {

// The thread's symbols of the word being merged (freed after a word longer than ~1 MiB of them).
std::vector<int32_t>& thread_syms() {
  thread_local std::vector<int32_t> syms;
  return syms;
}
constexpr size_t kSymsRetained = (size_t{1} << 20) / sizeof(int32_t);

}  // namespace

size_t Bpe::thread_scratch_bytes() {
  return thread_syms().capacity() * sizeof(int32_t);
}

void Bpe::tokenize(std::string_view word, std::vector<int32_t>& out, WordCache* cache) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (auto id = vocab_.find(word)) {
      out.push_back(*id);
      return;
    }
  }
  uint64_t h = 0;
  if (cache != nullptr && word.size() <= WordCache::kMaxKey) {
    h = hash_bytes(word);
    if (cache->get(word, h, out)) return;
  }
  std::vector<int32_t>& syms = thread_syms();
  syms.clear();
  initial_symbols(word, syms);
  if (syms.size() <= 64) {
    merge_small(syms);
  } else {
    merge_large(syms);
  }
  if (cache != nullptr && word.size() <= WordCache::kMaxKey) {
    cache->put(word, h, syms.data(), syms.size());
  }
  out.insert(out.end(), syms.begin(), syms.end());
  if (syms.capacity() > kSymsRetained) std::vector<int32_t>().swap(syms);
}

}  // namespace kvgate::tokenizer::detail
