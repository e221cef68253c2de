// http/server: see server.h. The only server-side translation unit that includes Beast.
#include "http/server.h"

#include <array>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <charconv>
#include <stdexcept>

#include "http/deadline.h"
#include "http/padded_body.h"
#include "util/log.h"

namespace kvgate::http {
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using asio::ip::tcp;
constexpr auto kTuple = asio::as_tuple(asio::use_awaitable);

struct Server::Shared {
  ServerConfig config;
  Handler handler;
  std::atomic<bool> stopping{false};
};

namespace {

using Request = bhttp::request<PaddedStringBody>;

// Shared with the disconnect watch's completion, which may run after the exchange is gone.
struct WatchState {
  bool done = false;
  bool gone = false;
  char peek = 0;
  std::function<void()> fn;
};

class ExchangeImpl final : public Exchange {
 public:
  ExchangeImpl(tcp::socket& socket, Deadline& deadline, beast::flat_buffer& buffer, Request& req,
               const std::string& remote, const ServerConfig& cfg, std::string& scratch)
      : socket_(socket),
        deadline_(deadline),
        buffer_(buffer),
        req_(req),
        remote_(remote),
        cfg_(cfg),
        head_(scratch) {}

  ~ExchangeImpl() override { unwatch_disconnect(); }

  std::string_view method() const override { return req_.method_string(); }
  std::string_view target() const override { return req_.target(); }
  unsigned version() const override { return req_.version(); }
  std::string_view header(std::string_view name) const override {
    auto it = req_.find(name);
    return it == req_.end() ? std::string_view{} : std::string_view(it->value());
  }
  void for_each_header(
      const std::function<void(std::string_view, std::string_view)>& fn) const override {
    for (const auto& f : req_) fn(f.name_string(), f.value());
  }
  std::string& body() override { return req_.body(); }
  const std::string& remote_address() const override { return remote_; }

  awaitable<bool> respond(int status, HeaderList headers, std::string_view body) override {
    start_head(status, headers);
    append_content_length(head_, body.size());
    head_.append("\r\n");
    started_ = true;
    bool head_only = req_.method() == bhttp::verb::head;
    std::array<asio::const_buffer, 2> bufs{asio::buffer(head_),
                                           asio::buffer(body.data(), head_only ? 0 : body.size())};
    bool ok = co_await write(bufs);
    complete_ = ok;
    co_return ok;
  }

  awaitable<bool> begin_body(int status, HeaderList headers,
                             std::optional<uint64_t> content_length) override {
    start_head(status, headers);
    if (content_length) {
      append_content_length(head_, *content_length);
      remaining_ = *content_length;
      chunked_ = false;
    } else if (req_.version() >= 11) {
      head_.append("transfer-encoding: chunked\r\n");
      chunked_ = true;
    } else {
      close_ = true;  // HTTP/1.0: the end of the body is the end of the connection
      chunked_ = false;
    }
    if (close_ && !closing_header_written_) head_.append("connection: close\r\n");
    head_.append("\r\n");
    head_pending_ = true;
    started_ = true;
    streaming_ = true;
    co_return true;
  }

  awaitable<bool> write_body(std::string_view data) override {
    if (!streaming_ || data.empty()) co_return !client_gone();
    if (remaining_) {
      if (data.size() > *remaining_) {
        close_ = true;
        data = data.substr(0, static_cast<size_t>(*remaining_));
      }
      *remaining_ -= data.size();
    }
    std::array<asio::const_buffer, 4> bufs;
    size_t n = 0;
    if (head_pending_) bufs[n++] = asio::buffer(head_);
    char size_line[20];
    if (chunked_) {
      char* end = std::to_chars(size_line, size_line + 16, data.size(), 16).ptr;
      *end++ = '\r';
      *end++ = '\n';
      bufs[n++] = asio::buffer(size_line, static_cast<size_t>(end - size_line));
      bufs[n++] = asio::buffer(data);
      bufs[n++] = asio::buffer("\r\n", 2);
    } else {
      bufs[n++] = asio::buffer(data);
    }
    head_pending_ = false;
    co_return co_await write(std::span<const asio::const_buffer>(bufs.data(), n));
  }

