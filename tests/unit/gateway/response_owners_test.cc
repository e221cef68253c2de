// Tests for gateway/response_owners: which worker created each Responses API response.
#include "gateway/response_owners.h"

#include <gtest/gtest.h>

#include <string>

#include "metrics/metrics.h"

namespace kvgate {
namespace {

using Clock = ResponseOwners::Clock;

TEST(ResponseOwners, ValidIds) {
  EXPECT_TRUE(ResponseOwners::valid_id("resp_0123456789abcdef0123456789abcdef"));
  EXPECT_TRUE(ResponseOwners::valid_id("resp_a-b_C"));
  EXPECT_FALSE(ResponseOwners::valid_id("resp_"));
  EXPECT_FALSE(ResponseOwners::valid_id("msg_abc"));
  EXPECT_FALSE(ResponseOwners::valid_id("resp_a b"));
  EXPECT_FALSE(ResponseOwners::valid_id("resp_a/../b"));
  EXPECT_FALSE(ResponseOwners::valid_id("resp_" + std::string(129, 'a')));
}

TEST(ResponseOwners, FindsTheResponseIdNotOthers) {
  // A whole answer: the top-level id comes first.
  EXPECT_EQ(
      ResponseOwners::find_id(R"({"id":"resp_abc","object":"response","output":[{"id":"msg_1"}],)"
                              R"("previous_response_id":"resp_old"})"),
      "resp_abc");
  // A stream's first event: the response object inside response.created.
  EXPECT_EQ(
      ResponseOwners::find_id(
          "event: response.created\ndata: {\"type\":\"response.created\","
          "\"sequence_number\":0,\"response\":{\"id\": \"resp_s1\",\"status\":\"in_progress\"}}"),
      "resp_s1");
  // Another key ending in id is not the id; an id-like string value is not a key.
  EXPECT_EQ(ResponseOwners::find_id(R"({"previous_response_id":"resp_old","x":"id"})"), "");
  EXPECT_EQ(ResponseOwners::find_id(R"({"text":"say \"id\": \"resp_fake\""})"), "");
  // Cut before its closing quote: not yet.
  EXPECT_EQ(ResponseOwners::find_id(R"({"id":"resp_ab)"), "");
  // An id that is not a response's first: the first "id" key decides.
  EXPECT_EQ(ResponseOwners::find_id(R"({"id":"chatcmpl-1","x":{"id":"resp_later"}})"),
            "resp_later");
  EXPECT_EQ(ResponseOwners::find_id(R"({"id":"resp_bad id"})"), "");
}

TEST(ResponseOwners, LearnsFindsForgets) {
  ResponseOwners owners(100, std::chrono::seconds(60));
  owners.learn("resp_a", "rule1", "http://w1");
  auto o = owners.find("resp_a");
  ASSERT_TRUE(o);
  EXPECT_EQ(o->rule, "rule1");
  EXPECT_EQ(o->worker, "http://w1");
  // Another worker answering with an id in use (a client's request_id reused) does not take it.
  EXPECT_FALSE(owners.learn("resp_a", "rule1", "http://w2"));
  EXPECT_EQ(owners.find("resp_a")->worker, "http://w1");
  EXPECT_TRUE(owners.learn("resp_a", "rule1", "http://w1", 3));  // the same worker: refreshed
  EXPECT_EQ(owners.find("resp_a")->dp_rank, 3);
  EXPECT_EQ(owners.size(), 1u);
  owners.forget("resp_a");
  EXPECT_FALSE(owners.find("resp_a"));
  owners.learn("not-an-id", "r", "w");
  EXPECT_EQ(owners.size(), 0u);
}

TEST(ResponseOwners, BoundedOldestForgottenFirst) {
  metrics::Registry registry;
  ResponseOwners owners(2048, std::chrono::seconds(3600));  // 16 shards of 128
  owners.attach_metrics(registry);
  for (int i = 0; i < 50000; ++i) owners.learn("resp_" + std::to_string(i), "r", "w");
  EXPECT_LE(owners.size(), 2048u);
  EXPECT_GE(owners.size(), 1900u);
  EXPECT_TRUE(owners.find("resp_49999"));
  EXPECT_FALSE(owners.find("resp_0"));
  std::string text = registry.expose();
  EXPECT_NE(text.find("kvgate_response_owners " + std::to_string(owners.size())), std::string::npos)
      << text;
}

TEST(ResponseOwners, SmallTablesAreExact) {
  ResponseOwners owners(3, std::chrono::seconds(3600));
  for (int i = 0; i < 10; ++i) owners.learn("resp_" + std::to_string(i), "r", "w");
  EXPECT_EQ(owners.size(), 3u);
  EXPECT_TRUE(owners.find("resp_9") && owners.find("resp_8") && owners.find("resp_7"));
}

TEST(ResponseOwners, Expire) {
  ResponseOwners owners(100, std::chrono::seconds(10));
  auto t0 = Clock::now();
  owners.learn("resp_old", "r", "w", -1, t0);
  EXPECT_TRUE(owners.find("resp_old", t0 + std::chrono::seconds(9)));
  EXPECT_FALSE(owners.find("resp_old", t0 + std::chrono::seconds(10)));
  // Expired entries at the front go when something is learned.
  for (int i = 0; i < 64; ++i) owners.learn("resp_x" + std::to_string(i), "r", "w", -1, t0);
  owners.learn("resp_new", "r", "w", -1, t0 + std::chrono::seconds(11));
  EXPECT_EQ(owners.size(), 1u);  // (one shard below 1,024 entries: every expired one went)
  // Once expired, an id is anyone's: another worker answering with it takes it.
  owners.learn("resp_id", "r", "w1", -1, t0);
  EXPECT_FALSE(owners.learn("resp_id", "r", "w2", -1, t0 + std::chrono::seconds(9)));
  EXPECT_TRUE(owners.learn("resp_id", "r", "w2", -1, t0 + std::chrono::seconds(10)));
  EXPECT_EQ(owners.find("resp_id", t0 + std::chrono::seconds(10))->worker, "w2");
  EXPECT_TRUE(owners.find("resp_new", t0 + std::chrono::seconds(11)));
}

TEST(ResponseOwners, CountsRoutes) {
  metrics::Registry registry;
  ResponseOwners owners(10, std::chrono::seconds(10));
  owners.count("owner");  // before attach: not counted, no crash
  owners.attach_metrics(registry);
  owners.count("found");
  owners.count("found");
  EXPECT_NE(registry.expose().find(R"(kvgate_response_owner_routes_total{result="found"} 2)"),
            std::string::npos);
}

}  // namespace
}  // namespace kvgate
