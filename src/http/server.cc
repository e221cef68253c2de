// http/server: see server.h. The only server-side translation unit that includes Asio's TLS.
// Requests are parsed by http/parser, in place in the connection's read buffer.
#include "http/server.h"

#include <openssl/ssl.h>
#include <poll.h>

#include <array>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/error.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/write.hpp>
#include <charconv>
#include <stdexcept>

#include "http/deadline.h"
#include "http/parking.h"
#include "http/parser.h"
#include "http/read_buffer.h"
#include "http/write_now.h"
#include "util/json.h"
#include "util/log.h"

namespace kvgate::http {
namespace ssl = boost::asio::ssl;
using asio::ip::tcp;
constexpr auto kTuple = asio::as_tuple(use_awaitable);

namespace {

// Bytes a connection reads into. Given back while a request's answer streams (the head moved out
// of it first: serve_one), and with the rest of the connection's memory when it is parked
// (http/parking).
constexpr size_t kReadBufferSize = ReadBuffer::kBlockSize;
// The least room a read into the buffer is given (fewer free bytes: moved or grown first).
constexpr size_t kMinRead = 1024;
// A body of known length is read straight into its string, in reads as large as what remains,
// but the string grows only as fast as bytes arrive (at most doubling, from this step): a
// Content-Length alone makes it reserve, not touch, the memory.
constexpr size_t kBodyStep = 65536;
// How long an idle plain-TCP keep-alive connection stays a session (its frames, read buffer and
// reactor state kept) before it is parked (http/parking), holding only its descriptor.
constexpr auto kParkAfter = std::chrono::milliseconds(1000);

// What a forced close (shutdown after the grace period) does to an exchange in progress.
class ForceClosable {
 public:
  virtual void force_close() = 0;

 protected:
  ~ForceClosable() = default;
};

// A connection, in the list of its io_context (only that context's thread touches the list).
struct SessionNode {
  SessionNode* prev = this;
  SessionNode* next = this;
  Socket* socket = nullptr;
  ForceClosable* exchange = nullptr;  // the exchange in progress, if any
  bool idle = false;                  // waiting for the next request
  void link_after(SessionNode& head) {
    prev = &head;
    next = head.next;
    head.next->prev = this;
    head.next = this;
  }
  void unlink() {
    prev->next = next;
    next->prev = prev;
    prev = next = this;
  }
};

}  // namespace

std::string_view ServerStats::reject_name(size_t kind) {
  switch (kind) {
    case kBadRequest:
      return "bad_request";
    case kHeadersTooLarge:
      return "headers_too_large";
    case kBodyTooLarge:
      return "body_too_large";
    case kHeaderTimeout:
      return "header_timeout";
    case kBodyTimeout:
      return "body_timeout";
    case kTlsHandshake:
      return "tls_handshake";
    default:
      return "unknown";
  }
}

struct Server::Shared {
  ServerConfig config;
  Handler handler;
  std::atomic<bool> stopping{false};
  uint16_t port = 0;  // the bound port (set before accepting)
  ServerStats stats;
  std::unique_ptr<ssl::context> tls;
  std::vector<asio::io_context*> contexts;
  std::vector<std::unique_ptr<SessionNode>> sessions;  // list heads, one per context
  std::vector<std::unique_ptr<ParkingLot>> parking;    // one per context
  // Contexts that have seen stop() (closed their acceptor, sorted their idle connections): until
  // all have, the server counts as busy (a connection whose request just arrived may still look
  // idle there).
  std::atomic<size_t> stopped_contexts{0};
};

namespace {

// A request being read or handled: its head (fields in the connection's read buffer, or in the
// connection's head_store once moved out of it: serve_one) and body.
struct Request {
  HeadParser head{HeadParser::Kind::kRequest};
  std::string body;
};

Socket& lowest(Socket& s) {
  return s;
}
Socket& lowest(ssl::stream<Socket&>& s) {
  return s.next_layer();
}

// Shared with the disconnect watch's completion, which may run after the exchange is gone.
struct WatchState {
  bool done = false;
  bool gone = false;
  char peek = 0;
  int fd = -1;
  std::function<void()> fn;
  std::unique_ptr<Timer> recheck;  // while bytes wait unread (see watch_disconnect)
  // Runs the callback once, at most.
  void fire() {
    if (done) return;
    done = true;
    gone = true;
    auto f = std::move(fn);
    fn = nullptr;
    if (f) f();
  }
};

template <class Stream>
class ExchangeImpl final : public Exchange, public ForceClosable {
 public:
  ExchangeImpl(Stream& stream, Deadline& deadline, ReadBuffer& buffer, Request& req,
               const std::string& remote, Server::Shared& srv, std::string& scratch)
      : stream_(stream),
        socket_(lowest(stream)),
        deadline_(deadline),
        buffer_(buffer),
        req_(req),
        remote_(remote),
        srv_(srv),
        head_(scratch) {}

  ~ExchangeImpl() override { unwatch_disconnect(); }
  ExchangeImpl(const ExchangeImpl&) = delete;
  ExchangeImpl& operator=(const ExchangeImpl&) = delete;

