// Integration (faults): 10,000 concurrent keep-alive client connections held by the real kvgate
// binary with bounded memory (idle connections hold no read buffer), reported as MB per 1,000
// connections, and the gateway still serving while it holds them.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <iostream>

#include "support/cluster.h"

namespace kvgate::testing {
namespace {

using namespace std::chrono_literals;

constexpr int kConnections = 10000;

// The memory bound is a property of the real build. Under ThreadSanitizer (make check-tsan)
// kvgate's resident memory includes TSan's shadow of every byte it touches, several times that
// byte; under AddressSanitizer (make test) its quarantine keeps the read buffers idle connections
// give back resident. There only the holding and the serving are checked.
// GCC defines __SANITIZE_*__; clang 14 (the ASan build) only answers __has_feature.
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define KVGATE_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
#define KVGATE_TEST_SANITIZED 1
#endif
#endif
#ifdef KVGATE_TEST_SANITIZED
constexpr bool kCheckMemory = false;
#else
constexpr bool kCheckMemory = true;
#endif

int connect_to(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

// One keep-alive request on `fd`; true when a whole 200 answer came back.
bool liveness(int fd) {
  static constexpr std::string_view kReq = "GET /liveness HTTP/1.1\r\nHost: x\r\n\r\n";
  if (::send(fd, kReq.data(), kReq.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(kReq.size())) {
    return false;
  }
  std::string in;
  char buf[1024];
  for (;;) {
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return false;
    in.append(buf, static_cast<size_t>(n));
    auto head = in.find("\r\n\r\n");
    if (head == std::string::npos) continue;
    auto cl = in.find("content-length: ");
    if (cl == std::string::npos) return false;
    size_t len = std::stoul(in.substr(cl + 16));
    if (in.size() >= head + 4 + len) return in.starts_with("HTTP/1.1 200");
  }
}

TEST(Connections, TenThousandKeepAliveConnectionsHeldWithBoundedMemory) {
  rlimit rl{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &rl), 0);
  rl.rlim_cur = rl.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &rl);
  ASSERT_GE(rl.rlim_cur, static_cast<rlim_t>(kConnections + 1024))
      << "the open-file limit (" << rl.rlim_cur << ") is too low for this test: raise it";
  Cluster c(1, {"--ttft-ms", "1", "--tpot-ms", "1"},
            {"--policy", "round_robin", "--max-connections", std::to_string(kConnections + 100),
             "--client-keepalive-timeout-secs", "600", "--health-check-interval-secs", "60"});
  HttpClient probe(c.port());
  ASSERT_EQ(probe.get("/liveness").status, 200);
  long rss_before = c.gateway().rss_kib();

  std::vector<int> fds;
  fds.reserve(kConnections);
  int failed = 0;
  for (int i = 0; i < kConnections; ++i) {
    int fd = connect_to(c.port());
    if (fd < 0 || !liveness(fd)) {
      ++failed;
      if (fd >= 0) ::close(fd);
      continue;
    }
    fds.push_back(fd);
  }
  EXPECT_EQ(failed, 0);
  ASSERT_TRUE(wait_until([&] { return c.metric("kvgate_connections") >= kConnections; }));
  // A connection idle for a second is parked (only its descriptor kept), and the allocator
  // returns freed pages within its decay time (10 s): wait for both.
  EXPECT_TRUE(
      wait_until([&] { return c.metric("kvgate_connections_parked") >= kConnections; }, 30s))
      << c.metric("kvgate_connections_parked") << " parked";
  auto mb_per_1000 = [&] {
    return static_cast<double>(c.gateway().rss_kib() - rss_before) / 1024.0 /
           (static_cast<double>(kConnections) / 1000.0);
  };
  // (It settles at ~0.7 here within the wait, two request threads; nginx: ~0.55 in
  // scripts/bench-memory. The bound leaves room for a slower machine's allocator.)
  bool settled = !kCheckMemory || wait_until([&] { return mb_per_1000() < 1.5; }, 30s);
  double per_1000 = mb_per_1000();
  std::cout << "kvgate holding " << fds.size() << " idle keep-alive connections: RSS "
            << rss_before / 1024 << " MB -> " << c.gateway().rss_kib() / 1024 << " MB, " << per_1000
            << " MB per 1,000 connections\n";
  // What one parked connection costs: an entry in its thread's parking lot.
  EXPECT_TRUE(settled) << per_1000 << " MB per 1,000 idle connections";

  // Still serving real traffic while holding them; held (parked) connections still work.
  auto r =
      probe.post("/generate", R"({"text":"still serving","sampling_params":{"max_new_tokens":2}})");
  EXPECT_EQ(r.status, 200);
  int reused = 0;
  for (size_t i = 0; i < fds.size(); i += 97) reused += liveness(fds[i]) ? 1 : 0;
  EXPECT_EQ(reused, static_cast<int>((fds.size() + 96) / 97));

  for (int fd : fds) ::close(fd);
  EXPECT_TRUE(wait_until([&] { return c.metric("kvgate_connections") <= 1; }, 20s));
}

}  // namespace
}  // namespace kvgate::testing
