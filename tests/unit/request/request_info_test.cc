// Tests for request/request_info: what the gateway reads from a body, and its 400 messages.
#include "request/request_info.h"

#include <gtest/gtest.h>

#include "http/message.h"

namespace kvgate {
namespace {

std::string padded(std::string s) {
  s.reserve(s.size() + http::kBodyPadding);
  return s;
}

TEST(RequestInfo, ReadsModelStreamRid) {
  RequestInfo info;
  std::string body = padded(
      R"({"model":"qwen","stream":true,"rid":"r1","stream_options":{"include_usage":true},"messages":[]})");
  ASSERT_EQ(parse_request(ApiRoute::kChatCompletions, body, info), "");
  EXPECT_EQ(info.model, "qwen");
  EXPECT_TRUE(info.stream);
  EXPECT_EQ(info.rid, "r1");
  EXPECT_TRUE(info.include_usage);
}

TEST(RequestInfo, DefaultsWhenAbsentOrNull) {
  RequestInfo info;
  std::string body = padded(R"({"text":"hi","stream":null,"model":null})");
  ASSERT_EQ(parse_request(ApiRoute::kGenerate, body, info), "");
  EXPECT_EQ(info.model, "");
  EXPECT_FALSE(info.stream);
}

TEST(RequestInfo, ErrorsNameTheProblem) {
  RequestInfo info;
  std::string b1 = padded(R"({"model": "x",)");
  EXPECT_NE(parse_request(ApiRoute::kGenerate, b1, info).find("not valid JSON"), std::string::npos);
  std::string b2 = padded("[1,2]");
  EXPECT_NE(parse_request(ApiRoute::kGenerate, b2, info).find("must be a JSON object"),
            std::string::npos);
  std::string b3 = padded(R"({"stream":"yes"})");
  EXPECT_NE(parse_request(ApiRoute::kGenerate, b3, info).find("\"stream\" must be true or false"),
            std::string::npos);
  std::string b4 = padded(R"({"model":3})");
  EXPECT_NE(parse_request(ApiRoute::kGenerate, b4, info).find("\"model\" must be a string"),
            std::string::npos);
  std::string b5;
  EXPECT_NE(parse_request(ApiRoute::kGenerate, b5, info).find("empty"), std::string::npos);
  std::string b6 = padded("{\"text\":\"\xff\xfe\"}");
  EXPECT_NE(parse_request(ApiRoute::kGenerate, b6, info).find("not valid JSON"), std::string::npos);
}

TEST(RequestInfo, UnpaddedBodyStillParses) {
  RequestInfo info;
  std::string body = R"({"model":"m"})";
  body.shrink_to_fit();
  ASSERT_EQ(parse_request(ApiRoute::kCompletions, body, info), "");
  EXPECT_EQ(info.model, "m");
}

}  // namespace
}  // namespace kvgate
