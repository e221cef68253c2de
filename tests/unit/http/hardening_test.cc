// Tests for what a review of http/server and http/client found, each failing before its fix:
// a quiet stream cut by the keep-alive timeout; slow and stuck clients; errors lost to a reset;
// the connection limit; graceful and forced shutdown; interim 1xx answers, leftover and
// unsolicited bytes, abandoned answers and full requests that must never be pooled or resent.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/as_tuple.hpp>
#include <cstring>
#include <future>
#include <mutex>
#include <thread>

#include "http/client.h"
#include "http/read_buffer.h"
#include "http/server.h"
#include "support/http_client.h"
#include "support/process.h"

namespace kvgate::http {
namespace {

using namespace std::chrono_literals;
using testing::wait_until;

class TestServer {
 public:
  explicit TestServer(Handler h, ServerConfig cfg = {}) {
    cfg.host = "127.0.0.1";
    cfg.port = 0;
    server_ = std::make_unique<Server>(std::vector<asio::io_context*>{&ctx_}, cfg, std::move(h));
    server_->start();
    thread_ = std::thread([this] {
      auto guard = asio::make_work_guard(ctx_);
      ctx_.run();
    });
  }
  ~TestServer() {
    server_->stop();
    ctx_.stop();
    thread_.join();
  }
  int port() const { return server_->port(); }
  asio::io_context& ctx() { return ctx_; }
  Server& server() { return *server_; }
  const ServerStats& stats() const { return server_->stats(); }

