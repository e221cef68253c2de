// Tests for kv/subscriber over loopback TCP: in-order delivery from our kv::Publisher; sequence
// gaps, replays, restarts and malformed messages from a publisher the test drives frame by frame
// (an XPUB, so the test knows when the subscription has arrived, and a ROUTER it answers by hand);
// the set of sources changing; connection state; stop. Then a cross-check against a publisher in
// Python that writes SGLang's wire shapes (tests/tools/sglang_kv_publisher.py).
#include "kv/subscriber.h"

#include <gtest/gtest.h>
#include <zmq.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "kv/block_hash.h"
#include "kv/events.h"
#include "kv/publisher.h"
#include "support/process.h"
#include "support/temp_dir.h"
#include "support/wire.h"

namespace kvgate::kv {
namespace {

using testing::Frames;
using testing::recv_multipart;
using testing::send_multipart;
using testing::wait_until;
using namespace std::chrono_literals;

// A batch that names its own sequence number: one BlockRemoved of the hash `seq`.
std::string tagged_payload(uint64_t seq) {
  EventBatch b;
  b.ts = 1.5;
  b.events.emplace_back(BlockRemoved{{seq}, Medium::kGpu});
  std::string out;
  encode_batch(b, WireFormat::kSglang, out);
  return out;
}

std::optional<uint64_t> tag_of(const EventBatch& b) {
  if (b.events.size() != 1) return std::nullopt;
  const auto* r = std::get_if<BlockRemoved>(&b.events[0]);
  if (r == nullptr || r->block_hashes.size() != 1) return std::nullopt;
  return r->block_hashes[0];
}

// Records every sink call; trace(source) reads "0 1 reset:restart 0" and the like.
class RecordingSink : public EventSink {
 public:
  void on_batch(SourceId source, uint64_t seq, const EventBatch& batch) override {
    std::lock_guard lock(mu_);
    if (closed_) ++after_close_;
    if (auto tag = tag_of(batch); tag && *tag != seq) ++mismatches_;
    append(source, std::to_string(seq));
    batches_[source].emplace_back(seq, batch);
  }
  void on_reset(SourceId source, ResetReason why) override {
    std::lock_guard lock(mu_);
    if (closed_) ++after_close_;
    append(source, "reset:" + std::string(to_string(why)));
  }

  std::string trace(SourceId source) const {
    std::lock_guard lock(mu_);
    auto it = traces_.find(source);
    return it == traces_.end() ? "" : it->second;
  }
  std::vector<std::pair<uint64_t, EventBatch>> batches(SourceId source) const {
    std::lock_guard lock(mu_);
    auto it = batches_.find(source);
    return it == batches_.end() ? std::vector<std::pair<uint64_t, EventBatch>>{} : it->second;
  }
  size_t count(SourceId source) const { return batches(source).size(); }
  // After this every call counts as a violation (stop() promised there would be none).
  void close() {
    std::lock_guard lock(mu_);
    closed_ = true;
  }
  int after_close() const {
    std::lock_guard lock(mu_);
    return after_close_;
  }
  int mismatches() const {
    std::lock_guard lock(mu_);
    return mismatches_;
  }

 private:
  void append(SourceId source, const std::string& word) {
    std::string& t = traces_[source];
    t += (t.empty() ? "" : " ") + word;
  }
  mutable std::mutex mu_;
  std::map<SourceId, std::string> traces_;
  std::map<SourceId, std::vector<std::pair<uint64_t, EventBatch>>> batches_;
  bool closed_ = false;
  int after_close_ = 0;
  int mismatches_ = 0;
};

// A publisher the test drives frame by frame, bound to free loopback ports.
class ScriptedPublisher {
 public:
  explicit ScriptedPublisher(bool with_replay) : ctx_(zmq_ctx_new()) {
    pub_endpoint_ = bind(ZMQ_XPUB, "tcp://127.0.0.1:0", pub_);
    if (with_replay) replay_endpoint_ = bind(ZMQ_ROUTER, "tcp://127.0.0.1:0", router_);
  }
  ~ScriptedPublisher() {
    if (pub_ != nullptr) zmq_close(pub_);
    if (router_ != nullptr) zmq_close(router_);
    zmq_ctx_term(ctx_);
  }
  ScriptedPublisher(const ScriptedPublisher&) = delete;
  ScriptedPublisher& operator=(const ScriptedPublisher&) = delete;

  const std::string& pub() const { return pub_endpoint_; }
  const std::string& replay() const { return replay_endpoint_; }

  // The topic of the next subscription (XPUB hands them up as "\x01" + topic); nullopt after
  // `timeout_ms`. XPUB reports a topic only when it is new to it.
  std::optional<std::string> wait_subscription(int timeout_ms = 10000) {
    return wait_for('\x01', timeout_ms);
  }
  // The topic of the next unsubscription ("\x00" + topic): a topic no connection wants any more.
  std::optional<std::string> wait_unsubscription(int timeout_ms = 10000) {
    return wait_for('\x00', timeout_ms);
  }

