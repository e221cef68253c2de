// http/io: the Asio names every network module uses (kept light: no Beast here).
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace kvgate {
namespace asio = boost::asio;
using asio::awaitable;
using Clock = std::chrono::steady_clock;
}  // namespace kvgate