  awaitable<bool> end_body() override {
    if (!streaming_ || complete_) co_return !close_;
    std::array<asio::const_buffer, 2> bufs;
    size_t n = 0;
    if (head_pending_) bufs[n++] = asio::buffer(head_);
    if (chunked_) bufs[n++] = asio::buffer("0\r\n\r\n", 5);
    head_pending_ = false;
    bool ok = true;
    if (n) ok = co_await write(std::span<const asio::const_buffer>(bufs.data(), n));
    if (remaining_ && *remaining_ != 0) close_ = true;  // short body: the client must see EOF
    complete_ = ok;
    co_return ok;
  }

  bool response_started() const override { return started_; }
  bool response_complete() const override { return complete_; }
  void close_after() override { close_ = true; }
  void abort() override {
    boost::system::error_code ignored;
    socket_.close(ignored);
    gone_ = true;
    close_ = true;
    complete_ = true;  // nothing more will be said on this connection
  }
  awaitable<bool> flush() override {
    if (!head_pending_) co_return !gone_;
    head_pending_ = false;
    co_return co_await write(asio::buffer(head_));
  }
  bool must_close() const { return close_; }

  void watch_disconnect(std::function<void()> fn) override {
    if (watch_ || complete_) return;
    watch_ = std::make_shared<WatchState>();
    watch_->fn = std::move(fn);
    if (buffer_.size() > 0) return;  // pipelined bytes already here: the client is still talking
    // A one-byte MSG_PEEK receive: it completes on EOF or reset (client gone) or when the next
    // pipelined request arrives (left in the socket). Being a speculative read, it costs no system
    // call while the socket is known to be drained, unlike async_wait (an epoll_ctl per call).
    auto state = watch_;
    socket_.async_receive(
        asio::buffer(&state->peek, 1), tcp::socket::message_peek,
        asio::bind_cancellation_slot(cancel_.slot(),
                                     [state](const boost::system::error_code& ec, size_t n) {
                                       if (state->done || ec == asio::error::operation_aborted)
                                         return;
                                       if (ec || n == 0) {
                                         state->gone = true;
                                         if (state->fn) state->fn();
                                       }
                                     }));
  }
  bool client_gone() const override { return gone_ || (watch_ && watch_->gone); }

  void unwatch_disconnect() override {
    if (!watch_ || watch_->done) return;
    watch_->done = true;
    watch_->fn = nullptr;
    cancel_.emit(asio::cancellation_type::all);
  }

  asio::any_io_executor executor() override { return socket_.get_executor(); }

 private:
  void start_head(int status, HeaderList headers) {
    head_.clear();
    append_status_line(head_, status, req_.version() >= 11 ? 11 : 10);
    for (const auto& h : headers) append_header(head_, h.name, h.value);
    bool keep = req_.keep_alive() && !close_;
    if (!keep) {
      close_ = true;
      head_.append("connection: close\r\n");
      closing_header_written_ = true;
    } else if (req_.version() < 11) {
      head_.append("connection: keep-alive\r\n");
    }
  }

  template <class Buffers>
  awaitable<bool> write(const Buffers& bufs) {
    if (gone_) co_return false;
    // A client that stops reading is dropped. The idle timeout, not the (longer) read timeout:
    // the deadline then never moves earlier between requests, so the timer is not re-armed.
    deadline_.expires_after(cfg_.idle_timeout);
    auto [ec, n] = co_await asio::async_write(socket_, bufs, kTuple);
    (void)n;
    if (ec) {
      gone_ = true;
      close_ = true;
      co_return false;
    }
    co_return true;
  }

