// Tests for http::parse_url.
#include <gtest/gtest.h>

#include "http/client.h"

namespace kvgate::http {
namespace {

TEST(Url, ParsesHostPortAndBase) {
  Target t;
  ASSERT_EQ(parse_url("http://127.0.0.1:30000", t), "");
  EXPECT_EQ(t.host, "127.0.0.1");
  EXPECT_EQ(t.port, 30000);
  EXPECT_EQ(t.host_header, "127.0.0.1:30000");
  EXPECT_EQ(t.url, "http://127.0.0.1:30000");
  ASSERT_EQ(parse_url("http://worker-1/api/", t), "");
  EXPECT_EQ(t.port, 80);
  EXPECT_EQ(t.base_path, "/api");
  EXPECT_EQ(t.host_header, "worker-1");
  ASSERT_EQ(parse_url("127.0.0.1:9", t), "");
  EXPECT_EQ(t.port, 9);
  ASSERT_EQ(parse_url("http://[::1]:8080", t), "");
  EXPECT_EQ(t.host, "::1");
  EXPECT_EQ(t.host_header, "[::1]:8080");
}

TEST(Url, RejectsWithReasons) {
  Target t;
  EXPECT_NE(parse_url("http://x:0", t).find("between 1 and 65535"), std::string::npos);
  EXPECT_NE(parse_url("http://x:99999", t).find("between 1 and 65535"), std::string::npos);
  EXPECT_NE(parse_url("http://:80", t).find("missing host"), std::string::npos);
  EXPECT_NE(parse_url("grpc://x:1", t).find("unsupported scheme"), std::string::npos);
  std::string creds = parse_url("http://admin:hunter2@x:1", t);
  EXPECT_NE(creds.find("credentials"), std::string::npos);
  EXPECT_EQ(creds.find("hunter2"), std::string::npos);  // a password is never echoed
}

TEST(Url, Https) {
  Target t;
  ASSERT_EQ(parse_url("https://gpu-1.internal/v1base/", t), "");
  EXPECT_TRUE(t.https);
  EXPECT_EQ(t.port, 443);
  EXPECT_EQ(t.url, "https://gpu-1.internal:443/v1base");
  ASSERT_EQ(parse_url("http://gpu-1.internal", t), "");
  EXPECT_FALSE(t.https);
  EXPECT_EQ(t.port, 80);
}

TEST(Url, ResolvesLiteralsWithoutDns) {
  Target t;
  ASSERT_EQ(parse_url("http://127.0.0.1:1", t), "");
  ASSERT_EQ(resolve(t), "");
  ASSERT_EQ(t.endpoints.size(), 1u);
  EXPECT_EQ(t.endpoints[0].port(), 1);
}

}  // namespace
}  // namespace kvgate::http
