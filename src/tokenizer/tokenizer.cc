// tokenizer/tokenizer: loading tokenizer.json / tokenizer_config.json into the pipeline, and the
// encode / decode paths. See tokenizer.h.
#include "tokenizer/tokenizer.h"

#include <simdjson.h>
#include <unicode/uchar.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <unordered_map>

#include "tokenizer/bpe.h"
#include "tokenizer/jinja.h"
#include "tokenizer/piece_cache.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace kvgate::tokenizer {

using detail::Bpe;
using detail::Regex;
using detail::WordCache;

namespace {

std::atomic<uint64_t> g_next_uid{1};

constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// ---- added tokens: a byte trie, leftmost-longest ----

// Edges live in one open-addressing table keyed on (node, byte): a step is one probe, where a
// node's own child map would be a pointer chase per byte.
class Trie {
 public:
  void add(std::string_view s, uint32_t value) {
    if (values_.empty()) values_.push_back(-1);  // the root
    uint32_t n = 0;
    for (char c : s) {
      auto b = static_cast<uint8_t>(c);
      uint32_t next = child(n, b);
      if (next == kNone) {
        next = static_cast<uint32_t>(values_.size());
        values_.push_back(-1);
        insert_edge(n, b, next);
      }
      n = next;
    }
    values_[n] = static_cast<int64_t>(value);
    auto first = static_cast<uint8_t>(s[0]);
    if (!first_[first]) {
      first_[first] = true;
      only_first_ = n_first_++ == 0 ? static_cast<int>(first) : -1;
    }
  }
  bool empty() const { return values_.size() <= 1; }
  // Longest entry that starts at text[pos]: its value and length, or false.
  bool longest(std::string_view text, size_t pos, uint32_t& value, size_t& len) const {
    if (!first_[static_cast<uint8_t>(text[pos])]) return false;
    uint32_t n = 0;
    bool found = false;
    for (size_t i = pos; i < text.size(); ++i) {
      n = child(n, static_cast<uint8_t>(text[i]));
      if (n == kNone) break;
      if (values_[n] >= 0) {
        value = static_cast<uint32_t>(values_[n]);
        len = i + 1 - pos;
        found = true;
      }
    }
    return found;
  }
  // The first position at or after `i` where an entry may start (s.size() when none).
  size_t next_candidate(std::string_view s, size_t i) const {
    if (only_first_ >= 0) {  // one first byte (every model's '<'): memchr
      if (i >= s.size()) return s.size();
      const void* p = std::memchr(s.data() + i, only_first_, s.size() - i);
      return p ? static_cast<size_t>(static_cast<const char*>(p) - s.data()) : s.size();
    }
    while (i < s.size() && !first_[static_cast<uint8_t>(s[i])]) ++i;
    return i;
  }
  size_t memory_bytes() const {
    return edges_.capacity() * sizeof(Edge) + values_.capacity() * sizeof(int64_t);
  }

 private:
  static constexpr uint32_t kNone = UINT32_MAX;
  static constexpr uint64_t kEmpty = ~0ull;
  struct Edge {
    uint64_t key;  // node << 8 | byte
    uint32_t child;
  };
  static uint64_t slot_of(uint64_t key, uint64_t mask) {
    return ((key * 0x9E3779B97F4A7C15ull) >> 32) & mask;
  }
  uint32_t child(uint32_t node, uint8_t b) const {
    if (edges_.empty()) return kNone;
    const uint64_t key = uint64_t{node} << 8 | b;
    const uint64_t mask = edges_.size() - 1;
    for (uint64_t i = slot_of(key, mask);; i = (i + 1) & mask) {
      const Edge& e = edges_[i];
      if (e.key == key) return e.child;
      if (e.key == kEmpty) return kNone;
    }
  }
  void insert_edge(uint32_t node, uint8_t b, uint32_t next) {
    if ((n_edges_ + 1) * 2 > edges_.size()) {  // at most half full
      std::vector<Edge> old;
      old.swap(edges_);
      edges_.assign(std::max<size_t>(64, old.size() * 2), Edge{kEmpty, kNone});
      for (const Edge& e : old) {
        if (e.key != kEmpty) place(e);
      }
    }
    place(Edge{uint64_t{node} << 8 | b, next});
    ++n_edges_;
  }
  void place(const Edge& e) {
    const uint64_t mask = edges_.size() - 1;
    uint64_t i = slot_of(e.key, mask);
    while (edges_[i].key != kEmpty) i = (i + 1) & mask;
    edges_[i] = e;
  }
  std::vector<Edge> edges_;
  size_t n_edges_ = 0;
  std::vector<int64_t> values_;  // per node: index of the entry ending there, or -1
  bool first_[256] = {};
  int n_first_ = 0;
  int only_first_ = -1;  // the first byte of every entry, when they share one
};

// ---- normalizers ----

struct NormStep {
  enum class Kind { kForm, kPrepend, kReplace, kStrip, kLowercase } kind;
  unicode::Form form = unicode::Form::kNFC;
  std::string text;                  // prepend / replacement content
  std::unique_ptr<Regex> pattern;    // replace
  bool left = false, right = false;  // strip
};

// ---- pre-tokenizers ----

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct PreStep {
  enum class Kind { kSplit, kByteLevelPrefix, kMetaspace, kDigits } kind;
  std::unique_ptr<Regex> pattern;  // split
  Behavior behavior = Behavior::kIsolated;
  bool invert = false;
  // metaspace
  std::string replacement;
  enum class Prepend { kAlways, kFirst, kNever } prepend = Prepend::kAlways;
  bool split = true;
  // digits
  bool individual = false;
};

// ---- decoders ----

struct DecStep {
  enum class Kind { kByteLevel, kMetaspace, kReplace, kByteFallback, kFuse, kStrip } kind;
  std::string from, to;  // replace; metaspace: from = replacement
  bool prepend = true;   // metaspace: strip the leading space of the first token
  char32_t content = ' ';
  size_t start = 0, stop = 0;
};

struct Range {
  uint32_t off;
  uint32_t len;
};

// Segments of a text cut by a Split pattern: the gaps and the matches, in order.
struct Seg {
  size_t a, b;
  bool m;  // a match (after `invert`)
};

// Scratch buffers are reused from text to text; one grown past this by a huge text is freed after
// it, so a thread does not keep the largest prompt's worth of memory for good.
constexpr size_t kScratchRetainedBytes = size_t{1} << 20;

template <class C>
size_t bytes_of(const C& c) {
  return c.capacity() * sizeof(typename C::value_type);
}

template <class C>
void release_if_large(C& c) {
  if (bytes_of(c) > kScratchRetainedBytes) C().swap(c);
}

// Per-thread state: caches (one per tokenizer recently used on the thread) and scratch buffers.
struct ThreadState {
  struct CacheSlot {
    uint64_t uid = 0;
    uint64_t last_use = 0;
    std::unique_ptr<WordCache> cache;
  };
  CacheSlot caches[4];
  uint64_t clock = 0;
  std::string text, norm, tmp;
  std::string repaired;  // the input with invalid UTF-8 replaced
  std::vector<Range> ranges, next_ranges;
  // encode_prefix: per pre-tokenizer step, its input ranges, and a Split's segments and pieces.
  std::vector<std::vector<Range>> levels, level_pieces;
  std::vector<std::vector<Seg>> level_segs;
  // Added tokens and text between them: id (or -1 for text), range (of the input; of `text`).
  std::vector<std::pair<int64_t, Range>> segments, norm_segments;
  std::vector<Seg> split_segs;                    // one range's Split segments
  std::vector<std::pair<size_t, size_t>> merged;  // pieces being merged by a Split behavior

