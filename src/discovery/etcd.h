// discovery/etcd: workers registered in etcd v3, read through etcd's JSON gateway (HTTP/1.1 at
// /v3/...; keys and values base64 in JSON), so no gRPC library is needed.
//
// Each worker is one key, `/kvgate/v1/workers/<model>/<id>`, held by a lease its registrar keeps
// alive (`kvgate register`, register_cli.cc): when the worker or its sidecar dies the lease
// expires and etcd deletes the key. EtcdWatcher ranges over a prefix of those keys, then watches
// it, and reports the whole set of workers whenever it changes.
//
// EtcdClient is blocking, on plain sockets, meant for a thread of its own beside the request path
// (never an event loop): every call has a deadline, except a watch's wait for its next event,
// which interrupt() ends from any thread. Why not http/client.h: it is Asio coroutines on an event
// loop; a watch is one long blocking read that stop() must be able to cut, which a socket polled
// together with an eventfd does in a few lines. The HTTP framing is still kvgate's own strict
// parser (http/parser.h).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "util/base64.h"

namespace kvgate::discovery {

// etcd's JSON carries keys and values in base64 (util/base64.h).

// The range_end that makes `prefix` a prefix query (etcd's clientv3.GetPrefixRangeEnd): the prefix
// with its last byte below 0xff incremented and what follows dropped; "\0" (every key) when none.
std::string prefix_range_end(std::string_view prefix);

// ---- The worker record. ----
inline constexpr std::string_view kWorkersPrefix = "/kvgate/v1/workers/";
// Gateways registered by --replica-registry: /kvgate/v1/gateways/<subject>/<replica id>, the same
// record (its url the gateway's).
inline constexpr std::string_view kGatewaysPrefix = "/kvgate/v1/gateways/";
inline constexpr size_t kMaxWorkerRecordBytes = size_t{64} * 1024;
inline constexpr size_t kMaxKeyPartBytes = 256;  // a model name or an id

// One worker as registered. `model` and `id` come from the key; the rest from its JSON value:
//   {"url": "http://h:p", "role": "regular"|"prefill"|"decode", "dp_size": N, "page_size": N,
//    "kv_events": {"endpoint": "tcp://h:5557", ...}, "bootstrap_port": N}
// Only "url" is required; unknown fields are ignored (a newer registrar may add some).
struct WorkerRecord {
  std::string model;
  std::string id;
  std::string url;                 // http(s)://host:port
  std::string role = "regular";    // regular, prefill or decode
  int64_t dp_size = 0;             // 0: not given
  int64_t page_size = 0;           // 0: not given
  int64_t bootstrap_port = 0;      // 0: not given (prefill workers of SGLang's PD)
  std::string kv_events_endpoint;  // kv_events.endpoint, "" when not given
  std::string kv_events_json;      // the kv_events object as given (compact JSON), "" when absent
  bool operator==(const WorkerRecord&) const = default;
};

// "/kvgate/v1/workers/<model>/<id>". Model and id are checked by check_worker_key_parts.
std::string worker_key(std::string_view model, std::string_view id);
// "" or what is wrong: each non-empty, at most kMaxKeyPartBytes, printable ASCII without spaces;
// the id without '/' (a model name may have one: "Qwen/Qwen3-8B").
std::string check_worker_key_parts(std::string_view model, std::string_view id);
// Splits a key under kWorkersPrefix into model and id (the id is after the last '/'). "" or why
// the key is not a worker key.
std::string split_worker_key(std::string_view key, std::string& model, std::string& id);
// The same under another root: "<root><group>/<id>" (gateways: kGatewaysPrefix).
std::string split_record_key(std::string_view key, std::string_view root, std::string& model,
                             std::string& id);
// Parses and validates a record's JSON value into `out` (model and id untouched). "" or every
// problem's description, naming the field.
std::string parse_worker_record(std::string_view value, WorkerRecord& out);
// The JSON value of a record (fields at their "not given" value left out). parse_worker_record of
// it gives the record back.
std::string serialize_worker_record(const WorkerRecord& record);

// ---- etcd messages. ----
struct EtcdKeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t version = 0;
  int64_t lease = 0;
};

struct EtcdRange {
  int64_t revision = 0;  // the store's revision the range was read at
  std::vector<EtcdKeyValue> kvs;
  bool more = false;  // etcd had more keys than it returned
};

struct EtcdWatchEvent {
  enum class Type : uint8_t { kPut, kDelete };
  Type type = Type::kPut;
  EtcdKeyValue kv;  // a DELETE's kv has the key and the deletion's mod_revision only
};

// One line of /v3/watch's stream.
struct EtcdWatchMessage {
  int64_t revision = 0;  // the header's
  bool created = false;
  bool canceled = false;
  int64_t compact_revision = 0;  // non-zero: the start revision was compacted (and canceled)
  std::string cancel_reason;
  std::vector<EtcdWatchEvent> events;
};

// Parses one line of a watch stream (`{"result": {...}}`). "" or why it is not one; an error line
// (`{"error": ...}`) gives etcd's message. Bounded: at most kMaxWatchEvents events are kept.
inline constexpr size_t kMaxWatchEvents = 100000;
std::string parse_watch_line(std::string_view line, EtcdWatchMessage& out);

