// http/server: an HTTP/1.1 server on Asio coroutines. One acceptor per io_context (SO_REUSEPORT, so
// the kernel spreads connections over threads), keep-alive, pipelined requests answered in order,
// header and body limits, Expect: 100-continue. It knows HTTP, not LLMs: each request becomes an
// Exchange handed to a Handler coroutine, which answers whole or streams the body.
#pragma once

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
  uint16_t port = 0;                        // 0 = any free port (see Server::port())
  size_t header_limit = size_t{64} * 1024;  // request line + headers; more -> 431
  uint64_t body_limit = 512ull << 20;       // more -> 413
  std::chrono::seconds idle_timeout{75};    // no request on a keep-alive connection; a write stuck
  std::chrono::seconds read_timeout{300};   // receiving one whole request
  int backlog = 4096;
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
  // The request body; capacity() >= size() + kBodyPadding, so it can be parsed in place.
  virtual std::string& body() = 0;
  virtual const std::string& remote_address() const = 0;

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
  // response is complete. One watch per exchange; stopped by unwatch_disconnect() or, at the
  // latest, when the handler returns.
  virtual void watch_disconnect(std::function<void()> fn) = 0;
  virtual void unwatch_disconnect() = 0;
  virtual bool client_gone() const = 0;

  virtual asio::any_io_executor executor() = 0;
};

using Handler = std::function<awaitable<void>(Exchange&)>;

// Destroy a Server only once its io_contexts have stopped running (or from their threads): its
// acceptors belong to them. Connections in progress keep what they need alive on their own.
class Server {
 public:
  // Binds one acceptor on each io_context. Throws std::runtime_error naming host:port and the
  // reason when the address cannot be bound.
  Server(const std::vector<asio::io_context*>& contexts, ServerConfig config, Handler handler);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  uint16_t port() const { return port_; }
  // Starts accepting on every context (the contexts are run by the caller's threads).
  void start();
  // Stops accepting; open connections finish their current exchange and close.
  void stop();

  struct Shared;  // what sessions share: config, handler, the stopping flag

 private:
  std::shared_ptr<Shared> shared_;
  std::vector<std::unique_ptr<asio::ip::tcp::acceptor>> acceptors_;
  uint16_t port_ = 0;
};

}  // namespace kvgate::http
