// Tests for gateway/admission: slots, FIFO hand-over, queue full, queue timeout.
#include "gateway/admission.h"

#include <gtest/gtest.h>

#include <boost/asio/as_tuple.hpp>

namespace kvgate {
namespace {

using namespace std::chrono_literals;
using R = Admission::Result;

TEST(Admission, DisabledAdmitsEverything) {
  Admission a(-1, 0, 1000ms);
  EXPECT_FALSE(a.enabled());
  asio::io_context ctx;
  R got = R::kTimeout;
  asio::co_spawn(
      ctx, [&]() -> awaitable<void> { got = co_await a.acquire(ctx.get_executor()); },
      asio::detached);
  ctx.run();
  EXPECT_EQ(got, R::kAdmitted);
}

TEST(Admission, QueueThenHandOverThenFull) {
  Admission a(1, 1, 5000ms);
  asio::io_context ctx;
  std::vector<R> results(3, R::kTimeout);
  std::vector<int> order;
  auto ex = ctx.get_executor();
  asio::co_spawn(
      ctx,
      [&]() -> awaitable<void> {
        results[0] = co_await a.acquire(ex);
        order.push_back(0);
        asio::steady_timer t(ex, 20ms);
        co_await t.async_wait(asio::as_tuple(asio::use_awaitable));
        a.release();
      },
      asio::detached);
  asio::co_spawn(
      ctx,
      [&]() -> awaitable<void> {
        results[1] = co_await a.acquire(ex);  // waits in the queue
        order.push_back(1);
        a.release();
      },
      asio::detached);
  asio::co_spawn(
      ctx,
      [&]() -> awaitable<void> {
        results[2] = co_await a.acquire(ex);  // queue (size 1) already holds one
        order.push_back(2);
      },
      asio::detached);
  ctx.run();
  EXPECT_EQ(results[0], R::kAdmitted);
  EXPECT_EQ(results[1], R::kAdmitted);
  EXPECT_EQ(results[2], R::kQueueFull);
  EXPECT_EQ(order, (std::vector<int>{0, 2, 1}));
  EXPECT_EQ(a.active(), 0);
}

TEST(Admission, QueueTimeout) {
  Admission a(1, 10, 30ms);
  asio::io_context ctx;
  R second = R::kAdmitted;
  auto ex = ctx.get_executor();
  asio::co_spawn(
      ctx,
      [&]() -> awaitable<void> {
        co_await a.acquire(ex);
        asio::steady_timer t(ex, 200ms);
        co_await t.async_wait(asio::as_tuple(asio::use_awaitable));
        a.release();
      },
      asio::detached);
  asio::co_spawn(
      ctx, [&]() -> awaitable<void> { second = co_await a.acquire(ex); }, asio::detached);
  ctx.run();
  EXPECT_EQ(second, R::kTimeout);
  EXPECT_EQ(a.queued(), 0u);
  EXPECT_EQ(a.active(), 0);
}

}  // namespace
}  // namespace kvgate
