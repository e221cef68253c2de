// kv/subscriber: one pool's event plane. For every source (an endpoint's DP rank) a ZMQ SUB
// connected to the rank's publisher, all polled by one thread of the subscriber's own (never a
// request thread). Each message is decoded (kv/events) and handed, in sequence order, to the
// sink; the subscriber keeps the sequence per source:
//   - the next number: delivered;
//   - a gap: the missing batches are asked from the rank's replay endpoint (SGLang's ROUTER: a
//     DEALER sends [empty, start_seq], reads [empty, seq, payload]... until seq -1), delivered in
//     order, then live delivery resumes; with no replay endpoint, or when replay fails or times
//     out, the sink is told to reset the source (forget it) and it rebuilds from new events;
//   - a number below the expected one (the publisher restarted, its sequence back near 0): a
//     reset too, not a storm of gaps;
//   - the first message of a source: taken as it is (nothing before it is known).
// A malformed message is counted and skipped; it never stops the thread. Sockets reconnect by
// themselves with backoff (ZMQ_RECONNECT_IVL .. ZMQ_RECONNECT_IVL_MAX); a socket monitor reports
// connected / disconnected per source.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kv/events.h"
#include "kv/inventory.h"

namespace kvgate::kv {

struct SourceSpec {
  SourceId id = 0;
  std::string endpoint;  // the worker's URL, for logs and labels
  int rank = 0;          // DP rank
  std::string pub;       // "tcp://host:port" of the rank's publisher
  std::string replay;    // "tcp://host:port" of its replay socket; "" = none
  std::string topic;     // subscription prefix ("" = every topic)
  bool operator==(const SourceSpec&) const = default;
};

enum class ResetReason : uint8_t {
  kGapNoReplay,   // a gap and no replay endpoint
  kReplayFailed,  // a gap the replay could not fill (timeout, error, batches no longer buffered)
  kRestart,       // the sequence went back: the publisher restarted
  kRemoved,       // the source left (set_sources)
};
std::string_view to_string(ResetReason r);

// Called on the subscriber's thread, one call at a time.
class EventSink {
 public:
  virtual ~EventSink() = default;
  virtual void on_batch(SourceId source, uint64_t seq, const EventBatch& batch) = 0;
  virtual void on_reset(SourceId source, ResetReason why) = 0;
};

// Per-source counters and state, readable from any thread.
struct SourceStatus {
  bool connected = false;
  uint64_t last_seq = 0;                                    // valid when messages > 0
  uint64_t messages = 0;                                    // delivered batches
  uint64_t decode_errors = 0;                               // malformed messages skipped
  uint64_t gaps = 0;                                        // sequence gaps seen
  uint64_t replayed = 0;                                    // batches recovered through replay
  uint64_t resets = 0;                                      // on_reset calls (any reason)
  uint64_t reconnects = 0;                                  // connections after the first
  std::chrono::system_clock::time_point connected_since{};  // valid when connected
  std::chrono::system_clock::time_point last_message{};     // valid when messages > 0
};

struct SubscriberOptions {
  std::chrono::milliseconds reconnect_min{100};
  std::chrono::milliseconds reconnect_max{5000};
  std::chrono::milliseconds replay_timeout{2000};
  int rcvhwm = 100000;
};

class Subscriber {
 public:
  Subscriber(SubscriberOptions options, EventSink& sink);
  ~Subscriber();  // stops
  Subscriber(const Subscriber&) = delete;
  Subscriber& operator=(const Subscriber&) = delete;

  // Replaces the set of sources (any thread): new ones are connected, removed ones closed (their
  // sink gets on_reset(kRemoved)), unchanged ones kept with their sequence.
  void set_sources(std::vector<SourceSpec> sources);
  void start();
  void stop();  // joins the thread; no sink call after it returns
  std::vector<std::pair<SourceSpec, SourceStatus>> status() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvgate::kv