  tcp::socket& socket_;
  Deadline& deadline_;
  beast::flat_buffer& buffer_;
  Request& req_;
  const std::string& remote_;
  const ServerConfig& cfg_;
  std::string& head_;
  std::optional<uint64_t> remaining_;
  std::shared_ptr<WatchState> watch_;
  asio::cancellation_signal cancel_;
  bool started_ = false;
  bool complete_ = false;
  bool streaming_ = false;
  bool chunked_ = false;
  bool head_pending_ = false;
  bool close_ = false;
  bool closing_header_written_ = false;
  bool gone_ = false;
};

// Writes a minimal error response on a connection whose request could not be read.
awaitable<void> reject(tcp::socket& socket, Deadline& deadline, int status, std::string_view code,
                       std::string_view message) {
  std::string body = R"({"error":{"type":"invalid_request_error","code":")" + std::string(code) +
                     R"(","message":")";
  for (char c : message) {
    if (c == '"' || c == '\\') body.push_back('\\');
    if (static_cast<unsigned char>(c) >= 0x20) body.push_back(c);
  }
  body += "\"}}";
  std::string head;
  append_status_line(head, status);
  append_header(head, "content-type", "application/json");
  append_header(head, "content-length", std::to_string(body.size()));
  append_header(head, "connection", "close");
  head += "\r\n";
  std::array<asio::const_buffer, 2> bufs{asio::buffer(head), asio::buffer(body)};
  deadline.expires_after(std::chrono::seconds(5));
  co_await asio::async_write(socket, bufs, kTuple);
}

bool is_quiet_close(const boost::system::error_code& ec) {
  return ec == bhttp::error::end_of_stream || ec == asio::error::eof ||
         ec == asio::error::connection_reset || ec == asio::error::bad_descriptor ||
         ec == asio::error::operation_aborted || ec == bhttp::error::partial_message;
}

awaitable<void> session(std::shared_ptr<Server::Shared> srv, tcp::socket socket) {
  const ServerConfig& cfg = srv->config;
  boost::system::error_code ignored;
  socket.set_option(tcp::no_delay(true), ignored);
  std::string remote;
  {
    auto ep = socket.remote_endpoint(ignored);
    if (!ignored) remote = ep.address().to_string();
  }
  Deadline deadline(socket.get_executor(), socket);
  beast::flat_buffer buffer;
  buffer.reserve(16384);  // Beast reads what fits: a small buffer means a recv per 512 bytes
  std::string scratch;
  scratch.reserve(512);

  for (;;) {
    bhttp::request_parser<PaddedStringBody> parser;
    parser.header_limit(static_cast<std::uint32_t>(cfg.header_limit));
    parser.body_limit(cfg.body_limit);
    deadline.expires_after(buffer.size() ? cfg.read_timeout : cfg.idle_timeout);
    auto [ec, n] = co_await bhttp::async_read_header(socket, buffer, parser, kTuple);
    (void)n;
    if (!ec && !parser.is_done() && buffer.size() > 0) {
      // The body usually arrives with the head: parse it in place, no asynchronous round trip.
      size_t used = parser.put(buffer.data(), ec);
      buffer.consume(used);
      if (ec == bhttp::error::need_more) ec = {};
    }
    if (!ec && !parser.is_done()) {
      if (buffer.size() == 0 && http::iequals(parser.get()[bhttp::field::expect], "100-continue")) {
        static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
        co_await asio::async_write(socket, asio::buffer(kContinue), kTuple);
      }
      deadline.expires_after(cfg.read_timeout);
      std::tie(ec, n) = co_await bhttp::async_read(socket, buffer, parser, kTuple);
    }
    if (ec) {
      if (ec == bhttp::error::body_limit) {
        co_await reject(socket, deadline, 413, "payload_too_large",
                        "request body exceeds --max-payload-size (" +
                            std::to_string(cfg.body_limit) + " bytes)");
      } else if (ec == bhttp::error::header_limit) {
        co_await reject(socket, deadline, 431, "headers_too_large",
                        "request headers exceed " + std::to_string(cfg.header_limit) + " bytes");
      } else if (!is_quiet_close(ec)) {
        co_await reject(socket, deadline, 400, "bad_http_request",
                        "malformed HTTP request: " + ec.message());
      }
      break;
    }
    deadline.never();
    Request& req = parser.get();
    bool close = false;
    {
      ExchangeImpl ex(socket, deadline, buffer, req, remote, cfg, scratch);
      try {
        co_await srv->handler(ex);
      } catch (const std::exception& e) {
        // Handlers map bad input to 4xx themselves; this is a bug: answer 500 (below) and log it.
        log::error("handler failed").kv("error", e.what()).kv("target", ex.target());
      }
      if (!ex.response_complete()) {
        if (!ex.response_started() && !ex.client_gone()) {
          static constexpr Header kJson[] = {{"content-type", "application/json"}};
          co_await ex.respond(
              500, kJson,
              R"({"error":{"type":"server_error","code":"no_response","message":"the handler produced no response"}})");
        }
        ex.close_after();
      }
      close = ex.must_close() || ex.client_gone() || !req.keep_alive();
    }
    if (close || srv->stopping.load(std::memory_order_relaxed)) break;
  }
  socket.shutdown(tcp::socket::shutdown_send, ignored);
  socket.close(ignored);
}

awaitable<void> accept_loop(std::shared_ptr<Server::Shared> srv, tcp::acceptor* acceptor) {
  for (;;) {
    auto [ec, socket] = co_await acceptor->async_accept(kTuple);
    if (srv->stopping.load()) co_return;
    if (ec) {
      if (ec == asio::error::operation_aborted) co_return;
      log::warn("accept failed").kv("error", ec.message());
      asio::steady_timer t(acceptor->get_executor(), std::chrono::milliseconds(50));
      co_await t.async_wait(kTuple);
      continue;
    }
    asio::co_spawn(acceptor->get_executor(), session(srv, std::move(socket)), asio::detached);
    // Take every connection already waiting (like nginx's multi_accept): on a busy loop each
    // asynchronous accept waits its turn behind all other handlers, and a burst of new
    // connections would otherwise trickle in one per turn.
    for (int i = 0; i < 64; ++i) {
      tcp::socket more(acceptor->get_executor());
      boost::system::error_code aec;
      acceptor->accept(more, aec);
      if (aec) break;
      asio::co_spawn(acceptor->get_executor(), session(srv, std::move(more)), asio::detached);
    }
  }
}

}  // namespace

