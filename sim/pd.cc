// sim/pd: see pd.h.
#include "sim/pd.h"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/write.hpp>
#include <charconv>
#include <sstream>

#include "util/log.h"

namespace kvgate::sim {
namespace {

using asio::ip::tcp;
constexpr auto kTuple = asio::as_tuple(asio::use_awaitable);
constexpr size_t kMaxLine = 256;
constexpr size_t kMaxRetained = 100000;

bool parse_u64(std::string_view s, uint64_t& out) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size() && !s.empty();
}

bool parse_i64(std::string_view s, int64_t& out) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size() && !s.empty();
}

// Splits "A B C rest..." into its first `n` words and the remainder.
std::vector<std::string_view> words(std::string_view line, size_t n, std::string_view& rest) {
  std::vector<std::string_view> out;
  while (out.size() < n) {
    size_t sp = line.find(' ');
    out.push_back(line.substr(0, sp));
    if (sp == std::string_view::npos) {
      line = {};
      break;
    }
    line.remove_prefix(sp + 1);
  }
  rest = line;
  return out;
}

awaitable<void> write_and_close(std::shared_ptr<tcp::socket> s, std::string line) {
  co_await asio::async_write(*s, asio::buffer(line), kTuple);
  boost::system::error_code ec;
  s->shutdown(tcp::socket::shutdown_both, ec);
  s->close(ec);
}

}  // namespace

struct BootstrapServer::Waiter {
  std::shared_ptr<tcp::socket> socket;
  bool answered = false;
};

BootstrapServer::BootstrapServer(std::chrono::seconds retention) : retention_(retention) {}

std::unique_ptr<BootstrapServer> BootstrapServer::start(const std::string& host, uint16_t port,
                                                        std::chrono::seconds retention,
                                                        std::string& error) {
  std::unique_ptr<BootstrapServer> s(new BootstrapServer(retention));
  boost::system::error_code ec;
  auto addr = asio::ip::make_address(host == "localhost" ? "127.0.0.1" : host, ec);
  if (ec) {
    error =
        "--disaggregation-bootstrap-port: cannot listen on host '" + host + "': " + ec.message();
    return nullptr;
  }
  tcp::endpoint ep(addr, port);
  s->acceptor_ = std::make_unique<tcp::acceptor>(s->ctx_);
  s->acceptor_->open(ep.protocol(), ec);
  if (!ec) s->acceptor_->set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) s->acceptor_->bind(ep, ec);
  if (!ec) s->acceptor_->listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    error = "--disaggregation-bootstrap-port: cannot listen on " + host + ":" +
            std::to_string(port) + ": " + ec.message();
    return nullptr;
  }
  s->port_ = s->acceptor_->local_endpoint().port();
  asio::co_spawn(s->ctx_, s->accept_loop(), asio::detached);
  s->thread_ = std::thread([srv = s.get()] {
    auto guard = asio::make_work_guard(srv->ctx_);
    srv->ctx_.run();
  });
  return s;
}

BootstrapServer::~BootstrapServer() {
  ctx_.stop();
  if (thread_.joinable()) thread_.join();
  // Pending handlers and coroutine frames are destroyed with the context, before the acceptor.
}

awaitable<void> BootstrapServer::accept_loop() {
  for (;;) {
    auto [ec, socket] = co_await acceptor_->async_accept(kTuple);
    if (ec) {
      if (ec == asio::error::operation_aborted) co_return;
      continue;
    }
    asio::co_spawn(ctx_, session(std::move(socket)), asio::detached);
  }
}

awaitable<void> BootstrapServer::session(tcp::socket socket) {
  auto s = std::make_shared<tcp::socket>(std::move(socket));
  std::string buf;
  auto [ec, n] =
      co_await asio::async_read_until(*s, asio::dynamic_buffer(buf, kMaxLine), '\n', kTuple);
  if (ec) co_return;
  std::string_view line(buf.data(), n - 1);
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  std::string_view rest;
  auto w = words(line, 2, rest);
  uint64_t room = 0;
  if (w.size() == 1 && w[0] == "PING") {
    co_await write_and_close(s, "PONG kvgate-sim prefill\n");
    co_return;
  }
  if (w.size() != 2 || w[0] != "WAIT" || !parse_u64(w[1], room)) {
    co_await write_and_close(s, "ERROR expected WAIT <room>\n");
    co_return;
  }
  if (auto it = done_.find(room); it != done_.end()) {
    std::string reply = std::move(it->second);
    done_.erase(it);
    co_await write_and_close(s, std::move(reply));
    co_return;
  }
  auto waiter = std::make_shared<Waiter>();
  waiter->socket = s;
  waiters_[room].push_back(waiter);
  // Wait until the room is answered (deliver closes the socket) or the decode side hangs up.
  char byte = 0;
  co_await s->async_read_some(asio::buffer(&byte, 1), kTuple);
  if (!waiter->answered) {
    auto& list = waiters_[room];
    std::erase(list, waiter);
    if (list.empty()) waiters_.erase(room);
  }
}

