// util/log: structured one-line logs ("ts=... level=info msg=... key=value") on fd 2 (stderr, or
// the file --log-dir points it at). Owns the global log level, the asynchronous sink that writes
// the lines, and the per-call-site rate limits.
//
// Logging never waits for I/O. The calling thread formats its line and appends it, under a short
// mutex, to a queue bounded in bytes (kQueueBytes); one writer thread drains the queue to fd 2.
// When the queue is full the line is dropped, never waited for: dropped_lines() counts it and the
// writer reports "log lines dropped" with the count in a line of its own. The writer thread starts
// with the first line queued, so a process that never logs has no extra thread and nothing needs
// to be called first. flush() waits for what was queued before it. At exit() (main returning) and
// in std::terminate the queue is written out, waiting a few seconds at most so that a stuck stderr
// cannot hang the exit; once the writer has stopped, later lines (static destructors) are written
// by their callers, as they are if no thread can be started. _exit() and fatal signals lose what
// is still queued.
//
// Why not spdlog's async logger: Debian 12 packages spdlog 1.10 (plus libfmt). Its async queue,
// when full, either blocks the caller (the default policy) or overwrites the oldest queued line
// (losing the start of an incident, not its repetition); dropping the new line came only in a
// later release. Its drop counter lives in a details:: class, its flush() posts a request and
// returns before anything is written, its queue is bounded in messages rather than bytes, and it
// has no rate limit. Our logfmt lines would bypass its formatter, so it would bring two libraries
// for a queue and a thread: about 150 lines here, with exactly the semantics above.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <string_view>

namespace kvgate::log {

enum class Level { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

void set_level(Level level);
Level level();
// Parses "debug", "info", "warn", "error"; returns false on anything else.
bool parse_level(std::string_view text, Level& out);

// Bytes of formatted lines the queue holds while the writer is behind; past that lines are dropped.
// The batch the writer has in hand is apart from it: the log holds twice this at most.
inline constexpr std::size_t kQueueBytes = std::size_t{4} << 20;

// Lines dropped since the process started because the queue was full (or the write failed).
// Monotonic: export it as a counter.
std::uint64_t dropped_lines();

// Waits until every line queued before the call has been written (or failed to write). Returns at
// once when nothing is queued. Not for signal handlers.
void flush();

// Test hooks. set_fd_for_testing flushes, then sends later lines to fd (pass the returned value
// back to restore). set_queue_bytes_for_testing changes the queue bound. Both return the old value.
int set_fd_for_testing(int fd);
std::size_t set_queue_bytes_for_testing(std::size_t bytes);

// Lets a repeated warning through at most `lines` times per `per` at one call site; the next line
// let through carries suppressed=K, the calls held back since the previous one. Declare one static
// per call site (constant-initialized, no guard):
//
//   static log::RateLimit limit(5, std::chrono::seconds(10));
//   if (auto l = log::warn(limit, "load report malformed")) l.kv("worker", url).kv("error", e);
//
// The `if` form skips evaluating the kv arguments when the line is held back; a plain
// log::warn(limit, "...").kv(...) works too. A held-back call costs the level check, a coarse
// monotonic clock read (vDSO, no system call), one atomic load and one relaxed fetch_add (the
// count). At the edge of a window a few concurrent callers may get through beyond `lines`.
class RateLimit {
 public:
  constexpr RateLimit(std::uint32_t lines, std::chrono::milliseconds per)
      : lines_(lines == 0 ? 1 : lines), per_ms_(per.count()) {}
  RateLimit(const RateLimit&) = delete;
  RateLimit& operator=(const RateLimit&) = delete;

  // True when a line may be written now; `suppressed` is set to the calls held back since the last
  // line let through (non-zero only on the first line of a window).
  bool admit(std::uint64_t& suppressed);
  // The same at a given time in milliseconds of a monotonic clock (tests).
  bool admit_at(std::int64_t now_ms, std::uint64_t& suppressed);

 private:
  const std::uint64_t lines_;
  const std::int64_t per_ms_;
  // Start of the current window; "long ago" so that the first call opens one.
  std::atomic<std::int64_t> window_start_ms_{INT64_MIN / 2};
  // Calls in the current window, let through or not.
  std::atomic<std::uint64_t> calls_{0};
};

// A line under construction: log::Line(Level::kInfo, "worker healthy").kv("worker", url);
// The line is queued for writing when the object is destroyed. A line is disabled when its level
// is below the global level or its rate limit held it back; then kv() does nothing and the line
// converts to false.
class Line {
 public:
  Line(Level level, std::string_view msg);
  Line(Level level, std::string_view msg, RateLimit& limit);
  ~Line();
  Line(const Line&) = delete;
  Line& operator=(const Line&) = delete;

  explicit operator bool() const { return enabled_; }

  template <typename T>
  Line& kv(std::string_view key, const T& value) {
    if (enabled_) {
      std::ostringstream os;
      os << value;
      append(key, os.str());
    }
    return *this;
  }
  Line& kv(std::string_view key, std::string_view value) {
    if (enabled_) append(key, value);
    return *this;
  }
  Line& kv(std::string_view key, const char* value) { return kv(key, std::string_view(value)); }
  Line& kv(std::string_view key, const std::string& value) {
    return kv(key, std::string_view(value));
  }

 private:
  void begin(Level level, std::string_view msg);
  void append(std::string_view key, std::string_view value);
  bool enabled_;
  std::string buf_;
};

inline Line debug(std::string_view msg) {
  return Line(Level::kDebug, msg);
}
inline Line info(std::string_view msg) {
  return Line(Level::kInfo, msg);
}
inline Line warn(std::string_view msg) {
  return Line(Level::kWarn, msg);
}
inline Line error(std::string_view msg) {
  return Line(Level::kError, msg);
}

// Rate-limited forms (see RateLimit).
inline Line info(RateLimit& limit, std::string_view msg) {
  return Line(Level::kInfo, msg, limit);
}
inline Line warn(RateLimit& limit, std::string_view msg) {
  return Line(Level::kWarn, msg, limit);
}
inline Line error(RateLimit& limit, std::string_view msg) {
  return Line(Level::kError, msg, limit);
}

}  // namespace kvgate::log