  void send(uint64_t seq, const std::string& topic = "kv") {
    send_multipart(pub_, {topic, encode_sequence(seq), tagged_payload(seq)});
  }
  void send_frames(const Frames& frames) { send_multipart(pub_, frames); }

  // A replay request: {identity, start}; nullopt after `timeout_ms`.
  std::optional<std::pair<std::string, uint64_t>> replay_request(int timeout_ms = 10000) {
    Frames f = recv_multipart(router_, timeout_ms);
    uint64_t start = 0;
    if (f.size() != 3 || !f[1].empty() || !decode_sequence(f[2], start)) return std::nullopt;
    return std::make_pair(f[0], start);
  }
  void reply(const std::string& identity, uint64_t seq) {
    send_multipart(router_, {identity, "", encode_sequence(seq), tagged_payload(seq)});
  }
  void reply_end(const std::string& identity) {
    send_multipart(router_, {identity, "", encode_sequence(kReplayEnd), ""});
  }

  // The publisher goes away (its connections close), then comes back on the same endpoint.
  void close_pub() {
    zmq_close(pub_);
    pub_ = nullptr;
  }
  void reopen_pub() { bind(ZMQ_XPUB, pub_endpoint_, pub_); }

 private:
  std::string bind(int type, const std::string& endpoint, void*& sock) {
    sock = zmq_socket(ctx_, type);
    int zero = 0;
    zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero);
    EXPECT_EQ(zmq_bind(sock, endpoint.c_str()), 0) << endpoint << ": " << zmq_strerror(zmq_errno());
    char buf[256];
    size_t len = sizeof buf;
    zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, buf, &len);
    return std::string(buf);  // "tcp://127.0.0.1:PORT"
  }

  std::optional<std::string> wait_for(char kind, int timeout_ms) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (std::chrono::steady_clock::now() < end) {
      Frames f = recv_multipart(pub_, 100);
      if (f.size() == 1 && !f[0].empty() && f[0][0] == kind) return f[0].substr(1);
    }
    return std::nullopt;
  }

  void* ctx_;
  void* pub_ = nullptr;
  void* router_ = nullptr;
  std::string pub_endpoint_;
  std::string replay_endpoint_;
};

SourceSpec spec_for(SourceId id, const ScriptedPublisher& p, const std::string& topic = "kv") {
  SourceSpec s;
  s.id = id;
  s.endpoint = "http://worker-" + std::to_string(id);
  s.pub = p.pub();
  s.replay = p.replay();
  s.topic = topic;
  return s;
}

SubscriberOptions fast_options() {
  SubscriberOptions o;
  o.reconnect_min = 20ms;
  o.reconnect_max = 200ms;
  o.replay_timeout = 5000ms;
  return o;
}

SourceStatus status_of(const Subscriber& sub, SourceId id) {
  for (const auto& [spec, st] : sub.status()) {
    if (spec.id == id) return st;
  }
  return {};
}

// The status once `messages` batches were delivered: status() trails the sink a little (the
// subscriber publishes it after each burst of messages).
SourceStatus settled(const Subscriber& sub, SourceId id, uint64_t messages) {
  SourceStatus st;
  EXPECT_TRUE(wait_until([&] {
    st = status_of(sub, id);
    return st.messages == messages;
  })) << "messages: "
      << st.messages;
  return st;
}

// Waits until the trace of `source` is `want`; the failure message shows what it was.
#define EXPECT_TRACE(sink, source, want)                                       \
  EXPECT_TRUE(wait_until([&] { return (sink).trace(source) == (want); }, 10s)) \
      << "trace: " << (sink).trace(source) << "\nwanted: " << (want)

TEST(KvSubscriber, DeliversOurPublishersBatchesInOrder) {
  const int port = testing::free_port();
  const int replay_port = testing::free_port();
  PublisherOptions po;
  // The engines' rule: a tcp PUB endpoint binds only with a wildcard host (it connects to a named
  // one). The subscriber connects to 127.0.0.1.
  po.endpoint = "tcp://*:" + std::to_string(port);
  po.replay_endpoint = "tcp://*:" + std::to_string(replay_port);
  po.topic = "kv@r0";
  std::string err;
  auto pub = Publisher::create(po, err);
  ASSERT_TRUE(pub) << err;

  RecordingSink sink;
  Subscriber sub(fast_options(), sink);
  SourceSpec s;
  s.id = 3;
  s.pub = "tcp://127.0.0.1:" + std::to_string(port);
  s.replay = "tcp://127.0.0.1:" + std::to_string(replay_port);
  s.topic = "kv@r0";
  sub.set_sources({s});
  sub.start();

  // PUB drops batches until the subscription reaches it: publish until one arrives.
  ASSERT_TRUE(wait_until([&] {
    pub->publish(tagged_payload(pub->published()));
    return sink.count(3) > 0;
  }));
  const uint64_t first = sink.batches(3).front().first;
  while (pub->published() < first + 60) pub->publish(tagged_payload(pub->published()));
  const uint64_t last = pub->published() - 1;
  ASSERT_TRUE(wait_until([&] { return status_of(sub, 3).last_seq == last; })) << sink.trace(3);

  std::string want;
  for (uint64_t q = first; q <= last; ++q) want += (q == first ? "" : " ") + std::to_string(q);
  EXPECT_EQ(sink.trace(3), want);
  EXPECT_EQ(sink.mismatches(), 0);
  const SourceStatus st = status_of(sub, 3);
  EXPECT_TRUE(st.connected);
  EXPECT_EQ(st.messages, last - first + 1);
  EXPECT_EQ(st.gaps, 0u);
  EXPECT_EQ(st.resets, 0u);
  EXPECT_EQ(st.decode_errors, 0u);
  EXPECT_GT(st.last_message.time_since_epoch().count(), 0);
}

