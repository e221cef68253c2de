// kv/events: see events.h.
#include "kv/events.h"

#include <msgpuck.h>

#include <cstring>
#include <limits>

namespace kvgate::kv {
namespace {

// ---------------------------------------------------------------- encoding

class Writer {
 public:
  explicit Writer(std::string& out) : out_(out) {}
  // Each call reserves exactly mp_sizeof_X bytes, then encodes into them.
  void array(uint32_t n) { mp_encode_array(grow(mp_sizeof_array(n)), n); }
  void map(uint32_t n) { mp_encode_map(grow(mp_sizeof_map(n)), n); }
  void nil() { mp_encode_nil(grow(mp_sizeof_nil())); }
  void uint(uint64_t v) { mp_encode_uint(grow(mp_sizeof_uint(v)), v); }
  void sint(int64_t v) {
    if (v >= 0) {
      uint(static_cast<uint64_t>(v));
    } else {
      mp_encode_int(grow(mp_sizeof_int(v)), v);
    }
  }
  void dbl(double v) { mp_encode_double(grow(mp_sizeof_double(v)), v); }
  void str(std::string_view s) {
    auto n = static_cast<uint32_t>(s.size());
    mp_encode_str(grow(mp_sizeof_str(n)), s.data(), n);
  }
  void opt_sint(const std::optional<int64_t>& v) {
    if (v) {
      sint(*v);
    } else {
      nil();
    }
  }
  void medium(Medium m) {
    if (m == Medium::kNone) {
      nil();
    } else {
      str(to_string(m));
    }
  }

 private:
  char* grow(size_t n) {
    size_t at = out_.size();
    out_.resize(at + n);
    return out_.data() + at;
  }
  std::string& out_;
};

// Ids: SGLang publishes signed int64, vLLM unsigned.
void put_id(Writer& w, uint64_t id, WireFormat f) {
  if (f == WireFormat::kSglang) {
    w.sint(static_cast<int64_t>(id));
  } else {
    w.uint(id);
  }
}

void put_ids(Writer& w, const std::vector<uint64_t>& ids, WireFormat f) {
  w.array(static_cast<uint32_t>(ids.size()));
  for (uint64_t id : ids) put_id(w, id, f);
}

void put_tokens(Writer& w, const std::vector<int32_t>& tokens) {
  w.array(static_cast<uint32_t>(tokens.size()));
  for (int32_t t : tokens) w.sint(t);
}

void encode_sglang(Writer& w, const Event& e) {
  if (const auto* s = std::get_if<BlockStored>(&e)) {
    // SGLang's BlockStoredWithMetadata: the metadata map is an 8th element, present only for a
    // salted request's blocks (so unsalted events keep their 7-element shape).
    const bool metadata = s->cache_salt.has_value() || s->lora_name.has_value();
    w.array(metadata ? 8 : s->medium == Medium::kNone ? 6 : 7);
    w.str("BlockStored");
    put_ids(w, s->block_hashes, WireFormat::kSglang);
    if (s->parent_block_hash) {
      put_id(w, *s->parent_block_hash, WireFormat::kSglang);
    } else {
      w.nil();
    }
    put_tokens(w, s->token_ids);
    w.sint(s->block_size);
    w.opt_sint(s->lora_id);
    if (metadata || s->medium != Medium::kNone) w.medium(s->medium);
    if (metadata) {
      w.map((s->cache_salt ? 1 : 0) + (s->lora_name ? 1 : 0));
      if (s->cache_salt) {
        w.str("cache_salt");
        w.str(*s->cache_salt);
      }
      if (s->lora_name) {
        w.str("lora_name");
        w.str(*s->lora_name);
      }
    }
  } else if (const auto* r = std::get_if<BlockRemoved>(&e)) {
    w.array(r->medium == Medium::kNone ? 2 : 3);
    w.str("BlockRemoved");
    put_ids(w, r->block_hashes, WireFormat::kSglang);
    if (r->medium != Medium::kNone) w.medium(r->medium);
  } else {
    w.array(1);
    w.str("AllBlocksCleared");
  }
}

void encode_vllm(Writer& w, const Event& e) {
  if (const auto* s = std::get_if<BlockStored>(&e)) {
    w.map(8);
    w.str("type");
    w.str("BlockStored");
    w.str("block_hashes");
    put_ids(w, s->block_hashes, WireFormat::kVllm);
    w.str("parent_block_hash");
    if (s->parent_block_hash) {
      put_id(w, *s->parent_block_hash, WireFormat::kVllm);
    } else {
      w.nil();
    }
    w.str("token_ids");
    put_tokens(w, s->token_ids);
    w.str("block_size");
    w.sint(s->block_size);
    w.str("lora_id");
    w.opt_sint(s->lora_id);
    w.str("medium");
    w.medium(s->medium);
    w.str("lora_name");
    if (s->lora_name) {
      w.str(*s->lora_name);
    } else {
      w.nil();
    }
  } else if (const auto* r = std::get_if<BlockRemoved>(&e)) {
    w.map(3);
    w.str("type");
    w.str("BlockRemoved");
    w.str("block_hashes");
    put_ids(w, r->block_hashes, WireFormat::kVllm);
    w.str("medium");
    w.medium(r->medium);
  } else {
    w.map(1);
    w.str("type");
    w.str("AllBlocksCleared");
  }
}

// ---------------------------------------------------------------- decoding

// A cursor over untrusted msgpack. Every read checks the type and the bytes left before msgpuck
// decodes anything; container counts are checked against the bytes left (each element needs at
// least one), so no count can make a loop run past the input.
class Reader {
 public:
  Reader(const char* begin, const char* end) : begin_(begin), p_(begin), end_(end) {}

