// http/client: upstream HTTP/1.1 calls (http:// or https://) over per-thread keep-alive connection
// pools. A call sends one request, reads the status and headers (skipping interim 1xx answers),
// then the body in pieces as they arrive (the proxy relays each piece before reading the next:
// backpressure, no unbounded buffering).
//
// Connection reuse is what makes a proxy leak one user's answer to another, so it is strict: a
// connection goes back to the pool only when its response was read to the end, the peer allowed
// keep-alive, the request was written whole and nothing unread is left; a pooled connection is
// checked before reuse (a peer that closed it, or sent bytes nobody asked for, means it is
// dropped). A reused connection that fails while the request is being written is replaced
// transparently, once: the worker cannot have started a request it did not receive whole.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "http/io.h"
#include "http/message.h"

namespace kvgate::http {

class TlsClientContext;
enum class ParseError : uint8_t;  // http/parser.h

// Where an upstream lives: parsed once from a URL, resolved once.
struct Target {
  std::string url;   // as configured, without a trailing slash
  std::string host;  // host name or IP literal (no brackets)
  uint16_t port = 80;
  bool https = false;
  // https: how to verify the worker and what to present (set before use; see TlsClientContext).
  std::shared_ptr<const TlsClientContext> tls;
  std::string host_header;  // host[:port] for the Host header
  std::string base_path;    // "" or "/prefix" (prepended to every request path)
  std::vector<asio::ip::tcp::endpoint> endpoints;
};

// Parses "http[s]://host[:port][/base]". Returns "" or an error naming what is wrong.
std::string parse_url(std::string_view url, Target& out);

// TLS settings for https workers: the CA bundle that verifies them (the system's when empty) and
// an optional client certificate + key (mutual TLS). The worker's certificate must name the host
// of its URL. Immutable once made; shared by every connection.
class TlsClientContext {
 public:
  // Returns null and sets `error` (naming the file and the fix) when a file cannot be used.
  static std::shared_ptr<const TlsClientContext> create(const std::string& ca_file,
                                                        const std::string& cert_file,
                                                        const std::string& key_file,
                                                        std::string& error);
  ~TlsClientContext();
  TlsClientContext(const TlsClientContext&) = delete;
  TlsClientContext& operator=(const TlsClientContext&) = delete;
  void* native() const;  // the asio::ssl::context (opaque here: no TLS headers in this one)

 private:
  TlsClientContext();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};
// Resolves host (blocking; call at startup or on a control thread). Returns "" or an error.
std::string resolve(Target& target);

struct Connection;  // a keep-alive socket with its read buffer (defined in client.cc)

// Idle keep-alive connections of one thread, per upstream key. Not thread-safe: one per io_context.
class ConnectionPool {
 public:
  struct Options {
    size_t max_idle_per_target = 512;
    // Below the keep-alive timeout of the workers' HTTP servers (uvicorn, which SGLang runs,
    // closes idle connections after 5 s): a connection the worker is about to close is not reused.
    std::chrono::milliseconds idle_timeout{4000};
    std::chrono::milliseconds connect_timeout{10000};
    bool operator==(const Options&) const = default;
  };
  ConnectionPool();
  explicit ConnectionPool(Options options);
  ~ConnectionPool();
  ConnectionPool(const ConnectionPool&) = delete;
  ConnectionPool& operator=(const ConnectionPool&) = delete;

  // An idle connection to `key` still fit for a request, or null. Connections found closed by the
  // peer, or with bytes nobody asked for, are dropped on the way.
  std::unique_ptr<Connection> take(uint64_t key);
  void give(uint64_t key, std::unique_ptr<Connection> c);
  // Drops every idle connection of `key` (a worker was removed or failed).
  void drop(uint64_t key);
  // Drops idle connections past the idle timeout (call periodically: the worker closes its end).
  void reap(Clock::time_point now);
  // Drops every idle connection and pools none from now on (the thread is shutting down).
  void close();
  const Options& options() const { return options_; }
  size_t idle_count() const;
  uint64_t stale_dropped() const { return stale_dropped_; }