void BootstrapServer::deliver(uint64_t room, const std::string& line) {
  auto it = waiters_.find(room);
  if (it != waiters_.end()) {
    for (auto& w : it->second) {
      w->answered = true;
      asio::co_spawn(ctx_, write_and_close(w->socket, line), asio::detached);
    }
    waiters_.erase(it);
    return;
  }
  // Nobody asked yet: keep the answer for a while.
  const auto now = Clock::now();
  while (!done_order_.empty() &&
         (done_order_.front().first < now || done_order_.size() >= kMaxRetained)) {
    done_.erase(done_order_.front().second);
    done_order_.pop_front();
  }
  done_[room] = line;
  done_order_.emplace_back(now + retention_, room);
}

void BootstrapServer::room_ready(uint64_t room, RoomInfo info) {
  std::string line = "READY " + std::to_string(room) + " " + std::to_string(info.prompt_tokens) +
                     " " + std::to_string(info.cached_tokens) + "\n";
  asio::post(ctx_, [this, room, line = std::move(line)] { deliver(room, line); });
}

void BootstrapServer::room_failed(uint64_t room, std::string reason) {
  for (char& c : reason) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  std::string line = "FAILED " + std::to_string(room) + " " + reason + "\n";
  asio::post(ctx_, [this, room, line = std::move(line)] { deliver(room, line); });
}

namespace {

awaitable<RoomWait> ask(std::string host, uint16_t port, uint64_t room,
                        std::shared_ptr<tcp::socket> s) {
  RoomWait out;
  const std::string where = host + ":" + std::to_string(port);
  auto ex = co_await asio::this_coro::executor;
  tcp::resolver resolver(ex);
  auto [rec, endpoints] = co_await resolver.async_resolve(host, std::to_string(port), kTuple);
  if (rec) {
    out.error = "cannot resolve the prefill bootstrap host " + where + ": " + rec.message();
    co_return out;
  }
  auto [cec, ep] = co_await asio::async_connect(*s, endpoints, kTuple);
  if (cec) {
    out.error = "cannot reach the prefill bootstrap server at " + where + ": " + cec.message() +
                " (is a --disaggregation-mode prefill server listening there?)";
    co_return out;
  }
  std::string request = "WAIT " + std::to_string(room) + "\n";
  auto [ec, n] = co_await asio::async_write(*s, asio::buffer(request), kTuple);
  std::string buf;
  if (!ec) {
    std::tie(ec, n) =
        co_await asio::async_read_until(*s, asio::dynamic_buffer(buf, kMaxLine), '\n', kTuple);
  }
  if (ec) {
    out.error = "the prefill bootstrap server at " + where +
                " closed the rendezvous of bootstrap_room " + std::to_string(room) + " (" +
                ec.message() + ")";
    co_return out;
  }
  std::string_view line(buf.data(), n - 1);
  std::string_view rest;
  auto w = words(line, 4, rest);
  uint64_t got = 0;
  if (w.size() == 4 && w[0] == "READY" && parse_u64(w[1], got) && got == room &&
      parse_i64(w[2], out.info.prompt_tokens) && parse_i64(w[3], out.info.cached_tokens)) {
    out.ok = true;
    co_return out;
  }
  w = words(line, 2, rest);
  if (w.size() == 2 && w[0] == "FAILED") {
    out.error = "the prefill server at " + where + " aborted bootstrap_room " +
                std::to_string(room) + ": " + std::string(rest);
    co_return out;
  }
  out.error = "unexpected answer from the prefill bootstrap server at " + where + ": '" +
              std::string(line) + "'";
  co_return out;
}

}  // namespace

awaitable<RoomWait> wait_for_room(std::string host, uint16_t port, uint64_t room,
                                  std::chrono::milliseconds timeout,
                                  std::shared_ptr<asio::steady_timer> cancel) {
  using namespace asio::experimental::awaitable_operators;
  auto ex = co_await asio::this_coro::executor;
  auto socket = std::make_shared<tcp::socket>(ex);
  asio::steady_timer deadline(ex, timeout);
  if (!cancel) cancel = std::make_shared<asio::steady_timer>(ex, Clock::time_point::max());
  auto result = co_await (ask(host, port, room, socket) || deadline.async_wait(kTuple) ||
                          cancel->async_wait(kTuple));
  boost::system::error_code ignored;
  socket->close(ignored);
  if (result.index() == 0) co_return std::get<0>(result);
  RoomWait out;
  if (result.index() == 1) {
    std::ostringstream secs;
    secs << std::chrono::duration<double>(timeout).count();
    out.error = "the prefill of bootstrap_room " + std::to_string(room) + " never arrived from " +
                host + ":" + std::to_string(port) + " within " + secs.str() +
                " s (wrong room, or its prefill request was never sent or failed)";
  } else {
    out.error = "cancelled: the client went away";
  }
  co_return out;
}

}  // namespace kvgate::sim
