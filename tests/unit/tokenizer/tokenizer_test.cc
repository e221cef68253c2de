// Unit tests of tokenizer/tokenizer: the BPE pipeline on small hand-made tokenizer.json files
// (merge order, added tokens and their options, post-processors, decoders, invalid UTF-8),
// refusal of unsupported components, encode_prefix against the full encode, and the real model
// files scripts/setup fetches (spot ids, concurrency, pathological inputs: skipped without them;
// encode_prefix on five pipelines: fails without them). Full parity with HF is tests/conformance.
#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "support/models.h"
#include "tokenizer/chat_template.h"

namespace kvgate::tokenizer {
namespace {

using Ids = std::vector<int32_t>;

using testing::models_dir;

// A byte-level BPE over the GPT-2 alphabet: single bytes a b c (and space as "Ġ"), merges
// "a b" (rank 0) -> ab, "ab c" (rank 1) -> abc, "Ġ a" -> Ġa, "b c" (rank 3) -> bc.
std::string tiny_byte_level(const std::string& extra = "", const std::string& post = "null",
                            const std::string& added = "[]", bool ignore_merges = false) {
  return R"({"version":"1.0","truncation":null,"padding":null,"added_tokens":)" + added +
         R"(,"normalizer":null,
    "pre_tokenizer":{"type":"Sequence","pretokenizers":[
      {"type":"Split","pattern":{"Regex":" ?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+|\\s+"},"behavior":"Isolated","invert":false},
      {"type":"ByteLevel","add_prefix_space":false,"trim_offsets":false,"use_regex":false}]},
    "post_processor":)" +
         post + R"(,
    "decoder":{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":false,"use_regex":false},
    "model":{"type":"BPE","dropout":null,"unk_token":null,"continuing_subword_prefix":null,
      "end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,"ignore_merges":)" +
         (ignore_merges ? "true" : "false") + R"(,
      "vocab":{"a":0,"b":1,"c":2,"Ġ":3,"ab":4,"abc":5,"Ġa":6,"bc":7,"!":8,"1":9,"Ã":10,"©":11,"Ã©":12,"ï":13,"¿":14,"½":15,"cab":16)" +
         extra + R"(},
      "merges":["a b","ab c","Ġ a","b c","Ã ©"]}})";
}

std::unique_ptr<Tokenizer> make(const std::string& json, const std::string& config = "") {
  std::string err;
  auto t = Tokenizer::from_json(json, config, err);
  EXPECT_TRUE(t) << err;
  return t;
}

TEST(Tokenizer, MergesLowestRankFirst) {
  auto t = make(tiny_byte_level());
  ASSERT_TRUE(t);
  EXPECT_EQ(t->encode("abc"), (Ids{5}));          // a b -> ab, ab c -> abc
  EXPECT_EQ(t->encode("bc"), (Ids{7}));           // b c
  EXPECT_EQ(t->encode("cab"), (Ids{2, 4}));       // no merge makes "cab": c + ab
  EXPECT_EQ(t->encode("a abc"), (Ids{0, 3, 5}));  // "a b" (rank 0) beats "Ġ a" (rank 2)
  EXPECT_EQ(t->encode("é"), (Ids{12}));           // bytes C3 A9 -> Ã ©
  EXPECT_EQ(t->encode(""), Ids{});
}

TEST(Tokenizer, IgnoreMergesTakesWholeWordsFromTheVocab) {
  auto with = make(tiny_byte_level("", "null", "[]", true));
  auto without = make(tiny_byte_level());
  ASSERT_TRUE(with && without);
  EXPECT_EQ(with->encode("cab"), (Ids{16}));
  EXPECT_EQ(without->encode("cab"), (Ids{2, 4}));
}

TEST(Tokenizer, LongWordsUseTheSameMergeOrder) {
  auto t = make(tiny_byte_level());
  ASSERT_TRUE(t);
  // Words longer than the small-word path (64 symbols) go through the heap path.
  std::string w;
  Ids expected;
  for (int i = 0; i < 100; ++i) {
    w += "abc";
    expected.push_back(5);
  }
  EXPECT_EQ(t->encode(w), expected);
  Ids e2(150, 4);  // leftmost pairs merge first: ab ab ... a
  e2.push_back(0);
  std::string abs;
  for (int i = 0; i < 150; ++i) abs += "ab";
  abs += "a";
  EXPECT_EQ(t->encode(abs), e2);
}

