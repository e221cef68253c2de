// Unit tests of tokenizer/piece_cache: the bound (LRU eviction within accounted bytes, entries too
// large for it), keys verified beyond their hash (collisions and other tokenizers miss), and, on
// every model of models/, that a tokenizer with the cache returns exactly the ids of one without
// it over a varied corpus, whatever the cache already holds; from several threads at once with a
// cache small enough to evict all the time (the TSan build checks the locking).
#include "tokenizer/piece_cache.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <initializer_list>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "support/models.h"
#include "tokenizer/bpe.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace kvgate::tokenizer {
namespace {

using Ids = std::vector<int32_t>;

// A piece of `n` bytes, distinct for each `i`.
std::string piece(size_t i, size_t n = 64) {
  std::string s = "piece " + std::to_string(i) + " ";
  while (s.size() < n) s.push_back(static_cast<char>('a' + (s.size() + i) % 26));
  s.resize(n);
  return s;
}

TEST(PieceCache, HitReturnsTheStoredIdsAppended) {
  PieceCache c(1 << 20);
  std::string p = piece(1);
  Ids out{7};
  EXPECT_FALSE(c.get(1, p, detail::hash_bytes(p), out));
  EXPECT_EQ(out, (Ids{7}));
  c.put(1, p, detail::hash_bytes(p), Ids{1, 2, 3});
  EXPECT_TRUE(c.get(1, p, detail::hash_bytes(p), out));
  EXPECT_EQ(out, (Ids{7, 1, 2, 3}));
  auto st = c.stats();
  EXPECT_EQ(st.hits, 1u);
  EXPECT_EQ(st.misses, 1u);
  EXPECT_EQ(st.inserts, 1u);
  EXPECT_EQ(st.entries, 1u);
  EXPECT_EQ(st.bytes, PieceCache::entry_bytes(p.size(), 3));
}

TEST(PieceCache, KeysAreVerifiedNotJustHashed) {
  PieceCache c(1 << 20);
  std::string a = piece(1), b = piece(2);
  const uint64_t h = 42;  // both pieces claim the same hash
  c.put(1, a, h, Ids{1});
  Ids out;
  EXPECT_FALSE(c.get(1, b, h, out)) << "another piece with the same hash";
  EXPECT_FALSE(c.get(2, a, h, out)) << "the same piece of another tokenizer";
  EXPECT_TRUE(out.empty());
  c.put(1, b, h, Ids{2});  // the newer piece takes the slot
  EXPECT_TRUE(c.get(1, b, h, out));
  EXPECT_EQ(out, (Ids{2}));
  out.clear();
  EXPECT_FALSE(c.get(1, a, h, out));
  EXPECT_EQ(c.stats().entries, 1u);
}

TEST(PieceCache, EvictsLeastRecentlyUsedWithinTheBound) {
  // Hashes 0..n with one owner all land in one shard (its top bits pick it): one LRU list.
  const size_t per_entry = PieceCache::entry_bytes(64, 4);
  const size_t shard_entries = 10;
  PieceCache c(PieceCache::kShards * shard_entries * per_entry);
  const Ids ids{1, 2, 3, 4};
  for (uint64_t i = 0; i < shard_entries; ++i) c.put(1, piece(i), i, ids);
  EXPECT_EQ(c.stats().entries, shard_entries);
  EXPECT_EQ(c.stats().evictions, 0u);
  Ids out;
  ASSERT_TRUE(c.get(1, piece(0), 0, out));  // 0 becomes the most recently used; 1 the least
  c.put(1, piece(100), 100, ids);
  auto st = c.stats();
  EXPECT_EQ(st.entries, shard_entries);
  EXPECT_EQ(st.evictions, 1u);
  EXPECT_LE(st.bytes, st.capacity_bytes);
  EXPECT_TRUE(c.get(1, piece(0), 0, out));
  EXPECT_FALSE(c.get(1, piece(1), 1, out)) << "the least recently used entry goes first";
  EXPECT_TRUE(c.get(1, piece(2), 2, out));
  EXPECT_TRUE(c.get(1, piece(100), 100, out));

  // Many pieces of every size over every shard: never above the bound.
  PieceCache small(size_t{64} * 1024);
  for (size_t i = 0; i < 5000; ++i) {
    std::string p = piece(i, 32 + i % 300);
    Ids v(1 + i % 50, static_cast<int32_t>(i));
    small.put(7, p, detail::hash_bytes(p), v);
    if (i % 97 == 0) {
      auto s = small.stats();
      ASSERT_LE(s.bytes, s.capacity_bytes);
    }
  }
  auto s = small.stats();
  EXPECT_LE(s.bytes, s.capacity_bytes);
  EXPECT_GT(s.evictions, 0u);
  EXPECT_GT(s.entries, 0u);
  small.clear();
  EXPECT_EQ(small.stats().entries, 0u);
  EXPECT_EQ(small.stats().bytes, 0u);
}

// Puts and gets in random order over pieces whose hashes collide and cluster (one shard, long
// probe runs that wrap around, slots shifted back on every eviction): a hit always returns the
// ids stored for that very piece, and every entry the cache counts can be found.
TEST(PieceCache, RandomOperationsNeverReturnAnotherPiecesIds) {
  std::mt19937_64 rng(7);
  const size_t per_entry = PieceCache::entry_bytes(40, 3);
  PieceCache c(PieceCache::kShards * 150 * per_entry);  // ~150 entries in the shard used
  auto ids_of = [](size_t i) {
    return Ids{static_cast<int32_t>(i), static_cast<int32_t>(i * 3), static_cast<int32_t>(i * 7)};
  };
  auto hash_of = [](size_t i) { return uint64_t{i % 300}; };  // 600 pieces, 300 hashes
  for (int op = 0; op < 50000; ++op) {
    size_t i = rng() % 600;
    std::string p = piece(i, 40);
    Ids out;
    if (rng() % 2) {
      if (c.get(1, p, hash_of(i), out)) {
        ASSERT_EQ(out, ids_of(i)) << "piece " << i;
      }
    } else {
      c.put(1, p, hash_of(i), ids_of(i));
    }
  }
  size_t found = 0;
  for (size_t i = 0; i < 600; ++i) {
    Ids out;
    if (c.get(1, piece(i, 40), hash_of(i), out)) {
      ASSERT_EQ(out, ids_of(i));
      ++found;
    }
  }
  auto st = c.stats();
  EXPECT_EQ(found, st.entries);
  EXPECT_GT(st.evictions, 0u);
  EXPECT_LE(st.bytes, st.capacity_bytes);
}

TEST(PieceCache, EntriesTooLargeForTheBoundAreNotCached) {
  PieceCache c(size_t{128} * 1024);  // entries up to 1 KiB
  std::string big = piece(1, 2000), fits = piece(2, 500);
  c.put(1, big, detail::hash_bytes(big), Ids{1});
  c.put(1, fits, detail::hash_bytes(fits), Ids{1});
  Ids out;
  EXPECT_FALSE(c.get(1, big, detail::hash_bytes(big), out));
  EXPECT_TRUE(c.get(1, fits, detail::hash_bytes(fits), out));
  EXPECT_EQ(c.stats().too_large, 1u);
  EXPECT_EQ(c.stats().entries, 1u);
}

// ---- on tokenizers ----

const char* const kModels[] = {"qwen3",  "llama3", "llama3_1",   "llama2",
                               "gemma3", "gptoss", "deepseek_v3"};

struct Pair {
  std::unique_ptr<Tokenizer> plain, cached;
  std::shared_ptr<PieceCache> cache;
};

Pair load_pair(const std::string& model, size_t cache_bytes) {
  Pair p;
  std::string err;
  std::string dir = testing::models_dir() + "/" + model;
  p.plain = Tokenizer::load(dir, err);
  EXPECT_TRUE(p.plain) << err;
  p.cached = Tokenizer::load(dir, err);
  EXPECT_TRUE(p.cached) << err;
  if (p.cached) {
    p.cache = std::make_shared<PieceCache>(cache_bytes);
    p.cached->set_piece_cache(p.cache);
    EXPECT_TRUE(p.cached->uses_piece_cache()) << model;
  }
  return p;
}

std::string join(std::initializer_list<std::string_view> parts) {
  std::string out;
  for (std::string_view p : parts) out.append(p);
  return out;
}

// Texts with special tokens of the model among varied pieces: at the start, in the middle, at the
// end, next to each other, repeated in other places; plus the model's chat template output.
std::vector<std::string> corpus(const Tokenizer& t, const std::string& model) {
  const std::vector<std::string> pieces = {
      "Hello world! I'm sure they'll've done it, isn't it? The end.",
      " leading space and trailing space, then a number 1234567890 ",
      "def f(x):\n\treturn x ** 2  # square\n\n\n    if x:\n        pass\n",
      "日本語のテキストと中文文本，还有한국어와 العربية و हिन्दी पाठ. ",
      "emoji 😀👨‍👩‍👧 👍🏽 🏳️‍🌈 cafe\xCC\x81 caf\xC3\xA9 and ZWJ",
      "   \n\n\t  spaces   and\r\nnewlines \n          \n\n\n\n",
      "bad \xFF\xFE bytes inside a long enough piece of text \xC3",
      "Numbers: 3.14159 2024-01-01 100,000,000 and ١٢٣ and ½ ² Ⅻ",
      std::string(300, 'a') + " " + std::string(40, '!') + "\n",
      "x",
      "UPPER lower MiXeD wOrDs CamelCase snake_case kebab-case",
  };
  std::vector<std::string> specials;
  for (const auto& a : t.added_tokens()) {
    if (specials.size() >= 6) break;
    specials.push_back(a.content);
  }
  for (const char* s : {"<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|eot_id|>", "<s>",
                        "</s>", "<start_of_turn>", "<end_of_turn>", "<|start|>", "<|end|>"}) {
    if (t.token_to_id(s)) specials.emplace_back(s);
  }
  std::vector<std::string> texts(pieces);
  for (size_t i = 0; i < pieces.size(); ++i) {
    for (size_t k = 0; k < specials.size(); ++k) {
      const std::string& sp = specials[k];
      const std::string& a = pieces[i];
      const std::string& b = pieces[(i + k + 1) % pieces.size()];
      texts.push_back(join({sp, a}));                 // piece at the end
      texts.push_back(join({a, sp}));                 // piece at the start
      texts.push_back(join({a, sp, b, sp, a}));       // the same piece at both ends
      texts.push_back(join({sp, sp, a, sp, sp}));     // specials next to each other
      texts.push_back(join({b, " ", sp, " ", a}));    // spaces around a special token
      texts.push_back(join({a, "\n", sp, "\n", b}));  // newlines around it
    }
  }
  std::string err;
  auto chat = ChatTemplate::load(testing::models_dir() + "/" + model, err);
  if (chat) {
    std::vector<std::string> messages;  // JSON objects
    for (const auto& text : pieces) {
      if (text.find('\xFF') != std::string::npos) continue;  // JSON carries UTF-8 only
      std::string content;
      for (char c : text) {
        if (c == '"' || c == '\\') {
          content += '\\';
          content += c;
        } else if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
          content += buf;
        } else {
          content += c;
        }
      }
      messages.push_back(std::string(R"({"role":")") +
                         (messages.size() % 2 ? "assistant" : "user") + R"(","content":")" +
                         content + R"("})");
    }
    // The conversation as its successive turns send it (each ending with a user message).
    size_t rendered = 0;
    for (size_t n = 1; n <= messages.size(); n += 2) {
      std::string turn = "[";
      for (size_t i = 0; i < n; ++i) turn += (i ? "," : "") + messages[i];
      std::string prompt;
      if (chat->render_json(turn + "]", "", true, "", prompt, err)) {
        texts.push_back(prompt);
        ++rendered;
      }
    }
    EXPECT_GT(rendered, 0u) << model << ": " << err;
  }
  return texts;
}

