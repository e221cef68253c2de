// kv/subscriber: see subscriber.h.
//
// Threading: everything below Impl::sources (sockets, sequences, held batches) belongs to the
// subscriber's thread while it runs and to the owner's thread while it is stopped (start() and
// join() order the two). The caller-facing state (the wanted sources, the stop flag, the published
// status) sits under Impl::mu; the thread copies a source's status there after each change, so
// status() never touches a socket. set_sources and stop wake the thread through an inproc PAIR,
// whose sending end is used under mu (a ZMQ socket is not thread-safe).
#include "kv/subscriber.h"

#include <zmq.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <zmq.hpp>

#include "util/log.h"

namespace kvgate::kv {

std::string_view to_string(Bootstrap b) {
  switch (b) {
    case Bootstrap::kPending:
      return "pending";
    case Bootstrap::kLive:
      return "live";
    case Bootstrap::kEngineReplay:
      return "engine_replay";
    case Bootstrap::kPeer:
      return "peer";
    case Bootstrap::kCold:
      return "cold";
  }
  return "pending";
}

std::string_view to_string(ResetReason r) {
  switch (r) {
    case ResetReason::kGapNoReplay:
      return "gap_no_replay";
    case ResetReason::kReplayFailed:
      return "replay_failed";
    case ResetReason::kRestart:
      return "restart";
    case ResetReason::kRemoved:
      return "removed";
    case ResetReason::kDisconnected:
      return "disconnected";
  }
  return "unknown";
}

namespace {

using Clock = std::chrono::steady_clock;

// Messages read from one socket per poll round, so that one busy source cannot starve the others
// (or a stop request) for long.
constexpr int kBurst = 512;
// Frames kept of one message: a valid one has 3 ([topic, seq, payload] live, [empty, seq,
// payload] from a replay); the rest of a longer one is read and dropped, so that a hostile
// publisher cannot make us hold an unbounded frame list.
constexpr size_t kMaxFrames = 4;

constexpr std::string_view kEpochMarker{"\0sgl-kv-epoch=", 14};

// The epoch of a topic frame ("" when it carries none): the text after the marker up to the next
// NUL, so that a snapshot barrier's "\0sgl-kv-snapshot=<id>" suffix does not count as a new epoch.
std::string_view epoch_of(std::string_view topic) {
  size_t at = topic.find(kEpochMarker);
  if (at == std::string_view::npos) return {};
  std::string_view rest = topic.substr(at + kEpochMarker.size());
  return rest.substr(0, rest.find('\0'));
}

// Reads one multipart message without waiting; false when none is queued (or the socket failed,
// which the next poll reports again). `total` counts every frame, kept or not.
bool recv_message(zmq::socket_t& s, std::vector<zmq::message_t>& frames, size_t& total) {
  frames.clear();
  total = 0;
  try {
    for (;;) {
      zmq::message_t msg;
      auto got = s.recv(msg, total == 0 ? zmq::recv_flags::dontwait : zmq::recv_flags::none);
      if (!got) return false;
      ++total;
      const bool more = msg.more();
      if (frames.size() < kMaxFrames) frames.push_back(std::move(msg));
      if (!more) return true;
    }
  } catch (const zmq::error_t& e) {
    static log::RateLimit limit(5, std::chrono::seconds(10));
    log::warn(limit, "kv events: receive failed").kv("error", e.what());
    return false;
  }
}

std::string_view view(const zmq::message_t& m) {
  return {static_cast<const char*>(m.data()), m.size()};
}

// IPv6 literals need the option on the socket before connect (as the publisher does for bind).
void allow_ipv6(zmq::socket_t& s, const std::string& endpoint) {
  if (endpoint.find('[') != std::string::npos) s.set(zmq::sockopt::ipv6, 1);
}

}  // namespace

struct Subscriber::Impl {
  // A batch of the live stream held while its source replays. `ok` false: its payload did not
  // decode; it still takes its place in the sequence.
  struct Held {
    bool ok = false;
    EventBatch batch;
  };

  struct Source {
    SourceSpec spec;
    zmq::socket_t sub;
    zmq::socket_t monitor;  // PAIR reading the SUB's socket monitor
    zmq::socket_t dealer;   // open only while a replay runs: a fresh one per replay, so that the
                            // tail of a failed replay can never be read as part of the next one
    SourceStatus status;
    bool ever_connected = false;

