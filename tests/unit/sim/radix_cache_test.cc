// Tests for sim/radix_cache: hits, misses, partial pages, splits, LRU eviction of unlocked leaves,
// pinning by running requests, KV accounting, namespaces (cache_salt, LoRA), and the KV events
// (SGLang merged or per page, vLLM per node) whose ids must equal the chained block hashes of the
// cached sequence (seeded by the salt, mixed with the adapter's seed).
#include "sim/radix_cache.h"

#include <gtest/gtest.h>

#include <numeric>

namespace kvgate::sim {
namespace {

std::vector<int32_t> seq(int from, int n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), from);
  return v;
}

std::vector<int32_t> cat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Runs one request through the cache as a scheduler does: match, allocate the rest, insert, end.
int64_t serve(RadixCache& c, const std::vector<int32_t>& tokens, bool limit_match = true) {
  auto n = tokens.size();
  auto h = c.acquire(std::span(tokens).first(limit_match ? n - 1 : n));
  int64_t hit = h.tree_len;
  EXPECT_TRUE(c.allocate(h, static_cast<int64_t>(n) - hit));
  c.release(h, tokens, true);
  return hit;
}

RadixCacheConfig cfg(int64_t page, int64_t capacity, bool events = false) {
  return RadixCacheConfig{.page_size = page, .capacity = capacity, .events = events};
}

TEST(RadixCache, MissThenHitLimitedToWholePages) {
  RadixCache c(cfg(4, 1000));
  auto a = seq(100, 10);  // two full pages + 2 tokens
  EXPECT_EQ(serve(c, a), 0);
  EXPECT_EQ(c.tree_tokens(), 8) << "only full pages are cached";
  EXPECT_EQ(c.private_tokens(), 0);
  EXPECT_EQ(serve(c, a), 8);
  // Exactly two pages: the match stops at prompt_len - 1 = 7 tokens, i.e. one page.
  auto b = seq(100, 8);
  EXPECT_EQ(serve(c, b), 4);
  EXPECT_EQ(c.peek_match(a), 8);
  EXPECT_EQ(c.peek_match(seq(101, 8)), 0) << "a shifted prompt shares no page";
}

TEST(RadixCache, SplitsAndSharesPrefixes) {
  RadixCache c(cfg(1, 1000));
  auto sys = seq(1, 6);
  auto a = cat(sys, seq(50, 4));
  auto b = cat(sys, seq(60, 4));
  EXPECT_EQ(serve(c, a), 0);
  EXPECT_EQ(serve(c, b), 6) << "the shared system prompt";
  EXPECT_EQ(c.tree_tokens(), 14);
  EXPECT_EQ(c.node_count(), 3u) << "shared prefix + two branches";
  EXPECT_EQ(c.peek_match(a), 10);
  EXPECT_EQ(c.peek_match(b), 10);
}

TEST(RadixCache, EvictsLeastRecentlyUsedUnlockedLeaves) {
  RadixCache c(cfg(1, 12));
  auto a = seq(1, 5), b = seq(20, 5);
  serve(c, a);
  serve(c, b);
  EXPECT_EQ(c.tree_tokens(), 10);
  serve(c, a);  // a is now more recent than b
  RadixCache::Handle h;
  ASSERT_TRUE(c.allocate(h, 5));  // needs 3 more slots than free: evicts b, not a
  EXPECT_EQ(c.peek_match(a), 5);
  EXPECT_EQ(c.peek_match(b), 0);
  c.release(h, {}, false);
}

TEST(RadixCache, PagesOfRunningRequestsAreNeverEvicted) {
  RadixCache c(cfg(1, 10));
  auto a = seq(1, 6);
  serve(c, a);
  auto h = c.acquire(a);  // a running request pins all 6 pages
  EXPECT_EQ(h.tree_len, 6);
  EXPECT_EQ(c.locked_tokens(), 6);
  EXPECT_EQ(c.evictable_tokens(), 0);
  EXPECT_EQ(c.used_tokens(), 6);
  RadixCache::Handle other;
  EXPECT_FALSE(c.allocate(other, 5)) << "4 free slots, nothing evictable";
  EXPECT_EQ(c.peek_match(a), 6);
  EXPECT_TRUE(c.allocate(other, 4));
  c.release(other, {}, false);
  c.release(h, a, false);
  EXPECT_EQ(c.locked_tokens(), 0);
  EXPECT_TRUE(c.allocate(other, 9)) << "unpinned, a can go";
  EXPECT_EQ(c.peek_match(a), 0);
  c.release(other, {}, false);
  EXPECT_EQ(c.used_tokens(), 0);
}

