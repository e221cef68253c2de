// util/log: see log.h.
#include "util/log.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <ctime>

namespace kvgate::log {
namespace {
std::atomic<int> g_level{static_cast<int>(Level::kInfo)};

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

Line::Line(Level l, std::string_view msg)
    : enabled_(static_cast<int>(l) >= g_level.load(std::memory_order_relaxed)) {
  if (!enabled_) return;
  buf_.reserve(160);
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char ts[80];
  std::snprintf(ts, sizeof ts, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms));
  buf_.append("ts=").append(ts).append(" level=").append(level_name(l)).append(" msg=");
  append_value(buf_, msg);
}

void Line::append(std::string_view key, std::string_view value) {
  buf_.push_back(' ');
  buf_.append(key);
  buf_.push_back('=');
  append_value(buf_, value);
}

Line::~Line() {
  if (!enabled_) return;
  buf_.push_back('\n');
  ssize_t ignored = ::write(STDERR_FILENO, buf_.data(), buf_.size());
  (void)ignored;
}

}  // namespace kvgate::log
