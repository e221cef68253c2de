// Tests for sim/tokenizer (the byte-level stand-in and the model's tokenizer behind the same
// interface), sim/words and sim/chat_template.
#include "sim/tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "sim/chat_template.h"
#include "sim/words.h"
#include "support/models.h"

namespace kvgate::sim {
namespace {

std::vector<int32_t> enc(const Tokenizer& t, std::string_view s) {
  std::vector<int32_t> ids;
  t.encode(s, ids);
  return ids;
}

std::string dec(const Tokenizer& t, const std::vector<int32_t>& ids) {
  std::string s;
  t.decode(ids, s);
  return s;
}

TEST(SimTokenizer, WordListIsUniqueLowercaseLetters) {
  std::set<std::string_view> seen;
  for (auto w : kWords) {
    EXPECT_TRUE(seen.insert(w).second) << "duplicate word " << w;
    ASSERT_FALSE(w.empty());
    for (char c : w) EXPECT_TRUE(c >= 'a' && c <= 'z') << w;
  }
}

TEST(SimTokenizer, EveryWordIsOneTokenWithAndWithoutASpace) {
  StandInTokenizer t;
  std::set<int32_t> ids;
  for (auto w : kWords) {
    auto bare = enc(t, w);
    auto spaced = enc(t, " " + std::string(w));
    ASSERT_EQ(bare.size(), 1u) << w;
    ASSERT_EQ(spaced.size(), 1u) << w;
    EXPECT_NE(bare[0], spaced[0]);
    EXPECT_TRUE(ids.insert(bare[0]).second && ids.insert(spaced[0]).second);
    EXPECT_EQ(dec(t, spaced), " " + std::string(w));
  }
  EXPECT_EQ(t.vocab_size(), StandInTokenizer::kFirstWord + 2 * static_cast<int32_t>(kWords.size()));
}

TEST(SimTokenizer, OtherTextIsBytes) {
  StandInTokenizer t;
  // "Hello" is not a listed word (capital H): five bytes; " world" is one word token.
  auto ids = enc(t, "Hello world");
  ASSERT_EQ(ids.size(), 6u);
  EXPECT_EQ(ids[0], 'H');
  EXPECT_GE(ids[5], StandInTokenizer::kFirstWord);
  // A listed word glued to other letters is not a word token.
  EXPECT_EQ(enc(t, "thecat").size(), 6u);
  EXPECT_EQ(enc(t, "theory").size(), 6u);   // not "the" + bytes: a word token needs the whole run
  EXPECT_EQ(enc(t, "the,cat").size(), 5u);  // the , c a t
}

TEST(SimTokenizer, SpecialTokensAreSingleIds) {
  StandInTokenizer t;
  auto ids = enc(t, "<|im_start|>user\nhi<|im_end|>");
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids.front(), StandInTokenizer::kImStart);
  EXPECT_EQ(ids.back(), StandInTokenizer::kImEnd);
  EXPECT_EQ(t.eos_token_id(), StandInTokenizer::kImEnd);
  EXPECT_TRUE(t.is_special(StandInTokenizer::kEndOfText));
  EXPECT_FALSE(t.is_special('a'));
  EXPECT_EQ(enc(t, "<|nope|>").size(), 8u);
}

TEST(SimTokenizer, DecodeOfEncodeIsIdentity) {
  StandInTokenizer t;
  for (const std::string& s :
       std::vector<std::string>{"", " ", "the quick brown fox", "Ünïcödé ✓ text\n\twith tabs",
                                "<|im_start|>system\nYou are the model.<|im_end|>\n", "a  b   c",
                                "question?answer!the", std::string("\0\xff\x80", 3)}) {
    EXPECT_EQ(dec(t, enc(t, s)), s);
  }
  std::string out;
  t.decode_token(-1, out);
  t.decode_token(t.vocab_size(), out);
  EXPECT_EQ(out, "");
}

// What /tokenize and /detokenize use: the stand-in adds no special tokens; detokenize leaves its
// special tokens out on request and repairs the UTF-8 a cut byte sequence leaves.
TEST(SimTokenizer, StandInTokenizeAndDetokenize) {
  StandInTokenizer t;
  const std::string text = "<|im_start|>user\nhi ✓<|im_end|>";
  for (bool add : {true, false}) {
    std::vector<int32_t> ids;
    t.tokenize(text, add, ids);
    EXPECT_EQ(ids, enc(t, text));
  }
  auto ids = enc(t, text);
  EXPECT_EQ(t.detokenize(ids, false), text);
  EXPECT_EQ(t.detokenize(ids, true), "user\nhi ✓");
  EXPECT_EQ(t.detokenize(std::vector<int32_t>{'a', 0xe2, 0x9c, 'b', -5, t.vocab_size()}, true),
            "a\xef\xbf\xbd"
            "b");  // the cut "✓": one U+FFFD; ids outside the vocabulary: nothing
}

using testing::models_dir;

TEST(SimTokenizer, FactoryPicksTheStandInOrTheModelTokenizer) {
  std::string note, error;
  auto t = make_tokenizer("", note, error);
  ASSERT_TRUE(t);
  EXPECT_TRUE(note.empty());
  EXPECT_EQ(t->name(), "byte-level stand-in");
  EXPECT_FALSE(make_tokenizer("/nonexistent/model", note, error));
  EXPECT_NE(error.find("/nonexistent/model"), std::string::npos) << error;
}

TEST(SimTokenizer, ModelTokenizerBehindTheInterface) {
  KVGATE_REQUIRE_MODEL("qwen3");
  std::string dir = models_dir() + "/qwen3";
  std::string note, error;
  auto t = make_tokenizer(dir, note, error);
  ASSERT_TRUE(t) << error;
  EXPECT_NE(note.find("tokenizer.json"), std::string::npos);
  EXPECT_EQ(enc(*t, "Hello world"), (std::vector<int32_t>{9707, 1879}));
  auto ids = enc(*t, "<|im_start|>user\n你好 😀<|im_end|>");
  EXPECT_EQ(ids.front(), 151644);
  EXPECT_EQ(t->eos_token_id(), 151645);
  EXPECT_TRUE(t->is_special(151644));
  // Token by token, the bytes concatenate back to the text (multi-byte characters included).
  EXPECT_EQ(dec(*t, ids), "<|im_start|>user\n你好 😀<|im_end|>");
  EXPECT_GE(t->vocab_size(), 151669);
  // Qwen3's post-processor adds nothing; detokenize is HF's decode.
  std::vector<int32_t> with;
  t->tokenize("Hello world", true, with);
  EXPECT_EQ(with, enc(*t, "Hello world"));
  EXPECT_EQ(t->detokenize(ids, false), "<|im_start|>user\n你好 😀<|im_end|>");
  EXPECT_EQ(t->detokenize(ids, true), "user\n你好 😀");

  auto tmpl = make_chat_template(dir);
  std::vector<ChatMessage> msgs = {{"system", "Be brief."}, {"user", "Hi"}};
  std::string out;
  tmpl->render(msgs, true, out);
  EXPECT_EQ(out,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(tmpl->name(), "model chat template");
}

TEST(SimChatTemplate, Llama3TemplateAndFallback) {
  KVGATE_REQUIRE_MODEL("llama3", "tokenizer_config.json");
  std::string dir = models_dir() + "/llama3";
  auto tmpl = make_chat_template(dir);
  std::vector<ChatMessage> msgs = {{"user", "  Hi  "}};
  std::string out;
  tmpl->render(msgs, true, out);
  EXPECT_EQ(out,
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(make_chat_template("")->name(), "chatml stand-in");
  EXPECT_EQ(make_chat_template("/nonexistent")->name(), "chatml stand-in");
}

TEST(SimChatTemplate, RendersChatMl) {
  ChatMLTemplate tmpl;
  std::vector<ChatMessage> msgs = {{"system", "Be brief."}, {"user", "Hi"}};
  std::string out;
  tmpl.render(msgs, true, out);
  EXPECT_EQ(out,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n");
  out.clear();
  tmpl.render(msgs, false, out);
  EXPECT_FALSE(out.ends_with("assistant\n"));
}

}  // namespace
}  // namespace kvgate::sim
