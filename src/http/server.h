// http/server: an HTTP/1.1 server on Asio coroutines. One acceptor per io_context (SO_REUSEPORT, so
// the kernel spreads connections over threads), keep-alive, pipelined requests answered in order,
// optional TLS, header and body limits, Expect: 100-continue, a connection limit. It knows HTTP,
// not LLMs: each request becomes an Exchange handed to a Handler coroutine, which answers whole or
// streams the body.
//
// Timeouts, each for one phase of a connection (never one for the whole response: a stream that
// is quiet for minutes during a long prefill is healthy; its length is the handler's business):
//   keep-alive   waiting for the first byte of the next request (then the connection closes);
//   header       from that first byte to the end of the request head (then 408);
//   body         from the end of the head to the end of the body (then 408);
//   write        one write to the client that makes no progress (then the connection closes).
// A connection answered with an error is closed lingering (RFC 9112 9.6): the server stops
// sending, reads and discards what the client still sends for a moment, then closes, so the
// client reads the answer instead of a reset.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "http/io.h"
#include "http/message.h"

namespace kvgate::http {

struct ServerConfig {
  std::string host = "0.0.0.0";
  uint16_t port = 0;  // 0 = any free port (see Server::port())
  // SO_REUSEPORT (one acceptor per context on one port; also lets a second process bind next to
  // this one). Off for a single-context listener that must not share its port (the admin API).
  bool reuse_port = true;
  size_t header_limit = size_t{64} * 1024;          // request line + headers; more -> 431
  uint64_t body_limit = 512ull << 20;               // more -> 413
  std::chrono::milliseconds idle_timeout{75000};    // keep-alive: no next request
  std::chrono::milliseconds header_timeout{60000};  // first byte to the end of the head
  std::chrono::milliseconds body_timeout{60000};    // end of the head to the end of the body
  std::chrono::milliseconds write_timeout{60000};   // one write to the client without progress
  std::chrono::milliseconds linger_timeout{2000};   // reading and discarding after an error
  size_t max_connections = 0;                       // 0 = no limit; beyond it, refused
  int backlog = 4096;
  // TLS: both set = every connection is TLS (PEM files; the key unencrypted).
  std::string tls_cert_path;
  std::string tls_key_path;
  bool operator==(const ServerConfig&) const = default;
};

// Counters of what the server refused or cut, read by the owner's metrics.
struct ServerStats {
  enum Reject : size_t {
    kBadRequest,       // 400: malformed HTTP
    kHeadersTooLarge,  // 431
    kBodyTooLarge,     // 413
    kHeaderTimeout,    // 408: the head did not arrive in time
    kBodyTimeout,      // 408: the body did not arrive in time
    kTlsHandshake,     // TLS handshake failed or timed out
    kRejectKinds
  };
  std::atomic<int64_t> connections{0};      // open now
  std::atomic<int64_t> idle{0};             // of which waiting for their next request
  std::atomic<int64_t> parked{0};           // of which parked (http/parking)
  std::atomic<uint64_t> accepted{0};        // ever
  std::atomic<uint64_t> refused{0};         // closed at once: --max-connections reached
  std::atomic<uint64_t> idle_closed{0};     // keep-alive timeout or shutdown
  std::atomic<uint64_t> write_timeouts{0};  // a client that stopped reading
  std::atomic<uint64_t> rejected[kRejectKinds]{};
  static std::string_view reject_name(size_t kind);
};

// One request and its response. Valid for the duration of the handler call.
class Exchange {
 public:
  virtual ~Exchange() = default;

  virtual std::string_view method() const = 0;
  virtual std::string_view target() const = 0;
  std::string_view path() const {
    auto t = target();
    return t.substr(0, t.find('?'));
  }
  virtual unsigned version() const = 0;  // 10 or 11
  // First value of a header (case-insensitive), or empty.
  virtual std::string_view header(std::string_view name) const = 0;
  virtual void for_each_header(
      const std::function<void(std::string_view, std::string_view)>& fn) const = 0;
  // Whether the request has a Connection field (tokens naming fields a proxy must not forward).
  virtual bool has_connection_header() const { return true; }
  // The request body; capacity() >= size() + kBodyPadding, so it can be parsed in place.
  virtual std::string& body() = 0;
  virtual const std::string& remote_address() const = 0;
  virtual bool secure() const = 0;  // arrived over TLS
  // The port of the listener the request arrived on (0 when not known).
  virtual uint16_t local_port() const { return 0; }

  // Whole response with Content-Length. Returns false if the client went away.
  virtual awaitable<bool> respond(int status, HeaderList headers, std::string_view body) = 0;
  // Streaming: the status and headers, then write_body() pieces, then end_body(). Without a
  // content length the body is sent chunked (or close-delimited to HTTP/1.0 clients).
  virtual awaitable<bool> begin_body(int status, HeaderList headers,
                                     std::optional<uint64_t> content_length) = 0;
  virtual awaitable<bool> write_body(std::string_view data) = 0;
  virtual awaitable<bool> end_body() = 0;
  // True once any byte of the response was handed to the socket.
  virtual bool response_started() const = 0;
  virtual bool response_complete() const = 0;
  // After an error mid-body: the connection is closed once the handler returns.
  virtual void close_after() = 0;
  // Drops the connection now without (finishing) a response, as a crashing server would.
  virtual void abort() = 0;
  // Sends the status line and headers given to begin_body() now, before any body byte.
  virtual awaitable<bool> flush() = 0;

  // Calls `fn` (on this exchange's executor) if the client closes its connection before the
  // response is complete, or when the server closes it by force at shutdown. One watch per
  // exchange; stopped by unwatch_disconnect() or, at the latest, when the handler returns.
  virtual void watch_disconnect(std::function<void()> fn) = 0;
  virtual void unwatch_disconnect() = 0;
  virtual bool client_gone() const = 0;

  virtual Executor executor() = 0;
};

using Handler = std::function<awaitable<void>(Exchange&)>;

// Destroy a Server only once every one of its io_contexts has stopped running (and before they are
// destroyed): its acceptors and parking lots belong to them. Connections in progress keep what
// they need alive on their own.
class Server {
 public:
  // Binds one acceptor on each io_context. Throws std::runtime_error naming host:port and the
  // reason when the address cannot be bound, or the TLS files cannot be loaded.
  Server(const std::vector<asio::io_context*>& contexts, ServerConfig config, Handler handler);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  uint16_t port() const { return port_; }
  // Starts accepting on every context (the contexts are run by the caller's threads).
  void start();
  // Graceful: stops accepting, closes idle keep-alive connections, and makes every exchange in
  // progress answer with `connection: close` and close when it is done.
  void stop();
  // Forceful (after a grace period): closes every connection now; an exchange in progress sees
  // its client gone (its disconnect watch fires).
  void close_all();
  const ServerStats& stats() const;
  // Connections not waiting for a next request: a request being read, handled or answered (what
  // a graceful shutdown waits for, besides the requests the handler counts).
  int64_t busy_connections() const;

  struct Shared;  // what sessions share: config, handler, stopping flag, sessions, stats

 private:
  std::shared_ptr<Shared> shared_;
  std::vector<std::unique_ptr<Acceptor>> acceptors_;
  uint16_t port_ = 0;
};

}  // namespace kvgate::http