  size_t offset() const { return static_cast<size_t>(p_ - begin_); }
  bool at_end() const { return p_ >= end_; }
  size_t left() const { return static_cast<size_t>(end_ - p_); }
  // Type of the next value; MP_EXT also stands for "no more input" (callers check at_end()).
  mp_type peek() const { return at_end() ? MP_EXT : mp_typeof(*p_); }

  DecodeError array(uint32_t& n) {
    if (at_end()) return DecodeError::kTruncated;
    if (mp_check_array(p_, end_) > 0) return DecodeError::kTruncated;
    n = mp_decode_array(&p_);
    return n <= left() ? DecodeError::kNone : DecodeError::kInvalid;
  }
  DecodeError map(uint32_t& n) {
    if (at_end()) return DecodeError::kTruncated;
    if (mp_check_map(p_, end_) > 0) return DecodeError::kTruncated;
    n = mp_decode_map(&p_);
    return n <= left() / 2 ? DecodeError::kNone : DecodeError::kInvalid;
  }
  // A string (or bin) value.
  DecodeError bytes(std::string_view& s) {
    mp_type t = peek();
    uint32_t len = 0;
    const char* data = nullptr;
    if (t == MP_STR) {
      if (mp_check_strl(p_, end_) > 0) return DecodeError::kTruncated;
      data = mp_decode_str(&p_, &len);
    } else if (t == MP_BIN) {
      if (mp_check_binl(p_, end_) > 0) return DecodeError::kTruncated;
      data = mp_decode_bin(&p_, &len);
    } else {
      return DecodeError::kBadEvent;
    }
    if (len > static_cast<uint64_t>(end_ - data)) {
      p_ = end_;
      return DecodeError::kTruncated;
    }
    s = std::string_view(data, len);
    return DecodeError::kNone;
  }
  // An integer (uint or negative int) as its 64-bit pattern; `negative` tells which.
  DecodeError integer(uint64_t& bits, bool& negative) {
    mp_type t = peek();
    if (t == MP_UINT) {
      if (mp_check_uint(p_, end_) > 0) return DecodeError::kTruncated;
      bits = mp_decode_uint(&p_);
      negative = false;
      return DecodeError::kNone;
    }
    if (t == MP_INT) {
      if (mp_check_int(p_, end_) > 0) return DecodeError::kTruncated;
      int64_t v = mp_decode_int(&p_);
      bits = static_cast<uint64_t>(v);
      negative = v < 0;
      return DecodeError::kNone;
    }
    return DecodeError::kBadEvent;
  }
  DecodeError number(double& v) {
    mp_type t = peek();
    if (t == MP_DOUBLE) {
      if (mp_check_double(p_, end_) > 0) return DecodeError::kTruncated;
      v = mp_decode_double(&p_);
      return DecodeError::kNone;
    }
    if (t == MP_FLOAT) {
      if (mp_check_float(p_, end_) > 0) return DecodeError::kTruncated;
      v = mp_decode_float(&p_);
      return DecodeError::kNone;
    }
    uint64_t bits = 0;
    bool negative = false;
    if (auto e = integer(bits, negative); e != DecodeError::kNone) return e;
    v = negative ? static_cast<double>(static_cast<int64_t>(bits)) : static_cast<double>(bits);
    return DecodeError::kNone;
  }
  bool nil() {
    if (peek() != MP_NIL || at_end()) return false;
    ++p_;
    return true;
  }
  // Skips one value of any type and depth, without recursion.
  DecodeError skip() {
    uint64_t pending = 1;
    while (pending > 0) {
      if (at_end()) return DecodeError::kTruncated;
      --pending;
      mp_type t = mp_typeof(*p_);
      if (t == MP_ARRAY || t == MP_MAP) {
        uint32_t n = 0;
        DecodeError e = t == MP_ARRAY ? array(n) : map(n);
        if (e != DecodeError::kNone) return e;
        pending += t == MP_ARRAY ? uint64_t{n} : uint64_t{n} * 2;
        if (pending > left()) return DecodeError::kInvalid;
        continue;
      }
      if (static_cast<uint8_t>(*p_) == 0xc1) return DecodeError::kInvalid;  // never used
      // A scalar, string or ext: mp_check never counts elements for these, it only bounds-checks
      // the value's length.
      const char* q = p_;
      if (mp_check(&q, end_) != 0) {
        p_ = end_;
        return DecodeError::kTruncated;
      }
      p_ = q;
    }
    return DecodeError::kNone;
  }

