// http/client: see client.h. The only client-side translation unit that includes Asio's TLS.
// Responses are parsed by http/parser, in place in the connection's read buffer.
#include "http/client.h"

#include <netdb.h>
#include <openssl/ssl.h>
#include <sys/socket.h>

#include <array>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/error.hpp>
#include <boost/asio/ssl/host_name_verification.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/write.hpp>
#include <charconv>
#include <cstring>

#include "http/deadline.h"
#include "http/parser.h"
#include "http/read_buffer.h"
#include "http/write_now.h"

namespace kvgate::http {
namespace ssl = boost::asio::ssl;
using asio::ip::tcp;
namespace {
constexpr auto kTuple = asio::as_tuple(use_awaitable);
// Interim (1xx) answers skipped before the real one; more is a broken or hostile peer.
constexpr int kMaxInterimResponses = 8;
// A worker's answer head (status line and fields) must end within this many bytes.
constexpr size_t kHeaderLimit = size_t{64} * 1024;
// The least room a read into a connection's buffer is given.
constexpr size_t kMinRead = 1024;
}  // namespace

struct TlsClientContext::Impl {
  ssl::context ctx{ssl::context::tls_client};
};

TlsClientContext::TlsClientContext() : impl_(std::make_unique<Impl>()) {}
TlsClientContext::~TlsClientContext() = default;
void* TlsClientContext::native() const {
  return &impl_->ctx;
}

std::shared_ptr<const TlsClientContext> TlsClientContext::create(const std::string& ca_file,
                                                                 const std::string& cert_file,
                                                                 const std::string& key_file,
                                                                 std::string& error) {
  std::shared_ptr<TlsClientContext> c(new TlsClientContext());
  auto& ctx = c->impl_->ctx;
  ctx.set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                  ssl::context::no_sslv3 | ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1);
  ctx.set_verify_mode(ssl::verify_peer);
  boost::system::error_code ec;
  if (ca_file.empty()) {
    ctx.set_default_verify_paths(ec);
    if (ec) {
      error = "cannot load the system's CA certificates (" + ec.message() +
              "); give --worker-ca-cert-path";
      return nullptr;
    }
  } else {
    ctx.load_verify_file(ca_file, ec);
    if (ec) {
      error = "--worker-ca-cert-path " + ca_file + ": cannot load CA certificates (" +
              ec.message() + "); give a PEM file";
      return nullptr;
    }
  }
  if (cert_file.empty() != key_file.empty()) {
    error =
        "a client certificate needs both --worker-client-cert-path and "
        "--worker-client-key-path";
    return nullptr;
  }
  if (!cert_file.empty()) {
    ctx.use_certificate_chain_file(cert_file, ec);
    if (ec) {
      error = "--worker-client-cert-path " + cert_file + ": cannot load it (" + ec.message() +
              "); give a PEM file";
      return nullptr;
    }
    // No pass phrase: an encrypted key fails here rather than prompting on a terminal at startup.
    ctx.set_password_callback([](size_t, ssl::context::password_purpose) { return std::string(); });
    ctx.use_private_key_file(key_file, ssl::context::pem, ec);
    if (ec || SSL_CTX_check_private_key(ctx.native_handle()) != 1) {
      error = "--worker-client-key-path " + key_file +
              ": cannot load it or it does not match --worker-client-cert-path";
      return nullptr;
    }
  }
  return c;
}

struct Connection {
  explicit Connection(const Executor& ex) : socket(ex), deadline(ex, socket) {
    // Reads take what fits: a small buffer means more receives.
    buffer.reserve(ReadBuffer::kBlockSize);
  }
  Socket socket;
  Deadline deadline;
  std::unique_ptr<ssl::stream<Socket&>> tls;  // https workers
  ReadBuffer buffer;
  // The answer being read: its head (fields in `buffer`), then its body as `framing` says.
  HeadParser head{HeadParser::Kind::kResponse};
  bool head_done = false;  // a final (not 1xx) head was read
  bool keep_alive = false;
  BodyFraming framing = BodyFraming::kNone;
  uint64_t left = 0;  // kLength: body bytes not yet read
  ChunkedDecoder chunks;
  Clock::time_point idle_since{};