TEST(PieceCacheModels, CachedIdsAreTheUncachedIdsOnEveryModel) {
  for (const char* model : kModels) {
    SCOPED_TRACE(model);
    KVGATE_REQUIRE_MODEL(model);
    Pair p = load_pair(model, size_t{64} << 20);
    ASSERT_TRUE(p.plain && p.cached);
    auto texts = corpus(*p.plain, model);
    // Twice: the first pass fills the cache (hits only for pieces repeated in the corpus), the
    // second finds every cacheable piece.
    for (int pass = 0; pass < 2; ++pass) {
      for (const auto& text : texts) {
        for (bool add_special : {false, true}) {
          Ids want, got;
          ASSERT_TRUE(p.plain->encode(text, add_special, want));
          ASSERT_TRUE(p.cached->encode(text, add_special, got));
          ASSERT_EQ(got, want) << "pass " << pass << " add_special " << add_special << " text "
                               << text;
          // encode_prefix: a hit appends a whole piece; the result is trimmed to n.
          for (size_t n : {size_t{1}, size_t{7}, want.size() / 2, want.size()}) {
            Ids pre;
            ASSERT_TRUE(p.cached->encode_prefix(text, add_special, n, pre));
            ASSERT_EQ(pre, Ids(want.begin(),
                               want.begin() + static_cast<ptrdiff_t>(std::min(n, want.size()))))
                << "n=" << n << " text " << text;
          }
        }
      }
    }
    auto st = p.cache->stats();
    EXPECT_GT(st.hits, st.misses) << "the second pass should hit";
    EXPECT_GT(st.entries, 0u);
  }
}

