// Tests for util/json string escaping and util/json_parser (outsized parsers are released).
#include "util/json.h"

#include <gtest/gtest.h>

#include <string>

#include "util/json_parser.h"

namespace kvgate {
namespace {

TEST(Json, EscapesControlAndQuotes) {
  EXPECT_EQ(json::quote("a\"b\\c\n\t\x01"), R"("a\"b\\c\n\t\u0001")");
}

TEST(Json, KeepsValidUtf8AndReplacesInvalid) {
  EXPECT_EQ(json::quote("h\xc3\xa9 \xe4\xbd\xa0 \xf0\x9f\x98\x80"),
            "\"h\xc3\xa9 \xe4\xbd\xa0 \xf0\x9f\x98\x80\"");
  EXPECT_EQ(json::quote("a\xff"
                        "b"),
            "\"a\xef\xbf\xbd"
            "b\"");
  EXPECT_EQ(json::quote("\xc3"), "\"\xef\xbf\xbd\"");  // truncated sequence
  EXPECT_EQ(json::quote("\xed\xa0\x80"), "\"\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\"");  // surrogate
}

TEST(JsonParser, AnOutsizedParserIsReleasedASmallOneKept) {
  simdjson::dom::parser p;
  simdjson::dom::element doc;
  ASSERT_FALSE(p.parse(simdjson::padded_string(std::string(R"({"a":[1,2,3]})"))).get(doc));
  size_t small = p.capacity();
  ASSERT_GT(small, 0u);
  json::release_if_large(p);
  EXPECT_EQ(p.capacity(), small) << "a parser within the bound is kept for reuse";
  std::string big = "[\"" + std::string(2 * json::kParserRetainedBytes, 'x') + "\"]";
  ASSERT_FALSE(p.parse(simdjson::padded_string(big)).get(doc));
  ASSERT_GT(p.capacity(), json::kParserRetainedBytes);
  { json::ParserRelease release(p); }
  EXPECT_LE(p.capacity(), json::kParserRetainedBytes);
  ASSERT_FALSE(p.parse(simdjson::padded_string(std::string("[1]"))).get(doc));
}

}  // namespace
}  // namespace kvgate
