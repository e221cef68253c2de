// Tests for util/versioned: the figures of a moment, and a reader racing a writer never pairing
// one write's figures with another's moment (run under TSan too).
#include "util/versioned.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

namespace kvgate {
namespace {

TEST(VersionedFigures, GivesTheFiguresOfTheMomentAsked) {
  VersionedFigures<2> f;
  EXPECT_EQ(f.at(0), (std::array<int64_t, 2>{0, 0}));
  f.set({3, 40}, 1000);
  EXPECT_EQ(f.at(0), (std::array<int64_t, 2>{3, 40}));     // the latest
  EXPECT_EQ(f.at(999), (std::array<int64_t, 2>{0, 0}));    // before the change: the figures before
  EXPECT_EQ(f.at(1000), (std::array<int64_t, 2>{3, 40}));  // from its moment on
  f.set({5, 40}, 2000);
  EXPECT_EQ(f.at(1500), (std::array<int64_t, 2>{3, 40}));
  EXPECT_EQ(f.at(2500), (std::array<int64_t, 2>{5, 40}));
  // The same figures again change nothing: the last change keeps its moment.
  f.set({5, 40}, 3000);
  EXPECT_EQ(f.at(2500), (std::array<int64_t, 2>{5, 40}));
  EXPECT_EQ(f.at(1500), (std::array<int64_t, 2>{3, 40}));
}

TEST(VersionedFigures, AReaderNeverSeesOneWritesFiguresWithAnothersMoment) {
  VersionedFigures<2> f;
  std::atomic<bool> done{false};
  std::atomic<int64_t> torn{0}, reads{0};
  std::thread reader([&] {
    while (!done.load(std::memory_order_relaxed)) {
      // Write i is {i, -i} from moment 10 * i: asked for moment 10 * i - 1 the figures before it,
      // {i - 1, 1 - i}; any mix of two writes breaks one of the two relations.
      const auto now = f.at(0);
      if (now[1] != -now[0]) ++torn;
      const int64_t i = now[0];
      if (i > 0) {
        const auto before = f.at(10 * i - 1);
        if (before[1] != -before[0]) ++torn;
      }
      ++reads;
    }
  });
  while (reads.load() == 0) std::this_thread::yield();  // the reader runs
  for (int64_t i = 1; i <= 200000; ++i) f.set({i, -i}, 10 * i);
  done = true;
  reader.join();
  EXPECT_EQ(torn.load(), 0);
}

}  // namespace
}  // namespace kvgate
