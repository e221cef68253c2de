// Tests for http::Server and http::UpstreamCall, in process on loopback: keep-alive, pipelining,
// limits, streaming, Expect: 100-continue, the upstream pool's stale-connection replacement,
// timeouts and connect failures.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/as_tuple.hpp>
#include <future>
#include <thread>

#include "http/client.h"
#include "http/server.h"
#include "support/http_client.h"
#include "support/process.h"

namespace kvgate::http {
namespace {

using testing::HttpClient;

// A server on its own thread whose handler the test supplies.
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

 private:
  asio::io_context ctx_{1};
  std::unique_ptr<Server> server_;
  std::thread thread_;
};

awaitable<void> echo(Exchange& ex) {
  std::string body = std::string(ex.method()) + " " + std::string(ex.target()) + " " + ex.body();
  const Header h[] = {{"content-type", "text/plain"}, {"x-seen", ex.header("x-test")}};
  co_await ex.respond(200, h, body);
}

TEST(HttpServer, KeepAliveServesManyRequestsOnOneConnection) {
  TestServer s(echo);
  HttpClient c(s.port());
  for (int i = 0; i < 20; ++i) {
    auto r = c.post("/p?i=" + std::to_string(i), "body", {{"X-Test", "v"}});
    ASSERT_EQ(r.status, 200);
    EXPECT_EQ(r.body, "POST /p?i=" + std::to_string(i) + " body");
    EXPECT_EQ(r.header("x-seen"), "v");
    EXPECT_FALSE(r.closed);
  }
  EXPECT_TRUE(c.connected());
}

TEST(HttpServer, PipelinedRequestsAnsweredInOrder) {
  TestServer s(echo);
  HttpClient c(s.port());
  std::string two =
      "GET /one HTTP/1.1\r\nHost: x\r\n\r\nPOST /two HTTP/1.1\r\nHost: x\r\nContent-Length: "
      "3\r\n\r\nabc"
      "GET /three HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  std::string out = c.raw(two, std::chrono::milliseconds(2000));
  auto a = out.find("GET /one ");
  auto b = out.find("POST /two abc");
  auto d = out.find("GET /three ");
  ASSERT_NE(a, std::string::npos) << out;
  ASSERT_NE(b, std::string::npos) << out;
  ASSERT_NE(d, std::string::npos) << out;
  EXPECT_LT(a, b);
  EXPECT_LT(b, d);
}

TEST(HttpServer, BodyLimitGives413AndHeaderLimit431) {
  ServerConfig cfg;
  cfg.body_limit = 100;
  cfg.header_limit = 1024;
  TestServer s(echo, cfg);
  HttpClient c(s.port());
  auto r = c.post("/x", std::string(101, 'a'));
  EXPECT_EQ(r.status, 413);
  EXPECT_NE(r.body.find("payload_too_large"), std::string::npos);
  HttpClient c2(s.port());
  auto r2 = c2.get("/x", {{"X-Big", std::string(2000, 'b')}});
  EXPECT_EQ(r2.status, 431);
  HttpClient c3(s.port());
  EXPECT_EQ(c3.post("/x", std::string(100, 'a')).status, 200);
}

TEST(HttpServer, MalformedRequestGets400) {
  TestServer s(echo);
  HttpClient c(s.port());
  std::string out = c.raw("GARBAGE\r\n\r\n", std::chrono::milliseconds(2000));
  EXPECT_NE(out.find("400 Bad Request"), std::string::npos) << out;
  EXPECT_NE(out.find("bad_http_request"), std::string::npos) << out;
}

TEST(HttpServer, ExpectContinue) {
  TestServer s(echo);
  // A client that waits for 100 Continue before sending the body gets it...
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(s.port()));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  std::string head =
      "POST /e HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2\r\n"
      "Connection: close\r\n\r\n";
  ASSERT_EQ(::send(fd, head.data(), head.size(), 0), static_cast<ssize_t>(head.size()));
  char buf[512];
  ssize_t n = ::recv(fd, buf, sizeof buf, 0);
  ASSERT_GT(n, 0);
  EXPECT_NE(std::string(buf, static_cast<size_t>(n)).find("HTTP/1.1 100 Continue"),
            std::string::npos);
  ASSERT_EQ(::send(fd, "hi", 2, 0), 2);
  std::string rest;
  while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) rest.append(buf, static_cast<size_t>(n));
  ::close(fd);
  EXPECT_NE(rest.find("POST /e hi"), std::string::npos) << rest;
  // ...one that sent the body along with the head does not need it (RFC 9110 10.1.1).
  HttpClient c(s.port());
  std::string out = c.raw(
      "POST /e HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2\r\nConnection: "
      "close\r\n\r\nhi",
      std::chrono::milliseconds(2000));
  EXPECT_NE(out.find("POST /e hi"), std::string::npos) << out;
}

TEST(HttpServer, ChunkedStreamingArrivesInPieces) {
  TestServer s([](Exchange& ex) -> awaitable<void> {
    const Header h[] = {{"content-type", "text/event-stream"}};
    co_await ex.begin_body(200, h, std::nullopt);
    Timer t(ex.executor());
    for (int i = 0; i < 3; ++i) {
      co_await ex.write_body("data: " + std::to_string(i) + "\n\n");
      t.expires_after(std::chrono::milliseconds(20));
      co_await t.async_wait(asio::as_tuple(use_awaitable));
    }
    co_await ex.end_body();
  });
  HttpClient c(s.port());
  int pieces = 0;
  auto r = c.stream("GET", "/s", "", {}, [&](std::string_view) {
    ++pieces;
    return true;
  });
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.header("transfer-encoding"), "chunked");
  EXPECT_EQ(testing::sse_data(r.body), (std::vector<std::string>{"0", "1", "2"}));
  EXPECT_GE(pieces, 3);
  EXPECT_EQ(c.get("/again").status, 200);  // connection still usable
}