TEST(RadixCache, CommitMovesPrivateSlotsIntoTheTree) {
  RadixCache c(cfg(4, 100));
  auto a = seq(1, 11);
  auto h = c.acquire(std::span(a).first(10));
  ASSERT_TRUE(c.allocate(h, 11));
  EXPECT_EQ(c.private_tokens(), 11);
  c.commit(h, a);  // cache_unfinished_req: 8 tokens in pages, 3 still private
  EXPECT_EQ(h.tree_len, 8);
  EXPECT_EQ(c.private_tokens(), 3);
  EXPECT_EQ(c.locked_tokens(), 8);
  EXPECT_EQ(c.used_tokens(), 11);
  // Generation adds tokens; at the end prompt + output with KV are cached.
  auto full = cat(a, seq(500, 6));
  ASSERT_TRUE(c.allocate(h, 5));  // the last generated token has no KV
  c.release(h, full, true);
  EXPECT_EQ(c.tree_tokens(), 16);
  EXPECT_EQ(c.private_tokens(), 0);
  EXPECT_EQ(c.used_tokens(), 0);
}

TEST(RadixCache, DuplicateInsertsFreeTheRequestsCopies) {
  RadixCache c(cfg(1, 100));
  auto a = seq(1, 8);
  auto h1 = c.acquire(std::span(a).first(7));
  auto h2 = c.acquire(std::span(a).first(7));
  ASSERT_TRUE(c.allocate(h1, 8));
  ASSERT_TRUE(c.allocate(h2, 8));  // both prefill the same prompt concurrently
  c.commit(h1, a);
  c.commit(h2, a);
  EXPECT_EQ(c.tree_tokens(), 8);
  EXPECT_EQ(c.private_tokens(), 0);
  c.release(h1, a, true);
  c.release(h2, a, true);
  EXPECT_EQ(c.used_tokens(), 0);
  EXPECT_EQ(c.evictable_tokens(), 8);
}

// The ids of every event, in order; BlockStored parents chain.
struct Seen {
  std::vector<uint64_t> stored, removed;
  std::vector<std::optional<uint64_t>> parents;
  int cleared = 0;
  void take(RadixCache& c) {
    for (auto& e : c.take_events()) {
      if (auto* s = std::get_if<kv::BlockStored>(&e)) {
        stored.insert(stored.end(), s->block_hashes.begin(), s->block_hashes.end());
        parents.push_back(s->parent_block_hash);
        EXPECT_EQ(s->medium, kv::Medium::kGpu);
        EXPECT_EQ(s->token_ids.size(), s->block_hashes.size() * static_cast<size_t>(s->block_size));
      } else if (auto* r = std::get_if<kv::BlockRemoved>(&e)) {
        removed.insert(removed.end(), r->block_hashes.begin(), r->block_hashes.end());
      } else {
        ++cleared;
      }
    }
  }
};

std::vector<uint64_t> chain(const std::vector<int32_t>& tokens, size_t page, kv::HashScheme s,
                            const kv::Digest* seed = nullptr) {
  kv::BlockHasher h(s);
  std::vector<uint64_t> ids(tokens.size() / page);
  h.chain_ids(tokens, page, ids, seed);
  return ids;
}

RadixCacheConfig per_page(int64_t page, int64_t capacity) {
  RadixCacheConfig c = cfg(page, capacity, true);
  c.grouping = EventGrouping::kPerPage;
  return c;
}

TEST(RadixCache, SglangEventsOnePerPageWithChainedHashes) {
  RadixCache c(per_page(2, 100));
  auto sys = seq(1, 4);
  auto a = cat(sys, seq(50, 4));
  auto b = cat(sys, seq(60, 5));
  Seen ev;
  serve(c, a);
  ev.take(c);
  EXPECT_EQ(ev.stored, chain(a, 2, kv::HashScheme::kSglang));
  ASSERT_EQ(ev.parents.size(), 4u);
  EXPECT_FALSE(ev.parents[0]) << "the first page hangs under the root";
  for (size_t i = 1; i < 4; ++i) EXPECT_EQ(ev.parents[i], ev.stored[i - 1]);
  serve(c, b);  // splits a's node after the system prompt; only b's new pages are stored
  Seen evb;
  evb.take(c);
  auto cb = chain(b, 2, kv::HashScheme::kSglang);
  EXPECT_EQ(evb.stored, std::vector<uint64_t>(cb.begin() + 2, cb.end()));
  EXPECT_EQ(evb.parents[0], cb[1]) << "parent: the last page of the shared prefix";
}

