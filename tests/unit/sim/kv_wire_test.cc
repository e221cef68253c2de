// The KV events of a running kvgate-sim, on the wire: an in-process sim publishes over real TCP
// ZeroMQ sockets and this test reads them with raw libzmq (SUB, DEALER) and decodes the msgpack
// with a reader of its own (not kv::decode_batch). Checks SGLang's framing and positional shapes,
// block ids against Python's hashlib, one batch per scheduler step, BlockRemoved after eviction
// equal to what was stored, AllBlocksCleared on /flush_cache, replay from a sequence, one
// publisher per DP rank at port base + rank, and the vLLM shape (maps, sha256_cbor, unsigned ids).
#include <gtest/gtest.h>
#include <zmq.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>
#include <stdexcept>

#include "sim_harness.h"
#include "support/http_client.h"
#include "support/process.h"
#include "support/wire.h"

namespace kvgate::sim {
namespace {

using testing::be64;
using testing::Frames;
using testing::recv_multipart;
using Zmq = testing::ZmqSockets;

// ------------------------------------------------------------ a minimal msgpack reader

struct V {
  enum T { kNil, kBool, kInt, kUint, kFloat, kStr, kBin, kArr, kMap } t = kNil;
  int64_t i = 0;
  uint64_t u = 0;
  double d = 0;
  std::string s;
  std::vector<V> a;
  std::vector<V> keys, vals;  // a map, in order

  bool is_int() const { return t == kInt || t == kUint; }
  int64_t as_int() const { return t == kUint ? static_cast<int64_t>(u) : i; }
  const V& at(const std::string& key) const {
    for (size_t k = 0; k < keys.size(); ++k) {
      if (keys[k].t == kStr && keys[k].s == key) return vals[k];
    }
    throw std::runtime_error("no key " + key);
  }
  bool has(const std::string& key) const {
    for (const auto& k : keys) {
      if (k.t == kStr && k.s == key) return true;
    }
    return false;
  }
};

class Reader {
 public:
  explicit Reader(const std::string& s)
      : p_(reinterpret_cast<const uint8_t*>(s.data())), e_(p_ + s.size()) {}
  V read() {
    uint8_t c = byte();
    V v;
    if (c <= 0x7f) return uint_value(c);
    if (c >= 0xe0) return int_value(static_cast<int8_t>(c));
    if ((c & 0xf0) == 0x80) return map(c & 0x0f);
    if ((c & 0xf0) == 0x90) return arr(c & 0x0f);
    if ((c & 0xe0) == 0xa0) return str(c & 0x1f, V::kStr);
    switch (c) {
      case 0xc0:
        return v;
      case 0xc2:
      case 0xc3:
        v.t = V::kBool;
        v.i = c == 0xc3;
        return v;
      case 0xc4:
        return str(be(1), V::kBin);
      case 0xc5:
        return str(be(2), V::kBin);
      case 0xc6:
        return str(be(4), V::kBin);
      case 0xcb: {
        uint64_t bits = be(8);
        v.t = V::kFloat;
        std::memcpy(&v.d, &bits, 8);
        return v;
      }
      case 0xcc:
        return uint_value(be(1));
      case 0xcd:
        return uint_value(be(2));
      case 0xce:
        return uint_value(be(4));
      case 0xcf:
        return uint_value(be(8));
      case 0xd0:
        return int_value(static_cast<int8_t>(be(1)));
      case 0xd1:
        return int_value(static_cast<int16_t>(be(2)));
      case 0xd2:
        return int_value(static_cast<int32_t>(be(4)));
      case 0xd3:
        return int_value(static_cast<int64_t>(be(8)));
      case 0xd9:
        return str(be(1), V::kStr);
      case 0xda:
        return str(be(2), V::kStr);
      case 0xdb:
        return str(be(4), V::kStr);
      case 0xdc:
        return arr(be(2));
      case 0xdd:
        return arr(be(4));
      case 0xde:
        return map(be(2));
      case 0xdf:
        return map(be(4));
    }
    throw std::runtime_error("unexpected msgpack byte " + std::to_string(c));
  }
  bool done() const { return p_ == e_; }

