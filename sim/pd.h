// sim/pd: prefill/decode disaggregation. SGLang moves the KV cache of a prompt from the prefill
// server to the decode server over Mooncake or NIXL after a rendezvous at the prefill server's
// bootstrap port; the sim keeps what a gateway can observe and replaces the transport with a
// line protocol over TCP on --disaggregation-bootstrap-port (see sim/README.md):
//   decode -> prefill:  "WAIT <room>\n"
//   prefill -> decode:  "READY <room> <prompt_tokens> <cached_tokens>\n"   (the KV arrived)
//                    or "FAILED <room> <reason>\n"                         (the prefill aborted)
//   and "PING\n" -> "PONG kvgate-sim prefill\n" for probes.
// A room that finished before its decode asked is kept (5 minutes, at most 100,000 rooms) and
// answered at once; the decode side gives up after its timeout (--pd-room-timeout-secs). The
// modelled transfer time is spent on the prefill side before READY, as the prefill request is held
// until its KV left.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "http/io.h"

namespace kvgate::sim {

struct RoomInfo {
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;  // the prefill's prefix hit, reported by the decode as its own
};

// Where a prefill scheduler reports its rooms. Thread-safe.
class RoomListener {
 public:
  virtual ~RoomListener() = default;
  virtual void room_ready(uint64_t room, RoomInfo info) = 0;
  virtual void room_failed(uint64_t room, std::string reason) = 0;
};

// The prefill side: the rendezvous server on the bootstrap port, on its own thread.
class BootstrapServer final : public RoomListener {
 public:
  // Binds host:port (port 0 = any). nullptr with `error` when it cannot.
  static std::unique_ptr<BootstrapServer> start(const std::string& host, uint16_t port,
                                                std::chrono::seconds retention, std::string& error);
  ~BootstrapServer() override;
  uint16_t port() const { return port_; }
  void room_ready(uint64_t room, RoomInfo info) override;
  void room_failed(uint64_t room, std::string reason) override;

  struct Waiter;

 private:
  BootstrapServer(std::chrono::seconds retention);
  awaitable<void> accept_loop();
  awaitable<void> session(asio::ip::tcp::socket socket);
  void deliver(uint64_t room, const std::string& line);  // on the server thread

  asio::io_context ctx_{1};
  std::unique_ptr<asio::ip::tcp::acceptor> acceptor_;
  uint16_t port_ = 0;
  std::chrono::seconds retention_;
  std::thread thread_;
  // Server thread only:
  std::unordered_map<uint64_t, std::vector<std::shared_ptr<Waiter>>> waiters_;
  std::unordered_map<uint64_t, std::string> done_;  // rooms answered before anyone asked
  std::deque<std::pair<Clock::time_point, uint64_t>> done_order_;
};

// The decode side's wait for a room. `cancel` (may be null) aborts the wait when cancelled (the
// client went away).
struct RoomWait {
  bool ok = false;
  RoomInfo info;
  int status = 500;   // HTTP status of the failure
  std::string error;  // why the KV did not arrive
};
awaitable<RoomWait> wait_for_room(std::string host, uint16_t port, uint64_t room,
                                  std::chrono::milliseconds timeout,
                                  std::shared_ptr<asio::steady_timer> cancel);

}  // namespace kvgate::sim
