// Integration: what a router observes of kvgate-sim's HTTP timing, on a raw socket, as of SGLang
// behind uvicorn: a /generate stream's status and headers arrive before its first token; an OpenAI
// stream's come with its first chunk (SGLang pulls that chunk before answering); an idle
// keep-alive connection is closed after --timeout-keep-alive seconds.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "support/cluster.h"

namespace kvgate::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// One raw TCP connection: what arrived so far, and whether the server closed it.
class Raw {
 public:
  explicit Raw(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  }
  ~Raw() { ::close(fd_); }
  Raw(const Raw&) = delete;
  Raw& operator=(const Raw&) = delete;

  bool connected() const { return connected_; }
  void send(const std::string& s) {
    ASSERT_EQ(::send(fd_, s.data(), s.size(), 0), ssize_t(s.size()));
  }
  // Reads until `done(received)` holds, the server closes, or `timeout` passes.
  void read_until(const std::function<bool(const std::string&)>& done,
                  std::chrono::milliseconds timeout) {
    const auto end = Clock::now() + timeout;
    while (!done(in_) && !closed_) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now());
      if (left <= 0ms) return;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char buf[4096];
      ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) {
        closed_ = true;
      } else {
        in_.append(buf, static_cast<size_t>(n));
      }
    }
  }
  const std::string& received() const { return in_; }
  bool closed() const { return closed_; }

 private:
  int fd_ = -1;
  bool connected_ = false;
  bool closed_ = false;
  std::string in_;
};

std::string post(const std::string& path, const std::string& body) {
  return "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

bool has_head(const std::string& s) {
  return s.find("\r\n\r\n") != std::string::npos;
}

TEST(SimHttp, GenerateStreamHeadersArriveBeforeTheFirstToken) {
  Sim s;
  s.port = free_port();
  s.args = {"--ttft-ms", "3000", "--tpot-ms", "1"};  // first token 3 s after arrival
  s.start();
  Raw r(s.port);
  ASSERT_TRUE(r.connected());
  r.send(
      post("/generate", R"({"text":"hi","sampling_params":{"max_new_tokens":2},"stream":true})"));
  r.read_until(has_head, 10s);
  ASSERT_TRUE(has_head(r.received())) << r.received();
  const std::string head = r.received().substr(0, r.received().find("\r\n\r\n") + 4);
  EXPECT_EQ(head.rfind("HTTP/1.1 200 ", 0), 0u) << head;
  EXPECT_NE(head.find("content-type: text/event-stream"), std::string::npos) << head;
  // The head came alone: the prefill is still running.
  EXPECT_EQ(r.received().find("data:"), std::string::npos) << r.received();
  // Then the tokens, and the end of the stream.
  r.read_until([](const std::string& in) { return in.find("data: [DONE]") != std::string::npos; },
               15s);
  EXPECT_NE(r.received().find("data: [DONE]"), std::string::npos) << r.received();
  EXPECT_NE(r.received().find("\"completion_tokens\":2"), std::string::npos) << r.received();
}

TEST(SimHttp, OpenAiStreamHeadersComeWithTheFirstChunk) {
  Sim s;
  s.port = free_port();
  s.args = {"--ttft-ms", "2500", "--tpot-ms", "1"};
  s.start();
  Raw r(s.port);
  ASSERT_TRUE(r.connected());
  r.send(post("/v1/chat/completions",
              R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":2,"stream":true})"));
  // Nothing during the prefill: SGLang's OpenAI routes answer once the first chunk exists.
  r.read_until([](const std::string& in) { return !in.empty(); }, 1500ms);
  EXPECT_EQ(r.received(), "");
  r.read_until([](const std::string& in) { return in.find("data: ") != std::string::npos; }, 10s);
  EXPECT_EQ(r.received().rfind("HTTP/1.1 200 ", 0), 0u) << r.received();
  EXPECT_NE(r.received().find("\"role\":\"assistant\""), std::string::npos) << r.received();
}

TEST(SimHttp, IdleKeepAliveConnectionIsClosedAfterTheTimeout) {
  Sim s;
  s.port = free_port();
  s.args = {"--instant", "--timeout-keep-alive", "1"};
  s.start();
  Raw r(s.port);
  ASSERT_TRUE(r.connected());
  const auto sent = Clock::now();
  r.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  r.read_until(has_head, 5s);
  ASSERT_EQ(r.received().rfind("HTTP/1.1 200 ", 0), 0u) << r.received();
  EXPECT_EQ(r.received().find("connection: close"), std::string::npos) << "kept alive";
  // Idle from here on: the server closes the connection after about a second.
  r.read_until([](const std::string&) { return false; }, 10s);
  EXPECT_TRUE(r.closed());
  EXPECT_GE(Clock::now() - sent, 900ms);
  // A connection that keeps asking is served on the same connection meanwhile.
  Raw busy(s.port);
  for (int i = 0; i < 3; ++i) {
    busy.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    size_t want = static_cast<size_t>(i + 1);
    busy.read_until(
        [want](const std::string& in) {
          size_t n = 0;
          for (size_t p = 0; (p = in.find("HTTP/1.1 200", p)) != std::string::npos; ++p) ++n;
          return n == want && in.size() >= 4 && in.compare(in.size() - 4, 4, "\r\n\r\n") == 0;
        },
        5s);
    EXPECT_FALSE(busy.closed()) << "request " << i;
  }
}

}  // namespace
}  // namespace kvgate::testing