 private:
  asio::io_context ctx_{1};
  std::unique_ptr<Server> server_;
  std::thread thread_;
};

awaitable<void> ok_handler(Exchange& ex) {
  co_await ex.respond(200, {}, "ok");
}

awaitable<void> sleep_for(Exchange& ex, std::chrono::milliseconds d) {
  Timer t(ex.executor(), d);
  co_await t.async_wait(asio::as_tuple(use_awaitable));
}

// A blocking loopback socket with a receive timeout.
int connect_to(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

void send_all(int fd, std::string_view s) {
  while (!s.empty()) {
    ssize_t n = ::send(fd, s.data(), s.size(), MSG_NOSIGNAL);
    if (n <= 0) return;
    s.remove_prefix(static_cast<size_t>(n));
  }
}

// Everything until EOF, reset or the receive timeout; `reset` tells whether it ended in a reset.
std::string read_until_close(int fd, bool* reset = nullptr) {
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (reset) *reset = n < 0 && errno == ECONNRESET;
    return out;
  }
}

// True when the peer closed: recv returns 0 or a reset within the socket's receive timeout.
bool peer_closed(int fd) {
  char c;
  ssize_t n = ::recv(fd, &c, 1, 0);
  return n == 0 || (n < 0 && errno == ECONNRESET);
}

// ---- server: timeouts that bound phases, not responses ----

TEST(ServerTimeouts, QuietStreamOutlivesTheKeepAliveAndWriteTimeouts) {
  // Headers go out at once (as SGLang's StreamingResponse does), then a long silence (a prefill
  // behind a queue), then the tokens. Neither the keep-alive nor the write timeout may cut it.
  ServerConfig cfg;
  cfg.idle_timeout = 200ms;
  cfg.write_timeout = 200ms;
  TestServer s(
      [](Exchange& ex) -> awaitable<void> {
        const Header h[] = {{"content-type", "text/event-stream"}};
        co_await ex.begin_body(200, h, std::nullopt);
        co_await ex.flush();
        co_await sleep_for(ex, 1000ms);
        co_await ex.write_body("data: {\"text\":\"late\"}\n\n");
        co_await ex.write_body("data: [DONE]\n\n");
        co_await ex.end_body();
      },
      cfg);
  testing::HttpClient c(s.port());
  auto r = c.post("/s", "{}");
  ASSERT_EQ(r.status, 200);
  EXPECT_FALSE(r.truncated);
  EXPECT_EQ(testing::sse_data(r.body), (std::vector<std::string>{"{\"text\":\"late\"}", "[DONE]"}));
  EXPECT_EQ(s.stats().write_timeouts.load(), 0u);
}

TEST(ServerTimeouts, ClientThatStopsReadingIsDropped) {
  ServerConfig cfg;
  cfg.write_timeout = 300ms;
  std::promise<bool> write_failed;
  TestServer s(
      [&](Exchange& ex) -> awaitable<void> {
        co_await ex.begin_body(200, {}, std::nullopt);
        std::string chunk(65536, 'x');
        for (int i = 0; i < 16384; ++i) {  // up to 1 GiB: far more than socket buffers hold
          bool written = co_await ex.write_body(chunk);
          if (!written) {
            write_failed.set_value(true);
            co_return;
          }
        }
        write_failed.set_value(false);
      },
      cfg);
  int fd = connect_to(s.port());
  send_all(fd, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");  // and never read
  auto f = write_failed.get_future();
  ASSERT_EQ(f.wait_for(10s), std::future_status::ready);
  EXPECT_TRUE(f.get());
  EXPECT_EQ(s.stats().write_timeouts.load(), 1u);
  ::close(fd);
}

TEST(ServerTimeouts, SlowHeadersGet408) {
  ServerConfig cfg;
  cfg.header_timeout = 300ms;
  TestServer s(ok_handler, cfg);
  int fd = connect_to(s.port());
  send_all(fd, "GET / HTTP/1.1\r\nHost: x\r\n");  // the blank line never comes
  std::string out = read_until_close(fd);
  ::close(fd);
  EXPECT_NE(out.find("HTTP/1.1 408"), std::string::npos) << out;
  EXPECT_NE(out.find("request headers did not arrive within 0.3 s"), std::string::npos) << out;
  EXPECT_EQ(s.stats().rejected[ServerStats::kHeaderTimeout].load(), 1u);
}

TEST(ServerTimeouts, SlowBodyGets408) {
  ServerConfig cfg;
  cfg.body_timeout = 300ms;
  TestServer s(ok_handler, cfg);
  int fd = connect_to(s.port());
  send_all(fd, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789");
  std::string out = read_until_close(fd);
  ::close(fd);
  EXPECT_NE(out.find("HTTP/1.1 408"), std::string::npos) << out;
  EXPECT_NE(out.find("request body did not arrive"), std::string::npos) << out;
  EXPECT_EQ(s.stats().rejected[ServerStats::kBodyTimeout].load(), 1u);
}

TEST(ServerTimeouts, IdleKeepAliveConnectionIsClosed) {
  ServerConfig cfg;
  cfg.idle_timeout = 200ms;
  TestServer s(ok_handler, cfg);
  int fd = connect_to(s.port());
  send_all(fd, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  char buf[512];
  ASSERT_GT(::recv(fd, buf, sizeof buf, 0), 0);
  EXPECT_TRUE(peer_closed(fd));
  ::close(fd);
  EXPECT_TRUE(wait_until([&] { return s.stats().idle_closed.load() == 1; }));
}

// ---- server: idle connections parked (http/parking) ----

// A request on `fd` and its answer (a small one, whole in one receive).
std::string ask(int fd, std::string_view target) {
  send_all(fd, "GET " + std::string(target) + " HTTP/1.1\r\nHost: x\r\n\r\n");
  char buf[512];
  ssize_t n = ::recv(fd, buf, sizeof buf, 0);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

TEST(ServerParking, AnIdleConnectionIsParkedAndServedAgain) {
  TestServer s(ok_handler);
  int fd = connect_to(s.port());
  ASSERT_NE(ask(fd, "/1").find("200"), std::string::npos);
  // Idle for over a second: parked, still open and idle.
  ASSERT_TRUE(wait_until([&] { return s.stats().parked.load() == 1; }));
  EXPECT_EQ(s.stats().connections.load(), 1);
  EXPECT_EQ(s.stats().idle.load(), 1);
  EXPECT_EQ(s.server().busy_connections(), 0);
  for (int i = 0; i < 3; ++i) {  // a request brings it back, as often as it is parked
    std::string r = ask(fd, "/again");
    EXPECT_NE(r.find("HTTP/1.1 200"), std::string::npos) << r;
    EXPECT_EQ(r.find("close"), std::string::npos) << r;
    ASSERT_TRUE(wait_until([&] { return s.stats().parked.load() == 1; }));
  }
  EXPECT_EQ(s.stats().connections.load(), 1);
  EXPECT_EQ(s.stats().accepted.load(), 1u);
  // The client leaves while parked: the connection is closed and no longer counted.
  ::close(fd);
  EXPECT_TRUE(wait_until([&] { return s.stats().connections.load() == 0; }));
  EXPECT_EQ(s.stats().parked.load(), 0);
  EXPECT_EQ(s.stats().idle.load(), 0);
}

TEST(ServerParking, PipelinedBytesSentJustAsItParksAreAnswered) {
  TestServer s(ok_handler);
  int fd = connect_to(s.port());
  ASSERT_NE(ask(fd, "/1").find("200"), std::string::npos);
  ASSERT_TRUE(wait_until([&] { return s.stats().parked.load() == 1; }));
  // Two requests in one send, the second split across two: both answered, in order.
  send_all(fd, "GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHo");
  send_all(fd, "st: x\r\n\r\n");
  std::string got;
  char buf[512];
  while (got.find("ok", got.find("ok") + 1) == std::string::npos) {
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    ASSERT_GT(n, 0) << got;
    got.append(buf, static_cast<size_t>(n));
  }
  EXPECT_EQ(got.find("HTTP/1.1 200"), 0u);
  EXPECT_NE(got.find("HTTP/1.1 200", 1), std::string::npos);
  ::close(fd);
}

TEST(ServerParking, AParkedConnectionClosesAtTheKeepAliveTimeout) {
  ServerConfig cfg;
  cfg.idle_timeout = 1500ms;  // parked after 1 s, closed 0.5 s later
  TestServer s(ok_handler, cfg);
  int fd = connect_to(s.port());
  ASSERT_NE(ask(fd, "/").find("200"), std::string::npos);
  ASSERT_TRUE(wait_until([&] { return s.stats().parked.load() == 1; }));
  EXPECT_TRUE(peer_closed(fd));
  ::close(fd);
  EXPECT_TRUE(wait_until([&] { return s.stats().connections.load() == 0; }));
  EXPECT_EQ(s.stats().idle_closed.load(), 1u);
  EXPECT_EQ(s.stats().idle.load(), 0);
  EXPECT_EQ(s.stats().parked.load(), 0);
}

TEST(ServerParking, ARequestArrivingAsShutdownBeginsIsAnsweredNotReset) {
  TestServer s(ok_handler);
  int fd = connect_to(s.port());
  ASSERT_NE(ask(fd, "/").find("200"), std::string::npos);
  ASSERT_TRUE(wait_until([&] { return s.stats().parked.load() == 1; }));
  // On the server's thread: the request is sent, then the shutdown starts, before the thread
  // has looked at the parked connections again.
  std::promise<void> done;
  asio::post(s.ctx(), [&] {
    send_all(fd, "POST /last HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}");
    s.server().stop();
    done.set_value();
  });
  done.get_future().get();
  bool reset = false;
  std::string out = read_until_close(fd, &reset);
  ::close(fd);
  EXPECT_FALSE(reset);
  EXPECT_EQ(out.find("HTTP/1.1 200"), 0u) << out;
  EXPECT_NE(out.find("connection: close"), std::string::npos) << out;
  EXPECT_TRUE(wait_until([&] { return s.stats().connections.load() == 0; }));
  EXPECT_EQ(s.stats().parked.load(), 0);
}

TEST(ServerParking, StopClosesParkedConnections) {
  TestServer s(ok_handler);
  int fd = connect_to(s.port());
  ASSERT_NE(ask(fd, "/").find("200"), std::string::npos);
  ASSERT_TRUE(wait_until([&] { return s.stats().parked.load() == 1; }));
  s.server().stop();
  EXPECT_TRUE(peer_closed(fd));
  ::close(fd);
  EXPECT_TRUE(wait_until([&] { return s.stats().connections.load() == 0; }));
  EXPECT_EQ(s.stats().idle_closed.load(), 1u);
  EXPECT_EQ(s.server().busy_connections(), 0);
}

// ---- server: errors reach the client; limits ----

TEST(ServerLimits, ErrorReachesAClientStillSendingItsBody) {
  // 413 while the client is still uploading: closing at once with unread bytes would make the
  // kernel reset the connection, and the client could lose the answer. Lingering close keeps it.
  ServerConfig cfg;
  cfg.body_limit = 1000;
  TestServer s(ok_handler, cfg);
  int fd = connect_to(s.port());
  std::thread sender([fd] {
    send_all(fd, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4000000\r\n\r\n");
    std::string chunk(65536, 'a');
    for (int i = 0; i < 60; ++i) send_all(fd, chunk);
  });
  bool reset = false;
  std::string out = read_until_close(fd, &reset);
  sender.join();
  ::close(fd);
  EXPECT_NE(out.find("HTTP/1.1 413"), std::string::npos) << out.substr(0, 200);
  EXPECT_NE(out.find("payload_too_large"), std::string::npos);
}

TEST(ServerLimits, ConnectionsBeyondTheLimitAreRefusedAndCounted) {
  ServerConfig cfg;
  cfg.max_connections = 2;
  TestServer s(ok_handler, cfg);
  testing::HttpClient a(s.port()), b(s.port());
  ASSERT_EQ(a.get("/").status, 200);
  ASSERT_EQ(b.get("/").status, 200);
  int fd = connect_to(s.port());
  EXPECT_TRUE(peer_closed(fd));
  ::close(fd);
  EXPECT_EQ(s.stats().refused.load(), 1u);
  a.close();
  ASSERT_TRUE(wait_until([&] { return s.stats().connections.load() == 1; }));
  testing::HttpClient c(s.port());
  EXPECT_EQ(c.get("/").status, 200);
}

// ---- server: shutdown ----

TEST(ServerShutdown, StopClosesIdleConnectionsAndEndsActiveOnesAfterTheirAnswer) {
  std::promise<void> release;
  auto released = release.get_future().share();
  std::atomic<int> started{0};
  TestServer s([&](Exchange& ex) -> awaitable<void> {
    if (ex.path() == "/slow") {
      started++;
      while (released.wait_for(0s) != std::future_status::ready) co_await sleep_for(ex, 10ms);
    }
    co_await ex.respond(200, {}, "done");
  });
  testing::HttpClient idle(s.port());
  ASSERT_EQ(idle.get("/").status, 200);  // now idle, keep-alive
  auto busy = std::async(std::launch::async, [&] {
    testing::HttpClient c(s.port());
    return c.get("/slow");
  });
  ASSERT_TRUE(wait_until([&] { return started.load() == 1; }));
  s.server().stop();
  ASSERT_TRUE(wait_until([&] { return s.stats().idle_closed.load() == 1; }));
  release.set_value();
  auto r = busy.get();
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.header("connection"), "close");  // told, while draining
  EXPECT_TRUE(r.closed);
  EXPECT_TRUE(wait_until([&] { return s.stats().connections.load() == 0; }));
}

TEST(ServerShutdown, CloseAllFiresTheDisconnectWatchOfExchangesInProgress) {
  std::atomic<bool> watched{false}, fired{false}, returned{false};
  TestServer s([&](Exchange& ex) -> awaitable<void> {
    ex.watch_disconnect([&] { fired = true; });
    watched = true;
    while (!fired) co_await sleep_for(ex, 10ms);
    returned = true;
  });
  int fd = connect_to(s.port());
  send_all(fd, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_TRUE(wait_until([&] { return watched.load(); }));
  s.server().close_all();
  EXPECT_TRUE(wait_until([&] { return returned.load(); }));
  EXPECT_TRUE(peer_closed(fd));
  ::close(fd);
}

TEST(ServerShutdown, ClientHangingUpBehindPipelinedBytesIsStillNoticed) {
  // A client that sent more bytes (a pipelined request, or a TLS close_notify) and then left:
  // a peek sees the bytes, not the hang-up behind them; the watch must still fire.
  std::atomic<bool> fired{false}, returned{false};
  TestServer s([&](Exchange& ex) -> awaitable<void> {
    ex.watch_disconnect([&] { fired = true; });
    for (int i = 0; i < 1000 && !fired; ++i) co_await sleep_for(ex, 10ms);
    returned = true;
    co_await ex.respond(200, {}, "late");
  });
  int fd = connect_to(s.port());
  send_all(fd, "GET /slow HTTP/1.1\r\nHost: x\r\n\r\nGET /next HTTP/1.1\r\nHost: x\r\n");
  ASSERT_TRUE(wait_until([&] { return s.stats().connections.load() == 1; }));
  ::close(fd);
  EXPECT_TRUE(wait_until([&] { return fired.load(); }, 5s));
  EXPECT_TRUE(wait_until([&] { return returned.load(); }));
}

TEST(ServerShutdown, ARequestStillArrivingIsCountedBusyUntilAnswered) {
  // Graceful shutdown waits for connections still reading a request, not only for requests
  // already handled: busy_connections() counts them.
  TestServer s(ok_handler);
  int fd = connect_to(s.port());
  send_all(fd, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nab");
  EXPECT_TRUE(wait_until([&] { return s.server().busy_connections() == 1; }));
  s.server().stop();
  EXPECT_EQ(s.server().busy_connections(), 1);
  send_all(fd, "cd");
  std::string out = read_until_close(fd);
  ::close(fd);
  EXPECT_NE(out.find("HTTP/1.1 200"), std::string::npos) << out;
  EXPECT_NE(out.find("connection: close"), std::string::npos) << out;
  EXPECT_TRUE(wait_until([&] { return s.server().busy_connections() == 0; }));
}

// ---- server: hostile HTTP ----

struct Hostile {
  const char* name;
  const char* bytes;
};

TEST(ServerHostileInput, AmbiguousFramingAndMalformedHeadsGet400AndClose) {
  std::atomic<int> handled{0};
  TestServer s([&](Exchange& ex) -> awaitable<void> {
    handled++;
    co_await ex.respond(200, {}, "handled");
  });
  const Hostile cases[] = {
      {"content-length and transfer-encoding",
       "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
       "0\r\n\r\n"},
      {"conflicting content-lengths",
       "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!"},
      {"content-length list", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5, 6\r\n\r\nhello!"},
      {"negative content-length", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n"},
      {"bad chunk size",
       "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n"},
      {"chunk size overflow",
       "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
       "ffffffffffffffffffff\r\nx\r\n0\r\n\r\n"},
      {"unknown transfer coding", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n"},
      {"space before colon", "GET / HTTP/1.1\r\nHost : x\r\n\r\n"},
      {"NUL in a header value", "GET / HTTP/1.1\r\nHost: x\r\nX-A: a\0b\r\n\r\n"},
      {"bare LF line endings", "GET / HTTP/1.1\nHost: x\n\n"},
      {"bad version", "GET / HTTP/9.9\r\nHost: x\r\n\r\n"},
  };
  for (const auto& c : cases) {
    int fd = connect_to(s.port());
    std::string bytes(c.bytes);
    if (std::string_view(c.name) == "NUL in a header value") {
      bytes = std::string("GET / HTTP/1.1\r\nHost: x\r\nX-A: a\0b\r\n\r\n", 38);
    }
    send_all(fd, bytes);
    std::string out = read_until_close(fd);
    ::close(fd);
    EXPECT_NE(out.find("HTTP/1.1 400"), std::string::npos) << c.name << ": " << out;
    EXPECT_NE(out.find("connection: close"), std::string::npos) << c.name;
  }
  EXPECT_EQ(handled.load(), 0);
}

TEST(ServerHostileInput, ObsFoldIsNeverForwardedWithItsLineBreak) {
  // RFC 9112 5.2: a folded header is rejected or unfolded; what reaches a handler never carries
  // CR or LF (it would become header injection when forwarded).
  std::string seen;
  std::mutex mu;
  TestServer s([&](Exchange& ex) -> awaitable<void> {
    {
      std::lock_guard lock(mu);
      seen = std::string(ex.header("x-folded"));
    }
    co_await ex.respond(200, {}, "ok");
  });
  int fd = connect_to(s.port());
  send_all(fd,
           "GET / HTTP/1.1\r\nHost: x\r\nX-Folded: a\r\n Evil: injected\r\nConnection: "
           "close\r\n\r\n");
  std::string out = read_until_close(fd);
  ::close(fd);
  bool rejected = out.find("HTTP/1.1 400") != std::string::npos;
  std::lock_guard lock(mu);
  EXPECT_TRUE(rejected || (out.find("HTTP/1.1 200") != std::string::npos &&
                           seen.find_first_of("\r\n") == std::string::npos))
      << out << " seen=" << seen;
}

TEST(ServerHostileInput, HugeHeaderCountAndLongLinesAre431) {
  ServerConfig cfg;
  cfg.header_limit = 8192;
  TestServer s(ok_handler, cfg);
  std::string many = "GET / HTTP/1.1\r\nHost: x\r\n";
  for (int i = 0; i < 2000; ++i) many += "X-" + std::to_string(i) + ": v\r\n";
  many += "\r\n";
  int fd = connect_to(s.port());
  send_all(fd, many);
  std::string out = read_until_close(fd);
  ::close(fd);
  EXPECT_NE(out.find("HTTP/1.1 431"), std::string::npos) << out.substr(0, 200);
  fd = connect_to(s.port());
  send_all(fd, "GET /" + std::string(20000, 'a') + " HTTP/1.1\r\nHost: x\r\n\r\n");
  out = read_until_close(fd);
  ::close(fd);
  EXPECT_NE(out.find("HTTP/1.1 431"), std::string::npos) << out.substr(0, 200);
}

// ---- client: what may be pooled and what may be resent ----

// A loopback TCP server whose connections the test scripts byte by byte.
class RawServer {
 public:
  using Script = std::function<void(int fd, int index)>;
  explicit RawServer(Script script) : script_(std::move(script)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::listen(fd_, 16);
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    accept_thread_ = std::thread([this] {
      for (;;) {
        pollfd p{fd_, POLLIN, 0};
        if (::poll(&p, 1, 50) <= 0) {
          if (stop_) return;
          continue;
        }
        int c = ::accept(fd_, nullptr, nullptr);
        if (c < 0) continue;
        int index = accepted_++;
        std::lock_guard lock(mu_);
        workers_.emplace_back([this, c, index] {
          timeval tv{5, 0};
          ::setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
          script_(c, index);
          ::close(c);
          finished_++;
        });
      }
    });
  }
  ~RawServer() {
    stop_ = true;
    accept_thread_.join();
    std::lock_guard lock(mu_);
    for (auto& t : workers_) t.join();
    ::close(fd_);
  }
  int port() const { return port_; }
  int accepted() const { return accepted_.load(); }
  // Connections whose script ended and whose socket is closed.
  int finished() const { return finished_.load(); }
  Target target() const {
    Target t;
    parse_url("http://127.0.0.1:" + std::to_string(port_), t);
    resolve(t);
    return t;
  }

 private:
  Script script_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> accepted_{0};
  std::atomic<int> finished_{0};
  std::thread accept_thread_;
  std::mutex mu_;
  std::vector<std::thread> workers_;
};

// Reads one request head (and a Content-Length body) from a raw connection; "" on EOF.
std::string read_request(int fd) {
  std::string in;
  char buf[4096];
  while (in.find("\r\n\r\n") == std::string::npos) {
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return "";
    in.append(buf, static_cast<size_t>(n));
  }
  auto cl = in.find("content-length: ");
  size_t want = cl == std::string::npos ? 0 : std::stoul(in.substr(cl + 16));
  size_t have = in.size() - in.find("\r\n\r\n") - 4;
  while (have < want) {
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return "";
    have += static_cast<size_t>(n);
    in.append(buf, static_cast<size_t>(n));
  }
  return in;
}

// Runs a coroutine on a context and waits for its result.
template <class T>
T run_on(asio::io_context& ctx, std::function<awaitable<T>()> fn) {
  std::promise<T> p;
  asio::co_spawn(
      ctx, [&]() -> awaitable<void> { p.set_value(co_await fn()); }, asio::detached);
  return p.get_future().get();
}

struct CallResult {
  CallError error = CallError::kNone;
  int status = 0;
  std::string body;
  bool sent = false;
  bool fresh = false;
};

class ClientSide {
 public:
  ClientSide() : server_([](Exchange&) -> awaitable<void> { co_return; }) {}
  CallResult call(const Target& t, std::string_view body = "{}") {
    return run_on<CallResult>(server_.ctx(), [&]() -> awaitable<CallResult> {
      CallResult r;
      UpstreamCall c(server_.ctx().get_executor(), pool_, t, 1);
      c.set_deadline(Clock::now() + 5s);
      r.error = co_await c.start("POST", "/generate", {}, body);
      r.sent = c.request_sent();
      r.fresh = c.connected_fresh();
      if (r.error == CallError::kNone) {
        r.status = c.status();
        r.error = co_await c.read_all(r.body);
      }
      co_return r;
    });
  }
  size_t idle() {
    return run_on<size_t>(server_.ctx(),
                          [&]() -> awaitable<size_t> { co_return pool_.idle_count(); });
  }
  asio::io_context& ctx() { return server_.ctx(); }
  ConnectionPool& pool() { return pool_; }

 private:
  TestServer server_;
  ConnectionPool pool_;
};

TEST(UpstreamPooling, InterimAnswersAreSkippedAndTheConnectionStaysInStep) {
  RawServer raw([](int fd, int) {
    if (read_request(fd).empty()) return;
    send_all(fd,
             "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n"
             "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst");
    if (read_request(fd).empty()) return;
    send_all(fd, "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecond");
  });
  ClientSide client;
  Target t = raw.target();
  auto a = client.call(t);
  EXPECT_EQ(a.status, 200);
  EXPECT_EQ(a.body, "first");  // not the 100's empty answer
  auto b = client.call(t);
  EXPECT_EQ(b.status, 200);
  EXPECT_EQ(b.body, "second");
  EXPECT_FALSE(b.fresh);  // the same connection, in step
  EXPECT_EQ(raw.accepted(), 1);
}

TEST(UpstreamPooling, LeftoverBytesAfterAnAnswerKeepTheConnectionOutOfThePool) {
  // One user's answer must never be read as another's: bytes past the end of a response mean
  // the connection is out of step, and it is dropped.
  RawServer raw([](int fd, int index) {
    if (read_request(fd).empty()) return;
    if (index == 0) {
      send_all(fd,
               "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst"
               "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nEVIL!");
    } else {
      send_all(fd, "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecond");
    }
    read_request(fd);
  });
  ClientSide client;
  Target t = raw.target();
  EXPECT_EQ(client.call(t).body, "first");
  auto b = client.call(t);
  EXPECT_EQ(b.body, "second");
  EXPECT_TRUE(b.fresh);
}

TEST(UpstreamPooling, UnsolicitedBytesOnAnIdleConnectionAreNotReadAsTheNextAnswer) {
  std::atomic<bool> pooled{false}, injected{false};
  RawServer raw([&](int fd, int index) {
    if (read_request(fd).empty()) return;
    if (index == 0) {
      send_all(fd, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst");
      wait_until([&] { return pooled.load(); });  // the client took its answer and pooled
      send_all(fd, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nEVIL!");
      injected = true;
    } else {
      send_all(fd, "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecond");
    }
    read_request(fd);
  });
  ClientSide client;
  Target t = raw.target();
  EXPECT_EQ(client.call(t).body, "first");
  EXPECT_EQ(client.idle(), 1u);
  pooled = true;
  ASSERT_TRUE(wait_until([&] { return injected.load(); }));
  auto b = client.call(t);
  EXPECT_EQ(b.body, "second");
  EXPECT_TRUE(b.fresh);
  EXPECT_GE(client.pool().stale_dropped(), 1u);
}

TEST(UpstreamPooling, AnswerNotReadToTheEndIsNotPooled) {
  RawServer raw([](int fd, int) {
    if (read_request(fd).empty()) return;
    send_all(fd, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n");
    read_request(fd);  // never finishes the body; waits for the client to go
  });
  ClientSide client;
  Target t = raw.target();
  auto n = run_on<size_t>(client.ctx(), [&]() -> awaitable<size_t> {
    UpstreamCall c(client.ctx().get_executor(), client.pool(), t, 1);
    co_await c.start("POST", "/generate", {}, "{}");
    CallError e;
    co_return (co_await c.read_view(e)).size();  // one piece, then abandoned
  });
  EXPECT_EQ(n, 5u);
  EXPECT_EQ(client.idle(), 0u);
}

// ---- upstream: read_view, the body in place in the connection's buffer ----

// The pieces read_view gives for one answer, until the end or an error ("!" + error last);
// `taken` (when given) counts the pieces as they come, for a worker script to wait on.
std::vector<std::string> pieces_of(ClientSide& client, const Target& t,
                                   std::atomic<int>* taken = nullptr) {
  return run_on<std::vector<std::string>>(
      client.ctx(), [&]() -> awaitable<std::vector<std::string>> {
        std::vector<std::string> out;
        UpstreamCall c(client.ctx().get_executor(), client.pool(), t, 1);
        c.set_deadline(Clock::now() + 5s);
        CallError started = co_await c.start("POST", "/generate", {}, "{}");
        if (started != CallError::kNone) co_return out;
        for (;;) {
          CallError e = CallError::kNone;
          std::string_view piece = co_await c.read_view(e);
          if (!piece.empty() && e != CallError::kNone) {
            out.push_back("data with an error");  // never both (the view may be gone)
          }
          if (!piece.empty()) out.emplace_back(piece);
          if (!piece.empty() && taken) ++*taken;
          if (e != CallError::kNone) {
            out.push_back("!" + std::string(to_string(e)));
            break;
          }
          if (piece.empty()) break;
        }
        co_return out;
      });
}

TEST(UpstreamReadView, ChunksThatArriveTogetherComeAsOnePiece) {
  std::atomic<int> taken{0};
  RawServer raw([&](int fd, int) {
    if (read_request(fd).empty()) return;
    // Three chunks in one write (one segment on loopback, read with the head), framing between
    // them; the rest only once that piece was taken, in two writes split inside a chunk size.
    send_all(fd,
             "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
             "3\r\nabc\r\n4;ext=1\r\ndefg\r\n1\r\nh\r\n");
    if (!wait_until([&] { return taken.load() >= 1; })) return;
    send_all(fd, "1");
    send_all(fd, "0\r\n" + std::string(16, 'x') + "\r\n0\r\n\r\n");
    read_request(fd);
  });
  ClientSide client;
  auto got = pieces_of(client, raw.target(), &taken);
  std::string all;
  for (const auto& p : got) all += p;
  EXPECT_EQ(all, "abcdefgh" + std::string(16, 'x'));
  ASSERT_FALSE(got.empty());
  EXPECT_EQ(got[0], "abcdefgh");  // three chunks, one piece
  for (const auto& p : got) {
    EXPECT_EQ(p.find_first_of("\r\n;!"), std::string::npos) << p;  // data only, no framing
  }
  EXPECT_EQ(client.idle(), 1u);  // read to its end: pooled
}

TEST(UpstreamReadView, ContentLengthBodyStopsAtItsEnd) {
  std::atomic<int> taken{0};
  RawServer raw([&](int fd, int) {
    if (read_request(fd).empty()) return;
    send_all(fd, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123");
    if (!wait_until([&] { return taken.load() >= 1; })) return;  // the rest in a later read
    send_all(fd, "456789");
    read_request(fd);
  });
  ClientSide client;
  auto got = pieces_of(client, raw.target(), &taken);
  EXPECT_EQ(got, (std::vector<std::string>{"0123", "456789"}));
  EXPECT_EQ(client.idle(), 1u);
}

TEST(UpstreamReadView, BytesAfterAContentLengthBodyAreNotPartOfIt) {
  RawServer raw([](int fd, int) {
    if (read_request(fd).empty()) return;
    send_all(fd, "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nbodyEXTRA");
    read_request(fd);
  });
  ClientSide client;
  auto got = pieces_of(client, raw.target());
  std::string all;
  for (const auto& p : got) all += p;
  EXPECT_EQ(all, "body");
  EXPECT_EQ(client.idle(), 0u);  // bytes nobody asked for: never pooled
}

TEST(UpstreamReadView, MalformedChunkFailsAfterTheDataBeforeIt) {
  RawServer raw([](int fd, int) {
    if (read_request(fd).empty()) return;
    send_all(fd, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\nzz\r\n");
    read_request(fd);
  });
  ClientSide client;
  auto got = pieces_of(client, raw.target());
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0], "ok");
  EXPECT_EQ(got[1], "!protocol");
  EXPECT_EQ(client.idle(), 0u);
}

TEST(UpstreamReadView, AFailedBodyStaysFailed) {
  // After a failure, a later read must not look like the end of a complete body.
  RawServer raw([](int fd, int) {
    if (read_request(fd).empty()) return;
    send_all(fd, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort");
    ::shutdown(fd, SHUT_RDWR);  // gone before the body's end
  });
  ClientSide client;
  Target t = raw.target();
  auto errors =
      run_on<std::vector<CallError>>(client.ctx(), [&]() -> awaitable<std::vector<CallError>> {
        std::vector<CallError> out;
        UpstreamCall c(client.ctx().get_executor(), client.pool(), t, 1);
        c.set_deadline(Clock::now() + 5s);
        CallError started = co_await c.start("POST", "/generate", {}, "{}");
        if (started != CallError::kNone) co_return out;
        for (int i = 0; i < 4; ++i) {
          CallError e = CallError::kNone;
          std::string_view piece = co_await c.read_view(e);
          if (piece.empty()) out.push_back(e);
        }
        co_return out;
      });
  ASSERT_EQ(errors.size(), 3u);  // "short", then the failure, every time
  for (CallError e : errors) EXPECT_NE(e, CallError::kNone);
}

TEST(UpstreamRetrySafety, ResetAfterTheWholeRequestWasSentIsNotResent) {
  // The worker read the whole request, then the connection died: it may be generating. The call
  // fails (request_sent tells the gateway not to retry); it never resends on its own.
  std::atomic<int> requests{0};
  RawServer raw([&](int fd, int) {
    if (read_request(fd).empty()) return;
    requests++;
    linger l{1, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);  // close with a reset
  });
  ClientSide client;
  Target t = raw.target();
  auto r = client.call(t);
  EXPECT_EQ(r.error, CallError::kReset);
  EXPECT_TRUE(r.sent);
  EXPECT_EQ(requests.load(), 1);
  EXPECT_EQ(raw.accepted(), 1);
}

TEST(UpstreamRetrySafety, PooledConnectionClosedWhileIdleIsReplacedBeforeSending) {
  std::atomic<int> requests{0};
  RawServer raw([&](int fd, int index) {
    if (read_request(fd).empty()) return;
    requests++;
    send_all(fd, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
    if (index == 0) return;  // closes right after answering (keep-alive promised)
    read_request(fd);
  });
  ClientSide client;
  Target t = raw.target();
  EXPECT_EQ(client.call(t).status, 200);
  // Closed on the server (on loopback its FIN is in the client's socket once close returns).
  ASSERT_TRUE(wait_until([&] { return raw.finished() == 1; }));
  auto b = client.call(t);
  EXPECT_EQ(b.status, 200);
  EXPECT_TRUE(b.fresh);
  EXPECT_EQ(requests.load(), 2);
}

// ---- the parser in place: requests and answers in every framing, whole and byte by byte ----

// Sends `bytes` one byte per send (TCP_NODELAY: each its own segment, as a slow client's).
void send_bytewise(int fd, std::string_view bytes) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  for (char c : bytes) send_all(fd, std::string_view(&c, 1));
}

awaitable<void> echo_body(Exchange& ex) {
  bool padded = ex.body().capacity() >= ex.body().size() + kBodyPadding;
  std::string out = std::string(ex.method()) + " " + std::string(ex.target()) + " [" + ex.body() +
                    "] padded=" + (padded ? "yes" : "no") + " t=" + std::string(ex.header("x-t"));
  co_await ex.respond(200, {}, out);
}

TEST(ServerParsing, EveryFramingWholeAndByteByByte) {
  TestServer s(echo_body);
  const std::string requests =
      "GET /a HTTP/1.1\r\nHost: x\r\nX-T:  one \r\n\r\n"
      "POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
      "POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
      "5;ext=\"v\"\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n"
      "GET /d HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"
      "GET /e HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  for (bool bytewise : {false, true}) {
    int fd = connect_to(s.port());
    if (bytewise) {
      send_bytewise(fd, requests);
    } else {
      send_all(fd, requests);
    }
    std::string out = read_until_close(fd);
    ::close(fd);
    std::vector<std::string> want = {"GET /a [] padded=yes t=one", "POST /b [hello] padded=yes t=",
                                     "POST /c [hello world] padded=yes t=",
                                     "GET /d [] padded=yes t=", "GET /e [] padded=yes t="};
    size_t at = 0;
    for (const auto& w : want) {
      size_t found = out.find(w, at);
      EXPECT_NE(found, std::string::npos) << w << " in " << out;
      if (found != std::string::npos) at = found;
    }
    EXPECT_NE(out.find("HTTP/1.0 200 OK\r\nconnection: keep-alive"), std::string::npos) << out;
    EXPECT_NE(out.find("connection: close"), std::string::npos) << out;
  }
}

// A request's head leaves the read buffer before its handler runs, and once its answer streams
// the buffer goes back to the thread's spares: the next connection's request is read into that
// very block. The first request's method, target and headers must still be its own.
TEST(ServerParsing, AHeadStaysItsOwnWhenItsReadBufferIsReused) {
  std::atomic<bool> second_read{false};
  std::atomic<bool> given_back{false};
  TestServer s([&](Exchange& ex) -> awaitable<void> {
    if (ex.path() == "/second") {
      second_read = true;
      co_await ex.respond(200, {}, std::string(ex.header("x-t")));
      co_return;
    }
    size_t spares = ReadBuffer::spare_blocks();     // (the server's thread: this one)
    co_await ex.begin_body(200, {}, std::nullopt);  // a stream: the read buffer is given back
    given_back = ReadBuffer::spare_blocks() == spares + 1;
    for (int i = 0; i < 2000 && !second_read; ++i) co_await sleep_for(ex, 5ms);
    std::string out = std::string(ex.method()) + " " + std::string(ex.target()) + " " +
                      std::string(ex.header("x-t")) + " " + ex.body();
    co_await ex.write_body(out);
    co_await ex.end_body();
  });
  auto first = std::async(std::launch::async, [&] {
    testing::HttpClient c(s.port());
    return c.post("/first?q=1", "body-one", {{"X-T", "one-one-one"}});
  });
  ASSERT_TRUE(testing::wait_until([&] { return s.stats().connections.load() == 1; }));
  testing::HttpClient c2(s.port());
  auto r2 = c2.post("/second", "body-two", {{"X-T", "TWO-TWO-TWO"}});
  EXPECT_EQ(r2.body, "TWO-TWO-TWO");
  auto r1 = first.get();
  EXPECT_EQ(r1.status, 200);
  EXPECT_EQ(r1.body, "POST /first?q=1 one-one-one body-one");
  EXPECT_TRUE(given_back);
}

TEST(ReadBuffer, ABlockGivenBackIsTakenAgainAndTheSparesAreBounded) {
  const char* first = nullptr;
  {
    ReadBuffer b;
    b.reserve(ReadBuffer::kBlockSize);
    first = b.base();
    b.release();
    EXPECT_EQ(b.capacity(), 0u);
  }
  ReadBuffer again;
  again.reserve(ReadBuffer::kBlockSize);
  EXPECT_EQ(again.base(), first);  // the spare, not a new block
  std::vector<ReadBuffer> many(ReadBuffer::kSpareBlocks + 8);
  for (auto& b : many) b.reserve(ReadBuffer::kBlockSize);
  for (auto& b : many) b.release();
  EXPECT_EQ(ReadBuffer::spare_blocks(), ReadBuffer::kSpareBlocks);
  ReadBuffer pinned;  // a buffer holding a head is never given back
  pinned.reserve(ReadBuffer::kBlockSize);
  std::memcpy(pinned.prepare(4).data(), "GET ", 4);
  pinned.commit(4);
  pinned.pin(4);
  pinned.consume(4);
  pinned.release();
  EXPECT_EQ(pinned.capacity(), ReadBuffer::kBlockSize);
}

TEST(ServerParsing, ALargeBodyIsReadWhole) {
  TestServer s([](Exchange& ex) -> awaitable<void> {
    size_t sum = 0;
    for (char c : ex.body()) sum += static_cast<unsigned char>(c);
    bool padded = ex.body().capacity() >= ex.body().size() + kBodyPadding;
    std::string out = std::to_string(ex.body().size()) + " " + std::to_string(sum) +
                      (padded ? " padded" : " short");
    co_await ex.respond(200, {}, out);
  });
  std::string body(300000, '\0');
  size_t sum = 0;
  for (size_t i = 0; i < body.size(); ++i) {
    body[i] = static_cast<char>('a' + i % 26);
    sum += static_cast<unsigned char>(body[i]);
  }
  testing::HttpClient c(s.port());
  auto r = c.post("/big", body);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, std::to_string(body.size()) + " " + std::to_string(sum) + " padded");
  // Chunked, in chunks of 7000 bytes.
  std::string chunked = "POST /big HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (size_t i = 0; i < body.size(); i += 7000) {
    std::string part = body.substr(i, 7000);
    char size[16];
    std::snprintf(size, sizeof size, "%zx\r\n", part.size());
    chunked += size + part + "\r\n";
  }
  chunked += "0\r\n\r\n";
  int fd = connect_to(s.port());
  send_all(fd, chunked);
  ::shutdown(fd, SHUT_WR);
  std::string out = read_until_close(fd);
  ::close(fd);
  EXPECT_NE(out.find(std::to_string(body.size()) + " " + std::to_string(sum) + " padded"),
            std::string::npos)
      << out.substr(0, 300);
}

TEST(ServerParsing, ChunkedBodiesBeyondTheLimitAre413) {
  ServerConfig cfg;
  cfg.body_limit = 10;
  TestServer s(echo_body, cfg);
  int fd = connect_to(s.port());
  send_all(fd,
           "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
           "5\r\nhello\r\n6\r\nworld!\r\n0\r\n\r\n");
  std::string out = read_until_close(fd);
  ::close(fd);
  EXPECT_NE(out.find("HTTP/1.1 413"), std::string::npos) << out;
  EXPECT_EQ(s.stats().rejected[ServerStats::kBodyTooLarge].load(), 1u);
}

TEST(ServerParsing, MalformedHeadsByteByByteGet400) {
  TestServer s(echo_body);
  for (std::string_view bad :
       {"GET / HTTP/1.1\r\nHost : x\r\n\r\n", "GET / HTTP/1.1\r\nX: a\r\n folded\r\n\r\n",
        "GET /a b HTTP/1.1\r\n\r\n"}) {
    int fd = connect_to(s.port());
    send_bytewise(fd, bad);
    std::string out = read_until_close(fd);
    ::close(fd);
    EXPECT_NE(out.find("HTTP/1.1 400"), std::string::npos) << bad << ": " << out;
    EXPECT_NE(out.find("malformed HTTP request"), std::string::npos) << out;
  }
}

// Answers each request with the next of `answers`, `piece` bytes per send.
RawServer::Script answer_with(std::vector<std::string> answers, size_t piece) {
  return [answers = std::move(answers), piece](int fd, int) {
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    for (const auto& a : answers) {
      if (read_request(fd).empty()) return;
      for (size_t i = 0; i < a.size(); i += piece)
        send_all(fd, std::string_view(a).substr(i, piece));
    }
    read_request(fd);
  };
}

TEST(UpstreamParsing, EveryFramingWholeAndByteByByte) {
  const std::vector<std::string> answers = {
      "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: a\r\n\r\nfirst",
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
      "4;x=1\r\nsec \r\n3\r\nond\r\n0\r\nX-Trailer: t\r\n\r\n",
      "HTTP/1.1 204 No Content\r\n\r\n",
      "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 4\r\n\r\nlast",
  };
  for (size_t piece : {size_t{1}, size_t{3}, size_t{100000}}) {
    RawServer raw(answer_with(answers, piece));
    ClientSide client;
    Target t = raw.target();
    auto a = client.call(t);
    EXPECT_EQ(a.status, 200);
    EXPECT_EQ(a.body, "first");
    auto b = client.call(t);
    EXPECT_EQ(b.error, CallError::kNone);
    EXPECT_EQ(b.body, "sec ond");
    EXPECT_FALSE(b.fresh);
    auto c = client.call(t);
    EXPECT_EQ(c.status, 204);
    EXPECT_EQ(c.body, "");
    auto d = client.call(t);
    EXPECT_EQ(d.status, 201);
    EXPECT_EQ(d.body, "last");
    EXPECT_EQ(raw.accepted(), 1) << "piece " << piece;  // all four on one connection
  }
}

TEST(UpstreamParsing, ABodyUntilCloseEndsWithTheConnection) {
  RawServer raw([](int fd, int) {
    if (read_request(fd).empty()) return;
    send_all(fd, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nall of this");
  });
  ClientSide client;
  Target t = raw.target();
  auto r = client.call(t);
  EXPECT_EQ(r.error, CallError::kNone);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "all of this");
  EXPECT_EQ(client.idle(), 0u);
}

TEST(UpstreamParsing, AnAnswerToHeadHasNoBody) {
  RawServer raw(answer_with({"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n",
                             "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"},
                            100000));
  ClientSide client;
  Target t = raw.target();
  auto r = run_on<CallResult>(client.ctx(), [&]() -> awaitable<CallResult> {
    CallResult out;
    UpstreamCall c(client.ctx().get_executor(), client.pool(), t, 1);
    c.set_deadline(Clock::now() + 5s);
    out.error = co_await c.start("HEAD", "/x", {}, "");
    out.status = c.status();
    if (out.error == CallError::kNone) out.error = co_await c.read_all(out.body);
    out.sent = c.done();
    co_return out;
  });
  EXPECT_EQ(r.error, CallError::kNone);
  EXPECT_EQ(r.status, 200);
  EXPECT_TRUE(r.sent);  // done at once
  auto next = client.call(t);
  EXPECT_EQ(next.body, "ok");
  EXPECT_FALSE(next.fresh);
}

TEST(UpstreamParsing, MalformedAnswersAreProtocolErrors) {
  for (const std::string& bad :
       {std::string("HTTP/1.1 200 OK\r\nContent-Length: 1\r\nTransfer-Encoding: "
                    "chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n"),
        std::string("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: "
                    "3\r\n\r\nabc"),
        std::string("HTTP/1.1 200 OK\nContent-Length: 2\n\nok"),
        std::string("HTTP/1.1 200 OK\r\nX: a\r\n b\r\nContent-Length: "
                    "2\r\n\r\nok"),
        std::string("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                    "zz\r\nhello\r\n0\r\n\r\n"),
        std::string("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                    "5\r\nhelloXX0\r\n\r\n"),
        std::string("HTTP/1.1 101 Switching Protocols\r\n\r\n")}) {
    RawServer raw([bad](int fd, int) {
      if (read_request(fd).empty()) return;
      send_all(fd, bad);
      read_request(fd);
    });
    ClientSide client;
    auto r = client.call(raw.target());
    EXPECT_EQ(r.error, CallError::kProtocol) << bad;
    EXPECT_EQ(client.idle(), 0u);
  }
}

}  // namespace
}  // namespace kvgate::http