TEST(KvSubscriber, FiltersByTopicPrefixAndTakesAnEpochChangeAsARestart) {
  ScriptedPublisher p(false);
  RecordingSink sink;
  Subscriber sub(fast_options(), sink);
  sub.set_sources({spec_for(1, p, "kv")});
  sub.start();
  ASSERT_EQ(p.wait_subscription(), "kv") << "SUB subscribes to the topic prefix";

  const std::string nul(1, '\0');
  const std::string a = "kv" + nul + "sgl-kv-epoch=aaa";
  const std::string b = "kv" + nul + "sgl-kv-epoch=bbb";
  p.send(0, "other");
  p.send(0, a);
  p.send(1, a + nul + "sgl-kv-snapshot=x1");  // a snapshot barrier: the same epoch
  p.send(2, a);
  p.send(3, b);  // a new publisher lifetime whose numbers happen to follow on
  p.send(4, b);
  EXPECT_TRACE(sink, 1u, "0 1 2 reset:restart 3 4");
  EXPECT_EQ(sink.mismatches(), 0) << "the batch of topic 'other' never arrived";
}

TEST(KvSubscriber, FillsAGapByReplayInOrderExactlyOnce) {
  ScriptedPublisher p(true);
  RecordingSink sink;
  Subscriber sub(fast_options(), sink);
  sub.set_sources({spec_for(1, p)});
  sub.start();
  ASSERT_TRUE(p.wait_subscription());
  for (uint64_t q : {0, 1, 2}) p.send(q);
  EXPECT_TRACE(sink, 1u, "0 1 2");

  p.send(5);  // 3 and 4 lost
  auto req = p.replay_request();
  ASSERT_TRUE(req);
  EXPECT_EQ(req->second, 3u) << "the replay starts at the first missing batch";
  p.send(6);  // live while the replay runs: held, delivered after it
  for (uint64_t q : {3, 4, 5, 6, 7}) p.reply(req->first, q);
  p.reply_end(req->first);
  EXPECT_TRACE(sink, 1u, "0 1 2 3 4 5 6 7");
  // 7 was replayed before it came live (the replay's connection overtook the live one): the live
  // copy is dropped, not taken for a restart.
  p.send(7);
  p.send(8);
  EXPECT_TRACE(sink, 1u, "0 1 2 3 4 5 6 7 8");
  const SourceStatus st = settled(sub, 1, 9);
  EXPECT_EQ(st.gaps, 1u);
  EXPECT_EQ(st.replayed, 5u);
  EXPECT_EQ(st.resets, 0u);
  EXPECT_EQ(sink.mismatches(), 0);

  // A publisher restart after the live stream caught up is a reset again.
  p.send(0);
  EXPECT_TRACE(sink, 1u, "0 1 2 3 4 5 6 7 8 reset:restart 0");
}

TEST(KvSubscriber, AGapWithoutReplayEndpointResets) {
  ScriptedPublisher p(false);
  RecordingSink sink;
  Subscriber sub(fast_options(), sink);
  sub.set_sources({spec_for(1, p)});
  sub.start();
  ASSERT_TRUE(p.wait_subscription());
  for (uint64_t q : {0, 1, 3, 4}) p.send(q);
  EXPECT_TRACE(sink, 1u, "0 1 reset:gap_no_replay 3 4");
  const SourceStatus st = settled(sub, 1, 4);
  EXPECT_EQ(st.gaps, 1u);
  EXPECT_EQ(st.resets, 1u);
}

TEST(KvSubscriber, AReplayMissingBatchesResetsAndGoesOnLive) {
  ScriptedPublisher p(true);
  RecordingSink sink;
  Subscriber sub(fast_options(), sink);
  sub.set_sources({spec_for(1, p)});
  sub.start();
  ASSERT_TRUE(p.wait_subscription());
  for (uint64_t q : {0, 1, 2, 5}) p.send(q);
  auto req = p.replay_request();
  ASSERT_TRUE(req);
  ASSERT_EQ(req->second, 3u);
  // The publisher's buffer starts past 3: what was asked is gone.
  for (uint64_t q : {4, 5}) p.reply(req->first, q);
  p.reply_end(req->first);
  EXPECT_TRACE(sink, 1u, "0 1 2 reset:replay_failed 5");
  p.send(6);
  EXPECT_TRACE(sink, 1u, "0 1 2 reset:replay_failed 5 6");
  EXPECT_EQ(settled(sub, 1, 5).replayed, 0u);
}