  // Heap bytes of the scratch buffers (not the word caches).
  size_t scratch_bytes() const {
    size_t n = bytes_of(text) + bytes_of(norm) + bytes_of(tmp) + bytes_of(repaired) +
               bytes_of(ranges) + bytes_of(next_ranges) + bytes_of(segments) +
               bytes_of(norm_segments) + bytes_of(split_segs) + bytes_of(merged);
    for (const auto& v : levels) n += bytes_of(v);
    for (const auto& v : level_pieces) n += bytes_of(v);
    for (const auto& v : level_segs) n += bytes_of(v);
    return n;
  }
  // Frees each buffer one huge text grew past kScratchRetainedBytes.
  void release_large() {
    release_if_large(text);
    release_if_large(norm);
    release_if_large(tmp);
    release_if_large(repaired);
    release_if_large(ranges);
    release_if_large(next_ranges);
    release_if_large(segments);
    release_if_large(norm_segments);
    release_if_large(split_segs);
    release_if_large(merged);
    for (auto& v : levels) release_if_large(v);
    for (auto& v : level_pieces) release_if_large(v);
    for (auto& v : level_segs) release_if_large(v);
  }

  WordCache* cache_for(uint64_t uid) {
    ++clock;
    CacheSlot* victim = &caches[0];
    for (auto& c : caches) {
      if (c.uid == uid) {
        c.last_use = clock;
        return c.cache.get();
      }
      if (c.last_use < victim->last_use) victim = &c;
    }
    if (!victim->cache) victim->cache = std::make_unique<WordCache>();
    *victim->cache = WordCache();
    victim->uid = uid;
    victim->last_use = clock;
    return victim->cache.get();
  }
};

ThreadState& thread_state() {
  thread_local ThreadState s;
  return s;
}

}  // namespace

struct Tokenizer::Impl {
  uint64_t uid = g_next_uid.fetch_add(1);
  std::unique_ptr<Bpe> model;
  std::vector<AddedToken> added;
  std::unordered_map<int32_t, size_t> added_by_id;
  std::unordered_map<std::string, int32_t> added_by_content;
  Trie raw_trie, normalized_trie;  // values: index into `added`
  std::vector<NormStep> normalizers;
  std::vector<PreStep> pre;
  bool byte_level = false;
  std::vector<int32_t> prefix, suffix;  // post-processor, single sequence
  std::vector<DecStep> decoders;
  bool has_decoder = false;
  std::string bos, eos;
  std::optional<int32_t> bos_id, eos_id;
  int32_t vocab_size = 0;
  std::string description;
  // The ids of a piece between raw-matched added tokens depend on its bytes alone: true unless a
  // Metaspace step prepends its replacement only to the first piece of the whole text (HF decides
  // that from the piece's offset in the original input).
  bool position_independent = true;
  std::shared_ptr<PieceCache> pieces;  // null: no piece cache

  // Appends the ids of `input`, stopping once `out` holds `limit` ids (SIZE_MAX: all of them;
  // the caller trims the excess of the last piece).
  bool encode(std::string_view input, bool add_special, std::vector<int32_t>& out,
              std::string* error, size_t limit) const;
  bool encode_text(ThreadState& ts, std::string_view segment, std::vector<int32_t>& out,
                   WordCache* cache, std::string* error, size_t limit) const;
  bool pre_tokenize(ThreadState& ts, std::string* error) const;
  // Runs steps k.. of the pre-tokenizer on ts.levels[k], then the model on each piece in order,
  // until `out` holds `limit` ids; Split steps are scanned a little at a time.
  bool encode_pieces(ThreadState& ts, size_t k, std::vector<int32_t>& out, size_t limit,
                     WordCache* cache, std::string* error) const;
  void find_added(std::string_view s, const Trie& trie,
                  std::vector<std::pair<int64_t, Range>>& segs, uint32_t base) const;
};