  // Runs `fn(stream)` with the stream requests travel on (TLS or plain).
  template <class Fn>
  auto with_stream(Fn&& fn) {
    return tls ? fn(*tls) : fn(socket);
  }
  // Whether an idle pooled connection may carry a new request: the peer has not closed it and
  // has not sent anything (an HTTP peer says nothing unasked; leftover bytes would be read as the
  // next request's answer).
  bool fit_for_reuse() {
    if (!socket.is_open() || buffer.size() != 0) return false;
    if (tls && SSL_pending(tls->native_handle()) > 0) return false;
    char c = 0;
    ssize_t n = ::recv(socket.native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK;
    // n == 0: closed by the peer. n > 0: bytes nobody asked for. Over TLS they may be a record of
    // the peer's own (a late session ticket, or close_notify before its FIN), but they may as well
    // be data, which would be read as the next request's answer: either way the connection is not
    // reused (a late ticket costs one new connection).
    return false;
  }
};

std::string parse_url(std::string_view url, Target& out) {
  std::string_view rest = url;
  bool https = false;
  if (rest.starts_with("http://")) {
    rest.remove_prefix(7);
  } else if (rest.starts_with("https://")) {
    rest.remove_prefix(8);
    https = true;
  } else if (rest.find("://") != std::string_view::npos) {
    return "'" + std::string(url) + "': unsupported scheme; use http://host:port or https://";
  }
  auto slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  if (authority.find('@') != std::string_view::npos) {
    // Not echoed: the part before '@' is a password.
    return "a worker URL with credentials (user:password@host) is not supported; give the "
           "worker's address only";
  }
  std::string_view path = slash == std::string_view::npos ? "" : rest.substr(slash);
  while (!path.empty() && path.back() == '/') path.remove_suffix(1);
  if (authority.empty())
    return "'" + std::string(url) + "': missing host (expected http://host:port)";
  std::string host;
  std::string_view port_text;
  if (authority.front() == '[') {
    auto close = authority.find(']');
    if (close == std::string_view::npos) return "'" + std::string(url) + "': unterminated [IPv6]";
    host = std::string(authority.substr(1, close - 1));
    if (close + 1 < authority.size()) {
      if (authority[close + 1] != ':') return "'" + std::string(url) + "': bad text after ]";
      port_text = authority.substr(close + 2);
    }
  } else {
    auto colon = authority.rfind(':');
    host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) port_text = authority.substr(colon + 1);
  }
  if (host.empty()) return "'" + std::string(url) + "': missing host";
  uint16_t port = https ? 443 : 80;
  if (!port_text.empty()) {
    unsigned v = 0;
    auto [p, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), v);
    if (ec != std::errc() || p != port_text.data() + port_text.size() || v == 0 || v > 65535) {
      return "'" + std::string(url) + "': port '" + std::string(port_text) +
             "' is not a number between 1 and 65535";
    }
    port = static_cast<uint16_t>(v);
  }
  out.host = host;
  out.port = port;
  out.https = https;
  out.base_path = std::string(path);
  bool v6 = host.find(':') != std::string::npos;
  out.host_header =
      (v6 ? "[" + host + "]" : host) + (port_text.empty() ? "" : ":" + std::to_string(port));
  out.url = std::string(https ? "https://" : "http://") + (v6 ? "[" + host + "]" : host) + ":" +
            std::to_string(port) + out.base_path;
  out.endpoints.clear();
  return "";
}