 private:
  Options options_;
  bool closed_ = false;
  uint64_t stale_dropped_ = 0;
  std::unordered_map<uint64_t, std::vector<std::unique_ptr<Connection>>> idle_;
};

enum class CallError {
  kNone,
  kConnect,   // could not connect (refused, unreachable, connect or TLS handshake timeout)
  kTimeout,   // the deadline passed
  kReset,     // the connection failed (see UpstreamCall::request_sent() for how far it got)
  kProtocol,  // the peer's response is not valid HTTP
  kAborted,   // abort() was called (client went away)
};
std::string_view to_string(CallError e);

class UpstreamCall {
 public:
  UpstreamCall(Executor ex, ConnectionPool& pool, const Target& target, uint64_t key);
  ~UpstreamCall();
  UpstreamCall(const UpstreamCall&) = delete;
  UpstreamCall& operator=(const UpstreamCall&) = delete;

  void set_deadline(Clock::time_point deadline) { deadline_ = deadline; }

  // Sends the request and reads the response status and headers.
  awaitable<CallError> start(std::string_view method, std::string_view path, HeaderList headers,
                             std::string_view body);
  int status() const;
  std::string_view header(std::string_view name) const;
  void for_each_header(const std::function<void(std::string_view, std::string_view)>& fn) const;
  bool has_connection_header() const;  // the response has a Connection field
  std::optional<uint64_t> content_length() const;
  bool done() const { return done_; }
  // The next piece of body, where it lies in the connection's read buffer (no copy): valid until
  // the next call on this object. Empty when the body is complete, or on failure (`error` set,
  // never with data: the data before a malformed chunk comes first, the error on the next call;
  // once failed, every later call fails the same way).
  awaitable<std::string_view> read_view(CallError& error);
  // Reads the rest of the body into out (at most `limit` bytes, else kProtocol).
  awaitable<CallError> read_all(std::string& out, size_t limit = 64 << 20);
  // Closes the connection now; a pending operation completes with kAborted.
  void abort();
  bool aborted() const { return aborted_; }
  bool connected_fresh() const { return fresh_; }
  // How long the new connection this call made took to connect (TCP, and TLS's handshake for
  // https), when it made one that connected; nullopt when it reused a pooled connection.
  std::optional<Clock::duration> connect_time() const { return connect_time_; }
  // True once the whole request (head and body) was handed to the worker's connection: from then
  // on the worker may be running it, and sending it again could run it twice.
  bool request_sent() const { return sent_; }
  // True once any byte of the response arrived.
  bool response_started() const { return response_started_; }
  // The failed connect/IO error text, for logs and error messages.
  const std::string& error_detail() const { return detail_; }

 private:
  awaitable<CallError> connect();
  CallError classify(const boost::system::error_code& ec);
  CallError malformed(ParseError e);  // drops the connection; kProtocol

  Executor ex_;
  ConnectionPool& pool_;
  const Target& target_;
  uint64_t key_;
  std::unique_ptr<Connection> conn_;
  Clock::time_point deadline_ = Clock::time_point::max();
  std::string head_;
  std::string detail_;
  bool done_ = false;
  bool aborted_ = false;
  CallError read_error_ = CallError::kNone;  // how reading the body failed, for every later read
  bool fresh_ = false;
  std::optional<Clock::duration> connect_time_;
  bool sent_ = false;
  bool response_started_ = false;
};

// One-shot GET/POST with a fresh connection and a timeout: health probes, load polls, admin.
struct FetchResult {
  CallError error = CallError::kNone;
  int status = 0;
  std::string body;
  std::string detail;
  // The answer's headers (names as sent), when `keep_headers` was asked.
  std::vector<std::pair<std::string, std::string>> headers;
  // The value of header `name` (case-insensitive), or "".
  std::string_view header(std::string_view name) const;
};
// `keep_headers`: fill FetchResult::headers (the doctor reads the gateway's debug headers).
// A body longer than `max_body` is an error (status still set: the head was read).
awaitable<FetchResult> fetch(Executor ex, const Target& target, std::string_view method,
                             std::string_view path, std::chrono::milliseconds timeout,
                             std::string_view body = {}, HeaderList headers = {},
                             bool keep_headers = false, size_t max_body = 16 << 20);

}  // namespace kvgate::http
