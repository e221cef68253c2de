// util/log: structured one-line logs on stderr ("ts=... level=info msg=... key=value").
// Owns the global log level. Thread-safe: each line is formatted locally and written with one
// write().
#pragma once

#include <sstream>
#include <string>
#include <string_view>

namespace kvgate::log {

enum class Level { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

void set_level(Level level);
Level level();
// Parses "debug", "info", "warn", "error"; returns false on anything else.
bool parse_level(std::string_view text, Level& out);

// A line under construction: log::Line(Level::kInfo, "worker healthy").kv("worker", url);
// The line is written when the object is destroyed.
class Line {
 public:
  Line(Level level, std::string_view msg);
  ~Line();
  Line(const Line&) = delete;
  Line& operator=(const Line&) = delete;

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

}  // namespace kvgate::log
