// gateway/admission: see admission.h.
#include "gateway/admission.h"

#include <algorithm>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/post.hpp>

namespace kvgate {

Admission::Admission(int64_t max_concurrent, size_t queue_size,
                     std::chrono::milliseconds queue_timeout)
    : max_(max_concurrent), queue_size_(queue_size), timeout_(queue_timeout) {}

awaitable<Admission::Result> Admission::acquire(
    Executor ex,  // NOLINT(performance-unnecessary-value-param)
    std::shared_ptr<Waiter>* handle) {
  if (!enabled()) co_return Result::kAdmitted;
  std::shared_ptr<Waiter> w;
  {
    std::lock_guard lock(mu_);
    if (active_ < max_) {
      ++active_;
      co_return Result::kAdmitted;
    }
    if (waiters_.size() >= queue_size_) co_return Result::kQueueFull;
    w = std::make_shared<Waiter>(ex);
    w->timer.expires_after(timeout_);
    waiters_.push_back(w);
  }
  if (handle) *handle = w;
  // If this coroutine is destroyed while queued (its event loop destroyed at shutdown), it leaves
  // the queue, and a slot already handed to it is passed on: no waiter outlives its loop, and no
  // slot is lost.
  struct Leave {
    Admission* a;
    std::shared_ptr<Waiter>& w;
    bool armed = true;
    ~Leave() {
      if (!armed) return;
      bool granted = false;
      {
        std::lock_guard lock(a->mu_);
        granted = w->granted;
        auto it = std::find(a->waiters_.begin(), a->waiters_.end(), w);
        if (it != a->waiters_.end()) a->waiters_.erase(it);
      }
      if (granted) a->release();
    }
  } leave{this, w};
  co_await w->timer.async_wait(asio::as_tuple(use_awaitable));
  leave.armed = false;
  if (handle) handle->reset();
  std::lock_guard lock(mu_);
  if (w->granted) co_return Result::kAdmitted;
  if (w->cancelled) co_return Result::kCancelled;
  auto it = std::find(waiters_.begin(), waiters_.end(), w);
  if (it != waiters_.end()) waiters_.erase(it);
  co_return Result::kTimeout;
}

void Admission::cancel(const std::shared_ptr<Waiter>& w) {
  {
    std::lock_guard lock(mu_);
    if (w->granted || w->cancelled) return;
    w->cancelled = true;
    auto it = std::find(waiters_.begin(), waiters_.end(), w);
    if (it != waiters_.end()) waiters_.erase(it);
  }
  w->timer.cancel();
}

void Admission::release() {
  if (!enabled()) return;
  std::shared_ptr<Waiter> next;
  {
    std::lock_guard lock(mu_);
    if (waiters_.empty()) {
      --active_;
      return;
    }
    next = std::move(waiters_.front());
    waiters_.pop_front();
    next->granted = true;  // the slot passes to the waiter; active_ is unchanged
  }
  asio::post(next->executor, [next] { next->timer.cancel(); });
}

int64_t Admission::active() const {
  std::lock_guard lock(mu_);
  return active_;
}

size_t Admission::queued() const {
  std::lock_guard lock(mu_);
  return waiters_.size();
}

}  // namespace kvgate