TEST(KvSubscriber, AReplayThatNeverAnswersTimesOut) {
  ScriptedPublisher p(true);
  RecordingSink sink;
  SubscriberOptions o = fast_options();
  // Long enough for the request to reach the publisher on a loaded machine (under TSan, 300 ms
  // was not): a subscriber that gives up first closes its socket, dropping a request not yet
  // delivered, and the publisher never sees it.
  o.replay_timeout = 2s;
  Subscriber sub(o, sink);
  sub.set_sources({spec_for(1, p)});
  sub.start();
  ASSERT_TRUE(p.wait_subscription());
  for (uint64_t q : {0, 1, 2, 5, 6}) p.send(q);
  ASSERT_TRUE(p.replay_request()) << "the replay was asked";
  const auto asked = std::chrono::steady_clock::now();
  EXPECT_TRACE(sink, 1u, "0 1 2 reset:replay_failed 5 6");
  EXPECT_LT(std::chrono::steady_clock::now() - asked, 5s);
}

TEST(KvSubscriber, TooManyHeldBatchesEndTheReplay) {
  ScriptedPublisher p(true);
  RecordingSink sink;
  SubscriberOptions o = fast_options();
  o.replay_timeout = 60s;  // never reached: the bound on held batches ends the replay first
  o.max_held = 3;
  Subscriber sub(o, sink);
  sub.set_sources({spec_for(1, p)});
  sub.start();
  ASSERT_TRUE(p.wait_subscription());
  for (uint64_t q : {0, 2, 3, 4, 5}) p.send(q);
  EXPECT_TRACE(sink, 1u, "0 reset:replay_failed 2 3 4 5");
  p.send(6);
  EXPECT_TRACE(sink, 1u, "0 reset:replay_failed 2 3 4 5 6");
}

TEST(KvSubscriber, ARestartResets) {
  ScriptedPublisher p(true);
  RecordingSink sink;
  Subscriber sub(fast_options(), sink);
  sub.set_sources({spec_for(1, p)});
  sub.start();
  ASSERT_TRUE(p.wait_subscription());
  for (uint64_t q : {0, 1, 2, 0, 1}) p.send(q);
  EXPECT_TRACE(sink, 1u, "0 1 2 reset:restart 0 1");
  const SourceStatus st = settled(sub, 1, 5);
  EXPECT_EQ(st.gaps, 0u) << "a restart is not a gap";
  EXPECT_EQ(st.resets, 1u);
}

TEST(KvSubscriber, MalformedMessagesAreCountedAndSkipped) {
  ScriptedPublisher p(true);
  RecordingSink sink;
  Subscriber sub(fast_options(), sink);
  sub.set_sources({spec_for(1, p)});
  sub.start();
  ASSERT_TRUE(p.wait_subscription());
  p.send(0);
  p.send_frames({"kv", encode_sequence(1)});                              // two frames
  p.send_frames({"kv", "1234567", tagged_payload(1)});                    // a 7-byte sequence
  p.send_frames({"kv", encode_sequence(1), tagged_payload(1), "extra"});  // four frames
  p.send_frames({"kv", encode_sequence(1), "\xc1"});                      // not msgpack
  p.send(2);
  EXPECT_TRACE(sink, 1u, "0 2");
  const SourceStatus st = settled(sub, 1, 2);
  EXPECT_EQ(st.decode_errors, 4u);
  EXPECT_EQ(st.gaps, 0u) << "the bad batch 1 took its place in the sequence";
  EXPECT_EQ(st.resets, 0u);
}

TEST(KvSubscriber, AReplayDoesNotHoldUpOtherSources) {
  ScriptedPublisher a(true), b(false);
  RecordingSink sink;
  SubscriberOptions o = fast_options();
  o.replay_timeout = 60s;
  Subscriber sub(o, sink);
  sub.set_sources({spec_for(1, a), spec_for(2, b)});
  sub.start();
  ASSERT_TRUE(a.wait_subscription());
  ASSERT_TRUE(b.wait_subscription());
  for (uint64_t q : {0, 2}) a.send(q);
  ASSERT_TRUE(a.replay_request()) << "source 1 replays (and its publisher never answers)";
  for (uint64_t q : {0, 1, 2}) b.send(q);
  EXPECT_TRACE(sink, 2u, "0 1 2");
  EXPECT_EQ(sink.trace(1), "0");
}

