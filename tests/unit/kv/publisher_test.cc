// Tests for kv/publisher: endpoint offsets per DP rank, the PUB framing [topic, seq, payload] and
// the replay ROUTER, read with raw libzmq sockets (SUB, DEALER) over loopback TCP.
#include "kv/publisher.h"

#include <gtest/gtest.h>
#include <msgpuck.h>
#include <zmq.h>

#include <chrono>
#include <string>
#include <vector>

#include "kv/events.h"
#include "support/process.h"
#include "support/wire.h"

namespace kvgate::kv {
namespace {

using testing::be64;
using testing::Frames;
using testing::recv_multipart;
using testing::send_multipart;

using Zmq = testing::ZmqSockets;
using namespace std::string_literals;

TEST(KvPublisher, OffsetsEndpointsPerRank) {
  std::string out, err;
  ASSERT_TRUE(offset_endpoint("tcp://*:5557", 0, out, err));
  EXPECT_EQ(out, "tcp://*:5557");
  ASSERT_TRUE(offset_endpoint("tcp://*:5557", 3, out, err));
  EXPECT_EQ(out, "tcp://*:5560");
  ASSERT_TRUE(offset_endpoint("tcp://[::1]:6000", 1, out, err));
  EXPECT_EQ(out, "tcp://[::1]:6001");
  ASSERT_TRUE(offset_endpoint("inproc://kv", 2, out, err));
  EXPECT_EQ(out, "inproc://kv_dp2");
  EXPECT_FALSE(offset_endpoint("tcp://*:65535", 1, out, err));
  EXPECT_NE(err.find("65535"), std::string::npos);
  EXPECT_FALSE(offset_endpoint("tcp://host", 1, out, err));
  EXPECT_FALSE(offset_endpoint("ipc:///tmp/kv", 1, out, err));
  EXPECT_TRUE(endpoint_binds("tcp://*:5557"));
  EXPECT_TRUE(endpoint_binds("tcp://[::]:5557"));
  EXPECT_TRUE(endpoint_binds("ipc:///tmp/x"));
  EXPECT_TRUE(endpoint_binds("tcp://0.0.0.0:5557")) << "SGLang binds the IPv4 wildcard too";
  EXPECT_FALSE(endpoint_binds("tcp://10.0.0.1:5557")) << "the engines connect to a named host";
}

TEST(KvPublisher, PublishesFramesAndReplaysFromASequence) {
  const int port = testing::free_port();
  const int replay_port = testing::free_port();
  PublisherOptions o;
  o.endpoint = "tcp://*:" + std::to_string(port);
  o.replay_endpoint = "tcp://*:" + std::to_string(replay_port);
  o.topic = "kv@r0";
  o.buffer_steps = 4;
  std::string err;
  auto pub = Publisher::create(o, err);
  ASSERT_TRUE(pub) << err;

  Zmq z;
  void* sub = z.connect(ZMQ_SUB, "tcp://127.0.0.1:" + std::to_string(port));
  // PUB drops messages until the subscription arrives: probe until one gets through.
  Frames got;
  for (int i = 0; i < 200 && got.empty(); ++i) {
    pub->publish("probe");
    got = recv_multipart(sub, 20);
  }
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0], "kv@r0");
  ASSERT_EQ(got[1].size(), 8u);
  EXPECT_EQ(got[2], "probe");
  while (!recv_multipart(sub, 50).empty()) {
  }
  const uint64_t first = pub->published();
  for (int i = 0; i < 6; ++i) EXPECT_EQ(pub->publish("batch" + std::to_string(i)), first + i);
  for (int i = 0; i < 6; ++i) {
    got = recv_multipart(sub, 2000);
    ASSERT_EQ(got.size(), 3u);
    EXPECT_EQ(be64(got[1]), first + i) << "consecutive sequence numbers";
    EXPECT_EQ(got[2], "batch" + std::to_string(i));
  }