  std::string_view method() const override { return req_.head.method(); }
  std::string_view target() const override { return req_.head.target(); }
  unsigned version() const override { return req_.head.version(); }
  std::string_view header(std::string_view name) const override { return req_.head.find(name); }
  void for_each_header(
      const std::function<void(std::string_view, std::string_view)>& fn) const override {
    req_.head.for_each(fn);
  }
  bool has_connection_header() const override { return req_.head.has_connection(); }
  std::string& body() override { return req_.body; }
  const std::string& remote_address() const override { return remote_; }
  bool secure() const override { return !std::is_same_v<Stream, Socket>; }
  uint16_t local_port() const override { return srv_.port; }

  awaitable<bool> respond(int status, HeaderList headers, std::string_view body) override {
    start_head(status, headers);
    append_content_length(head_, body.size());
    head_.append("\r\n");
    started_ = true;
    bool head_only = req_.head.method() == "HEAD";
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
    } else if (req_.head.version() >= 11) {
      head_.append("transfer-encoding: chunked\r\n");
      chunked_ = true;
    } else {
      close_ = true;  // HTTP/1.0: the end of the body is the end of the connection
      chunked_ = false;
    }
    // A body of unknown length (a stream) may run for minutes: the connection's read buffer is
    // given back meanwhile when it holds nothing (serve_one moved the head out of it; a buffer
    // still holding the head or a pipelined request keeps it). The next read takes one again.
    if (!content_length) buffer_.release();
    if (close_ && !closing_header_written_) head_.append("connection: close\r\n");
    head_.append("\r\n");
    head_pending_ = true;
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
    started_ = true;
    co_return co_await write(std::span<const asio::const_buffer>(bufs.data(), n));
  }

  awaitable<bool> end_body() override {
    if (!streaming_ || complete_) co_return !close_;
    std::array<asio::const_buffer, 2> bufs;
    size_t n = 0;
    if (head_pending_) bufs[n++] = asio::buffer(head_);
    if (chunked_) bufs[n++] = asio::buffer("0\r\n\r\n", 5);
    head_pending_ = false;
    started_ = true;
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
    unwatch_disconnect();  // its fd is closed now, and may soon be another connection's
    boost::system::error_code ignored;
    socket_.close(ignored);
    gone_ = true;
    close_ = true;
    complete_ = true;  // nothing more will be said on this connection
  }
  awaitable<bool> flush() override {
    if (!head_pending_) co_return !gone_;
    head_pending_ = false;
    started_ = true;
    co_return co_await write(asio::buffer(head_));
  }
  bool must_close() const { return close_; }

  void watch_disconnect(std::function<void()> fn) override {
    if (watch_ || complete_) return;
    watch_ = std::make_shared<WatchState>();
    watch_->fn = std::move(fn);
    if (gone_) {
      // Already closed (by force): tell the watcher, from the executor, not from inside this call.
      asio::post(socket_.get_executor(), [w = watch_] { w->fire(); });
      return;
    }
    watch_->fd = socket_.native_handle();
    watch_->recheck = std::make_unique<Timer>(socket_.get_executor());
    // (The read buffer holds the request's head only when pipelined bytes followed it; otherwise
    // the head was moved out and the buffer is empty, or given back once the answer streams.)
    if (buffer_.size() > 0) {
      recheck_loop(watch_);  // pipelined bytes already here: only a hang-up can be seen
      return;
    }
    // A one-byte MSG_PEEK receive: it completes on EOF or reset (client gone) or when bytes
    // arrive (left in the socket: the next pipelined request, or a TLS close_notify). Being a
    // speculative read, it costs no system call while the socket is known to be drained, unlike
    // async_wait (an epoll_ctl per call). Once bytes wait unread, every read would see them, so
    // the client's hang-up behind them is looked for (POLLRDHUP) once a second instead.
    auto state = watch_;
    socket_.async_receive(
        asio::buffer(&state->peek, 1), Socket::message_peek,
        asio::bind_cancellation_slot(cancel_.slot(),
                                     [state](const boost::system::error_code& ec, size_t n) {
                                       if (state->done || ec == asio::error::operation_aborted)
                                         return;
                                       if (ec || n == 0 || peer_hung_up(state->fd)) {
                                         state->fire();
                                       } else {
                                         recheck_loop(state);
                                       }
                                     }));
  }

  static bool peer_hung_up(int fd) {
    pollfd p{fd, POLLRDHUP, 0};
    return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
  }

  // Every second until the watch ends: fires when the client hung up.
  static void recheck_loop(std::shared_ptr<WatchState> state) {
    Timer& timer = *state->recheck;
    timer.expires_after(std::chrono::seconds(1));
    timer.async_wait([state = std::move(state)](const boost::system::error_code& ec) mutable {
      if (ec || state->done) return;
      if (peer_hung_up(state->fd)) {
        state->fire();
        return;
      }
      recheck_loop(std::move(state));
    });
  }

  bool client_gone() const override { return gone_ || (watch_ && watch_->gone); }

  void unwatch_disconnect() override {
    if (!watch_ || watch_->done) return;
    watch_->done = true;
    watch_->fn = nullptr;
    cancel_.emit(asio::cancellation_type::all);
    if (watch_->recheck) watch_->recheck->cancel();
  }

  void force_close() override {
    gone_ = true;
    close_ = true;
    boost::system::error_code ignored;
    socket_.close(ignored);
    if (watch_) watch_->fire();
  }

  Executor executor() override { return socket_.get_executor(); }

