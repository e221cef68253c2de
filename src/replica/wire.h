// replica/wire: what kvgate replicas say to each other over NATS (replica/sync.h), as compact
// little-endian binary messages. No text of any request travels: a prompt is the chain of hashes
// of its chunks (prefix/chunk_index.h), a worker the hash of its URL.
//
// Every message starts with a 24-byte header:
//   magic "KVGR" | version (1) | kind (1) | reserved (2, zero) | replica id (8) | sent, unix us (8)
// then the body of its kind:
//   kChains (cache_aware's records, kv_exact's predictions): a table of rule names (u16 count, each
//     u8 length + bytes, 1..96 bytes), then u16 records, each: u8 rule index, u8 flags (bit 0:
//     retraction; bit 1: a kv_exact prediction), u16 chunk size in bytes (0 for pages), i16 DP
//     rank (-1: none), u64 worker, i64 origin (unix us), u16 hashes, u64 hashes[...].
//   kLoad (one replica's load, absolute values): u64 sequence, u32 entries, each: u64 worker, i16
//     DP rank (-1: the worker as a whole), u32 requests in flight, u64 prefill tokens queued.
//   kInventoryRequest (a replica bootstrapping a kv_exact source asks its peers for it): u8 rule
//     length + rule, u64 worker, i16 DP rank.
//   kInventoryReply (one part of a peer's answer; parts are sent in order): u8 rule length +
//     rule, u64 worker, i16 rank, u8 status (0: warm, the inventory follows; 1: not warm, nothing
//     follows), u64 applied sequence, u32 part, u32 parts, u32 links, each u64 key, u64 parent, u8
//     root; u32 holdings, each u64 engine id, u64 key, u8 media.
//
// The decoder checks every count against the bytes that remain and never reads past them: a
// malformed message is an error naming the field and offset, never a crash (tests/fuzz/
// replica_wire_fuzz.cc). Unknown kinds and versions are errors the receiver counts and drops.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kv/inventory.h"

namespace kvgate::replica {

inline constexpr uint8_t kVersion = 1;
inline constexpr size_t kHeaderBytes = 24;
inline constexpr size_t kMaxRecords = 4096;       // per message
inline constexpr size_t kMaxRuleBytes = 64;       // a rule name (rules::valid_name)
inline constexpr size_t kMaxLoadEntries = 65536;  // per message

enum class Kind : uint8_t {
  kChains = 1,
  kLoad = 2,
  kInventoryRequest = 3,
  kInventoryReply = 4,
};

struct Header {
  Kind kind = Kind::kChains;
  uint64_t replica = 0;  // the sender's id (random per process start)
  int64_t sent_us = 0;   // the sender's clock when it sent the message (unix microseconds)
};

// One dispatch's record: `worker` (rank) was sent a prompt whose chunk chain is `hashes`.
struct ChainRecord {
  std::string rule;
  uint64_t worker = 0;
  int32_t rank = -1;
  int64_t origin_us = 0;  // when the deciding replica dispatched it (its clock, unix us)
  bool retract = false;   // the worker never ran it: take this record back
  bool predict = false;   // kv_exact's predicted pages (else cache_aware's chunks)
  uint32_t chunk_bytes = 0;
  std::vector<uint64_t> hashes;
  bool operator==(const ChainRecord&) const = default;
};

struct LoadEntry {
  uint64_t worker = 0;
  int32_t rank = -1;
  int64_t inflight = 0;
  int64_t prefill_tokens = 0;
  bool operator==(const LoadEntry&) const = default;
};

struct LoadReport {
  uint64_t seq = 0;
  std::vector<LoadEntry> entries;
  bool operator==(const LoadReport&) const = default;
};

// kv_exact's bootstrap from a peer: which source is asked for, and one part of the answer.
struct InventoryRequest {
  std::string rule;
  uint64_t worker = 0;
  int32_t rank = 0;
  bool operator==(const InventoryRequest&) const = default;
};
struct InventoryPart {
  InventoryRequest source;
  bool warm = false;  // false: the peer's view of this source is not complete (cold, pending)
  uint64_t seq = 0;   // the last batch the peer had applied when it exported
  uint32_t part = 0;  // 0-based
  uint32_t parts = 1;
  kv::SourceExport data;
  bool operator==(const InventoryPart&) const = default;
};
inline constexpr size_t kMaxInventoryPartBytes = size_t{512} * 1024;
inline constexpr uint32_t kMaxInventoryParts = 4096;  // 2 GB of answer at most

// The worker key every replica computes alike: XXH3 of the worker's URL.
uint64_t worker_key(std::string_view url);

// Encoders append one whole message to `out`.
void encode_chains(const Header& h, std::span<const ChainRecord> records, std::string& out);
void encode_load(const Header& h, const LoadReport& load, std::string& out);
void encode_inventory_request(const Header& h, const InventoryRequest& r, std::string& out);
// The answer to `source` from `data` (warm) at `seq`, in parts of at most kMaxInventoryPartBytes,
// each a whole message.
std::vector<std::string> encode_inventory_reply(const Header& h, const InventoryRequest& source,
                                                bool warm, uint64_t seq,
                                                const kv::SourceExport& data);
// Bytes one record adds to a chains message (its rule named once per message on top).
size_t chain_record_bytes(const ChainRecord& r);

// Decoding: the header first, then the body of its kind. Each returns "" or what is wrong.
std::string decode_header(std::string_view msg, Header& h);
std::string decode_chains(std::string_view msg, std::vector<ChainRecord>& out);
std::string decode_load(std::string_view msg, LoadReport& out);
std::string decode_inventory_request(std::string_view msg, InventoryRequest& out);
std::string decode_inventory_part(std::string_view msg, InventoryPart& out);

// Little-endian helpers the inventory messages (replica/bootstrap) share.
class Writer {
 public:
  explicit Writer(std::string& out) : out_(out) {}
  void u8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void u16(uint16_t v) { put(v, 2); }
  void u32(uint32_t v) { put(v, 4); }
  void u64(uint64_t v) { put(v, 8); }
  void bytes(std::string_view s) { out_.append(s); }

 private:
  void put(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  std::string& out_;
};

class Reader {
 public:
  explicit Reader(std::string_view in, size_t pos = 0) : in_(in), pos_(pos) {}
  bool u8(uint8_t& v);
  bool u16(uint16_t& v);
  bool u32(uint32_t& v);
  bool u64(uint64_t& v);
  bool bytes(size_t n, std::string_view& v);
  size_t pos() const { return pos_; }
  size_t left() const { return in_.size() - pos_; }
  // "field at offset N: what" for an error message.
  std::string error(std::string_view field, std::string_view what) const;

 private:
  bool get(uint64_t& v, size_t n);
  std::string_view in_;
  size_t pos_;
};

}  // namespace kvgate::replica
