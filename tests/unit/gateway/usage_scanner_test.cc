// Tests for gateway/usage_scanner: cached_tokens / prompt_tokens read from relayed pieces.
#include "gateway/usage_scanner.h"

#include <gtest/gtest.h>

#include <optional>
#include <random>
#include <string>

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

// What the scanner must find, written the plain way: every full key, its number, the last wins.
std::optional<int64_t> last_value(const std::string& s, const std::string& key) {
  std::optional<int64_t> v;
  for (size_t p = s.find(key); p != std::string::npos; p = s.find(key, p + 1)) {
    size_t i = p + key.size();
    while (i < s.size() && s[i] == ' ') ++i;
    size_t start = i;
    int64_t n = 0;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9' && i - start < 18)
      n = n * 10 + (s[i++] - '0');
    if (i != start && i != s.size()) v = n;
  }
  return v;
}

TEST(UsageScanner, AgreesWithAPlainSearchOnRandomBodiesInRandomPieces) {
  std::mt19937 rng(7);
  const char* parts[] = {"\"cached_tokens\":",
                         "\"prompt_tokens\":",
                         "_tokens\":",
                         "\"cached",
                         "\"prompt",
                         "_",
                         " ",
                         "12",
                         "3",
                         "\"",
                         ",",
                         "x_tokens\":",
                         "{\"a\":1}"};
  for (int round = 0; round < 2000; ++round) {
    std::string body;
    int n = 1 + static_cast<int>(rng() % 12);
    for (int i = 0; i < n; ++i) body += parts[rng() % std::size(parts)];
    body += ",";  // a number at the very end is incomplete by design
    UsageScanner sc;
    for (size_t at = 0; at < body.size();) {
      size_t len = 1 + rng() % 9;
      sc.feed(std::string_view(body).substr(at, len));
      at += len;
    }
    EXPECT_EQ(sc.cached_tokens(), last_value(body, "\"cached_tokens\":")) << body;
    EXPECT_EQ(sc.prompt_tokens(), last_value(body, "\"prompt_tokens\":")) << body;
  }
}

}  // namespace
}  // namespace kvgate