 private:
  const char* begin_;
  const char* p_;
  const char* end_;
};

struct Failure {
  DecodeError error;
  std::string_view field;
};

#define KV_TRY(expr, field_name)                                           \
  do {                                                                     \
    if (DecodeError kv_try_e_ = (expr); kv_try_e_ != DecodeError::kNone) { \
      return Failure{kv_try_e_, field_name};                               \
    }                                                                      \
  } while (0)

constexpr Failure kOk{DecodeError::kNone, {}};

// A type mismatch inside an event is kBadEvent; inside the batch frame kBadBatch.
DecodeError as(DecodeError e, DecodeError mismatch) {
  return e == DecodeError::kBadEvent ? mismatch : e;
}

DecodeError read_hash(Reader& r, uint64_t& out) {
  if (r.peek() == MP_STR || r.peek() == MP_BIN) {
    std::string_view b;
    if (auto e = r.bytes(b); e != DecodeError::kNone) return e;
    if (b.empty()) return DecodeError::kBadEvent;
    // vLLM's int conversion: int.from_bytes(hash, "big") & (2**64 - 1), i.e. the last 8 bytes.
    out = 0;
    size_t from = b.size() > 8 ? b.size() - 8 : 0;
    for (size_t i = from; i < b.size(); ++i) out = (out << 8) | static_cast<uint8_t>(b[i]);
    return DecodeError::kNone;
  }
  bool negative = false;
  return r.integer(out, negative);
}

DecodeError read_hashes(Reader& r, std::vector<uint64_t>& out) {
  if (r.peek() != MP_ARRAY || r.at_end()) return DecodeError::kBadEvent;
  uint32_t n = 0;
  if (auto e = r.array(n); e != DecodeError::kNone) return e;
  out.clear();
  out.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    uint64_t h = 0;
    if (auto e = read_hash(r, h); e != DecodeError::kNone) return e;
    out.push_back(h);
  }
  return DecodeError::kNone;
}

DecodeError read_opt_hash(Reader& r, std::optional<uint64_t>& out) {
  if (r.nil()) {
    out.reset();
    return DecodeError::kNone;
  }
  uint64_t h = 0;
  if (auto e = read_hash(r, h); e != DecodeError::kNone) return e;
  out = h;
  return DecodeError::kNone;
}

DecodeError read_int(Reader& r, int64_t& out) {
  uint64_t bits = 0;
  bool negative = false;
  if (auto e = r.integer(bits, negative); e != DecodeError::kNone) return e;
  if (!negative && bits > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return DecodeError::kBadEvent;
  }
  out = static_cast<int64_t>(bits);
  return DecodeError::kNone;
}

DecodeError read_opt_int(Reader& r, std::optional<int64_t>& out) {
  if (r.nil()) {
    out.reset();
    return DecodeError::kNone;
  }
  int64_t v = 0;
  if (auto e = read_int(r, v); e != DecodeError::kNone) return e;
  out = v;
  return DecodeError::kNone;
}

DecodeError read_tokens(Reader& r, std::vector<int32_t>& out) {
  if (r.peek() != MP_ARRAY || r.at_end()) return DecodeError::kBadEvent;
  uint32_t n = 0;
  if (auto e = r.array(n); e != DecodeError::kNone) return e;
  out.clear();
  out.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    int64_t v = 0;
    if (auto e = read_int(r, v); e != DecodeError::kNone) return e;
    if (v < 0 || v > std::numeric_limits<int32_t>::max()) return DecodeError::kBadEvent;
    out.push_back(static_cast<int32_t>(v));
  }
  return DecodeError::kNone;
}

