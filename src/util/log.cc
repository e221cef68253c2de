// util/log: see log.h. The sink: callers append whole lines to `pending_` under `mu_`; the writer
// thread swaps `pending_` for its own empty buffer and writes the batch with the lock released.
#include "util/log.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <mutex>
#include <new>
#include <system_error>
#include <thread>
#include <utility>

namespace kvgate::log {
namespace {
std::atomic<int> g_level{static_cast<int>(Level::kInfo)};

// How long exit() and std::terminate wait for the queue to drain.
constexpr std::chrono::seconds kExitGrace{3};

const char* level_name(Level l) {
  switch (l) {
    case Level::kDebug:
      return "debug";
    case Level::kInfo:
      return "info";
    case Level::kWarn:
      return "warn";
    case Level::kError:
      return "error";
  }
  return "info";
}

bool needs_quotes(std::string_view v) {
  if (v.empty()) return true;
  for (char c : v) {
    if (c == ' ' || c == '"' || c == '=' || c == '\\' || static_cast<unsigned char>(c) < 0x20) {
      return true;
    }
  }
  return false;
}

void append_value(std::string& out, std::string_view v) {
  if (!needs_quotes(v)) {
    out.append(v);
    return;
  }
  out.push_back('"');
  for (char c : v) {
    switch (c) {
      case '"':
        out.append("\\\"");
        break;
      case '\\':
        out.append("\\\\");
        break;
      case '\n':
        out.append("\\n");
        break;
      case '\r':
        out.append("\\r");
        break;
      case '\t':
        out.append("\\t");
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out.append("?");
        } else {
          out.push_back(c);
        }
    }
  }
  out.push_back('"');
}

// "ts=... level=... msg=..." for a line that starts now.
void append_header(std::string& out, Level l, std::string_view msg) {
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char ts[80];
  std::snprintf(ts, sizeof ts, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms));
  out.append("ts=").append(ts).append(" level=").append(level_name(l)).append(" msg=");
  append_value(out, msg);
}

// Writes all of `data` to fd, waiting as long as the fd needs (this is the writer thread's job).
// Returns how many lines were not written because the write failed.
std::uint64_t write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n >= 0) {
      data.remove_prefix(static_cast<std::size_t>(n));
      continue;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {  // someone made the fd non-blocking
      pollfd p{.fd = fd, .events = POLLOUT, .revents = 0};
      ::poll(&p, 1, -1);
      continue;
    }
    return static_cast<std::uint64_t>(std::count(data.begin(), data.end(), '\n'));
  }
  return 0;
}

class Sink {
 public:
  // Never destroyed: threads may log during and after static destruction.
  static Sink& instance() {
    static Sink* sink = new Sink();
    return *sink;
  }

  // Queues `line` (which ends with '\n') or drops it when the queue is full.
  void submit(const std::string& line) {
    std::unique_lock lock(mu_);
    if (state_ == State::kIdle) start_locked();
    if (state_ == State::kDirect) {
      int fd = fd_;
      lock.unlock();
      if (std::uint64_t lost = write_all(fd, line))
        dropped_.fetch_add(lost, std::memory_order_relaxed);
      return;
    }
    if (pending_.size() + line.size() > capacity_) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      // The report is one more thing to write; flush() waits for it too.
      if (unreported_drops_++ > 0) return;
      ++queued_;
    } else {
      pending_.append(line);
      ++queued_;
      if (pending_.size() > line.size()) return;  // the writer was woken for the first line
    }
    lock.unlock();
    wake_.notify_one();
  }

  void flush() {
    std::unique_lock lock(mu_);
    if (state_ != State::kQueued || std::this_thread::get_id() == writer_id_) return;
    std::uint64_t target = queued_;
    written_cv_.wait(lock, [&] { return written_ >= target; });
  }

  // Waits up to `limit` for what is queued now to be written; false on time-out.
  bool flush_for(std::chrono::nanoseconds limit) {
    std::unique_lock lock(mu_);
    if (state_ != State::kQueued || std::this_thread::get_id() == writer_id_) return true;
    std::uint64_t target = queued_;
    return written_cv_.wait_for(lock, limit, [&] { return written_ >= target; });
  }

  std::uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }

  int set_fd(int fd) {
    flush();
    std::lock_guard lock(mu_);
    return std::exchange(fd_, fd);
  }

  std::size_t set_capacity(std::size_t bytes) {
    std::lock_guard lock(mu_);
    return std::exchange(capacity_, bytes);
  }

  // At exit(): let the writer write what is queued (lines logged meanwhile included) and stop;
  // later lines, from static destructors or threads still running, are written directly. A
  // writer stuck in write() for longer than kExitGrace is left behind: lines keep queueing (and
  // dropping once the queue is full), so nothing else blocks, and exit ends the thread.
  void shut_down() {
    std::unique_lock lock(mu_);
    if (state_ != State::kQueued) {
      state_ = State::kDirect;
      return;
    }
    stop_ = true;
    lock.unlock();
    wake_.notify_one();
    lock.lock();
    bool stopped = written_cv_.wait_for(lock, kExitGrace, [&] { return state_ == State::kDirect; });
    lock.unlock();
    if (stopped) {
      writer_.join();
    } else {
      writer_.detach();
    }
  }

 private:
  enum class State {
    kIdle,    // nothing logged yet: no writer thread
    kQueued,  // lines go through the queue to the writer thread
    kDirect,  // the writer stopped at exit, or could not start: callers write their own lines
  };

  void start_locked() {
    try {
      writer_ = std::thread([this] { run(); });
    } catch (const std::system_error&) {
      state_ = State::kDirect;
      return;
    }
    writer_id_ = writer_.get_id();
    state_ = State::kQueued;
    std::atexit([] { instance().shut_down(); });
    previous_terminate_ = std::set_terminate([] {
      Sink& s = instance();
      s.flush_for(kExitGrace);
      std::terminate_handler previous = nullptr;
      {
        std::lock_guard lock(s.mu_);
        previous = s.previous_terminate_;
      }
      if (previous != nullptr) previous();
      std::abort();
    });
  }

  void run() {
    std::string batch;
    std::unique_lock lock(mu_);
    for (;;) {
      wake_.wait(lock, [&] { return !pending_.empty() || unreported_drops_ > 0 || stop_; });
      if (pending_.empty() && unreported_drops_ == 0) break;  // stopping, and all written
      batch.swap(pending_);  // both keep their capacity: no allocation once warm
      std::uint64_t drops = std::exchange(unreported_drops_, 0);
      std::uint64_t upto = queued_;
      int fd = fd_;
      lock.unlock();
      if (drops > 0) {
        append_header(batch, Level::kWarn, "log lines dropped: the log queue was full");
        batch.append(" dropped=").append(std::to_string(drops)).push_back('\n');
      }
      if (std::uint64_t lost = write_all(fd, batch))
        dropped_.fetch_add(lost, std::memory_order_relaxed);
      batch.clear();
      lock.lock();
      written_ = upto;
      written_cv_.notify_all();
    }
    state_ = State::kDirect;  // in the same critical section that found the queue empty
    written_cv_.notify_all();
  }

  std::mutex mu_;
  std::condition_variable wake_;        // the writer: lines, a drop report, or stop
  std::condition_variable written_cv_;  // `written_` moved, or the writer stopped
  State state_ = State::kIdle;
  int fd_ = STDERR_FILENO;
  std::size_t capacity_ = kQueueBytes;
  std::string pending_;
  std::uint64_t queued_ = 0;   // lines and drop reports handed to the writer, ever
  std::uint64_t written_ = 0;  // of those, how many it has written
  std::uint64_t unreported_drops_ = 0;
  bool stop_ = false;
  std::thread writer_;
  std::thread::id writer_id_;
  std::terminate_handler previous_terminate_ = nullptr;
  std::atomic<std::uint64_t> dropped_{0};
};
}  // namespace