    bool have_seq = false;  // false: the next message is taken as it is
    // The view has not begun yet: the first delivery (or the replay from 0) decides how.
    bool bootstrapping = true;
    bool delivered = false;   // some batch was delivered since the bootstrap began
    bool seed_asked = false;  // the sink was asked to seed this view (EventSink::seed)
    uint64_t next = 0;        // the sequence number expected next
    std::string epoch;        // the publisher lifetime the sequence belongs to ("" unknown)

    bool replaying = false;
    uint64_t replay_from = 0;  // the start asked of the replay
    uint64_t gap_seq = 0;      // the live sequence that revealed the gap: the replay must reach it
    Clock::time_point deadline;
    std::map<uint64_t, Held> held;  // live batches that arrived during the replay, by sequence
    // After a replay the live stream may still bring batches the replay delivered (the replay
    // travels on its own connection and can overtake it): a live sequence from here to `next` is
    // such a late copy, not a restart, until the live stream reaches `next`.
    std::optional<uint64_t> late_from;
  };

  enum class Slot : uint8_t { kSub, kMonitor, kDealer };

  Impl(SubscriberOptions o, EventSink& s) : options(o), sink(s) {
    wake_rx = zmq::socket_t(ctx, zmq::socket_type::pair);
    wake_tx = zmq::socket_t(ctx, zmq::socket_type::pair);
    wake_rx.set(zmq::sockopt::linger, 0);
    wake_tx.set(zmq::sockopt::linger, 0);
    wake_rx.bind("inproc://kvgate-subscriber-wake");
    wake_tx.connect("inproc://kvgate-subscriber-wake");
  }

  ~Impl() {
    // Sockets close before the context (member order), each with linger 0: nothing to flush.
    for (auto& [id, s] : sources) close(*s);
  }

  SubscriberOptions options;
  EventSink& sink;
  zmq::context_t ctx{1};
  zmq::socket_t wake_rx;  // the thread's
  zmq::socket_t wake_tx;  // under mu
  uint64_t monitors = 0;  // names the monitors' inproc endpoints (one context per subscriber)

  mutable std::mutex mu;
  std::vector<SourceSpec> wanted;  // the last set_sources, one spec per id, by id
  bool changed = false;            // `wanted` not applied yet
  bool stopping = false;
  std::map<SourceId, std::pair<SourceSpec, SourceStatus>> published;

  std::thread thread;
  std::map<SourceId, std::unique_ptr<Source>> sources;

  // The thread's scratch space, kept to avoid allocating per message.
  std::vector<zmq::message_t> frames;
  std::vector<zmq_pollitem_t> items;
  std::vector<std::pair<Source*, Slot>> slots;
  Message msg;

  void wake() {
    // Never waits: a full pipe means a wake-up is already pending.
    (void)wake_tx.send(zmq::const_buffer(nullptr, 0), zmq::send_flags::dontwait);
  }

  void run();
  std::chrono::milliseconds poll_timeout() const;
  void apply(const std::vector<SourceSpec>& want);
  void open(const SourceSpec& spec);
  void close(Source& s);
  void publish(const Source& s);

