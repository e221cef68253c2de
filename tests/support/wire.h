// tests/support/wire: what the KV-event tests share to check the wire independently of kvgate's own
// code: raw libzmq sockets and multipart frames, big-endian sequence numbers, and Python
// (python3's hashlib) as the reference for block hashes. Header-only; the unit tests link libzmq.
#pragma once

#include <gtest/gtest.h>
#include <zmq.h>

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "support/process.h"

namespace kvgate::testing {

using Frames = std::vector<std::string>;

// Sockets on one context, closed (linger 0) with it. SUB sockets subscribe to everything.
class ZmqSockets {
 public:
  ZmqSockets() : ctx_(zmq_ctx_new()) {}
  ~ZmqSockets() {
    for (void* s : sockets_) zmq_close(s);
    zmq_ctx_term(ctx_);
  }
  ZmqSockets(const ZmqSockets&) = delete;
  ZmqSockets& operator=(const ZmqSockets&) = delete;

  void* connect(int type, const std::string& endpoint) {
    void* s = zmq_socket(ctx_, type);
    int linger = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    if (type == ZMQ_SUB) zmq_setsockopt(s, ZMQ_SUBSCRIBE, "", 0);
    EXPECT_EQ(zmq_connect(s, endpoint.c_str()), 0) << endpoint;
    sockets_.push_back(s);
    return s;
  }
  void* connect(int type, int port) {
    return connect(type, "tcp://127.0.0.1:" + std::to_string(port));
  }

 private:
  void* ctx_;
  std::vector<void*> sockets_;
};

// One multipart message, or {} after `timeout_ms`.
inline Frames recv_multipart(void* sock, int timeout_ms) {
  zmq_pollitem_t item{sock, 0, ZMQ_POLLIN, 0};
  if (zmq_poll(&item, 1, timeout_ms) <= 0) return {};
  Frames out;
  for (;;) {
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    if (zmq_msg_recv(&msg, sock, 0) < 0) {
      zmq_msg_close(&msg);
      return {};
    }
    out.emplace_back(static_cast<char*>(zmq_msg_data(&msg)), zmq_msg_size(&msg));
    bool more = zmq_msg_more(&msg) != 0;
    zmq_msg_close(&msg);
    if (!more) return out;
  }
}

inline void send_multipart(void* sock, const Frames& frames) {
  for (size_t i = 0; i < frames.size(); ++i) {
    zmq_send(sock, frames[i].data(), frames[i].size(), i + 1 < frames.size() ? ZMQ_SNDMORE : 0);
  }
}

// An 8-byte big-endian frame (sequence numbers).
inline uint64_t be64(const std::string& s) {
  EXPECT_EQ(s.size(), 8u);
  uint64_t v = 0;
  for (char c : s) v = (v << 8) | static_cast<uint8_t>(c);
  return v;
}

// Token ids as a Python list literal.
inline std::string py_list(const std::vector<int32_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

// Runs a Python program; its stdout split on whitespace.
inline std::vector<std::string> python_words(const std::string& code) {
  auto r = run("/usr/bin/python3", {"-c", code});
  EXPECT_EQ(r.status, 0) << r.output;
  std::istringstream in(r.output);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

}  // namespace kvgate::testing
