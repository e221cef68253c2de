// bench/rate: see rate.h.
#include "bench/rate.h"

#include <algorithm>
#include <boost/asio/as_tuple.hpp>

#include "http/client.h"
#include "http/io.h"

namespace kvgate::bench {

RateResult run_rate(const RateOptions& o) {
  RateResult res;
  http::Target target;
  if (std::string e = http::parse_url(o.url, target); !e.empty()) {
    res.fatal = "bad --url: " + e;
    return res;
  }
  if (std::string e = http::resolve(target); !e.empty()) {
    res.fatal = "bad --url: " + e;
    return res;
  }
  asio::io_context ctx(1);
  http::ConnectionPool pool(
      http::ConnectionPool::Options{8192, std::chrono::seconds(30), std::chrono::seconds(5)});
  int in_flight = 0;
  auto one = [&]() -> awaitable<void> {
    ++in_flight;
    static constexpr http::Header kHeaders[] = {{"content-type", "application/json"}};
    auto start = Clock::now();
    http::UpstreamCall call(ctx.get_executor(), pool, target, 1);
    call.set_deadline(start + std::chrono::seconds(10));
    auto err = co_await call.start("POST", o.path, kHeaders, o.body);
    std::string body;
    if (err == http::CallError::kNone) err = co_await call.read_all(body);
    double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
    if (err != http::CallError::kNone || call.status() < 200 || call.status() >= 300) {
      ++res.errors;
    } else {
      res.latency_us.push_back(us);
    }
    --in_flight;
  };
  auto t0 = Clock::now();
  auto pacer = [&]() -> awaitable<void> {
    Timer timer(ctx);
    auto gap = std::chrono::duration<double>(1.0 / o.rate);
    size_t total = static_cast<size_t>(o.rate * o.seconds);
    for (size_t i = 0; i < total; ++i) {
      timer.expires_at(t0 +
                       std::chrono::duration_cast<Clock::duration>(gap * static_cast<double>(i)));
      co_await timer.async_wait(asio::as_tuple(use_awaitable));
      if (in_flight >= o.max_in_flight) {
        ++res.dropped;
        continue;
      }
      ++res.sent;
      asio::co_spawn(ctx, one(), asio::detached);
    }
    // Wait for the last answers, then stop (pooled connections' idle timers must not hold the run).
    while (in_flight > 0) {
      timer.expires_after(std::chrono::milliseconds(1));
      co_await timer.async_wait(asio::as_tuple(use_awaitable));
    }
    ctx.stop();
  };
  asio::co_spawn(ctx, pacer(), asio::detached);
  ctx.run();
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  res.achieved_rate = secs > 0 ? static_cast<double>(res.sent) / secs : 0;
  std::sort(res.latency_us.begin(), res.latency_us.end());
  return res;
}

}  // namespace kvgate::bench
