// Tests for gateway/admission: slots, FIFO hand-over, queue full, queue timeout.
#include "gateway/admission.h"

#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio/as_tuple.hpp>
#include <thread>
#include <vector>

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
        Timer t(ex, 20ms);
        co_await t.async_wait(asio::as_tuple(use_awaitable));
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
        Timer t(ex, 200ms);
        co_await t.async_wait(asio::as_tuple(use_awaitable));
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

// As in kvgate: each request thread runs its own io_context, and a slot freed on one thread is
// handed to a waiter of another (posted to its executor); some waiters are cancelled by their
// own thread (client gone) while queued. make check-tsan watches the hand-overs. No slot is lost
// and the limit holds throughout.
TEST(Admission, SlotsHandedOverAcrossRequestThreads) {
  Admission a(2, 1000, 5000ms);
  constexpr int kThreads = 3, kPerThread = 40;
  std::atomic<int> holding{0}, most{0}, admitted{0}, cancelled{0}, other{0};
  std::vector<std::unique_ptr<asio::io_context>> contexts;
  for (int k = 0; k < kThreads; ++k) contexts.push_back(std::make_unique<asio::io_context>(1));
  for (auto& ctx : contexts) {
    auto ex = ctx->get_executor();
    for (int i = 0; i < kPerThread; ++i) {
      asio::co_spawn(
          *ctx,
          [&, ex, i]() -> awaitable<void> {
            std::shared_ptr<Admission::Waiter> handle;
            if (i % 4 == 3) {
              // A client that goes away 2 ms in: cancelled if still queued by then.
              asio::co_spawn(
                  ex,
                  [&a, &handle, ex]() -> awaitable<void> {
                    Timer t(ex, 2ms);
                    co_await t.async_wait(asio::as_tuple(use_awaitable));
                    if (handle) a.cancel(handle);
                  },
                  asio::detached);
            }
            R r = co_await a.acquire(ex, &handle);
            if (r == R::kCancelled) {
              cancelled.fetch_add(1);
              co_return;
            }
            if (r != R::kAdmitted) {
              other.fetch_add(1);
              co_return;
            }
            admitted.fetch_add(1);
            int now = holding.fetch_add(1) + 1;
            int seen = most.load();
            while (now > seen && !most.compare_exchange_weak(seen, now)) {
            }
            Timer t(ex, 1ms);
            co_await t.async_wait(asio::as_tuple(use_awaitable));
            holding.fetch_sub(1);
            a.release();
          },
          asio::detached);
    }
  }
  std::vector<std::thread> threads;
  for (auto& ctx : contexts) threads.emplace_back([c = ctx.get()] { c->run(); });
  for (auto& t : threads) t.join();
  EXPECT_EQ(admitted.load() + cancelled.load(), kThreads * kPerThread);
  EXPECT_EQ(other.load(), 0);
  EXPECT_LE(most.load(), 2);
  EXPECT_EQ(a.active(), 0);
  EXPECT_EQ(a.queued(), 0u);
}

}  // namespace
}  // namespace kvgate
