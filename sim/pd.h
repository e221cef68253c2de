// sim/pd: prefill/decode disaggregation as SGLang does it where a router or operator can see it.
//
// The prefill server runs SGLang's bootstrap server on --disaggregation-bootstrap-port: an HTTP
// server (SGLang's is aiohttp, disaggregation/common/conn.py CommonKVBootstrapServer) with its
// routes and shapes: GET /health ("OK"), PUT /route (a prefill rank registers), GET /route
// (prefill_dp_rank, prefill_cp_rank, target_tp_rank, target_pp_rank: a rank's address, or, with
// all four -1, the prefill's parallel info: dp_size, follow_bootstrap_room...), POST
// /register_dp_rank and POST /query_dp_ranks. The sim registers its own DP ranks at start.
// SGLang moves the KV itself over Mooncake or NIXL, which no router sees; the sim replaces that
// transport with one sim-only route on the same port:
//   GET /kvgate_sim/room/<room>?prefill_dp_rank=<rank>   (long poll)
// answered once the prefill rank's request for that room has sent its KV
// ({"status":"success","prompt_tokens","cached_tokens"}) or failed ({"status":"failed",
// "reason"}). Rooms are per (room, prefill DP rank); an answer nobody asked for yet is kept
// (`retention`, at most 100,000 rooms) and given to the first decode that asks.
//
// The decode side (wait_for_room) does what SGLang's decode does before its KV arrives: fetches
// the prefill's parallel info (retried like DecodePreallocQueue._ensure_prefill_info), resolves
// the prefill DP rank (the request's disagg_prefill_dp_rank, else 0 with one prefill rank, else
// bootstrap_room % the prefill's dp_size), asks the bootstrap server for that rank, then waits for
// the room on that rank; failures carry SGLang's messages (KVTransferError, KVPoll.* states).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "http/io.h"
#include "sim/abort.h"

namespace kvgate::sim {

struct RoomInfo {
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;  // the prefill's prefix hit, reported by the decode as its own
};

// Where a prefill scheduler reports its rooms (each rank its own). Thread-safe.
class RoomListener {
 public:
  virtual ~RoomListener() = default;
  virtual void room_ready(uint64_t room, int dp_rank, RoomInfo info) = 0;
  virtual void room_failed(uint64_t room, int dp_rank, std::string reason) = 0;
};

struct BootstrapSettings {
  std::string host = "127.0.0.1";  // --host
  uint16_t port = 0;               // --disaggregation-bootstrap-port (0: any free port)
  int dp_size = 1;                 // the prefill ranks registered at start
  int64_t page_size = 1;           // reported in the parallel info
  std::chrono::seconds retention{300};
};

// The prefill side: SGLang's bootstrap server plus the sim's room rendezvous, on its own thread.
class BootstrapServer final : public RoomListener {
 public:
  // Binds host:port. nullptr with `error` when it cannot.
  static std::unique_ptr<BootstrapServer> start(const BootstrapSettings& settings,
                                                std::string& error);
  ~BootstrapServer() override;
  BootstrapServer(const BootstrapServer&) = delete;
  BootstrapServer& operator=(const BootstrapServer&) = delete;
  uint16_t port() const;
  // The prefill's HTTP port, reported as prefill_http_port in the parallel info (known only once
  // the HTTP server is bound). Thread-safe.
  void set_http_port(int64_t port);
  void room_ready(uint64_t room, int dp_rank, RoomInfo info) override;
  void room_failed(uint64_t room, int dp_rank, std::string reason) override;

  struct Impl;

