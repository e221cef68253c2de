// Tests for sim/pseudo_text: deterministic, prompt-seeded word tokens that re-tokenize exactly.
#include "sim/pseudo_text.h"

#include <gtest/gtest.h>

#include <set>

#include "sim/words.h"

namespace kvgate::sim {
namespace {

class SimPseudoText : public ::testing::Test {
 protected:
  std::vector<int32_t> prompt(std::string_view text) {
    std::vector<int32_t> ids;
    tok.encode(text, ids);
    return ids;
  }
  std::string text(const std::vector<int32_t>& ids) {
    std::string s;
    tok.decode(ids, s);
    return s;
  }
  StandInTokenizer tok;
  PseudoText model{tok};
};

TEST_F(SimPseudoText, UsesEveryWord) {
  EXPECT_EQ(model.word_count(), kWords.size());
}

TEST_F(SimPseudoText, SamePromptAndSeedGiveTheSameText) {
  auto p = prompt("The capital of France is");
  EXPECT_EQ(model.generate(p, 0, 50), model.generate(p, 0, 50));
  EXPECT_NE(model.generate(p, 0, 50), model.generate(p, 1, 50));
  EXPECT_NE(model.generate(p, 0, 50), model.generate(prompt("The capital of Spain is"), 0, 50));
}

TEST_F(SimPseudoText, ALongerGenerationExtendsAShorterOne) {
  auto p = prompt("hello");
  auto short_ids = model.generate(p, 3, 10);
  auto long_ids = model.generate(p, 3, 40);
  ASSERT_EQ(long_ids.size(), 40u);
  EXPECT_TRUE(std::equal(short_ids.begin(), short_ids.end(), long_ids.begin()));
}

TEST_F(SimPseudoText, OneWordPerTokenAndTheTextReTokenizesToTheSameIds) {
  auto ids = model.generate(prompt("Tell me a story."), 0, 200);
  std::string t = text(ids);
  EXPECT_EQ(t.front(), ' ');  // continues a prompt that ends mid-line
  std::vector<int32_t> again;
  tok.encode(t, again);
  EXPECT_EQ(again, ids);
  std::set<int32_t> distinct(ids.begin(), ids.end());
  EXPECT_GT(distinct.size(), 50u);  // looks like text, not one repeated word
}

TEST_F(SimPseudoText, AfterANewlineTheFirstWordHasNoSpace) {
  auto ids = model.generate(prompt("<|im_start|>assistant\n"), 0, 5);
  std::string t = text(ids);
  ASSERT_FALSE(t.empty());
  EXPECT_NE(t.front(), ' ');
  EXPECT_NE(t.find(' '), std::string::npos);
  // In a follow-up chat turn the reply re-tokenizes exactly after the template's newline.
  std::vector<int32_t> turn = prompt("<|im_start|>assistant\n" + t);
  auto head = prompt("<|im_start|>assistant\n");
  EXPECT_EQ(
      std::vector<int32_t>(turn.begin() + static_cast<std::ptrdiff_t>(head.size()), turn.end()),
      ids);
}

TEST_F(SimPseudoText, PromptHashDependsOnOrderAndSeed) {
  std::vector<int32_t> a = {1, 2, 3}, b = {3, 2, 1};
  EXPECT_NE(PseudoText::prompt_hash(a, 0), PseudoText::prompt_hash(b, 0));
  EXPECT_NE(PseudoText::prompt_hash(a, 0), PseudoText::prompt_hash(a, 1));
  EXPECT_EQ(PseudoText::prompt_hash(a, 5), PseudoText::prompt_hash(a, 5));
}

}  // namespace
}  // namespace kvgate::sim