  void read_monitor(Source& s);
  void read_live(Source& s);
  void read_replay(Source& s);
  void take_live(Source& s, uint64_t seq, Held h, std::string_view topic);
  void accept(Source& s, uint64_t seq, Held& h, bool from_held);
  void deliver(Source& s, uint64_t seq, const Held& h, bool replayed);
  void reset(Source& s, ResetReason why);
  void start_replay(Source& s, uint64_t seq, Held&& h);
  // A new view of the source begins: `replay` asks for every batch from 0 first when it can.
  void begin_bootstrap(Source& s, bool replay);
  void end_bootstrap(Source& s, Bootstrap how);
  // Asks the sink to seed a view that is beginning, once (options.seed); whether it did.
  bool maybe_seed(Source& s, bool after_replay = false);
  void end_replay(Source& s, bool failed, std::string_view why);
  void abort_replay(Source& s);
  void drain_held(Source& s);
};

void Subscriber::Impl::run() {
  for (;;) {
    std::optional<std::vector<SourceSpec>> want;
    {
      std::lock_guard lock(mu);
      if (stopping) break;
      if (changed) {
        want = wanted;
        changed = false;
      }
    }
    if (want) apply(*want);

    items.clear();
    slots.clear();
    items.push_back({wake_rx.handle(), 0, ZMQ_POLLIN, 0});
    slots.emplace_back(nullptr, Slot::kSub);
    for (auto& [id, sp] : sources) {
      Source& s = *sp;
      if (!s.sub) continue;  // could not be opened
      items.push_back({s.sub.handle(), 0, ZMQ_POLLIN, 0});
      slots.emplace_back(&s, Slot::kSub);
      items.push_back({s.monitor.handle(), 0, ZMQ_POLLIN, 0});
      slots.emplace_back(&s, Slot::kMonitor);
      if (s.replaying) {
        items.push_back({s.dealer.handle(), 0, ZMQ_POLLIN, 0});
        slots.emplace_back(&s, Slot::kDealer);
      }
    }
    try {
      zmq::poll(items, poll_timeout());
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      // Nothing else is expected (the context is never shut down under the thread); log it and go
      // on rather than lose the event plane.
      static log::RateLimit limit(5, std::chrono::seconds(10));
      log::error(limit, "kv events: poll failed").kv("error", e.what());
      continue;
    }

    if (items[0].revents & ZMQ_POLLIN) {
      size_t n = 0;
      while (recv_message(wake_rx, frames, n)) {
      }
    }
    for (size_t i = 1; i < items.size(); ++i) {
      if (!(items[i].revents & ZMQ_POLLIN)) continue;
      auto [s, slot] = slots[i];
      switch (slot) {
        case Slot::kSub:
          read_live(*s);
          break;
        case Slot::kMonitor:
          read_monitor(*s);
          break;
        case Slot::kDealer:
          // A replay that ended while reading live messages closed its dealer already.
          if (s->replaying) read_replay(*s);
          break;
      }
    }
    const auto now = Clock::now();
    for (auto& [id, s] : sources) {
      if (s->replaying && now >= s->deadline) end_replay(*s, true, "timeout");
    }
  }
}

std::chrono::milliseconds Subscriber::Impl::poll_timeout() const {
  std::optional<Clock::time_point> first;
  for (const auto& [id, s] : sources) {
    if (s->replaying && (!first || s->deadline < *first)) first = s->deadline;
  }
  if (!first) return std::chrono::milliseconds(-1);  // nothing to time out: sleep until woken
  auto left = std::chrono::ceil<std::chrono::milliseconds>(*first - Clock::now());
  return std::max(left, std::chrono::milliseconds(0));
}

void Subscriber::Impl::apply(const std::vector<SourceSpec>& want) {
  for (auto it = sources.begin(); it != sources.end();) {
    auto w = std::lower_bound(want.begin(), want.end(), it->first,
                              [](const SourceSpec& a, SourceId id) { return a.id < id; });
    if (w != want.end() && w->id == it->first && *w == it->second->spec) {
      ++it;
      continue;
    }
    const SourceId id = it->first;
    close(*it->second);
    it = sources.erase(it);
    {
      std::lock_guard lock(mu);
      published.erase(id);
    }
    log::info("kv events: source removed").kv("source", id);
    sink.on_reset(id, ResetReason::kRemoved);
  }
  for (const auto& spec : want) {
    if (!sources.contains(spec.id)) open(spec);
  }
}

void Subscriber::Impl::open(const SourceSpec& spec) {
  auto src = std::make_unique<Source>();
  Source& s = *src;
  s.spec = spec;
  begin_bootstrap(s, true);
  try {
    s.sub = zmq::socket_t(ctx, zmq::socket_type::sub);
    s.sub.set(zmq::sockopt::linger, 0);
    s.sub.set(zmq::sockopt::rcvhwm, options.rcvhwm);
    s.sub.set(zmq::sockopt::reconnect_ivl, static_cast<int>(options.reconnect_min.count()));
    s.sub.set(zmq::sockopt::reconnect_ivl_max, static_cast<int>(options.reconnect_max.count()));
    // The monitor first, and its reader connected before the SUB connects: inproc drops what is
    // sent before the reader is there, and the first CONNECTED must not be lost.
    const std::string mon = "inproc://kvgate-subscriber-monitor-" + std::to_string(++monitors);
    if (zmq_socket_monitor(s.sub.handle(), mon.c_str(),
                           ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED) != 0) {
      throw zmq::error_t();
    }
    s.monitor = zmq::socket_t(ctx, zmq::socket_type::pair);
    s.monitor.set(zmq::sockopt::linger, 0);
    s.monitor.connect(mon);
    s.sub.set(zmq::sockopt::subscribe, spec.topic);
    allow_ipv6(s.sub, spec.pub);
    s.sub.connect(spec.pub);
    log::info("kv events: source added")
        .kv("source", spec.id)
        .kv("worker", spec.endpoint)
        .kv("rank", spec.rank)
        .kv("pub", spec.pub)
        .kv("replay", spec.replay.empty() ? std::string("none") : spec.replay);
  } catch (const zmq::error_t& e) {
    // An endpoint libzmq rejects (or an option it refuses): the source is kept without sockets,
    // never connected (its status shows it), so that the set stays what the caller asked for and
    // a corrected spec replaces it as a change.
    close(s);
    log::error("kv events: cannot subscribe")
        .kv("source", spec.id)
        .kv("pub", spec.pub)
        .kv("error", e.what());
  }
  {
    std::lock_guard lock(mu);
    published[spec.id] = {spec, s.status};
  }
  sources.emplace(spec.id, std::move(src));
}

void Subscriber::Impl::close(Source& s) {
  abort_replay(s);
  if (s.sub) {
    (void)zmq_socket_monitor(s.sub.handle(), nullptr, 0);
    s.sub.close();
  }
  s.monitor.close();
}

void Subscriber::Impl::publish(const Source& s) {
  // The spec went in when the source opened; only the counters change after.
  std::lock_guard lock(mu);
  published[s.spec.id].second = s.status;
}

void Subscriber::Impl::read_monitor(Source& s) {
  size_t total = 0;
  bool any = false;
  while (recv_message(s.monitor, frames, total)) {
    // libzmq's monitor message: [uint16 event, uint32 value] in native order, then the endpoint.
    if (frames.empty() || frames[0].size() < 6) continue;
    uint16_t event = 0;
    std::memcpy(&event, frames[0].data(), sizeof event);
    if (event == ZMQ_EVENT_CONNECTED) {
      if (s.ever_connected) ++s.status.reconnects;
      s.ever_connected = true;
      s.status.connected = true;
      s.status.connected_since = std::chrono::system_clock::now();
      any = true;
      maybe_seed(s);
    } else if (event == ZMQ_EVENT_DISCONNECTED) {
      bool was = s.status.connected;
      s.status.connected = false;
      any = true;
      log::info("kv events: publisher disconnected").kv("source", s.spec.id).kv("pub", s.spec.pub);
      // Never route on what a publisher that went away held: it may come back empty (an engine
      // restart) with nothing in its sequence to say so before its first new event.
      if (was) {
        if (s.replaying) abort_replay(s);
        reset(s, ResetReason::kDisconnected);
      }
    }
  }
  if (any) publish(s);
}

void Subscriber::Impl::read_live(Source& s) {
  size_t total = 0;
  for (int i = 0; i < kBurst && recv_message(s.sub, frames, total); ++i) {
    std::string_view views[kMaxFrames];
    for (size_t f = 0; f < frames.size(); ++f) views[f] = view(frames[f]);
    DecodeStatus st = total > kMaxFrames ? DecodeStatus{DecodeError::kFrameCount, "frames", 0}
                                         : decode_message(std::span(views, frames.size()), msg);
    if (st.ok() || st.error > DecodeError::kSequenceSize) {
      // The sequence frame was read: the batch takes its place even when its payload is bad.
      if (!st.ok()) {
        ++s.status.decode_errors;
        static log::RateLimit limit(5, std::chrono::seconds(10));
        log::warn(limit, "kv events: malformed batch skipped")
            .kv("source", s.spec.id)
            .kv("seq", msg.seq)
            .kv("error", st.message());
      }
      take_live(s, msg.seq, Held{st.ok(), std::move(msg.batch)}, views[0]);
    } else {
      ++s.status.decode_errors;
      static log::RateLimit limit(5, std::chrono::seconds(10));
      log::warn(limit, "kv events: malformed message skipped")
          .kv("source", s.spec.id)
          .kv("frames", total)
          .kv("error", st.message());
    }
  }
  publish(s);  // once per burst: status() readers need not see every message
}

void Subscriber::Impl::take_live(Source& s, uint64_t seq, Held h, std::string_view topic) {
  maybe_seed(s);  // (a batch read before the monitor said connected)
  if (std::string_view ep = epoch_of(topic); !ep.empty() && ep != s.epoch) {
    // (A source still waiting for its first batch has nothing of the old lifetime to forget.)
    const bool restarted = !s.epoch.empty() && s.have_seq && !(s.bootstrapping && !s.delivered);
    s.epoch.assign(ep);
    if (restarted) {
      // A new publisher lifetime: nothing before this batch is continuous with it, and whatever a
      // replay in progress or the held batches would bring belongs to the old one.
      abort_replay(s);
      reset(s, ResetReason::kRestart);
      deliver(s, seq, h, false);
      return;
    }
  }
  if (!s.replaying) {
    accept(s, seq, h, false);
    return;
  }
  if (seq < s.replay_from) {
    // The sequence went back under the replay: the publisher restarted meanwhile.
    abort_replay(s);
    reset(s, ResetReason::kRestart);
    deliver(s, seq, h, false);
    return;
  }
  s.held.try_emplace(seq, std::move(h));
  if (s.held.size() > options.max_held) end_replay(s, true, "too many batches held");
}

void Subscriber::Impl::accept(Source& s, uint64_t seq, Held& h, bool from_held) {
  if (s.have_seq && seq < s.next) {
    if (from_held || (s.late_from && seq >= *s.late_from)) return;  // the replay delivered it
  } else if (!from_held) {
    s.late_from.reset();  // the live stream caught up: a lower sequence now is a restart
  }
  if (!s.have_seq || seq == s.next) {
    deliver(s, seq, h, false);
    return;
  }
  if (seq < s.next) {
    reset(s, ResetReason::kRestart);
    deliver(s, seq, h, false);
    return;
  }
  if (!s.bootstrapping) ++s.status.gaps;  // (the first batch of a bootstrap is not a gap)
  if (s.spec.replay.empty()) {
    reset(s, ResetReason::kGapNoReplay);
    deliver(s, seq, h, false);
    return;
  }
  start_replay(s, seq, std::move(h));
}

void Subscriber::Impl::begin_bootstrap(Source& s, bool replay) {
  s.bootstrapping = true;
  s.delivered = false;
  s.seed_asked = false;
  s.status.bootstrap = Bootstrap::kPending;
  // With a replay endpoint, batch 0 is what comes next: a later first batch is a gap, filled
  // from the replay (the whole history, when the publisher still buffers it).
  s.have_seq = replay && options.bootstrap_replay && !s.spec.replay.empty();
  s.next = 0;
}

bool Subscriber::Impl::maybe_seed(Source& s, bool after_replay) {
  if (!options.seed || !s.bootstrapping || s.delivered || s.seed_asked || s.replaying) return false;
  // A source whose publisher replays is asked for its history first; the sink only when that
  // fails (after_replay).
  if (!after_replay && options.bootstrap_replay && !s.spec.replay.empty()) return false;
  s.seed_asked = true;
  std::optional<uint64_t> seq = sink.seed(s.spec.id);
  if (!seq) return false;
  // Complete up to *seq: the stream goes on from the next batch; what the live stream brings at
  // or below it is a copy (late_from 0: dropped, not a restart).
  s.have_seq = true;
  s.next = *seq + 1;
  s.late_from = 0;
  end_bootstrap(s, Bootstrap::kPeer);
  log::info("kv events: source seeded from a peer's inventory")
      .kv("source", s.spec.id)
      .kv("seq", *seq);
  publish(s);
  return true;
}

void Subscriber::Impl::end_bootstrap(Source& s, Bootstrap how) {
  s.bootstrapping = false;
  s.status.bootstrap = how;
  s.status.bootstrap_at = std::chrono::system_clock::now();
  if (how == Bootstrap::kCold) {
    log::info("kv events: source began mid-stream; what its engine stored before is unknown")
        .kv("source", s.spec.id)
        .kv("worker", s.spec.endpoint)
        .kv("rank", s.spec.rank);
  }
}

void Subscriber::Impl::deliver(Source& s, uint64_t seq, const Held& h, bool replayed) {
  s.have_seq = true;
  s.next = seq + 1;
  // The first batch decides how the view began, unless a replay from 0 is running (its end does).
  if (s.bootstrapping && !(replayed && s.replaying)) {
    end_bootstrap(s, seq == 0 ? Bootstrap::kLive : Bootstrap::kCold);
  }
  s.delivered = true;
  if (!h.ok) return;  // counted where it was read; it only holds its place
  sink.on_batch(s.spec.id, seq, h.batch);
  ++s.status.messages;
  if (replayed) ++s.status.replayed;
  s.status.last_seq = seq;
  s.status.last_message = std::chrono::system_clock::now();
}

void Subscriber::Impl::reset(Source& s, ResetReason why) {
  // A new view begins. After a disconnect the next batch comes from a publisher that may have
  // restarted (its first batches lost to the reconnect): its history is asked for again.
  begin_bootstrap(s, why == ResetReason::kDisconnected);
  s.late_from.reset();
  ++s.status.resets;
  log::info("kv events: source reset")
      .kv("source", s.spec.id)
      .kv("reason", to_string(why))
      .kv("next", s.next);
  sink.on_reset(s.spec.id, why);
  publish(s);
}

void Subscriber::Impl::start_replay(Source& s, uint64_t seq, Held&& h) {
  s.replaying = true;
  s.replay_from = s.next;
  s.gap_seq = seq;
  s.deadline = Clock::now() + options.replay_timeout;
  s.held.try_emplace(seq, std::move(h));
  log::info("kv events: sequence gap, replaying")
      .kv("source", s.spec.id)
      .kv("from", s.replay_from)
      .kv("to", seq);
  try {
    s.dealer = zmq::socket_t(ctx, zmq::socket_type::dealer);
    s.dealer.set(zmq::sockopt::linger, 0);
    // The publisher streams its whole buffer at once; its ROUTER drops what our pipe refuses.
    s.dealer.set(zmq::sockopt::rcvhwm, options.rcvhwm);
    allow_ipv6(s.dealer, s.spec.replay);
    s.dealer.connect(s.spec.replay);
    // [empty delimiter, start seq]: the ROUTER sees [identity, "", start] as the engines expect.
    // Queued until the connection is up; the deadline covers a replay endpoint that never is.
    const std::string start = encode_sequence(s.replay_from);
    const auto more = zmq::send_flags::sndmore | zmq::send_flags::dontwait;
    if (!s.dealer.send(zmq::const_buffer(nullptr, 0), more) ||
        !s.dealer.send(zmq::const_buffer(start.data(), start.size()), zmq::send_flags::dontwait)) {
      end_replay(s, true, "cannot queue the request");
    }
  } catch (const zmq::error_t& e) {
    end_replay(s, true, e.what());
  }
}

void Subscriber::Impl::read_replay(Source& s) {
  size_t total = 0;
  for (int i = 0; i < kBurst && s.replaying && recv_message(s.dealer, frames, total); ++i) {
    uint64_t seq = 0;
    if (total != 3 || !frames[0].empty() || !decode_sequence(view(frames[1]), seq)) {
      ++s.status.decode_errors;
      end_replay(s, true, "malformed reply");
      break;
    }
    if (seq == kReplayEnd) {
      // The publisher sent all it had: enough only if it reached the batch that showed the gap.
      const bool filled = s.next >= s.gap_seq;
      end_replay(s, !filled, filled ? "" : "ended before the gap was filled");
      break;
    }
    if (seq < s.next) continue;  // delivered already
    if (seq > s.next) {
      end_replay(s, true, "batches no longer buffered by the publisher");
      break;
    }
    Held h;
    DecodeStatus st = decode_batch(view(frames[2]), h.batch);
    h.ok = st.ok();
    if (!h.ok) {
      ++s.status.decode_errors;
      static log::RateLimit limit(5, std::chrono::seconds(10));
      log::warn(limit, "kv events: malformed replayed batch skipped")
          .kv("source", s.spec.id)
          .kv("seq", seq)
          .kv("error", st.message());
    }
    deliver(s, seq, h, true);
  }
  publish(s);
}

void Subscriber::Impl::end_replay(Source& s, bool failed, std::string_view why) {
  s.dealer.close();
  s.replaying = false;
  if (!failed) s.late_from = s.replay_from;
  if (s.bootstrapping) {
    if (!failed) {
      end_bootstrap(s, Bootstrap::kEngineReplay);
      log::info("kv events: source bootstrapped from its publisher's replay")
          .kv("source", s.spec.id)
          .kv("batches", s.next);
    } else if (!s.delivered && maybe_seed(s, true)) {
      // Batch 0 is no longer buffered, but a peer's inventory covers up to a sequence: the held
      // live batches continue from there (older ones dropped as copies).
      drain_held(s);
      publish(s);
      return;
    } else if (!s.delivered) {
      // Batch 0 is no longer buffered: nothing was delivered, so nothing is reset; the held
      // live batches begin the view (cold).
      log::info("kv events: the publisher no longer buffers its history; starting mid-stream")
          .kv("source", s.spec.id)
          .kv("error", why);
      s.have_seq = false;
      drain_held(s);
      if (s.bootstrapping) end_bootstrap(s, Bootstrap::kCold);
      publish(s);
      return;
    }
  }
  if (failed) {
    log::warn("kv events: replay failed")
        .kv("source", s.spec.id)
        .kv("from", s.replay_from)
        .kv("to", s.gap_seq)
        .kv("reached", s.next)
        .kv("error", why);
    // The sink forgets the source; the held live batches then start it again, the first taken as
    // it is.
    reset(s, ResetReason::kReplayFailed);
  }
  drain_held(s);
  publish(s);
}

void Subscriber::Impl::abort_replay(Source& s) {
  s.dealer.close();
  s.replaying = false;
  s.held.clear();
}

void Subscriber::Impl::drain_held(Source& s) {
  // In sequence order; a new gap among them starts another replay, which keeps the rest held.
  while (!s.held.empty() && !s.replaying) {
    auto node = s.held.extract(s.held.begin());
    accept(s, node.key(), node.mapped(), true);
  }
}

Subscriber::Subscriber(SubscriberOptions options, EventSink& sink)
    : impl_(std::make_unique<Impl>(options, sink)) {}

Subscriber::~Subscriber() {
  stop();
}

void Subscriber::set_sources(std::vector<SourceSpec> sources) {
  // One spec per id, the last given; sorted by id for the thread's diff and for status().
  std::stable_sort(sources.begin(), sources.end(),
                   [](const SourceSpec& a, const SourceSpec& b) { return a.id < b.id; });
  std::vector<SourceSpec> unique;
  unique.reserve(sources.size());
  for (auto& s : sources) {
    if (!unique.empty() && unique.back().id == s.id) {
      unique.back() = std::move(s);
    } else {
      unique.push_back(std::move(s));
    }
  }
  std::lock_guard lock(impl_->mu);
  impl_->wanted = std::move(unique);
  impl_->changed = true;
  impl_->wake();
}

void Subscriber::start() {
  if (impl_->thread.joinable()) return;
  {
    std::lock_guard lock(impl_->mu);
    impl_->stopping = false;
  }
  impl_->thread = std::thread([this] { impl_->run(); });
}

void Subscriber::stop() {
  if (!impl_->thread.joinable()) return;
  {
    std::lock_guard lock(impl_->mu);
    impl_->stopping = true;
    impl_->wake();
  }
  impl_->thread.join();
}

std::vector<std::pair<SourceSpec, SourceStatus>> Subscriber::status() const {
  std::lock_guard lock(impl_->mu);
  std::vector<std::pair<SourceSpec, SourceStatus>> out;
  out.reserve(impl_->wanted.size());
  for (const auto& spec : impl_->wanted) {
    auto it = impl_->published.find(spec.id);
    const bool current = it != impl_->published.end() && it->second.first == spec;
    out.emplace_back(spec, current ? it->second.second : SourceStatus{});
  }
  return out;
}

}  // namespace kvgate::kv
