// Tests of request/body_rewrite: fields appended to a JSON body, the rest left byte for byte.
#include "request/body_rewrite.h"

#include <gtest/gtest.h>
#include <simdjson.h>

namespace kvgate {
namespace {

TEST(BodyRewrite, AppendsBeforeTheClosingBraceAndKeepsTheRestAsItWas) {
  BodyField rank{"routed_dp_rank", "3"};
  EXPECT_EQ(add_fields(R"({"text":"hi"})", {&rank, 1}), R"({"text":"hi","routed_dp_rank":3})");
  EXPECT_EQ(add_fields("{ \"a\" : [1, {\"b\":2}] }\n", {&rank, 1}),
            "{ \"a\" : [1, {\"b\":2}] ,\"routed_dp_rank\":3}\n");
  EXPECT_EQ(add_fields("{}", {&rank, 1}), R"({"routed_dp_rank":3})");
  EXPECT_EQ(add_fields("{ \n }", {&rank, 1}), "{ \n \"routed_dp_rank\":3}");
  BodyField two[] = {{"bootstrap_host", "\"10.0.0.1\""}, {"bootstrap_room", "42"}};
  EXPECT_EQ(add_fields(R"({"x":1})", two),
            R"({"x":1,"bootstrap_host":"10.0.0.1","bootstrap_room":42})");
}

TEST(BodyRewrite, NotAnObjectIsLeftAlone) {
  BodyField rank{"routed_dp_rank", "3"};
  EXPECT_EQ(add_fields("[1,2]", {&rank, 1}), "");
  EXPECT_EQ(add_fields("", {&rank, 1}), "");
  EXPECT_EQ(add_fields("   ", {&rank, 1}), "");
}

TEST(BodyRewrite, TheResultIsValidJsonAndTheAppendedValueIsTheLastOfItsKey) {
  BodyField rank{"routed_dp_rank", "5"};
  std::string out = add_fields(R"({"routed_dp_rank":1,"text":"x"})", {&rank, 1});
  simdjson::dom::parser p;
  simdjson::padded_string padded(out);
  simdjson::dom::element doc;
  ASSERT_FALSE(p.parse(padded).get(doc)) << out;
  // The last occurrence is the one Python's json.loads keeps.
  EXPECT_EQ(out.rfind("\"routed_dp_rank\":5"),
            out.size() - std::string("\"routed_dp_rank\":5}").size());
}

}  // namespace
}  // namespace kvgate