 private:
  void start_head(int status, HeaderList headers) {
    head_.clear();
    append_status_line(head_, status, req_.head.version() >= 11 ? 11 : 10);
    for (const auto& h : headers) append_header(head_, h.name, h.value);
    // While the server drains, every answer closes its connection.
    bool keep = req_.head.keep_alive() && !close_ && !srv_.stopping.load(std::memory_order_relaxed);
    if (!keep) {
      close_ = true;
      head_.append("connection: close\r\n");
      closing_header_written_ = true;
    } else if (req_.head.version() < 11) {
      head_.append("connection: keep-alive\r\n");
    }
  }

  template <class Buffers>
  awaitable<bool> write(const Buffers& bufs) {
    if (gone_) co_return false;
    boost::system::error_code ec;
    size_t done = 0;
    if constexpr (std::is_same_v<Stream, Socket>) {
      done = write_now(socket_, bufs, ec);  // the usual case: taken whole, nothing to wait for
      if (!ec && done == asio::buffer_size(bufs)) co_return true;
    }
    bool timed_out = false;
    if (!ec) {
      // Bounded by progress, not by the length of the response: a write the client does not
      // take within the write timeout ends the connection; between writes nothing is armed, so
      // a stream may be quiet as long as its handler allows.
      auto rest = rest_after(bufs, done);
      deadline_.expires_after(srv_.config.write_timeout);
      auto [aec, n] = co_await asio::async_write(stream_, rest, kTuple);
      (void)n;
      ec = aec;
      timed_out = ec && deadline_.expired();
      deadline_.never();
    }
    if (ec) {
      if (timed_out) srv_.stats.write_timeouts.fetch_add(1, std::memory_order_relaxed);
      gone_ = true;
      close_ = true;
      co_return false;
    }
    co_return true;
  }