TEST(KvSubscriber, AnEndpointLibzmqRejectsLeavesTheOtherSourcesRunning) {
  ScriptedPublisher p(false);
  RecordingSink sink;
  Subscriber sub(fast_options(), sink);
  SourceSpec bad;
  bad.id = 2;
  bad.pub = "tcp://127.0.0.1";  // no port
  sub.set_sources({spec_for(1, p), bad});
  sub.start();
  ASSERT_TRUE(p.wait_subscription());
  p.send(0);
  EXPECT_TRACE(sink, 1u, "0");
  ASSERT_EQ(sub.status().size(), 2u);
  EXPECT_FALSE(status_of(sub, 2).connected);
  sub.set_sources({spec_for(1, p)});
  EXPECT_TRACE(sink, 2u, "reset:removed");
}

TEST(KvSubscriber, SetSourcesAddsRemovesAndReplaces) {
  ScriptedPublisher a(false), b(false);
  RecordingSink sink;
  Subscriber sub(fast_options(), sink);
  sub.set_sources({spec_for(1, a), spec_for(2, b)});
  ASSERT_EQ(sub.status().size(), 2u) << "status lists the sources asked for before start";
  sub.start();
  ASSERT_TRUE(a.wait_subscription());
  ASSERT_TRUE(b.wait_subscription());
  a.send(0);
  b.send(0);
  EXPECT_TRACE(sink, 1u, "0");
  EXPECT_TRACE(sink, 2u, "0");

  sub.set_sources({spec_for(1, a)});  // 2 leaves; 1 is unchanged and keeps its sequence
  EXPECT_TRACE(sink, 2u, "0 reset:removed");
  // Its SUB is gone: its publisher drops the topic (and will report it anew when 2 comes back).
  ASSERT_EQ(b.wait_unsubscription(), "kv");
  auto st = sub.status();
  ASSERT_EQ(st.size(), 1u);
  EXPECT_EQ(st[0].first.id, 1u);
  a.send(1);
  EXPECT_TRACE(sink, 1u, "0 1");

  // The same id with another topic: removed, then added as new (its first batch taken as is).
  sub.set_sources({spec_for(1, a, "kv2")});
  EXPECT_TRACE(sink, 1u, "0 1 reset:removed");
  ASSERT_EQ(a.wait_subscription(), "kv2");
  a.send(7, "kv2");
  EXPECT_TRACE(sink, 1u, "0 1 reset:removed 7");

  // 2 comes back as a new source.
  sub.set_sources({spec_for(1, a, "kv2"), spec_for(2, b)});
  ASSERT_EQ(b.wait_subscription(), "kv");
  b.send(5);
  EXPECT_TRACE(sink, 2u, "0 reset:removed 5");
  EXPECT_EQ(sink.mismatches(), 0);
}

TEST(KvSubscriber, ReportsConnectionStateAndReconnects) {
  ScriptedPublisher p(false);
  RecordingSink sink;
  Subscriber sub(fast_options(), sink);
  sub.set_sources({spec_for(1, p)});
  sub.start();
  ASSERT_TRUE(wait_until([&] { return status_of(sub, 1).connected; }));
  EXPECT_GT(status_of(sub, 1).connected_since.time_since_epoch().count(), 0);
  EXPECT_EQ(status_of(sub, 1).reconnects, 0u);

  p.close_pub();
  ASSERT_TRUE(wait_until([&] { return !status_of(sub, 1).connected; }));
  p.reopen_pub();
  ASSERT_TRUE(wait_until([&] { return status_of(sub, 1).connected; }));
  EXPECT_EQ(status_of(sub, 1).reconnects, 1u);
  // The subscription is sent again on the new connection.
  ASSERT_EQ(p.wait_subscription(), "kv");
  p.send(0);
  // The drop forgot the source (its engine may come back empty); the new stream is taken as is.
  EXPECT_TRACE(sink, 1u, "reset:disconnected 0");
}

// --- How a source's view began (SourceStatus::bootstrap) ---

// A sink that answers EventSink::seed (a peer's inventory up to a sequence) and counts the asks.
class SeedingSink : public RecordingSink {
 public:
  explicit SeedingSink(std::optional<uint64_t> covers) : covers_(covers) {}
  std::optional<uint64_t> seed(SourceId) override {
    ++asked_;
    return covers_;
  }
  int asked() const { return asked_.load(); }

 private:
  std::optional<uint64_t> covers_;
  std::atomic<int> asked_{0};
};

Bootstrap bootstrap_of(const Subscriber& sub, SourceId id) {
  return status_of(sub, id).bootstrap;
}

TEST(KvSubscriberBootstrap, AStreamFollowedFromItsFirstBatchIsLive) {
  ScriptedPublisher p(false);
  RecordingSink sink;
  Subscriber sub(fast_options(), sink);
  sub.set_sources({spec_for(1, p)});
  sub.start();
  ASSERT_TRUE(p.wait_subscription());
  EXPECT_EQ(bootstrap_of(sub, 1), Bootstrap::kPending);
  for (uint64_t q : {0, 1}) p.send(q);
  EXPECT_TRACE(sink, 1u, "0 1");
  ASSERT_TRUE(wait_until([&] { return bootstrap_of(sub, 1) == Bootstrap::kLive; }));
  EXPECT_TRUE(complete(bootstrap_of(sub, 1)));
}