std::string resolve(Target& target) {
  boost::system::error_code ec;
  auto addr = asio::ip::make_address(target.host, ec);
  target.endpoints.clear();
  if (!ec) {
    target.endpoints.emplace_back(addr, target.port);
    return "";
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(target.host.c_str(), nullptr, &hints, &res);
  if (rc != 0) return "cannot resolve '" + target.host + "': " + gai_strerror(rc);
  for (addrinfo* p = res; p; p = p->ai_next) {
    if (p->ai_family == AF_INET) {
      auto* sa = reinterpret_cast<sockaddr_in*>(p->ai_addr);
      asio::ip::address_v4::bytes_type b;
      std::memcpy(b.data(), &sa->sin_addr, 4);
      target.endpoints.emplace_back(asio::ip::address_v4(b), target.port);
    } else if (p->ai_family == AF_INET6) {
      auto* sa = reinterpret_cast<sockaddr_in6*>(p->ai_addr);
      asio::ip::address_v6::bytes_type b;
      std::memcpy(b.data(), &sa->sin6_addr, 16);
      target.endpoints.emplace_back(asio::ip::address_v6(b), target.port);
    }
  }
  ::freeaddrinfo(res);
  if (target.endpoints.empty()) return "cannot resolve '" + target.host + "': no address";
  return "";
}

ConnectionPool::ConnectionPool() : ConnectionPool(Options{}) {}
ConnectionPool::ConnectionPool(Options options) : options_(options) {}
ConnectionPool::~ConnectionPool() = default;

std::unique_ptr<Connection> ConnectionPool::take(uint64_t key) {
  auto it = idle_.find(key);
  if (it == idle_.end()) return nullptr;
  auto& v = it->second;
  auto now = coarse_now();
  while (!v.empty()) {
    std::unique_ptr<Connection> c = std::move(v.back());
    v.pop_back();
    if (now - c->idle_since >= options_.idle_timeout) continue;  // the worker may be closing it
    if (c->fit_for_reuse()) return c;
    ++stale_dropped_;
  }
  return nullptr;
}

void ConnectionPool::give(uint64_t key, std::unique_ptr<Connection> c) {
  if (closed_) return;  // closes c
  auto& v = idle_[key];
  if (v.size() >= options_.max_idle_per_target) return;  // closes c
  c->idle_since = coarse_now();
  c->deadline.never();
  v.push_back(std::move(c));
}

void ConnectionPool::drop(uint64_t key) {
  idle_.erase(key);
}

void ConnectionPool::reap(Clock::time_point now) {
  for (auto it = idle_.begin(); it != idle_.end();) {
    auto& v = it->second;
    std::erase_if(v, [&](const std::unique_ptr<Connection>& c) {
      return now - c->idle_since >= options_.idle_timeout;
    });
    it = v.empty() ? idle_.erase(it) : std::next(it);
  }
}

void ConnectionPool::close() {
  closed_ = true;
  idle_.clear();
}

size_t ConnectionPool::idle_count() const {
  size_t n = 0;
  for (const auto& [k, v] : idle_) n += v.size();
  return n;
}

std::string_view to_string(CallError e) {
  switch (e) {
    case CallError::kNone:
      return "none";
    case CallError::kConnect:
      return "connect";
    case CallError::kTimeout:
      return "timeout";
    case CallError::kReset:
      return "reset";
    case CallError::kProtocol:
      return "protocol";
    case CallError::kAborted:
      return "aborted";
  }
  return "unknown";
}

UpstreamCall::UpstreamCall(Executor ex, ConnectionPool& pool, const Target& target, uint64_t key)
    : ex_(std::move(ex)), pool_(pool), target_(target), key_(key) {}

UpstreamCall::~UpstreamCall() {
  // Back to the pool only after a clean, complete exchange: the request written whole, the
  // response read to its end with nothing after it, and the peer willing to keep the connection.
  if (conn_ && sent_ && done_ && !aborted_ && conn_->head_done && conn_->keep_alive &&
      conn_->buffer.size() == 0 && conn_->socket.is_open()) {
    conn_->head_done = false;
    conn_->buffer.restart();
    pool_.give(key_, std::move(conn_));
  }
}

CallError UpstreamCall::classify(const boost::system::error_code& ec) {
  if (aborted_) return CallError::kAborted;
  if (conn_ && conn_->deadline.expired()) {
    detail_ = "no complete answer before the deadline";
    return CallError::kTimeout;
  }
  detail_ = ec.message();  // end of stream, reset, broken pipe, a TLS error...
  return CallError::kReset;
}

CallError UpstreamCall::malformed(ParseError e) {
  detail_ = "malformed HTTP response: " + std::string(describe(e));
  conn_.reset();
  return aborted_ ? CallError::kAborted : CallError::kProtocol;
}

awaitable<CallError> UpstreamCall::connect() {
  conn_ = std::make_unique<Connection>(ex_);
  fresh_ = true;
  const auto began = Clock::now();
  if (target_.endpoints.empty()) {
    detail_ = "address of " + target_.host + " is not resolved";
    co_return CallError::kConnect;
  }
  auto connect_deadline = Clock::now() + pool_.options().connect_timeout;
  conn_->deadline.expires_at(std::min(deadline_, connect_deadline));
  auto [ec, ep] = co_await asio::async_connect(conn_->socket, target_.endpoints, kTuple);
  (void)ep;
  if (!ec && target_.https) {
    if (!target_.tls) {
      detail_ = "https worker without TLS settings";
      co_return CallError::kConnect;
    }
    auto* ctx = static_cast<ssl::context*>(target_.tls->native());
    conn_->tls = std::make_unique<ssl::stream<Socket&>>(conn_->socket, *ctx);
    // SNI, and the certificate must name the host of the worker's URL.
    // (SNI carries host names only: RFC 6066 forbids IP literals there.)
    boost::system::error_code not_ip;
    asio::ip::make_address(target_.host, not_ip);
    if (not_ip) SSL_set_tlsext_host_name(conn_->tls->native_handle(), target_.host.c_str());
    conn_->tls->set_verify_callback(ssl::host_name_verification(target_.host));
    auto [hec] = co_await conn_->tls->async_handshake(ssl::stream_base::client, kTuple);
    ec = hec;
  }
  if (ec) {
    if (aborted_) co_return CallError::kAborted;
    bool timed_out = conn_->deadline.expired();
    detail_ = timed_out ? "connect timed out" : ec.message();
    if (timed_out && Clock::now() >= deadline_) co_return CallError::kTimeout;
    co_return CallError::kConnect;
  }
  connect_time_ = Clock::now() - began;
  boost::system::error_code ignored;
  conn_->socket.set_option(tcp::no_delay(true), ignored);
  conn_->socket.non_blocking(true, ignored);  // write_now() never waits
  co_return CallError::kNone;
}

awaitable<CallError> UpstreamCall::start(std::string_view method, std::string_view path,
                                         HeaderList headers, std::string_view body) {
  // A request line cannot hold a space or a control character: a path carrying one (built from
  // something a client sent) would split it, and what followed would be a second request.
  for (char ch : path) {
    if (static_cast<unsigned char>(ch) <= 0x20 || ch == 0x7f) {
      detail_ = "the request path holds a space or a control character; not sent";
      co_return CallError::kProtocol;
    }
  }
  head_.clear();
  head_.append(method).append(" ").append(target_.base_path).append(path).append(" HTTP/1.1\r\n");
  append_header(head_, "host", target_.host_header);
  for (const auto& h : headers) append_header(head_, h.name, h.value);
  if (!body.empty() || method == "POST" || method == "PUT") {
    append_content_length(head_, body.size());
  }
  head_.append("\r\n");
  const size_t total = head_.size() + body.size();

  conn_ = pool_.take(key_);
  fresh_ = false;
  connect_time_.reset();
  sent_ = false;
  response_started_ = false;
  for (int attempt = 0;; ++attempt) {
    if (!conn_) {
      CallError e = co_await connect();
      if (e != CallError::kNone) co_return e;
    }
    if (aborted_) co_return CallError::kAborted;
    conn_->deadline.expires_at(deadline_);
    std::array<asio::const_buffer, 2> bufs{asio::buffer(head_), asio::buffer(body)};
    boost::system::error_code wec;
    size_t wn = 0;
    if (!conn_->tls) wn = write_now(conn_->socket, bufs, wec);  // usually the whole request
    if (!wec && wn < total) {
      auto rest = rest_after(bufs, wn);
      auto [aec, an] =
          co_await conn_->with_stream([&](auto& s) { return asio::async_write(s, rest, kTuple); });
      wec = aec;
      wn += an;
    }
    if (!wec && wn == total) {
      sent_ = true;
      std::string().swap(head_);  // sent whole: not kept for the answer's life (a stream's)
      break;
    }
    if (aborted_) co_return CallError::kAborted;
    // The request did not reach the worker whole, so the worker cannot have started it. A reused
    // connection the peer had closed is replaced once; a fresh one failing is a real failure.
    if (!fresh_ && attempt == 0 && !conn_->deadline.expired()) {
      conn_.reset();
      continue;
    }
    CallError e = classify(wec ? wec : make_error_code(asio::error::broken_pipe));
    conn_.reset();
    co_return e;
  }

  // The answer's head; interim 1xx answers (100 Continue, 103 Early Hints) are read and skipped:
  // the final answer follows on the same connection.
  const bool head_request = method == "HEAD";
  Connection& c = *conn_;
  for (int interim = 0;; ++interim) {
    c.head.reset();
    c.head_done = false;
    c.buffer.restart();  // an interim answer's bytes are dropped: the next head starts here
    ParseStatus st = ParseStatus::kNeedMore;
    boost::system::error_code rec;
    for (;;) {
      st = c.head.parse(c.buffer.data(), c.buffer.size(), kHeaderLimit);
      if (st != ParseStatus::kNeedMore) break;
      auto space = c.buffer.prepare(kMinRead);
      auto [ec, n] =
          co_await c.with_stream([&](auto& s) { return s.async_read_some(space, kTuple); });
      c.buffer.commit(n);
      if (c.buffer.size() > 0) response_started_ = true;
      if (ec) {
        rec = ec;
        break;
      }
    }
    if (rec) {
      if (aborted_) co_return CallError::kAborted;
      CallError e = classify(rec);
      conn_.reset();
      co_return e;
    }
    response_started_ = true;
    if (st == ParseStatus::kError) co_return malformed(c.head.error());
    c.buffer.pin(c.head.head_size());  // its fields stay where they are while the body is read
    c.buffer.consume(c.head.head_size());
    int status = c.head.status();
    if (status >= 200) break;
    if (status == 101 || interim + 1 >= kMaxInterimResponses) {
      detail_ = status == 101 ? "the worker switched protocols (101), which was not asked for"
                              : "too many interim (1xx) answers";
      conn_.reset();
      co_return CallError::kProtocol;
    }
  }
  c.head_done = true;
  c.framing = c.head.framing(head_request);
  c.keep_alive = c.head.keep_alive(head_request);
  c.left = c.framing == BodyFraming::kLength ? *c.head.content_length() : 0;
  c.chunks.reset();
  done_ = c.framing == BodyFraming::kNone;
  co_return CallError::kNone;
}

int UpstreamCall::status() const {
  return conn_ && conn_->head_done ? conn_->head.status() : 0;
}

std::string_view UpstreamCall::header(std::string_view name) const {
  return conn_ && conn_->head_done ? conn_->head.find(name) : std::string_view{};
}

void UpstreamCall::for_each_header(
    const std::function<void(std::string_view, std::string_view)>& fn) const {
  if (conn_ && conn_->head_done) conn_->head.for_each(fn);
}

bool UpstreamCall::has_connection_header() const {
  return conn_ && conn_->head_done && conn_->head.has_connection();
}

std::optional<uint64_t> UpstreamCall::content_length() const {
  if (!conn_ || !conn_->head_done || conn_->framing == BodyFraming::kChunked ||
      conn_->framing == BodyFraming::kUntilClose) {
    return std::nullopt;
  }
  return conn_->head.content_length();
}

awaitable<std::string_view> UpstreamCall::read_view(CallError& error) {
  error = CallError::kNone;
  if (read_error_ != CallError::kNone) {
    error = read_error_;  // a failed body stays failed (never read as complete)
    co_return std::string_view();
  }
  if (done_ || !conn_ || !conn_->head_done) co_return std::string_view();
  Connection& c = *conn_;
  if (c.framing == BodyFraming::kChunked) {
    for (;;) {
      // The data of every chunk already here, moved together to the front of the unread bytes
      // (over the chunks' framing, which always comes before their data): one piece, however
      // many chunks the worker's last write held.
      char* const start = c.buffer.unread();
      char* out = start;
      size_t used_total = 0;
      ParseStatus st = ParseStatus::kNeedMore;
      for (;;) {
        size_t used = 0;
        std::string_view data;
        st =
            c.chunks.decode(start + used_total, c.buffer.size() - used_total, SIZE_MAX, used, data);
        if (!data.empty()) {
          std::memmove(out, data.data(), data.size());
          out += data.size();
        }
        used_total += used;
        if (st != ParseStatus::kNeedMore || used == 0) break;
      }
      // (Consumed bytes stay where they are until the next read into the buffer.)
      c.buffer.consume(used_total);
      const std::string_view got(start, static_cast<size_t>(out - start));
      if (st == ParseStatus::kDone) {
        done_ = true;
        co_return got;
      }
      if (st == ParseStatus::kError) {
        // The data before the error first (the error ends the connection, whose buffer the view
        // points into); the decoder stays failed, and the next call reports it.
        if (!got.empty()) co_return got;
        error = read_error_ = malformed(c.chunks.error());
        co_return std::string_view();
      }
      if (!got.empty()) co_return got;
      auto space = c.buffer.prepare(kMinRead);
      auto [ec, n] =
          co_await c.with_stream([&](auto& s) { return s.async_read_some(space, kTuple); });
      c.buffer.commit(n);
      c.head.rebase(c.buffer.base());  // the buffer may have grown
      if (ec) {
        error = read_error_ = classify(ec);
        conn_.reset();
        co_return std::string_view();
      }
    }
  }
  // Content-Length, or until the worker closes: bytes that came with the head first, then reads
  // into the buffer, never past the body's end (what follows it is not this answer's).
  const bool until_close = c.framing == BodyFraming::kUntilClose;
  if (!until_close && c.left == 0) {
    done_ = true;
    co_return std::string_view();
  }
  while (c.buffer.size() == 0) {
    auto space = c.buffer.prepare(kMinRead);
    if (!until_close) space = asio::buffer(space, static_cast<size_t>(c.left));
    auto [ec, n] =
        co_await c.with_stream([&](auto& s) { return s.async_read_some(space, kTuple); });
    c.buffer.commit(n);
    c.head.rebase(c.buffer.base());
    if (until_close && ec == asio::error::eof && !aborted_) {
      done_ = true;  // the end of the body (and of the connection, which is not pooled)
      co_return std::string_view();
    }
    if (ec) {
      error = read_error_ = classify(ec);
      conn_.reset();
      co_return std::string_view();
    }
  }
  size_t n = until_close ? c.buffer.size()
                         : static_cast<size_t>(std::min<uint64_t>(c.left, c.buffer.size()));
  const std::string_view got(c.buffer.unread(), n);
  c.buffer.consume(n);
  if (!until_close) {
    c.left -= n;
    done_ = c.left == 0;
  }
  co_return got;
}

awaitable<CallError> UpstreamCall::read_all(std::string& out, size_t limit) {
  for (;;) {
    CallError err = CallError::kNone;
    std::string_view piece = co_await read_view(err);
    if (err != CallError::kNone) co_return err;
    if (piece.empty()) co_return CallError::kNone;
    if (out.size() + piece.size() > limit) {
      detail_ = "response larger than " + std::to_string(limit) + " bytes";
      abort();
      co_return CallError::kProtocol;
    }
    out.append(piece);
  }
}

void UpstreamCall::abort() {
  aborted_ = true;
  if (conn_) {
    boost::system::error_code ignored;
    conn_->socket.close(ignored);
  }
}

awaitable<FetchResult> fetch(Executor ex, const Target& target, std::string_view method,
                             std::string_view path, std::chrono::milliseconds timeout,
                             std::string_view body, HeaderList headers, bool keep_headers,
                             size_t max_body) {
  ConnectionPool pool;  // private: a probe always opens a new connection
  FetchResult r;
  UpstreamCall call(ex, pool, target, 0);
  call.set_deadline(Clock::now() + timeout);
  r.error = co_await call.start(method, path, headers, body);
  if (r.error == CallError::kNone) {
    r.status = call.status();
    if (keep_headers) {
      call.for_each_header([&r](std::string_view name, std::string_view value) {
        r.headers.emplace_back(name, value);
      });
    }
    r.error = co_await call.read_all(r.body, max_body);
  }
  if (r.error != CallError::kNone) r.detail = call.error_detail();
  co_return r;
}

std::string_view FetchResult::header(std::string_view name) const {
  for (const auto& [n, v] : headers) {
    if (iequals(n, name)) return v;
  }
  return {};
}

}  // namespace kvgate::http