  // Replay: the last buffer_steps (4) batches from the asked sequence on, then seq -1.
  void* dealer = z.connect(ZMQ_DEALER, "tcp://127.0.0.1:" + std::to_string(replay_port));
  send_multipart(dealer, {"", encode_sequence(first + 3)});
  std::vector<uint64_t> seqs;
  for (;;) {
    got = recv_multipart(dealer, 2000);
    ASSERT_EQ(got.size(), 3u);
    EXPECT_EQ(got[0], "");
    uint64_t s = be64(got[1]);
    if (s == kReplayEnd) {
      EXPECT_EQ(got[2], "") << "the end marker has an empty payload";
      break;
    }
    EXPECT_EQ(got[2], "batch" + std::to_string(s - first));
    seqs.push_back(s);
  }
  EXPECT_EQ(seqs, (std::vector<uint64_t>{first + 3, first + 4, first + 5}));
  // From 0: only what the buffer still holds.
  send_multipart(dealer, {"", encode_sequence(0)});
  seqs.clear();
  for (got = recv_multipart(dealer, 2000); got.size() == 3 && be64(got[1]) != kReplayEnd;
       got = recv_multipart(dealer, 2000)) {
    seqs.push_back(be64(got[1]));
  }
  EXPECT_EQ(seqs, (std::vector<uint64_t>{first + 2, first + 3, first + 4, first + 5}));
  // A malformed request is ignored; the socket keeps serving.
  send_multipart(dealer, {"", "bad"});
  send_multipart(dealer, {"", encode_sequence(first + 5)});
  got = recv_multipart(dealer, 2000);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(be64(got[1]), first + 5);
}

TEST(KvPublisher, BindConflictIsAnErrorNamingTheEndpoint) {
  const int port = testing::free_port();
  PublisherOptions o;
  o.endpoint = "tcp://*:" + std::to_string(port);
  std::string err;
  auto a = Publisher::create(o, err);
  ASSERT_TRUE(a) << err;
  auto b = Publisher::create(o, err);
  EXPECT_FALSE(b);
  EXPECT_NE(err.find(o.endpoint), std::string::npos) << err;
}

TEST(KvPublisher, EpochTopicOnlyWithASnapshotEndpoint) {
  EXPECT_EQ(epoch_topic("kv", "abc"), "kv\0sgl-kv-epoch=abc"s);
  const std::string id = uuid4_hex();
  ASSERT_EQ(id.size(), 32u);
  EXPECT_EQ(id[12], '4') << "a version 4 uuid";
  EXPECT_NE(uuid4_hex(), id);
  PublisherOptions o;
  o.endpoint = "tcp://*:" + std::to_string(testing::free_port());
  o.topic = "kv";
  std::string err;
  auto plain = Publisher::create(o, err);
  ASSERT_TRUE(plain) << err;
  EXPECT_EQ(plain->live_topic(), "kv") << "SGLang keeps the exact topic without snapshots";
}

