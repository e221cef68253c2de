// Tests for prefix/approx_tree: matching per worker, Unicode splits, LRU eviction to size, worker
// removal, truncation (ground-truth correction), accounting, concurrent use.
#include "prefix/approx_tree.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <thread>

namespace kvgate::prefix {
namespace {

std::vector<size_t> match(const ApproxTree& t, std::string_view text, std::vector<Slot> slots) {
  std::vector<size_t> out(slots.size());
  t.match(text, slots, out);
  return out;
}

TEST(ApproxTree, MatchesPerSlot) {
  ApproxTree t;
  t.insert("hello world", 1);
  t.insert("hello there", 2);
  EXPECT_EQ(match(t, "hello world and more", {1, 2, 3}), (std::vector<size_t>{11, 6, 0}));
  EXPECT_EQ(match(t, "hello", {1, 2}), (std::vector<size_t>{5, 5}));
  EXPECT_EQ(match(t, "help", {1, 2}), (std::vector<size_t>{3, 3}));
  EXPECT_EQ(match(t, "xyz", {1, 2}), (std::vector<size_t>{0, 0}));
  std::vector<size_t> out(1);
  EXPECT_EQ(t.match("héllo", std::vector<Slot>{1}, out), 5u);  // characters, not bytes
}

TEST(ApproxTree, CountsCharactersNotBytesAndSplitsOnlyAtCodePoints) {
  ApproxTree t;
  t.insert("日本語のテキスト", 1);
  t.insert("日本人", 2);  // shares 2 characters (6 bytes)
  EXPECT_EQ(match(t, "日本語の", {1, 2}), (std::vector<size_t>{4, 2}));
  // é (C3 A9) and è (C3 A8) share their first byte but no character.
  t.insert("café", 3);
  EXPECT_EQ(match(t, "cafè", {3}), (std::vector<size_t>{3}));
  EXPECT_EQ(t.chars_of(1), 8u);
  EXPECT_EQ(t.chars_of(2), 3u);
  EXPECT_EQ(t.chars_of(3), 4u);
  EXPECT_EQ(t.stored_chars(), 8u + 1u + 4u);  // "日本" shared, "人" and "café" new
}

// Random text of `chars` characters mixing 1-, 2-, 3- and 4-byte UTF-8 sequences.
std::string random_utf8(size_t chars, std::mt19937& rng) {
  static const char* const kPieces[] = {"a", "b", " ", "é", "è", "日", "本", "😀"};
  std::string out;
  for (size_t i = 0; i < chars; ++i) out += kPieces[rng() % 8];
  return out;
}

size_t count_chars_slowly(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xc0) != 0x80;
  return n;
}

TEST(ApproxTree, LongPromptsMatchToTheCharacterAtEveryOffset) {
  // The comparisons and the character count go sixteen bytes at a time: a difference, or a
  // multi-byte character, anywhere in or across a block must land on the same answer.
  std::mt19937 rng(7);
  for (size_t chars : {0, 1, 5, 15, 16, 17, 31, 33, 64, 100, 1000, 5000}) {
    std::string a = random_utf8(chars, rng);
    EXPECT_EQ(count_chars(a), count_chars_slowly(a)) << chars;
    EXPECT_EQ(count_chars(a), chars);
  }
  // Lanes that are continuation bytes in every block (four-byte characters, 16 per 64 bytes):
  // each lane's counter reaches its bound (255 rounds) before it is summed.
  std::string emoji;
  for (int i = 0; i < 2000; ++i) emoji += "😀";
  EXPECT_EQ(count_chars(emoji), 2000u);
  EXPECT_EQ(count_chars(emoji + "abc"), 2003u);
  for (int round = 0; round < 200; ++round) {
    size_t chars = 1 + rng() % 300;
    std::string a = random_utf8(chars, rng);
    size_t keep = rng() % chars;  // characters kept before the first difference
    size_t cut = 0;
    for (size_t c = 0; c < keep; ++c) {
      ++cut;
      while (cut < a.size() && (static_cast<unsigned char>(a[cut]) & 0xc0) == 0x80) ++cut;
    }
    // b: a's first `keep` characters, then one a does not have there (sharing its first byte
    // where it can: é/è, 日/本), then anything.
    const char* other = a.compare(cut, 2, "é") == 0    ? "è"
                        : a.compare(cut, 3, "日") == 0 ? "本"
                                                       : "x";
    std::string b = a.substr(0, cut) + other + random_utf8(rng() % 40, rng);
    ApproxTree t;
    t.insert(a, 1);
    EXPECT_EQ(match(t, b, {1}), (std::vector<size_t>{keep})) << "round " << round;
    EXPECT_EQ(match(t, a, {1}), (std::vector<size_t>{chars}));
  }
}

TEST(ApproxTree, SplitKeepsEveryTenantsCount) {
  ApproxTree t;
  t.insert("abcdef", 1);
  t.insert("abcxyz", 2);
  t.insert("abc", 1);
  EXPECT_EQ(t.chars_of(1), 6u);
  EXPECT_EQ(t.chars_of(2), 6u);
  EXPECT_EQ(t.node_count(), 4u);  // root, "abc", "def", "xyz"
}

TEST(ApproxTree, EvictsLeastRecentlyUsedLeavesToSize) {
  ApproxTree t;
  t.insert("prefix-old-conversation-one", 1);  // oldest
  t.insert("prefix-new-conversation-two", 1);
  t.insert("another-text-entirely", 1);  // newest
  size_t before = t.chars_of(1);
  size_t removed = t.evict(before - 10);
  EXPECT_GE(removed, 10u);
  EXPECT_LE(t.chars_of(1), before - 10);
  // The oldest leaf ("old-conversation-one") went first; the newest text is intact.
  EXPECT_EQ(match(t, "another-text-entirely", {1})[0], 21u);
  EXPECT_EQ(match(t, "prefix-new-conversation-two", {1})[0], 27u);
  EXPECT_LT(match(t, "prefix-old-conversation-one", {1})[0], 27u);
}

TEST(ApproxTree, EvictionIsPerSlotAndKeepsSharedNodes) {
  ApproxTree t;
  t.insert("shared prefix then a", 1);
  t.insert("shared prefix then b", 2);
  t.evict(0);  // slot 1 and 2 both over 0: everything of theirs goes
  EXPECT_EQ(t.chars_of(1), 0u);
  EXPECT_EQ(t.chars_of(2), 0u);
  EXPECT_EQ(t.node_count(), 1u);
  EXPECT_EQ(t.stored_chars(), 0u);
}

TEST(ApproxTree, RemoveSlotForgetsAWorker) {
  ApproxTree t;
  t.insert("common start one", 1);
  t.insert("common start two", 2);
  t.remove_slot(1);
  EXPECT_EQ(t.chars_of(1), 0u);
  EXPECT_EQ(match(t, "common start one", {1, 2}), (std::vector<size_t>{0, 13}));
  EXPECT_EQ(t.stored_chars(), 16u);  // "common start " + "two": slot 1's "one" is gone
  // A slot alone on a deep path: removing it deletes the whole path and its accounting.
  t.insert("solo path / a / b", 3);
  t.insert("solo path / a / c", 3);
  t.insert("solo path / d", 3);
  EXPECT_EQ(t.chars_of(3), 17u + 1u + 1u);
  t.remove_slot(3);
  EXPECT_EQ(t.chars_of(3), 0u);
  EXPECT_EQ(t.stored_chars(), 16u);
  EXPECT_EQ(t.node_count(), 3u);
}

TEST(ApproxTree, TruncateRemovesTheSlotBeyondTheCut) {
  ApproxTree t;
  t.insert("system prompt. user: hi. assistant: hello.", 1);
  t.insert("system prompt. user: other question", 1);
  t.insert("system prompt. user: hi. assistant: hello.", 2);
  t.truncate("system prompt. user: hi. assistant: hello.", 1, 10);
  auto m = match(t, "system prompt. user: hi. assistant: hello.", {1, 2});
  EXPECT_EQ(m[0], 10u);
  EXPECT_EQ(m[1], 42u);
  // Slot 1's other text below the cut is gone too (an extension of a lost prefix is lost).
  EXPECT_EQ(match(t, "system prompt. user: other question", {1})[0], 10u);
  EXPECT_EQ(t.chars_of(1), 10u);
}

// insert() with the hint of a match_best() of the same text builds the same tree as without it,
// whatever changed the tree in between (the other ops change its shape; the hint must then be
// ignored). Two trees take the same operations, one with hints, one without.
TEST(ApproxTree, InsertWithAHintBuildsTheSameTreeAsWithout) {
  std::mt19937 rng(7);
  std::vector<std::string> texts;
  for (int i = 0; i < 40; ++i) {
    std::string base = i % 2 ? "system prompt é日 " : "other start ";
    texts.push_back(base + random_utf8(rng() % 40, rng) + random_utf8(rng() % 200, rng));
  }
  ApproxTree hinted, plain;
  auto accept_all = ApproxTree::SlotFilter{[](const void*, Slot) { return true; }, nullptr};
  size_t used = 0;
  for (int step = 0; step < 3000; ++step) {
    const std::string& text = texts[rng() % texts.size()];
    auto slot = static_cast<Slot>(1 + rng() % 4);
    PathHint hint;
    std::vector<Slot> longest;
    size_t total = 0;
    hinted.match_best(text, accept_all, longest, total, &hint);
    ASSERT_EQ(total, count_chars_slowly(text)) << step;
    ASSERT_EQ(hint.total_chars, total);
    // Something else happens to both trees between the match and the record.
    switch (rng() % 6) {
      case 0: {
        const std::string& other = texts[rng() % texts.size()];
        auto s = static_cast<Slot>(1 + rng() % 4);
        hinted.insert(other, s);
        plain.insert(other, s);
        break;
      }
      case 1: {
        const std::string& other = texts[rng() % texts.size()];
        auto s = static_cast<Slot>(1 + rng() % 4);
        size_t keep = rng() % 100;
        hinted.truncate(other, s, keep);
        plain.truncate(other, s, keep);
        break;
      }
      case 2:
        if (step % 50 == 0) {
          hinted.evict(400);
          plain.evict(400);
        }
        break;
      default:
        break;
    }
    used += hinted.insert(text, slot, &hint) ? 1 : 0;
    plain.insert(text, slot);
    ASSERT_EQ(match(hinted, text, {slot}), match(plain, text, {slot})) << step;
    if (step % 100 != 99) continue;
    ASSERT_EQ(hinted.node_count(), plain.node_count()) << step;
    ASSERT_EQ(hinted.stored_chars(), plain.stored_chars()) << step;
    for (Slot s = 1; s <= 4; ++s) ASSERT_EQ(hinted.chars_of(s), plain.chars_of(s)) << step;
    for (const std::string& t : texts) {
      ASSERT_EQ(match(hinted, t, {1, 2, 3, 4}), match(plain, t, {1, 2, 3, 4})) << step;
    }
  }
  EXPECT_GT(used, 1000u);  // inserts that started from the hint, not from the root
}

// The hint is trusted while the tree keeps its shape: the part of the text it covers is not
// compared again (what saves the second walk). Shown by changing the text's bytes in place after
// the match: the record follows the matched path. Also: a hint of another tree is ignored.
TEST(ApproxTree, InsertFollowsAValidHintAndIgnoresAnotherTreesHint) {
  ApproxTree t;
  t.insert("shared prefix, then one", 1);
  std::string text = "shared prefix, then one more";
  PathHint hint;
  std::vector<Slot> longest;
  size_t total = 0;
  auto accept_all = ApproxTree::SlotFilter{[](const void*, Slot) { return true; }, nullptr};
  EXPECT_EQ(t.match_best(text, accept_all, longest, total, &hint), 23u);
  ASSERT_EQ(hint.node_count, 1u);
  text[0] = 'S';  // same buffer, same size: the hint still names it
  t.insert(text, 2, &hint);
  EXPECT_EQ(match(t, "shared prefix, then one more", {2}), (std::vector<size_t>{28}));
  EXPECT_EQ(match(t, "Shared", {2}), (std::vector<size_t>{0}));

  ApproxTree other;
  other.insert("xyz", 1);
  other.insert(text, 3, &hint);  // hint of t: ignored, the text is walked
  EXPECT_EQ(match(other, "Shared", {3}), (std::vector<size_t>{6}));
}

// A path longer than a hint holds (PathHint::kMaxNodes whole nodes): the record starts at the
// last node the hint names and walks the rest.
TEST(ApproxTree, AHintOfALongPathCoversItsFirstNodes) {
  const std::string full = "abcdefghijklmnopqrstuvwxyz";
  ApproxTree hinted, plain;
  for (ApproxTree* t : {&hinted, &plain}) {
    t->insert(full, 1);
    for (size_t n = full.size() - 1; n > 0; --n) t->insert(full.substr(0, n), 1);  // a chain
  }
  ASSERT_GT(hinted.node_count(), PathHint::kMaxNodes + 2);
  PathHint hint;
  std::vector<Slot> longest;
  size_t total = 0;
  auto accept_all = ApproxTree::SlotFilter{[](const void*, Slot) { return true; }, nullptr};
  std::string text = full + " and more";
  EXPECT_EQ(hinted.match_best(text, accept_all, longest, total, &hint), full.size());
  EXPECT_EQ(hint.node_count, PathHint::kMaxNodes);
  EXPECT_EQ(hint.pos, PathHint::kMaxNodes);  // one character per node
  EXPECT_TRUE(hinted.insert(text, 2, &hint));
  plain.insert(text, 2);
  EXPECT_EQ(match(hinted, text, {1, 2}), match(plain, text, {1, 2}));
  EXPECT_EQ(match(hinted, text, {2}), (std::vector<size_t>{text.size()}));
  EXPECT_EQ(hinted.chars_of(2), plain.chars_of(2));
  EXPECT_EQ(hinted.node_count(), plain.node_count());
}

// Invalid UTF-8: a lead byte without its continuation is one character to a child's key but the
// start of one to the compare, so two texts can share a key and no character. Each is recorded
// (the second as a leaf of its own, once however often it comes) and the insert ends; it used to
// split forever.
TEST(ApproxTree, InvalidUtf8SharingAKeyButNoCharacterIsRecorded) {
  const std::string a =
      "pre \xE2\x82"
      "A";  // under a parent node, not only the root
  const std::string b =
      "pre \xE2\x83"
      "A";
  ApproxTree t;
  t.insert(a, 1);
  t.insert(b, 2);
  size_t nodes = t.node_count();
  t.insert(b, 2);
  t.insert(b, 3);
  EXPECT_EQ(t.node_count(), nodes);  // b's leaf found again, not another one made
  EXPECT_EQ(match(t, a, {1, 2}), (std::vector<size_t>{6, 4}));
  EXPECT_EQ(t.chars_of(2), 6u);
  EXPECT_EQ(t.chars_of(3), 6u);
  t.evict(0);
  EXPECT_TRUE(t.empty());
  EXPECT_EQ(t.stored_chars(), 0u);
  EXPECT_EQ(t.node_count(), 1u);
}

// A text that leaves the tree inside a node the slot holds (its own leaf was evicted and another
// of its texts took the branch): a cut beyond where the text leaves touches nothing, a cut before
// it splits the node there. (It used to cut at 5 anyway, taking from the slot text this one never
// covered, and a cut at or past the node's end left an empty node with a wrapped count.)
TEST(ApproxTree, TruncateOfATextLeavingTheTreeInsideANode) {
  ApproxTree t;
  t.insert("abcdef", 1);
  t.truncate("abcXYZ", 1, 5);  // leaves inside "abcdef" after 3 characters: cut at 5 is beyond
  EXPECT_EQ(match(t, "abcdef", {1}), (std::vector<size_t>{6}));
  EXPECT_EQ(t.chars_of(1), 6u);
  t.truncate("abcXYZ", 1, 2);  // before it: the slot keeps "ab"
  EXPECT_EQ(match(t, "abcdef", {1}), (std::vector<size_t>{2}));
  EXPECT_EQ(t.chars_of(1), 2u);
  std::vector<size_t> out(1);
  EXPECT_EQ(t.match("abcdef", std::vector<Slot>{1}, out), 6u);
}

TEST(ApproxTree, MemoryPerStoredCharacter) {
  ApproxTree t;
  std::string base(3500, 'a');
  for (size_t i = 0; i < base.size(); ++i) base[i] = static_cast<char>('a' + (i * 7919) % 26);
  for (int i = 0; i < 200; ++i) {
    std::string text = base + std::to_string(i) + std::string(500, static_cast<char>('A' + i % 26));
    t.insert(text, static_cast<Slot>(1 + i % 8));
  }
  double per_char = static_cast<double>(t.memory_bytes()) / static_cast<double>(t.stored_chars());
  EXPECT_LT(per_char, 2.0) << t.memory_bytes() << " bytes for " << t.stored_chars() << " chars";
}

TEST(ApproxTree, ConcurrentInsertAndMatch) {
  ApproxTree t;
  std::vector<std::thread> threads;
  for (int th = 0; th < 4; ++th) {
    threads.emplace_back([&t, th] {
      for (int i = 0; i < 500; ++i) {
        std::string text = "conversation " + std::to_string(i % 50) + " turn " + std::to_string(i);
        PathHint hint;
        std::vector<Slot> longest;
        size_t total = 0;
        t.match_best(text, {[](const void*, Slot) { return true; }, nullptr}, longest, total,
                     &hint);
        t.insert(text, static_cast<Slot>(th + 1), &hint);
        std::vector<Slot> slots{1, 2, 3, 4};
        std::vector<size_t> out(4);
        t.match(text, slots, out);
        EXPECT_EQ(out[static_cast<size_t>(th)], count_chars(text));
        if (i % 100 == 99) t.evict(2000);
      }
    });
  }
  for (auto& th : threads) th.join();
  for (Slot s = 1; s <= 4; ++s) EXPECT_LE(t.chars_of(s), 2000u + 200u);
}

}  // namespace
}  // namespace kvgate::prefix
