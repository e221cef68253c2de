// Unit tests: gateway/gateway_metrics's LabelLimiter (bounded label values, cached per thread).
#include "gateway/gateway_metrics.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>

namespace kvgate {
namespace {

TEST(LabelLimiter, AdmitsUpToItsLimitThenSaysOther) {
  LabelLimiter limiter(2);
  EXPECT_EQ(limiter.admit("a"), "a");
  EXPECT_EQ(limiter.admit("b"), "b");
  EXPECT_EQ(limiter.admit("c"), "other");
  EXPECT_EQ(limiter.admit("a"), "a");  // seen before the limit: still itself
  EXPECT_EQ(limiter.admit("c"), "other");
}

TEST(LabelLimiter, ReturnsItsOwnCopyThatOutlivesTheRequest) {
  LabelLimiter limiter(4);
  std::string_view first;
  {
    std::string body_model = "qwen3";
    first = limiter.admit(body_model);
    EXPECT_NE(first.data(), body_model.data());
    body_model.assign("xxxxx");  // the request's text changes: the label does not
  }
  EXPECT_EQ(first, "qwen3");
  EXPECT_EQ(limiter.admit(std::string("qwen3")).data(), first.data());  // the cached copy
}

TEST(LabelLimiter, EachLimiterCountsItsOwnValuesWhateverThisThreadCached) {
  auto full = std::make_unique<LabelLimiter>(1);
  EXPECT_EQ(full->admit("x"), "x");
  EXPECT_EQ(full->admit("y"), "other");
  LabelLimiter other(1);
  EXPECT_EQ(other.admit("y"), "y");  // not "other": x was cached for the first limiter only
  EXPECT_EQ(other.admit("x"), "other");
  full.reset();  // its cached entries must never match a later limiter
  LabelLimiter later(1);
  EXPECT_EQ(later.admit("z"), "z");
  EXPECT_EQ(later.admit("x"), "other");
}

TEST(LabelLimiter, ThreadsAgreeOnTheLimit) {
  LabelLimiter limiter(3);
  std::thread t([&] {
    for (int i = 0; i < 3; ++i)
      EXPECT_EQ(limiter.admit("t" + std::to_string(i)), "t" + std::to_string(i));
  });
  t.join();
  EXPECT_EQ(limiter.admit("main"), "other");
  EXPECT_EQ(limiter.admit("t1"), "t1");
}

}  // namespace
}  // namespace kvgate
