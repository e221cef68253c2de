// Tests for workers/health: parsing what servers report on /get_load and /v1/models.
#include "workers/health.h"

#include <gtest/gtest.h>

namespace kvgate {
namespace {

TEST(LoadReport, SglangArrayPerRank) {
  EXPECT_EQ(parse_load_report(R"([{"dp_rank":0,"num_reqs":3,"num_waiting_reqs":2,"num_tokens":100},
                                  {"dp_rank":1,"num_reqs":1,"num_waiting_reqs":0,"num_tokens":5}])"),
            6);
}

TEST(LoadReport, V1LoadsObject) {
  EXPECT_EQ(
      parse_load_report(
          R"({"timestamp":1,"loads":[{"dp_rank":0,"num_running_reqs":4,"num_waiting_reqs":1}]})"),
      5);
}

TEST(LoadReport, PlainLoadAndGarbage) {
  EXPECT_EQ(parse_load_report(R"({"load": 7})"), 7);
  EXPECT_EQ(parse_load_report("[]"), 0);
  EXPECT_FALSE(parse_load_report("not json"));
  EXPECT_FALSE(parse_load_report(R"([{"x":1}])"));
}

TEST(LoadReport, HostileNumbersAreClampedNotOverflowed) {
  // Figures past int64, out of range doubles and negatives: a bounded, non-negative load.
  auto huge = parse_load_report(R"({"num_reqs":9223372036854775807,"num_waiting_reqs":1})");
  ASSERT_TRUE(huge);
  EXPECT_GT(*huge, 1'000'000);
  EXPECT_EQ(parse_load_report(R"([{"num_reqs":1e300},{"num_reqs":18446744073709551615}])"), *huge);
  EXPECT_EQ(parse_load_report(R"([{"num_reqs":-5,"num_waiting_reqs":2},{"load":-1e300}])"), 2);
}

TEST(ModelList, DataEntries) {
  auto m = parse_model_list(R"({"object":"list","data":[{"id":"a","object":"model"},{"id":"b"}]})");
  ASSERT_TRUE(m);
  ASSERT_EQ(m->size(), 2u);
  EXPECT_EQ((*m)[0], R"({"id":"a","object":"model"})");
  EXPECT_FALSE(parse_model_list("{}"));
}

}  // namespace
}  // namespace kvgate
