// Tests for util/json string escaping.
#include "util/json.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace kvgate