TEST(HttpServer, HandlerWithoutResponseGets500) {
  TestServer s([](Exchange&) -> awaitable<void> { co_return; });
  HttpClient c(s.port());
  auto r = c.get("/");
  EXPECT_EQ(r.status, 500);
}

TEST(HttpServer, DisconnectWatchFires) {
  std::promise<void> fired;
  TestServer s([&](Exchange& ex) -> awaitable<void> {
    bool gone = false;
    ex.watch_disconnect([&] { gone = true; });
    Timer t(ex.executor());
    for (int i = 0; i < 200 && !gone; ++i) {
      t.expires_after(std::chrono::milliseconds(10));
      co_await t.async_wait(asio::as_tuple(use_awaitable));
    }
    if (gone) fired.set_value();
    co_await ex.respond(200, {}, "late");
  });
  {
    HttpClient c(s.port());
    c.raw("GET / HTTP/1.1\r\nHost: x\r\n\r\n", std::chrono::milliseconds(50));
  }
  EXPECT_EQ(fired.get_future().wait_for(std::chrono::seconds(3)), std::future_status::ready);
}

// Runs a coroutine on a context and waits for its result.
template <class T>
T run_on(asio::io_context& ctx, std::function<awaitable<T>()> fn) {
  std::promise<T> p;
  asio::co_spawn(
      ctx, [&]() -> awaitable<void> { p.set_value(co_await fn()); }, asio::detached);
  return p.get_future().get();
}

TEST(UpstreamCall, ReusesConnectionsAndReadsBodies) {
  std::atomic<int> connections{0};
  TestServer s(echo);
  TestServer client_side([](Exchange&) -> awaitable<void> { co_return; });
  Target t;
  ASSERT_EQ(parse_url("http://127.0.0.1:" + std::to_string(s.port()), t), "");
  ASSERT_EQ(resolve(t), "");
  ConnectionPool pool;
  for (int i = 0; i < 3; ++i) {
    auto body = run_on<std::string>(client_side.ctx(), [&]() -> awaitable<std::string> {
      UpstreamCall call(client_side.ctx().get_executor(), pool, t, 1);
      const Header h[] = {{"x-test", "y"}};
      auto e = co_await call.start("POST", "/u", h, "payload");
      if (e != CallError::kNone) co_return "error";
      std::string out;
      co_await call.read_all(out);
      if (!call.connected_fresh()) connections++;
      co_return std::to_string(call.status()) + " " + out;
    });
    EXPECT_EQ(body, "200 POST /u payload");
  }
  EXPECT_EQ(connections.load(), 2);  // the 2nd and 3rd calls reused the 1st connection
  EXPECT_EQ(run_on<size_t>(client_side.ctx(),
                           [&]() -> awaitable<size_t> { co_return pool.idle_count(); }),
            1u);
}

TEST(UpstreamCall, ConnectRefusedAndTimeout) {
  TestServer hang([](Exchange& ex) -> awaitable<void> {
    Timer t(ex.executor(), std::chrono::seconds(5));
    co_await t.async_wait(asio::as_tuple(use_awaitable));
    co_await ex.respond(200, {}, "late");
  });
  TestServer client_side([](Exchange&) -> awaitable<void> { co_return; });
  ConnectionPool pool;
  Target closed;
  parse_url("http://127.0.0.1:" + std::to_string(testing::free_port()), closed);
  resolve(closed);
  auto e = run_on<CallError>(client_side.ctx(), [&]() -> awaitable<CallError> {
    UpstreamCall call(client_side.ctx().get_executor(), pool, closed, 1);
    co_return co_await call.start("GET", "/", {}, "");
  });
  EXPECT_EQ(e, CallError::kConnect);
  Target slow;
  parse_url("http://127.0.0.1:" + std::to_string(hang.port()), slow);
  resolve(slow);
  e = run_on<CallError>(client_side.ctx(), [&]() -> awaitable<CallError> {
    UpstreamCall call(client_side.ctx().get_executor(), pool, slow, 2);
    call.set_deadline(Clock::now() + std::chrono::milliseconds(100));
    co_return co_await call.start("GET", "/", {}, "");
  });
  EXPECT_EQ(e, CallError::kTimeout);
}

TEST(UpstreamCall, StaleKeepAliveConnectionIsReplaced) {
  // The server closes each connection after answering (but says keep-alive): the pooled
  // connection is dead on reuse, and the call must transparently use a new one.
  TestServer s([](Exchange& ex) -> awaitable<void> {
    co_await ex.respond(200, {}, "ok");
    ex.close_after();
  });
  auto closed = [&] { return s.server().stats().connections.load() == 0; };
  TestServer client_side([](Exchange&) -> awaitable<void> { co_return; });
  Target t;
  parse_url("http://127.0.0.1:" + std::to_string(s.port()), t);
  resolve(t);
  ConnectionPool pool;
  for (int i = 0; i < 3; ++i) {
    auto status = run_on<int>(client_side.ctx(), [&]() -> awaitable<int> {
      UpstreamCall call(client_side.ctx().get_executor(), pool, t, 1);
      auto e = co_await call.start("GET", "/", {}, "");
      if (e != CallError::kNone) co_return -1;
      std::string out;
      co_await call.read_all(out);
      co_return call.status();
    });
    EXPECT_EQ(status, 200) << "call " << i;
    // The server closed the pooled connection before the next call (what the pool checks on
    // reuse): the next call must see that and connect anew.
    ASSERT_TRUE(testing::wait_until(closed));
  }
}

}  // namespace
}  // namespace kvgate::http
