// Tests for http/parser: every rule, with good and bad input, each fed whole and one byte at a
// time (the two must agree).
#include "http/parser.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "http/read_buffer.h"

namespace kvgate::http {
namespace {

using Kind = HeadParser::Kind;
using namespace std::string_view_literals;

struct HeadResult {
  ParseStatus status;
  ParseError error;
  size_t head_size;
};

// Parses `bytes` into `p`: whole, or growing one byte at a time (as a slow client sends them).
HeadResult parse_head(HeadParser& p, std::string_view bytes, bool bytewise, size_t limit) {
  p.reset();
  ParseStatus st = ParseStatus::kNeedMore;
  if (!bytewise) {
    st = p.parse(bytes.data(), bytes.size(), limit);
  } else {
    for (size_t n = 1; n <= bytes.size() && st == ParseStatus::kNeedMore; ++n) {
      st = p.parse(bytes.data(), n, limit);
    }
  }
  return {st, p.error(), p.head_size()};
}

// Both ways; they must agree. Returns the whole-input parse (p holds its result).
HeadResult parse_both(HeadParser& p, std::string_view bytes, size_t limit = 65536) {
  HeadResult b = parse_head(p, bytes, true, limit);
  HeadResult w = parse_head(p, bytes, false, limit);
  EXPECT_EQ(static_cast<int>(b.status), static_cast<int>(w.status)) << bytes;
  EXPECT_EQ(static_cast<int>(b.error), static_cast<int>(w.error)) << bytes;
  EXPECT_EQ(b.head_size, w.head_size) << bytes;
  return w;
}

void expect_request_error(std::string_view bytes, ParseError e) {
  HeadParser p(Kind::kRequest);
  HeadResult r = parse_both(p, bytes);
  EXPECT_EQ(r.status, ParseStatus::kError) << bytes;
  EXPECT_EQ(r.error, e) << bytes << " -> " << describe(r.error);
}

void expect_response_error(std::string_view bytes, ParseError e) {
  HeadParser p(Kind::kResponse);
  HeadResult r = parse_both(p, bytes);
  EXPECT_EQ(r.status, ParseStatus::kError) << bytes;
  EXPECT_EQ(r.error, e) << bytes << " -> " << describe(r.error);
}

// ---- requests: good ----

TEST(HeadParser, ParsesARequestInPlace) {
  HeadParser p(Kind::kRequest);
  std::string req =
      "POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: gw:30000\r\nContent-Type: "
      "application/json\r\nAuthorization: Bearer abc\r\nContent-Length: 5\r\n\r\nhello";
  HeadResult r = parse_both(p, req);
  ASSERT_EQ(r.status, ParseStatus::kDone);
  EXPECT_EQ(r.head_size, req.size() - 5);
  EXPECT_EQ(p.method(), "POST");
  EXPECT_EQ(p.target(), "/v1/chat/completions?x=1");
  EXPECT_EQ(p.version(), 11u);
  ASSERT_EQ(p.field_count(), 4u);
  EXPECT_EQ(p.name(0), "Host");
  EXPECT_EQ(p.value(0), "gw:30000");
  EXPECT_EQ(p.find("content-type"), "application/json");
  EXPECT_EQ(p.find("AUTHORIZATION"), "Bearer abc");
  EXPECT_EQ(p.find("x-missing"), "");
  EXPECT_EQ(p.content_length(), 5u);
  EXPECT_EQ(p.framing(), BodyFraming::kLength);
  EXPECT_TRUE(p.keep_alive());
  EXPECT_FALSE(p.expect_continue());
}

TEST(HeadParser, ValuesAreTrimmedAndMayHoldTabsAndObsText) {
  HeadParser p(Kind::kRequest);
  std::string req =
      "GET / HTTP/1.1\r\nA:   spaced \t \r\nB:\r\nC: a\tb  c\r\nD: caf\xc3\xa9\r\nE:x\r\n\r\n";
  ASSERT_EQ(parse_both(p, req).status, ParseStatus::kDone);
  EXPECT_EQ(p.find("a"), "spaced");
  EXPECT_EQ(p.find("b"), "");
  EXPECT_EQ(p.find("c"), "a\tb  c");
  EXPECT_EQ(p.find("d"), "caf\xc3\xa9");
  EXPECT_EQ(p.find("e"), "x");
  EXPECT_EQ(p.framing(), BodyFraming::kNone);
}

TEST(HeadParser, FirstValueWinsAndEveryFieldIsKeptInOrder) {
  HeadParser p(Kind::kRequest);
  std::string req = "GET / HTTP/1.1\r\n";
  for (int i = 0; i < 100; ++i)
    req += "X-" + std::to_string(i) + ": v" + std::to_string(i) + "\r\n";
  req += "x-7: second\r\n\r\n";
  ASSERT_EQ(parse_both(p, req).status, ParseStatus::kDone);
  ASSERT_EQ(p.field_count(), 101u);  // beyond the inline fields
  EXPECT_EQ(p.find("x-7"), "v7");
  EXPECT_EQ(p.find("X-99"), "v99");
  size_t i = 0;
  p.for_each([&](std::string_view n, std::string_view v) {
    if (i < 100) {
      EXPECT_EQ(n, "X-" + std::to_string(i));
      EXPECT_EQ(v, "v" + std::to_string(i));
    }
    ++i;
  });
  EXPECT_EQ(i, 101u);
}

TEST(HeadParser, KeepAliveFollowsVersionAndConnection) {
  struct Case {
    const char* head;
    bool keep;
  } cases[] = {
      {"GET / HTTP/1.1\r\n\r\n", true},
      {"GET / HTTP/1.1\r\nConnection: close\r\n\r\n", false},
      {"GET / HTTP/1.1\r\nConnection: Upgrade, CLOSE\r\n\r\n", false},
      {"GET / HTTP/1.1\r\nConnection: keep-alive, , te\r\n\r\n", true},
      {"GET / HTTP/1.0\r\n\r\n", false},
      {"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", true},
      {"GET / HTTP/1.0\r\nConnection: keep-alive, close\r\n\r\n", false},
      {"GET / HTTP/1.1\r\nProxy-Connection: close\r\n\r\n", false},
      // RFC 9112 6.1: HTTP/1.0 with Transfer-Encoding is faulty framing: served, then closed.
      {"POST / HTTP/1.0\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n", false},
  };
  for (const auto& c : cases) {
    HeadParser p(Kind::kRequest);
    ASSERT_EQ(parse_both(p, c.head).status, ParseStatus::kDone) << c.head;
    EXPECT_EQ(p.keep_alive(), c.keep) << c.head;
  }
}

// has_connection() lets a proxy skip collecting Connection tokens when there is no such field
// (Proxy-Connection does not count; another field of the same length is not read as one).
TEST(HeadParser, HasConnectionOnlyForAConnectionField) {
  struct Case {
    const char* head;
    bool has;
    bool keep;
  } cases[] = {
      {"GET / HTTP/1.1\r\nHost: a\r\n\r\n", false, true},
      {"GET / HTTP/1.1\r\nconnection: x-secret\r\n\r\n", true, true},
      {"GET / HTTP/1.1\r\nProxy-Connection: keep-alive\r\n\r\n", false, true},
      {"GET / HTTP/1.1\r\nConnection: te\r\nUser-Agent: close\r\n\r\n", true, true},
  };
  for (const auto& c : cases) {
    HeadParser p(Kind::kRequest);
    ASSERT_EQ(parse_both(p, c.head).status, ParseStatus::kDone) << c.head;
    EXPECT_EQ(p.has_connection(), c.has) << c.head;
    EXPECT_EQ(p.keep_alive(), c.keep) << c.head;
    p.reset();
    EXPECT_FALSE(p.has_connection());
  }
}

TEST(HeadParser, ChunkedRequestsAndExpectContinue) {
  HeadParser p(Kind::kRequest);
  ASSERT_EQ(parse_both(p,
                       "POST / HTTP/1.1\r\nTransfer-Encoding: Chunked\r\nExpect: "
                       "100-Continue\r\n\r\n")
                .status,
            ParseStatus::kDone);
  EXPECT_EQ(p.framing(), BodyFraming::kChunked);
  EXPECT_FALSE(p.content_length());
  EXPECT_TRUE(p.expect_continue());
  ASSERT_EQ(parse_both(p, "POST / HTTP/1.1\r\nExpect: x\r\nExpect: 100-continue\r\n\r\n").status,
            ParseStatus::kDone);
  EXPECT_FALSE(p.expect_continue());  // the first one counts
  ASSERT_EQ(
      parse_both(p, "POST / HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n").status,
      ParseStatus::kDone);
  EXPECT_FALSE(p.expect_continue());  // RFC 9110 10.1.1: a 1.0 client's Expect is ignored
}

TEST(HeadParser, AWorkersHttp10AnswerWithTransferEncodingIsNeverKeptAlive) {
  HeadParser p(Kind::kResponse);
  ASSERT_EQ(parse_both(p,
                       "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nTransfer-Encoding: "
                       "chunked\r\n\r\n")
                .status,
            ParseStatus::kDone);
  EXPECT_FALSE(p.keep_alive());
}

TEST(HeadParser, RepeatedEqualContentLengthsAreOneLength) {
  HeadParser p(Kind::kRequest);
  ASSERT_EQ(
      parse_both(p, "POST / HTTP/1.1\r\nContent-Length: 007\r\ncontent-length: 7\r\n\r\n").status,
      ParseStatus::kDone);
  EXPECT_EQ(p.content_length(), 7u);
  ASSERT_EQ(parse_both(p, "POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n").status,
            ParseStatus::kDone);
  EXPECT_EQ(p.framing(), BodyFraming::kNone);
  ASSERT_EQ(parse_both(p, "POST / HTTP/1.1\r\nContent-Length: 18446744073709551615\r\n\r\n").status,
            ParseStatus::kDone);
  EXPECT_EQ(p.content_length(), UINT64_MAX);
}

TEST(HeadParser, PipelinedBytesAreLeftForTheNextMessage) {
  HeadParser p(Kind::kRequest);
  std::string two = "GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\n\r\n";
  HeadResult r = parse_both(p, two);
  ASSERT_EQ(r.status, ParseStatus::kDone);
  EXPECT_EQ(p.target(), "/a");
  std::string rest = two.substr(r.head_size);
  ASSERT_EQ(parse_both(p, rest).status, ParseStatus::kDone);
  EXPECT_EQ(p.target(), "/b");
  EXPECT_EQ(p.field_count(), 0u);
}

TEST(HeadParser, TargetsMayHoldAnyVisibleByte) {
  HeadParser p(Kind::kRequest);
  ASSERT_EQ(parse_both(p, "OPTIONS * HTTP/1.1\r\n\r\n").status, ParseStatus::kDone);
  EXPECT_EQ(p.target(), "*");
  ASSERT_EQ(parse_both(p, "GET /a%20b?q=\"x\"&r=\xff HTTP/1.0\r\n\r\n").status, ParseStatus::kDone);
  EXPECT_EQ(p.target(), "/a%20b?q=\"x\"&r=\xff");
  EXPECT_EQ(p.version(), 10u);
}

TEST(HeadParser, ViewsFollowRebase) {
  HeadParser p(Kind::kRequest);
  std::string a = "GET /x HTTP/1.1\r\nName: value\r\n\r\n";
  ASSERT_EQ(parse_both(p, a).status, ParseStatus::kDone);
  std::string b = a;  // the same bytes elsewhere (a buffer that grew)
  a.assign(a.size(), '?');
  p.rebase(b.data());
  EXPECT_EQ(p.target(), "/x");
  EXPECT_EQ(p.find("name"), "value");
}

// ---- requests: bad ----

TEST(HeadParser, LinesMustEndWithCrlf) {
  expect_request_error("GET / HTTP/1.1\nHost: x\n\n", ParseError::kBadLineEnding);
  expect_request_error("GET / HTTP/1.1\r\nHost: x\n\r\n", ParseError::kBadLineEnding);
  expect_request_error("GET / HTTP/1.1\r\nHost: x\r\n\n", ParseError::kBadLineEnding);
  expect_request_error("GET / HTTP/1.1\r\n\n", ParseError::kBadLineEnding);
  expect_request_error("GET / HTTP/1.1\r\nA: a\rb\r\n\r\n", ParseError::kBadFieldValue);
  expect_request_error("GET / HTTP/1.1\r\nA: a\r\r\n\r\n", ParseError::kBadFieldValue);
  expect_request_error("\r\nGET / HTTP/1.1\r\n\r\n", ParseError::kBadMethod);
  expect_request_error("\nGET / HTTP/1.1\r\n\r\n", ParseError::kBadLineEnding);
}

TEST(HeadParser, RequestLineRules) {
  expect_request_error(" / HTTP/1.1\r\n\r\n", ParseError::kBadMethod);
  expect_request_error("GE(T / HTTP/1.1\r\n\r\n", ParseError::kBadMethod);
  expect_request_error("GET\t/ HTTP/1.1\r\n\r\n", ParseError::kBadMethod);
  expect_request_error("GET\r\n\r\n", ParseError::kBadMethod);
  expect_request_error("GARBAGE\r\n\r\n", ParseError::kBadMethod);
  expect_request_error("GET  HTTP/1.1\r\n\r\n", ParseError::kBadTarget);
  expect_request_error("GET  / HTTP/1.1\r\n\r\n", ParseError::kBadTarget);
  expect_request_error("GET /a\x01z HTTP/1.1\r\n\r\n", ParseError::kBadTarget);
  expect_request_error("GET /a\x7fz HTTP/1.1\r\n\r\n", ParseError::kBadTarget);
  expect_request_error("GET /a\tb HTTP/1.1\r\n\r\n", ParseError::kBadTarget);
  expect_request_error("GET /\r\n\r\n", ParseError::kBadTarget);
  expect_request_error("GET / HTTP/2.0\r\n\r\n", ParseError::kBadVersion);
  expect_request_error("GET / HTTP/1.2\r\n\r\n", ParseError::kBadVersion);
  expect_request_error("GET / HTTP/9.9\r\n\r\n", ParseError::kBadVersion);
  expect_request_error("GET / http/1.1\r\n\r\n", ParseError::kBadVersion);
  expect_request_error("GET / HTTP/1.1 \r\n\r\n", ParseError::kBadVersion);
  expect_request_error("GET / HTTP/1.\r\n\r\n", ParseError::kBadVersion);
  expect_request_error("GET / / HTTP/1.1\r\n\r\n", ParseError::kBadVersion);
}

TEST(HeadParser, FieldRules) {
  expect_request_error("GET / HTTP/1.1\r\n: x\r\n\r\n", ParseError::kBadFieldName);
  expect_request_error("GET / HTTP/1.1\r\nHost : x\r\n\r\n", ParseError::kBadFieldName);
  expect_request_error("GET / HTTP/1.1\r\nHost\t: x\r\n\r\n", ParseError::kBadFieldName);
  expect_request_error("GET / HTTP/1.1\r\nX@Y: x\r\n\r\n", ParseError::kBadFieldName);
  expect_request_error("GET / HTTP/1.1\r\nNoColon\r\n\r\n", ParseError::kBadFieldName);
  expect_request_error("GET / HTTP/1.1\r\nX\xc3\xa9: x\r\n\r\n", ParseError::kBadFieldName);
  expect_request_error("GET / HTTP/1.1\r\nX-A: a\0b\r\n\r\n"sv, ParseError::kBadFieldValue);
  expect_request_error("GET / HTTP/1.1\r\nX-A: a\x7f\r\n\r\n", ParseError::kBadFieldValue);
  expect_request_error("GET / HTTP/1.1\r\nX-A: a\x1b[31m\r\n\r\n", ParseError::kBadFieldValue);
  // A long value with the bad byte past the first eight-byte words.
  expect_request_error(
      "GET / HTTP/1.1\r\nX-A: " + std::string(40, 'v') + "\x01" + std::string(40, 'v') + "\r\n\r\n",
      ParseError::kBadFieldValue);
  expect_request_error("GET / HTTP/1.1\r\nX-A: a\r\n b\r\n\r\n", ParseError::kObsFold);
  expect_request_error("GET / HTTP/1.1\r\nX-A: a\r\n\tb\r\n\r\n", ParseError::kObsFold);
  expect_request_error("GET / HTTP/1.1\r\n Host: x\r\n\r\n", ParseError::kObsFold);
  expect_request_error("GET / HTTP/1.1\r\nConnection: close;x\r\n\r\n", ParseError::kBadConnection);
  expect_request_error("GET / HTTP/1.1\r\nConnection: keep alive\r\n\r\n",
                       ParseError::kBadConnection);
}

TEST(HeadParser, AmbiguousLengthsAreRefused) {
  const std::string post = "POST / HTTP/1.1\r\nHost: x\r\n";
  expect_request_error(post + "Content-Length: 5\r\nContent-Length: 6\r\n\r\n",
                       ParseError::kConflictingLength);
  expect_request_error(post + "Content-Length: 5, 6\r\n\r\n", ParseError::kBadContentLength);
  expect_request_error(post + "Content-Length: 5, 5\r\n\r\n", ParseError::kBadContentLength);
  expect_request_error(post + "Content-Length: -1\r\n\r\n", ParseError::kBadContentLength);
  expect_request_error(post + "Content-Length: +5\r\n\r\n", ParseError::kBadContentLength);
  expect_request_error(post + "Content-Length: 0x5\r\n\r\n", ParseError::kBadContentLength);
  expect_request_error(post + "Content-Length: 5 5\r\n\r\n", ParseError::kBadContentLength);
  expect_request_error(post + "Content-Length:\r\n\r\n", ParseError::kBadContentLength);
  expect_request_error(post + "Content-Length: 18446744073709551616\r\n\r\n",
                       ParseError::kBadContentLength);
  expect_request_error(post + "Content-Length: 99999999999999999999999\r\n\r\n",
                       ParseError::kBadContentLength);
  expect_request_error(post + "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
                       ParseError::kLengthWithEncoding);
  expect_request_error(post + "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
                       ParseError::kLengthWithEncoding);
  expect_request_error(post + "Transfer-Encoding: gzip\r\n\r\n", ParseError::kBadTransferEncoding);
  expect_request_error(post + "Transfer-Encoding: gzip, chunked\r\n\r\n",
                       ParseError::kBadTransferEncoding);
  expect_request_error(post + "Transfer-Encoding: chunked, chunked\r\n\r\n",
                       ParseError::kBadTransferEncoding);
  expect_request_error(post + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
                       ParseError::kBadTransferEncoding);
  expect_request_error(post + "Transfer-Encoding:\r\n\r\n", ParseError::kBadTransferEncoding);
  expect_request_error(post + "Transfer-Encoding: chunked;q=1\r\n\r\n",
                       ParseError::kBadTransferEncoding);
}

TEST(HeadParser, TheHeadMustEndWithinTheLimit) {
  std::string head = "GET / HTTP/1.1\r\nX: " + std::string(100, 'a') + "\r\n\r\n";
  HeadParser p(Kind::kRequest);
  EXPECT_EQ(parse_both(p, head, head.size()).status, ParseStatus::kDone);
  HeadResult r = parse_both(p, head, head.size() - 1);
  EXPECT_EQ(r.status, ParseStatus::kError);
  EXPECT_EQ(r.error, ParseError::kHeaderLimit);
  // Fewer bytes than the limit and no end yet: more are needed.
  EXPECT_EQ(parse_both(p, head.substr(0, 50), 100).status, ParseStatus::kNeedMore);
  // A line longer than the limit, fed in pieces.
  std::string longline = "GET /" + std::string(20000, 'a') + " HTTP/1.1\r\n\r\n";
  r = parse_both(p, longline, 8192);
  EXPECT_EQ(r.error, ParseError::kHeaderLimit);
}

// ---- responses ----

TEST(HeadParser, ParsesResponsesAndTheirFraming) {
  HeadParser p(Kind::kResponse);
  ASSERT_EQ(parse_both(p, "HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n").status,
            ParseStatus::kDone);
  EXPECT_EQ(p.status(), 200);
  EXPECT_EQ(p.framing(), BodyFraming::kLength);
  EXPECT_EQ(p.content_length(), 12u);
  EXPECT_TRUE(p.keep_alive());
  EXPECT_EQ(p.framing(true), BodyFraming::kNone);  // the answer to HEAD

  ASSERT_EQ(parse_both(p, "HTTP/1.1 200 \r\nTransfer-Encoding: gzip,chunked\r\n\r\n").status,
            ParseStatus::kDone);
  EXPECT_EQ(p.framing(), BodyFraming::kChunked);
  ASSERT_EQ(parse_both(p,
                       "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: "
                       "chunked\r\n\r\n")
                .status,
            ParseStatus::kDone);
  EXPECT_EQ(p.framing(), BodyFraming::kChunked);
  ASSERT_EQ(parse_both(p, "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n").status,
            ParseStatus::kDone);
  EXPECT_EQ(p.framing(), BodyFraming::kUntilClose);
  EXPECT_FALSE(p.keep_alive());

  ASSERT_EQ(parse_both(p, "HTTP/1.1 200 OK\r\nServer: x\r\n\r\n").status, ParseStatus::kDone);
  EXPECT_EQ(p.framing(), BodyFraming::kUntilClose);
  EXPECT_FALSE(p.keep_alive());

  for (const char* none : {"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n",
                           "HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n",
                           "HTTP/1.1 100 Continue\r\n\r\n", "HTTP/1.1 103 Early Hints\r\n\r\n"}) {
    ASSERT_EQ(parse_both(p, none).status, ParseStatus::kDone) << none;
    EXPECT_EQ(p.framing(), BodyFraming::kNone) << none;
    EXPECT_TRUE(p.keep_alive()) << none;
  }
  ASSERT_EQ(parse_both(p, "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n").status,
            ParseStatus::kDone);
  EXPECT_EQ(p.version(), 10u);
  EXPECT_FALSE(p.keep_alive());
  ASSERT_EQ(parse_both(p, "HTTP/1.0 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\n")
                .status,
            ParseStatus::kDone);
  EXPECT_TRUE(p.keep_alive());
  ASSERT_EQ(parse_both(p, "HTTP/1.1 599 \xe2\x9c\x93 ok\tfine\r\nContent-Length: 0\r\n\r\n").status,
            ParseStatus::kDone);
  EXPECT_EQ(p.status(), 599);
  EXPECT_EQ(p.framing(), BodyFraming::kNone);
}

TEST(HeadParser, BadResponses) {
  expect_response_error("HTTP/1.1 200\r\n\r\n", ParseError::kBadStatus);
  expect_response_error("HTTP/1.1 20 OK\r\n\r\n", ParseError::kBadStatus);
  expect_response_error("HTTP/1.1 2000 OK\r\n\r\n", ParseError::kBadStatus);
  expect_response_error("HTTP/1.1 099 Low\r\n\r\n", ParseError::kBadStatus);
  expect_response_error("HTTP/1.1 2x0 OK\r\n\r\n", ParseError::kBadStatus);
  expect_response_error("HTTP/1.1  200 OK\r\n\r\n", ParseError::kBadStatus);
  expect_response_error("HTTP/2 200 OK\r\n\r\n", ParseError::kBadVersion);
  expect_response_error("HTTP/1.1200 OK\r\n\r\n", ParseError::kBadVersion);
  expect_response_error("ICY 200 OK\r\n\r\n", ParseError::kBadVersion);
  expect_response_error("HTTP/1.1 200 O\x01K\r\n\r\n", ParseError::kBadReason);
  expect_response_error("HTTP/1.1 200 OK\nContent-Length: 0\n\n", ParseError::kBadLineEnding);
  expect_response_error("HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
                        ParseError::kConflictingLength);
  expect_response_error(
      "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
      ParseError::kLengthWithEncoding);
  expect_response_error("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
                        ParseError::kBadTransferEncoding);
  expect_response_error(
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
      ParseError::kBadTransferEncoding);
  expect_response_error("HTTP/1.1 200 OK\r\nTransfer-Encoding: ,\r\n\r\n",
                        ParseError::kBadTransferEncoding);
  expect_response_error("HTTP/1.1 200 OK\r\nTransfer-Encoding: a b\r\n\r\n",
                        ParseError::kBadTransferEncoding);
  expect_response_error("HTTP/1.1 200 OK\r\nX: a\r\n b\r\n\r\n", ParseError::kObsFold);
}

// ---- chunked bodies ----

struct Decoded {
  ParseStatus status = ParseStatus::kNeedMore;
  ParseError error = ParseError::kNone;
  std::string data;
  size_t left = 0;  // input bytes not consumed
};

// Feeds `in` to a decoder `piece` bytes at a time, taking data in pieces of at most `room` bytes,
// as a connection's buffer would: unused bytes stay and the next piece is appended to them.
Decoded decode(std::string_view in, size_t piece, size_t room, uint64_t limit = UINT64_MAX) {
  ChunkedDecoder dec(limit);
  Decoded out;
  std::string pending;
  size_t fed = 0;
  for (;;) {
    size_t used = 0;
    std::string_view data;
    out.status = dec.decode(pending.data(), pending.size(), room, used, data);
    out.data.append(data);
    pending.erase(0, used);
    if (out.status != ParseStatus::kNeedMore) break;
    if (used == 0) {
      if (fed == in.size()) break;
      size_t n = std::min(piece, in.size() - fed);
      pending.append(in.substr(fed, n));
      fed += n;
    }
  }
  out.error = dec.error();
  out.left = pending.size() + (in.size() - fed);
  return out;
}

// Every way of feeding must give the same result.
Decoded decode_all_ways(std::string_view in, uint64_t limit = UINT64_MAX) {
  Decoded whole = decode(in, in.size() + 1, SIZE_MAX, limit);
  for (size_t piece : {size_t{1}, size_t{2}, size_t{3}, size_t{7}}) {
    for (size_t room : {size_t{1}, size_t{4}, SIZE_MAX}) {
      Decoded d = decode(in, piece, room, limit);
      EXPECT_EQ(static_cast<int>(d.status), static_cast<int>(whole.status))
          << in << " piece " << piece << " room " << room;
      EXPECT_EQ(static_cast<int>(d.error), static_cast<int>(whole.error)) << in;
      EXPECT_EQ(d.data, whole.data) << in;
      if (whole.status == ParseStatus::kDone) {
        EXPECT_EQ(d.left, whole.left) << in;
      }
    }
  }
  return whole;
}

TEST(ChunkedDecoder, DecodesChunksExtensionsAndTrailers) {
  Decoded d = decode_all_ways("5\r\nhello\r\n0\r\n\r\n");
  EXPECT_EQ(d.status, ParseStatus::kDone);
  EXPECT_EQ(d.data, "hello");
  EXPECT_EQ(d.left, 0u);

  d = decode_all_ways("000A\r\n0123456789\r\n1;a=b\r\n!\r\n00\r\n\r\nGET / HTTP/1.1\r\n");
  EXPECT_EQ(d.status, ParseStatus::kDone);
  EXPECT_EQ(d.data, "0123456789!");
  EXPECT_EQ(d.left, 16u);  // the next request stays

  d = decode_all_ways(
      "3 ; name ; q=\"a \\\"quoted\\\" ;x\" ;t=tok\r\nabc\r\n0;last\r\nX-Trailer: v\r\n"
      "Other:\r\n\r\n");
  EXPECT_EQ(d.status, ParseStatus::kDone);
  EXPECT_EQ(d.data, "abc");

  d = decode_all_ways("ffffffffffffffff\r\nab");  // the largest size: fine, data follows
  EXPECT_EQ(d.status, ParseStatus::kNeedMore);
  EXPECT_EQ(d.data, "ab");

  d = decode_all_ways("4\r\nab");  // more is needed
  EXPECT_EQ(d.status, ParseStatus::kNeedMore);
  EXPECT_EQ(d.data, "ab");
}

TEST(ChunkedDecoder, RefusesWhatIsMalformed) {
  struct Case {
    const char* in;
    ParseError e;
  } cases[] = {
      {"zz\r\nhello\r\n0\r\n\r\n", ParseError::kBadChunkSize},
      {"\r\n", ParseError::kBadChunkSize},
      {"-5\r\nhello\r\n0\r\n\r\n", ParseError::kBadChunkSize},
      {" 5\r\nhello\r\n0\r\n\r\n", ParseError::kBadChunkSize},
      {"0x5\r\nhello\r\n0\r\n\r\n", ParseError::kBadChunkExtension},
      {"ffffffffffffffffffff\r\nx\r\n0\r\n\r\n", ParseError::kBadChunkSize},
      {"10000000000000000\r\nx\r\n", ParseError::kBadChunkSize},
      {"5\nhello\r\n0\r\n\r\n", ParseError::kBadLineEnding},
      {"5\r\nhello\n0\r\n\r\n", ParseError::kBadChunkEnd},
      {"5\r\nhelloX\r\n0\r\n\r\n", ParseError::kBadChunkEnd},
      {"5\r\nhello\rX0\r\n\r\n", ParseError::kBadChunkEnd},
      {"5 \r\nhello\r\n0\r\n\r\n", ParseError::kBadChunkExtension},
      {"5;\r\nhello\r\n0\r\n\r\n", ParseError::kBadChunkExtension},
      {"5;a=\r\nhello\r\n0\r\n\r\n", ParseError::kBadChunkExtension},
      {"5;a=b c\r\nhello\r\n0\r\n\r\n", ParseError::kBadChunkExtension},
      {"5;a=\"open\r\nhello\r\n0\r\n\r\n", ParseError::kBadChunkExtension},
      {"5;a\rb\r\nhello\r\n0\r\n\r\n", ParseError::kBadChunkExtension},
      {"5;a=\"x\x01\"\r\nhello\r\n0\r\n\r\n", ParseError::kBadChunkExtension},
      {"0\r\n bad: fold\r\n\r\n", ParseError::kBadTrailer},
      {"0\r\nNoColon\r\n\r\n", ParseError::kBadTrailer},
      {"0\r\nX: a\x01\r\n\r\n", ParseError::kBadTrailer},
      {"0\r\nX: a\n\r\n", ParseError::kBadTrailer},
  };
  for (const auto& c : cases) {
    Decoded d = decode_all_ways(c.in);
    EXPECT_EQ(d.status, ParseStatus::kError) << c.in;
    EXPECT_EQ(d.error, c.e) << c.in << " -> " << describe(d.error);
  }
}

TEST(ChunkedDecoder, LimitsTheBodyTheSizeLineAndTheTrailers) {
  Decoded d = decode_all_ways("5\r\nhello\r\n5\r\nworld\r\n0\r\n\r\n", 10);
  EXPECT_EQ(d.status, ParseStatus::kDone);
  d = decode_all_ways("5\r\nhello\r\n6\r\nworld!\r\n0\r\n\r\n", 10);
  EXPECT_EQ(d.status, ParseStatus::kError);
  EXPECT_EQ(d.error, ParseError::kBodyLimit);
  EXPECT_EQ(d.data, "hello");  // refused at the size line, before its data

  std::string ext = "5;" + std::string(ChunkedDecoder::kMaxLine, 'e') + "\r\nhello\r\n0\r\n\r\n";
  d = decode(ext, 1000, SIZE_MAX);
  EXPECT_EQ(d.status, ParseStatus::kError);
  EXPECT_EQ(d.error, ParseError::kBadChunkSize);

  std::string trailers = "0\r\n";
  while (trailers.size() < ChunkedDecoder::kMaxTrailers + 100) trailers += "X-T: abcdefgh\r\n";
  trailers += "\r\n";
  d = decode(trailers, 4096, SIZE_MAX);
  EXPECT_EQ(d.status, ParseStatus::kError);
  EXPECT_EQ(d.error, ParseError::kBadTrailer);
}

TEST(ParseError, EveryErrorIsDescribed) {
  for (int e = 0; e <= static_cast<int>(ParseError::kBadTrailer); ++e) {
    EXPECT_NE(describe(static_cast<ParseError>(e)), "unknown error") << e;
  }
}

// ---- the read buffer a head is parsed in ----

void put(ReadBuffer& b, std::string_view bytes) {
  auto space = b.prepare(bytes.size());
  ASSERT_GE(space.size(), bytes.size());
  std::memcpy(space.data(), bytes.data(), bytes.size());
  b.commit(bytes.size());
}

TEST(ReadBuffer, APinnedHeadStaysByOffsetWhileMoreIsRead) {
  ReadBuffer b;
  b.reserve(32);
  put(b, "HEAD|body1");
  b.pin(5);  // "HEAD|" is a parsed head: it stays
  b.consume(5);
  EXPECT_EQ(std::string_view(b.data(), b.size()), "body1");
  b.consume(3);
  put(b, std::string(100, 'x'));  // more than fits: grows, keeping offsets
  EXPECT_GE(b.capacity(), 107u);
  EXPECT_EQ(std::string_view(b.base(), 5), "HEAD|");
  EXPECT_EQ(std::string_view(b.data(), 2), "y1");
  b.consume(b.size());  // all read: the next read goes right after the head
  EXPECT_EQ(b.data(), b.base() + 5);
  put(b, "tail");
  b.consume(2);
  auto space = b.prepare(b.capacity() - 5);  // moves "il" down to the pin, not over the head
  EXPECT_GE(space.size(), b.capacity() - 7);
  EXPECT_EQ(std::string_view(b.base(), 7), "HEAD|il");
  b.release();  // pinned: kept
  EXPECT_NE(b.base(), nullptr);
  b.restart();  // the next message: what is left moves to the start
  EXPECT_EQ(std::string_view(b.base(), b.size()), "il");
  b.consume(2);
  b.release();
  EXPECT_EQ(b.capacity(), 0u);
}

TEST(ReadBuffer, ViewsOfAPinnedHeadSurviveTheBlockGrowing) {
  // The gateway holds a worker's header views while it reads the body (the prompt-logprobs merge
  // writes its answer only after read_all): growing must not free the block they point into.
  ReadBuffer b;
  b.reserve(16);
  put(b, "Name: value|");
  b.pin(12);
  b.consume(12);
  std::string_view held(b.base() + 6, 5);  // a field's value, as HeadParser::find gives it
  for (int i = 0; i < 6; ++i) put(b, std::string(1000, 'b'));  // grows several times
  EXPECT_EQ(held, "value");  // (ASan: a read of freed memory if the old block were gone)
  EXPECT_EQ(std::string_view(b.base() + 6, 5), "value");
  b.consume(b.size());
  b.restart();  // the next message: the old blocks go now
  put(b, "next");
  EXPECT_EQ(std::string_view(b.data(), b.size()), "next");
}

}  // namespace
}  // namespace kvgate::http