DecodeError read_medium(Reader& r, Medium& out) {
  if (r.nil()) {
    out = Medium::kNone;
    return DecodeError::kNone;
  }
  if (r.peek() != MP_STR) return DecodeError::kBadEvent;
  std::string_view s;
  if (auto e = r.bytes(s); e != DecodeError::kNone) return e;
  out = medium_from_string(s);
  return DecodeError::kNone;
}

DecodeError read_opt_string(Reader& r, std::optional<std::string>& out) {
  if (r.nil()) return DecodeError::kNone;
  if (r.peek() != MP_STR || r.at_end()) return DecodeError::kBadEvent;
  std::string_view s;
  if (auto e = r.bytes(s); e != DecodeError::kNone) return e;
  out.emplace(s);
  return DecodeError::kNone;
}

// SGLang's BlockStoredMetadata: a map whose "cache_salt" names the block's namespace. Other keys
// (session_id, ... in other builds) are skipped; so is an element that is not a map at all (the
// position holds other fields in other engines' positional shapes).
DecodeError read_metadata(Reader& r, std::optional<std::string>& salt,
                          std::optional<std::string>& lora_name) {
  if (r.peek() != MP_MAP || r.at_end()) return r.skip();
  uint32_t n = 0;
  if (auto e = r.map(n); e != DecodeError::kNone) return e;
  for (uint32_t i = 0; i < n; ++i) {
    std::string_view key;
    if (r.peek() == MP_STR && !r.at_end()) {
      if (auto e = r.bytes(key); e != DecodeError::kNone) return e;
    } else if (auto e = r.skip(); e != DecodeError::kNone) {
      return e;
    }
    DecodeError e = key == "cache_salt"  ? read_opt_string(r, salt)
                    : key == "lora_name" ? read_opt_string(r, lora_name)
                                         : r.skip();
    if (e != DecodeError::kNone) return e;
  }
  return DecodeError::kNone;
}

enum class Kind { kStored, kRemoved, kCleared, kUnknown };

Kind kind_of(std::string_view tag) {
  if (tag == "BlockStored") return Kind::kStored;
  if (tag == "BlockRemoved") return Kind::kRemoved;
  if (tag == "AllBlocksCleared") return Kind::kCleared;
  return Kind::kUnknown;
}

// ["BlockStored", hashes, parent, token_ids, block_size, lora_id?, medium?, metadata?,
//  ...ignored]
Failure positional_stored(Reader& r, uint32_t fields, BlockStored& s) {
  if (fields < 4) return {DecodeError::kBadEvent, "BlockStored: fewer than 4 fields"};
  KV_TRY(read_hashes(r, s.block_hashes), "BlockStored.block_hashes");
  KV_TRY(read_opt_hash(r, s.parent_block_hash), "BlockStored.parent_block_hash");
  KV_TRY(read_tokens(r, s.token_ids), "BlockStored.token_ids");
  KV_TRY(read_int(r, s.block_size), "BlockStored.block_size");
  if (fields > 4) KV_TRY(read_opt_int(r, s.lora_id), "BlockStored.lora_id");
  if (fields > 5) KV_TRY(read_medium(r, s.medium), "BlockStored.medium");
  if (fields > 6) KV_TRY(read_metadata(r, s.cache_salt, s.lora_name), "BlockStored.metadata");
  for (uint32_t i = 7; i < fields; ++i) KV_TRY(r.skip(), "BlockStored: trailing field");
  return kOk;
}

