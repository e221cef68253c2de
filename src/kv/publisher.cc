// kv/publisher: see publisher.h.
#include "kv/publisher.h"

#include <zmq.h>

#include <atomic>
#include <charconv>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>
#include <zmq.hpp>

#include "kv/events.h"
#include "util/log.h"

namespace kvgate::kv {

struct Publisher::Impl {
  zmq::context_t ctx{1};
  zmq::socket_t pub;
  zmq::socket_t replay;  // owned by `thread` once it runs
  std::thread thread;

  mutable std::mutex mu;
  uint64_t next_seq = 0;
  std::string topic;
  size_t buffer_steps = 0;
  bool keep = false;  // buffer payloads (replay enabled)
  std::deque<std::pair<uint64_t, std::shared_ptr<const std::string>>> buffer;

  void serve_replay();
  void answer(const std::string& identity, uint64_t start);
};

namespace {

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
         endpoint.find("::") != std::string_view::npos || endpoint.starts_with("ipc://") ||
         endpoint.starts_with("inproc://");
}

Publisher::Publisher(PublisherOptions options)
    : options_(std::move(options)), impl_(std::make_unique<Impl>()) {}

std::unique_ptr<Publisher> Publisher::create(const PublisherOptions& options, std::string& error) {
  std::unique_ptr<Publisher> p(new Publisher(options));
  Impl& im = *p->impl_;
  im.topic = options.topic;
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
    im.thread = std::thread([&im] { im.serve_replay(); });
  }
  return p;
}

Publisher::~Publisher() {
  // Shutting the context down wakes the replay thread's poll with ETERM.
  impl_->ctx.shutdown();
  if (impl_->thread.joinable()) impl_->thread.join();
  impl_->pub.close();
  impl_->replay.close();
  impl_->ctx.close();
}

uint64_t Publisher::publish(std::string payload) {
  Impl& im = *impl_;
  std::lock_guard lock(im.mu);
  const uint64_t seq = im.next_seq++;
  const std::string seq_bytes = encode_sequence(seq);
  send_frames(im.pub, {im.topic, seq_bytes, payload});
  if (im.keep) {
    im.buffer.emplace_back(seq, std::make_shared<const std::string>(std::move(payload)));
    while (im.buffer.size() > im.buffer_steps) im.buffer.pop_front();
  }
  return seq;
}

uint64_t Publisher::published() const {
  std::lock_guard lock(impl_->mu);
  return impl_->next_seq;
}

void Publisher::Impl::serve_replay() {
  std::vector<std::string> frames;
  for (;;) {
    zmq_pollitem_t item{replay.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&item, 1, -1) < 0) {
      if (zmq_errno() == EINTR) continue;
      break;  // ETERM: the publisher is closing
    }
    while (recv_frames(replay, frames)) {
      uint64_t start = 0;
      // [identity, "", start_seq]; anything else is ignored, as the engines do.
      if (frames.size() != 3 || !frames[1].empty() || !decode_sequence(frames[2], start)) {
        log::warn("kv events: invalid replay request").kv("frames", frames.size());
        continue;
      }
      answer(frames[0], start);
    }
  }
  replay.close();
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