// A Metaspace pre-tokenizer that prepends only to the text's first piece: the ids of a piece
// depend on where it is, so the tokenizer does not use the cache.
TEST(PieceCacheModels, RefusedWhereAPieceDependsOnItsPosition) {
  auto make = [](const std::string& scheme) {
    std::string json =
        R"({"version":"1.0","truncation":null,"padding":null,"added_tokens":[
          {"id":3,"content":"<s>","single_word":false,"lstrip":false,"rstrip":false,
           "normalized":false,"special":true}],"normalizer":null,
        "pre_tokenizer":{"type":"Metaspace","replacement":"▁","prepend_scheme":")" +
        scheme + R"(","split":true},"post_processor":null,"decoder":null,
        "model":{"type":"BPE","dropout":null,"unk_token":null,"continuing_subword_prefix":null,
          "end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,
          "vocab":{"▁":0,"a":1,"▁a":2,"<s>":3},"merges":["▁ a"]}})";
    std::string err;
    auto t = Tokenizer::from_json(json, "", err);
    EXPECT_TRUE(t) << err;
    if (t) t->set_piece_cache(std::make_shared<PieceCache>(1 << 20));
    return t;
  };
  auto first = make("first");
  auto always = make("always");
  ASSERT_TRUE(first && always);
  EXPECT_FALSE(first->pieces_are_position_independent());
  EXPECT_FALSE(first->uses_piece_cache());
  EXPECT_TRUE(always->pieces_are_position_independent());
  EXPECT_TRUE(always->uses_piece_cache());
}