void set_level(Level l) {
  g_level.store(static_cast<int>(l), std::memory_order_relaxed);
}
Level level() {
  return static_cast<Level>(g_level.load(std::memory_order_relaxed));
}

bool parse_level(std::string_view text, Level& out) {
  if (text == "debug")
    out = Level::kDebug;
  else if (text == "info")
    out = Level::kInfo;
  else if (text == "warn" || text == "warning")
    out = Level::kWarn;
  else if (text == "error")
    out = Level::kError;
  else
    return false;
  return true;
}

std::uint64_t dropped_lines() {
  return Sink::instance().dropped();
}

void flush() {
  Sink::instance().flush();
}

int set_fd_for_testing(int fd) {
  return Sink::instance().set_fd(fd);
}

std::size_t set_queue_bytes_for_testing(std::size_t bytes) {
  return Sink::instance().set_capacity(bytes);
}

bool RateLimit::admit(std::uint64_t& suppressed) {
  // The coarse clock is read in the vDSO without a system call; its few milliseconds of
  // resolution are plenty for windows of seconds.
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return admit_at(static_cast<std::int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1'000'000, suppressed);
}

bool RateLimit::admit_at(std::int64_t now_ms, std::uint64_t& suppressed) {
  suppressed = 0;
  std::int64_t start = window_start_ms_.load(std::memory_order_relaxed);
  if (now_ms - start >= per_ms_ &&
      window_start_ms_.compare_exchange_strong(start, now_ms, std::memory_order_relaxed)) {
    // This call opens a new window and is its first line. Calls that raced in between count
    // toward the old window.
    std::uint64_t calls = calls_.exchange(1, std::memory_order_relaxed);
    suppressed = calls > lines_ ? calls - lines_ : 0;
    return true;
  }
  return calls_.fetch_add(1, std::memory_order_relaxed) < lines_;
}

Line::Line(Level l, std::string_view msg)
    : enabled_(static_cast<int>(l) >= g_level.load(std::memory_order_relaxed)) {
  if (enabled_) begin(l, msg);
}

Line::Line(Level l, std::string_view msg, RateLimit& limit)
    : enabled_(static_cast<int>(l) >= g_level.load(std::memory_order_relaxed)) {
  if (!enabled_) return;  // a disabled level does not count against the limit
  std::uint64_t suppressed = 0;
  enabled_ = limit.admit(suppressed);
  if (!enabled_) return;
  begin(l, msg);
  if (suppressed > 0) kv("suppressed", suppressed);
}

void Line::begin(Level l, std::string_view msg) {
  buf_.reserve(160);
  append_header(buf_, l, msg);
}

void Line::append(std::string_view key, std::string_view value) {
  buf_.push_back(' ');
  buf_.append(key);
  buf_.push_back('=');
  append_value(buf_, value);
}

Line::~Line() {
  if (!enabled_) return;
  try {
    buf_.push_back('\n');
    Sink::instance().submit(buf_);
  } catch (const std::bad_alloc&) {
    // Out of memory: the line is lost.
  }
}

}  // namespace kvgate::log