TEST(RadixCache, EvictionRemovesExactlyWhatWasStored) {
  for (bool vllm : {false, true}) {
    RadixCacheConfig conf = cfg(2, 12, true);
    conf.scheme = vllm ? kv::HashScheme::kVllmSha256Cbor : kv::HashScheme::kSglang;
    conf.grouping = vllm ? EventGrouping::kPerNode : EventGrouping::kPerPage;
    RadixCache c(conf);
    Seen ev;
    auto a = seq(1, 8), b = seq(100, 8);
    serve(c, a);
    serve(c, seq(1, 4));  // a's node splits twice: [1,2] [3,4] [5..8]
    ev.take(c);
    serve(c, b);  // 4 slots free, b needs 8: evicts the only leaf, a's pages 3-4
    ev.take(c);
    EXPECT_EQ(ev.stored.size(), 8u);
    auto ca = chain(a, 2, conf.scheme);
    EXPECT_EQ(ev.removed, std::vector<uint64_t>(ca.begin() + 2, ca.end()));
    c.reset();
    ev.take(c);
    EXPECT_EQ(ev.cleared, 1);
    EXPECT_EQ(c.tree_tokens(), 0);
    EXPECT_EQ(c.node_count(), 0u);
  }
}

TEST(RadixCache, VllmGroupsOneEventPerNode) {
  RadixCacheConfig conf = cfg(2, 100, true);
  conf.scheme = kv::HashScheme::kVllmSha256Cbor;
  conf.grouping = EventGrouping::kPerNode;
  RadixCache c(conf);
  auto a = seq(1, 9);
  serve(c, a);
  auto events = c.take_events();
  ASSERT_EQ(events.size(), 1u);
  const auto& s = std::get<kv::BlockStored>(events[0]);
  EXPECT_EQ(s.block_hashes, chain(a, 2, kv::HashScheme::kVllmSha256Cbor));
  EXPECT_EQ(s.token_ids, seq(1, 8));
  EXPECT_EQ(s.block_size, 2);
}

TEST(RadixCache, SglangMergesContiguousStoresAndRemovesPerNode) {
  RadixCache c(cfg(2, 12, true));  // kMerged, the default: the newest SGLang
  auto a = seq(1, 8);
  serve(c, a);
  auto events = c.take_events();
  ASSERT_EQ(events.size(), 1u) << "one BlockStored for the 4 contiguous pages";
  const auto& s = std::get<kv::BlockStored>(events[0]);
  EXPECT_EQ(s.block_hashes, chain(a, 2, kv::HashScheme::kSglang));
  EXPECT_EQ(s.token_ids, a) << "n hashes, n x page tokens";
  EXPECT_EQ(s.block_size, 2);
  EXPECT_FALSE(s.parent_block_hash);
  EXPECT_FALSE(s.cache_salt);

  // Two requests stored in one step, each under the root: no chain links them, two events.
  auto b = seq(100, 4), d = seq(200, 4);
  c.reset();
  (void)c.take_events();
  serve(c, b);
  serve(c, d);
  events = c.take_events();
  ASSERT_EQ(events.size(), 2u);
  // A store continuing the previous event's chain joins it: [b] then b's extension in one event.
  c.reset();
  (void)c.take_events();
  serve(c, b);
  serve(c, cat(b, seq(300, 4)));
  events = c.take_events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(std::get<kv::BlockStored>(events[0]).block_hashes,
            chain(cat(b, seq(300, 4)), 2, kv::HashScheme::kSglang));

  // Eviction: one BlockRemoved per node, and the removals of one step merge into one event.
  c.reset();
  (void)c.take_events();
  serve(c, seq(1, 4));
  serve(c, seq(50, 4));
  serve(c, seq(70, 4));
  (void)c.take_events();
  ASSERT_EQ(c.evict(8), 8);
  events = c.take_events();
  ASSERT_EQ(events.size(), 1u);
  const auto& r = std::get<kv::BlockRemoved>(events[0]);
  auto one = chain(seq(1, 4), 2, kv::HashScheme::kSglang);
  auto two = chain(seq(50, 4), 2, kv::HashScheme::kSglang);
  EXPECT_EQ(r.block_hashes, (std::vector<uint64_t>{one[0], one[1], two[0], two[1]}))
      << "the two least recently used nodes, oldest first";
  EXPECT_EQ(r.medium, kv::Medium::kGpu);
}

