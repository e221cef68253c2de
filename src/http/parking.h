// http/parking: idle keep-alive connections held at the least cost. A plain-TCP connection that
// has waited for its next request for a while is taken out of Asio (its socket's reactor state,
// its coroutine frames and its read buffer are freed) and parked here: its descriptor alone, in
// an epoll set of this lot's own, with its idle deadline. When it turns readable (the next
// request, or the client hanging up) it is handed back (Resume) to start a session again; when
// its deadline passes it is closed. What is left of a parked connection is one 32-byte entry
// (bench/README.md, "After issue 13's second session": ~0.6 MB per 1,000 idle connections).
//
// The lot's epoll descriptor is itself watched by the io_context (one readiness wait for all
// parked connections), and one timer serves every deadline: entries are kept in the order they
// were parked, which is the order of their deadlines when every connection has the same idle
// timeout (a later one parked first only closes that much later).
//
// Threads: one, the io_context's. Destroy it there, or once the context has stopped, and before
// the context is destroyed (its timer and descriptor belong to it); the destructor closes what is
// still parked.
#pragma once

#include <boost/asio/posix/basic_stream_descriptor.hpp>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "http/io.h"

namespace kvgate::http {

class ParkingLot {
 public:
  // Called with a parked connection's descriptor once it is readable or hung up (it now belongs
  // to the callee, non-blocking as it was parked). `v6`: its address family, as parked.
  using Resume = std::function<void(int fd, bool v6)>;
  // Called with how many parked connections were just closed because their deadline passed.
  using Expired = std::function<void(size_t n)>;

  // Throws std::system_error when the epoll set cannot be made.
  ParkingLot(asio::io_context& ctx, Resume resume, Expired expired);
  ~ParkingLot();
  ParkingLot(const ParkingLot&) = delete;
  ParkingLot& operator=(const ParkingLot&) = delete;

  // Takes `fd` (a connected, non-blocking socket no reactor watches) until it is readable or
  // `until` passes. False when it cannot be watched, or after close_all() (the descriptor is
  // still the caller's).
  bool park(int fd, bool v6, Clock::time_point until);
  // False once close_all() ran: nothing is parked any more.
  bool open() const { return !closed_; }
  // Hands back (Resume) every parked connection that is readable now, without waiting for the
  // context to notice (shutdown: one whose request has arrived is answered, not reset).
  void resume_ready();
  // Closes every parked connection now and refuses any later one (shutdown); returns how many.
  size_t close_all();
  size_t size() const { return size_; }

 private:
  struct Entry {
    Entry* prev;
    Entry* next;
    Clock::time_point until;
    int fd;
    bool v6;
  };
  using Descriptor = asio::posix::basic_stream_descriptor<Executor>;

  void unlink(Entry* e);
  void watch();      // waits for the epoll set to be readable (once at a time)
  void arm_timer();  // for the oldest entry's deadline (once at a time)
  void expire();     // closes those whose deadline passed

  Resume resume_;
  Expired expired_;
  Entry head_{&head_, &head_, {}, -1, false};  // sentinel: oldest after it
  size_t size_ = 0;
  int epfd_ = -1;
  Descriptor epoll_;  // owns epfd_
  Timer timer_;
  bool watching_ = false;
  bool timing_ = false;
  bool closed_ = false;
  // Bumped by close_all(): a wait or timer of before it is ignored when it completes.
  uint64_t watch_gen_ = 0;
  uint64_t timer_gen_ = 0;
  // Handlers hold it weakly: one already queued when the lot goes finds it expired.
  std::shared_ptr<char> alive_ = std::make_shared<char>();
};

}  // namespace kvgate::http
