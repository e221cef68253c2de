// http/client: upstream HTTP/1.1 calls over per-thread keep-alive connection pools. A call sends
// one request, reads the status and headers, then the body in pieces as they arrive (the proxy
// relays each piece before reading the next: backpressure, no unbounded buffering). A reused
// connection that turns out closed by the peer is replaced transparently, once, before any response
// byte.
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

// Where an upstream lives: parsed once from a URL, resolved once.
struct Target {
  std::string url;   // as configured, without a trailing slash
  std::string host;  // host name or IP literal (no brackets)
  uint16_t port = 80;
  std::string host_header;  // host[:port] for the Host header
  std::string base_path;    // "" or "/prefix" (prepended to every request path)
  std::vector<asio::ip::tcp::endpoint> endpoints;
};

// Parses "http://host[:port][/base]". Returns "" or an error naming what is wrong.
std::string parse_url(std::string_view url, Target& out);
// Resolves host (blocking; call at startup or on a control thread). Returns "" or an error.
std::string resolve(Target& target);

struct Connection;  // a keep-alive socket with its read buffer (defined in client.cc)

// Idle keep-alive connections of one thread, per upstream key. Not thread-safe: one per io_context.
class ConnectionPool {
 public:
  struct Options {
    size_t max_idle_per_target = 512;
    std::chrono::seconds idle_timeout{30};
    std::chrono::seconds connect_timeout{10};
  };
  ConnectionPool();
  explicit ConnectionPool(Options options);
  ~ConnectionPool();
  ConnectionPool(const ConnectionPool&) = delete;
  ConnectionPool& operator=(const ConnectionPool&) = delete;

  std::unique_ptr<Connection> take(uint64_t key);
  void give(uint64_t key, std::unique_ptr<Connection> c);
  // Drops every idle connection of `key` (a worker was removed or failed).
  void drop(uint64_t key);
  const Options& options() const { return options_; }
  size_t idle_count() const;

 private:
  Options options_;
  std::unordered_map<uint64_t, std::vector<std::unique_ptr<Connection>>> idle_;
};

enum class CallError {
  kNone,
  kConnect,   // could not connect (refused, unreachable, connect timeout)
  kTimeout,   // the deadline passed
  kReset,     // the connection failed after the request was sent
  kProtocol,  // the peer's response is not valid HTTP
  kAborted,   // abort() was called (client went away)
};
std::string_view to_string(CallError e);

class UpstreamCall {
 public:
  UpstreamCall(asio::any_io_executor ex, ConnectionPool& pool, const Target& target, uint64_t key);
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
  std::optional<uint64_t> content_length() const;
  bool done() const { return done_; }
  // Reads the next piece of body into buf. Returns bytes read (> 0), or 0 when the body is
  // complete; `error` is set on failure.
  awaitable<size_t> read_some(char* buf, size_t cap, CallError& error);
  // Reads the rest of the body into out (at most `limit` bytes, else kProtocol).
  awaitable<CallError> read_all(std::string& out, size_t limit = 64 << 20);
  // Closes the connection now; a pending operation completes with kAborted.
  void abort();
  bool aborted() const { return aborted_; }
  bool connected_fresh() const { return fresh_; }
  // The failed connect/IO error text, for logs and error messages.
  const std::string& error_detail() const { return detail_; }

 private:
  awaitable<CallError> connect();
  CallError classify(const boost::system::error_code& ec);

  asio::any_io_executor ex_;
  ConnectionPool& pool_;
  const Target& target_;
  uint64_t key_;
  std::unique_ptr<Connection> conn_;
  Clock::time_point deadline_ = Clock::time_point::max();
  std::string head_;
  std::string detail_;
  bool done_ = false;
  bool aborted_ = false;
  bool fresh_ = false;
};

// One-shot GET/POST with a fresh connection and a timeout: health probes, load polls, admin.
struct FetchResult {
  CallError error = CallError::kNone;
  int status = 0;
  std::string body;
  std::string detail;
};
awaitable<FetchResult> fetch(asio::any_io_executor ex, const Target& target,
                             std::string_view method, std::string_view path,
                             std::chrono::milliseconds timeout, std::string_view body = {},
                             HeaderList headers = {});

}  // namespace kvgate::http