namespace {

using simdjson::dom::element;

std::string type_of(element e) {
  std::string_view t;
  if (e["type"].get(t)) return "";
  return std::string(t);
}

std::string get_string(element e, const char* key, std::string_view dflt = "") {
  std::string_view v;
  if (e[key].get(v)) return std::string(dflt);
  return std::string(v);
}

bool get_bool(element e, const char* key, bool dflt) {
  bool v;
  if (e[key].get(v)) return dflt;
  return v;
}

// A pattern object {"Regex": "..."} or {"String": "..."}.
std::unique_ptr<Regex> load_pattern(element p, std::string& error) {
  std::string_view s;
  if (!p["Regex"].get(s)) return Regex::compile(s, error);
  if (!p["String"].get(s)) return Regex::literal(s, error);
  error = "pattern is neither {\"Regex\": ...} nor {\"String\": ...}";
  return nullptr;
}

// A component of type "Sequence": each element of `key` loaded by `load_one`, in order.
template <class LoadOne>
bool load_sequence(element e, const char* key, const char* what, std::string& error,
                   LoadOne load_one) {
  simdjson::dom::array list;
  if (e[key].get(list)) {
    error = std::string(what) + " Sequence without " + key;
    return false;
  }
  for (element c : list) {
    if (!load_one(c)) return false;
  }
  return true;
}

bool load_normalizer(element n, std::vector<NormStep>& steps, std::string& error) {
  if (n.is_null()) return true;
  std::string t = type_of(n);
  NormStep s;
  if (t == "Sequence") {
    return load_sequence(n, "normalizers", "normalizer", error,
                         [&](element c) { return load_normalizer(c, steps, error); });
  }
  if (t == "NFC" || t == "NFD" || t == "NFKC" || t == "NFKD") {
    s.kind = NormStep::Kind::kForm;
    s.form = t == "NFC"    ? unicode::Form::kNFC
             : t == "NFD"  ? unicode::Form::kNFD
             : t == "NFKC" ? unicode::Form::kNFKC
                           : unicode::Form::kNFKD;
  } else if (t == "Prepend") {
    s.kind = NormStep::Kind::kPrepend;
    s.text = get_string(n, "prepend");
  } else if (t == "Replace") {
    s.kind = NormStep::Kind::kReplace;
    element p;
    if (n["pattern"].get(p)) {
      error = "normalizer Replace without a pattern";
      return false;
    }
    s.pattern = load_pattern(p, error);
    if (!s.pattern) {
      error = "normalizer Replace: " + error;
      return false;
    }
    s.text = get_string(n, "content");
  } else if (t == "Strip") {
    s.kind = NormStep::Kind::kStrip;
    s.left = get_bool(n, "strip_left", true);
    s.right = get_bool(n, "strip_right", true);
  } else if (t == "Lowercase") {
    s.kind = NormStep::Kind::kLowercase;
  } else {
    error = "unsupported normalizer '" + t + "'";
    return false;
  }
  steps.push_back(std::move(s));
  return true;
}

// Runs the normalizer steps on `s` in place (`tmp` is scratch).
bool run_normalizers(const std::vector<NormStep>& normalizers, std::string& s, std::string& tmp,
                     std::string* error) {
  for (const NormStep& n : normalizers) {
    tmp.clear();
    switch (n.kind) {
      case NormStep::Kind::kForm:
        if (unicode::is_normalized(n.form, s)) continue;
        if (!unicode::normalize(n.form, s, tmp)) {
          if (error) *error = "unicode normalization failed";
          return false;
        }
        break;
      case NormStep::Kind::kPrepend:
        if (s.empty()) continue;
        tmp.assign(n.text).append(s);
        break;
      case NormStep::Kind::kReplace: {
        size_t pos = 0, ms, me;
        while (pos <= s.size()) {
          int rc = n.pattern->find(s, pos, ms, me);
          if (rc < 0) {
            if (error) *error = "regex engine error in Replace normalizer";
            return false;
          }
          if (rc == 0 || me == ms) break;
          tmp.append(s, pos, ms - pos).append(n.text);
          pos = me;
        }
        tmp.append(s, std::min(pos, s.size()), std::string::npos);
        break;
      }
      case NormStep::Kind::kStrip: {
        size_t a = 0, b = s.size();
        if (n.left) {
          while (a < b) {
            size_t k = a;
            if (!unicode::is_white_space(unicode::next_code_point(s, k))) break;
            a = k;
          }
        }
        if (n.right) {
          while (b > a) {
            size_t p = b - 1;
            while (p > a && (static_cast<unsigned char>(s[p]) & 0xC0) == 0x80) --p;
            size_t k = p;
            if (!unicode::is_white_space(unicode::next_code_point(s, k))) break;
            b = p;
          }
        }
        tmp.assign(s, a, b - a);
        break;
      }
      case NormStep::Kind::kLowercase: {
        size_t i = 0;
        while (i < s.size()) {
          size_t a = i;
          unicode::next_code_point(s, i);
          tmp.append(unicode::to_lower(std::string_view(s).substr(a, i - a)));
        }
        break;
      }
    }
    std::swap(s, tmp);
  }
  return true;
}

bool parse_behavior(std::string_view b, Behavior& out) {
  if (b == "Removed")
    out = Behavior::kRemoved;
  else if (b == "Isolated")
    out = Behavior::kIsolated;
  else if (b == "MergedWithPrevious")
    out = Behavior::kMergedWithPrevious;
  else if (b == "MergedWithNext")
    out = Behavior::kMergedWithNext;
  else if (b == "Contiguous")
    out = Behavior::kContiguous;
  else
    return false;
  return true;
}

bool load_pre_tokenizer(element p, std::vector<PreStep>& steps, bool& byte_level,
                        std::string& error) {
  if (p.is_null()) return true;
  std::string t = type_of(p);
  if (byte_level) {
    error = "pre_tokenizer '" + t + "' after ByteLevel is not supported";
    return false;
  }
  if (t == "Sequence") {
    return load_sequence(p, "pretokenizers", "pre_tokenizer", error, [&](element c) {
      return load_pre_tokenizer(c, steps, byte_level, error);
    });
  }
  PreStep s;
  if (t == "Split") {
    s.kind = PreStep::Kind::kSplit;
    element pat;
    if (p["pattern"].get(pat)) {
      error = "pre_tokenizer Split without a pattern";
      return false;
    }
    s.pattern = load_pattern(pat, error);
    if (!s.pattern) {
      error = "pre_tokenizer Split: " + error;
      return false;
    }
    if (!parse_behavior(get_string(p, "behavior", "Isolated"), s.behavior)) {
      error = "pre_tokenizer Split: unsupported behavior '" + get_string(p, "behavior") + "'";
      return false;
    }
    s.invert = get_bool(p, "invert", false);
  } else if (t == "ByteLevel") {
    byte_level = true;
    bool prefix = get_bool(p, "add_prefix_space", true);
    bool use_regex = get_bool(p, "use_regex", true);
    if (prefix) {
      PreStep ps;
      ps.kind = PreStep::Kind::kByteLevelPrefix;
      steps.push_back(std::move(ps));
    }
    if (use_regex) {
      s.kind = PreStep::Kind::kSplit;
      s.pattern = Regex::compile(kGpt2Pattern, error);
      if (!s.pattern) return false;
      s.behavior = Behavior::kIsolated;
    } else {
      return true;
    }
  } else if (t == "Metaspace") {
    s.kind = PreStep::Kind::kMetaspace;
    s.replacement = get_string(p, "replacement", "\xE2\x96\x81");
    std::string scheme = get_string(p, "prepend_scheme", "");
    if (scheme.empty()) {
      s.prepend = get_bool(p, "add_prefix_space", true) ? PreStep::Prepend::kAlways
                                                        : PreStep::Prepend::kNever;
    } else if (scheme == "always") {
      s.prepend = PreStep::Prepend::kAlways;
    } else if (scheme == "first") {
      s.prepend = PreStep::Prepend::kFirst;
    } else if (scheme == "never") {
      s.prepend = PreStep::Prepend::kNever;
    } else {
      error = "pre_tokenizer Metaspace: unsupported prepend_scheme '" + scheme + "'";
      return false;
    }
    s.split = get_bool(p, "split", true);
  } else if (t == "Digits") {
    s.kind = PreStep::Kind::kDigits;
    s.individual = get_bool(p, "individual_digits", false);
  } else {
    error = "unsupported pre_tokenizer '" + t + "'";
    return false;
  }
  steps.push_back(std::move(s));
  return true;
}

bool load_decoder(element d, std::vector<DecStep>& steps, std::string& error) {
  std::string t = type_of(d);
  DecStep s;
  if (t == "Sequence") {
    return load_sequence(d, "decoders", "decoder", error,
                         [&](element c) { return load_decoder(c, steps, error); });
  }
  if (t == "ByteLevel") {
    s.kind = DecStep::Kind::kByteLevel;
  } else if (t == "Metaspace") {
    s.kind = DecStep::Kind::kMetaspace;
    s.from = get_string(d, "replacement", "\xE2\x96\x81");
    std::string scheme = get_string(d, "prepend_scheme", "");
    s.prepend = scheme.empty() ? get_bool(d, "add_prefix_space", true) : scheme != "never";
  } else if (t == "Replace") {
    s.kind = DecStep::Kind::kReplace;
    std::string_view lit;
    if (d["pattern"]["String"].get(lit)) {
      error = "decoder Replace: only String patterns are supported";
      return false;
    }
    s.from = std::string(lit);
    s.to = get_string(d, "content");
  } else if (t == "ByteFallback") {
    s.kind = DecStep::Kind::kByteFallback;
  } else if (t == "Fuse") {
    s.kind = DecStep::Kind::kFuse;
  } else if (t == "Strip") {
    s.kind = DecStep::Kind::kStrip;
    std::string c = get_string(d, "content", " ");
    size_t i = 0;
    s.content = c.empty() ? U' ' : unicode::next_code_point(c, i);
    int64_t a = 0, b = 0;
    if (d["start"].get(a)) a = 0;
    if (d["stop"].get(b)) b = 0;
    s.start = static_cast<size_t>(std::max<int64_t>(0, a));
    s.stop = static_cast<size_t>(std::max<int64_t>(0, b));
  } else {
    error = "unsupported decoder '" + t + "'";
    return false;
  }
  steps.push_back(std::move(s));
  return true;
}

// Special-token string of a config entry: "..." or {"content": "..."}.
std::string config_token(element config, const char* key) {
  element v;
  if (config[key].get(v) || v.is_null()) return "";
  std::string_view s;
  if (!v.get(s)) return std::string(s);
  if (!v["content"].get(s)) return std::string(s);
  return "";
}

bool load_post_processor(element p, Tokenizer::Impl& impl,
                         const std::function<std::optional<int32_t>(std::string_view)>& id_of,
                         std::string& error) {
  if (p.is_null()) return true;
  std::string t = type_of(p);
  if (t == "ByteLevel") return true;  // offsets only
  if (t == "Sequence") {
    return load_sequence(p, "processors", "post_processor", error,
                         [&](element c) { return load_post_processor(c, impl, id_of, error); });
  }
  if (t == "TemplateProcessing") {
    simdjson::dom::array single;
    if (p["single"].get(single)) {
      error = "post_processor TemplateProcessing without 'single'";
      return false;
    }
    simdjson::dom::object specials;
    bool has_specials = !p["special_tokens"].get(specials);
    std::vector<int32_t> before, after;
    bool seen_sequence = false;
    for (element item : single) {
      element seq, special;
      if (!item["Sequence"].get(seq)) {
        std::string_view which;
        if (!seq["id"].get(which) && which != "A") {
          error = "post_processor TemplateProcessing: single template uses sequence " +
                  std::string(which);
          return false;
        }
        seen_sequence = true;
        continue;
      }
      if (item["SpecialToken"].get(special)) {
        error = "post_processor TemplateProcessing: unknown template item";
        return false;
      }
      std::string_view name;
      if (special["id"].get(name)) {
        error = "post_processor TemplateProcessing: special token without id";
        return false;
      }
      std::vector<int32_t> ids;
      simdjson::dom::array id_list;
      if (has_specials && !specials.at_key(name)["ids"].get(id_list)) {
        for (element x : id_list) {
          int64_t v;
          if (!x.get(v)) ids.push_back(static_cast<int32_t>(v));
        }
      } else if (auto id = id_of(name)) {
        ids.push_back(*id);
      } else {
        error = "post_processor TemplateProcessing: unknown special token " + std::string(name);
        return false;
      }
      auto& dst = seen_sequence ? after : before;
      dst.insert(dst.end(), ids.begin(), ids.end());
    }
    impl.prefix.insert(impl.prefix.end(), before.begin(), before.end());
    impl.suffix.insert(impl.suffix.begin(), after.begin(), after.end());
    return true;
  }
  if (t == "BertProcessing" || t == "RobertaProcessing") {
    int64_t cls = 0, sep = 0;
    if (p["cls"].at(1).get(cls) || p["sep"].at(1).get(sep)) {
      error = "post_processor " + t + " without cls/sep ids";
      return false;
    }
    impl.prefix.insert(impl.prefix.begin(), static_cast<int32_t>(cls));
    impl.suffix.push_back(static_cast<int32_t>(sep));
    return true;
  }
  error = "unsupported post_processor '" + t + "'";
  return false;
}

bool is_llama_style_class(std::string_view cls) {
  return cls == "LlamaTokenizer" || cls == "LlamaTokenizerFast" || cls == "CodeLlamaTokenizer" ||
         cls == "CodeLlamaTokenizerFast" || cls == "GemmaTokenizer" || cls == "GemmaTokenizerFast";
}

}  // namespace