// ---- The client. ----
class EtcdClient {
 public:
  struct Options {
    std::chrono::milliseconds timeout{2000};       // connect, and each unary call as a whole
    size_t max_response_bytes = size_t{64} << 20;  // a unary answer, and one watch line
  };

  // `url`: http://host:port (a trailing slash is allowed). An https:// URL, or one that is
  // malformed, makes every call fail with url_error().
  explicit EtcdClient(std::string_view url);
  EtcdClient(std::string_view url, Options options);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  // "" when the URL is usable, else what is wrong with it.
  const std::string& url_error() const { return url_error_; }

  // Every call returns "" or an error naming the call and the cause (etcd's own message when it
  // answered one).
  std::string range(std::string_view prefix, EtcdRange& out);
  std::string put(std::string_view key, std::string_view value, int64_t lease = 0);
  std::string delete_key(std::string_view key);
  std::string lease_grant(int64_t ttl_secs, int64_t& id);
  // One keepalive round. `ttl_left`: the lease's TTL after it; 0 when the lease is gone
  // (expired, revoked, or etcd lost it).
  std::string lease_keepalive(int64_t id, int64_t& ttl_left);
  std::string lease_revoke(int64_t id);
  // Watches the keys under `prefix` from `start_revision`, calling `on_message` with each message
  // of the stream, until the stream ends (an error: "the watch stream ended"), a call fails,
  // `on_message` returns false (then ""), or interrupt(). Waits for events without a deadline
  // (TCP keepalive notices a peer that vanished).
  std::string watch(std::string_view prefix, int64_t start_revision,
                    const std::function<bool(const EtcdWatchMessage&)>& on_message);

  // Makes the call in progress (from another thread) and every later one fail at once with
  // "interrupted". Thread-safe; irreversible.
  void interrupt();

 private:
  struct Conn;
  using Sink = std::function<bool(std::string_view piece)>;
  // One POST: "" and the status set, with the body handed to `sink` piece by piece (false stops
  // reading: the connection is closed). `deadline_body`: whether the body's reading is bounded by
  // the call's deadline (not for a watch).
  std::string post(std::string_view path, const std::string& body, int& status, const Sink& sink,
                   bool deadline_body);
  // A unary call: POST, whole body, 200 expected; "" or the error.
  std::string call(std::string_view what, std::string_view path, const std::string& body,
                   std::string& answer);

  Options options_;
  std::string url_error_;
  std::string host_;
  uint16_t port_ = 0;
  std::string host_header_;
  int cancel_fd_ = -1;  // an eventfd: readable once interrupt() was called
};

// ---- The watcher. ----
class EtcdWatcher {
 public:
  struct Options {
    EtcdClient::Options client;
    std::chrono::milliseconds min_backoff{100};  // after a failure; doubles up to max_backoff
    std::chrono::milliseconds max_backoff{5000};
    size_t max_workers = 4096;  // records past this are ignored (logged)
    // The tree the records are in (keys "<root><model>/<id>"): workers, or kGatewaysPrefix.
    std::string root = std::string(kWorkersPrefix);
  };
  // Monotonic counters, readable from any thread (for metrics).
  struct Stats {
    std::atomic<uint64_t> ranges{0};           // full reads of the prefix that succeeded
    std::atomic<uint64_t> errors{0};           // failed ranges and watches (etcd unreachable, ...)
    std::atomic<uint64_t> events{0};           // watch events applied
    std::atomic<uint64_t> watch_restarts{0};   // watch streams that ended (then re-range)
    std::atomic<uint64_t> invalid_records{0};  // keys or values skipped as malformed
    std::atomic<uint64_t> changes{0};          // on_change calls
  };
  using OnChange = std::function<void(std::vector<WorkerRecord> workers)>;

  // `prefix`: kWorkersPrefix, or a part of the tree under it (e.g. "/kvgate/v1/workers/llama/").
  EtcdWatcher(std::string etcd_url, std::string prefix, Options options, OnChange on_change);
  ~EtcdWatcher();  // stop()
  EtcdWatcher(const EtcdWatcher&) = delete;
  EtcdWatcher& operator=(const EtcdWatcher&) = delete;

  // "" and the thread started, or what is wrong with the URL or the prefix (nothing started).
  // on_change runs on the watcher's thread with every worker (sorted by key): at the
  // first successful range, then whenever the set differs from the last one reported. It must
  // not call stop(). While etcd is unreachable the last set stays.
  std::string start();
  // Interrupts the call in progress and joins the thread (returns at once).
  void stop();
  const Stats& stats() const { return stats_; }

 private:
  void run();
  bool run_loop();  // true: stopped; false: ended by an exception (run() starts it again)
  // Applies a key's new value (or deletion); true when the set changed.
  bool apply(const EtcdKeyValue& kv, bool deleted);
  // Calls on_change when the set differs from the last reported (or was never reported).
  void report();
  void wait(std::chrono::milliseconds d);

  std::string url_;
  std::string prefix_;
  Options options_;
  OnChange on_change_;
  Stats stats_;
  EtcdClient client_;
  std::map<std::string, WorkerRecord> workers_;  // by key; the watcher thread's
  std::vector<WorkerRecord> reported_;
  bool reported_once_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;  // guarded by mu_
  std::thread thread_;
};

}  // namespace kvgate::discovery