Server::Server(const std::vector<asio::io_context*>& contexts, ServerConfig config, Handler handler)
    : shared_(std::make_shared<Shared>()) {
  shared_->config = std::move(config);
  shared_->handler = std::move(handler);
  const auto& cfg = shared_->config;
  boost::system::error_code ec;
  auto address = asio::ip::make_address(cfg.host, ec);
  if (ec) {
    throw std::runtime_error("cannot listen on '" + cfg.host +
                             "': not an IP address (use e.g. 0.0.0.0 or 127.0.0.1)");
  }
  uint16_t port = cfg.port;
  for (auto* ctx : contexts) {
    auto acc = std::make_unique<tcp::acceptor>(*ctx);
    tcp::endpoint ep(address, port);
    acc->open(ep.protocol(), ec);
    if (!ec) acc->set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) {
      int one = 1;
      if (::setsockopt(acc->native_handle(), SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) != 0) {
        ec.assign(errno, boost::system::system_category());
      }
    }
    if (!ec) acc->bind(ep, ec);
    if (!ec) acc->listen(cfg.backlog, ec);
    if (ec) {
      throw std::runtime_error("cannot listen on " + cfg.host + ":" + std::to_string(port) + ": " +
                               ec.message() +
                               (ec == asio::error::address_in_use
                                    ? " (another process holds the port; pick another with --port)"
                                    : ""));
    }
    if (!ec) acc->non_blocking(true, ec);  // accept() in the drain loop must not block
    port = acc->local_endpoint().port();
    acceptors_.push_back(std::move(acc));
  }
  port_ = port;
}

Server::~Server() {
  stop();
}

void Server::start() {
  for (auto& acc : acceptors_) {
    asio::co_spawn(acc->get_executor(), accept_loop(shared_, acc.get()), asio::detached);
  }
}

void Server::stop() {
  if (shared_->stopping.exchange(true)) return;
  for (auto& acc : acceptors_) {
    asio::post(acc->get_executor(), [a = acc.get()] {
      boost::system::error_code ignored;
      a->close(ignored);
    });
  }
}

}  // namespace kvgate::http
