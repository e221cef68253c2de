// Tests for util/log: the line format, the asynchronous sink (order, whole lines across threads,
// drops instead of blocking, flush, exit) and the rate limits.
#include "util/log.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace kvgate {
namespace {

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// Points the log at a pipe for the duration of a test; finish() returns what was written.
// With read_now == false nobody reads the pipe until finish(), so the writer blocks once the pipe
// is full.
class Capture {
 public:
  explicit Capture(bool read_now = true) {
    if (::pipe2(fds_, O_CLOEXEC) != 0) std::abort();
    old_fd_ = log::set_fd_for_testing(fds_[1]);
    if (read_now) start_reading();
  }
  ~Capture() {
    if (fds_[1] >= 0) finish();
  }
  Capture(const Capture&) = delete;
  Capture& operator=(const Capture&) = delete;

  int write_end() const { return fds_[1]; }

  std::string finish() {
    if (!reader_.joinable()) start_reading();
    log::flush();
    log::set_fd_for_testing(old_fd_);
    ::close(fds_[1]);
    fds_[1] = -1;
    reader_.join();
    ::close(fds_[0]);
    return out_;
  }

 private:
  void start_reading() {
    reader_ = std::thread([this] {
      char buf[65536];
      for (;;) {
        ssize_t n = ::read(fds_[0], buf, sizeof buf);
        if (n > 0) {
          out_.append(buf, static_cast<std::size_t>(n));
        } else if (n == 0 || errno != EINTR) {
          return;
        }
      }
    });
  }

  int fds_[2] = {-1, -1};
  int old_fd_ = -1;
  std::thread reader_;
  std::string out_;
};

TEST(Log, LinesArriveWholeAndInOrderInTheUsualFormat) {
  Capture cap;
  constexpr int kLines = 2000;
  for (int i = 0; i < kLines; ++i) {
    log::info("step done").kv("i", i).kv("note", "two words").kv("path", "/v1/x");
  }
  auto lines = split_lines(cap.finish());
  ASSERT_EQ(lines.size(), static_cast<std::size_t>(kLines));
  const std::regex format(
      R"(ts=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z level=info msg="step done" i=(\d+) )"
      R"(note="two words" path=/v1/x)");
  for (int i = 0; i < kLines; ++i) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(lines[i], m, format)) << lines[i];
    EXPECT_EQ(m[1].str(), std::to_string(i));
  }
}

TEST(Log, DisabledLevelsWriteNothingAndConvertToFalse) {
  Capture cap;
  log::set_level(log::Level::kWarn);
  bool evaluated = false;
  if (auto l = log::info("hidden")) {
    evaluated = true;
    l.kv("k", 1);
  }
  EXPECT_FALSE(evaluated);
  EXPECT_TRUE(static_cast<bool>(log::warn("shown").kv("k", 1)));
  log::set_level(log::Level::kInfo);
  auto lines = split_lines(cap.finish());
  ASSERT_EQ(lines.size(), 1U);
  EXPECT_NE(lines[0].find("level=warn msg=shown k=1"), std::string::npos) << lines[0];
}

TEST(Log, LinesFromManyThreadsNeverInterleave) {
  Capture cap;
  constexpr int kThreads = 8;
  constexpr int kPerThread = 1500;
  std::uint64_t dropped_before = log::dropped_lines();
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t] {
      // Long enough that a torn write would show: 300 copies of this thread's letter.
      std::string pad(300, static_cast<char>('a' + t));
      for (int i = 0; i < kPerThread; ++i) log::info("busy").kv("t", t).kv("i", i).kv("pad", pad);
    });
  }
  for (auto& th : threads) th.join();
  auto lines = split_lines(cap.finish());
  // A slow reader may let the queue fill: every line is then either written whole or counted.
  std::uint64_t dropped = log::dropped_lines() - dropped_before;
  const std::regex format(R"(ts=\S+ level=info msg=busy t=(\d) i=(\d+) pad=([a-h]+))");
  std::vector<int> last(kThreads, -1);
  std::size_t busy = 0;
  for (const auto& line : lines) {
    if (line.find("msg=\"log lines dropped") != std::string::npos) continue;
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, format)) << line;
    int t = std::stoi(m[1].str());
    int i = std::stoi(m[2].str());
    EXPECT_EQ(m[3].str(), std::string(300, static_cast<char>('a' + t)));
    EXPECT_GT(i, last[t]) << "thread " << t << " out of order";
    last[t] = i;
    ++busy;
  }
  EXPECT_EQ(busy + dropped, static_cast<std::size_t>(kThreads * kPerThread));
}

