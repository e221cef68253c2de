// replica/wire: see wire.h.
#include "replica/wire.h"

#define XXH_INLINE_ALL  // header-only xxHash: no library to link
#include <xxhash.h>

#include <algorithm>
#include <limits>
#include <map>

namespace kvgate::replica {
namespace {

constexpr std::string_view kMagic = "KVGR";

void put_header(const Header& h, std::string& out) {
  Writer w(out);
  w.bytes(kMagic);
  w.u8(kVersion);
  w.u8(static_cast<uint8_t>(h.kind));
  w.u16(0);
  w.u64(h.replica);
  w.u64(static_cast<uint64_t>(h.sent_us));
}

uint16_t clamp16(size_t n) {
  return static_cast<uint16_t>(std::min<size_t>(n, std::numeric_limits<uint16_t>::max()));
}

}  // namespace

uint64_t worker_key(std::string_view url) {
  return XXH3_64bits(url.data(), url.size());
}

bool Reader::get(uint64_t& v, size_t n) {
  if (left() < n) return false;
  v = 0;
  for (size_t i = 0; i < n; ++i) {
    v |= static_cast<uint64_t>(static_cast<unsigned char>(in_[pos_ + i])) << (8 * i);
  }
  pos_ += n;
  return true;
}

bool Reader::u8(uint8_t& v) {
  uint64_t x = 0;
  if (!get(x, 1)) return false;
  v = static_cast<uint8_t>(x);
  return true;
}

bool Reader::u16(uint16_t& v) {
  uint64_t x = 0;
  if (!get(x, 2)) return false;
  v = static_cast<uint16_t>(x);
  return true;
}

bool Reader::u32(uint32_t& v) {
  uint64_t x = 0;
  if (!get(x, 4)) return false;
  v = static_cast<uint32_t>(x);
  return true;
}

bool Reader::u64(uint64_t& v) {
  return get(v, 8);
}

bool Reader::bytes(size_t n, std::string_view& v) {
  if (left() < n) return false;
  v = in_.substr(pos_, n);
  pos_ += n;
  return true;
}

std::string Reader::error(std::string_view field, std::string_view what) const {
  return std::string(field) + " at offset " + std::to_string(pos_) + ": " + std::string(what);
}

size_t chain_record_bytes(const ChainRecord& r) {
  return 1 + 1 + 2 + 2 + 8 + 8 + 2 + 8 * std::min<size_t>(r.hashes.size(), UINT16_MAX);
}

void encode_chains(const Header& h, std::span<const ChainRecord> records, std::string& out) {
  Header hh = h;
  hh.kind = Kind::kChains;
  put_header(hh, out);
  // The rule table: each name once (at most 256 distinct rules per message; records past that
  // or past kMaxRecords are for the caller to send in another message).
  std::map<std::string_view, uint8_t> index;
  std::vector<std::string_view> names;
  size_t n = 0;
  for (const auto& r : records) {
    if (n == kMaxRecords) break;
    if (!index.contains(r.rule)) {
      if (names.size() == 256) break;
      index.emplace(r.rule, static_cast<uint8_t>(names.size()));
      names.push_back(r.rule);
    }
    ++n;
  }
  Writer w(out);
  w.u16(static_cast<uint16_t>(names.size()));
  for (std::string_view name : names) {
    std::string_view cut = name.substr(0, kMaxRuleBytes);
    w.u8(static_cast<uint8_t>(cut.size()));
    w.bytes(cut);
  }
  w.u16(static_cast<uint16_t>(n));
  for (size_t i = 0; i < n; ++i) {
    const ChainRecord& r = records[i];
    w.u8(index.at(r.rule));
    w.u8(static_cast<uint8_t>((r.retract ? 1 : 0) | (r.predict ? 2 : 0)));
    w.u16(clamp16(r.chunk_bytes));
    w.u16(static_cast<uint16_t>(static_cast<int16_t>(std::clamp<int32_t>(r.rank, -1, INT16_MAX))));
    w.u64(r.worker);
    w.u64(static_cast<uint64_t>(r.origin_us));
    const uint16_t count = clamp16(r.hashes.size());
    w.u16(count);
    for (uint16_t k = 0; k < count; ++k) w.u64(r.hashes[k]);
  }
}

void encode_load(const Header& h, const LoadReport& load, std::string& out) {
  Header hh = h;
  hh.kind = Kind::kLoad;
  put_header(hh, out);
  Writer w(out);
  w.u64(load.seq);
  const size_t n = std::min(load.entries.size(), kMaxLoadEntries);
  w.u32(static_cast<uint32_t>(n));
  for (size_t i = 0; i < n; ++i) {
    const LoadEntry& e = load.entries[i];
    w.u64(e.worker);
    w.u16(static_cast<uint16_t>(static_cast<int16_t>(std::clamp<int32_t>(e.rank, -1, INT16_MAX))));
    w.u32(static_cast<uint32_t>(std::clamp<int64_t>(e.inflight, 0, UINT32_MAX)));
    w.u64(static_cast<uint64_t>(std::max<int64_t>(0, e.prefill_tokens)));
  }
}

std::string decode_header(std::string_view msg, Header& h) {
  Reader r(msg);
  std::string_view magic;
  if (!r.bytes(4, magic) || magic != kMagic) {
    return r.error("magic", "not a kvgate replica message (want \"KVGR\")");
  }
  uint8_t version = 0, kind = 0;
  uint16_t reserved = 0;
  uint64_t replica = 0, sent = 0;
  if (!r.u8(version)) return r.error("version", "message ends");
  if (version != kVersion) {
    return r.error("version", "version " + std::to_string(version) + " (this kvgate speaks " +
                                  std::to_string(kVersion) + ")");
  }
  if (!r.u8(kind) || !r.u16(reserved) || !r.u64(replica) || !r.u64(sent)) {
    return r.error("header", "message ends within the header");
  }
  if (reserved != 0) return r.error("reserved", "must be zero in version 1");
  if (kind < static_cast<uint8_t>(Kind::kChains) ||
      kind > static_cast<uint8_t>(Kind::kInventoryReply)) {
    return r.error("kind", "unknown kind " + std::to_string(kind));
  }
  h.kind = static_cast<Kind>(kind);
  h.replica = replica;
  h.sent_us = static_cast<int64_t>(sent);
  return "";
}

namespace {
std::string decode_chains_into(std::string_view msg, std::vector<ChainRecord>& out);
}  // namespace

std::string decode_chains(std::string_view msg, std::vector<ChainRecord>& out) {
  out.clear();
  std::string e = decode_chains_into(msg, out);
  if (!e.empty()) out.clear();  // all or nothing
  return e;
}

namespace {
std::string decode_chains_into(std::string_view msg, std::vector<ChainRecord>& out) {
  Header h;
  if (std::string e = decode_header(msg, h); !e.empty()) return e;
  if (h.kind != Kind::kChains) return "kind: not a chains message";
  Reader r(msg, kHeaderBytes);
  uint16_t rules = 0;
  if (!r.u16(rules)) return r.error("rules", "message ends");
  if (rules > 256) return r.error("rules", "more than 256 rule names");
  std::vector<std::string_view> names(rules);
  for (auto& name : names) {
    uint8_t len = 0;
    if (!r.u8(len)) return r.error("rule name", "message ends");
    if (len == 0 || len > kMaxRuleBytes) return r.error("rule name", "length not in 1..96");
    if (!r.bytes(len, name)) return r.error("rule name", "message ends");
  }
  uint16_t count = 0;
  if (!r.u16(count)) return r.error("records", "message ends");
  if (count > kMaxRecords) return r.error("records", "more than 4096 records");
  // Each record is at least 24 bytes: a count the rest cannot hold is refused before reserving.
  if (static_cast<size_t>(count) * 24 > r.left())
    return r.error("records", "count exceeds the message");
  out.reserve(count);
  for (uint16_t i = 0; i < count; ++i) {
    uint8_t rule = 0, flags = 0;
    uint16_t chunk = 0, rank = 0, n = 0;
    uint64_t worker = 0, origin = 0;
    if (!r.u8(rule) || !r.u8(flags) || !r.u16(chunk) || !r.u16(rank) || !r.u64(worker) ||
        !r.u64(origin) || !r.u16(n)) {
      return r.error("record " + std::to_string(i), "message ends");
    }
    if (rule >= names.size())
      return r.error("record " + std::to_string(i), "rule index out of range");
    if (flags > 3) return r.error("record " + std::to_string(i), "unknown flags");
    const auto signed_rank = static_cast<int16_t>(rank);
    if (signed_rank < -1) return r.error("record " + std::to_string(i), "rank below -1");
    if (static_cast<size_t>(n) * 8 > r.left()) {
      return r.error("record " + std::to_string(i), "hash count exceeds the message");
    }
    ChainRecord rec;
    rec.rule = std::string(names[rule]);
    rec.worker = worker;
    rec.rank = signed_rank;
    rec.origin_us = static_cast<int64_t>(origin);
    rec.retract = (flags & 1) != 0;
    rec.predict = (flags & 2) != 0;
    rec.chunk_bytes = chunk;
    rec.hashes.resize(n);
    for (auto& x : rec.hashes) r.u64(x);
    out.push_back(std::move(rec));
  }
  if (r.left() != 0) return r.error("records", "bytes left after the last record");
  return "";
}
}  // namespace

namespace {
std::string decode_load_into(std::string_view msg, LoadReport& out);
}  // namespace

std::string decode_load(std::string_view msg, LoadReport& out) {
  out = {};
  std::string e = decode_load_into(msg, out);
  if (!e.empty()) out = {};
  return e;
}

namespace {
std::string decode_load_into(std::string_view msg, LoadReport& out) {
  Header h;
  if (std::string e = decode_header(msg, h); !e.empty()) return e;
  if (h.kind != Kind::kLoad) return "kind: not a load message";
  Reader r(msg, kHeaderBytes);
  uint32_t n = 0;
  if (!r.u64(out.seq) || !r.u32(n)) return r.error("load", "message ends");
  if (n > kMaxLoadEntries) return r.error("entries", "more than 65536 entries");
  constexpr size_t kEntry = 8 + 2 + 4 + 8;
  if (static_cast<size_t>(n) * kEntry != r.left()) {
    return r.error("entries", "count does not match the message's length");
  }
  out.entries.resize(n);
  for (auto& e : out.entries) {
    uint16_t rank = 0;
    uint32_t inflight = 0;
    uint64_t tokens = 0;
    r.u64(e.worker);
    r.u16(rank);
    r.u32(inflight);
    r.u64(tokens);
    e.rank = static_cast<int16_t>(rank);
    if (e.rank < -1) return r.error("entries", "rank below -1");
    e.inflight = inflight;
    if (tokens > static_cast<uint64_t>(INT64_MAX))
      return r.error("entries", "prefill tokens out of range");
    e.prefill_tokens = static_cast<int64_t>(tokens);
  }
  return "";
}

}  // namespace

namespace {

void put_source(Writer& w, const InventoryRequest& r) {
  std::string_view rule = std::string_view(r.rule).substr(0, kMaxRuleBytes);
  w.u8(static_cast<uint8_t>(rule.size()));
  w.bytes(rule);
  w.u64(r.worker);
  w.u16(static_cast<uint16_t>(static_cast<int16_t>(std::clamp<int32_t>(r.rank, -1, INT16_MAX))));
}

std::string get_source(Reader& r, InventoryRequest& out) {
  uint8_t len = 0;
  std::string_view rule;
  uint16_t rank = 0;
  if (!r.u8(len) || len == 0 || len > kMaxRuleBytes || !r.bytes(len, rule)) {
    return r.error("rule", "missing or not 1..96 bytes");
  }
  if (!r.u64(out.worker) || !r.u16(rank)) return r.error("source", "message ends");
  out.rule = std::string(rule);
  out.rank = static_cast<int16_t>(rank);
  if (out.rank < 0) return r.error("rank", "negative");
  return "";
}

constexpr size_t kLinkBytes = 8 + 8 + 1;
constexpr size_t kHoldingBytes = 8 + 8 + 1;

}  // namespace

void encode_inventory_request(const Header& h, const InventoryRequest& r, std::string& out) {
  Header hh = h;
  hh.kind = Kind::kInventoryRequest;
  put_header(hh, out);
  Writer w(out);
  put_source(w, r);
}

std::vector<std::string> encode_inventory_reply(const Header& h, const InventoryRequest& source,
                                                bool warm, uint64_t seq,
                                                const kv::SourceExport& data) {
  Header hh = h;
  hh.kind = Kind::kInventoryReply;
  // Parts: links first, then holdings, each part within kMaxInventoryPartBytes.
  const size_t per_part = (kMaxInventoryPartBytes - 256) / kLinkBytes;
  const size_t items = warm ? data.links.size() + data.holdings.size() : 0;
  const size_t parts = std::max<size_t>(1, (items + per_part - 1) / per_part);
  std::vector<std::string> out(parts);
  size_t next = 0;
  for (size_t p = 0; p < parts; ++p) {
    put_header(hh, out[p]);
    Writer w(out[p]);
    put_source(w, source);
    w.u8(warm ? 0 : 1);
    w.u64(seq);
    w.u32(static_cast<uint32_t>(p));
    w.u32(static_cast<uint32_t>(parts));
    const size_t end = std::min(items, next + per_part);
    const size_t nl = data.links.size();
    const size_t links_from = std::min(next, nl), links_to = std::min(end, nl);
    w.u32(static_cast<uint32_t>(links_to - links_from));
    for (size_t i = links_from; i < links_to; ++i) {
      w.u64(data.links[i].key);
      w.u64(data.links[i].parent);
      w.u8(data.links[i].root ? 1 : 0);
    }
    const size_t hold_from = std::max(next, nl) - nl, hold_to = std::max(end, nl) - nl;
    w.u32(static_cast<uint32_t>(hold_to - hold_from));
    for (size_t i = hold_from; i < hold_to; ++i) {
      w.u64(data.holdings[i].id);
      w.u64(data.holdings[i].key);
      w.u8(data.holdings[i].media);
    }
    next = end;
  }
  return out;
}

std::string decode_inventory_request(std::string_view msg, InventoryRequest& out) {
  out = {};
  Header h;
  if (std::string e = decode_header(msg, h); !e.empty()) return e;
  if (h.kind != Kind::kInventoryRequest) return "kind: not an inventory request";
  Reader r(msg, kHeaderBytes);
  std::string e = get_source(r, out);
  if (e.empty() && r.left() != 0) e = r.error("request", "bytes left after it");
  if (!e.empty()) out = {};  // all or nothing
  return e;
}

std::string decode_inventory_part(std::string_view msg, InventoryPart& out) {
  out = {};
  Header h;
  if (std::string e = decode_header(msg, h); !e.empty()) return e;
  if (h.kind != Kind::kInventoryReply) return "kind: not an inventory reply";
  Reader r(msg, kHeaderBytes);
  auto fail = [&](std::string e) {
    out = {};
    return e;
  };
  if (std::string e = get_source(r, out.source); !e.empty()) return fail(e);
  uint8_t status = 0;
  uint32_t nl = 0, nh = 0;
  if (!r.u8(status) || !r.u64(out.seq) || !r.u32(out.part) || !r.u32(out.parts)) {
    return fail(r.error("reply", "message ends"));
  }
  if (status > 1) return fail(r.error("status", "unknown"));
  out.warm = status == 0;
  if (out.parts == 0 || out.parts > kMaxInventoryParts || out.part >= out.parts) {
    return fail(r.error("parts", "part not within 1..4096 parts"));
  }
  if (!r.u32(nl) || static_cast<size_t>(nl) * kLinkBytes > r.left()) {
    return fail(r.error("links", "count exceeds the message"));
  }
  out.data.links.resize(nl);
  for (auto& l : out.data.links) {
    uint8_t root = 0;
    r.u64(l.key);
    r.u64(l.parent);
    r.u8(root);
    if (root > 1) return fail(r.error("links", "root flag not 0 or 1"));
    l.root = root == 1;
  }
  if (!r.u32(nh) || static_cast<size_t>(nh) * kHoldingBytes != r.left()) {
    return fail(r.error("holdings", "count does not match the message's length"));
  }
  out.data.holdings.resize(nh);
  for (auto& x : out.data.holdings) {
    r.u64(x.id);
    r.u64(x.key);
    r.u8(x.media);
  }
  if (!out.warm && (nl != 0 || nh != 0)) return fail("reply: a not-warm answer carries data");
  return "";
}

}  // namespace kvgate::replica