// ["BlockRemoved", hashes, medium?, ...ignored]
Failure positional_removed(Reader& r, uint32_t fields, BlockRemoved& b) {
  if (fields < 1) return {DecodeError::kBadEvent, "BlockRemoved: no block_hashes"};
  KV_TRY(read_hashes(r, b.block_hashes), "BlockRemoved.block_hashes");
  if (fields > 1) KV_TRY(read_medium(r, b.medium), "BlockRemoved.medium");
  for (uint32_t i = 2; i < fields; ++i) KV_TRY(r.skip(), "BlockRemoved: trailing field");
  return kOk;
}

Failure positional_event(Reader& r, EventBatch& out) {
  uint32_t n = 0;
  KV_TRY(r.array(n), "event");
  if (n == 0 || r.peek() != MP_STR || r.at_end()) {
    return {DecodeError::kBadEvent, "event: the first element is not a type name"};
  }
  std::string_view tag;
  KV_TRY(r.bytes(tag), "event type");
  const uint32_t fields = n - 1;
  switch (kind_of(tag)) {
    case Kind::kStored: {
      BlockStored s;
      if (auto f = positional_stored(r, fields, s); f.error != DecodeError::kNone) return f;
      out.events.emplace_back(std::move(s));
      return kOk;
    }
    case Kind::kRemoved: {
      BlockRemoved b;
      if (auto f = positional_removed(r, fields, b); f.error != DecodeError::kNone) return f;
      out.events.emplace_back(std::move(b));
      return kOk;
    }
    case Kind::kCleared:
      for (uint32_t i = 0; i < fields; ++i) KV_TRY(r.skip(), "AllBlocksCleared: field");
      out.events.emplace_back(AllBlocksCleared{});
      return kOk;
    case Kind::kUnknown:
      for (uint32_t i = 0; i < fields; ++i) KV_TRY(r.skip(), "unknown event: field");
      ++out.skipped_events;
      return kOk;
  }
  return kOk;
}

// {"type": ..., field: value, ...}: the type may come anywhere, so it is found first.
Failure map_event(Reader& r, EventBatch& out) {
  uint32_t n = 0;
  KV_TRY(r.map(n), "event");
  Reader scan = r;
  std::string_view tag;
  bool have_tag = false;
  for (uint32_t i = 0; i < n; ++i) {
    std::string_view key;
    if (scan.peek() == MP_STR && !scan.at_end()) {
      KV_TRY(scan.bytes(key), "event key");
    } else {
      KV_TRY(scan.skip(), "event key");
    }
    if (key == "type" && scan.peek() == MP_STR && !scan.at_end()) {
      KV_TRY(scan.bytes(tag), "event type");
      have_tag = true;
    } else {
      KV_TRY(scan.skip(), "event value");
    }
  }
  if (!have_tag) return {DecodeError::kBadEvent, "event: no \"type\""};
  const Kind kind = kind_of(tag);
  BlockStored s;
  BlockRemoved b;
  bool hashes = false, parent = false, tokens = false, size = false;
  for (uint32_t i = 0; i < n; ++i) {
    std::string_view key;
    if (r.peek() == MP_STR && !r.at_end()) {
      KV_TRY(r.bytes(key), "event key");
    } else {
      KV_TRY(r.skip(), "event key");
    }
    if (kind == Kind::kStored && key == "block_hashes") {
      KV_TRY(read_hashes(r, s.block_hashes), "BlockStored.block_hashes");
      hashes = true;
    } else if (kind == Kind::kStored && key == "parent_block_hash") {
      KV_TRY(read_opt_hash(r, s.parent_block_hash), "BlockStored.parent_block_hash");
      parent = true;
    } else if (kind == Kind::kStored && key == "token_ids") {
      KV_TRY(read_tokens(r, s.token_ids), "BlockStored.token_ids");
      tokens = true;
    } else if (kind == Kind::kStored && key == "block_size") {
      KV_TRY(read_int(r, s.block_size), "BlockStored.block_size");
      size = true;
    } else if (kind == Kind::kStored && key == "lora_id") {
      KV_TRY(read_opt_int(r, s.lora_id), "BlockStored.lora_id");
    } else if (kind == Kind::kStored && key == "medium") {
      KV_TRY(read_medium(r, s.medium), "BlockStored.medium");
    } else if (kind == Kind::kStored && key == "cache_salt") {
      KV_TRY(read_opt_string(r, s.cache_salt), "BlockStored.cache_salt");
    } else if (kind == Kind::kStored && key == "lora_name") {
      KV_TRY(read_opt_string(r, s.lora_name), "BlockStored.lora_name");
    } else if (kind == Kind::kStored && key == "metadata") {
      KV_TRY(read_metadata(r, s.cache_salt, s.lora_name), "BlockStored.metadata");
    } else if (kind == Kind::kRemoved && key == "block_hashes") {
      KV_TRY(read_hashes(r, b.block_hashes), "BlockRemoved.block_hashes");
      hashes = true;
    } else if (kind == Kind::kRemoved && key == "medium") {
      KV_TRY(read_medium(r, b.medium), "BlockRemoved.medium");
    } else {
      KV_TRY(r.skip(), "event value");
    }
  }
  switch (kind) {
    case Kind::kStored:
      if (!hashes || !tokens || !size) {
        return {DecodeError::kBadEvent,
                "BlockStored: block_hashes, token_ids or block_size missing"};
      }
      (void)parent;  // absent = nil
      out.events.emplace_back(std::move(s));
      break;
    case Kind::kRemoved:
      if (!hashes) return {DecodeError::kBadEvent, "BlockRemoved: block_hashes missing"};
      out.events.emplace_back(std::move(b));
      break;
    case Kind::kCleared:
      out.events.emplace_back(AllBlocksCleared{});
      break;
    case Kind::kUnknown:
      ++out.skipped_events;
      break;
  }
  return kOk;
}

