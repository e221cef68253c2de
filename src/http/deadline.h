// http/deadline: closes a socket when a movable deadline passes. Moving the deadline later costs
// no timer operation (the timer fires at the old time, sees the new deadline and re-arms once), so
// a connection can refresh its deadline on every read and write for free. Beast's tcp_stream arms
// and cancels a timer per operation instead, which showed up as a timerfd_settime per I/O.
#pragma once

#include <memory>

#include "http/io.h"

namespace kvgate::http {

class Deadline {
 public:
  Deadline(const asio::any_io_executor& ex, asio::ip::tcp::socket& socket);
  ~Deadline();
  Deadline(const Deadline&) = delete;
  Deadline& operator=(const Deadline&) = delete;

  void expires_at(Clock::time_point t);
  void expires_after(Clock::duration d) { expires_at(Clock::now() + d); }
  void never() { expires_at(Clock::time_point::max()); }
  // True once the deadline passed and the socket was closed because of it.
  bool expired() const;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace kvgate::http