TEST(KvSubscriberBootstrap, BeginningMidStreamWithoutAReplayIsCold) {
  ScriptedPublisher p(false);
  RecordingSink sink;
  Subscriber sub(fast_options(), sink);
  sub.set_sources({spec_for(1, p)});
  sub.start();
  ASSERT_TRUE(p.wait_subscription());
  for (uint64_t q : {5, 6}) p.send(q);
  EXPECT_TRACE(sink, 1u, "5 6");  // taken as they come: no reset, no gap
  ASSERT_TRUE(wait_until([&] { return bootstrap_of(sub, 1) == Bootstrap::kCold; }));
  EXPECT_FALSE(complete(bootstrap_of(sub, 1)));
  const SourceStatus st = settled(sub, 1, 2);
  EXPECT_EQ(st.gaps, 0u);
  EXPECT_EQ(st.resets, 0u);
}

TEST(KvSubscriberBootstrap, BeginningMidStreamTheEnginesReplayGivesTheHistoryFromZero) {
  ScriptedPublisher p(true);
  RecordingSink sink;
  Subscriber sub(fast_options(), sink);
  sub.set_sources({spec_for(1, p)});
  sub.start();
  ASSERT_TRUE(p.wait_subscription());
  p.send(3);
  auto req = p.replay_request();
  ASSERT_TRUE(req);
  EXPECT_EQ(req->second, 0u) << "a view that begins asks for the whole history";
  for (uint64_t q : {0, 1, 2, 3}) p.reply(req->first, q);
  p.reply_end(req->first);
  EXPECT_TRACE(sink, 1u, "0 1 2 3");
  ASSERT_TRUE(wait_until([&] { return bootstrap_of(sub, 1) == Bootstrap::kEngineReplay; }));
  p.send(4);
  EXPECT_TRACE(sink, 1u, "0 1 2 3 4");
  const SourceStatus st = settled(sub, 1, 5);
  EXPECT_EQ(st.gaps, 0u) << "the first batch of a view is not a gap";
  EXPECT_EQ(st.resets, 0u);
  EXPECT_EQ(sink.mismatches(), 0);
}

TEST(KvSubscriberBootstrap, AReplayThatNoLongerHasBatchZeroLeavesTheViewColdNotReset) {
  ScriptedPublisher p(true);
  RecordingSink sink;
  Subscriber sub(fast_options(), sink);
  sub.set_sources({spec_for(1, p)});
  sub.start();
  ASSERT_TRUE(p.wait_subscription());
  p.send(7);
  auto req = p.replay_request();
  ASSERT_TRUE(req);
  for (uint64_t q : {5, 6, 7}) p.reply(req->first, q);  // its buffer begins at 5
  p.reply_end(req->first);
  EXPECT_TRACE(sink, 1u, "7");  // the live batch begins the view
  ASSERT_TRUE(wait_until([&] { return bootstrap_of(sub, 1) == Bootstrap::kCold; }));
  p.send(8);
  EXPECT_TRACE(sink, 1u, "7 8");
  EXPECT_EQ(settled(sub, 1, 2).resets, 0u);
}

TEST(KvSubscriberBootstrap, APeersInventorySeedsTheViewAndItsCopiesAreDropped) {
  ScriptedPublisher p(false);
  SeedingSink sink(10);  // a peer's inventory covers batches 0..10
  SubscriberOptions o = fast_options();
  o.seed = true;
  Subscriber sub(o, sink);
  sub.set_sources({spec_for(1, p)});
  sub.start();
  ASSERT_TRUE(p.wait_subscription());
  ASSERT_TRUE(wait_until([&] { return bootstrap_of(sub, 1) == Bootstrap::kPeer; }));
  EXPECT_EQ(sink.asked(), 1);
  // Batches the inventory covered arrive live as well (in flight when it was taken): dropped,
  // neither delivered again nor taken for a restart.
  for (uint64_t q : {9, 10, 11, 12}) p.send(q);
  EXPECT_TRACE(sink, 1u, "11 12");
  const SourceStatus st = settled(sub, 1, 2);
  EXPECT_EQ(st.resets, 0u);
  EXPECT_EQ(st.gaps, 0u);
  EXPECT_EQ(sink.asked(), 1) << "asked once per view";
}

TEST(KvSubscriberBootstrap, TheEnginesReplayIsAskedFirstThenAPeer) {
  ScriptedPublisher p(true);
  SeedingSink sink(8);
  SubscriberOptions o = fast_options();
  o.seed = true;
  Subscriber sub(o, sink);
  sub.set_sources({spec_for(1, p)});
  sub.start();
  ASSERT_TRUE(p.wait_subscription());
  p.send(9);
  auto req = p.replay_request();
  ASSERT_TRUE(req);
  EXPECT_EQ(req->second, 0u);
  EXPECT_EQ(sink.asked(), 0) << "the peers are asked only when the engine cannot tell";
  for (uint64_t q : {6, 7, 8, 9}) p.reply(req->first, q);  // batch 0 is gone
  p.reply_end(req->first);
  // The peer's inventory covers 0..8: the held live batch 9 continues it.
  EXPECT_TRACE(sink, 1u, "9");
  ASSERT_TRUE(wait_until([&] { return bootstrap_of(sub, 1) == Bootstrap::kPeer; }));
  EXPECT_EQ(sink.asked(), 1);
  p.send(10);
  EXPECT_TRACE(sink, 1u, "9 10");
}

