// Tokenizer parity: the probe, and the verdict from the stores an engine publishes for it.
#include "policy/kv_parity.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "support/models.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace kvgate::kv_parity {
namespace {

constexpr size_t kPage = 16;

struct Qwen3 {
  Qwen3() {
    std::string err;
    tok = tokenizer::Tokenizer::load(testing::models_dir() + "/qwen3", err);
    tmpl = tokenizer::ChatTemplate::load(testing::models_dir() + "/qwen3", err);
  }
  std::unique_ptr<tokenizer::Tokenizer> tok;
  std::unique_ptr<tokenizer::ChatTemplate> tmpl;
};

// The stores an engine with these ids would publish for them: merged (one event), or one event
// per page chained by parent ids, starting under the root or after `cached` pages it held.
std::vector<Stored> stores(const std::vector<int32_t>& ids, bool per_page, size_t cached = 0) {
  std::vector<Stored> out;
  size_t pages = ids.size() / kPage;
  std::optional<uint64_t> parent;
  if (cached > 0) parent = 1000 + cached - 1;
  for (size_t p = cached; p < pages; ++p) {
    if (per_page || out.empty()) {
      Stored s;
      s.root = !parent;
      s.parent = parent;
      out.push_back(s);
    }
    Stored& s = out.back();
    s.hashes.push_back(1000 + p);
    s.tokens.insert(s.tokens.end(), ids.begin() + static_cast<long>(p * kPage),
                    ids.begin() + static_cast<long>((p + 1) * kPage));
    parent = 1000 + p;
  }
  return out;
}

TEST(KvParity, TheProbeIsUniqueLongEnoughAndPinsTheRank) {
  KVGATE_REQUIRE_MODEL("qwen3");
  Qwen3 m;
  ASSERT_TRUE(m.tok && m.tmpl);
  Probe a, b;
  std::string err;
  ASSERT_TRUE(make_probe(*m.tok, *m.tmpl, kPage, 1, 1, a, err)) << err;
  ASSERT_TRUE(make_probe(*m.tok, *m.tmpl, kPage, 2, -1, b, err)) << err;
  EXPECT_NE(a.nonce, b.nonce);
  EXPECT_GE(a.ids.size(), 4 * kPage);
  EXPECT_NE(a.body.find("\"routed_dp_rank\":1"), std::string::npos) << a.body;
  EXPECT_EQ(b.body.find("routed_dp_rank"), std::string::npos) << b.body;
  EXPECT_NE(a.body.find("\"max_tokens\":1"), std::string::npos);
  // The nonce sits in the first page after the template's start: the probe's chain is its own.
  std::string first = m.tok->decode(std::span<const int32_t>(a.ids.data(), 2 * kPage));
  EXPECT_NE(first.find(a.nonce.substr(0, 8)), std::string::npos) << first;
  Probe big;
  ASSERT_TRUE(make_probe(*m.tok, *m.tmpl, 256, 3, -1, big, err)) << err;
  EXPECT_GE(big.ids.size(), 4 * 256u);
}

TEST(KvParity, AllPagesInTheInventoryIsAMatch) {
  KVGATE_REQUIRE_MODEL("qwen3");
  Qwen3 m;
  Probe p;
  std::string err;
  ASSERT_TRUE(make_probe(*m.tok, *m.tmpl, kPage, 7, -1, p, err)) << err;
  Verdict v = judge(p, kPage, p.ids.size() / kPage, {}, *m.tok);
  EXPECT_EQ(v.kind, Verdict::kMatch) << v.detail;
}

TEST(KvParity, TheSameIdsInEventsAreAMatchMergedOrPerPage) {
  KVGATE_REQUIRE_MODEL("qwen3");
  Qwen3 m;
  Probe p;
  std::string err;
  ASSERT_TRUE(make_probe(*m.tok, *m.tmpl, kPage, 7, -1, p, err)) << err;
  for (bool per_page : {false, true}) {
    auto s = stores(p.ids, per_page);
    Verdict v = judge(p, kPage, 0, s, *m.tok);
    EXPECT_EQ(v.kind, Verdict::kMatch) << v.detail;
  }
}

TEST(KvParity, AnotherTemplateStartIsNamedAtItsFirstDifferingToken) {
  KVGATE_REQUIRE_MODEL("qwen3");
  Qwen3 m;
  Probe p;
  std::string err;
  ASSERT_TRUE(make_probe(*m.tok, *m.tmpl, kPage, 9, -1, p, err)) << err;
  // The engine renders a system message first: "<|im_start|>system\n..." instead of "user".
  std::vector<int32_t> theirs = m.tok->encode("<|im_start|>system\nBe brief.<|im_end|>\n");
  theirs.insert(theirs.end(), p.ids.begin(), p.ids.end());
  for (bool per_page : {false, true}) {
    auto s = stores(theirs, per_page);
    Verdict v = judge(p, kPage, 0, s, *m.tok);
    ASSERT_EQ(v.kind, Verdict::kMismatch) << v.detail;
    EXPECT_EQ(v.position, 1u);
    EXPECT_EQ(v.ours, p.ids[1]);
    EXPECT_EQ(v.theirs, theirs[1]);
    EXPECT_NE(v.detail.find("at token 1 of the probe"), std::string::npos) << v.detail;
    EXPECT_NE(v.detail.find("'system'"), std::string::npos) << v.detail;
  }
}

TEST(KvParity, ABosTokenTheEngineAddsIsNamedAtTokenZero) {
  KVGATE_REQUIRE_MODEL("qwen3");
  Qwen3 m;
  Probe p;
  std::string err;
  ASSERT_TRUE(make_probe(*m.tok, *m.tmpl, kPage, 11, -1, p, err)) << err;
  std::vector<int32_t> theirs = {151643};  // <|endoftext|> as a BOS
  theirs.insert(theirs.end(), p.ids.begin(), p.ids.end());
  Verdict v = judge(p, kPage, 0, stores(theirs, false), *m.tok);
  ASSERT_EQ(v.kind, Verdict::kMismatch) << v.detail;
  EXPECT_EQ(v.position, 0u);
  EXPECT_NE(v.detail.find("BOS"), std::string::npos) << v.detail;
}

// A chain under a parent the engine had cached continues after the pages kvgate's keys matched.
TEST(KvParity, AStoreUnderACachedParentIsComparedFromWhereTheMatchEnded) {
  KVGATE_REQUIRE_MODEL("qwen3");
  Qwen3 m;
  Probe p;
  std::string err;
  ASSERT_TRUE(make_probe(*m.tok, *m.tmpl, kPage, 13, -1, p, err)) << err;
  // A template whose start (two pages: a default system prompt) the engine has cached already.
  std::vector<int32_t> system(2 * kPage, 9707);
  p.ids.insert(p.ids.begin(), system.begin(), system.end());
  std::vector<int32_t> theirs = p.ids;
  theirs[4 * kPage + 3] = 42;  // differs in the fifth page
  Verdict v = judge(p, kPage, 2, stores(theirs, true, 2), *m.tok);
  ASSERT_EQ(v.kind, Verdict::kMismatch) << v.detail;
  EXPECT_EQ(v.position, 4 * kPage + 3);
  EXPECT_EQ(v.theirs, 42);
}

// A kvgate that restarted in front of a warm engine does not know the shared start the probe's
// chain hangs under (matched_pages 0): the chain is placed at the page boundary where it agrees,
// never read as a difference at token 0.
TEST(KvParity, AChainUnderAPrefixKvgateNeverSawIsPlacedNotMisread) {
  KVGATE_REQUIRE_MODEL("qwen3");
  Qwen3 m;
  Probe p;
  std::string err;
  ASSERT_TRUE(make_probe(*m.tok, *m.tmpl, kPage, 17, -1, p, err)) << err;
  std::vector<int32_t> system(2 * kPage, 9707);
  p.ids.insert(p.ids.begin(), system.begin(), system.end());
  Verdict same = judge(p, kPage, 0, stores(p.ids, true, 2), *m.tok);
  EXPECT_EQ(same.kind, Verdict::kMatch) << same.detail;
  std::vector<int32_t> theirs = p.ids;
  theirs[5 * kPage + 5] = 42;  // past the nonce
  Verdict differ = judge(p, kPage, 0, stores(theirs, false, 2), *m.tok);
  ASSERT_EQ(differ.kind, Verdict::kMismatch) << differ.detail;
  EXPECT_EQ(differ.position, 5 * kPage + 5);
}

// The engine's chain stops before the probe's last full page (events missed): no verdict on
// what was not seen, whatever agreed.
TEST(KvParity, AChainEndingEarlyIsNoMatch) {
  KVGATE_REQUIRE_MODEL("qwen3");
  Qwen3 m;
  Probe p;
  std::string err;
  ASSERT_TRUE(make_probe(*m.tok, *m.tmpl, kPage, 19, -1, p, err)) << err;
  std::vector<int32_t> head(p.ids.begin(), p.ids.begin() + 2 * kPage);
  Verdict v = judge(p, kPage, 0, stores(head, false), *m.tok);
  EXPECT_EQ(v.kind, Verdict::kNotFound) << v.detail;
}

// An engine whose prompt before the probe's text is longer (a default system message it adds)
// lines up with kvgate's ids off a page boundary: a mismatch that says so, even when the
// engine's start was cached and kvgate never saw it.
TEST(KvParity, APromptStartOfAnotherLengthIsAMismatch) {
  KVGATE_REQUIRE_MODEL("qwen3");
  Qwen3 m;
  Probe p;
  std::string err;
  ASSERT_TRUE(make_probe(*m.tok, *m.tmpl, kPage, 21, -1, p, err)) << err;
  std::vector<int32_t> theirs(2 * kPage + 5, 9707);  // 37 tokens of their own start
  theirs.insert(theirs.end(), p.ids.begin(), p.ids.end());
  Verdict v = judge(p, kPage, 0, stores(theirs, true, 2), *m.tok);
  ASSERT_EQ(v.kind, Verdict::kMismatch) << v.detail;
  EXPECT_NE(v.detail.find("off a page boundary"), std::string::npos) << v.detail;
}

TEST(KvParity, TheRankFieldOfOlderBuilds) {
  KVGATE_REQUIRE_MODEL("qwen3");
  Qwen3 m;
  Probe p;
  std::string err;
  ASSERT_TRUE(make_probe(*m.tok, *m.tmpl, kPage, 23, 1, p, err, "data_parallel_rank")) << err;
  EXPECT_NE(p.body.find("\"data_parallel_rank\":1"), std::string::npos) << p.body;
  EXPECT_EQ(p.body.find("routed_dp_rank"), std::string::npos) << p.body;
}

TEST(KvParity, NoStoreCarryingTheProbeIsNotFound) {
  KVGATE_REQUIRE_MODEL("qwen3");
  Qwen3 m;
  Probe p;
  std::string err;
  ASSERT_TRUE(make_probe(*m.tok, *m.tmpl, kPage, 15, -1, p, err)) << err;
  std::vector<int32_t> other = m.tok->encode(std::string(400, 'x'));
  Verdict v = judge(p, kPage, 0, stores(other, false), *m.tok);
  EXPECT_EQ(v.kind, Verdict::kNotFound) << v.detail;
  EXPECT_NE(v.detail.find(p.nonce), std::string::npos);
  // A chain that loops back on itself (hostile ids) ends.
  auto loop = stores(p.ids, true);
  loop.front().parent = loop.back().hashes.back();
  loop.front().root = false;
  (void)judge(p, kPage, 0, loop, *m.tok);
}

}  // namespace
}  // namespace kvgate::kv_parity
