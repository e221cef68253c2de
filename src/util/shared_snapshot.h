// util/shared_snapshot: an immutable value behind a shared_ptr that one thread replaces while any
// number of threads take copies of it (the worker set, a policy's hash ring). A copy keeps the
// value it got alive for as long as it is held, whatever is published meanwhile.
//
// Why not std::atomic<std::shared_ptr<T>>: in GCC 12's libstdc++ it is a spin lock whose load()
// releases the lock with memory_order_relaxed, so a reader's read of the stored pointer is not
// ordered before the next store()'s write of it. That is a data race in the C++ memory model
// (ThreadSanitizer reports it; on weakly ordered CPUs a reader could pair the new pointer with
// the old reference count). It is no faster than a mutex either: neither is lock-free, and both
// hold the lock only for a reference-count increment. Here the lock is a std::mutex, which every
// tool understands, and the old value is released after the lock is.
#pragma once

#include <memory>
#include <mutex>
#include <utility>

namespace kvgate {

template <class T>
class SharedSnapshot {
 public:
  explicit SharedSnapshot(std::shared_ptr<T> value) : value_(std::move(value)) {}
  SharedSnapshot(const SharedSnapshot&) = delete;
  SharedSnapshot& operator=(const SharedSnapshot&) = delete;

  std::shared_ptr<T> load() const {
    std::lock_guard lock(mu_);
    return value_;
  }
  void store(std::shared_ptr<T> value) {
    {
      std::lock_guard lock(mu_);
      value_.swap(value);
    }
    // `value` now holds the previous snapshot: its last owner, if that is us, frees it here,
    // outside the lock.
  }

 private:
  mutable std::mutex mu_;
  std::shared_ptr<T> value_;
};

}  // namespace kvgate