TEST(KvSubscriberBootstrap, NoPeerToSeedItAndNoReplayIsCold) {
  ScriptedPublisher p(false);
  SeedingSink sink(std::nullopt);  // no warm peer
  SubscriberOptions o = fast_options();
  o.seed = true;
  Subscriber sub(o, sink);
  sub.set_sources({spec_for(1, p)});
  sub.start();
  ASSERT_TRUE(p.wait_subscription());
  ASSERT_TRUE(wait_until([&] { return sink.asked() == 1; }));
  p.send(4);
  EXPECT_TRACE(sink, 1u, "4");
  ASSERT_TRUE(wait_until([&] { return bootstrap_of(sub, 1) == Bootstrap::kCold; }));
}

TEST(KvSubscriberBootstrap, ADisconnectBeginsANewViewThatIsDecidedAgain) {
  ScriptedPublisher p(false);
  RecordingSink sink;
  Subscriber sub(fast_options(), sink);
  sub.set_sources({spec_for(1, p)});
  sub.start();
  ASSERT_TRUE(p.wait_subscription());
  p.send(0);
  ASSERT_TRUE(wait_until([&] { return bootstrap_of(sub, 1) == Bootstrap::kLive; }));
  p.close_pub();
  ASSERT_TRUE(wait_until([&] { return bootstrap_of(sub, 1) == Bootstrap::kPending; }));
  p.reopen_pub();
  ASSERT_EQ(p.wait_subscription(), "kv");
  p.send(3);  // the engine went on meanwhile: its view now begins mid-stream
  EXPECT_TRACE(sink, 1u, "0 reset:disconnected 3");
  ASSERT_TRUE(wait_until([&] { return bootstrap_of(sub, 1) == Bootstrap::kCold; }));
}

TEST(KvSubscriber, StopJoinsPromptlyAndNoSinkCallFollows) {
  ScriptedPublisher p(true);
  RecordingSink sink;
  SubscriberOptions o = fast_options();
  o.replay_timeout = 60s;
  auto sub = std::make_unique<Subscriber>(o, sink);
  sub->set_sources({spec_for(1, p)});
  sub->start();
  ASSERT_TRUE(p.wait_subscription());
  for (uint64_t q : {0, 2}) p.send(q);
  auto req = p.replay_request();
  ASSERT_TRUE(req) << "a replay is pending, with a long timeout";

  const auto t0 = std::chrono::steady_clock::now();
  sub->stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s) << "stop waits for no replay timeout";
  sink.close();
  // Everything that would make the thread call the sink, were it still running.
  p.reply(req->first, 1);
  p.reply_end(req->first);
  for (uint64_t q = 3; q < 50; ++q) p.send(q);
  sub->set_sources({});
  sub->stop();  // again: a no-op
  EXPECT_EQ(sub->status().size(), 0u);
  sub.reset();
  EXPECT_EQ(sink.after_close(), 0);
  EXPECT_EQ(sink.trace(1), "0");
}