Failure read_events(Reader& r, EventBatch& out) {
  if (r.peek() != MP_ARRAY || r.at_end()) return {DecodeError::kBadBatch, "events: not a list"};
  uint32_t n = 0;
  KV_TRY(r.array(n), "events");
  out.events.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    Failure f = kOk;
    if (r.at_end()) return {DecodeError::kTruncated, "events"};
    if (r.peek() == MP_ARRAY) {
      f = positional_event(r, out);
    } else if (r.peek() == MP_MAP) {
      f = map_event(r, out);
    } else {
      return {DecodeError::kBadEvent, "event: neither a list nor a map"};
    }
    if (f.error != DecodeError::kNone) return f;
  }
  return kOk;
}

Failure read_dp_rank(Reader& r, std::optional<int64_t>& out) {
  KV_TRY(as(read_opt_int(r, out), DecodeError::kBadBatch), "batch dp rank");
  return kOk;
}

// [ts, events, dp_rank?, ...ignored] or {"ts", "events", "data_parallel_rank" | "attn_dp_rank"}
Failure read_batch(Reader& r, EventBatch& out) {
  if (r.at_end()) return {DecodeError::kTruncated, "batch"};
  if (r.peek() == MP_ARRAY) {
    uint32_t n = 0;
    KV_TRY(r.array(n), "batch");
    if (n < 2) return {DecodeError::kBadBatch, "batch: fewer than 2 fields"};
    KV_TRY(as(r.number(out.ts), DecodeError::kBadBatch), "batch ts");
    if (auto f = read_events(r, out); f.error != DecodeError::kNone) return f;
    if (n > 2) {
      if (auto f = read_dp_rank(r, out.dp_rank); f.error != DecodeError::kNone) return f;
    }
    for (uint32_t i = 3; i < n; ++i) KV_TRY(r.skip(), "batch: trailing field");
    return kOk;
  }
  if (r.peek() != MP_MAP) return {DecodeError::kBadBatch, "batch: neither a list nor a map"};
  out.map_shaped = true;
  uint32_t n = 0;
  KV_TRY(r.map(n), "batch");
  bool ts = false, events = false;
  for (uint32_t i = 0; i < n; ++i) {
    std::string_view key;
    if (r.peek() == MP_STR && !r.at_end()) {
      KV_TRY(r.bytes(key), "batch key");
    } else {
      KV_TRY(r.skip(), "batch key");
    }
    if (key == "ts") {
      KV_TRY(as(r.number(out.ts), DecodeError::kBadBatch), "batch ts");
      ts = true;
    } else if (key == "events") {
      if (auto f = read_events(r, out); f.error != DecodeError::kNone) return f;
      events = true;
    } else if (key == "data_parallel_rank" || key == "attn_dp_rank" || key == "dp_rank") {
      if (auto f = read_dp_rank(r, out.dp_rank); f.error != DecodeError::kNone) return f;
    } else {
      KV_TRY(r.skip(), "batch value");
    }
  }
  if (!ts || !events) return {DecodeError::kBadBatch, "batch: ts or events missing"};
  return kOk;
}