bool read_file(const std::string& path, std::string& out, std::string& error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    error = "cannot open " + path;
    return false;
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  out = std::move(ss).str();
  return true;
}

std::unique_ptr<Tokenizer> Tokenizer::load(const std::string& dir, std::string& error) {
  std::string tok, cfg, err;
  if (!read_file(dir + "/tokenizer.json", tok, error)) return nullptr;
  read_file(dir + "/tokenizer_config.json", cfg, err);  // optional
  auto t = from_json(tok, cfg, error);
  if (!t) error = dir + ": " + error;
  return t;
}

std::unique_ptr<Tokenizer> Tokenizer::from_json(std::string_view tokenizer_json,
                                                std::string_view config_json, std::string& error) {
  auto impl = std::make_unique<Impl>();
  simdjson::dom::parser parser;
  simdjson::padded_string padded(tokenizer_json);
  element root;
  if (auto e = parser.parse(padded).get(root); e) {
    error = std::string("tokenizer.json is not valid JSON: ") + simdjson::error_message(e);
    return nullptr;
  }
  simdjson::dom::parser cfg_parser;
  // Configs hold integers Python accepts and simdjson does not (model_max_length = 1e30).
  std::string cfg_text = jinja::widen_big_integers(config_json.empty() ? "{}" : config_json);
  simdjson::padded_string cfg_padded(cfg_text);
  element config;
  if (auto e = cfg_parser.parse(cfg_padded).get(config); e) {
    error = std::string("tokenizer_config.json is not valid JSON: ") + simdjson::error_message(e);
    return nullptr;
  }
  for (const char* key : {"truncation", "padding"}) {
    element v;
    if (!root[key].get(v) && !v.is_null()) {
      error = std::string("tokenizer.json sets ") + key + ", which is not supported";
      return nullptr;
    }
  }

  // Pre-tokenizer first: whether it is byte-level decides how the model is keyed.
  element pre;
  if (!root["pre_tokenizer"].get(pre)) {
    if (!load_pre_tokenizer(pre, impl->pre, impl->byte_level, error)) return nullptr;
  }
  for (const PreStep& p : impl->pre) {
    if (p.kind == PreStep::Kind::kMetaspace && p.prepend == PreStep::Prepend::kFirst) {
      impl->position_independent = false;
    }
  }
  element norm;
  if (!root["normalizer"].get(norm)) {
    if (!load_normalizer(norm, impl->normalizers, error)) return nullptr;
  }

  element model;
  if (root["model"].get(model)) {
    error = "tokenizer.json has no model";
    return nullptr;
  }
  std::string model_type = type_of(model);
  if (model_type.empty()) {
    element v;
    if (!model["merges"].get(v)) model_type = "BPE";
  }
  if (model_type != "BPE") {
    error = "unsupported model '" + model_type + "' (only BPE is supported)";
    return nullptr;
  }
  detail::BpeOptions bo;
  bo.byte_level = impl->byte_level;
  impl->model = Bpe::load(simdjson::minify(model), bo, error);
  if (!impl->model) return nullptr;
  impl->vocab_size = impl->model->max_id() + 1;

  // Added tokens (from tokenizer.json, then any extra ones tokenizer_config.json declares).
  simdjson::dom::array added;
  if (!root["added_tokens"].get(added)) {
    for (element a : added) {
      AddedToken t;
      int64_t id = 0;
      std::string_view content;
      if (a["id"].get(id) || a["content"].get(content) || content.empty()) {
        error = "added_tokens: an entry without id or content";
        return nullptr;
      }
      t.id = static_cast<int32_t>(id);
      t.content = std::string(content);
      t.special = get_bool(a, "special", false);
      t.single_word = get_bool(a, "single_word", false);
      t.lstrip = get_bool(a, "lstrip", false);
      t.rstrip = get_bool(a, "rstrip", false);
      t.normalized = get_bool(a, "normalized", !t.special);
      if (impl->added_by_content.count(t.content)) continue;
      impl->added_by_content.emplace(t.content, t.id);
      impl->added_by_id.emplace(t.id, impl->added.size());
      impl->added.push_back(std::move(t));
    }
  }
  simdjson::dom::object decoder_map;
  if (!config["added_tokens_decoder"].get(decoder_map)) {
    for (auto [key, a] : decoder_map) {
      std::string_view content;
      if (a["content"].get(content) || content.empty()) continue;
      if (impl->added_by_content.count(std::string(content))) continue;
      AddedToken t;
      t.id = static_cast<int32_t>(std::strtol(std::string(key).c_str(), nullptr, 10));
      if (impl->added_by_id.count(t.id)) continue;
      t.content = std::string(content);
      t.special = get_bool(a, "special", false);
      t.single_word = get_bool(a, "single_word", false);
      t.lstrip = get_bool(a, "lstrip", false);
      t.rstrip = get_bool(a, "rstrip", false);
      t.normalized = get_bool(a, "normalized", !t.special);
      impl->added_by_content.emplace(t.content, t.id);
      impl->added_by_id.emplace(t.id, impl->added.size());
      impl->added.push_back(std::move(t));
    }
  }
  bool split_special = get_bool(config, "split_special_tokens", false);
  for (size_t i = 0; i < impl->added.size(); ++i) {
    const AddedToken& t = impl->added[i];
    impl->vocab_size = std::max(impl->vocab_size, t.id + 1);
    if (split_special && t.special) continue;
    if (t.normalized && !impl->normalizers.empty()) {
      // Matched against its normalized form in normalized text.
      std::string n = t.content, tmp;
      if (!run_normalizers(impl->normalizers, n, tmp, &error) || n.empty()) {
        error = "added token '" + t.content + "' cannot be normalized";
        return nullptr;
      }
      impl->normalized_trie.add(n, static_cast<uint32_t>(i));
    } else {
      impl->raw_trie.add(t.content, static_cast<uint32_t>(i));
    }
  }

  auto id_of = [&](std::string_view s) -> std::optional<int32_t> {
    auto it = impl->added_by_content.find(std::string(s));
    if (it != impl->added_by_content.end()) return it->second;
    return impl->model->token_to_id(s);
  };

  // Post-processor, or transformers' own for Llama/Gemma tokenizer classes.
  impl->bos = config_token(config, "bos_token");
  impl->eos = config_token(config, "eos_token");
  if (!impl->bos.empty()) impl->bos_id = id_of(impl->bos);
  if (!impl->eos.empty()) impl->eos_id = id_of(impl->eos);
  std::string cls = get_string(config, "tokenizer_class");
  element pp;
  if (is_llama_style_class(cls)) {
    bool add_bos = get_bool(config, "add_bos_token", true);
    bool add_eos = get_bool(config, "add_eos_token", false);
    if (add_bos) {
      if (!impl->bos_id) {
        error = "tokenizer_config.json: add_bos_token without a known bos_token";
        return nullptr;
      }
      impl->prefix.push_back(*impl->bos_id);
    }
    if (add_eos) {
      if (!impl->eos_id) {
        error = "tokenizer_config.json: add_eos_token without a known eos_token";
        return nullptr;
      }
      impl->suffix.push_back(*impl->eos_id);
    }
  } else if (!root["post_processor"].get(pp)) {
    if (!load_post_processor(pp, *impl, id_of, error)) return nullptr;
  }

  element dec;
  if (!root["decoder"].get(dec) && !dec.is_null()) {
    impl->has_decoder = true;
    if (!load_decoder(dec, impl->decoders, error)) return nullptr;
  }

  std::string d = "BPE ";
  d += impl->byte_level ? "byte-level" : "character-level";
  d += ", " + std::to_string(impl->vocab_size) + " tokens (" + std::to_string(impl->added.size()) +
       " added)";
  if (!impl->normalizers.empty()) d += ", normalizer";
  if (!impl->prefix.empty()) d += ", adds BOS";
  impl->description = std::move(d);
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

// ---- encode ----

void Tokenizer::Impl::find_added(std::string_view s, const Trie& trie,
                                 std::vector<std::pair<int64_t, Range>>& segs,
                                 uint32_t base) const {
  size_t start_offset = 0;
  size_t i = 0;
  const size_t n = s.size();
  auto push_text = [&](size_t a, size_t b) {
    if (b > a)
      segs.emplace_back(-1, Range{base + static_cast<uint32_t>(a), static_cast<uint32_t>(b - a)});
  };
  if (!trie.empty()) {
    while (i < n) {
      // Skip bytes that start no added token.
      i = trie.next_candidate(s, i);
      if (i >= n) break;
      uint32_t idx;
      size_t len;
      if (!trie.longest(s, i, idx, len)) {
        ++i;
        continue;
      }
      const AddedToken& t = added[idx];
      size_t start = i, stop = i + len;
      i = stop;
      if (t.single_word) {
        bool left_ok = true, right_ok = true;
        if (start > 0) {
          size_t k = start - 1;
          while (k > 0 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
          size_t kk = k;
          left_ok = !unicode::is_word_char(unicode::next_code_point(s, kk));
        }
        if (stop < n) {
          size_t kk = stop;
          right_ok = !unicode::is_word_char(unicode::next_code_point(s, kk));
        }
        if (!left_ok || !right_ok) continue;
      }
      if (t.lstrip) {
        size_t k = start;
        while (k > 0) {
          size_t p = k - 1;
          while (p > 0 && (static_cast<unsigned char>(s[p]) & 0xC0) == 0x80) --p;
          size_t pp = p;
          if (!unicode::is_white_space(unicode::next_code_point(s, pp))) break;
          k = p;
        }
        start = std::max(k, start_offset);
      }
      if (t.rstrip) {
        while (stop < n) {
          size_t k = stop;
          if (!unicode::is_white_space(unicode::next_code_point(s, k))) break;
          stop = k;
        }
        i = stop;
      }
      push_text(start_offset, start);
      segs.emplace_back(
          t.id, Range{base + static_cast<uint32_t>(start), static_cast<uint32_t>(stop - start)});
      start_offset = stop;
    }
  }
  push_text(start_offset, n);
}

namespace {

// Where an incremental Split scan stands in its text.
struct SplitScan {
  size_t prev = 0, pos = 0;
  bool done = false;  // the whole text is scanned (its trailing gap included)
};

// Scans `s` from `st` on, appending segments to `segs` until about `max_segs` more were added or
// the text ends (st.done). The segments are those a scan of the whole text yields, in order: the
// pattern always sees all of `s`.
bool scan_split(const PreStep& step, std::string_view s, SplitScan& st, size_t max_segs,
                std::vector<Seg>& segs, std::string* error) {
  const size_t stop = max_segs > SIZE_MAX - segs.size() ? SIZE_MAX : segs.size() + max_segs;
  while (st.pos <= s.size()) {
    if (segs.size() >= stop) return true;
    size_t ms, me;
    int rc = step.pattern->find(s, st.pos, ms, me);
    if (rc < 0) {
      if (error) {
        *error = "regex engine error on pre-tokenizer pattern: " + detail::pcre2_error_message(rc);
      }
      return false;
    }
    if (rc == 0) break;
    if (me == ms) {  // empty match: step over one character
      st.pos =
          ms + (ms < s.size() ? unicode::sequence_length(static_cast<unsigned char>(s[ms])) : 1);
      continue;
    }
    if (ms > st.prev) segs.push_back({st.prev, ms, step.invert});
    segs.push_back({ms, me, !step.invert});
    st.prev = st.pos = me;
  }
  if (st.prev < s.size()) segs.push_back({st.prev, s.size(), step.invert});
  st.done = true;
  return true;
}

// Appends the pieces the step's behavior makes of `segs` (offsets relative to `base`). From the
// segments of a text's beginning, every piece but the last is a piece of the whole text (only
// the last may still grow, or merge with what follows).
void emit_split(const PreStep& step, const std::vector<Seg>& segs, uint32_t base,
                std::vector<Range>& out, std::vector<std::pair<size_t, size_t>>& acc) {
  auto emit = [&](size_t a, size_t b) {
    if (b > a) out.push_back(Range{base + static_cast<uint32_t>(a), static_cast<uint32_t>(b - a)});
  };
  switch (step.behavior) {
    case Behavior::kIsolated:
      for (const auto& g : segs) emit(g.a, g.b);
      break;
    case Behavior::kRemoved:
      for (const auto& g : segs) {
        if (!g.m) emit(g.a, g.b);
      }
      break;
    case Behavior::kMergedWithPrevious: {
      acc.clear();
      bool previous_match = false;
      for (const auto& g : segs) {
        if (g.m && !previous_match && !acc.empty()) {
          acc.back().second = g.b;
        } else {
          acc.emplace_back(g.a, g.b);
        }
        previous_match = g.m;
      }
      for (auto& [a, b] : acc) emit(a, b);
      break;
    }
    case Behavior::kMergedWithNext: {
      acc.clear();
      bool previous_match = false;
      for (size_t k = segs.size(); k-- > 0;) {
        const auto& g = segs[k];
        if (g.m && !previous_match && !acc.empty()) {
          acc.back().first = g.a;
        } else {
          acc.emplace_back(g.a, g.b);
        }
        previous_match = g.m;
      }
      for (size_t k = acc.size(); k-- > 0;) emit(acc[k].first, acc[k].second);
      break;
    }
    case Behavior::kContiguous: {
      acc.clear();
      bool previous_match = false;
      bool first = true;
      for (const auto& g : segs) {
        if (!first && g.m == previous_match) {
          acc.back().second = g.b;
        } else {
          acc.emplace_back(g.a, g.b);
        }
        first = false;
        previous_match = g.m;
      }
      for (auto& [a, b] : acc) emit(a, b);
      break;
    }
  }
}

// Applies one split step to every range of `in`, appending the pieces to `out`.
bool split_ranges(const PreStep& step, ThreadState& ts, const std::vector<Range>& in,
                  std::vector<Range>& out, std::string* error) {
  for (const Range& r : in) {
    ts.split_segs.clear();
    SplitScan st;
    if (!scan_split(step, std::string_view(ts.text.data() + r.off, r.len), st, SIZE_MAX,
                    ts.split_segs, error))
      return false;
    emit_split(step, ts.split_segs, r.off, out, ts.merged);
  }
  return true;
}

bool is_numeric(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  int8_t t = u_charType(static_cast<UChar32>(c));
  return t == U_DECIMAL_DIGIT_NUMBER || t == U_LETTER_NUMBER || t == U_OTHER_NUMBER;
}

// Applies one pre-tokenizer step to every range of `in` (each independently of the others),
// appending the pieces to `out`. Steps that rewrite text append it to ts.text.
bool apply_pre_step(const PreStep& step, ThreadState& ts, const std::vector<Range>& in,
                    std::vector<Range>& out, std::string* error) {
  switch (step.kind) {
    case PreStep::Kind::kSplit:
      return split_ranges(step, ts, in, out, error);
    case PreStep::Kind::kByteLevelPrefix:
      for (const Range& r : in) {
        if (r.len > 0 && ts.text[r.off] == ' ') {
          out.push_back(r);
          continue;
        }
        auto off = static_cast<uint32_t>(ts.text.size());
        ts.tmp.assign(" ");
        ts.tmp.append(ts.text, r.off, r.len);
        ts.text.append(ts.tmp);
        out.push_back(Range{off, r.len + 1});
      }
      return true;
    case PreStep::Kind::kMetaspace: {
      bool first_piece = true;
      for (const Range& r : in) {
        ts.tmp.clear();
        std::string_view s(ts.text.data() + r.off, r.len);
        bool prepend = step.prepend == PreStep::Prepend::kAlways ||
                       (step.prepend == PreStep::Prepend::kFirst && first_piece && r.off == 0);
        first_piece = false;
        for (char c : s) {
          if (c == ' ') {
            ts.tmp.append(step.replacement);
          } else {
            ts.tmp.push_back(c);
          }
        }
        if (prepend && !std::string_view(ts.tmp).starts_with(step.replacement)) {
          ts.tmp.insert(0, step.replacement);
        }
        auto off = static_cast<uint32_t>(ts.text.size());
        ts.text.append(ts.tmp);
        Range nr{off, static_cast<uint32_t>(ts.tmp.size())};
        if (!step.split) {
          if (nr.len) out.push_back(nr);
          continue;
        }
        // Split on the replacement, MergedWithNext.
        size_t start = 0;
        std::string_view t(ts.text.data() + off, nr.len);
        size_t pos = t.find(step.replacement, 1);
        while (pos != std::string_view::npos) {
          if (pos > start)
            out.push_back(
                Range{off + static_cast<uint32_t>(start), static_cast<uint32_t>(pos - start)});
          start = pos;
          pos = t.find(step.replacement, pos + step.replacement.size());
        }
        if (t.size() > start)
          out.push_back(
              Range{off + static_cast<uint32_t>(start), static_cast<uint32_t>(t.size() - start)});
      }
      return true;
    }
    case PreStep::Kind::kDigits:
      for (const Range& r : in) {
        std::string_view s(ts.text.data() + r.off, r.len);
        size_t i = 0, run_start = 0;
        int run_kind = -1;  // 0 text, 1 digits
        while (i < s.size()) {
          size_t at = i;
          bool digit = is_numeric(unicode::next_code_point(s, i));
          int kind = digit ? 1 : 0;
          if (run_kind >= 0 && (kind != run_kind || (digit && step.individual))) {
            out.push_back(Range{r.off + static_cast<uint32_t>(run_start),
                                static_cast<uint32_t>(at - run_start)});
            run_start = at;
          }
          run_kind = kind;
        }
        if (s.size() > run_start)
          out.push_back(Range{r.off + static_cast<uint32_t>(run_start),
                              static_cast<uint32_t>(s.size() - run_start)});
      }
      return true;
  }
  return true;
}

}  // namespace

bool Tokenizer::Impl::pre_tokenize(ThreadState& ts, std::string* error) const {
  for (const PreStep& step : pre) {
    ts.next_ranges.clear();
    if (!apply_pre_step(step, ts, ts.ranges, ts.next_ranges, error)) return false;
    std::swap(ts.ranges, ts.next_ranges);
  }
  return true;
}

bool Tokenizer::Impl::encode_pieces(ThreadState& ts, size_t k, std::vector<int32_t>& out,
                                    size_t limit, WordCache* cache, std::string* error) const {
  if (k == pre.size()) {
    for (const Range& p : ts.levels[k]) {
      model->tokenize(std::string_view(ts.text.data() + p.off, p.len), out, cache);
      if (out.size() >= limit) return true;
    }
    return true;
  }
  const PreStep& step = pre[k];
  if (step.kind != PreStep::Kind::kSplit) {
    ts.levels[k + 1].clear();
    if (!apply_pre_step(step, ts, ts.levels[k], ts.levels[k + 1], error)) return false;
    return encode_pieces(ts, k + 1, out, limit, cache, error);
  }
  // A Split step: scan each range a batch of segments at a time (doubling), and send every
  // piece known to be final on through the later steps before scanning further.
  std::vector<Seg>& segs = ts.level_segs[k];
  std::vector<Range>& pieces = ts.level_pieces[k];
  for (size_t ri = 0; ri < ts.levels[k].size(); ++ri) {
    const Range r = ts.levels[k][ri];
    segs.clear();
    SplitScan st;
    size_t done_pieces = 0;
    size_t batch = 16;
    while (true) {
      // ts.text may have grown (and moved) under later steps: take the view afresh.
      std::string_view s(ts.text.data() + r.off, r.len);
      if (!scan_split(step, s, st, batch, segs, error)) return false;
      pieces.clear();
      emit_split(step, segs, r.off, pieces, ts.merged);
      size_t final_pieces = st.done || pieces.empty() ? pieces.size() : pieces.size() - 1;
      for (; done_pieces < final_pieces; ++done_pieces) {
        ts.levels[k + 1].assign(1, pieces[done_pieces]);
        if (!encode_pieces(ts, k + 1, out, limit, cache, error)) return false;
        if (out.size() >= limit) return true;
      }
      if (st.done) break;
      batch = batch > SIZE_MAX / 2 ? SIZE_MAX : batch * 2;
    }
  }
  return true;
}

bool Tokenizer::Impl::encode_text(ThreadState& ts, std::string_view segment,
                                  std::vector<int32_t>& out, WordCache* cache, std::string* error,
                                  size_t limit) const {
  std::string_view text = segment;
  if (!normalizers.empty()) {
    ts.norm.assign(segment);
    if (!run_normalizers(normalizers, ts.norm, ts.tmp, error)) return false;
    text = ts.norm;
  }
  const bool all = limit == SIZE_MAX;
  if (!all && ts.levels.size() < pre.size() + 1) {
    ts.levels.resize(pre.size() + 1);
    ts.level_pieces.resize(pre.size());
    ts.level_segs.resize(pre.size());
  }
  // Pre-tokenizes the ranges of a text piece and runs the model on them (all of them, or until
  // `limit` ids).
  auto encode_range = [&](Range r) {
    if (!all) {
      ts.levels[0].assign(1, r);
      return encode_pieces(ts, 0, out, limit, cache, error);
    }
    ts.ranges.assign(1, r);
    if (!pre_tokenize(ts, error)) return false;
    for (const Range& p : ts.ranges) {
      model->tokenize(std::string_view(ts.text.data() + p.off, p.len), out, cache);
    }
    return true;
  };

  // Normalized added tokens, then pre-tokenize each remaining piece.
  ts.text.assign(text);
  if (!normalized_trie.empty()) {
    ts.norm_segments.clear();
    find_added(ts.text, normalized_trie, ts.norm_segments, 0);
    // Process pieces in order: text pieces go through the pre-tokenizer one at a time.
    for (const auto& [id, r] : ts.norm_segments) {
      if (out.size() >= limit) return true;
      if (id >= 0) {
        out.push_back(static_cast<int32_t>(id));
      } else if (!encode_range(r)) {
        return false;
      }
    }
    return true;
  }
  if (ts.text.empty()) return true;
  return encode_range(Range{0, static_cast<uint32_t>(ts.text.size())});
}

bool Tokenizer::Impl::encode(std::string_view input, bool add_special, std::vector<int32_t>& out,
                             std::string* error, size_t limit) const {
  ThreadState& ts = thread_state();
  struct Release {
    ThreadState& ts;
    ~Release() { ts.release_large(); }
  } release{ts};
  WordCache* cache = ts.cache_for(uid);
  // Repair invalid UTF-8 first (into a buffer that outlives the segments below).
  std::string_view text = input;
  if (!unicode::is_valid_utf8(input)) {
    ts.repaired.clear();
    unicode::append_sanitized_utf8(input, ts.repaired);
    text = ts.repaired;
  }
  if (add_special) out.insert(out.end(), prefix.begin(), prefix.end());
  ts.segments.clear();
  find_added(text, raw_trie, ts.segments, 0);
  for (const auto& [id, r] : ts.segments) {
    if (out.size() >= limit) return true;
    if (id >= 0) {
      out.push_back(static_cast<int32_t>(id));
      continue;
    }
    const std::string_view piece = text.substr(r.off, r.len);
    if (!pieces || !PieceCache::cacheable(piece.size())) {
      if (!encode_text(ts, piece, out, cache, error, limit)) return false;
      continue;
    }
    // The piece's ids are a function of its bytes (position_independent): a hit appends exactly
    // what encode_text would (all of them; encode_prefix trims the excess).
    const uint64_t hash = detail::hash_bytes(piece);
    if (pieces->get(uid, piece, hash, out)) continue;
    const size_t before = out.size();
    if (!encode_text(ts, piece, out, cache, error, limit)) return false;
    if (limit == SIZE_MAX) {  // complete ids only (encode_prefix may stop inside the piece)
      pieces->put(uid, piece, hash, std::span<const int32_t>(out).subspan(before));
    }
  }
  if (add_special) out.insert(out.end(), suffix.begin(), suffix.end());
  return true;
}

bool Tokenizer::encode(std::string_view text, bool add_special_tokens, std::vector<int32_t>& out,
                       std::string* error) const {
  return impl_->encode(text, add_special_tokens, out, error, SIZE_MAX);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int32_t> out;
  impl_->encode(text, add_special_tokens, out, nullptr, SIZE_MAX);
  return out;
}

bool Tokenizer::encode_prefix(std::string_view text, bool add_special_tokens, size_t max_tokens,
                              std::vector<int32_t>& out, std::string* error) const {
  if (max_tokens == 0) return true;
  const size_t limit =
      max_tokens > SIZE_MAX - 1 - out.size() ? SIZE_MAX - 1 : out.size() + max_tokens;
  if (!impl_->encode(text, add_special_tokens, out, error, limit)) return false;
  if (out.size() > limit) out.resize(limit);
  return true;
}

// ---- decode ----

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  const Impl& m = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  bool byte_level_decoder =
      m.decoders.size() == 1 && m.decoders[0].kind == DecStep::Kind::kByteLevel;
  std::string bytes;
  for (int32_t id : ids) {
    auto it = m.added_by_id.find(id);
    if (it != m.added_by_id.end()) {
      const AddedToken& t = m.added[it->second];
      if (skip_special_tokens && t.special) continue;
      if (byte_level_decoder) {
        std::string raw;
        if (detail::unmap_byte_level(t.content, raw)) {
          bytes.append(raw);
        } else {
          bytes.append(t.content);
        }
      } else {
        tokens.push_back(t.content);
      }
      continue;
    }
    if (byte_level_decoder) {
      bytes.append(m.model->id_to_bytes(id));
    } else {
      std::string_view tok = m.model->id_to_token(id);
      if (tok.empty() && (id < 0 || id > m.model->max_id())) continue;
      tokens.emplace_back(tok);
    }
  }
  std::string out;
  if (byte_level_decoder) {
    unicode::append_sanitized_utf8(bytes, out);
    return out;
  }
  if (!m.has_decoder) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i) out.push_back(' ');
      out.append(tokens[i]);
    }
    return out;
  }
  for (const DecStep& d : m.decoders) {
    std::vector<std::string> next;
    switch (d.kind) {
      case DecStep::Kind::kByteLevel: {
        std::string all;
        for (const auto& t : tokens) {
          std::string raw;
          if (detail::unmap_byte_level(t, raw)) {
            all.append(raw);
          } else {
            all.append(t);
          }
        }
        std::string s;
        unicode::append_sanitized_utf8(all, s);
        next.push_back(std::move(s));
        break;
      }
      case DecStep::Kind::kReplace:
        for (const auto& t : tokens) {
          std::string s;
          size_t pos = 0;
          while (true) {
            size_t f = d.from.empty() ? std::string::npos : t.find(d.from, pos);
            if (f == std::string::npos) break;
            s.append(t, pos, f - pos).append(d.to);
            pos = f + d.from.size();
          }
          s.append(t, pos, std::string::npos);
          next.push_back(std::move(s));
        }
        break;
      case DecStep::Kind::kMetaspace:
        for (size_t i = 0; i < tokens.size(); ++i) {
          std::string s;
          const std::string& t = tokens[i];
          size_t pos = 0;
          while (true) {
            size_t f = t.find(d.from, pos);
            if (f == std::string::npos) break;
            s.append(t, pos, f - pos).push_back(' ');
            pos = f + d.from.size();
          }
          s.append(t, pos, std::string::npos);
          if (i == 0 && d.prepend && !s.empty() && s[0] == ' ') s.erase(0, 1);
          next.push_back(std::move(s));
        }
        break;
      case DecStep::Kind::kByteFallback: {
        std::string pending;
        size_t pending_n = 0;
        auto flush = [&] {
          if (pending_n == 0) return;
          if (unicode::is_valid_utf8(pending)) {
            next.push_back(pending);
          } else {
            for (size_t k = 0; k < pending_n; ++k) next.emplace_back("\xEF\xBF\xBD");
          }
          pending.clear();
          pending_n = 0;
        };
        for (const auto& t : tokens) {
          auto hex = [](char c) -> int {
            if (c >= '0' && c <= '9') return c - '0';
            if (c >= 'A' && c <= 'F') return c - 'A' + 10;
            if (c >= 'a' && c <= 'f') return c - 'a' + 10;
            return -1;
          };
          if (t.size() == 6 && t.starts_with("<0x") && t.back() == '>' && hex(t[3]) >= 0 &&
              hex(t[4]) >= 0) {
            pending.push_back(static_cast<char>(hex(t[3]) * 16 + hex(t[4])));
            ++pending_n;
            continue;
          }
          flush();
          next.push_back(t);
        }
        flush();
        break;
      }
      case DecStep::Kind::kFuse: {
        std::string s;
        for (const auto& t : tokens) s.append(t);
        next.push_back(std::move(s));
        break;
      }
      case DecStep::Kind::kStrip:
        for (const auto& t : tokens) {
          std::vector<std::pair<size_t, size_t>> chars;  // byte ranges
          size_t i = 0;
          std::vector<char32_t> cps;
          while (i < t.size()) {
            size_t a = i;
            cps.push_back(unicode::next_code_point(t, i));
            chars.emplace_back(a, i);
          }
          size_t a = 0, b = cps.size();
          while (a < b && a < d.start && cps[a] == d.content) ++a;
          size_t stripped_end = 0;
          while (b > a && stripped_end < d.stop && cps[b - 1] == d.content) {
            --b;
            ++stripped_end;
          }
          if (a >= b) {
            next.emplace_back();
          } else {
            next.push_back(t.substr(chars[a].first, chars[b - 1].second - chars[a].first));
          }
        }
        break;
    }
    tokens = std::move(next);
  }
  for (const auto& t : tokens) out.append(t);
  return out;
}