TEST(Tokenizer, InvalidUtf8BecomesReplacementCharacters) {
  auto t = make(tiny_byte_level());
  ASSERT_TRUE(t);
  // U+FFFD is EF BF BD: three byte tokens.
  Ids fffd{13, 14, 15};
  EXPECT_EQ(t->encode(std::string("\xC3")), fffd);
  Ids two = fffd;
  two.insert(two.end(), fffd.begin(), fffd.end());
  EXPECT_EQ(t->encode(std::string("\xED\xA0\x80")), (Ids{13, 14, 15, 13, 14, 15, 13, 14, 15}));
  EXPECT_EQ(t->encode(std::string("\xFF\xFE")), two);
  EXPECT_EQ(t->decode(Ids{12}), "é");
  EXPECT_EQ(t->decode(Ids{10}), "\xEF\xBF\xBD");  // a lone C3 byte decodes to U+FFFD
}

TEST(Tokenizer, AddedTokensSplitBeforePreTokenization) {
  std::string added = R"([
    {"id":20,"content":"<s>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},
    {"id":21,"content":"<s>x","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},
    {"id":22,"content":"[L]","single_word":false,"lstrip":true,"rstrip":false,"normalized":false,"special":false},
    {"id":23,"content":"[R]","single_word":false,"lstrip":false,"rstrip":true,"normalized":false,"special":false},
    {"id":24,"content":"[W]","single_word":true,"lstrip":false,"rstrip":false,"normalized":false,"special":false}])";
  auto t = make(tiny_byte_level("", "null", added));
  ASSERT_TRUE(t);
  EXPECT_EQ(t->encode("a<s>b"), (Ids{0, 20, 1}));
  EXPECT_EQ(t->encode("<s>xa"), (Ids{21, 0}));       // leftmost-longest
  EXPECT_EQ(t->encode("a  [L]b"), (Ids{0, 22, 1}));  // lstrip eats the spaces before
  EXPECT_EQ(t->encode("a[R]  b"), (Ids{0, 23, 1}));  // rstrip eats the spaces after
  EXPECT_EQ(t->encode("a [W] b"), (Ids{0, 3, 24, 3, 1}));
  EXPECT_NE(t->encode("a[W]b"), (Ids{0, 24, 1}));  // not a single word
  EXPECT_EQ(t->decode(Ids{0, 20, 1}), "a<s>b");
  EXPECT_EQ(t->decode(Ids{0, 20, 1}, true), "ab");
  EXPECT_TRUE(t->is_special(20));
  EXPECT_FALSE(t->is_special(22));
  EXPECT_EQ(t->token_to_id("<s>"), 20);
  EXPECT_EQ(t->id_to_token(6), "Ġa");
  EXPECT_EQ(t->vocab_size(), 25);
}

TEST(Tokenizer, TemplateProcessingAddsSpecialTokens) {
  std::string added =
      R"([{"id":20,"content":"<s>","special":true},{"id":21,"content":"</s>","special":true}])";
  std::string post =
      R"({"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<s>","type_id":0}},{"Sequence":{"id":"A","type_id":0}},{"SpecialToken":{"id":"</s>","type_id":0}}],
    "pair":[],"special_tokens":{"<s>":{"id":"<s>","ids":[20],"tokens":["<s>"]},"</s>":{"id":"</s>","ids":[21],"tokens":["</s>"]}}})";
  auto t = make(tiny_byte_level("", post, added));
  ASSERT_TRUE(t);
  EXPECT_EQ(t->encode("ab", true), (Ids{20, 4, 21}));
  EXPECT_EQ(t->encode("ab", false), (Ids{4}));
  EXPECT_EQ(t->encode("", true), (Ids{20, 21}));
}

TEST(Tokenizer, LlamaTokenizerClassAddsBosLikeTransformers) {
  std::string added = R"([{"id":20,"content":"<s>","special":true}])";
  auto t = make(
      tiny_byte_level("", "null", added),
      R"({"tokenizer_class":"LlamaTokenizerFast","bos_token":{"content":"<s>"},"add_bos_token":true})");
  ASSERT_TRUE(t);
  EXPECT_EQ(t->encode("ab", true), (Ids{20, 4}));
  EXPECT_EQ(t->bos_token(), "<s>");
  EXPECT_EQ(t->bos_token_id(), 20);
}