 private:
  explicit BootstrapServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// --- decode side ---

// SGLang's decode-side waiting timeout (SGLANG_DISAGGREGATION_WAITING_TIMEOUT, seconds).
inline constexpr double kSglangWaitingTimeoutSecs = 300;
// DecodePreallocQueue: the prefill parallel info is fetched at most this many times, one second
// apart, before the request is aborted.
inline constexpr int kEnsureInfoAttempts = 15;

// One decode rank's PD queues, as SGLang's decode scheduler has them: a request is in the prealloc
// queue from its arrival through the handshake with the prefill server, then in the transfer queue
// until its KV arrived. Thread-safe counts (read by /v1/loads).
struct DecodeQueues {
  std::atomic<int64_t> prealloc{0};
  std::atomic<int64_t> transfer{0};
};

struct RoomRequest {
  std::string host;                           // bootstrap_host ("" when the body had none)
  std::optional<int64_t> port;                // bootstrap_port
  uint64_t room = 0;                          // bootstrap_room
  std::string rid;                            // the request's rid (SGLang's messages name it)
  std::optional<int64_t> prefill_dp_rank;     // the decode body's disagg_prefill_dp_rank
  std::chrono::milliseconds timeout{300000};  // waiting timeout (--pd-room-timeout-secs)
  // Between two parallel-info attempts (SGLang: 1 s; the sim shortens it to fit `timeout`).
  std::chrono::milliseconds retry_interval{1000};
  DecodeQueues* queues = nullptr;  // the decode rank's queues (counted while waiting), or null
};

struct RoomWait {
  bool ok = false;
  RoomInfo info;
  std::string error;  // SGLang's abort message (status 500) when !ok and the client is still there
};

// What a decode server knows of a prefill server (from GET /route with every rank -1).
struct PrefillInfo {
  int64_t dp_size = 1;
  bool follow_bootstrap_room = true;
};

// SGLang's prefill_info_table: the parallel info of each bootstrap address ("host:port"), fetched
// once and kept (dropped when the prefill server is found gone). Thread-safe.
class PrefillInfoTable {
 public:
  std::optional<PrefillInfo> find(const std::string& addr) const;
  void put(const std::string& addr, PrefillInfo info);
  void erase(const std::string& addr);

 private:
  mutable std::mutex mu_;
  std::unordered_map<std::string, PrefillInfo> by_addr_;
};

// Waits for the KV of `r` as SGLang's decode does. `control` interrupts the wait: an abort
// (/abort_request) ends it with SGLang's "Aborted by AbortReq." failure, a client that went away
// ends it with no answer (control->gone()).
awaitable<RoomWait> wait_for_room(RoomRequest r, PrefillInfoTable& infos,
                                  std::shared_ptr<RequestControl> control);

// --- SGLang's messages (exposed for tests) ---

// Python's repr() of a str: 'abc', or "it's" when it holds a single quote and no double quote;
// other control characters as \xNN.
std::string python_repr(std::string_view s);
// KVTransferError.__str__: "KVTransferError(bootstrap_room=R): reason".
std::string kv_transfer_error(uint64_t room, std::string_view reason);
// The decode scheduler's abort message: "Decode handshake failed for request rank=0
// decode_req.req.rid='…' decode_req.req.bootstrap_room=R with exception KVTransferError(…)"
// (handshake: DecodePreallocQueue, before the rank's KV is waited for; otherwise "Decode
// transfer failed", DecodeTransferQueue).
std::string decode_failure(bool handshake, std::string_view rid, uint64_t room,
                           std::string_view reason);
// The prefill scheduler's abort message (PrefillBootstrapQueue.pop_bootstrapped): "Prefill
// bootstrap failed for request rank=0 req.rid='…' req.bootstrap_room=R with exception …".
std::string prefill_bootstrap_failure(std::string_view rid, uint64_t room, std::string_view reason);
// CommonKVSender: a request dispatched (routed_dp_rank) to another rank than bootstrap_room %
// dp_size, without disagg_prefill_dp_rank.
std::string follow_bootstrap_room_conflict(int64_t dispatched, uint64_t room, int dp_size);
// CommonKVReceiver._check_waiting_timeout.
std::string waiting_timeout_reason(uint64_t room, double elapsed_secs);
// The scheduler's 400 abort of a request without bootstrap_room on a prefill or decode server.
std::string missing_room_message(std::string_view rid);

}  // namespace kvgate::sim
