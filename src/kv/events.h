// kv/events: the KV cache events engines publish (REFERENCE.md section 3) as typed C++ values, and
// their msgpack wire forms: encode in SGLang's shape (positional arrays) or vLLM's (maps with a
// "type" tag), and one decoder that accepts both, skips unknown trailing fields, map keys and event
// types, and never reads past its input: every failure is an error code, never a crash or a throw.
//
// SGLang's BlockStored: ["BlockStored", hashes, parent, token_ids, block_size, lora_id, medium]
// plus, for a salted or LoRA request's blocks only, an 8th element {"cache_salt": salt,
// "lora_name": adapter} (each key only when set).
//
// A publisher message is three ZMQ frames [topic, sequence as 8 bytes big-endian, payload]; a
// replay reply is [sequence, payload] after the ROUTER envelope, ending with sequence -1 and an
// empty payload.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace kvgate::kv {

// Where a block lives. kNone: the field was nil or absent; kOther: a name this code does not know.
enum class Medium : uint8_t { kNone, kGpu, kCpuPinned, kDisk, kExternal, kOther };
std::string_view to_string(Medium m);  // "GPU", "CPU_PINNED", ...; "" for kNone
Medium medium_from_string(std::string_view s);

// Block ids are carried as uint64_t bit patterns: SGLang's signed int64 ids and vLLM's unsigned
// ones alike (a negative msgpack int keeps its two's-complement bits). A hash sent as bytes
// becomes its last 8 bytes read big-endian, which is vLLM's own int conversion.
struct BlockStored {
  std::vector<uint64_t> block_hashes;
  std::optional<uint64_t> parent_block_hash;  // nil: the first block under the root
  std::vector<int32_t> token_ids;             // block_size tokens per hash
  int64_t block_size = 0;
  std::optional<int64_t> lora_id;
  Medium medium = Medium::kNone;
  // The namespace of the chain, from the event's metadata element: SGLang (BlockStoredWithMetadata,
  // disaggregation/kv_events.py) sends an 8th element, the map {"cache_salt": salt}, only for the
  // blocks of a salted request; those blocks match only requests with the same salt. Map-shaped
  // events may carry "cache_salt" as a key of their own (or of a "metadata" map).
  std::optional<std::string> cache_salt;
  // The LoRA adapter whose namespace the chain is in: SGLang's recorder names it (lora_name of
  // the metadata map; its published ids are then mixed with the adapter's seed), vLLM's events
  // carry "lora_name" as a key. Those blocks match only requests for the same adapter.
  std::optional<std::string> lora_name;
};

struct BlockRemoved {
  std::vector<uint64_t> block_hashes;
  Medium medium = Medium::kNone;
};

struct AllBlocksCleared {};

using Event = std::variant<BlockStored, BlockRemoved, AllBlocksCleared>;

struct EventBatch {
  double ts = 0;  // unix seconds
  std::vector<Event> events;
  std::optional<int64_t> dp_rank;  // SGLang attn_dp_rank / vLLM data_parallel_rank
  uint32_t skipped_events = 0;     // decode only: events of a type this code does not know
  bool map_shaped = false;         // decode only: the batch was a map (vLLM's JSON-like shape)
};

enum class WireFormat : uint8_t {
  kSglang,  // batch [ts, events, attn_dp_rank]; events ["BlockStored", hashes, parent, ...]
  kVllm,    // batch {"ts","events","data_parallel_rank"}; events {"type":"BlockStored", ...}
};
std::string_view to_string(WireFormat f);

// Appends the msgpack payload of `batch` to `out`.
void encode_batch(const EventBatch& batch, WireFormat format, std::string& out);

enum class DecodeError : uint8_t {
  kNone = 0,
  kFrameCount,     // a message is not [topic, sequence, payload]
  kSequenceSize,   // the sequence frame is not 8 bytes
  kTruncated,      // the payload ends inside a value
  kInvalid,        // bytes that are not msgpack (reserved byte 0xc1, a count beyond the input)
  kBadBatch,       // the payload is not a batch: wrong type, or ts/events missing or mistyped
  kBadEvent,       // a known event with a missing or mistyped field
  kTrailingBytes,  // bytes after the batch
};
std::string_view to_string(DecodeError e);

struct DecodeStatus {
  DecodeError error = DecodeError::kNone;
  std::string_view field;  // static text naming where it failed, e.g. "BlockStored.token_ids"
  size_t offset = 0;       // byte offset in the payload where decoding stopped
  bool ok() const { return error == DecodeError::kNone; }
  std::string message() const;  // "bad event at byte 17 (BlockStored.token_ids)"
};

// Decodes one payload into `out` (cleared first). On error `out` holds what was decoded so far.
DecodeStatus decode_batch(std::string_view payload, EventBatch& out);

struct Message {
  std::string topic;
  uint64_t seq = 0;
  EventBatch batch;
};

// Decodes a subscriber's multipart message [topic, seq, payload].
DecodeStatus decode_message(std::span<const std::string_view> frames, Message& out);

// The sequence number of a replay reply or PUB message: 8 bytes big-endian.
inline constexpr uint64_t kReplayEnd = ~uint64_t{0};  // -1: the end of a replay stream
std::string encode_sequence(uint64_t seq);
bool decode_sequence(std::string_view frame, uint64_t& seq);

}  // namespace kvgate::kv