// What the Python publisher sends for `seq` (see tests/tools/sglang_kv_publisher.py), derived here
// independently; block ids through kvgate's SGLang hash, which the script computes with hashlib.
void expect_sglang_batch(uint64_t seq, const EventBatch& b) {
  SCOPED_TRACE("seq " + std::to_string(seq));
  EXPECT_EQ(b.dp_rank, 2);
  EXPECT_GT(b.ts, 1.7e9);
  EXPECT_EQ(b.skipped_events, 0u);
  const auto s = static_cast<int32_t>(seq);
  auto chain = [](const std::vector<int32_t>& tokens) {
    std::vector<uint64_t> ids;
    Digest d{};
    for (size_t i = 0; i + 4 <= tokens.size(); i += 4) {
      d = sglang_page_digest(ids.empty() ? nullptr : &d, std::span(tokens).subspan(i, 4));
      ids.push_back(sglang_block_id(d));
    }
    return ids;
  };
  switch (seq % 5) {
    case 0: {
      ASSERT_EQ(b.events.size(), 1u);
      const auto* e = std::get_if<BlockStored>(&b.events[0]);
      ASSERT_NE(e, nullptr);
      std::vector<int32_t> tokens(8);
      for (int32_t i = 0; i < 8; ++i) tokens[i] = s * 8 + i;
      EXPECT_EQ(e->token_ids, tokens);
      EXPECT_EQ(e->block_hashes, chain(tokens));
      EXPECT_FALSE(e->parent_block_hash);
      EXPECT_EQ(e->block_size, 4);
      EXPECT_FALSE(e->lora_id);
      EXPECT_EQ(e->medium, Medium::kGpu);
      // The trailing metadata map ({"cache_salt": ...}) must not break the event; whether the
      // decoder keeps the salt is events_test's business.
      break;
    }
    case 1: {
      ASSERT_EQ(b.events.size(), 1u);
      const auto* e = std::get_if<BlockStored>(&b.events[0]);
      ASSERT_NE(e, nullptr);
      std::vector<int32_t> tokens(4);
      for (int32_t i = 0; i < 4; ++i) tokens[i] = s * 4 + i;
      EXPECT_EQ(e->token_ids, tokens);
      EXPECT_EQ(e->block_hashes, chain(tokens));
      EXPECT_EQ(e->parent_block_hash, static_cast<uint64_t>(-(1000 + int64_t{s})));
      EXPECT_EQ(e->lora_id, 7);
      EXPECT_EQ(e->medium, Medium::kNone);
      break;
    }
    case 2: {
      ASSERT_EQ(b.events.size(), 1u);
      const auto* e = std::get_if<BlockRemoved>(&b.events[0]);
      ASSERT_NE(e, nullptr);
      EXPECT_EQ(e->block_hashes, (std::vector<uint64_t>{seq, static_cast<uint64_t>(-int64_t{s})}));
      EXPECT_EQ(e->medium, Medium::kCpuPinned);
      break;
    }
    case 3:
      ASSERT_EQ(b.events.size(), 1u);
      EXPECT_TRUE(std::holds_alternative<AllBlocksCleared>(b.events[0]));
      break;
    default:
      EXPECT_TRUE(b.events.empty()) << "a snapshot barrier carries no events";
  }
}

// The words after `key` on the line of the log that starts with it ("" until it is there).
std::string log_line(const testing::Process& p, const std::string& key) {
  std::istringstream in(p.log());
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with(key + " ")) return line.substr(key.size() + 1);
  }
  return "";
}

TEST(KvSubscriber, SglangShapedPublisherFromPython) {
  const std::string python = "/usr/bin/python3";
  ASSERT_TRUE(std::filesystem::exists(python)) << "Debian's python3 is needed (scripts/setup)";
  auto probe = testing::run(python, {"-c", "import zmq, msgpack"});
  ASSERT_EQ(probe.status, 0) << "python3-zmq and python3-msgpack are needed (scripts/setup): "
                             << probe.output;

  testing::TempDir dir;
  const std::string go = dir / "go";
  testing::Process py(
      python, {std::string(KVGATE_SOURCE_DIR) + "/tests/tools/sglang_kv_publisher.py", "--topic",
               "kv-test", "--rank", "2", "--go-file", go, "--max-seconds", "60"});
  ASSERT_TRUE(wait_until([&] { return !log_line(py, "ready").empty(); }, 20s)) << py.log();
  std::istringstream ready(log_line(py, "ready"));
  std::string pub_word, replay_word;
  ready >> pub_word >> replay_word;
  ASSERT_TRUE(pub_word.starts_with("pub=") && replay_word.starts_with("replay=")) << py.log();

  RecordingSink sink;
  Subscriber sub(fast_options(), sink);
  SourceSpec s;
  s.id = 9;
  s.rank = 2;
  s.pub = pub_word.substr(4);
  s.replay = replay_word.substr(7);
  s.topic = "kv-test";  // a prefix of the epoch-suffixed topic SGLang sends
  sub.set_sources({s});
  sub.start();
  ASSERT_TRUE(wait_until([&] { return sink.count(9) > 0; }, 20s)) << py.log();
  dir.write("go", "");

  ASSERT_TRUE(wait_until([&] { return !log_line(py, "last").empty(); }, 20s)) << py.log();
  const uint64_t last = std::stoull(log_line(py, "last"));
  ASSERT_TRUE(wait_until([&] { return status_of(sub, 9).last_seq == last; }, 20s))
      << sink.trace(9) << "\n"
      << py.log();
  sub.stop();

  const auto batches = sink.batches(9);
  ASSERT_FALSE(batches.empty());
  const uint64_t first = batches.front().first;
  ASSERT_EQ(batches.size(), last - first + 1) << "every batch once: " << sink.trace(9);
  for (size_t i = 0; i < batches.size(); ++i) {
    ASSERT_EQ(batches[i].first, first + i) << sink.trace(9);
    expect_sglang_batch(batches[i].first, batches[i].second);
  }
  const SourceStatus st = status_of(sub, 9);
  // Two gaps (two skipped, then one); one when the first replay, served late, already held the
  // third skipped batch.
  EXPECT_GE(st.gaps, 1u) << "skipped: " << log_line(py, "skip");
  EXPECT_LE(st.gaps, 2u) << "skipped: " << log_line(py, "skip");
  EXPECT_GE(st.replayed, 3u) << "the three skipped batches came through the Python ROUTER";
  EXPECT_EQ(st.resets, 0u);
  EXPECT_EQ(st.decode_errors, 0u);
}

}  // namespace
}  // namespace kvgate::kv