TEST(RadixCache, PerPageGroupingSplitsStoresAndRemovals) {
  RadixCache c(per_page(2, 8));
  serve(c, seq(1, 8));
  auto events = c.take_events();
  EXPECT_EQ(events.size(), 4u) << "one BlockStored per page";
  ASSERT_EQ(c.evict(8), 8);
  events = c.take_events();
  ASSERT_EQ(events.size(), 4u) << "one BlockRemoved per page";
  for (const auto& e : events) EXPECT_EQ(std::get<kv::BlockRemoved>(e).block_hashes.size(), 1u);
}

TEST(RadixCache, SaltsAndAdaptersKeepTheirOwnNamespaces) {
  RadixCache c(cfg(2, 1000));
  auto a = seq(1, 9);
  const CacheNamespace salted{.cache_salt = "tenant-a"};
  const CacheNamespace other{.cache_salt = "tenant-b"};
  const CacheNamespace lora{.lora = "sql-adapter"};
  serve(c, a);
  EXPECT_EQ(c.peek_match(a), 8);
  EXPECT_EQ(c.peek_match(a, salted), 0) << "a salted request never matches an unsalted prefix";
  EXPECT_EQ(c.peek_match(a, lora), 0);
  auto h = c.acquire(std::span(a).first(8), salted);
  EXPECT_EQ(h.tree_len, 0);
  ASSERT_TRUE(c.allocate(h, 9));
  c.release(h, a, true);
  EXPECT_EQ(c.peek_match(a, salted), 8);
  EXPECT_EQ(c.peek_match(a, other), 0) << "nor another salt's";
  EXPECT_EQ(c.tree_tokens(), 16) << "the same pages, cached twice";
  EXPECT_EQ(c.namespace_count(), 1u);
  // An empty salt is no salt (SGLang normalises it to None).
  EXPECT_EQ(c.peek_match(a, CacheNamespace{}), 8);
  // A namespace whose pages are all evicted is forgotten.
  ASSERT_EQ(c.evict(16), 16);
  EXPECT_EQ(c.namespace_count(), 0u);
  EXPECT_EQ(c.node_count(), 0u);
}

TEST(RadixCache, SaltedAndAdapterEventsSeedAndMixTheChain) {
  RadixCache c(cfg(2, 1000, true));
  auto a = seq(1, 8);
  const CacheNamespace salted{.cache_salt = "tenant-a"};
  auto h = c.acquire(std::span(a).first(7), salted);
  ASSERT_TRUE(c.allocate(h, 8));
  c.release(h, a, true);
  auto events = c.take_events();
  ASSERT_EQ(events.size(), 1u);
  const auto& s = std::get<kv::BlockStored>(events[0]);
  const kv::Digest seed = kv::sglang_salt_seed("tenant-a");
  EXPECT_EQ(s.block_hashes, chain(a, 2, kv::HashScheme::kSglang, &seed));
  EXPECT_NE(s.block_hashes, chain(a, 2, kv::HashScheme::kSglang));
  EXPECT_FALSE(s.parent_block_hash) << "still nil under the namespace's root";
  EXPECT_EQ(s.cache_salt, std::optional<std::string>("tenant-a")) << "the metadata element";

  // A LoRA adapter mixes every published id (parents too) with its seed.
  const CacheNamespace lora{.lora = "sql"};
  auto pre = seq(500, 4);
  h = c.acquire(std::span(pre).first(3), lora);
  ASSERT_TRUE(c.allocate(h, 4));
  c.release(h, pre, true);
  auto ext = cat(pre, seq(600, 2));
  h = c.acquire(std::span(ext).first(5), lora);
  ASSERT_EQ(h.tree_len, 4);
  ASSERT_TRUE(c.allocate(h, 2));
  c.release(h, ext, true);
  events = c.take_events();
  ASSERT_EQ(events.size(), 1u) << "the extension continues the adapter's chain: merged";
  const auto& l = std::get<kv::BlockStored>(events[0]);
  const kv::Digest lseed = kv::sglang_lora_seed("sql");
  std::vector<uint64_t> want;
  for (uint64_t id : chain(ext, 2, kv::HashScheme::kSglang)) {
    want.push_back(kv::sglang_lora_block_id(lseed, id));
  }
  EXPECT_EQ(l.block_hashes, want);
  EXPECT_FALSE(l.cache_salt) << "an adapter adds no metadata element";
}

}  // namespace
}  // namespace kvgate::sim
