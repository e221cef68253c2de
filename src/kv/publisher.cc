// kv/publisher: see publisher.h.
#include "kv/publisher.h"

#include <msgpuck.h>
#include <zmq.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <deque>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>
#include <zmq.hpp>

#include "util/log.h"

namespace kvgate::kv {

struct Publisher::Impl {
  zmq::context_t ctx{1};
  zmq::socket_t pub;
  zmq::socket_t replay;    // owned by `thread` once it runs
  zmq::socket_t snapshot;  // likewise
  std::thread thread;

  mutable std::mutex mu;
  uint64_t next_seq = 0;
  std::string topic;       // as configured
  std::string live_topic;  // the topic frame of live batches
  std::string epoch;
  int dp_rank = 0;
  size_t buffer_steps = 0;
  bool keep = false;  // buffer payloads (replay enabled)
  std::deque<std::pair<uint64_t, std::shared_ptr<const std::string>>> buffer;

  // The placement view a snapshot copies (SGLang's _snapshot_blocks): block -> its parent, in
  // first-stored order.
  struct Placed {
    uint64_t order = 0;
    std::optional<uint64_t> parent;
  };
  bool mirror = false;
  uint64_t next_order = 0;
  std::unordered_map<uint64_t, Placed> blocks;

  void apply(std::span<const Event> events);
  void append(uint64_t seq, std::string payload);
  void serve();
  void answer(const std::string& identity, uint64_t start);
  void answer_snapshot(const std::vector<std::string>& frames);
};

namespace {

using namespace std::string_view_literals;
constexpr std::string_view kEpochMarker = "\0sgl-kv-epoch="sv;
constexpr std::string_view kSnapshotMarker = "\0sgl-kv-snapshot="sv;
constexpr std::string_view kSnapshotRequest = "snapshot-v1";
constexpr size_t kSnapshotChunkRecords = 4096;
constexpr int kSnapshotSendTimeoutMs = 500;

bool send_frames(zmq::socket_t& s, const std::vector<std::string_view>& frames) {
  for (size_t i = 0; i < frames.size(); ++i) {
    int flags = i + 1 < frames.size() ? ZMQ_SNDMORE : 0;
    if (zmq_send(s.handle(), frames[i].data(), frames[i].size(), flags) < 0) return false;
  }
  return true;
}

// Receives one multipart message without waiting; false when none is queued.
bool recv_frames(zmq::socket_t& s, std::vector<std::string>& frames) {
  frames.clear();
  for (;;) {
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    int flags = frames.empty() ? ZMQ_DONTWAIT : 0;
    if (zmq_msg_recv(&msg, s.handle(), flags) < 0) {
      zmq_msg_close(&msg);
      return false;
    }
    frames.emplace_back(static_cast<const char*>(zmq_msg_data(&msg)), zmq_msg_size(&msg));
    bool more = zmq_msg_more(&msg) != 0;
    zmq_msg_close(&msg);
    if (!more) return true;
  }
}

std::string open(zmq::socket_t& s, const std::string& endpoint, bool bind) {
  try {
    if (endpoint.find("::") != std::string::npos || endpoint.find('[') != std::string::npos) {
      s.set(zmq::sockopt::ipv6, 1);
    }
    if (bind) {
      s.bind(endpoint);
    } else {
      s.connect(endpoint);
    }
  } catch (const zmq::error_t& e) {
    return std::string(bind ? "cannot bind " : "cannot connect ") + endpoint + ": " + e.what();
  }
  return "";
}

}  // namespace

bool offset_endpoint(std::string_view endpoint, int rank, std::string& out, std::string& error) {
  out.assign(endpoint);
  if (rank == 0) return true;
  if (endpoint.find("inproc") != std::string_view::npos) {
    out += "_dp" + std::to_string(rank);
    return true;
  }
  if (endpoint.find("tcp") == std::string_view::npos) {
    error = "endpoint '" + std::string(endpoint) +
            "' cannot be offset per DP rank (only tcp:// and inproc:// can)";
    return false;
  }
  size_t colon = endpoint.rfind(':');
  std::string_view port_text = endpoint.substr(colon + 1);
  int port = 0;
  auto [ptr, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (colon == std::string_view::npos || ec != std::errc() ||
      ptr != port_text.data() + port_text.size()) {
    error = "endpoint '" + std::string(endpoint) + "' has no numeric port to offset per DP rank";
    return false;
  }
  if (port + rank > 65535) {
    error = "endpoint '" + std::string(endpoint) + "' offset by DP rank " + std::to_string(rank) +
            " is past port 65535";
    return false;
  }
  out = std::string(endpoint.substr(0, colon)) + ":" + std::to_string(port + rank);
  return true;
}

bool endpoint_binds(std::string_view endpoint) {
  return endpoint.find('*') != std::string_view::npos ||
         endpoint.find("::") != std::string_view::npos ||
         endpoint.find("0.0.0.0") != std::string_view::npos || endpoint.starts_with("ipc://") ||
         endpoint.starts_with("inproc://");
}

std::string epoch_topic(std::string_view topic, std::string_view epoch) {
  std::string out(topic);
  out.append(kEpochMarker);
  out.append(epoch);
  return out;
}

std::string uuid4_hex() {
  thread_local std::mt19937_64 rng{
      std::random_device{}() ^
      static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count())};
  uint64_t hi = rng(), lo = rng();
  hi = (hi & ~uint64_t{0xf000}) | 0x4000;                    // version 4
  lo = (lo & ~(uint64_t{0xc} << 60)) | (uint64_t{8} << 60);  // variant 10
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(32, '0');
  for (int i = 0; i < 16; ++i) {
    out[static_cast<size_t>(15 - i)] = kHex[(hi >> (4 * i)) & 0xf];
    out[static_cast<size_t>(31 - i)] = kHex[(lo >> (4 * i)) & 0xf];
  }
  return out;
}

Publisher::Publisher(PublisherOptions options)
    : options_(std::move(options)), impl_(std::make_unique<Impl>()) {}

std::unique_ptr<Publisher> Publisher::create(const PublisherOptions& options, std::string& error) {
  std::unique_ptr<Publisher> p(new Publisher(options));
  Impl& im = *p->impl_;
  im.topic = options.topic;
  im.dp_rank = options.dp_rank;
  im.mirror = !options.snapshot_endpoint.empty();
  im.epoch = options.epoch.empty() ? uuid4_hex() : options.epoch;
  // SGLang keeps the exact topic without snapshots; a snapshot-capable publisher appends its epoch
  // (SUB filters are prefixes, so subscribers of the bare topic still receive everything).
  im.live_topic = im.mirror ? epoch_topic(im.topic, im.epoch) : im.topic;
  im.buffer_steps = options.buffer_steps;
  im.keep = !options.replay_endpoint.empty() && options.buffer_steps > 0;
  im.pub = zmq::socket_t(im.ctx, zmq::socket_type::pub);
  im.pub.set(zmq::sockopt::linger, 0);
  im.pub.set(zmq::sockopt::sndhwm, options.hwm);
  error = open(im.pub, options.endpoint, endpoint_binds(options.endpoint));
  if (!error.empty()) return nullptr;
  if (!options.replay_endpoint.empty()) {
    im.replay = zmq::socket_t(im.ctx, zmq::socket_type::router);
    im.replay.set(zmq::sockopt::linger, 0);
    im.replay.set(zmq::sockopt::sndhwm, 0);  // a replay may stream the whole buffer at once
    error = open(im.replay, options.replay_endpoint, true);
    if (!error.empty()) return nullptr;
  }
  if (im.mirror) {
    im.snapshot = zmq::socket_t(im.ctx, zmq::socket_type::router);
    im.snapshot.set(zmq::sockopt::linger, 0);
    // A client that stops reading must not stall every later request (SGLang's 500 ms).
    im.snapshot.set(zmq::sockopt::sndtimeo, kSnapshotSendTimeoutMs);
    error = open(im.snapshot, options.snapshot_endpoint, true);
    if (!error.empty()) return nullptr;
  }
  if (im.replay || im.snapshot) im.thread = std::thread([&im] { im.serve(); });
  return p;
}

Publisher::~Publisher() {
  // Shutting the context down wakes the replay thread's poll with ETERM.
  impl_->ctx.shutdown();
  if (impl_->thread.joinable()) impl_->thread.join();
  impl_->pub.close();
  impl_->replay.close();
  impl_->snapshot.close();
  impl_->ctx.close();
}

void Publisher::Impl::append(uint64_t seq, std::string payload) {
  if (!keep) return;
  buffer.emplace_back(seq, std::make_shared<const std::string>(std::move(payload)));
  while (buffer.size() > buffer_steps) buffer.pop_front();
}

void Publisher::Impl::apply(std::span<const Event> events) {
  for (const auto& e : events) {
    if (const auto* s = std::get_if<BlockStored>(&e)) {
      std::optional<uint64_t> parent = s->parent_block_hash;
      for (uint64_t h : s->block_hashes) {
        auto [it, fresh] = blocks.try_emplace(h);
        if (fresh) it->second.order = next_order++;
        it->second.parent = parent;
        parent = h;
      }
    } else if (const auto* r = std::get_if<BlockRemoved>(&e)) {
      for (uint64_t h : r->block_hashes) blocks.erase(h);
    } else {
      blocks.clear();
    }
  }
}

uint64_t Publisher::publish(std::string payload, std::span<const Event> events) {
  Impl& im = *impl_;
  std::lock_guard lock(im.mu);
  const uint64_t seq = im.next_seq++;
  const std::string seq_bytes = encode_sequence(seq);
  send_frames(im.pub, {im.live_topic, seq_bytes, payload});
  im.append(seq, std::move(payload));
  if (im.mirror) im.apply(events);
  return seq;
}

uint64_t Publisher::published() const {
  std::lock_guard lock(impl_->mu);
  return impl_->next_seq;
}

const std::string& Publisher::live_topic() const {
  return impl_->live_topic;
}

void Publisher::Impl::serve() {
  std::vector<std::string> frames;
  std::vector<zmq_pollitem_t> items;
  if (replay) items.push_back({replay.handle(), 0, ZMQ_POLLIN, 0});
  if (snapshot) items.push_back({snapshot.handle(), 0, ZMQ_POLLIN, 0});
  for (;;) {
    if (zmq_poll(items.data(), static_cast<int>(items.size()), -1) < 0) {
      if (zmq_errno() == EINTR) continue;
      break;  // ETERM: the publisher is closing
    }
    while (replay && recv_frames(replay, frames)) {
      uint64_t start = 0;
      // [identity, "", start_seq]; anything else is ignored, as the engines do.
      if (frames.size() != 3 || !frames[1].empty() || !decode_sequence(frames[2], start)) {
        log::warn("kv events: invalid replay request").kv("frames", frames.size());
        continue;
      }
      answer(frames[0], start);
    }
    while (snapshot && recv_frames(snapshot, frames)) answer_snapshot(frames);
  }
  replay.close();
  snapshot.close();
}

void Publisher::Impl::answer_snapshot(const std::vector<std::string>& frames) {
  if (frames.size() != 3) {
    log::warn("kv events: invalid snapshot request").kv("frames", frames.size());
    return;
  }
  const std::string& identity = frames[0];
  if (!frames[1].empty() || frames[2] != kSnapshotRequest) {
    send_frames(snapshot, {identity, {}, "error", "invalid snapshot-v1 request"});
    return;
  }
  // The barrier, its sequence and the copy of the placement view form one cut (under the lock
  // every publish takes).
  const std::string barrier_id = uuid4_hex();
  uint64_t barrier_seq = 0, resume_seq = 0;
  std::vector<std::pair<uint64_t, std::pair<uint64_t, std::optional<uint64_t>>>> records;
  {
    std::lock_guard lock(mu);
    barrier_seq = next_seq++;
    EventBatch barrier;
    barrier.ts =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    barrier.dp_rank = dp_rank;
    std::string payload;
    encode_batch(barrier, WireFormat::kSglang, payload);
    std::string barrier_topic = live_topic;
    barrier_topic.append(kSnapshotMarker);
    barrier_topic.append(barrier_id);
    send_frames(pub, {barrier_topic, encode_sequence(barrier_seq), payload});
    append(barrier_seq, std::move(payload));
    resume_seq = next_seq;
    records.reserve(blocks.size());
    for (const auto& [h, p] : blocks) records.push_back({p.order, {h, p.parent}});
  }
  std::sort(records.begin(), records.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });

  auto put_int = [](std::string& out, int64_t v) {
    char buf[9];
    char* end = v >= 0 ? mp_encode_uint(buf, static_cast<uint64_t>(v)) : mp_encode_int(buf, v);
    out.append(buf, static_cast<size_t>(end - buf));
  };
  auto put_str = [](std::string& out, std::string_view v) {
    char buf[5];
    char* end = mp_encode_strl(buf, static_cast<uint32_t>(v.size()));
    out.append(buf, static_cast<size_t>(end - buf));
    out.append(v);
  };
  auto put_array = [](std::string& out, uint32_t n) {
    char buf[5];
    char* end = mp_encode_array(buf, n);
    out.append(buf, static_cast<size_t>(end - buf));
  };
  // KVSnapshotHeader, positional: version, epoch, replica_rank, resume_seq, barrier_seq,
  // barrier_id, record_count.
  std::string header;
  put_array(header, 7);
  put_int(header, 1);
  put_str(header, epoch);
  put_int(header, dp_rank);
  put_int(header, static_cast<int64_t>(resume_seq));
  put_int(header, static_cast<int64_t>(barrier_seq));
  put_str(header, barrier_id);
  put_int(header, static_cast<int64_t>(records.size()));
  if (!send_frames(snapshot, {identity, {}, "header", header})) return;
  for (size_t start = 0; start < records.size(); start += kSnapshotChunkRecords) {
    const size_t n = std::min(kSnapshotChunkRecords, records.size() - start);
    std::string chunk;
    put_array(chunk, static_cast<uint32_t>(n));
    for (size_t i = start; i < start + n; ++i) {
      // KVSnapshotBlock, positional: parent_block_hash, block_hashes (one per record).
      const auto& [h, parent] = records[i].second;
      put_array(chunk, 2);
      if (parent) {
        put_int(chunk, static_cast<int64_t>(*parent));
      } else {
        chunk.push_back(static_cast<char>(0xc0));
      }
      put_array(chunk, 1);
      put_int(chunk, static_cast<int64_t>(h));
    }
    if (!send_frames(snapshot, {identity, {}, "chunk", chunk})) return;
  }
  send_frames(snapshot, {identity, {}, "end", {}});
}

void Publisher::Impl::answer(const std::string& identity, uint64_t start) {
  std::vector<std::pair<uint64_t, std::shared_ptr<const std::string>>> out;
  {
    std::lock_guard lock(mu);
    for (const auto& entry : buffer) {
      if (entry.first >= start) out.push_back(entry);
    }
  }
  for (const auto& [seq, payload] : out) {
    if (!send_frames(replay, {identity, {}, encode_sequence(seq), *payload})) return;
  }
  send_frames(replay, {identity, {}, encode_sequence(kReplayEnd), {}});
}

}  // namespace kvgate::kv