// The tiny byte-level tokenizer with another pre-tokenizer before its ByteLevel step.
std::string tiny_with_pre(const std::string& steps) {
  std::string json = tiny_byte_level();
  size_t a = json.find("\"pre_tokenizer\":");
  size_t b = json.find("\"post_processor\":");
  return json.substr(0, a) + R"("pre_tokenizer":{"type":"Sequence","pretokenizers":[)" + steps +
         R"(,{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":false,"use_regex":false}]},
    )" + json.substr(b);
}

std::string split(const std::string& pattern, const std::string& behavior, bool invert = false) {
  return R"({"type":"Split","pattern":)" + pattern + R"(,"behavior":")" + behavior +
         R"(","invert":)" + (invert ? "true" : "false") + "}";
}

// encode_prefix(text, N) is the first N ids of encode(text), for every N (and every split
// behavior: each decides differently whether the last piece of a partial scan is final).
void expect_prefixes_match(const Tokenizer& t, const std::string& text, bool add_special) {
  Ids full;
  ASSERT_TRUE(t.encode(text, add_special, full));
  for (size_t n = 0; n <= full.size() + 2; ++n) {
    Ids got{-7};  // appends after what is there
    ASSERT_TRUE(t.encode_prefix(text, add_special, n, got));
    Ids want{-7};
    want.insert(want.end(), full.begin(),
                full.begin() + static_cast<ptrdiff_t>(std::min(n, full.size())));
    ASSERT_EQ(got, want) << "n=" << n << " text=\"" << text << "\"";
  }
}

TEST(Tokenizer, EncodePrefixIsTheStartOfTheFullEncodeForEverySplitBehavior) {
  std::vector<std::string> configs;
  for (const char* behavior :
       {"Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"}) {
    for (bool invert : {false, true}) {
      configs.push_back(tiny_with_pre(split(R"({"String":" "})", behavior, invert)));
      configs.push_back(tiny_with_pre(split(R"({"Regex":"\\s+|!+"})", behavior, invert)));
    }
  }
  configs.push_back(tiny_with_pre(split(R"({"Regex":"!"})", "Isolated") + "," +
                                  R"({"type":"Digits","individual_digits":true},)" +
                                  split(R"({"Regex":"\\s+"})", "MergedWithNext") + "," +
                                  split(R"({"Regex":"b"})", "Contiguous")));
  configs.push_back(tiny_byte_level("", "null", R"([{"id":17,"content":"!!","special":true}])"));
  std::mt19937 rng(12345);
  const char alphabet[] = "abc !1";
  std::vector<std::string> texts = {"", " ", "abc", "  abc  ", "!!!", "a!!b c 11 1abc!  "};
  for (int i = 0; i < 40; ++i) {
    std::string s(rng() % 120, ' ');
    for (char& c : s) c = alphabet[rng() % 6];
    texts.push_back(s);
  }
  for (const auto& json : configs) {
    auto t = make(json);
    ASSERT_TRUE(t) << json;
    for (const auto& text : texts) expect_prefixes_match(*t, text, false);
  }
}

// A huge prompt does not leave the thread holding its size in scratch buffers (text copies,
// pieces, segments, the merge symbols of one huge word).
TEST(Tokenizer, ScratchMemoryReturnsAfterAHugeText) {
  std::string json = tiny_byte_level("", "null", R"([{"id":17,"content":"!!","special":true}])");
  json.replace(json.find("\"normalizer\":null"), 17, R"("normalizer":{"type":"NFC"})");
  auto t = make(json);
  ASSERT_TRUE(t);
  std::string huge;
  while (huge.size() < (size_t{8} << 20)) huge += "abc ab!!1 cab \xFF ";
  huge += std::string(size_t{3} << 20, 'a');  // one word of 3M symbols
  std::thread th([&] {
    Ids small = t->encode("abc abc");
    ASSERT_FALSE(small.empty());
    Ids ids;
    ASSERT_TRUE(t->encode(huge, false, ids));
    EXPECT_GT(ids.size(), size_t{4} << 20);
    EXPECT_LT(Tokenizer::thread_scratch_bytes(), huge.size() / 4);
    ids.clear();
    ASSERT_TRUE(t->encode_prefix(huge, false, 1000, ids));
    EXPECT_EQ(ids.size(), 1000u);
    EXPECT_LT(Tokenizer::thread_scratch_bytes(), huge.size() / 4);
    EXPECT_EQ(t->encode("abc abc"), small);
  });
  th.join();
}

