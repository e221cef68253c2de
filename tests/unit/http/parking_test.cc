// Tests for http::ParkingLot: a parked descriptor comes back when readable or hung up, is closed
// when its deadline passes or at close_all(), and the lot cleans up after itself.
#include "http/parking.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <vector>

namespace kvgate::http {
namespace {

using namespace std::chrono_literals;

struct Pair {
  int parked = -1;  // the end given to the lot
  int peer = -1;    // the client's end
  Pair() {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds), 0);
    parked = fds[0];
    peer = fds[1];
  }
  ~Pair() {
    if (peer >= 0) ::close(peer);
  }
};

bool closed(int fd) {
  return ::fcntl(fd, F_GETFD) == -1 && errno == EBADF;
}

// Runs the context until `done` or 5 s.
template <class F>
bool run_until(asio::io_context& ctx, F done) {
  auto limit = Clock::now() + 5s;
  while (!done() && Clock::now() < limit) {
    ctx.restart();
    ctx.run_for(10ms);
  }
  return done();
}

TEST(ParkingLot, ReadableConnectionIsHandedBack) {
  asio::io_context ctx;
  std::vector<int> resumed;
  size_t expired = 0;
  ParkingLot lot(
      ctx, [&](int fd, bool) { resumed.push_back(fd); }, [&](size_t n) { expired += n; });
  Pair a, b;
  ASSERT_TRUE(lot.park(a.parked, false, Clock::now() + 60s));
  ASSERT_TRUE(lot.park(b.parked, true, Clock::now() + 60s));
  EXPECT_EQ(lot.size(), 2u);
  ctx.run_for(20ms);
  EXPECT_TRUE(resumed.empty());  // nothing to read yet
  ASSERT_EQ(::write(b.peer, "GET", 3), 3);
  ASSERT_TRUE(run_until(ctx, [&] { return resumed.size() == 1; }));
  EXPECT_EQ(resumed[0], b.parked);
  EXPECT_EQ(lot.size(), 1u);
  char buf[8];
  EXPECT_EQ(::read(b.parked, buf, sizeof buf), 3);  // the bytes are still there, for the session
  ::close(b.parked);
  // A hang-up is handed back too (the session reads the end and closes).
  ::close(a.peer);
  a.peer = -1;
  ASSERT_TRUE(run_until(ctx, [&] { return resumed.size() == 2; }));
  EXPECT_EQ(resumed[1], a.parked);
  EXPECT_EQ(lot.size(), 0u);
  EXPECT_EQ(expired, 0u);
  ::close(a.parked);
}

TEST(ParkingLot, BytesThatArrivedBeforeParkingAreSeen) {
  asio::io_context ctx;
  int resumed = -1;
  ParkingLot lot(
      ctx, [&](int fd, bool) { resumed = fd; }, [](size_t) {});
  Pair a;
  ASSERT_EQ(::write(a.peer, "x", 1), 1);
  ASSERT_TRUE(lot.park(a.parked, false, Clock::now() + 60s));
  ASSERT_TRUE(run_until(ctx, [&] { return resumed == a.parked; }));
  ::close(a.parked);
}

TEST(ParkingLot, DeadlineClosesThoseDueOnly) {
  asio::io_context ctx;
  size_t expired = 0;
  int resumed = 0;
  ParkingLot lot(
      ctx, [&](int, bool) { ++resumed; }, [&](size_t n) { expired += n; });
  Pair a, b, c;
  ASSERT_TRUE(lot.park(a.parked, false, Clock::now() + 20ms));
  ASSERT_TRUE(lot.park(b.parked, false, Clock::now() + 40ms));
  ASSERT_TRUE(lot.park(c.parked, false, Clock::now() + 60s));
  ASSERT_TRUE(run_until(ctx, [&] { return expired == 2; }));
  EXPECT_TRUE(closed(a.parked));
  EXPECT_TRUE(closed(b.parked));
  EXPECT_FALSE(closed(c.parked));
  char ch;
  EXPECT_EQ(::read(a.peer, &ch, 1), 0);  // the client sees the close
  EXPECT_EQ(lot.size(), 1u);
  EXPECT_EQ(resumed, 0);
  EXPECT_EQ(lot.close_all(), 1u);
}

TEST(ParkingLot, ResumeReadyHandsBackAtOnceAndCloseAllLeavesNoWork) {
  asio::io_context ctx;
  std::vector<int> resumed;
  ParkingLot lot(
      ctx, [&](int fd, bool) { resumed.push_back(fd); }, [](size_t) {});
  Pair a, b;
  ASSERT_TRUE(lot.park(a.parked, false, Clock::now() + 60s));
  ASSERT_TRUE(lot.park(b.parked, false, Clock::now() + 60s));
  ASSERT_EQ(::write(a.peer, "GET", 3), 3);
  lot.resume_ready();  // without running the context (shutdown does this)
  ASSERT_EQ(resumed.size(), 1u);
  EXPECT_EQ(resumed[0], a.parked);
  ::close(a.parked);
  EXPECT_EQ(lot.close_all(), 1u);
  EXPECT_TRUE(closed(b.parked));
  // Its wait and timer are cancelled: the context runs out of work (no guard here).
  for (int i = 0; i < 100 && !ctx.stopped(); ++i) ctx.poll();
  EXPECT_TRUE(ctx.stopped());
  EXPECT_EQ(resumed.size(), 1u);
  // Closed for good: a later connection is refused (still the caller's), and no handler of
  // before runs into anything.
  Pair d;
  EXPECT_FALSE(lot.open());
  EXPECT_FALSE(lot.park(d.parked, false, Clock::now() + 60s));
  EXPECT_FALSE(closed(d.parked));
  ctx.restart();
  ctx.run_for(20ms);
  EXPECT_EQ(resumed.size(), 1u);
  ::close(d.parked);
}

TEST(ParkingLot, CloseAllAndDestructionCloseWhatIsParked) {
  asio::io_context ctx;
  Pair a, b, c;
  {
    ParkingLot lot(
        ctx, [](int, bool) {}, [](size_t) {});
    ASSERT_TRUE(lot.park(a.parked, false, Clock::now() + 60s));
    ASSERT_TRUE(lot.park(b.parked, false, Clock::now() + 60s));
    EXPECT_EQ(lot.close_all(), 2u);
    EXPECT_TRUE(closed(a.parked));
    EXPECT_TRUE(closed(b.parked));
  }
  {
    ParkingLot lot(
        ctx, [](int, bool) {}, [](size_t) {});
    ASSERT_TRUE(lot.park(c.parked, false, Clock::now() + 60s));
    ctx.restart();
    ctx.run_for(5ms);  // a wait and a timer in flight
  }
  EXPECT_TRUE(closed(c.parked));
  // The lot's handlers, cancelled by its destruction, run without touching it.
  ctx.restart();
  ctx.run_for(20ms);
}

TEST(ParkingLot, ADescriptorItCannotWatchStaysTheCallers) {
  asio::io_context ctx;
  ParkingLot lot(
      ctx, [](int, bool) {}, [](size_t) {});
  int fd = ::open("/proc/self/exe", O_RDONLY);  // epoll refuses regular files
  ASSERT_GE(fd, 0);
  EXPECT_FALSE(lot.park(fd, false, Clock::now() + 60s));
  EXPECT_EQ(lot.size(), 0u);
  EXPECT_FALSE(closed(fd));
  ::close(fd);
}

}  // namespace
}  // namespace kvgate::http