TEST(Log, FlushReturnsOnceQueuedLinesAreWritten) {
  int fds[2];
  ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
  ASSERT_EQ(::fcntl(fds[0], F_SETFL, O_NONBLOCK), 0);
  int old_fd = log::set_fd_for_testing(fds[1]);
  for (int i = 0; i < 10; ++i) log::info("queued").kv("i", i);
  log::flush();
  // Everything is in the pipe now (10 short lines fit in its buffer): no reader needed.
  std::string got;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) {
    got.append(buf, static_cast<std::size_t>(n));
  }
  log::set_fd_for_testing(old_fd);
  ::close(fds[0]);
  ::close(fds[1]);
  auto lines = split_lines(got);
  ASSERT_EQ(lines.size(), 10U);
  EXPECT_NE(lines[9].find("msg=queued i=9"), std::string::npos) << lines[9];
  log::flush();  // nothing queued: returns at once
}

TEST(Log, AFullQueueDropsAndCountsInsteadOfBlocking) {
  // Nobody reads the pipe until finish(): the writer blocks in write() once the pipe is full,
  // the 4 KiB queue fills behind it, and later lines must be dropped, not waited for.
  Capture cap(/*read_now=*/false);
  std::size_t old_bytes = log::set_queue_bytes_for_testing(4096);
  std::uint64_t dropped_before = log::dropped_lines();
  // More than the pipe's buffer, the batch in the writer's hands and the queue together.
  int pipe_bytes = ::fcntl(cap.write_end(), F_GETPIPE_SZ);
  ASSERT_GT(pipe_bytes, 0);
  std::string pad(100, 'x');
  int lines_logged = 0;
  while (lines_logged * 100 < 4 * (pipe_bytes + 2 * 4096)) {
    log::warn("flood").kv("i", lines_logged).kv("pad", pad);
    ++lines_logged;
  }
  std::uint64_t dropped = log::dropped_lines() - dropped_before;
  EXPECT_GT(dropped, 0U);
  std::string out = cap.finish();
  log::set_queue_bytes_for_testing(old_bytes);

  // Each line was written or dropped, and the writer said how many were dropped.
  std::size_t written = 0;
  std::uint64_t reported = 0;
  const std::regex report(
      R"(ts=\S+ level=warn msg="log lines dropped: the log queue was full" dropped=(\d+))");
  for (const auto& line : split_lines(out)) {
    std::smatch m;
    if (std::regex_match(line, m, report)) {
      reported += std::stoull(m[1].str());
    } else {
      ASSERT_NE(line.find("msg=flood i="), std::string::npos) << line;
      ++written;
    }
  }
  EXPECT_EQ(written + dropped, static_cast<std::size_t>(lines_logged));
  EXPECT_EQ(reported, dropped);
}

TEST(Log, QueuedLinesAreWrittenWhenTheProcessExits) {
  // A fresh process (re-executed, not forked: the writer thread is not fork-safe) logs to a file
  // and calls exit() right away; the exit handler writes what is still queued. The re-executed
  // child runs this body again: it finds the file's name in the environment.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  constexpr const char* kPathVar = "KVGATE_LOG_EXIT_TEST_FILE";
  std::string path;
  if (const char* inherited = std::getenv(kPathVar)) {
    path = inherited;
  } else {
    path = (std::filesystem::temp_directory_path() /
            ("kvgate_log_exit_" + std::to_string(::getpid()) + ".log"))
               .string();
    ::setenv(kPathVar, path.c_str(), 1);
    std::filesystem::remove(path);
  }
  constexpr int kLines = 5000;
  EXPECT_EXIT(
      {
        // Registered before the first line, so it runs after the log's own exit handler: its
        // line is written directly, the writer having stopped.
        std::atexit([] { log::info("logged after the writer stopped"); });
        int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) std::_Exit(2);
        log::set_fd_for_testing(fd);
        for (int i = 0; i < kLines; ++i) log::info("before exit").kv("i", i);
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "");
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::filesystem::remove(path);
  ::unsetenv(kPathVar);
  auto lines = split_lines(text.str());
  ASSERT_EQ(lines.size(), static_cast<std::size_t>(kLines + 1));
  EXPECT_NE(lines[kLines - 1].find("i=" + std::to_string(kLines - 1)), std::string::npos);
  EXPECT_NE(lines.back().find("msg=\"logged after the writer stopped\""), std::string::npos);
}