void Tokenizer::append_token_bytes(int32_t id, std::string& out) const {
  const Impl& m = *impl_;
  auto it = m.added_by_id.find(id);
  if (it != m.added_by_id.end()) {
    out.append(m.added[it->second].content);
    return;
  }
  if (m.byte_level) {
    out.append(m.model->id_to_bytes(id));
    return;
  }
  std::string_view tok = m.model->id_to_token(id);
  if (tok.size() == 6 && tok.starts_with("<0x") && tok.back() == '>') {
    out.push_back(
        static_cast<char>(std::strtol(std::string(tok.substr(3, 2)).c_str(), nullptr, 16)));
    return;
  }
  for (const DecStep& d : m.decoders) {
    if ((d.kind == DecStep::Kind::kReplace || d.kind == DecStep::Kind::kMetaspace) &&
        !d.from.empty()) {
      std::string_view to = d.kind == DecStep::Kind::kMetaspace ? std::string_view(" ") : d.to;
      size_t pos = 0;
      while (true) {
        size_t f = tok.find(d.from, pos);
        if (f == std::string_view::npos) break;
        out.append(tok.substr(pos, f - pos)).append(to);
        pos = f + d.from.size();
      }
      out.append(tok.substr(pos));
      return;
    }
  }
  out.append(tok);
}

