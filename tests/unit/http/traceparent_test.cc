// Tests for http/traceparent: W3C Trace Context level 1 parsing, continuing and starting traces.
#include "http/traceparent.h"

#include <gtest/gtest.h>

#include <string>

namespace kvgate::http {
namespace {

constexpr std::string_view kValid = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

TEST(TraceParent, ParsesLevelOneExamples) {
  auto p = parse_traceparent(kValid);
  ASSERT_TRUE(p);
  EXPECT_EQ(std::string_view(p->trace_id, 32), "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(std::string_view(p->parent_id, 16), "00f067aa0ba902b7");
  EXPECT_EQ(p->flags, 1);
  auto q = parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00");
  ASSERT_TRUE(q);
  EXPECT_EQ(q->flags, 0);
}

TEST(TraceParent, RefusesWhatTheSpecificationRefuses) {
  for (std::string_view bad : {
           "",
           "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",     // short
           "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",   // version 00 with more
           "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",    // uppercase
           "00-00000000000000000000000000000000-00f067aa0ba902b7-01",    // zero trace-id
           "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",    // zero parent-id
           "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",    // version ff
           "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",    // not hex
           "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",    // separator
           "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x",    // flags
           "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",    // misplaced dash
           "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01.x",  // later version, no '-'
       }) {
    EXPECT_FALSE(parse_traceparent(bad)) << bad;
  }
}

TEST(TraceParent, LaterVersionsAreReadAsVersionZero) {
  EXPECT_TRUE(parse_traceparent("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"));
  EXPECT_TRUE(
      parse_traceparent("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-ever"));
}

TEST(TraceContext, ContinuesAValidTraceWithANewSpanPerCall) {
  TraceContext t;
  t.begin(kValid, 1, 7, 9);
  EXPECT_TRUE(t.continued());
  EXPECT_EQ(t.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(t.client_span_id(), "00f067aa0ba902b7");
  t.next_span(0x1234);
  EXPECT_EQ(t.header(), "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000001234-01");
  ASSERT_TRUE(parse_traceparent(t.header()));
  t.next_span(0xabcdef0123456789ull);
  EXPECT_EQ(t.span_id(), "abcdef0123456789");
  // Flags travel as received; a later version goes on as version 00.
  TraceContext u;
  u.begin("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-more", 1, 1, 2);
  EXPECT_TRUE(u.continued());
  EXPECT_TRUE(u.header().starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"));
  EXPECT_TRUE(u.header().ends_with("-00"));
}

TEST(TraceContext, StartsANewTraceWhenAbsentInvalidOrRepeated) {
  for (auto [value, count] :
       {std::pair<std::string_view, int>{"", 0}, {"00-nonsense", 1}, {kValid, 2}}) {
    TraceContext t;
    t.begin(value, count, 0x0123456789abcdefull, 0xfedcba9876543210ull);
    EXPECT_FALSE(t.continued()) << value;
    EXPECT_EQ(t.trace_id(), "0123456789abcdeffedcba9876543210");
    EXPECT_EQ(t.client_span_id(), "");
    auto parsed = parse_traceparent(t.header());
    ASSERT_TRUE(parsed) << t.header();
    EXPECT_EQ(parsed->flags, TraceContext::kSampled);
  }
  // Never all zeros, whatever the random source said.
  TraceContext z;
  z.begin("", 0, 0, 0);
  z.next_span(0);
  EXPECT_TRUE(parse_traceparent(z.header())) << z.header();
}

}  // namespace
}  // namespace kvgate::http