TEST(Tokenizer, RefusesWhatItCannotTokenizeExactly) {
  struct Bad {
    std::string from, to, names;
  };
  const Bad bad[] = {
      {R"("type":"BPE","dropout":null)", R"("type":"WordPiece","dropout":null)", "WordPiece"},
      {R"("dropout":null)", R"("dropout":0.1)", "dropout"},
      {R"("normalizer":null)", R"("normalizer":{"type":"BertNormalizer"})", "BertNormalizer"},
      {R"({"type":"Split","pattern")", R"({"type":"Whitespace"},{"type":"Split","pattern")",
       "Whitespace"},
      {R"("decoder":{"type":"ByteLevel")", R"("decoder":{"type":"WordPiece")", "WordPiece"},
      {R"(\\p{N}|)", R"(\\p{N}|\\w|)", "\\w"},
      {R"("continuing_subword_prefix":null)", R"("continuing_subword_prefix":"##")",
       "continuing_subword_prefix"},
      {R"("truncation":null)", R"("truncation":{"max_length":5})", "truncation"},
  };
  for (const auto& b : bad) {
    std::string json = tiny_byte_level();
    size_t at = json.find(b.from);
    ASSERT_NE(at, std::string::npos) << b.from;
    json.replace(at, b.from.size(), b.to);
    std::string err;
    EXPECT_FALSE(Tokenizer::from_json(json, "", err)) << b.names;
    EXPECT_NE(err.find(b.names), std::string::npos) << b.names << " -> " << err;
  }
  std::string err;
  EXPECT_FALSE(Tokenizer::load("/nonexistent-dir", err));
  EXPECT_NE(err.find("/nonexistent-dir/tokenizer.json"), std::string::npos) << err;
}

// ---- real model files (skipped when scripts/setup has not fetched them) ----

std::unique_ptr<Tokenizer> real(const std::string& model) {
  std::string dir = models_dir() + "/" + model;
  if (!std::filesystem::exists(dir + "/tokenizer.json")) return nullptr;
  std::string err;
  auto t = Tokenizer::load(dir, err);
  EXPECT_TRUE(t) << err;
  return t;
}

// A tokenizer every test machine has (scripts/setup fetches it): missing is a failure.
std::unique_ptr<Tokenizer> required(const std::string& model) {
  std::string dir = models_dir() + "/" + model;
  if (!std::filesystem::exists(dir + "/tokenizer.json")) {
    ADD_FAILURE() << dir << "/tokenizer.json is missing: run scripts/setup";
    return nullptr;
  }
  return real(model);
}

// Routing asks for the first --prefix-token-count ids only; they must be exactly the ones a full
// encode starts with, on the real pipelines (Qwen3: NFC + one Split; Llama 3: another regex;
// DeepSeek V3: three Splits in sequence; Gemma 3: Replace normalizer + literal split merged with
// the previous piece; Llama 2: no pre-tokenizer at all).
TEST(TokenizerModels, EncodePrefixIsTheStartOfTheFullEncode) {
  const std::vector<std::string> pieces = {
      "Hello world! I'm sure they'll've done it, isn't it? ",
      "def f(x):\n\treturn x ** 2  # square\n\n\n    if x:\n        pass\n",
      "日本語のテキストと中文文本，还有한국어. ",
      "Numbers: 1234567 3.14159 2024-01-01 and 100,000,000.",
      "emoji 😀👨‍👩‍👧 cafe\xCC\x81 caf\xC3\xA9 ",
      "   \n\n\t  spaces   and\r\nnewlines \n",
      "<|im_start|>user\nhi<|im_end|><|begin_of_text|><s></s><start_of_turn>model\n",
      "bad \xFF\xFE bytes ",
      std::string(300, 'a') + " " + std::string(40, '!') + "\n",
  };
  std::vector<std::string> texts(pieces);
  std::string all;
  for (int round = 0; round < 3; ++round) {
    for (const auto& p : pieces) all += p;
  }
  texts.push_back(all);
  texts.push_back(" " + all);
  for (const char* model : {"qwen3", "llama3", "deepseek_v3", "gemma3", "llama2"}) {
    auto t = required(model);
    if (!t) continue;
    for (bool add_special : {false, true}) {
      for (const auto& text : texts) {
        Ids full;
        ASSERT_TRUE(t->encode(text, add_special, full));
        std::vector<size_t> ns;
        for (size_t n = 0; n <= std::min<size_t>(full.size() + 1, 300); ++n) ns.push_back(n);
        for (size_t n = 301; n < full.size() + 2; n += 37) ns.push_back(n);
        ns.push_back(full.size());
        for (size_t n : ns) {
          Ids got;
          ASSERT_TRUE(t->encode_prefix(text, add_special, n, got));
          ASSERT_EQ(got, Ids(full.begin(),
                             full.begin() + static_cast<ptrdiff_t>(std::min(n, full.size()))))
              << model << " n=" << n << " add_special=" << add_special << " text=" << text;
        }
      }
    }
  }
}

