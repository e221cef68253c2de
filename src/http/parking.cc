// http/parking: see parking.h.
#include "http/parking.h"

#include <sys/epoll.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <system_error>

namespace kvgate::http {
namespace {
int make_epoll() {
  int fd = ::epoll_create1(EPOLL_CLOEXEC);
  if (fd < 0) throw std::system_error(errno, std::generic_category(), "epoll_create1");
  return fd;
}
}  // namespace

ParkingLot::ParkingLot(asio::io_context& ctx, Resume resume, Expired expired)
    : resume_(std::move(resume)),
      expired_(std::move(expired)),
      epfd_(make_epoll()),
      epoll_(ctx.get_executor(), epfd_),
      timer_(ctx.get_executor()) {}

ParkingLot::~ParkingLot() {
  close_all();
}

bool ParkingLot::park(int fd, bool v6, Clock::time_point until) {
  if (closed_) return false;
  auto* e = new Entry{head_.prev, &head_, until, fd, v6};
  epoll_event ev{};
  // Level-triggered: a request that arrived before the descriptor was added is seen at once.
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.ptr = e;
  if (::epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
    delete e;
    return false;
  }
  head_.prev->next = e;
  head_.prev = e;
  ++size_;
  watch();
  arm_timer();
  return true;
}

void ParkingLot::unlink(Entry* e) {
  e->prev->next = e->next;
  e->next->prev = e->prev;
  --size_;
}

void ParkingLot::watch() {
  if (watching_) return;
  watching_ = true;
  epoll_.async_wait(Descriptor::wait_read, [this, alive = std::weak_ptr<char>(alive_),
                                            gen = watch_gen_](const boost::system::error_code& ec) {
    // (A wait of before close_all(), or of a lot that is gone: nothing of it is left to touch.)
    if (alive.expired() || gen != watch_gen_) return;
    watching_ = false;
    if (ec) return;  // (not expected of an epoll descriptor: the next park() waits again)
    resume_ready();
    if (size_ > 0) watch();
  });
}

void ParkingLot::resume_ready() {
  std::array<epoll_event, 64> events{};
  for (;;) {
    int n = ::epoll_wait(epfd_, events.data(), static_cast<int>(events.size()), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    for (int i = 0; i < n; ++i) {
      auto* e = static_cast<Entry*>(events[static_cast<size_t>(i)].data.ptr);
      ::epoll_ctl(epfd_, EPOLL_CTL_DEL, e->fd, nullptr);
      unlink(e);
      int fd = e->fd;
      bool v6 = e->v6;
      delete e;
      resume_(fd, v6);
    }
    if (static_cast<size_t>(n) < events.size()) return;
  }
}

void ParkingLot::arm_timer() {
  if (timing_ || size_ == 0) return;
  timing_ = true;
  timer_.expires_at(head_.next->until);
  timer_.async_wait([this, alive = std::weak_ptr<char>(alive_),
                     gen = timer_gen_](const boost::system::error_code& ec) {
    if (alive.expired() || gen != timer_gen_) return;
    timing_ = false;
    if (ec) return;  // (not expected: the next park() arms it again)
    expire();
    arm_timer();
  });
}

void ParkingLot::expire() {
  // (The precise clock: the timer fired by it, and the coarse one may not have reached `until`.)
  const auto now = Clock::now();
  size_t n = 0;
  while (size_ > 0 && head_.next->until <= now) {
    Entry* e = head_.next;
    unlink(e);
    ::close(e->fd);  // (also leaves the epoll set: the descriptor was its only reference)
    delete e;
    ++n;
  }
  if (n > 0) expired_(n);
}

size_t ParkingLot::close_all() {
  closed_ = true;
  size_t n = 0;
  while (size_ > 0) {
    Entry* e = head_.next;
    unlink(e);
    ::close(e->fd);
    delete e;
    ++n;
  }
  // Nothing left to wait for, so the context may run out of work: the pending wait and timer are
  // cancelled, and their handlers find their generation gone.
  ++watch_gen_;
  ++timer_gen_;
  boost::system::error_code ignored;
  if (watching_) epoll_.cancel(ignored);
  if (timing_) timer_.cancel();
  watching_ = timing_ = false;
  return n;
}

}  // namespace kvgate::http
