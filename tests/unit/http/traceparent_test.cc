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

// kvgate exports no spans: a valid traceparent goes on exactly as it came (no span id of kvgate's
// that no tracing backend would ever receive).
TEST(TraceContext, ContinuesAValidTraceUnchanged) {
  TraceContext t;
  ASSERT_TRUE(t.continue_from(kValid, 1));
  EXPECT_TRUE(t.continued());
  EXPECT_EQ(t.header(), kValid);
  EXPECT_EQ(t.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(t.parent_id(), "00f067aa0ba902b7");
  // Flags travel as received (here: not sampled).
  constexpr std::string_view kUnsampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
  TraceContext v;
  ASSERT_TRUE(v.continue_from(kUnsampled, 1));
  EXPECT_EQ(v.header(), kUnsampled);
  // A later version goes on as version 00 with its trace-id, parent-id and flags (level 1).
  TraceContext u;
  ASSERT_TRUE(u.continue_from("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03-more", 1));
  EXPECT_EQ(u.header(), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03");
}

TEST(TraceContext, StartsANewTraceWhenAbsentInvalidOrRepeated) {
  for (auto [value, count] :
       {std::pair<std::string_view, int>{"", 0}, {"00-nonsense", 1}, {kValid, 2}}) {
    TraceContext t;
    EXPECT_FALSE(t.continue_from(value, count)) << value;
    EXPECT_FALSE(t.started()) << "nothing written: start() it";
    t.start(0x0123456789abcdefull, 0xfedcba9876543210ull, 0x1234);
    EXPECT_FALSE(t.continued()) << value;
    EXPECT_TRUE(t.started());
    EXPECT_EQ(t.header(), "00-0123456789abcdeffedcba9876543210-0000000000001234-01");
    EXPECT_EQ(t.trace_id(), "0123456789abcdeffedcba9876543210");
    EXPECT_EQ(t.parent_id(), "0000000000001234");
    auto parsed = parse_traceparent(t.header());
    ASSERT_TRUE(parsed) << t.header();
    EXPECT_EQ(parsed->flags, TraceContext::kSampled);
  }
  // Never all zeros, whatever the random source said.
  TraceContext z;
  z.start(0, 0, 0);
  EXPECT_TRUE(parse_traceparent(z.header())) << z.header();
}

// A tracestate past 512 characters, truncated as Trace Context level 1 says: white space and
// empty members do not count; then members over 128 characters go; then members from the end.
TEST(TraceState, TruncatedAsTheSpecificationSays) {
  const std::string a(100, 'a'), b(100, 'b'), big(200, 'x'), c(100, 'c');
  auto m = [](char k, const std::string& v) { return std::string(1, k) + "=" + v; };
  // 5 members of 102 characters and 4 commas: 514, too long; padded with white space and an empty
  // member, which go first.
  std::string five =
      m('a', a) + ",,  " + m('b', b) + " ,\t" + m('c', c) + "," + m('d', a) + "," + m('e', b);
  EXPECT_EQ(truncate_tracestate(five),
            m('a', a) + "," + m('b', b) + "," + m('c', c) + "," + m('d', a));
  // The long member goes first, even from the front; the rest then fits.
  std::string with_big =
      m('x', big) + "," + m('a', a) + "," + m('b', b) + "," + m('c', c) + "," + m('d', a);
  EXPECT_EQ(truncate_tracestate(with_big),
            m('a', a) + "," + m('b', b) + "," + m('c', c) + "," + m('d', a));
  // Only white space over the limit: the members, trimmed, all kept.
  std::string spaced = m('a', a) + std::string(500, ' ') + "," + m('b', b);
  EXPECT_EQ(truncate_tracestate(spaced), m('a', a) + "," + m('b', b));
  // Nothing left.
  EXPECT_EQ(truncate_tracestate(std::string(600, ',')), "");
  EXPECT_EQ(truncate_tracestate(std::string(600, 'z')), "");
}

}  // namespace
}  // namespace kvgate::http
