// http/deadline: ends a socket's pending I/O when a movable deadline passes. Moving the deadline
// later costs no timer operation (the timer fires at the old time, sees the new deadline and
// re-arms once), so a connection can refresh or disarm its deadline around every read and write
// for free. Beast's tcp_stream arms and cancels a timer per operation instead, which showed up as
// a timerfd_settime per I/O.
#pragma once

#include <memory>

#include "http/io.h"

namespace kvgate::http {

class Deadline {
 public:
  // What happens when the deadline passes: the socket is closed (upstream calls: every later
  // operation fails too), or only its pending operations are cancelled (the server, which may
  // still answer 408 on the same connection).
  enum class Action { kClose, kCancel };

  Deadline(const Executor& ex, Socket& socket, Action action = Action::kClose);
  ~Deadline();
  Deadline(const Deadline&) = delete;
  Deadline& operator=(const Deadline&) = delete;

  void expires_at(Clock::time_point t);
  void expires_after(Clock::duration d) { expires_at(coarse_now() + d); }  // timeouts: coarse
  void never() { expires_at(Clock::time_point::max()); }
  // True once the deadline passed and the socket was closed or cancelled because of it (until
  // the deadline is set again).
  bool expired() const;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace kvgate::http
