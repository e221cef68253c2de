// Tests for gateway/usage_scanner: cached_tokens / prompt_tokens read from relayed pieces.
#include "gateway/usage_scanner.h"

#include <gtest/gtest.h>

namespace kvgate {
namespace {

TEST(UsageScanner, WholeBodies) {
  UsageScanner s;
  s.feed(
      R"({"text":"x","meta_info":{"prompt_tokens":120,"cached_tokens":96,"completion_tokens":4}})");
  EXPECT_EQ(s.prompt_tokens(), 120);
  EXPECT_EQ(s.cached_tokens(), 96);
  UsageScanner o;
  o.feed(R"({"usage":{"prompt_tokens": 50, "prompt_tokens_details": {"cached_tokens": 32}}})");
  EXPECT_EQ(o.prompt_tokens(), 50);
  EXPECT_EQ(o.cached_tokens(), 32);
  UsageScanner n;
  n.feed(R"({"usage":{"prompt_tokens":7,"prompt_tokens_details":null}})");
  EXPECT_EQ(n.prompt_tokens(), 7);
  EXPECT_FALSE(n.cached_tokens());
}

TEST(UsageScanner, KeysAndNumbersSplitAcrossPieces) {
  std::string body = R"(data: {"meta_info":{"prompt_tokens":1234,"cached_tokens":5678}})";
  for (size_t cut = 1; cut < body.size(); ++cut) {
    UsageScanner s;
    s.feed(std::string_view(body).substr(0, cut));
    s.feed(std::string_view(body).substr(cut));
    EXPECT_EQ(s.prompt_tokens(), 1234) << cut;
    EXPECT_EQ(s.cached_tokens(), 5678) << cut;
  }
}

TEST(UsageScanner, LastValueWins) {
  UsageScanner s;
  s.feed("data: {\"meta_info\":{\"cached_tokens\":0}}\n\n");
  s.feed("data: {\"meta_info\":{\"cached_tokens\":64}}\n\n");
  EXPECT_EQ(s.cached_tokens(), 64);
}

}  // namespace
}  // namespace kvgate
