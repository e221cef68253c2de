// Tests for kv/publisher: endpoint offsets per DP rank, the PUB framing [topic, seq, payload] and
// the replay ROUTER, read with raw libzmq sockets (SUB, DEALER) over loopback TCP.
#include "kv/publisher.h"

#include <gtest/gtest.h>
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

}  // namespace
}  // namespace kvgate::kv
