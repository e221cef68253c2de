// http/write_now: a write (and read_now: a read) that completes without a round trip through the
// event loop when the
// socket takes it whole (nearly always: a proxy's writes are small next to a socket's buffer).
// Asio 1.81 completes even an immediately successful asynchronous write through the scheduler
// (a post, a lock, a resumption); this one system call is all the fast path costs. The socket
// must be in non-blocking mode (set once per connection), so a full buffer is never waited for
// here: the rest goes out asynchronously, with the caller's deadline.
#pragma once

#include <sys/socket.h>

#include <boost/asio/buffer.hpp>
#include <boost/asio/error.hpp>
#include <boost/beast/core/buffers_suffix.hpp>
#include <cerrno>

#include "http/io.h"

namespace kvgate::http {

// Writes what `socket` takes now. Returns the bytes written; `ec` is set only on a failure
// (a full socket buffer is not one: fewer bytes are returned).
template <class Buffers>
size_t write_now(Socket& socket, const Buffers& buffers, boost::system::error_code& ec) {
  size_t n = socket.write_some(buffers, ec);
  if (ec == asio::error::would_block || ec == asio::error::try_again) ec = {};
  return n;
}

// Reads what `socket` has now, never waiting (MSG_DONTWAIT, whatever mode the socket is in).
// Returns the bytes read; nothing there yet is 0 with `ec` unset; end of stream sets eof.
inline size_t read_now(Socket& socket, asio::mutable_buffer space, boost::system::error_code& ec) {
  ssize_t n = ::recv(socket.native_handle(), space.data(), space.size(), MSG_DONTWAIT);
  if (n > 0) return static_cast<size_t>(n);
  if (n == 0) {
    ec = asio::error::eof;
  } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
    ec = boost::system::error_code(errno, boost::system::system_category());
  }
  return 0;
}

// The part of `buffers` after the first `n` bytes (what write_now left for an asynchronous write).
template <class Buffers>
boost::beast::buffers_suffix<Buffers> rest_after(const Buffers& buffers, size_t n) {
  boost::beast::buffers_suffix<Buffers> rest(buffers);
  rest.consume(n);
  return rest;
}

}  // namespace kvgate::http
