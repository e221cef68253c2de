// http/io: the Asio names every network module uses (kept light: no Beast here).
//
// One concrete executor type everywhere: every loop is an io_context run by one thread, so the
// sockets, timers and coroutines name io_context's executor directly instead of Asio's
// type-erased any_io_executor (which costs a small-object copy, a virtual call and a destruction
// for every handler a request's I/O goes through).
#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/basic_socket_acceptor.hpp>
#include <boost/asio/basic_stream_socket.hpp>
#include <boost/asio/basic_waitable_timer.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <chrono>
#include <ctime>

namespace kvgate {
namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;
using Executor = asio::io_context::executor_type;
template <class T = void>
using awaitable = asio::awaitable<T, Executor>;
inline constexpr asio::use_awaitable_t<Executor> use_awaitable{};
using Timer = asio::basic_waitable_timer<Clock, asio::wait_traits<Clock>, Executor>;
using Socket = asio::basic_stream_socket<asio::ip::tcp, Executor>;
using Acceptor = asio::basic_socket_acceptor<asio::ip::tcp, Executor>;

// The steady clock as of its last tick (CLOCK_MONOTONIC_COARSE: the same time base, 1-4 ms
// behind, read without the timestamp counter that makes a precise read cost tens of ns in a VM).
// For timeouts and idle ages, which are seconds long; durations that are reported use Clock::now().
inline Clock::time_point coarse_now() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return Clock::time_point(std::chrono::duration_cast<Clock::duration>(
      std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec)));
}
}  // namespace kvgate
