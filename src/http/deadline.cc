// http/deadline: see deadline.h.
#include "http/deadline.h"

namespace kvgate::http {

struct Deadline::State {
  State(const Executor& ex, Socket& s, Deadline::Action a) : timer(ex), socket(&s), action(a) {}
  Timer timer;
  Socket* socket;  // null once the owner is gone
  Deadline::Action action;
  Clock::time_point deadline = Clock::time_point::max();
  Clock::time_point armed = Clock::time_point::max();  // when the pending wait fires
  uint64_t generation = 0;
  bool expired = false;
};

namespace {

void arm(const std::shared_ptr<Deadline::State>& s, Clock::time_point at) {
  s->armed = at;
  uint64_t gen = ++s->generation;
  s->timer.expires_at(at);
  s->timer.async_wait([s, gen](const boost::system::error_code& ec) {
    if (ec || !s->socket || gen != s->generation) return;
    s->armed = Clock::time_point::max();
    if (s->deadline == Clock::time_point::max()) return;
    if (Clock::now() >= s->deadline) {
      s->expired = true;
      boost::system::error_code ignored;
      if (s->action == Deadline::Action::kClose) {
        s->socket->close(ignored);
      } else {
        s->socket->cancel(ignored);
      }
      return;
    }
    arm(s, s->deadline);
  });
}

}  // namespace

Deadline::Deadline(const Executor& ex, Socket& socket, Action action)
    : state_(std::make_shared<State>(ex, socket, action)) {}

Deadline::~Deadline() {
  state_->socket = nullptr;
  if (state_->armed != Clock::time_point::max()) state_->timer.cancel();
}

void Deadline::expires_at(Clock::time_point t) {
  state_->deadline = t;
  state_->expired = false;
  // Only an earlier deadline than the pending wait needs the timer moved.
  if (t < state_->armed) arm(state_, t);
}

bool Deadline::expired() const {
  return state_->expired;
}

}  // namespace kvgate::http
