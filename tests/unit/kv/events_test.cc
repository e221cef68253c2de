// Tests for kv/events: encoding in SGLang's and vLLM's shapes, decoding both (and the variants real
// engines send: missing trailing optionals, extra fields, maps with the tag anywhere, unknown event
// types, bytes hashes), and error codes on hostile input. Inputs are built byte by byte with a
// small msgpack writer of the test's own.
#include "kv/events.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

namespace kvgate::kv {
namespace {

// A minimal msgpack writer, independent of the code under test.
class Mp {
 public:
  Mp& raw(std::initializer_list<int> bytes) {
    for (int b : bytes) s.push_back(static_cast<char>(b));
    return *this;
  }
  Mp& be(uint64_t v, int n) {
    for (int i = n - 1; i >= 0; --i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
    return *this;
  }
  Mp& arr(uint32_t n) { return n < 16 ? raw({0x90 | static_cast<int>(n)}) : raw({0xdd}).be(n, 4); }
  Mp& map(uint32_t n) { return n < 16 ? raw({0x80 | static_cast<int>(n)}) : raw({0xdf}).be(n, 4); }
  Mp& nil() { return raw({0xc0}); }
  Mp& u(uint64_t v) {
    if (v < 128) return raw({static_cast<int>(v)});
    return raw({0xcf}).be(v, 8);
  }
  Mp& i(int64_t v) {
    if (v >= 0) return u(static_cast<uint64_t>(v));
    return raw({0xd3}).be(static_cast<uint64_t>(v), 8);
  }
  Mp& f64(double d) {
    uint64_t bits = 0;
    std::memcpy(&bits, &d, 8);
    return raw({0xcb}).be(bits, 8);
  }
  Mp& str(std::string_view v) {
    raw({0xd9, static_cast<int>(v.size())});
    s.append(v);
    return *this;
  }
  Mp& bin(std::string_view v) {
    raw({0xc4, static_cast<int>(v.size())});
    s.append(v);
    return *this;
  }
  std::string s;
};

BlockStored stored(std::vector<uint64_t> hashes, std::optional<uint64_t> parent,
                   std::vector<int32_t> tokens, int64_t size) {
  BlockStored b;
  b.block_hashes = std::move(hashes);
  b.parent_block_hash = parent;
  b.token_ids = std::move(tokens);
  b.block_size = size;
  b.medium = Medium::kGpu;
  return b;
}

EventBatch sample() {
  EventBatch b;
  b.ts = 1767225600.25;
  b.dp_rank = 3;
  b.events.emplace_back(AllBlocksCleared{});
  b.events.emplace_back(stored({0x8000000000000001ull}, std::nullopt, {1, 2}, 2));
  b.events.emplace_back(stored({5, 0xfffffffffffffff0ull}, 0x8000000000000001ull, {3, 4, 5, 6}, 2));
  BlockRemoved r;
  r.block_hashes = {5, 0xfffffffffffffff0ull};
  r.medium = Medium::kGpu;
  b.events.emplace_back(r);
  return b;
}

void expect_same(const EventBatch& a, const EventBatch& b) {
  EXPECT_EQ(a.ts, b.ts);
  EXPECT_EQ(a.dp_rank, b.dp_rank);
  ASSERT_EQ(a.events.size(), b.events.size());
  for (size_t i = 0; i < a.events.size(); ++i) {
    ASSERT_EQ(a.events[i].index(), b.events[i].index()) << i;
    if (const auto* s = std::get_if<BlockStored>(&a.events[i])) {
      const auto& t = std::get<BlockStored>(b.events[i]);
      EXPECT_EQ(s->block_hashes, t.block_hashes);
      EXPECT_EQ(s->parent_block_hash, t.parent_block_hash);
      EXPECT_EQ(s->token_ids, t.token_ids);
      EXPECT_EQ(s->block_size, t.block_size);
      EXPECT_EQ(s->lora_id, t.lora_id);
      EXPECT_EQ(s->medium, t.medium);
      EXPECT_EQ(s->cache_salt, t.cache_salt);
    } else if (const auto* r = std::get_if<BlockRemoved>(&a.events[i])) {
      const auto& t = std::get<BlockRemoved>(b.events[i]);
      EXPECT_EQ(r->block_hashes, t.block_hashes);
      EXPECT_EQ(r->medium, t.medium);
    }
  }
}

TEST(KvEvents, RoundTripsBothFormats) {
  for (auto f : {WireFormat::kSglang, WireFormat::kVllm}) {
    std::string payload;
    encode_batch(sample(), f, payload);
    EventBatch back;
    auto st = decode_batch(payload, back);
    ASSERT_TRUE(st.ok()) << st.message();
    expect_same(sample(), back);
    EXPECT_EQ(back.skipped_events, 0u);
  }
}

TEST(KvEvents, SglangShapeIsPositional) {
  EventBatch b;
  b.ts = 0.5;
  b.dp_rank = 0;
  b.events.emplace_back(stored({0xffffffffffffffffull}, std::nullopt, {7}, 1));
  std::string payload;
  encode_batch(b, WireFormat::kSglang, payload);
  Mp want;
  want.arr(3).f64(0.5).arr(1).arr(7);
  std::string expected = want.s;
  expected +=
      "\xab"
      "BlockStored";       // fixstr 11
  expected += "\x91\xff";  // [-1] as a negative fixint: SGLang's ids are signed
  expected += "\xc0\x91\x07\x01\xc0";
  expected += "\xa3GPU";
  expected += '\x00';  // attn_dp_rank
  EXPECT_EQ(payload, expected);
}

TEST(KvEvents, VllmShapeIsMapsWithUnsignedIds) {
  EventBatch b;
  b.ts = 1;
  b.dp_rank = 1;
  b.events.emplace_back(stored({0xffffffffffffffffull}, std::nullopt, {7}, 1));
  std::string payload;
  encode_batch(b, WireFormat::kVllm, payload);
  EXPECT_EQ(static_cast<uint8_t>(payload[0]), 0x83) << "batch map of 3";
  EXPECT_NE(payload.find("data_parallel_rank"), std::string::npos);
  EXPECT_NE(payload.find("\xa4type\xab"
                         "BlockStored"),
            std::string::npos);
  EXPECT_NE(payload.find("\x91\xcf\xff\xff\xff\xff\xff\xff\xff\xff"), std::string::npos)
      << "the id as uint64";
}

TEST(KvEvents, DecodesShortArraysAndIgnoresExtraFields) {
  Mp m;
  m.arr(2).f64(2.0).arr(3);  // no dp rank
  // BlockStored without lora_id and medium (omit_defaults)
  m.arr(5).str("BlockStored").arr(1).i(-5).nil().arr(2).u(1).u(2).u(2);
  // BlockStored with an 8th element (a metadata map) and a 9th unknown field
  m.arr(9).str("BlockStored").arr(1).u(6).i(-5).arr(2).u(3).u(4).u(2).nil().str("CPU_PINNED");
  m.map(1).str("cache_salt").str("x").arr(2).u(1).u(2);
  // BlockRemoved with no medium
  m.arr(2).str("BlockRemoved").arr(1).u(6);
  EventBatch b;
  auto st = decode_batch(m.s, b);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_FALSE(b.dp_rank);
  ASSERT_EQ(b.events.size(), 3u);
  const auto& a = std::get<BlockStored>(b.events[0]);
  EXPECT_EQ(a.block_hashes, std::vector<uint64_t>{static_cast<uint64_t>(-5)});
  EXPECT_FALSE(a.parent_block_hash);
  EXPECT_EQ(a.medium, Medium::kNone);
  const auto& c = std::get<BlockStored>(b.events[1]);
  EXPECT_EQ(c.parent_block_hash, static_cast<uint64_t>(-5));
  EXPECT_EQ(c.medium, Medium::kCpuPinned);
  EXPECT_EQ(c.cache_salt, std::optional<std::string>("x"));
  EXPECT_FALSE(a.cache_salt);
  EXPECT_EQ(std::get<BlockRemoved>(b.events[2]).medium, Medium::kNone);
}

TEST(KvEvents, SglangMetadataElementCarriesTheSalt) {
  // SGLang's BlockStoredWithMetadata: the 7 fields, then {"cache_salt": salt}; unsalted events
  // keep 7 elements.
  EventBatch b;
  b.ts = 0.5;
  b.dp_rank = 0;
  BlockStored s = stored({1, 2}, std::nullopt, {7, 8}, 1);
  s.cache_salt = "tenant-a";
  b.events.emplace_back(s);
  std::string payload;
  encode_batch(b, WireFormat::kSglang, payload);
  Mp want;
  want.arr(3).f64(0.5).arr(1).arr(8);
  std::string expected = want.s;
  expected +=
      "\xab"
      "BlockStored";
  expected += "\x92\x01\x02\xc0\x92\x07\x08\x01\xc0\xa3GPU";
  expected +=
      "\x81\xaa"
      "cache_salt\xa8tenant-a";
  expected += '\x00';
  EXPECT_EQ(payload, expected);
  EventBatch back;
  ASSERT_TRUE(decode_batch(payload, back).ok());
  EXPECT_EQ(std::get<BlockStored>(back.events[0]).cache_salt,
            std::optional<std::string>("tenant-a"));
}

// SGLang's recorder names the adapter of a LoRA namespace (lora_name) beside the salt; vLLM's map
// shape carries "lora_name" as a key. Both round-trip in both shapes.
TEST(KvEvents, TheAdaptersNameTravelsInBothShapes) {
  for (WireFormat f : {WireFormat::kSglang, WireFormat::kVllm}) {
    EventBatch b;
    BlockStored s = stored({1, 2}, std::nullopt, {7, 8}, 1);
    s.lora_name = "adapter-x";
    if (f == WireFormat::kSglang) s.cache_salt = "tenant-a";
    b.events.emplace_back(s);
    b.events.emplace_back(stored({3}, std::nullopt, {9}, 1));
    std::string payload;
    encode_batch(b, f, payload);
    EventBatch back;
    ASSERT_TRUE(decode_batch(payload, back).ok());
    const auto& a = std::get<BlockStored>(back.events[0]);
    EXPECT_EQ(a.lora_name, std::optional<std::string>("adapter-x"));
    if (f == WireFormat::kSglang) {
      EXPECT_EQ(a.cache_salt, std::optional<std::string>("tenant-a"));
    }
    EXPECT_FALSE(std::get<BlockStored>(back.events[1]).lora_name);
  }
}

TEST(KvEvents, MetadataUnknownKeysNilsAndOtherShapesAreTolerated) {
  Mp m;
  m.arr(3).f64(1.0).arr(5);
  // Unknown keys around the salt (another build's session_id), one not even a string key.
  m.arr(8).str("BlockStored").arr(1).u(1).nil().arr(1).u(5).u(1).nil().str("GPU");
  m.map(3).str("session_id").str("s-1").u(7).arr(0).str("cache_salt").str("t");
  // A nil salt: no namespace.
  m.arr(8).str("BlockStored").arr(1).u(2).nil().arr(1).u(5).u(1).nil().str("GPU");
  m.map(1).str("cache_salt").nil();
  // An 8th element that is no map (another engine's positional field): skipped.
  m.arr(8).str("BlockStored").arr(1).u(3).nil().arr(1).u(5).u(1).nil().str("GPU").str("lora-x");
  // Map-shaped events: a cache_salt key, or a metadata map.
  m.map(5).str("type").str("BlockStored").str("block_hashes").arr(1).u(4).str("token_ids");
  m.arr(1).u(5).str("block_size").u(1).str("cache_salt").str("m");
  m.map(5).str("type").str("BlockStored").str("block_hashes").arr(1).u(5).str("token_ids");
  m.arr(1).u(5).str("block_size").u(1).str("metadata").map(1).str("cache_salt").str("n");
  m.nil();  // attn_dp_rank
  EventBatch b;
  auto st = decode_batch(m.s, b);
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_EQ(b.events.size(), 5u);
  auto salt = [&](size_t i) { return std::get<BlockStored>(b.events[i]).cache_salt; };
  EXPECT_EQ(salt(0), std::optional<std::string>("t"));
  EXPECT_FALSE(salt(1));
  EXPECT_FALSE(salt(2));
  EXPECT_EQ(salt(3), std::optional<std::string>("m"));
  EXPECT_EQ(salt(4), std::optional<std::string>("n"));

  Mp bad;
  bad.arr(2).f64(1.0).arr(1);
  bad.arr(8).str("BlockStored").arr(1).u(1).nil().arr(1).u(5).u(1).nil().str("GPU");
  bad.map(1).str("cache_salt").u(3);
  EXPECT_EQ(decode_batch(bad.s, b).error, DecodeError::kBadEvent) << "a salt must be a string";
}

TEST(KvEvents, DecodesMapsWithTheTagAnywhereAndUnknownEvents) {
  Mp m;
  m.map(4).str("events").arr(4);
  m.map(5).str("block_hashes").arr(1).u(0xfedcba9876543210ull).str("extra_keys").arr(1).nil();
  m.str("type").str("BlockStored").str("token_ids").arr(1).u(9).str("block_size").u(1);
  m.map(2).str("type").str("BlockRemoved").str("block_hashes").arr(1).bin(std::string(32, '\x01'));
  m.map(2).str("type").str("SomethingNew").str("payload").arr(2).u(1).arr(1).u(2);
  m.arr(2).str("AlsoNew").u(1);
  m.str("ts").u(7).str("attn_dp_rank").u(2).str("future").map(1).u(1).u(2);
  EventBatch b;
  auto st = decode_batch(m.s, b);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(b.ts, 7);
  EXPECT_EQ(b.dp_rank, 2);
  ASSERT_EQ(b.events.size(), 2u);
  EXPECT_EQ(b.skipped_events, 2u);
  const auto& s = std::get<BlockStored>(b.events[0]);
  EXPECT_EQ(s.block_hashes[0], 0xfedcba9876543210ull);
  EXPECT_FALSE(s.parent_block_hash) << "absent parent = nil";
  EXPECT_EQ(std::get<BlockRemoved>(b.events[1]).block_hashes[0], 0x0101010101010101ull)
      << "a bytes hash becomes its last 8 bytes";
}

TEST(KvEvents, ErrorsNameWhatFailed) {
  EventBatch b;
  EXPECT_EQ(decode_batch("", b).error, DecodeError::kTruncated);
  EXPECT_EQ(decode_batch("\x01", b).error, DecodeError::kBadBatch);
  {
    Mp m;
    m.arr(2).str("now").arr(0);
    EXPECT_EQ(decode_batch(m.s, b).error, DecodeError::kBadBatch);
  }
  {
    Mp m;
    m.arr(2).f64(1).arr(1).arr(5).str("BlockStored").arr(0).nil().str("nope").u(1);
    auto st = decode_batch(m.s, b);
    EXPECT_EQ(st.error, DecodeError::kBadEvent);
    EXPECT_EQ(st.field, "BlockStored.token_ids");
    EXPECT_NE(st.message().find("BlockStored.token_ids"), std::string::npos);
  }
  {
    Mp m;
    m.arr(2).f64(1).arr(0).u(1);
    EXPECT_EQ(decode_batch(m.s, b).error, DecodeError::kTrailingBytes);
  }
  {
    Mp m;
    m.arr(2).f64(1).arr(1).map(1).str("block_hashes").arr(0);
    EXPECT_EQ(decode_batch(m.s, b).error, DecodeError::kBadEvent) << "a map event without type";
  }
  {
    Mp m;
    m.arr(2).f64(1).arr(1).arr(2).str("BlockRemoved").arr(1).raw({0xd3, 0x00});  // int64, 1 byte
    EXPECT_EQ(decode_batch(m.s, b).error, DecodeError::kTruncated);
  }
}

TEST(KvEvents, HugeCountsAndDeepNestingAreRejectedSafely) {
  EventBatch b;
  {
    Mp m;  // an events list claiming 2^32-1 entries
    m.arr(2).f64(1).raw({0xdd}).be(0xffffffffu, 4).nil();
    EXPECT_EQ(decode_batch(m.s, b).error, DecodeError::kInvalid);
  }
  {
    Mp m;  // an ignored trailing field holding a map claiming 2^31 pairs (overflows naive counters)
    m.arr(3).f64(1).arr(0).nil();
    m.s[0] = static_cast<char>(0x94);
    m.raw({0xdf}).be(0x80000000u, 4).u(1).u(2);
    EXPECT_EQ(decode_batch(m.s, b).error, DecodeError::kInvalid);
  }
  {
    Mp m;  // a string longer than the input
    m.arr(2).f64(1).arr(1).arr(1).raw({0xdb}).be(0x7fffffff, 4);
    EXPECT_EQ(decode_batch(m.s, b).error, DecodeError::kTruncated);
  }
  {
    Mp m;  // 200k nested arrays inside an unknown field: skipped without recursion
    m.arr(4).f64(1).arr(0).nil();
    for (int i = 0; i < 200000; ++i) m.raw({0x91});
    m.nil();
    EXPECT_TRUE(decode_batch(m.s, b).ok());
  }
}

TEST(KvEvents, EveryTruncationOfAValidPayloadFailsCleanly) {
  for (auto f : {WireFormat::kSglang, WireFormat::kVllm}) {
    std::string payload;
    encode_batch(sample(), f, payload);
    for (size_t n = 0; n < payload.size(); ++n) {
      EventBatch b;
      EXPECT_FALSE(decode_batch(std::string_view(payload).substr(0, n), b).ok()) << n;
    }
  }
}

TEST(KvEvents, Messages) {
  std::string payload;
  encode_batch(sample(), WireFormat::kSglang, payload);
  std::string seq = encode_sequence(258);
  EXPECT_EQ(seq, std::string("\0\0\0\0\0\0\x01\x02", 8));
  std::string_view frames[] = {"kv", seq, payload};
  Message m;
  auto st = decode_message(frames, m);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(m.topic, "kv");
  EXPECT_EQ(m.seq, 258u);
  EXPECT_EQ(m.batch.events.size(), 4u);
  EXPECT_EQ(decode_message(std::span(frames, 2), m).error, DecodeError::kFrameCount);
  std::string_view short_seq[] = {"kv", "\x01", payload};
  EXPECT_EQ(decode_message(short_seq, m).error, DecodeError::kSequenceSize);
  uint64_t s = 0;
  EXPECT_TRUE(decode_sequence(encode_sequence(kReplayEnd), s));
  EXPECT_EQ(s, kReplayEnd);
}

}  // namespace
}  // namespace kvgate::kv
