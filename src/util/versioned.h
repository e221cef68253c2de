// util/versioned: a few figures with the moment they count from and the figures before it,
// written by one thread at a time and read by any (a seqlock over atomics, acquire/release
// only: a reader never pairs one write's figures with another's moment, and never waits on the
// writer's lock).
//
// What kvgate replicas share counts from a moment every replica agrees on (replica::Sync: a
// report's sending + settle); a decision asked for a moment (route-only's ?at=) weighs the
// figures of that moment. Only the last change is kept with its predecessor: asked for a moment
// before the last change, the figures before it are given, right when at most one change came
// since (a decision late by more than a change interval may weigh newer ones).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <thread>

namespace kvgate {

template <size_t N>
class VersionedFigures {
 public:
  using Values = std::array<int64_t, N>;

  // The figures are `v` from `from_us` (unix us) on. Unchanged figures change nothing (the moment
  // of the last change is kept). One writer at a time (the caller's lock).
  void set(const Values& v, int64_t from_us) {
    if (load(value_, std::memory_order_relaxed) == v) return;
    const uint64_t s = seq_.load(std::memory_order_relaxed);
    seq_.store(s + 1, std::memory_order_relaxed);
    // Release stores: none moves before the odd count (a reader that sees one of them sees the
    // count odd or changed), and the even count after them all.
    for (size_t i = 0; i < N; ++i) {
      prev_[i].store(value_[i].load(std::memory_order_relaxed), std::memory_order_release);
      value_[i].store(v[i], std::memory_order_release);
    }
    from_us_.store(from_us, std::memory_order_release);
    seq_.store(s + 2, std::memory_order_release);
  }

  // The figures as of `when_us` (unix us; 0: the latest).
  Values at(int64_t when_us) const {
    for (unsigned tries = 1;; ++tries) {
      // (A writer preempted mid-write: let it run rather than spin a time slice.)
      if (tries % 64 == 0) std::this_thread::yield();
      const uint64_t s1 = seq_.load(std::memory_order_acquire);
      if ((s1 & 1) != 0) continue;  // a write in progress: a few stores, then read again
      // Acquire loads (no fence: ThreadSanitizer does not model fences): the count is read
      // again after them, and a figure of a newer write shows it changed.
      const int64_t from = from_us_.load(std::memory_order_acquire);
      const Values value = load(value_, std::memory_order_acquire);
      const Values prev = load(prev_, std::memory_order_acquire);
      if (seq_.load(std::memory_order_relaxed) != s1) continue;
      return when_us != 0 && when_us < from ? prev : value;
    }
  }

 private:
  static Values load(const std::array<std::atomic<int64_t>, N>& a, std::memory_order order) {
    Values out{};
    for (size_t i = 0; i < N; ++i) out[i] = a[i].load(order);
    return out;
  }

  std::atomic<uint64_t> seq_{0};
  std::array<std::atomic<int64_t>, N> value_{}, prev_{};
  std::atomic<int64_t> from_us_{0};
};

}  // namespace kvgate
