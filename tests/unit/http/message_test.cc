// Unit tests: http/message (header classification and head building).
#include "http/message.h"

#include <gtest/gtest.h>

#include <string>

namespace kvgate::http {
namespace {

TEST(ClassifyHeader, KnowsItsNamesInAnyCase) {
  EXPECT_EQ(classify_header("Host"), HeaderKind::kHost);
  EXPECT_EQ(classify_header("CONTENT-LENGTH"), HeaderKind::kContentLength);
  EXPECT_EQ(classify_header("content-type"), HeaderKind::kContentType);
  EXPECT_EQ(classify_header("X-Request-Id"), HeaderKind::kRequestId);
  EXPECT_EQ(classify_header("Expect"), HeaderKind::kExpect);
  EXPECT_EQ(classify_header("TraceParent"), HeaderKind::kTraceParent);
  EXPECT_EQ(classify_header("tracestate"), HeaderKind::kOther);  // proxy.cc picks it by name
  for (const char* h : {"Connection", "keep-alive", "TE", "Trailer", "Upgrade", "Proxy-Connection",
                        "Transfer-Encoding", "Proxy-Authenticate", "proxy-authorization"}) {
    EXPECT_EQ(classify_header(h), HeaderKind::kHopByHop) << h;
    EXPECT_TRUE(is_hop_by_hop(h)) << h;
  }
}

TEST(ClassifyHeader, OtherNamesOfTheSameLengthAreOther) {
  EXPECT_EQ(classify_header("hist"), HeaderKind::kOther);
  EXPECT_EQ(classify_header("content-typo"), HeaderKind::kOther);
  EXPECT_EQ(classify_header("x-request-ix"), HeaderKind::kOther);
  EXPECT_EQ(classify_header("traceparenx"), HeaderKind::kOther);
  EXPECT_EQ(classify_header(""), HeaderKind::kOther);
  // A control character is never a letter's other case: CR | 0x20 is '-', yet no match.
  EXPECT_EQ(classify_header("keep\ralive"), HeaderKind::kOther);
  EXPECT_EQ(classify_header(std::string("t\x05", 2)), HeaderKind::kOther);
  // Bytes that differ from a letter only in bit 0x20 but are not letters.
  EXPECT_EQ(classify_header("@ost"), HeaderKind::kOther);
  EXPECT_EQ(classify_header("hos\x7f"), HeaderKind::kOther);
  EXPECT_EQ(classify_header("h\xcfst"), HeaderKind::kOther);
}

TEST(AppendHeader, WritesNameColonValueCrlf) {
  std::string out = "GET / HTTP/1.1\r\n";
  append_header(out, "host", "a:1");
  append_header(out, "x-empty", std::string_view{});  // a null view: no copy from it
  std::string big(5000, 'v');
  append_header(out, "x-big", big);
  EXPECT_EQ(out, "GET / HTTP/1.1\r\nhost: a:1\r\nx-empty: \r\nx-big: " + big + "\r\n");
}

std::string_view cookie_value(std::string_view header, std::string_view name) {
  auto values = cookie_values(header, name, 1);
  return values.empty() ? std::string_view{} : values.front();
}

TEST(CookieValue, FindsTheNamedPairOnly) {
  EXPECT_EQ(cookie_value("kvgate_session=abc", "kvgate_session"), "abc");
  EXPECT_EQ(cookie_value("a=1; kvgate_session=abc; b=2", "kvgate_session"), "abc");
  EXPECT_EQ(cookie_value("a=1;kvgate_session=abc ", "kvgate_session"), "abc");
  EXPECT_EQ(cookie_value("x_kvgate_session=abc", "kvgate_session"), "");
  EXPECT_EQ(cookie_value("kvgate_sessionX=abc", "kvgate_session"), "");
  EXPECT_EQ(cookie_value("kvgate_session", "kvgate_session"), "");
  EXPECT_EQ(cookie_value("kvgate_session=first; kvgate_session=second", "kvgate_session"), "first");
  EXPECT_EQ(cookie_value("", "kvgate_session"), "");
  EXPECT_EQ(cookie_value("a=1", ""), "");
  // Every pair of the name, in order, at most `limit`.
  using V = std::vector<std::string_view>;
  EXPECT_EQ(cookie_values("s=1; a=2; s=3; s=4", "s"), (V{"1", "3", "4"}));
  EXPECT_EQ(cookie_values("s=1; a=2; s=3; s=4", "s", 2), (V{"1", "3"}));
  EXPECT_EQ(without_cookies("a=1;kvgate_session_1=x; b=2 ; kvgate_session=y", kSessionCookiePrefix),
            "a=1; b=2");
  EXPECT_EQ(without_cookies("kvgate_session_1=x", kSessionCookiePrefix), "");
}

}  // namespace
}  // namespace kvgate::http