  Stream& stream_;
  Socket& socket_;
  Deadline& deadline_;
  // The connection's read buffer. With pipelined bytes after the request it holds the head,
  // pinned (method(), target() and header views point into it; release() refuses a pinned
  // buffer); otherwise serve_one moved the head out and it is empty: given back when a streamed
  // body begins.
  ReadBuffer& buffer_;
  Request& req_;
  const std::string& remote_;
  Server::Shared& srv_;
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

// Reads and discards what the client still sends, until it closes, stays quiet for a moment, or
// the linger time passes (then the caller closes). Closing with unread bytes would make the
// kernel send a reset, and the client could lose the answer it has not read yet (nginx's
// lingering close does the same).
awaitable<void> linger(Socket& socket, Deadline& deadline, std::chrono::milliseconds time) {
  constexpr auto kQuiet = std::chrono::milliseconds(500);
  boost::system::error_code ignored;
  socket.shutdown(Socket::shutdown_send, ignored);
  auto until = Clock::now() + time;
  thread_local std::array<char, 4096> discard;  // contents never read: sharing it is harmless
  size_t total = 0;
  for (;;) {
    deadline.expires_at(std::min(until, Clock::now() + kQuiet));
    auto [ec, n] = co_await socket.async_read_some(asio::buffer(discard), kTuple);
    total += n;
    if (ec || total > (size_t{64} << 20)) break;
  }
  deadline.never();
}

// Answers a request that could not be read with a JSON error and closes the connection lingering.
template <class Stream>
awaitable<void> reject(Stream& stream, Deadline& deadline, const ServerConfig& cfg, int status,
                       std::string_view code, std::string_view message) {
  std::string body = R"({"error":{"type":"invalid_request_error","code":)";
  json::append_string(body, code);
  body += R"(,"message":)";
  json::append_string(body, message);
  body += "}}";
  std::string head;
  append_status_line(head, status);
  append_header(head, "content-type", "application/json");
  append_content_length(head, body.size());
  append_header(head, "connection", "close");
  head += "\r\n";
  std::array<asio::const_buffer, 2> bufs{asio::buffer(head), asio::buffer(body)};
  deadline.expires_after(cfg.write_timeout);
  auto [ec, n] = co_await asio::async_write(stream, bufs, kTuple);
  (void)n;
  deadline.never();
  if (!ec) co_await linger(lowest(stream), deadline, cfg.linger_timeout);
}

bool is_quiet_close(const boost::system::error_code& ec) {
  return ec == asio::error::eof || ec == asio::error::connection_reset ||
         ec == asio::error::bad_descriptor || ec == asio::error::operation_aborted ||
         ec == ssl::error::stream_truncated;
}

// Decodes the chunked body bytes in `buffer` into `body` (kept with kBodyPadding spare bytes).
ParseStatus decode_chunks(ChunkedDecoder& dec, ReadBuffer& buffer, std::string& body) {
  for (;;) {
    size_t used = 0;
    std::string_view data;
    ParseStatus st = dec.decode(buffer.data(), buffer.size(), SIZE_MAX, used, data);
    if (!data.empty()) {
      size_t need = body.size() + data.size() + kBodyPadding;
      if (need > body.capacity()) body.reserve(std::max(body.capacity() * 2, need));
      body.append(data);
    }
    buffer.consume(used);
    if (st != ParseStatus::kNeedMore || used == 0) return st;
  }
}

// Tells a client that waits (Expect: 100-continue) to send its body.
template <class Stream>
awaitable<boost::system::error_code> send_continue(Stream& stream, Deadline& deadline,
                                                   const ServerConfig& cfg) {
  static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
  deadline.expires_after(cfg.write_timeout);
  auto [ec, n] = co_await asio::async_write(stream, asio::buffer(kContinue), kTuple);
  (void)n;
  co_return ec;
}

// Reads one request and runs its exchange. Returns whether the connection may serve another.
template <class Stream>
awaitable<bool> serve_one(Server::Shared& srv, Stream& stream, Deadline& deadline,
                          SessionNode& node, const std::string& remote, ReadBuffer& buffer,
                          std::string& scratch, std::string& head_store) {
  const ServerConfig& cfg = srv.config;
  Request req;
  HeadParser& head = req.head;
  std::string& body = req.body;
  buffer.restart();  // a pipelined request's bytes, to the start: the head is parsed there
  deadline.expires_after(cfg.header_timeout);
  bool reading_body = false;
  boost::system::error_code ec;
  ParseError bad = ParseError::kNone;
  // A deadline that fired while no read was waiting (this coroutine runnable between two reads)
  // cancelled nothing: checked before each read, or the next would wait unbounded.
  auto fired_between_reads = [&] {
    if (!deadline.expired()) return false;
    ec = asio::error::timed_out;
    return true;
  };
  for (;;) {
    ParseStatus st = head.parse(buffer.data(), buffer.size(), cfg.header_limit);
    if (st == ParseStatus::kDone) break;
    if (st == ParseStatus::kError) {
      bad = head.error();
      break;
    }
    if (fired_between_reads()) break;
    auto [rec, rn] = co_await stream.async_read_some(buffer.prepare(kMinRead), kTuple);
    buffer.commit(rn);
    if (rec) {
      ec = rec;
      break;
    }
  }
  BodyFraming framing = BodyFraming::kNone;
  if (!ec && bad == ParseError::kNone) {
    buffer.pin(head.head_size());  // the fields stay where they are while the body is read
    buffer.consume(head.head_size());
    framing = head.framing();
    if (framing == BodyFraming::kLength && *head.content_length() > cfg.body_limit) {
      bad = ParseError::kBodyLimit;
    }
  }
  if (!ec && bad == ParseError::kNone && framing == BodyFraming::kLength) {
    // Known length: what came with the head, then the rest straight into the body string.
    const auto len = static_cast<size_t>(*head.content_length());
    body.reserve(len + kBodyPadding);
    size_t have = std::min(len, buffer.size());
    body.assign(buffer.data(), have);
    buffer.consume(have);
    if (have < len) {
      reading_body = true;
      if (head.expect_continue()) ec = co_await send_continue(stream, deadline, cfg);
      if (!ec) deadline.expires_after(cfg.body_timeout);
      [[maybe_unused]] bool try_now = true;
      while (!ec && have < len) {
        if (fired_between_reads()) break;
        size_t want = std::min(len - have, std::max(have, kBodyStep));
        body.resize(have + want);
        auto space = asio::buffer(body.data() + have, want);
        if constexpr (std::is_same_v<Stream, Socket>) {
          // The rest of a large body has usually arrived with its start: read what is there now
          // (non-blocking socket), without a trip through the event loop; wait only for the rest.
          // One such read between two through the loop, so a client pouring a large body in
          // does not keep the thread from its other connections.
          if (try_now) {
            try_now = false;
            size_t rn = read_now(stream, space, ec);
            have += rn;
            if (ec || rn > 0) continue;
          }
          try_now = true;
        }
        auto [rec, rn] = co_await stream.async_read_some(space, kTuple);
        have += rn;
        ec = rec;
      }
      body.resize(have);
    }
  } else if (!ec && bad == ParseError::kNone && framing == BodyFraming::kChunked) {
    ChunkedDecoder chunks(cfg.body_limit);
    for (;;) {
      ParseStatus st = decode_chunks(chunks, buffer, body);
      if (st == ParseStatus::kDone) break;
      if (st == ParseStatus::kError) {
        bad = chunks.error();
        break;
      }
      if (!reading_body) {
        reading_body = true;
        if (buffer.size() == 0 && head.expect_continue()) {
          ec = co_await send_continue(stream, deadline, cfg);
          if (ec) break;
        }
        deadline.expires_after(cfg.body_timeout);
      }
      if (fired_between_reads()) break;
      auto [rec, rn] = co_await stream.async_read_some(buffer.prepare(kMinRead), kTuple);
      buffer.commit(rn);
      if (rec) {
        ec = rec;
        break;
      }
    }
  }
  bool timed_out = ec && deadline.expired();
  deadline.never();
  if (ec || bad != ParseError::kNone) {
    auto count = [&](ServerStats::Reject r) {
      srv.stats.rejected[r].fetch_add(1, std::memory_order_relaxed);
    };
    if (timed_out) {
      bool in_body = reading_body;
      count(in_body ? ServerStats::kBodyTimeout : ServerStats::kHeaderTimeout);
      auto limit = in_body ? cfg.body_timeout : cfg.header_timeout;
      std::string secs = std::to_string(std::chrono::duration<double>(limit).count());
      secs.erase(secs.find_last_not_of('0') + 1);
      if (secs.back() == '.') secs.pop_back();
      std::string what = in_body ? "the request body" : "the request headers";
      co_await reject(stream, deadline, cfg, 408, "request_timeout",
                      what + " did not arrive within " + secs + " s");
    } else if (ec) {
      if (!is_quiet_close(ec)) {
        count(ServerStats::kBadRequest);
        co_await reject(stream, deadline, cfg, 400, "bad_http_request",
                        "malformed HTTP request: " + ec.message());
      }
    } else if (bad == ParseError::kBodyLimit) {
      count(ServerStats::kBodyTooLarge);
      co_await reject(
          stream, deadline, cfg, 413, "payload_too_large",
          "request body exceeds --max-payload-size (" + std::to_string(cfg.body_limit) + " bytes)");
    } else if (bad == ParseError::kHeaderLimit) {
      count(ServerStats::kHeadersTooLarge);
      co_await reject(stream, deadline, cfg, 431, "headers_too_large",
                      "request headers exceed " + std::to_string(cfg.header_limit) + " bytes");
    } else if (bad == ParseError::kBadTransferEncoding) {
      // Any coding but chunked alone (RFC 9112 6.1: a body of unknown length, or one the worker
      // would not know to decode) is refused before its body is read.
      count(ServerStats::kBadRequest);
      co_await reject(stream, deadline, cfg, 400, "bad_http_request",
                      "unsupported Transfer-Encoding: only 'chunked' is accepted");
    } else {
      count(ServerStats::kBadRequest);
      co_await reject(stream, deadline, cfg, 400, "bad_http_request",
                      "malformed HTTP request: " + std::string(describe(bad)));
    }
    co_return false;
  }
  // Simdjson parses bodies in place: kBodyPadding spare bytes past the end, even when empty.
  if (body.capacity() < body.size() + kBodyPadding) body.reserve(body.size() + kBodyPadding);
  head.rebase(buffer.base());  // the buffer may have grown while a chunked body was read
  if (buffer.size() == 0) {
    // Nothing read past this request: its head moves out of the read buffer (a few hundred
    // bytes, into a string the connection keeps), so the buffer, with the page the request
    // touched, can be given back while a long answer streams (ExchangeImpl::begin_body). A
    // short answer keeps it for the next request (no allocation per request).
    if (head_store.capacity() > 4096 && head.head_size() < head_store.capacity() / 4) {
      head_store = std::string();  // one large head does not set every later one's size
    }
    head_store.assign(buffer.base(), head.head_size());
    head.rebase(head_store.data());
    buffer.restart();
  }
  bool close = false;
  {
    ExchangeImpl<Stream> ex(stream, deadline, buffer, req, remote, srv, scratch);
    node.exchange = &ex;
    struct Clear {
      SessionNode& n;
      ~Clear() { n.exchange = nullptr; }
    } clear{node};
    try {
      co_await srv.handler(ex);
    } catch (const std::exception& e) {
      // Handlers map bad input to 4xx themselves; this is a bug: answer 500 (below) and log it.
      log::error("handler failed").kv("error", e.what()).kv("path", ex.path());
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
    close = ex.must_close() || ex.client_gone() || !head.keep_alive();
  }
  co_return !close;
}

// Parked connections closed (keep-alive timeout, or shutdown).
void closed_parked(Server::Shared& srv, size_t n) {
  if (n == 0) return;
  auto k = static_cast<int64_t>(n);
  srv.stats.parked.fetch_sub(k, std::memory_order_relaxed);
  srv.stats.idle.fetch_sub(k, std::memory_order_relaxed);
  srv.stats.connections.fetch_sub(k, std::memory_order_relaxed);
  srv.stats.idle_closed.fetch_add(n, std::memory_order_relaxed);
}

// Marks a connection waiting for its next request (or not): what shutdown closes at once, and
// what the drain does not wait for.
void set_idle(Server::Shared& srv, SessionNode& node, bool idle) {
  if (node.idle == idle) return;
  node.idle = idle;
  srv.stats.idle.fetch_add(idle ? 1 : -1, std::memory_order_relaxed);
}

// Serves requests on one connection until it closes, or (plain TCP) until it has been idle for
// kParkAfter: then it returns the connection's idle deadline, and the session parks it. A
// request's parser and exchange live in serve_one()'s frame, allocated per request.
template <class Stream>
awaitable<std::optional<Clock::time_point>> serve(Server::Shared& srv, Stream& stream,
                                                  Deadline& deadline, SessionNode& node,
                                                  const std::string& remote) {
  const ServerConfig& cfg = srv.config;
  Socket& socket = lowest(stream);
  ReadBuffer buffer;
  std::string scratch;
  std::string head_store;  // a request's head while it runs, once out of the read buffer

  for (;;) {
    if (buffer.size() == 0) {
      constexpr bool kPlain = std::is_same_v<Stream, Socket>;
      bool arrived = false;  // shutting down, and a request's bytes are here already
      if (srv.stopping.load(std::memory_order_relaxed)) {
        // Shutting down: no next request is waited for, but one whose bytes have arrived (on a
        // connection accepted just before, or between two requests) is read and answered, and
        // the connection counts as busy meanwhile (shutdown waits for it).
        boost::system::error_code aec;
        if (!kPlain || socket.available(aec) == 0 || aec) break;
        arrived = true;
      }
      // Waiting for the next request, with a read (most keep-alive requests follow within
      // moments, and a read is the cheapest wait: no extra system call). A plain connection idle
      // longer than kParkAfter is parked: the session hands its descriptor to the context's
      // parking lot and ends, giving back everything else (a few system calls, paid only by
      // connections that were idle anyway). TLS connections stay sessions: their state is in
      // the TLS stream, and cancelling a TLS read may leave a record half-read.
      buffer.restart();  // nothing unread: the previous request's head is no longer needed
      buffer.reserve(kReadBufferSize);
      auto waiting_since = coarse_now();
      auto idle_until = waiting_since + cfg.idle_timeout;
      set_idle(srv, node, !arrived);
      deadline.expires_at(kPlain ? std::min(idle_until, waiting_since + kParkAfter) : idle_until);
      auto [rec, rn] = co_await stream.async_read_some(buffer.prepare(kReadBufferSize), kTuple);
      buffer.commit(rn);
      if (kPlain && rec && rn == 0 && deadline.expired() && coarse_now() < idle_until &&
          !srv.stopping.load(std::memory_order_relaxed)) {
        co_return idle_until;  // idle: parked by the session (still counted idle)
      }
      set_idle(srv, node, false);
      if (kPlain && rec && buffer.size() == 0 && srv.stopping.load(std::memory_order_relaxed)) {
        // Shutdown cancelled the wait, but a request may have arrived meanwhile (its bytes in
        // the socket, unread): it is read and answered (with connection: close), not reset.
        // Bytes arriving after this check are still reset: it narrows the race, no more. Plain
        // TCP only (a cancelled TLS read may leave a record half-read: no second read there).
        boost::system::error_code aec;
        if (socket.available(aec) > 0 && !aec) {
          deadline.expires_after(cfg.header_timeout);
          auto [rec2, rn2] =
              co_await stream.async_read_some(buffer.prepare(kReadBufferSize), kTuple);
          buffer.commit(rn2);
          rec = rec2;
        }
      }
      if (rec && buffer.size() == 0) {
        if (deadline.expired() || srv.stopping.load(std::memory_order_relaxed)) {
          srv.stats.idle_closed.fetch_add(1, std::memory_order_relaxed);
        }
        break;  // idle timeout, shutdown, or the client closed
      }
      if (scratch.capacity() < 512) scratch.reserve(512);
    }
    bool again =
        co_await serve_one(srv, stream, deadline, node, remote, buffer, scratch, head_store);
    if (!again || srv.stopping.load(std::memory_order_relaxed)) break;
  }
  co_return std::nullopt;
}

// Counts a connection open until the session ends (unless it was parked: still open).
struct ConnectionCount {
  ServerStats& stats;
  bool parked = false;
  ~ConnectionCount() {
    if (!parked) stats.connections.fetch_sub(1, std::memory_order_relaxed);
  }
};

// A TLS connection: handshake, requests, close_notify. A coroutine of its own so that the TLS
// stream (360 bytes) is in the frames of TLS connections only, not in every plain one's.
awaitable<void> serve_tls(Server::Shared& srv, Socket& socket, Deadline& deadline,
                          SessionNode& node, const std::string& remote) {
  ssl::stream<Socket&> tls(socket, *srv.tls);
  deadline.expires_after(srv.config.header_timeout);
  auto [ec] = co_await tls.async_handshake(ssl::stream_base::server, kTuple);
  deadline.never();
  if (ec) {
    srv.stats.rejected[ServerStats::kTlsHandshake].fetch_add(1, std::memory_order_relaxed);
    log::debug("TLS handshake failed").kv("client", remote).kv("error", ec.message());
    co_return;
  }
  (void)co_await serve(srv, tls, deadline, node, remote);  // (TLS connections are never parked)
  if (socket.is_open()) {
    // close_notify, bounded: a client that does not answer it is not waited for.
    deadline.expires_after(std::chrono::milliseconds(500));
    co_await tls.async_shutdown(kTuple);
    deadline.never();
  }
}

awaitable<void> session(std::shared_ptr<Server::Shared> srv, Socket socket, size_t slot,
                        bool resumed = false) {
  ConnectionCount counted{srv->stats};
  SessionNode node;
  node.socket = &socket;
  node.link_after(*srv->sessions[slot]);
  struct Unlink {
    Server::Shared& srv;
    SessionNode& n;
    ~Unlink() {
      set_idle(srv, n, false);
      n.unlink();
    }
  } unlink{*srv, node};

  boost::system::error_code ignored;
  if (!resumed) socket.set_option(tcp::no_delay(true), ignored);  // (a parked one kept it)
  socket.non_blocking(true, ignored);  // write_now() never waits; asynchronous I/O is unchanged
  std::string remote;
  bool v6 = false;
  {
    auto ep = socket.remote_endpoint(ignored);
    if (!ignored) {
      remote = ep.address().to_string();
      v6 = ep.address().is_v6();
    }
  }
  Deadline deadline(socket.get_executor(), socket, Deadline::Action::kCancel);
  if (srv->tls) {
    co_await serve_tls(*srv, socket, deadline, node, remote);
  } else {
    for (;;) {
      std::optional<Clock::time_point> park = co_await serve(*srv, socket, deadline, node, remote);
      if (!park) break;
      // Idle: out of Asio (its reactor state freed; non-blocking kept), into the lot, still
      // open and idle. A shutdown closes the lot (its handler, on this thread, first hands back
      // those whose request has arrived); an address is needed to bring it back (its family:
      // without one the peer is gone anyway).
      ParkingLot* lot = srv->parking[slot].get();
      if (lot && lot->open() && !remote.empty()) {
        int fd = socket.release(ignored);
        if (!ignored && lot->park(fd, v6, *park)) {
          counted.parked = true;
          srv->stats.parked.fetch_add(1, std::memory_order_relaxed);
          srv->stats.idle.fetch_add(1, std::memory_order_relaxed);  // (Unlink takes the session's)
          co_return;
        }
        if (!ignored) {
          ::close(fd);  // (epoll refused it)
          srv->stats.idle_closed.fetch_add(1, std::memory_order_relaxed);
          co_return;
        }
      }
      // Not parked (the lot is closed: shutting down): a request that arrived meanwhile is still
      // read and answered (serve sees the shutdown: connection: close); otherwise it closes.
      boost::system::error_code aec;
      if (socket.available(aec) > 0 && !aec) continue;
      srv->stats.idle_closed.fetch_add(1, std::memory_order_relaxed);
      break;
    }
  }
  socket.shutdown(Socket::shutdown_send, ignored);
  socket.close(ignored);
}

// A parked connection turned readable (a request, or the client hung up): a session again.
void resume_parked(std::shared_ptr<Server::Shared> srv, asio::io_context& ctx, size_t slot, int fd,
                   bool v6) {
  if (!srv) {  // (not expected: the lot goes before the shared state does)
    ::close(fd);
    return;
  }
  auto& st = srv->stats;
  st.parked.fetch_sub(1, std::memory_order_relaxed);
  st.idle.fetch_sub(1, std::memory_order_relaxed);
  Socket s(ctx.get_executor());
  boost::system::error_code ec;
  s.assign(v6 ? tcp::v6() : tcp::v4(), fd, ec);
  if (ec) {
    ::close(fd);
    st.connections.fetch_sub(1, std::memory_order_relaxed);
    return;
  }
  asio::co_spawn(ctx.get_executor(), session(std::move(srv), std::move(s), slot, true),
                 asio::detached);
}

awaitable<void> accept_loop(std::shared_ptr<Server::Shared> srv, Acceptor* acceptor, size_t slot) {
  auto admit = [&](Socket s) {
    auto& st = srv->stats;
    st.accepted.fetch_add(1, std::memory_order_relaxed);
    size_t max = srv->config.max_connections;
    // Counted first, then checked: acceptors on other threads cannot both take the last place.
    int64_t open = st.connections.fetch_add(1, std::memory_order_relaxed);
    if (max > 0 && open >= static_cast<int64_t>(max)) {
      // Over the limit: refused at once (counted), so what a client can hold stays bounded.
      st.connections.fetch_sub(1, std::memory_order_relaxed);
      st.refused.fetch_add(1, std::memory_order_relaxed);
      boost::system::error_code ignored;
      s.close(ignored);
      return;
    }
    asio::co_spawn(acceptor->get_executor(), session(srv, std::move(s), slot), asio::detached);
  };
  for (;;) {
    auto [ec, socket] = co_await acceptor->async_accept(kTuple);
    if (srv->stopping.load()) co_return;
    if (ec) {
      if (ec == asio::error::operation_aborted) co_return;
      static log::RateLimit limit(5, std::chrono::seconds(10));
      log::warn(limit, "accept failed").kv("error", ec.message());
      Timer t(acceptor->get_executor(), std::chrono::milliseconds(50));
      co_await t.async_wait(kTuple);
      continue;
    }
    admit(std::move(socket));
    // Take every connection already waiting (like nginx's multi_accept): on a busy loop each
    // asynchronous accept waits its turn behind all other handlers, and a burst of new
    // connections would otherwise trickle in one per turn.
    for (int i = 0; i < 64; ++i) {
      Socket more(acceptor->get_executor());
      boost::system::error_code aec;
      acceptor->accept(more, aec);
      if (aec) break;
      admit(std::move(more));
    }
  }
}

std::unique_ptr<ssl::context> make_tls_context(const ServerConfig& cfg) {
  if (cfg.tls_cert_path.empty() && cfg.tls_key_path.empty()) return nullptr;
  if (cfg.tls_cert_path.empty() || cfg.tls_key_path.empty()) {
    throw std::runtime_error("TLS needs both --tls-cert-path and --tls-key-path");
  }
  auto ctx = std::make_unique<ssl::context>(ssl::context::tls_server);
  ctx->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                   ssl::context::no_sslv3 | ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1 |
                   ssl::context::single_dh_use);
  boost::system::error_code ec;
  ctx->use_certificate_chain_file(cfg.tls_cert_path, ec);
  if (ec) {
    throw std::runtime_error("--tls-cert-path " + cfg.tls_cert_path +
                             ": cannot load the certificate chain (" + ec.message() +
                             "); give a PEM file");
  }
  // No pass phrase: an encrypted key fails here rather than prompting on a terminal at startup.
  ctx->set_password_callback([](size_t, ssl::context::password_purpose) { return std::string(); });
  ctx->use_private_key_file(cfg.tls_key_path, ssl::context::pem, ec);
  if (ec) {
    throw std::runtime_error("--tls-key-path " + cfg.tls_key_path +
                             ": cannot load the private key (" + ec.message() +
                             "); give an unencrypted PEM key matching --tls-cert-path");
  }
  if (SSL_CTX_check_private_key(ctx->native_handle()) != 1) {
    throw std::runtime_error("--tls-key-path " + cfg.tls_key_path +
                             " does not match the certificate in --tls-cert-path");
  }
  return ctx;
}

}  // namespace

Server::Server(const std::vector<asio::io_context*>& contexts, ServerConfig config, Handler handler)
    : shared_(std::make_shared<Shared>()) {
  shared_->config = std::move(config);
  shared_->handler = std::move(handler);
  shared_->contexts = contexts;
  const auto& cfg = shared_->config;
  shared_->tls = make_tls_context(cfg);
  boost::system::error_code ec;
  auto address = asio::ip::make_address(cfg.host, ec);
  if (ec) {
    throw std::runtime_error("cannot listen on '" + cfg.host +
                             "': not an IP address (use e.g. 0.0.0.0 or 127.0.0.1)");
  }
  uint16_t port = cfg.port;
  for (size_t i = 0; i < contexts.size(); ++i) {
    auto* ctx = contexts[i];
    shared_->sessions.push_back(std::make_unique<SessionNode>());
    std::weak_ptr<Shared> weak = shared_;
    shared_->parking.push_back(std::make_unique<ParkingLot>(
        *ctx, [weak, ctx, i](int fd, bool v6) { resume_parked(weak.lock(), *ctx, i, fd, v6); },
        [weak](size_t n) {
          if (auto srv = weak.lock()) closed_parked(*srv, n);
        }));
    auto acc = std::make_unique<Acceptor>(*ctx);
    tcp::endpoint ep(address, port);
    acc->open(ep.protocol(), ec);
    if (!ec) acc->set_option(Acceptor::reuse_address(true), ec);
    if (!ec && (cfg.reuse_port || contexts.size() > 1)) {
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
  shared_->port = port;
}

Server::~Server() {
  stop();
  // The parking lots' timers and descriptors belong to the contexts, which may be destroyed right
  // after this (all stopped already: the contract in server.h) while sessions' frames still hold
  // the shared state: the lots go now. What they held is closed.
  for (auto& lot : shared_->parking) lot.reset();
}

void Server::start() {
  for (size_t i = 0; i < acceptors_.size(); ++i) {
    asio::co_spawn(acceptors_[i]->get_executor(), accept_loop(shared_, acceptors_[i].get(), i),
                   asio::detached);
  }
}

void Server::stop() {
  if (shared_->stopping.exchange(true)) return;
  for (size_t i = 0; i < acceptors_.size(); ++i) {
    asio::post(acceptors_[i]->get_executor(), [a = acceptors_[i].get(), srv = shared_, i] {
      boost::system::error_code ignored;
      // Connections waiting in the backlog were made before the shutdown: each is taken (the
      // acceptor is non-blocking), so that one whose request has arrived is answered like one on
      // an idle connection, instead of being reset with the listener.
      for (int k = 0; k < 4096; ++k) {
        Socket s(a->get_executor());
        boost::system::error_code aec;
        a->accept(s, aec);
        if (aec) break;
        srv->stats.accepted.fetch_add(1, std::memory_order_relaxed);
        srv->stats.connections.fetch_add(1, std::memory_order_relaxed);
        asio::co_spawn(a->get_executor(), session(srv, std::move(s), i), asio::detached);
      }
      a->close(ignored);
      // Idle keep-alive connections close now; the others close after their exchange. One whose
      // next request has arrived (bytes wait unread) is busy from now on: on plain TCP its
      // request is read and answered (with connection: close), and shutdown waits for it (a TLS
      // connection is closed: its bytes may be a partial record).
      if (auto& lot = srv->parking[i]) {
        // A parked connection whose request has arrived is a session again first (answered with
        // connection: close, below, like an idle session's); the others close now.
        lot->resume_ready();
        closed_parked(*srv, lot->close_all());
      }
      SessionNode& head = *srv->sessions[i];
      for (SessionNode* n = head.next; n != &head; n = n->next) {
        if (!n->idle) continue;
        if (n->socket->available(ignored) > 0 && !ignored) {
          set_idle(*srv, *n, false);
        }
        n->socket->cancel(ignored);
      }
      srv->stopped_contexts.fetch_add(1, std::memory_order_release);
    });
  }
}

void Server::close_all() {
  stop();
  for (size_t i = 0; i < shared_->contexts.size(); ++i) {
    asio::post(*shared_->contexts[i], [srv = shared_, i] {
      SessionNode& head = *srv->sessions[i];
      boost::system::error_code ignored;
      for (SessionNode* n = head.next; n != &head; n = n->next) {
        if (n->exchange) {
          n->exchange->force_close();
        } else {
          n->socket->close(ignored);
        }
      }
    });
  }
}

int64_t Server::busy_connections() const {
  // The stop handlers' progress first (acquire): the counters read after it include what every
  // handler that has run marked busy.
  if (shared_->stopping.load(std::memory_order_relaxed) &&
      shared_->stopped_contexts.load(std::memory_order_acquire) < acceptors_.size()) {
    return 1;  // stop() not yet seen everywhere
  }
  return shared_->stats.connections.load(std::memory_order_relaxed) -
         shared_->stats.idle.load(std::memory_order_relaxed);
}

const ServerStats& Server::stats() const {
  return shared_->stats;
}

}  // namespace kvgate::http
