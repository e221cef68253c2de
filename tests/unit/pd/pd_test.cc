// pd: the bootstrap_room that carries a prefill rank (SGLang prefills room % dp_size).
#include "pd/pd.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>

namespace kvgate::pd {
namespace {

constexpr uint64_t kTop = uint64_t{1} << 63;

TEST(ChooseRoom, SixtyThreeRandomBitsWithoutARank) {
  EXPECT_EQ(choose_room(0xffffffffffffffffull, std::nullopt, 4), kTop - 1);
  EXPECT_EQ(choose_room(12345, std::nullopt, 4), 12345u);
  EXPECT_EQ(choose_room(12345, 3, 1), 12345u);  // one rank: nothing to choose
  EXPECT_EQ(choose_room(12345, -1, 4), 12345u);
}

TEST(ChooseRoom, TheRoomLandsOnTheChosenRank) {
  const uint64_t draws[] = {0,
                            1,
                            7,
                            12345,
                            kTop - 1,
                            kTop,
                            0xffffffffffffffffull,
                            0x8000000000000007ull,
                            0x123456789abcdefull};
  for (int64_t dp : {2, 3, 4, 7, 8, 64}) {
    for (int rank = 0; rank < dp; ++rank) {
      for (uint64_t d : draws) {
        uint64_t room = choose_room(d, rank, dp);
        EXPECT_LT(room, kTop) << d << " dp " << dp << " rank " << rank;
        EXPECT_EQ(room % static_cast<uint64_t>(dp), static_cast<uint64_t>(rank))
            << d << " dp " << dp;
        // Still the draw, up to a rank's shift: rooms of different draws stay different.
        uint64_t masked = d & (kTop - 1);
        EXPECT_LT(masked > room ? masked - room : room - masked, static_cast<uint64_t>(2 * dp));
      }
    }
  }
}

TEST(ChooseRoom, DifferentDrawsGiveDifferentRooms) {
  std::set<uint64_t> rooms;
  for (uint64_t d = 0; d < 1000; ++d) rooms.insert(choose_room(d * 0x9e3779b97f4a7c15ull, 1, 2));
  EXPECT_EQ(rooms.size(), 1000u);
}

TEST(BootstrapFields, HostWithoutBracketsPortAndRoom) {
  http::Target t;
  ASSERT_EQ(http::parse_url("http://[::1]:30000", t), "");
  auto f = bootstrap_fields(t, 8998, 42);
  ASSERT_EQ(f.size(), 3u);
  EXPECT_EQ(f[0].name, "bootstrap_host");
  EXPECT_EQ(f[0].value, "\"::1\"");
  EXPECT_EQ(f[1].value, "8998");
  EXPECT_EQ(f[2].name, "bootstrap_room");
  EXPECT_EQ(f[2].value, "42");
  ASSERT_EQ(http::parse_url("http://10.0.0.21:30000", t), "");
  EXPECT_EQ(bootstrap_fields(t, 9000, 1)[0].value, "\"10.0.0.21\"");
}

TEST(PromptLogprobs, PrefillRowsComeFirst) {
  const std::string prefill =
      R"({"text":"x","meta_info":{"id":"a","input_token_logprobs":[[null,11,null],[-1.25,12,null]],)"
      R"("input_top_logprobs":[null,[[-0.1,7,null]]],"output_token_logprobs":[[-2,99,null]]}})";
  // SGLang's decode sends the input lists empty.
  const std::string decode =
      R"({"text":"hello","meta_info":{"id":"b","input_token_logprobs":[],"input_top_logprobs":[],)"
      R"("output_token_logprobs":[[-0.75,5,null]],"cached_tokens":16}})";
  PromptLogprobs rows(prefill);
  ASSERT_FALSE(rows.empty());
  auto j = nlohmann::json::parse(rows.merge(decode));
  EXPECT_EQ(j["text"], "hello");
  EXPECT_EQ(j["meta_info"]["id"], "b");
  EXPECT_EQ(j["meta_info"]["cached_tokens"], 16);
  ASSERT_EQ(j["meta_info"]["input_token_logprobs"].size(), 2u);
  EXPECT_TRUE(j["meta_info"]["input_token_logprobs"][0][0].is_null());
  EXPECT_EQ(j["meta_info"]["input_token_logprobs"][1][1], 12);
  EXPECT_EQ(j["meta_info"]["input_top_logprobs"].size(), 2u);
  // The decode's own output rows stay; rows the decode had are kept after the prefill's.
  EXPECT_EQ(j["meta_info"]["output_token_logprobs"][0][1], 5);
  auto k =
      nlohmann::json::parse(rows.merge(R"({"meta_info":{"input_token_logprobs":[[-3,13,null]]}})"));
  EXPECT_EQ(k["meta_info"]["input_token_logprobs"].size(), 3u);
  EXPECT_EQ(k["meta_info"]["input_token_logprobs"][2][1], 13);
  // Merging again (every stream event) gives the same rows: the prefill's are kept, not moved.
  EXPECT_EQ(rows.merge(decode), rows.merge(decode));
}

TEST(PromptLogprobs, NothingToMergeRelaysAsIs) {
  EXPECT_TRUE(PromptLogprobs(R"({"meta_info":{}})").empty());
  EXPECT_TRUE(PromptLogprobs("not json").empty());
  EXPECT_EQ(PromptLogprobs(R"({"meta_info":{}})").merge(R"({"meta_info":{}})"), "");
  PromptLogprobs rows(R"({"meta_info":{"input_token_logprobs":[[0,1,null]]}})");
  EXPECT_EQ(rows.merge("[1]"), "");
  EXPECT_EQ(rows.merge_event("data: [DONE]\n\n"), "");
  EXPECT_EQ(
      rows.merge_event("data: {\"text\":\"a\",\"meta_info\":{\"input_token_logprobs\":null}}\n\n"),
      "data: {\"meta_info\":{\"input_token_logprobs\":[[0,1,null]]},\"text\":\"a\"}\n\n");
}

}  // namespace
}  // namespace kvgate::pd