void Tokenizer::set_piece_cache(std::shared_ptr<PieceCache> cache) {
  impl_->pieces = impl_->position_independent ? std::move(cache) : nullptr;
}

bool Tokenizer::uses_piece_cache() const {
  return impl_->pieces != nullptr;
}

bool Tokenizer::pieces_are_position_independent() const {
  return impl_->position_independent;
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  auto it = impl_->added_by_content.find(std::string(token));
  if (it != impl_->added_by_content.end()) return it->second;
  return impl_->model->token_to_id(token);
}

std::string Tokenizer::id_to_token(int32_t id) const {
  auto it = impl_->added_by_id.find(id);
  if (it != impl_->added_by_id.end()) return impl_->added[it->second].content;
  return std::string(impl_->model->id_to_token(id));
}

int32_t Tokenizer::vocab_size() const {
  return impl_->vocab_size;
}

bool Tokenizer::is_special(int32_t id) const {
  auto it = impl_->added_by_id.find(id);
  return it != impl_->added_by_id.end() && impl_->added[it->second].special;
}

const std::vector<AddedToken>& Tokenizer::added_tokens() const {
  return impl_->added;
}
const std::string& Tokenizer::bos_token() const {
  return impl_->bos;
}
const std::string& Tokenizer::eos_token() const {
  return impl_->eos;
}
std::optional<int32_t> Tokenizer::bos_token_id() const {
  return impl_->bos_id;
}
std::optional<int32_t> Tokenizer::eos_token_id() const {
  return impl_->eos_id;
}
const std::string& Tokenizer::description() const {
  return impl_->description;
}

size_t Tokenizer::thread_scratch_bytes() {
  return thread_state().scratch_bytes() + Bpe::thread_scratch_bytes();
}

size_t Tokenizer::memory_bytes() const {
  size_t n = sizeof(Impl) + impl_->model->memory_bytes() + impl_->raw_trie.memory_bytes() +
             impl_->normalized_trie.memory_bytes();
  for (const auto& t : impl_->added) n += sizeof(AddedToken) + t.content.capacity() + 64;
  return n;
}

}  // namespace kvgate::tokenizer