#undef KV_TRY

}  // namespace

std::string_view to_string(Medium m) {
  switch (m) {
    case Medium::kNone:
      return "";
    case Medium::kGpu:
      return "GPU";
    case Medium::kCpuPinned:
      return "CPU_PINNED";
    case Medium::kDisk:
      return "DISK";
    case Medium::kExternal:
      return "EXTERNAL";
    case Medium::kOther:
      return "OTHER";
  }
  return "";
}

Medium medium_from_string(std::string_view s) {
  if (s == "GPU") return Medium::kGpu;
  if (s == "CPU_PINNED" || s == "CPU") return Medium::kCpuPinned;
  if (s == "DISK") return Medium::kDisk;
  if (s == "EXTERNAL") return Medium::kExternal;
  return Medium::kOther;
}

std::string_view to_string(WireFormat f) {
  return f == WireFormat::kSglang ? "sglang" : "vllm";
}

std::string_view to_string(DecodeError e) {
  switch (e) {
    case DecodeError::kNone:
      return "ok";
    case DecodeError::kFrameCount:
      return "not a [topic, sequence, payload] message";
    case DecodeError::kSequenceSize:
      return "sequence frame is not 8 bytes";
    case DecodeError::kTruncated:
      return "payload truncated";
    case DecodeError::kInvalid:
      return "invalid msgpack";
    case DecodeError::kBadBatch:
      return "not an event batch";
    case DecodeError::kBadEvent:
      return "bad event";
    case DecodeError::kTrailingBytes:
      return "bytes after the batch";
  }
  return "?";
}

std::string DecodeStatus::message() const {
  std::string m(to_string(error));
  if (error == DecodeError::kNone) return m;
  m += " at byte " + std::to_string(offset);
  if (!field.empty()) {
    m += " (";
    m += field;
    m += ")";
  }
  return m;
}

void encode_batch(const EventBatch& batch, WireFormat format, std::string& out) {
  Writer w(out);
  if (format == WireFormat::kSglang) {
    w.array(3);
    w.dbl(batch.ts);
    w.array(static_cast<uint32_t>(batch.events.size()));
    for (const auto& e : batch.events) encode_sglang(w, e);
    w.opt_sint(batch.dp_rank);
    return;
  }
  w.map(batch.dp_rank ? 3 : 2);
  w.str("ts");
  w.dbl(batch.ts);
  w.str("events");
  w.array(static_cast<uint32_t>(batch.events.size()));
  for (const auto& e : batch.events) encode_vllm(w, e);
  if (batch.dp_rank) {
    w.str("data_parallel_rank");
    w.sint(*batch.dp_rank);
  }
}

DecodeStatus decode_batch(std::string_view payload, EventBatch& out) {
  out.ts = 0;
  out.events.clear();
  out.dp_rank.reset();
  out.skipped_events = 0;
  out.map_shaped = false;
  Reader r(payload.data(), payload.data() + payload.size());
  Failure f = read_batch(r, out);
  if (f.error == DecodeError::kNone && !r.at_end()) {
    f = {DecodeError::kTrailingBytes, "after the batch"};
  }
  return DecodeStatus{f.error, f.field, r.offset()};
}

DecodeStatus decode_message(std::span<const std::string_view> frames, Message& out) {
  if (frames.size() != 3) return DecodeStatus{DecodeError::kFrameCount, "frames", 0};
  if (!decode_sequence(frames[1], out.seq)) {
    return DecodeStatus{DecodeError::kSequenceSize, "sequence", 0};
  }
  out.topic.assign(frames[0]);
  return decode_batch(frames[2], out.batch);
}

std::string encode_sequence(uint64_t seq) {
  std::string s(8, '\0');
  for (int i = 7; i >= 0; --i) {
    s[static_cast<size_t>(i)] = static_cast<char>(seq & 0xff);
    seq >>= 8;
  }
  return s;
}

bool decode_sequence(std::string_view frame, uint64_t& seq) {
  if (frame.size() != 8) return false;
  seq = 0;
  for (char c : frame) seq = (seq << 8) | static_cast<uint8_t>(c);
  return true;
}

}  // namespace kvgate::kv
