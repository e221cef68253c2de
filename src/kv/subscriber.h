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
//   - the first message of a source (and the first after it reconnects): with a replay endpoint
//     and a sequence above 0, every batch from 0 is asked of the replay first, so a subscriber
//     that joins late (a kvgate restarted, another replica) knows what the engine stored before
//     it came (`bootstrap` engine_replay); sequence 0 needs nothing (live); otherwise, or when
//     the publisher no longer buffers batch 0, it is taken as it is and what came before is
//     unknown (cold: the owner should not trust it at once).
// A malformed message is counted and skipped; it never stops the thread. One whose sequence frame
// is readable but whose payload is not still takes its place in the sequence (no gap, no replay:
// a replay would return the same bytes). Sockets reconnect by themselves with backoff
// (ZMQ_RECONNECT_IVL .. ZMQ_RECONNECT_IVL_MAX); a socket monitor reports connected / disconnected
// per source.
//
// A replay runs inside the poll loop, never blocking it: the DEALER is one more polled socket,
// other sources keep flowing, and live batches of the replaying source are held (at most max_held,
// else the replay fails) and delivered after it, duplicates dropped; so are live copies of
// replayed batches that arrive after the replay (its connection can overtake the live one), until
// the live stream reaches the expected sequence. The replay fails when it times out
// (replay_timeout), when a batch is missing from it (the publisher's buffer no longer has it), or
// when it ends before the batch that revealed the gap.
//
// Newer SGLang appends "\0sgl-kv-epoch=<uuid>" to the topic, one uuid per publisher lifetime: an
// epoch that changes is a restart too, even when the sequence happens to look continuous.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
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
  // The publisher's connection dropped: what it held may be gone when it is back (an engine
  // restart loses its cache), so it is forgotten and rebuilt from its events after.
  kDisconnected,
};
std::string_view to_string(ResetReason r);

// How a source's view began (since it was added or last reset): whether it knows everything the
// engine stored before (live, engine_replay, peer) or only what came after (cold).
enum class Bootstrap : uint8_t {
  kPending,       // no batch delivered yet
  kLive,          // the stream was followed from sequence 0
  kEngineReplay,  // the publisher's replay gave every batch from 0
  kPeer,          // seeded by the owner (another replica's inventory) up to a sequence
  kCold,          // began mid-stream: what the engine stored before is unknown
};
std::string_view to_string(Bootstrap b);
inline bool complete(Bootstrap b) {
  return b == Bootstrap::kLive || b == Bootstrap::kEngineReplay || b == Bootstrap::kPeer;
}

// Called on the subscriber's thread, one call at a time; it must not throw.
class EventSink {
 public:
  virtual ~EventSink() = default;
  virtual void on_batch(SourceId source, uint64_t seq, const EventBatch& batch) = 0;
  virtual void on_reset(SourceId source, ResetReason why) = 0;
  // With SubscriberOptions::seed: a source's view is about to begin (it was added, or reset),
  // its publisher just connected. The sink may fill what the source holds from elsewhere (another
  // kvgate replica's inventory) and return the last sequence that covers; the live stream then
  // continues from the next one (older batches are dropped as copies). nullopt: not seeded (the
  // replay from 0, else mid-stream). It may block (bounded): the thread waits for it.
  virtual std::optional<uint64_t> seed(SourceId) { return std::nullopt; }
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
  Bootstrap bootstrap = Bootstrap::kPending;
  std::chrono::system_clock::time_point bootstrap_at{};  // when it was decided (not pending)
};

struct SubscriberOptions {
  std::chrono::milliseconds reconnect_min{100};
  std::chrono::milliseconds reconnect_max{5000};
  std::chrono::milliseconds replay_timeout{2000};
  int rcvhwm = 100000;
  size_t max_held = 10000;  // live batches held per source while its replay runs
  // Ask a new (or reconnected) source's replay for every batch from 0 (see above).
  bool bootstrap_replay = true;
  // Ask the sink to seed a view as it begins (EventSink::seed), before the replay from 0.
  bool seed = false;
};

class Subscriber {
 public:
  Subscriber(SubscriberOptions options, EventSink& sink);
  ~Subscriber();  // stops
  Subscriber(const Subscriber&) = delete;
  Subscriber& operator=(const Subscriber&) = delete;

  // Replaces the set of sources (any thread): new ones are connected, removed ones closed (their
  // sink gets on_reset(kRemoved)), unchanged ones kept with their sequence; a source whose spec
  // changed under the same id is removed and added. Of several specs with one id the last counts.
  // While stopped the set is only recorded; the thread applies it when it starts.
  void set_sources(std::vector<SourceSpec> sources);
  // start and stop are for the owner's thread (not concurrent with each other). A stopped
  // subscriber can start again: its sources kept their sockets and sequences.
  void start();
  void stop();  // joins the thread; no sink call after it returns
  // The sources last given to set_sources, by id; a source the thread has not opened yet shows a
  // default status.
  std::vector<std::pair<SourceSpec, SourceStatus>> status() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvgate::kv