TEST(Log, ExitDoesNotHangWhenTheOutputIsStuck) {
  // The child points the log at a pipe nobody reads and queues more than the pipe holds: the
  // writer blocks in write() for good, and exit() must still finish (after its grace period).
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        int fds[2];
        if (::pipe(fds) != 0) std::_Exit(2);
        log::set_fd_for_testing(fds[1]);
        std::string pad(1000, 'x');
        for (int i = 0; i < 1000; ++i) log::info("stuck").kv("pad", pad);
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(LogRateLimit, LetsLinesThroughPerWindowAndCountsTheRest) {
  log::RateLimit limit(3, std::chrono::seconds(1));
  std::uint64_t suppressed = 99;
  int admitted = 0;
  for (int i = 0; i < 10; ++i) {
    if (limit.admit_at(5000, suppressed)) {
      ++admitted;
      EXPECT_EQ(suppressed, 0U);
    }
  }
  EXPECT_EQ(admitted, 3);
  EXPECT_FALSE(limit.admit_at(5999, suppressed));
  // The next window's first line reports the 8 held back.
  EXPECT_TRUE(limit.admit_at(6000, suppressed));
  EXPECT_EQ(suppressed, 8U);
  EXPECT_TRUE(limit.admit_at(6001, suppressed));
  EXPECT_EQ(suppressed, 0U);
  // A window that held nothing back reports nothing.
  EXPECT_TRUE(limit.admit_at(9000, suppressed));
  EXPECT_EQ(suppressed, 0U);
}

TEST(LogRateLimit, ConcurrentCallersAreCountedExactlyWithinAWindow) {
  log::RateLimit limit(100, std::chrono::seconds(1));
  std::uint64_t suppressed = 0;
  ASSERT_TRUE(limit.admit_at(0, suppressed));  // opens the window
  constexpr int kThreads = 8;
  constexpr int kCalls = 10000;
  std::atomic<int> admitted{0};
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      std::uint64_t s = 0;
      for (int i = 0; i < kCalls; ++i) {
        if (limit.admit_at(500, s)) admitted.fetch_add(1);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(admitted.load(), 99);
  ASSERT_TRUE(limit.admit_at(1000, suppressed));
  EXPECT_EQ(suppressed, static_cast<std::uint64_t>(kThreads * kCalls - 99));
}

TEST(LogRateLimit, TheNextLineSaysHowManyWereSuppressed) {
  Capture cap;
  // One line per millisecond: call until a second line gets through, which takes one tick of the
  // coarse clock; every call in between is held back and counted.
  log::RateLimit limit(1, std::chrono::milliseconds(1));
  int calls = 0;
  int emitted = 0;
  while (emitted < 2) {
    ++calls;
    if (auto l = log::warn(limit, "upstream flapping")) {
      ++emitted;
      l.kv("call", calls);
    }
  }
  auto lines = split_lines(cap.finish());
  ASSERT_EQ(lines.size(), 2U);
  EXPECT_NE(lines[0].find("level=warn msg=\"upstream flapping\" call=1"), std::string::npos)
      << lines[0];
  std::string second = "msg=\"upstream flapping\" ";
  if (calls > 2) second += "suppressed=" + std::to_string(calls - 2) + " ";
  second += "call=" + std::to_string(calls);
  EXPECT_NE(lines[1].find(second), std::string::npos) << lines[1];
}

TEST(LogRateLimit, LinesBelowTheLevelDoNotCount) {
  Capture cap;
  log::RateLimit limit(2, std::chrono::hours(1));
  log::set_level(log::Level::kError);
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(static_cast<bool>(log::warn(limit, "quiet")));
  log::set_level(log::Level::kInfo);
  log::warn(limit, "loud").kv("n", 1);
  log::warn(limit, "loud").kv("n", 2);
  log::warn(limit, "loud").kv("n", 3);  // held back: the limit is 2 per hour
  auto lines = split_lines(cap.finish());
  ASSERT_EQ(lines.size(), 2U);
  EXPECT_NE(lines[0].find("msg=loud n=1"), std::string::npos) << lines[0];
  EXPECT_NE(lines[1].find("msg=loud n=2"), std::string::npos) << lines[1];
}

}  // namespace
}  // namespace kvgate