 private:
  uint8_t byte() {
    if (p_ >= e_) throw std::runtime_error("truncated msgpack");
    return *p_++;
  }
  uint64_t be(int n) {
    uint64_t v = 0;
    for (int k = 0; k < n; ++k) v = (v << 8) | byte();
    return v;
  }
  static V uint_value(uint64_t x) {
    V v;
    v.t = V::kUint;
    v.u = x;
    return v;
  }
  static V int_value(int64_t x) {
    V v;
    v.t = V::kInt;
    v.i = x;
    return v;
  }
  V str(uint64_t n, V::T t) {
    if (static_cast<uint64_t>(e_ - p_) < n) throw std::runtime_error("truncated string");
    V v;
    v.t = t;
    v.s.assign(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    return v;
  }
  V arr(uint64_t n) {
    V v;
    v.t = V::kArr;
    for (uint64_t k = 0; k < n; ++k) v.a.push_back(read());
    return v;
  }
  V map(uint64_t n) {
    V v;
    v.t = V::kMap;
    for (uint64_t k = 0; k < n; ++k) {
      v.keys.push_back(read());
      v.vals.push_back(read());
    }
    return v;
  }
  const uint8_t* p_;
  const uint8_t* e_;
};

V parse(const std::string& payload) {
  Reader r(payload);
  V v = r.read();
  EXPECT_TRUE(r.done()) << "bytes after the batch";
  return v;
}

// ------------------------------------------------------------ raw libzmq

std::string be64_bytes(uint64_t v) {
  std::string s(8, '\0');
  for (int k = 7; k >= 0; --k, v >>= 8) s[static_cast<size_t>(k)] = static_cast<char>(v & 0xff);
  return s;
}

// Every buffered batch of a replay socket from `from` on: (seq, payload).
std::vector<std::pair<uint64_t, std::string>> replay(Zmq& z, int port, uint64_t from) {
  void* dealer = z.connect(ZMQ_DEALER, port);
  std::string empty, seq = be64_bytes(from);
  zmq_send(dealer, empty.data(), 0, ZMQ_SNDMORE);
  zmq_send(dealer, seq.data(), seq.size(), 0);
  std::vector<std::pair<uint64_t, std::string>> out;
  for (;;) {
    Frames f = recv_multipart(dealer, 3000);
    if (f.size() != 3) {
      ADD_FAILURE() << "replay reply of " << f.size() << " frames";
      return out;
    }
    EXPECT_EQ(f[0], "");
    uint64_t s = be64(f[1]);
    if (s == ~uint64_t{0}) {
      EXPECT_EQ(f[2], "") << "the end marker (-1) carries an empty payload";
      return out;
    }
    out.emplace_back(s, f[2]);
  }
}

// ------------------------------------------------------------ references in Python

using testing::py_list;

// SGLang's ids of every full page (hashlib, chained raw digests, first 8 bytes signed); a salted
// chain starts from SHA-256("sglang-cache-salt-v1\0" + salt).
std::vector<int64_t> sglang_ids(const std::vector<int32_t>& tokens, int page,
                                const std::string& salt = "") {
  auto words = testing::python_words(R"(
import hashlib
t = )" + py_list(tokens) +
                                     R"(
salt = ")" + salt + R"("
p, prev, out = )" + std::to_string(page) +
                                     R"(, b"", []
if salt:
    prev = hashlib.sha256(b"sglang-cache-salt-v1\0" + salt.encode()).digest()
for i in range(0, len(t) // p * p, p):
    prev = hashlib.sha256(prev + b"".join(x.to_bytes(4, "little") for x in t[i:i + p])).digest()
    out.append(int.from_bytes(prev[:8], "big", signed=True))
print(*out)
)");
  std::vector<int64_t> ids;
  for (const auto& w : words) ids.push_back(std::stoll(w));
  return ids;
}

// vLLM's sha256_cbor ids (canonical CBOR written out by hand, last 8 bytes unsigned).
std::vector<uint64_t> vllm_ids(const std::vector<int32_t>& tokens, int page,
                               const std::string& seed) {
  auto words = testing::python_words(R"(
import hashlib
def head(m, n):
    if n < 24: return bytes([m << 5 | n])
    for a, k in ((24, 1), (25, 2), (26, 4), (27, 8)):
        if n < 1 << (8 * k): return bytes([m << 5 | a]) + n.to_bytes(k, "big")
def cbor(x):
    if x is None: return b"\xf6"
    if isinstance(x, bytes): return head(2, len(x)) + x
    if isinstance(x, str): return head(3, len(x.encode())) + x.encode()
    if isinstance(x, int): return head(0, x)
    return head(4, len(x)) + b"".join(cbor(e) for e in x)
t = )" + py_list(tokens) +
                                     R"(
p, out = )" + std::to_string(page) +
                                     R"(, []
parent = hashlib.sha256(cbor(")" + seed +
                                     R"(")).digest()
for i in range(0, len(t) // p * p, p):
    parent = hashlib.sha256(cbor((parent, tuple(t[i:i + p]), None))).digest()
    out.append(int.from_bytes(parent[-8:], "big"))
print(*out)
)");
  std::vector<uint64_t> ids;
  for (const auto& w : words) ids.push_back(std::stoull(w));
  return ids;
}

std::vector<int32_t> ids_from(int from, int n) {
  std::vector<int32_t> v;
  for (int k = 0; k < n; ++k) v.push_back(from + k);
  return v;
}

std::string generate_body(const std::vector<int32_t>& prompt, int rank) {
  return R"({"input_ids":)" + py_list(prompt) + R"(,"sampling_params":{"max_new_tokens":1},)" +
         R"("routed_dp_rank":)" + std::to_string(rank) + "}";
}

// One decoded SGLang batch: its events as (type, fields).
struct Batch {
  double ts = 0;
  int64_t rank = -1;
  std::vector<V> events;
};

Batch sglang_batch(const std::string& payload) {
  V v = parse(payload);
  Batch b;
  EXPECT_EQ(v.t, V::kArr) << "SGLang batches are positional arrays";
  EXPECT_EQ(v.a.size(), 3u) << "[ts, events, attn_dp_rank]";
  EXPECT_EQ(v.a[0].t, V::kFloat);
  b.ts = v.a[0].d;
  EXPECT_EQ(v.a[1].t, V::kArr);
  b.events = v.a[1].a;
  EXPECT_TRUE(v.a[2].is_int());
  b.rank = v.a[2].as_int();
  return b;
}

std::string tag(const V& e) {
  if (e.t == V::kArr && !e.a.empty() && e.a[0].t == V::kStr) return e.a[0].s;
  if (e.t == V::kMap && e.has("type")) return e.at("type").s;
  return "?";
}

TEST(SimKvWire, SglangFramesHashesEvictionFlushReplayAndRanks) {
  const int pub = free_port_range(4), rep = pub + 2;
  // Older SGLang builds: one event per page (the newest merge them, see the next test).
  Sim s({"--dp-size", "2", "--page-size", "4", "--max-total-tokens", "64", "--time-scale", "0.01",
         "--kv-events-per-page", "--kv-events-config",
         R"({"publisher":"zmq","endpoint":"tcp://*:)" + std::to_string(pub) +
             R"(","replay_endpoint":"tcp://*:)" + std::to_string(rep) +
             R"(","topic":"kv","buffer_steps":100})"});
  testing::HttpClient c(s.port);
  Zmq z;
  void* sub0 = z.connect(ZMQ_SUB, pub);
  void* sub1 = z.connect(ZMQ_SUB, pub + 1);
  // PUB drops messages until a subscription arrives: flush (AllBlocksCleared on every rank) until
  // both subscribers hear one.
  bool heard0 = false, heard1 = false;
  for (int i = 0; i < 200 && !(heard0 && heard1); ++i) {
    ASSERT_EQ(c.post("/flush_cache", "").status, 200);
    heard0 = heard0 || !recv_multipart(sub0, 20).empty();
    heard1 = heard1 || !recv_multipart(sub1, 20).empty();
  }
  ASSERT_TRUE(heard0 && heard1);
  while (!recv_multipart(sub0, 50).empty() || !recv_multipart(sub1, 50).empty()) {
  }

  // A and B fill 40 of 64 slots; C (30 tokens) needs 30 more: A, the least recent, is evicted.
  const auto a = ids_from(10, 20), b = ids_from(40, 20), cc = ids_from(70, 30),
             d = ids_from(110, 9);
  for (const auto* p : {&a, &b, &cc}) {
    auto r = c.post("/generate", generate_body(*p, 0));
    ASSERT_EQ(r.status, 200) << r.body;
  }
  ASSERT_EQ(c.post("/generate", generate_body(d, 1)).status, 200);
  ASSERT_EQ(c.post("/flush_cache", "").status, 200);

  // Live messages of rank 0 until the final flush.
  std::vector<std::pair<uint64_t, std::string>> live;
  for (;;) {
    Frames f = recv_multipart(sub0, 3000);
    ASSERT_EQ(f.size(), 3u) << "[topic, seq, payload]";
    EXPECT_EQ(f[0], "kv");
    live.emplace_back(be64(f[1]), f[2]);
    Batch last = sglang_batch(f[2]);
    if (last.events.size() == 1 && tag(last.events[0]) == "AllBlocksCleared") break;
  }
  ASSERT_EQ(live.size(), 4u) << "A stored, B stored, C evict+store (one step), flush";
  for (size_t i = 1; i < live.size(); ++i) EXPECT_EQ(live[i].first, live[i - 1].first + 1);

  auto ia = sglang_ids(a, 4), ib = sglang_ids(b, 4), ic = sglang_ids(cc, 4);
  auto stored_ids = [](const Batch& batch, std::vector<int64_t>& parents) {
    std::vector<int64_t> out;
    for (const V& e : batch.events) {
      if (tag(e) != "BlockStored") continue;
      EXPECT_EQ(e.a.size(), 7u) << "[tag, hashes, parent, token_ids, block_size, lora_id, medium]";
      EXPECT_EQ(e.a[1].a.size(), 1u) << "SGLang stores one page per event";
      out.push_back(e.a[1].a[0].as_int());
      parents.push_back(e.a[2].t == V::kNil ? 0 : e.a[2].as_int());
      EXPECT_EQ(e.a[3].a.size(), 4u);
      EXPECT_EQ(e.a[4].as_int(), 4);
      EXPECT_EQ(e.a[5].t, V::kNil);
      EXPECT_EQ(e.a[6].s, "GPU");
    }
    return out;
  };
  std::vector<int64_t> parents;
  Batch ba = sglang_batch(live[0].second);
  EXPECT_EQ(ba.rank, 0);
  EXPECT_EQ(stored_ids(ba, parents), ia) << "ids = chained SHA-256 of the pages (hashlib)";
  EXPECT_EQ(parents[0], 0) << "the first page's parent is nil";
  for (size_t i = 1; i < ia.size(); ++i) EXPECT_EQ(parents[i], ia[i - 1]);
  EXPECT_EQ(ba.events[0].a[3].a[0].as_int(), a[0]) << "token_ids of the first page";
  parents.clear();
  EXPECT_EQ(stored_ids(sglang_batch(live[1].second), parents), ib);
  Batch bc = sglang_batch(live[2].second);
  std::vector<int64_t> removed;
  for (const V& e : bc.events) {
    if (tag(e) == "BlockRemoved") {
      ASSERT_EQ(e.a.size(), 3u) << "[tag, hashes, medium]";
      removed.push_back(e.a[1].a[0].as_int());
      EXPECT_EQ(e.a[2].s, "GPU");
    }
  }
  EXPECT_EQ(removed, ia) << "BlockRemoved names exactly the pages A stored";
  parents.clear();
  auto sc = stored_ids(bc, parents);
  EXPECT_EQ(sc, std::vector<int64_t>(ic.begin(), ic.begin() + 7)) << "C's 28 of 30 tokens";
  EXPECT_EQ(tag(bc.events[0]), "BlockRemoved") << "the step evicted before it stored";

  // Replay from A's sequence returns the same bytes, then the end marker.
  auto replayed = replay(z, rep, live[0].first);
  ASSERT_EQ(replayed.size(), live.size());
  for (size_t i = 0; i < live.size(); ++i) {
    EXPECT_EQ(replayed[i].first, live[i].first);
    EXPECT_EQ(replayed[i].second, live[i].second);
  }
  // From 0: the first batch a rank ever published is SGLang's startup AllBlocksCleared.
  auto all = replay(z, rep, 0);
  ASSERT_FALSE(all.empty());
  EXPECT_EQ(all[0].first, 0u) << "sequence numbers count from 0";
  Batch first = sglang_batch(all[0].second);
  ASSERT_EQ(first.events.size(), 1u);
  EXPECT_EQ(tag(first.events[0]), "AllBlocksCleared");
  EXPECT_EQ(first.events[0].a.size(), 1u);

  // Rank 1: its own port, its own sequence, attn_dp_rank 1.
  Frames f1 = recv_multipart(sub1, 3000);
  ASSERT_EQ(f1.size(), 3u);
  Batch b1 = sglang_batch(f1[2]);
  EXPECT_EQ(b1.rank, 1);
  parents.clear();
  EXPECT_EQ(stored_ids(b1, parents), sglang_ids(d, 4)) << "9 tokens: two full pages";
  auto r1 = replay(z, rep + 1, 0);
  ASSERT_FALSE(r1.empty());
  EXPECT_LT(r1.back().first, live.back().first) << "rank 1 counts its own sequence";
}

TEST(SimKvWire, VllmShapeUsesMapsAndSha256CborIds) {
  const int pub = free_port_range(2);
  Sim s({"--page-size", "4", "--time-scale", "0.01", "--kv-events-format", "vllm",
         "--kv-events-config",
         R"({"publisher":"zmq","endpoint":"tcp://*:)" + std::to_string(pub) +
             R"(","replay_endpoint":"tcp://*:)" + std::to_string(pub + 1) + R"("})"});
  testing::HttpClient c(s.port);
  const auto a = ids_from(5, 18);
  ASSERT_EQ(c.post("/generate", generate_body(a, 0)).status, 200);
  Zmq z;
  auto batches = replay(z, pub + 1, 0);
  ASSERT_EQ(batches.size(), 2u) << "startup AllBlocksCleared, then A's step";
  V v = parse(batches[1].second);
  ASSERT_EQ(v.t, V::kMap) << "vLLM batches are maps";
  EXPECT_EQ(v.at("ts").t, V::kFloat);
  EXPECT_EQ(v.at("data_parallel_rank").as_int(), 0);
  const auto& events = v.at("events").a;
  ASSERT_EQ(events.size(), 1u) << "one BlockStored for the whole new node";
  const V& e = events[0];
  ASSERT_EQ(e.t, V::kMap);
  EXPECT_EQ(e.at("type").s, "BlockStored");
  EXPECT_EQ(e.keys[0].s, "type") << "the tag comes first";
  const char* env = std::getenv("PYTHONHASHSEED");
  auto want = vllm_ids(a, 4, env ? env : "vllm-none-hash");
  std::vector<uint64_t> got;
  for (const V& h : e.at("block_hashes").a) {
    EXPECT_EQ(h.t, V::kUint) << "vLLM ids are unsigned";
    got.push_back(h.u);
  }
  EXPECT_EQ(got, want);
  EXPECT_EQ(e.at("parent_block_hash").t, V::kNil);
  EXPECT_EQ(e.at("token_ids").a.size(), 16u);
  EXPECT_EQ(e.at("block_size").as_int(), 4);
  EXPECT_EQ(e.at("medium").s, "GPU");
  EXPECT_TRUE(e.has("lora_id"));
}

// The newest SGLang: contiguous stores merged into one BlockStored, the salt in the 8th (metadata)
// element, and with a snapshot endpoint the epoch in the live topic.
TEST(SimKvWire, MergedStoresSaltMetadataAndEpochTopic) {
  const int pub = free_port_range(4);
  const std::string config = R"({"publisher":"zmq","endpoint":"tcp://*:)" + std::to_string(pub) +
                             R"(","snapshot_endpoint":"tcp://*:)" + std::to_string(pub + 2) +
                             R"(","topic":"kv"})";
  Sim s({"--page-size", "4", "--time-scale", "0.01", "--kv-events-config", config});
  testing::HttpClient c(s.port);
  Zmq z;
  void* sub = z.connect(ZMQ_SUB, pub);
  Frames f;
  for (int i = 0; i < 200 && f.empty(); ++i) {
    ASSERT_EQ(c.post("/flush_cache", "").status, 200);
    f = recv_multipart(sub, 20);
  }
  ASSERT_EQ(f.size(), 3u);
  const std::string prefix = std::string("kv") + '\0' + "sgl-kv-epoch=";
  ASSERT_EQ(f[0].substr(0, prefix.size()), prefix) << "the live topic carries the epoch";
  const std::string epoch = f[0].substr(prefix.size());
  EXPECT_EQ(epoch.size(), 32u) << "uuid4().hex";
  while (!recv_multipart(sub, 50).empty()) {
  }
  // /server_info shows the configured topic (subscribers filter by prefix).
  testing::HttpClient info(s.port);
  auto body = info.get("/server_info").body;
  EXPECT_NE(body.find(R"("topic":"kv","block_size":4)"), std::string::npos) << body;

  const auto a = ids_from(10, 18);
  std::string req = R"({"input_ids":)" + py_list(a) +
                    R"(,"sampling_params":{"max_new_tokens":1},"cache_salt":"tenant-a"})";
  ASSERT_EQ(c.post("/generate", req).status, 200);
  V stored;
  for (int i = 0; i < 20 && stored.t == V::kNil; ++i) {
    f = recv_multipart(sub, 3000);
    ASSERT_EQ(f.size(), 3u);
    EXPECT_EQ(f[0], prefix + epoch) << "one epoch per publisher lifetime";
    for (const V& e : sglang_batch(f[2]).events) {
      if (tag(e) == "BlockStored") stored = e;
    }
  }
  ASSERT_EQ(stored.t, V::kArr);
  ASSERT_EQ(stored.a.size(), 8u) << "7 fields and the metadata map";
  std::vector<int64_t> ids;
  for (const V& h : stored.a[1].a) ids.push_back(h.as_int());
  EXPECT_EQ(ids, sglang_ids(a, 4, "tenant-a")) << "one event for the 4 full pages, salt-seeded";
  EXPECT_NE(ids, sglang_ids(a, 4));
  EXPECT_EQ(stored.a[2].t, V::kNil);
  EXPECT_EQ(stored.a[3].a.size(), 16u) << "n x page_size tokens";
  EXPECT_EQ(stored.a[4].as_int(), 4);
  const V& meta = stored.a[7];
  ASSERT_EQ(meta.t, V::kMap);
  ASSERT_EQ(meta.keys.size(), 1u);
  EXPECT_EQ(meta.at("cache_salt").s, "tenant-a");
}

}  // namespace
}  // namespace kvgate::sim