// The snapshot protocol of SGLang's ZmqEventPublisher (disaggregation/kv_events.py).
TEST(KvPublisher, SnapshotsThePlacementBehindABarrier) {
  const int port = testing::free_port();
  const int snap_port = testing::free_port();
  PublisherOptions o;
  o.endpoint = "tcp://*:" + std::to_string(port);
  o.snapshot_endpoint = "tcp://*:" + std::to_string(snap_port);
  o.topic = "kv";
  o.epoch = "replica-epoch-1";
  o.dp_rank = 2;
  std::string err;
  auto pub = Publisher::create(o, err);
  ASSERT_TRUE(pub) << err;
  const std::string live = "kv\0sgl-kv-epoch=replica-epoch-1"s;
  EXPECT_EQ(pub->live_topic(), live);

  Zmq z;
  void* sub = z.connect(ZMQ_SUB, "tcp://127.0.0.1:" + std::to_string(port));
  Frames got;
  for (int i = 0; i < 200 && got.empty(); ++i) {
    pub->publish("probe");
    got = recv_multipart(sub, 20);
  }
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0], live);
  while (!recv_multipart(sub, 50).empty()) {
  }

  BlockStored a;
  a.block_hashes = {11, 12};
  BlockStored b;
  b.block_hashes = {13};
  b.parent_block_hash = 12;
  BlockRemoved r;
  r.block_hashes = {13};
  std::vector<Event> events{a, b};
  pub->publish("stores", events);
  std::vector<Event> removal{r};
  pub->publish("removal", removal);
  const uint64_t barrier_expected = pub->published();

  void* dealer = z.connect(ZMQ_DEALER, "tcp://127.0.0.1:" + std::to_string(snap_port));
  send_multipart(dealer, {"", "snapshot-v1"});
  Frames header = recv_multipart(dealer, 3000);
  ASSERT_EQ(header.size(), 3u);
  EXPECT_EQ(header[0], "");
  EXPECT_EQ(header[1], "header");
  const char* p = header[2].data();
  ASSERT_EQ(mp_decode_array(&p), 7u) << "[version, epoch, replica_rank, resume_seq, barrier_seq, "
                                        "barrier_id, record_count]";
  EXPECT_EQ(mp_decode_uint(&p), 1u);
  uint32_t len = 0;
  const char* epoch = mp_decode_str(&p, &len);
  EXPECT_EQ(std::string(epoch, len), "replica-epoch-1");
  EXPECT_EQ(mp_decode_uint(&p), 2u);
  const uint64_t resume = mp_decode_uint(&p);
  const uint64_t barrier = mp_decode_uint(&p);
  EXPECT_EQ(barrier, barrier_expected) << "the barrier takes the next sequence number";
  EXPECT_EQ(resume, barrier + 1);
  const char* bid = mp_decode_str(&p, &len);
  const std::string barrier_id(bid, len);
  EXPECT_EQ(barrier_id.size(), 32u);
  EXPECT_EQ(mp_decode_uint(&p), 2u) << "blocks 11 and 12 remain";

  Frames chunk = recv_multipart(dealer, 3000);
  ASSERT_EQ(chunk.size(), 3u);
  EXPECT_EQ(chunk[1], "chunk");
  p = chunk[2].data();
  ASSERT_EQ(mp_decode_array(&p), 2u);
  ASSERT_EQ(mp_decode_array(&p), 2u) << "[parent_block_hash, block_hashes]";
  EXPECT_EQ(mp_typeof(*p), MP_NIL);
  mp_decode_nil(&p);
  ASSERT_EQ(mp_decode_array(&p), 1u);
  EXPECT_EQ(mp_decode_uint(&p), 11u);
  ASSERT_EQ(mp_decode_array(&p), 2u);
  EXPECT_EQ(mp_decode_uint(&p), 11u) << "12's parent";
  ASSERT_EQ(mp_decode_array(&p), 1u);
  EXPECT_EQ(mp_decode_uint(&p), 12u);
  Frames end = recv_multipart(dealer, 3000);
  ASSERT_EQ(end.size(), 3u);
  EXPECT_EQ(end[1], "end");
  EXPECT_EQ(end[2], "");

  // The barrier went out live, after the two batches, on a topic naming it.
  Frames f;
  for (f = recv_multipart(sub, 3000); f.size() == 3 && be64(f[1]) != barrier;
       f = recv_multipart(sub, 3000)) {
  }
  ASSERT_EQ(f.size(), 3u);
  EXPECT_EQ(f[0], live + "\0sgl-kv-snapshot="s + barrier_id);
  EventBatch bb;
  ASSERT_TRUE(decode_batch(f[2], bb).ok());
  EXPECT_TRUE(bb.events.empty());
  EXPECT_EQ(bb.dp_rank, 2);

  send_multipart(dealer, {"", "snapshot-v2"});
  Frames error = recv_multipart(dealer, 3000);
  ASSERT_EQ(error.size(), 3u);
  EXPECT_EQ(error[1], "error");
  EXPECT_EQ(error[2], "invalid snapshot-v1 request");
}

}  // namespace
}  // namespace kvgate::kv
