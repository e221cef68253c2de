// Tests for gateway/errors: statuses and the JSON error shape.
#include "gateway/errors.h"

#include <gtest/gtest.h>
#include <simdjson.h>

namespace kvgate {
namespace {

void expect_shape(const GatewayError& e, int status, std::string_view code) {
  EXPECT_EQ(e.status, status);
  std::string body = error_body(e);
  simdjson::dom::parser p;
  simdjson::dom::element doc;
  ASSERT_FALSE(p.parse(body).get(doc)) << body;
  std::string_view type, c, message;
  ASSERT_FALSE(doc["error"]["type"].get_string().get(type)) << body;
  ASSERT_FALSE(doc["error"]["code"].get_string().get(c)) << body;
  ASSERT_FALSE(doc["error"]["message"].get_string().get(message)) << body;
  EXPECT_EQ(c, code);
  EXPECT_FALSE(message.empty());
}

TEST(Errors, EachCauseHasItsStatus) {
  expect_shape(errors::bad_json("x"), 400, "invalid_json");
  expect_shape(errors::not_found("GET", "/nope"), 404, "not_found");
  expect_shape(errors::method_not_allowed("GET", "/generate", "POST"), 405, "method_not_allowed");
  expect_shape(errors::unauthorized(), 401, "invalid_api_key");
  expect_shape(errors::queue_full(100), 429, "queue_full");
  expect_shape(errors::queue_timeout(60), 408, "queue_timeout");
  expect_shape(errors::no_worker(2), 503, "no_available_workers");
  expect_shape(errors::upstream_unreachable(5), 502, "upstream_unreachable");
  expect_shape(errors::upstream_timeout(30), 504, "upstream_timeout");
  expect_shape(errors::upstream_failed(2), 502, "upstream_failed");
  expect_shape(errors::upstream_no_answer(2), 502, "upstream_no_answer");
  expect_shape(errors::upstream_protocol(2), 502, "upstream_protocol");
}

TEST(Errors, UpstreamFaultsNameTheWorkerByIdOnly) {
  auto e = errors::upstream_unreachable(3);
  EXPECT_NE(e.message.find("3 attempts"), std::string::npos);
  // No URL, address or socket error text reaches a client; the worker is named by its id.
  for (const auto& m :
       {e.message, errors::upstream_failed(7).message, errors::upstream_no_answer(7).message,
        errors::upstream_timeout(9).message, errors::upstream_protocol(7).message}) {
    EXPECT_EQ(m.find("http"), std::string::npos) << m;
    EXPECT_EQ(m.find("refused"), std::string::npos) << m;
  }
  EXPECT_NE(errors::upstream_failed(7).message.find("#7"), std::string::npos);
}

TEST(Errors, MessagesAreEscaped) {
  std::string body = error_body(errors::bad_json("bad \"quote\" \n and \xff byte"));
  simdjson::dom::parser p;
  simdjson::dom::element doc;
  EXPECT_FALSE(p.parse(body).get(doc)) << body;
}

}  // namespace
}  // namespace kvgate