// Request threads share one cache; with a cache small enough to evict on nearly every insert,
// every thread still gets exactly the uncached ids.
TEST(PieceCacheModels, ConcurrentEncodesWithEvictionsMatchUncachedOnes) {
  KVGATE_REQUIRE_MODEL("qwen3");
  // 3 KiB a shard, entries up to 384 bytes: the ~340 pieces below (~300 bytes each) do not fit.
  Pair p = load_pair("qwen3", size_t{48} * 1024);
  ASSERT_TRUE(p.plain && p.cached);
  std::vector<std::string> texts;
  for (int i = 0; i < 96; ++i) {
    std::string t;
    for (int m = 0; m <= i % 6; ++m) {
      t += "<|im_start|>user\nmessage " + std::to_string(m) + " of chat " + std::to_string(i) +
           ": the quick brown fox 日本語 😀 " + std::string(static_cast<size_t>(m % 3), ' ') +
           "<|im_end|>\n";
    }
    texts.push_back(t + "<|im_start|>assistant\n");
  }
  std::vector<Ids> want;
  want.reserve(texts.size());
  for (const auto& t : texts) want.push_back(p.plain->encode(t));
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  threads.reserve(4);
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      for (int round = 0; round < 30; ++round) {
        for (size_t i = 0; i < texts.size(); ++i) {
          size_t j =
              (i * 7 + static_cast<size_t>(k) * 11 + static_cast<size_t>(round)) % texts.size();
          if (p.cached->encode(texts[j]) != want[j]) ++mismatches[static_cast<size_t>(k)];
        }
      }
    });
  }
  std::thread scraper([&] {  // what the metrics collector does meanwhile
    for (int i = 0; i < 200; ++i) {
      auto st = p.cache->stats();
      EXPECT_LE(st.bytes, st.capacity_bytes);
    }
  });
  for (auto& th : threads) th.join();
  scraper.join();
  for (int m : mismatches) EXPECT_EQ(m, 0);
  auto st = p.cache->stats();
  EXPECT_GT(st.hits, 0u);
  EXPECT_GT(st.evictions, 0u);
  EXPECT_LE(st.bytes, st.capacity_bytes);
}

}  // namespace
}  // namespace kvgate::tokenizer