TEST(TokenizerModels, Qwen3SpotIds) {
  auto t = real("qwen3");
  ASSERT_TRUE(t) << testing::missing_model("qwen3");
  EXPECT_EQ(t->encode("Hello world! 12345 <|im_start|>user\nhi<|im_end|>"),
            (Ids{9707, 1879, 0, 220, 16, 17, 18, 19, 20, 220, 151644, 872, 198, 6023, 151645}));
  EXPECT_EQ(t->eos_token(), "<|im_end|>");
  EXPECT_EQ(t->eos_token_id(), 151645);
  EXPECT_EQ(t->decode(t->encode("héllo wörld 你好 👨‍👩‍👧")),
            "héllo wörld 你好 👨‍👩‍👧");
}

TEST(TokenizerModels, PathologicalInputsFinish) {
  auto t = real("llama3");
  ASSERT_TRUE(t) << testing::missing_model("llama3");
  for (const std::string& s :
       {std::string(200000, ' '), std::string(200000, 'a'), std::string(100000, '\n'),
        std::string(50000, '9'), std::string(60000, '!'), std::string("\xF0\x9F\x98", 3)}) {
    Ids ids;
    std::string err;
    EXPECT_TRUE(t->encode(s, false, ids, &err)) << err;
    EXPECT_FALSE(ids.empty());
  }
}

TEST(TokenizerModels, ConcurrentEncodesMatchSerialOnes) {
  auto t = real("qwen3");
  ASSERT_TRUE(t) << testing::missing_model("qwen3");
  std::vector<std::string> texts;
  texts.reserve(64);
  for (int i = 0; i < 64; ++i) {
    texts.push_back("request " + std::to_string(i) + ": The quick brown fox " +
                    std::string(static_cast<size_t>(i % 7), ' ') + "日本語 " +
                    std::to_string(i * 7919) + " <|im_end|> émoji 😀 " + std::string(i % 5, '\n'));
  }
  std::vector<Ids> serial;
  serial.reserve(texts.size());
  for (const auto& s : texts) serial.push_back(t->encode(s));
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  threads.reserve(4);
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      for (int round = 0; round < 50; ++round) {
        for (size_t i = 0; i < texts.size(); ++i) {
          size_t j = (i + static_cast<size_t>(k) * 13 + static_cast<size_t>(round)) % texts.size();
          if (t->encode(texts[j]) != serial[j]) ++mismatches[static_cast<size_t>(k)];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int m : mismatches) EXPECT_EQ(m, 0);
}

TEST(TokenizerModels, ChatTemplatesOfTheModelsRender) {
  for (const char* model : {"qwen3", "llama3"}) {
    std::string dir = models_dir() + "/" + model;
    if (!std::filesystem::exists(dir + "/tokenizer_config.json")) continue;
    std::string err, out;
    auto ct = ChatTemplate::load(dir, err);
    ASSERT_TRUE(ct) << err;
    ASSERT_TRUE(ct->render_json(R"([{"role":"user","content":"Hi"}])", "", true, "", out, err))
        << err;
    EXPECT_NE(out.find("Hi"), std::string::npos);
  }
  KVGATE_REQUIRE_MODEL("qwen3", "tokenizer_config.json");
  std::string dir = models_dir() + "/qwen3";
  std::string err, out;
  auto ct = ChatTemplate::load(dir, err);
  ASSERT_TRUE(ct) << err;
  ASSERT_TRUE(ct->render_json(R"([{"role":"user","content":"Hi"}])", "", true,
                              R"({"enable_thinking": false})", out, err))
      << err;
  EXPECT_EQ(out, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

}  // namespace
}  // namespace kvgate::tokenizer
