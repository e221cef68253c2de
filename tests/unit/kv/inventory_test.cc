// Tests for kv/inventory: chained keys and namespaces, stores (single and merged), parents and
// orphans, removals by id and medium, clears, sources sharing nodes, tiers and their weight,
// pruning (the bound, the order, never a wrong hit), a randomized differential test against a
// plain reference model, and one writer with concurrent readers.
#include "kv/inventory.h"

#include <gtest/gtest.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <set>
#include <thread>

#include "util/random.h"

namespace kvgate::kv {
namespace {

constexpr size_t kPage = 4;

// One page per start value: {s*100, s*100+1, ...}.
std::vector<int32_t> pages(std::initializer_list<int32_t> starts, size_t page = kPage) {
  std::vector<int32_t> t;
  for (int32_t s : starts) {
    for (size_t i = 0; i < page; ++i) t.push_back(s * 100 + static_cast<int32_t>(i));
  }
  return t;
}

BlockStored stored(std::vector<uint64_t> ids, std::optional<uint64_t> parent,
                   std::vector<int32_t> tokens, Medium m = Medium::kGpu,
                   int64_t block_size = kPage) {
  BlockStored b;
  b.block_hashes = std::move(ids);
  b.parent_block_hash = parent;
  b.token_ids = std::move(tokens);
  b.block_size = block_size;
  b.medium = m;
  return b;
}

BlockRemoved removed(std::vector<uint64_t> ids, Medium m = Medium::kGpu) {
  BlockRemoved r;
  r.block_hashes = std::move(ids);
  r.medium = m;
  return r;
}

EventBatch batch(std::vector<Event> events) {
  EventBatch b;
  b.events = std::move(events);
  return b;
}

std::vector<BlockKey> keys(const std::vector<int32_t>& tokens, uint64_t seed = 0,
                           size_t page = kPage) {
  std::vector<BlockKey> k;
  chain_keys(tokens, page, seed, k);
  return k;
}

InventoryOptions opts(size_t max_blocks = size_t{1} << 20, double w = 0, size_t page = kPage) {
  InventoryOptions o;
  o.page_size = page;
  o.max_blocks = max_blocks;
  o.other_tier_weight = w;
  return o;
}

const SourceMatch* find(const std::vector<SourceMatch>& out, SourceId s) {
  for (const auto& m : out) {
    if (m.source == s) return &m;
  }
  return nullptr;
}

uint32_t gpu_of(const Inventory& inv, const std::vector<BlockKey>& k, SourceId s) {
  std::vector<SourceMatch> out;
  inv.match(k, out);
  const SourceMatch* m = find(out, s);
  return m != nullptr ? m->gpu_pages : 0;
}

TEST(InventoryKeys, ChainOverInt32LittleEndianSeededByThePreviousKey) {
  std::vector<int32_t> t = pages({1, 2, 3});
  t.push_back(7);  // a partial page has no key
  auto k = keys(t, 42);
  ASSERT_EQ(k.size(), 3u);
  uint8_t bytes[kPage * 4];
  for (size_t i = 0; i < kPage; ++i) {
    auto v = static_cast<uint32_t>(t[i]);
    for (int b = 0; b < 4; ++b) bytes[i * 4 + b] = static_cast<uint8_t>(v >> (8 * b));
  }
  EXPECT_EQ(k[0], XXH3_64bits_withSeed(bytes, sizeof bytes, 42));
  EXPECT_EQ(k[1], XXH3_64bits_withSeed(t.data() + kPage, kPage * 4, k[0]));
  EXPECT_EQ(k[2], XXH3_64bits_withSeed(t.data() + 2 * kPage, kPage * 4, k[1]));
  std::vector<BlockKey> none;
  chain_keys(t, 0, 0, none);
  EXPECT_TRUE(none.empty());
}

TEST(InventoryKeys, NamespaceSeeds) {
  EXPECT_EQ(chain_seed(std::nullopt, std::nullopt), 0u);
  std::set<uint64_t> seeds = {chain_seed("a", std::nullopt),
                              chain_seed("b", std::nullopt),
                              chain_seed("", std::nullopt),
                              chain_seed(std::nullopt, 0),
                              chain_seed(std::nullopt, 1),
                              chain_seed("a", 1),
                              chain_seed("a", 2),
                              chain_seed(std::nullopt, std::nullopt, "x"),
                              chain_seed(std::nullopt, std::nullopt, ""),
                              chain_seed("x", std::nullopt),
                              chain_seed("x", std::nullopt, ""),
                              chain_seed("", std::nullopt, "x"),
                              chain_seed("ab", std::nullopt, "c"),
                              chain_seed("a", std::nullopt, "bc")};
  EXPECT_EQ(seeds.size(), 14u);
  EXPECT_EQ(seeds.count(0), 0u);
  EXPECT_EQ(chain_seed("a", 1), chain_seed("a", 1));
}

TEST(Inventory, StoresChainAndMatchesLeadingPages) {
  Inventory inv(opts());
  auto st = inv.apply(1, batch({stored({11}, std::nullopt, pages({1})),
                                stored({12}, 11, pages({2})), stored({13}, 12, pages({3}))}));
  EXPECT_EQ(st.stored, 3u);
  EXPECT_EQ(inv.nodes(), 3u);
  EXPECT_EQ(inv.blocks(1, true), 3u);
  EXPECT_EQ(inv.blocks(1, false), 0u);
  EXPECT_EQ(inv.blocks(2, true), 0u);

  std::vector<SourceMatch> out;
  EXPECT_EQ(inv.match(keys(pages({1, 2, 3, 4})), out), 3u);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].source, 1u);
  EXPECT_EQ(out[0].gpu_pages, 3u);
  EXPECT_DOUBLE_EQ(out[0].pages, 3);
  EXPECT_EQ(inv.match(keys(pages({1, 2, 9})), out), 2u);
  EXPECT_EQ(inv.match(keys(pages({2, 3})), out), 0u);  // not a prefix
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(inv.match({}, out), 0u);
  EXPECT_GT(inv.bytes(), 0u);
}

TEST(Inventory, MergedEventIsTheSameChain) {
  Inventory merged(opts());
  Inventory single(opts());
  merged.apply(1, batch({stored({11, 12, 13}, std::nullopt, pages({1, 2, 3}))}));
  single.apply(1, batch({stored({11}, std::nullopt, pages({1})), stored({12}, 11, pages({2})),
                         stored({13}, 12, pages({3}))}));
  auto k = keys(pages({1, 2, 3}));
  EXPECT_EQ(gpu_of(merged, k, 1), 3u);
  EXPECT_EQ(gpu_of(single, k, 1), 3u);
  // A merged event continuing under a block of a merged event.
  merged.apply(1, batch({stored({14, 15}, 13, pages({4, 5}))}));
  EXPECT_EQ(gpu_of(merged, keys(pages({1, 2, 3, 4, 5})), 1), 5u);
}

TEST(Inventory, RemovalsCutTheLeadingRun) {
  Inventory inv(opts());
  inv.apply(1, batch({stored({11, 12, 13}, std::nullopt, pages({1, 2, 3}))}));
  auto k = keys(pages({1, 2, 3}));
  auto st = inv.apply(1, batch({removed({13})}));
  EXPECT_EQ(st.removed, 1u);
  EXPECT_EQ(gpu_of(inv, k, 1), 2u);
  EXPECT_EQ(inv.nodes(), 2u);
  EXPECT_EQ(inv.blocks(1, true), 2u);
  inv.apply(1, batch({removed({12, 11})}));
  EXPECT_EQ(gpu_of(inv, k, 1), 0u);
  EXPECT_EQ(inv.nodes(), 0u);
}

TEST(Inventory, ParentRemovedBeforeItsChildStaysALinkUntilTheChildGoes) {
  // Events were lost: the engine's removal of the child never arrived before the parent's.
  Inventory inv(opts());
  inv.apply(1, batch({stored({11, 12}, std::nullopt, pages({1, 2}))}));
  inv.apply(1, batch({removed({11})}));
  auto k = keys(pages({1, 2, 3}));
  std::vector<SourceMatch> out;
  EXPECT_EQ(inv.match(k, out), 0u);  // no holder of page 0: no hit past it either
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(inv.nodes(), 2u);  // the parent stays as a link under the child
  EXPECT_EQ(inv.blocks(1, true), 1u);
  // The child still resolves as a parent and is still removable.
  auto st = inv.apply(1, batch({stored({13}, 12, pages({3}))}));
  EXPECT_EQ(st.orphans, 0u);
  EXPECT_EQ(st.stored, 1u);
  EXPECT_EQ(inv.nodes(), 3u);
  // The parent stored again: the whole chain matches again.
  inv.apply(1, batch({stored({11}, std::nullopt, pages({1}))}));
  EXPECT_EQ(gpu_of(inv, k, 1), 3u);
  inv.apply(1, batch({removed({11, 12})}));
  EXPECT_EQ(inv.nodes(), 3u);
  inv.apply(1, batch({removed({13})}));
  EXPECT_EQ(inv.nodes(), 0u);  // freed from the leaf up
  EXPECT_EQ(inv.blocks(1, true), 0u);
}

// Replica bootstrap: what one source holds, exported and imported into another inventory (in
// which another source already holds part of it), matches alike and keeps working: its engine
// ids still name its blocks (removals, parents of later stores).
TEST(Inventory, AnExportedSourceImportsElsewhereWithItsIdsAndTiers) {
  Inventory a(opts(size_t{1} << 20, 0.5)), b(opts(size_t{1} << 20, 0.5));
  a.apply(1, batch({stored({11, 12, 13}, std::nullopt, pages({1, 2, 3})),
                    stored({21}, 11, pages({7})), stored({31, 32}, std::nullopt, pages({5, 6})),
                    stored({33}, 32, pages({8}), Medium::kCpuPinned)}));
  a.apply(2, batch({stored({91, 92}, std::nullopt, pages({1, 2}))}));  // another source, shared
  b.apply(2, batch({stored({91, 92}, std::nullopt, pages({1, 2}))}));
  SourceExport e = a.export_source(1);
  EXPECT_EQ(e.holdings.size(), 7u);
  b.import_source(5, e);  // another id in b: source ids are each inventory's own
  EXPECT_EQ(b.blocks(5, true), 6u);
  EXPECT_EQ(b.blocks(5, false), 1u);
  std::vector<SourceMatch> ma, mb;
  for (const auto& tokens : {pages({1, 2, 3, 4}), pages({1, 7}), pages({5, 6, 8}), pages({1, 2})}) {
    a.match(keys(tokens), ma);
    b.match(keys(tokens), mb);
    auto of = [](const std::vector<SourceMatch>& m, SourceId s) {
      for (const auto& x : m) {
        if (x.source == s) return x.pages;
      }
      return -1.0;
    };
    EXPECT_EQ(of(ma, 1), of(mb, 5));
    EXPECT_EQ(of(ma, 2), of(mb, 2));
  }
  // The engine's ids go on naming the blocks: a removal and a store under an imported parent.
  b.apply(5, batch({removed({13}), stored({14}, 12, pages({4}))}));
  b.match(keys(pages({1, 2, 4})), mb);
  ASSERT_FALSE(mb.empty());
  EXPECT_EQ(b.export_source(5).holdings.size(), 7u);
  // Importing again replaces (the source is cleared first); an empty export empties it.
  b.import_source(5, SourceExport{});
  EXPECT_EQ(b.blocks(5, true), 0u);
  b.match(keys(pages({1, 2})), mb);
  ASSERT_EQ(mb.size(), 1u);  // source 2's blocks stay
  EXPECT_EQ(mb[0].source, 2u);
  // A link whose parent is missing is skipped, with what hangs below it.
  SourceExport broken = e;
  const BlockKey chain5 = keys(pages({5}))[0];
  std::erase_if(broken.links, [&](const SourceExport::Link& l) { return l.key == chain5; });
  b.import_source(6, broken);
  EXPECT_EQ(b.blocks(6, true), 4u);  // pages 1, 2, 3 and 7; not 5, 6 (or 8, on CPU)
  EXPECT_EQ(b.blocks(6, false), 0u);
}

TEST(Inventory, OrphansAreCountedAndSkipped) {
  Inventory inv(opts());
  inv.apply(2, batch({stored({11}, std::nullopt, pages({1}))}));
  // Source 1 never stored 11, although source 2 did.
  auto st =
      inv.apply(1, batch({stored({12, 13}, 11, pages({2, 3})), stored({14}, 99, pages({4}))}));
  EXPECT_EQ(st.orphans, 2u);
  EXPECT_EQ(st.stored, 0u);
  EXPECT_EQ(inv.nodes(), 1u);
  EXPECT_EQ(inv.blocks(1, true), 0u);
}

TEST(Inventory, PageSizeMismatchesAreSkipped) {
  Inventory inv(opts());
  std::vector<int32_t> eight(8, 5);
  auto st = inv.apply(1, batch({stored({11}, std::nullopt, eight, Medium::kGpu, 8),
                                stored({12, 13}, std::nullopt, pages({1})),  // 1 page, 2 hashes
                                stored({14}, std::nullopt, pages({1, 2})),   // 2 pages, 1 hash
                                stored({15}, std::nullopt, {}, Medium::kGpu, 0)}));
  EXPECT_EQ(st.page_size_mismatches, 4u);
  EXPECT_EQ(st.stored, 0u);
  EXPECT_EQ(inv.nodes(), 0u);
}

TEST(Inventory, UnknownRemovalsAreCounted) {
  Inventory inv(opts());
  inv.apply(1, batch({stored({11}, std::nullopt, pages({1}))}));
  auto st = inv.apply(1, batch({removed({99}), removed({11}, Medium::kCpuPinned)}));
  EXPECT_EQ(st.unknown_removals, 2u);
  EXPECT_EQ(st.removed, 0u);
  st = inv.apply(2, batch({removed({11})}));  // another source's id
  EXPECT_EQ(st.unknown_removals, 1u);
  EXPECT_EQ(inv.blocks(1, true), 1u);
  // Medium none is GPU: stored as GPU, removed as none.
  st = inv.apply(1, batch({removed({11}, Medium::kNone)}));
  EXPECT_EQ(st.removed, 1u);
  EXPECT_EQ(inv.nodes(), 0u);
}

TEST(Inventory, ClearsAndRemoveSource) {
  Inventory inv(opts());
  auto k = keys(pages({1, 2}));
  for (SourceId s : {1u, 2u, 3u}) {
    inv.apply(s, batch({stored({11, 12}, std::nullopt, pages({1, 2}))}));
  }
  inv.apply(3, batch({stored({13}, 12, pages({3}))}));
  EXPECT_EQ(inv.nodes(), 3u);
  auto st = inv.apply(1, batch({AllBlocksCleared{}, stored({21}, std::nullopt, pages({7}))}));
  EXPECT_EQ(st.cleared, 1u);
  EXPECT_EQ(st.stored, 1u);  // events after the clear apply
  EXPECT_EQ(inv.blocks(1, true), 1u);
  std::vector<SourceMatch> out;
  inv.match(k, out);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].source, 2u);
  EXPECT_EQ(out[1].source, 3u);
  inv.clear(2);
  EXPECT_EQ(inv.blocks(2, true), 0u);
  EXPECT_EQ(inv.nodes(), 4u);
  inv.remove_source(3);
  EXPECT_EQ(inv.blocks(3, true), 0u);
  EXPECT_EQ(inv.nodes(), 1u);
  EXPECT_EQ(inv.match(k, out), 0u);
  // A source that left can come back; its old ids are gone.
  st = inv.apply(3, batch({stored({14}, 13, pages({4}))}));
  EXPECT_EQ(st.orphans, 1u);
  inv.remove_source(1);
  inv.remove_source(42);  // unknown: nothing
  inv.clear(42);
  EXPECT_EQ(inv.nodes(), 0u);
}

TEST(Inventory, SaltAndLoraLiveInTheirOwnNamespaces) {
  Inventory inv(opts());
  BlockStored salted = stored({11, 12}, std::nullopt, pages({1, 2}));
  salted.cache_salt = "tenant-a";
  BlockStored lora = stored({21, 22}, std::nullopt, pages({1, 2}));
  lora.lora_id = 7;
  BlockStored both = stored({31}, std::nullopt, pages({1}));
  both.cache_salt = "tenant-a";
  both.lora_id = 7;
  inv.apply(1, batch({salted}));
  inv.apply(2, batch({lora}));
  inv.apply(3, batch({both}));
  EXPECT_EQ(inv.nodes(), 5u);
  std::vector<SourceMatch> out;
  EXPECT_EQ(inv.match(keys(pages({1, 2})), out), 0u);  // plain: nothing
  EXPECT_EQ(inv.match(keys(pages({1, 2}), chain_seed("tenant-a", std::nullopt)), out), 2u);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].source, 1u);
  EXPECT_EQ(inv.match(keys(pages({1, 2}), chain_seed("tenant-b", std::nullopt)), out), 0u);
  EXPECT_EQ(inv.match(keys(pages({1, 2}), chain_seed(std::nullopt, 7)), out), 2u);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].source, 2u);
  EXPECT_EQ(inv.match(keys(pages({1, 2}), chain_seed("tenant-a", 7)), out), 1u);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].source, 3u);
  // A child under a salted parent continues the salted chain.
  inv.apply(1, batch({stored({13}, 12, pages({3}))}));
  EXPECT_EQ(gpu_of(inv, keys(pages({1, 2, 3}), chain_seed("tenant-a", std::nullopt)), 1), 3u);
}

TEST(Inventory, SourcesShareNodes) {
  Inventory inv(opts());
  inv.apply(1, batch({stored({11, 12, 13}, std::nullopt, pages({1, 2, 3}))}));
  inv.apply(2, batch({stored({91, 92}, std::nullopt, pages({1, 2}))}));  // its own ids
  EXPECT_EQ(inv.nodes(), 3u);
  std::vector<SourceMatch> out;
  EXPECT_EQ(inv.match(keys(pages({1, 2, 3})), out), 3u);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].source, 1u);
  EXPECT_EQ(out[0].gpu_pages, 3u);
  EXPECT_EQ(out[1].source, 2u);
  EXPECT_EQ(out[1].gpu_pages, 2u);
  inv.apply(1, batch({removed({11, 12, 13})}));
  EXPECT_EQ(inv.nodes(), 2u);
  EXPECT_EQ(gpu_of(inv, keys(pages({1, 2, 3})), 2), 2u);
  EXPECT_EQ(gpu_of(inv, keys(pages({1, 2, 3})), 1), 0u);
  // Many holders of one node (past the inline ones), then back down.
  for (SourceId s = 10; s < 30; ++s) inv.apply(s, batch({stored({1}, std::nullopt, pages({1}))}));
  inv.match(keys(pages({1})), out);
  EXPECT_EQ(out.size(), 21u);
  EXPECT_TRUE(std::is_sorted(out.begin(), out.end(),
                             [](const auto& a, const auto& b) { return a.source < b.source; }));
  for (SourceId s = 10; s < 30; ++s) inv.remove_source(s);
  inv.match(keys(pages({1})), out);
  EXPECT_EQ(out.size(), 1u);
}

TEST(Inventory, SourceIdsOfAnySize) {
  // Past 2^24 a lone holder does not fit the key table's summary: the walk reads the node.
  constexpr SourceId kBig = 0xfffffff0u;
  Inventory inv(opts(size_t{1} << 20, 0.5));
  inv.apply(kBig, batch({stored({11, 12}, std::nullopt, pages({1, 2}))}));
  inv.apply(kBig, batch({stored({13}, 12, pages({3}), Medium::kCpuPinned)}));
  inv.apply(1u << 24, batch({stored({11}, std::nullopt, pages({1}))}));
  std::vector<SourceMatch> out;
  EXPECT_EQ(inv.match(keys(pages({1, 2, 3})), out), 2u);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].source, 1u << 24);
  EXPECT_EQ(out[0].gpu_pages, 1u);
  EXPECT_EQ(out[1].source, kBig);
  EXPECT_EQ(out[1].gpu_pages, 2u);
  EXPECT_DOUBLE_EQ(out[1].pages, 2.5);
  EXPECT_EQ(inv.blocks(kBig, true), 2u);
  EXPECT_EQ(inv.blocks(kBig, false), 1u);
  inv.remove_source(kBig);
  inv.remove_source(1u << 24);
  EXPECT_EQ(inv.nodes(), 0u);
}

TEST(Inventory, OneSourceTwoTiers) {
  Inventory inv(opts(size_t{1} << 20, 0.5));
  inv.apply(1, batch({stored({11, 12}, std::nullopt, pages({1, 2}), Medium::kGpu),
                      stored({11, 12}, std::nullopt, pages({1, 2}), Medium::kCpuPinned)}));
  EXPECT_EQ(inv.nodes(), 2u);
  EXPECT_EQ(inv.blocks(1, true), 2u);
  EXPECT_EQ(inv.blocks(1, false), 2u);
  auto k = keys(pages({1, 2}));
  std::vector<SourceMatch> out;
  EXPECT_EQ(inv.match(k, out), 2u);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_DOUBLE_EQ(out[0].pages, 2);
  // Evicted from GPU, kept on CPU (HiCache's write-back).
  auto st = inv.apply(1, batch({removed({11, 12}, Medium::kGpu)}));
  EXPECT_EQ(st.removed, 2u);
  EXPECT_EQ(inv.blocks(1, true), 0u);
  EXPECT_EQ(inv.blocks(1, false), 2u);
  EXPECT_EQ(inv.match(k, out), 0u);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].gpu_pages, 0u);
  EXPECT_DOUBLE_EQ(out[0].pages, 1.0);  // 2 pages x 0.5
  // Disk is another medium of the other tier: removing CPU keeps the disk copy.
  inv.apply(1, batch({stored({11}, std::nullopt, pages({1}), Medium::kDisk)}));
  inv.apply(1, batch({removed({11, 12}, Medium::kCpuPinned)}));
  EXPECT_EQ(inv.blocks(1, false), 1u);
  EXPECT_EQ(inv.nodes(), 1u);
  inv.apply(1, batch({removed({11}, Medium::kDisk)}));
  EXPECT_EQ(inv.nodes(), 0u);
}

TEST(Inventory, OtherTierWeightDefinition) {
  // Pages 0-1 on GPU, 2 on CPU only, 3 on GPU again, 4 nowhere.
  auto events = batch({stored({11, 12}, std::nullopt, pages({1, 2}), Medium::kGpu),
                       stored({13}, 12, pages({3}), Medium::kCpuPinned),
                       stored({14}, 13, pages({4}), Medium::kGpu)});
  auto k = keys(pages({1, 2, 3, 4, 5}));
  std::vector<SourceMatch> out;

  Inventory w0(opts(size_t{1} << 20, 0));
  w0.apply(1, events);
  EXPECT_EQ(w0.match(k, out), 2u);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].gpu_pages, 2u);
  EXPECT_DOUBLE_EQ(out[0].pages, 2);  // other tiers ignored

  Inventory w(opts(size_t{1} << 20, 0.25));
  w.apply(1, events);
  EXPECT_EQ(w.match(k, out), 2u);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].gpu_pages, 2u);
  EXPECT_DOUBLE_EQ(out[0].pages, 2 + 0.25 * 2);  // pages 2 and 3 each count 0.25

  // A source holding page 0 only on CPU: listed only when other tiers count.
  w0.apply(2, batch({stored({11}, std::nullopt, pages({1}), Medium::kCpuPinned)}));
  w.apply(2, batch({stored({11}, std::nullopt, pages({1}), Medium::kCpuPinned)}));
  w0.match(k, out);
  EXPECT_EQ(find(out, 2), nullptr);
  w.match(k, out);
  ASSERT_NE(find(out, 2), nullptr);
  EXPECT_EQ(find(out, 2)->gpu_pages, 0u);
  EXPECT_DOUBLE_EQ(find(out, 2)->pages, 0.25);
}

TEST(Inventory, TwoEngineIdsForOneNode) {
  // An engine whose hash covers more than the tokens (vLLM's multimodal extra keys) stores one
  // page under two ids: both hold the node until both are gone.
  Inventory inv(opts());
  inv.apply(1, batch({stored({11}, std::nullopt, pages({1})),
                      stored({99}, std::nullopt, pages({1}), Medium::kCpuPinned)}));
  EXPECT_EQ(inv.nodes(), 1u);
  EXPECT_EQ(inv.blocks(1, true), 1u);
  EXPECT_EQ(inv.blocks(1, false), 1u);
  inv.apply(1, batch({removed({11})}));
  EXPECT_EQ(inv.blocks(1, true), 0u);
  EXPECT_EQ(inv.blocks(1, false), 1u);
  EXPECT_EQ(inv.nodes(), 1u);
  // 99 is now the holder's id: a child under it resolves.
  auto st = inv.apply(1, batch({stored({12}, 99, pages({2}))}));
  EXPECT_EQ(st.stored, 1u);
  inv.apply(1, batch({removed({12}), removed({99}, Medium::kCpuPinned)}));
  EXPECT_EQ(inv.nodes(), 0u);
  EXPECT_EQ(inv.blocks(1, false), 0u);
}

TEST(Inventory, AnIdReusedForOtherContentMovesItsHolding) {
  Inventory inv(opts());
  inv.apply(1, batch({stored({11}, std::nullopt, pages({1}))}));
  inv.apply(1, batch({stored({11}, std::nullopt, pages({2}))}));
  EXPECT_EQ(inv.nodes(), 1u);
  EXPECT_EQ(gpu_of(inv, keys(pages({1})), 1), 0u);
  EXPECT_EQ(gpu_of(inv, keys(pages({2})), 1), 1u);
  EXPECT_EQ(inv.blocks(1, true), 1u);
}

TEST(Inventory, AnIdReusedOntoALinkWhoseOnlyChildItLeaves) {
  // Page 1's node has lost its holder (a link above page 2's). Id 12 moves from page 2 to page 1:
  // freeing page 2's node must not take page 1's link with it, since it is 12's new home.
  Inventory inv(opts());
  inv.apply(1, batch({stored({11, 12}, std::nullopt, pages({1, 2}))}));
  inv.apply(1, batch({removed({11})}));
  inv.apply(1, batch({stored({12}, std::nullopt, pages({1}))}));
  EXPECT_EQ(inv.nodes(), 1u);
  EXPECT_EQ(gpu_of(inv, keys(pages({1, 2})), 1), 1u);
  EXPECT_EQ(inv.blocks(1, true), 1u);
  inv.apply(1, batch({stored({13}, 12, pages({3}))}));
  EXPECT_EQ(gpu_of(inv, keys(pages({1, 3})), 1), 2u);
  inv.apply(1, batch({removed({12, 13})}));
  EXPECT_EQ(inv.nodes(), 0u);
}

TEST(InventoryPruning, PrunesTheLeastRecentlyStoredOrMatchedLeaves) {
  Inventory inv(opts(4));
  inv.apply(1, batch({stored({11, 12}, std::nullopt, pages({1, 2}))}));  // A
  inv.apply(1, batch({stored({21, 22}, std::nullopt, pages({3, 4}))}));  // B
  auto a = keys(pages({1, 2}));
  auto b = keys(pages({3, 4}));
  EXPECT_EQ(gpu_of(inv, a, 1), 2u);  // A matched after B was stored
  inv.apply(1, batch({stored({31, 32}, std::nullopt, pages({5, 6}))}));  // C
  EXPECT_EQ(inv.nodes(), 4u);
  EXPECT_EQ(inv.pruned(), 2u);
  EXPECT_EQ(gpu_of(inv, a, 1), 2u);
  EXPECT_EQ(gpu_of(inv, b, 1), 0u);
  EXPECT_EQ(gpu_of(inv, keys(pages({5, 6})), 1), 2u);
  EXPECT_EQ(inv.blocks(1, true), 4u);
  // B's ids went with it: a removal is unknown, a child is an orphan.
  auto st = inv.apply(1, batch({removed({22}), stored({23}, 22, pages({7}))}));
  EXPECT_EQ(st.unknown_removals, 1u);
  EXPECT_EQ(st.orphans, 1u);
}

TEST(InventoryPruning, AStoreAgainIsRecent) {
  Inventory inv(opts(6));
  inv.apply(1, batch({stored({11, 12}, std::nullopt, pages({1, 2}))}));  // A
  inv.apply(1, batch({stored({21, 22}, std::nullopt, pages({3, 4}))}));  // B
  inv.apply(1, batch({stored({31, 32}, std::nullopt, pages({5, 6}))}));  // C
  inv.apply(2, batch({stored({11, 12}, std::nullopt, pages({1, 2}))}));  // A again, elsewhere
  inv.apply(1, batch({stored({41}, std::nullopt, pages({8}))}));
  EXPECT_EQ(inv.nodes(), 6u);
  EXPECT_EQ(inv.pruned(), 1u);
  EXPECT_EQ(gpu_of(inv, keys(pages({1, 2})), 1), 2u);
  EXPECT_EQ(gpu_of(inv, keys(pages({1, 2})), 2), 2u);
  EXPECT_EQ(gpu_of(inv, keys(pages({3, 4})), 1), 1u);  // B, now the oldest, lost its leaf
  EXPECT_EQ(gpu_of(inv, keys(pages({5, 6})), 1), 2u);
}

TEST(InventoryPruning, MatchesCountAsUseAndProtectTheirPrefix) {
  // Recency counts matches: A matched, then B, then D stored. Pruning 4 nodes takes C (never
  // matched), then A (matched before B), never the newest D. A match touches only the deepest
  // node it reached; its ancestors go only after it.
  Inventory inv(opts(6));
  inv.apply(1, batch({stored({11, 12}, std::nullopt, pages({1, 2}))}));  // A
  inv.apply(1, batch({stored({21, 22}, std::nullopt, pages({3, 4}))}));  // B
  inv.apply(1, batch({stored({31, 32}, std::nullopt, pages({5, 6}))}));  // C
  EXPECT_EQ(gpu_of(inv, keys(pages({1, 2})), 1), 2u);
  inv.apply(9, batch({}));  // a batch between the two matches: B's is the more recent
  EXPECT_EQ(gpu_of(inv, keys(pages({3, 4})), 1), 2u);
  inv.apply(1, batch({stored({41, 42, 43, 44}, std::nullopt, pages({7, 8, 9, 10}))}));  // D
  EXPECT_EQ(inv.nodes(), 6u);
  EXPECT_EQ(inv.pruned(), 4u);
  EXPECT_EQ(gpu_of(inv, keys(pages({7, 8, 9, 10})), 1), 4u);
  EXPECT_EQ(gpu_of(inv, keys(pages({3, 4})), 1), 2u);
  EXPECT_EQ(gpu_of(inv, keys(pages({5, 6})), 1), 0u);
  EXPECT_EQ(gpu_of(inv, keys(pages({1, 2})), 1), 0u);
  // A match of a prefix only (page 7 of D) protects D's page 7 node but not D's leaf.
  inv.apply(9, batch({}));
  EXPECT_EQ(gpu_of(inv, keys(pages({7, 99})), 1), 1u);
  inv.apply(9, batch({}));
  EXPECT_EQ(gpu_of(inv, keys(pages({3, 4})), 1), 2u);
  inv.apply(1, batch({stored({51}, std::nullopt, pages({11}))}));
  EXPECT_EQ(gpu_of(inv, keys(pages({7, 8, 9, 10})), 1), 3u);  // D's leaf was the oldest
}

TEST(InventoryPruning, APrunedSharedNodeLeavesEverySource) {
  Inventory inv(opts(2));
  inv.apply(1, batch({stored({11, 12}, std::nullopt, pages({1, 2}))}));
  inv.apply(2, batch({stored({81, 82}, std::nullopt, pages({1, 2}))}));
  inv.apply(3, batch({stored({51}, std::nullopt, pages({9}))}));
  EXPECT_EQ(inv.nodes(), 2u);
  EXPECT_EQ(inv.blocks(1, true), 1u);
  EXPECT_EQ(inv.blocks(2, true), 1u);
  auto st = inv.apply(1, batch({removed({12})}));
  EXPECT_EQ(st.unknown_removals, 1u);
  st = inv.apply(2, batch({removed({82, 81})}));
  EXPECT_EQ(st.unknown_removals, 1u);
  EXPECT_EQ(st.removed, 1u);
  inv.remove_source(1);
  inv.remove_source(3);
  EXPECT_EQ(inv.nodes(), 0u);
}

// ---- a plain model of the same contract, for the randomized tests ----

uint8_t ref_bit(Medium m) {
  switch (m) {
    case Medium::kNone:
    case Medium::kGpu:
      return 1;
    case Medium::kCpuPinned:
      return 2;
    case Medium::kDisk:
      return 4;
    case Medium::kExternal:
      return 8;
    case Medium::kOther:
      return 16;
  }
  return 16;
}

class Reference {
 public:
  struct Entry {
    BlockKey key = 0;
    uint8_t media = 0;
    std::vector<int32_t> path;  // every token from the chain's first page to this block's last
    uint64_t seed = 0;
  };
  using Ids = std::map<uint64_t, Entry>;

  explicit Reference(size_t page) : page_(page) {}

  ApplyStats apply(SourceId s, const EventBatch& b) {
    ApplyStats st;
    Ids& ids = src_[s];
    for (const Event& ev : b.events) {
      if (const auto* bs = std::get_if<BlockStored>(&ev)) {
        size_t n = bs->block_hashes.size();
        if (bs->block_size != static_cast<int64_t>(page_) || bs->token_ids.size() != n * page_) {
          ++st.page_size_mismatches;
          continue;
        }
        if (n == 0) continue;
        std::vector<int32_t> path;
        uint64_t seed = 0;
        BlockKey prev = 0;
        if (bs->parent_block_hash) {
          auto it = ids.find(*bs->parent_block_hash);
          if (it == ids.end()) {
            ++st.orphans;
            for (uint64_t id : bs->block_hashes) ids.erase(id);
            continue;
          }
          path = it->second.path;
          seed = it->second.seed;
          prev = it->second.key;
        } else {
          seed = chain_seed(
              bs->cache_salt ? std::optional<std::string_view>(*bs->cache_salt) : std::nullopt,
              bs->lora_id);
          prev = seed;
        }
        std::vector<BlockKey> ks;
        chain_keys(bs->token_ids, page_, prev, ks);
        for (size_t i = 0; i < n; ++i) {
          path.insert(path.end(), bs->token_ids.begin() + static_cast<ptrdiff_t>(i * page_),
                      bs->token_ids.begin() + static_cast<ptrdiff_t>((i + 1) * page_));
          Entry& e = ids[bs->block_hashes[i]];
          if (e.media != 0 && e.key == ks[i]) {
            e.media |= ref_bit(bs->medium);
          } else {
            e = Entry{ks[i], ref_bit(bs->medium), path, seed};
          }
          ++st.stored;
        }
      } else if (const auto* br = std::get_if<BlockRemoved>(&ev)) {
        uint8_t m = ref_bit(br->medium);
        for (uint64_t id : br->block_hashes) {
          auto it = ids.find(id);
          if (it == ids.end() || (it->second.media & m) == 0) {
            ++st.unknown_removals;
            continue;
          }
          it->second.media &= static_cast<uint8_t>(~m);
          if (it->second.media == 0) ids.erase(it);
          ++st.removed;
        }
      } else {
        ids.clear();
        ++st.cleared;
      }
    }
    return st;
  }

  void remove_source(SourceId s) { src_.erase(s); }

  std::map<BlockKey, uint8_t> tiers(SourceId s) const {
    std::map<BlockKey, uint8_t> t;
    auto it = src_.find(s);
    if (it == src_.end()) return t;
    for (const auto& [id, e] : it->second) t[e.key] |= e.media;
    return t;
  }

  size_t blocks(SourceId s, bool gpu) const {
    size_t n = 0;
    for (const auto& [k, m] : tiers(s)) n += gpu ? (m & 1) != 0 : (m & ~1) != 0;
    return n;
  }

  std::vector<SourceMatch> match(const std::vector<BlockKey>& k, double w) const {
    std::vector<SourceMatch> out;
    for (const auto& [s, ids] : src_) {
      auto t = tiers(s);
      uint32_t g = 0;
      uint32_t a = 0;
      while (g < k.size() && t.contains(k[g]) && (t[k[g]] & 1) != 0) ++g;
      while (a < k.size() && t.contains(k[a])) ++a;
      if (w > 0 ? a > 0 : g > 0) {
        out.push_back(SourceMatch{s, g, w > 0 ? g + w * (a - g) : g});
      }
    }
    return out;
  }

  const Ids* ids(SourceId s) const {
    auto it = src_.find(s);
    return it == src_.end() ? nullptr : &it->second;
  }

 private:
  size_t page_;
  std::map<SourceId, Ids> src_;
};

// Event streams shaped like engines': content-derived ids (so sources storing the same content
// use the same ids), children under held blocks, a small vocabulary (so chains and sources
// overlap), some random and reused ids, orphans, page-size mismatches, tiers, namespaces.
class Generator {
 public:
  static constexpr size_t kGenPage = 2;
  Generator(uint64_t seed, const Reference& ref) : rng_(seed), ref_(ref) {}

  SourceId source() { return kSources[rng_.below(std::size(kSources))]; }

  EventBatch next(SourceId s) {
    EventBatch b;
    size_t n = 1 + rng_.below(5);
    for (size_t i = 0; i < n; ++i) {
      double r = rng_.uniform();
      if (r < 0.6) {
        b.events.emplace_back(store(s));
      } else if (r < 0.98) {
        b.events.emplace_back(remove(s));
      } else {
        b.events.emplace_back(AllBlocksCleared{});
      }
    }
    return b;
  }

  std::vector<BlockKey> query() {
    std::vector<int32_t> tokens;
    uint64_t seed = 0;
    const Reference::Ids* ids = ref_.ids(source());
    if (ids != nullptr && !ids->empty() && rng_.uniform() < 0.8) {
      auto it = ids->begin();
      std::advance(it, static_cast<ptrdiff_t>(rng_.below(ids->size())));
      tokens = it->second.path;
      seed = it->second.seed;
    }
    size_t extra = rng_.below(3) + (tokens.empty() ? 1 : 0);
    for (size_t i = 0; i < extra * kGenPage; ++i) tokens.push_back(token());
    std::vector<BlockKey> k;
    chain_keys(tokens, kGenPage, seed, k);
    return k;
  }

  static constexpr SourceId kSources[] = {0, 1, 2, 3, 1000};

 private:
  int32_t token() { return static_cast<int32_t>(rng_.below(3)); }
  Medium medium() {
    static constexpr Medium kMedia[] = {Medium::kGpu, Medium::kGpu, Medium::kNone,
                                        Medium::kCpuPinned, Medium::kDisk};
    return kMedia[rng_.below(std::size(kMedia))];
  }
  const Reference::Entry* held(SourceId s, uint64_t* id) {
    const Reference::Ids* ids = ref_.ids(s);
    if (ids == nullptr || ids->empty()) return nullptr;
    auto it = ids->begin();
    std::advance(it, static_cast<ptrdiff_t>(rng_.below(ids->size())));
    *id = it->first;
    return &it->second;
  }

  BlockStored store(SourceId s) {
    BlockStored b;
    b.block_size = kGenPage;
    b.medium = medium();
    uint64_t prev = 0;
    double r = rng_.uniform();
    uint64_t parent = 0;
    if (r < 0.65 && held(s, &parent) != nullptr) {
      b.parent_block_hash = parent;
      prev = parent;
    } else if (r < 0.7) {
      b.parent_block_hash = rng_.next();  // unknown: an orphan
    } else {
      double ns = rng_.uniform();
      if (ns < 0.15) b.cache_salt = rng_.below(2) == 0 ? "a" : "b";
      if (ns > 0.85) b.lora_id = static_cast<int64_t>(rng_.below(2));
      prev = chain_seed(
          b.cache_salt ? std::optional<std::string_view>(*b.cache_salt) : std::nullopt, b.lora_id);
    }
    size_t n = 1 + rng_.below(3);
    for (size_t i = 0; i < n; ++i) {
      size_t at = b.token_ids.size();
      for (size_t j = 0; j < kGenPage; ++j) b.token_ids.push_back(token());
      uint64_t id = XXH3_64bits_withSeed(b.token_ids.data() + at, kGenPage * 4, prev);
      double x = rng_.uniform();
      uint64_t other = 0;
      if (x < 0.08) {
        id = rng_.below(1u << 20);  // an id unrelated to content
      } else if (x < 0.1 && held(s, &other) != nullptr) {
        id = other;  // an id reused for other content
      }
      b.block_hashes.push_back(id);
      prev = id;
    }
    if (rng_.uniform() < 0.03) {
      if (rng_.below(2) == 0) {
        b.block_size = kGenPage + 1;
      } else {
        b.token_ids.pop_back();
      }
    }
    return b;
  }

  BlockRemoved remove(SourceId s) {
    BlockRemoved r;
    r.medium = medium();
    size_t n = 1 + rng_.below(3);
    for (size_t i = 0; i < n; ++i) {
      uint64_t id = 0;
      if (rng_.uniform() < 0.1 || held(s, &id) == nullptr) id = rng_.next();
      r.block_hashes.push_back(id);
    }
    return r;
  }

  Rng rng_;
  const Reference& ref_;
};

void expect_same(const std::vector<SourceMatch>& got, const std::vector<SourceMatch>& want,
                 const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].source, want[i].source) << what;
    EXPECT_EQ(got[i].gpu_pages, want[i].gpu_pages) << what;
    EXPECT_DOUBLE_EQ(got[i].pages, want[i].pages) << what;
  }
}

TEST(InventoryDifferential, MatchesAPlainModel) {
  constexpr double kW = 0.5;
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    SCOPED_TRACE(seed);
    Reference ref(Generator::kGenPage);
    Generator gen(seed, ref);
    Inventory inv0(opts(size_t{1} << 20, 0, Generator::kGenPage));
    Inventory invw(opts(size_t{1} << 20, kW, Generator::kGenPage));
    std::vector<SourceMatch> out;
    for (int step = 0; step < 1500; ++step) {
      SourceId s = gen.source();
      if (step % 97 == 96) {  // now and then a source leaves
        inv0.remove_source(s);
        invw.remove_source(s);
        ref.remove_source(s);
        continue;
      }
      EventBatch b = gen.next(s);
      ApplyStats a = inv0.apply(s, b);
      ApplyStats aw = invw.apply(s, b);
      ApplyStats want = ref.apply(s, b);
      ASSERT_EQ(a.stored, want.stored);
      ASSERT_EQ(a.removed, want.removed);
      ASSERT_EQ(a.cleared, want.cleared);
      ASSERT_EQ(a.orphans, want.orphans);
      ASSERT_EQ(a.page_size_mismatches, want.page_size_mismatches);
      ASSERT_EQ(a.unknown_removals, want.unknown_removals);
      ASSERT_EQ(aw.stored, want.stored);
      for (SourceId t : Generator::kSources) {
        ASSERT_EQ(inv0.blocks(t, true), ref.blocks(t, true)) << "step " << step;
        ASSERT_EQ(inv0.blocks(t, false), ref.blocks(t, false)) << "step " << step;
      }
      for (int q = 0; q < 4; ++q) {
        auto k = gen.query();
        size_t best = inv0.match(k, out);
        auto want0 = ref.match(k, 0);
        expect_same(out, want0, "w=0");
        size_t want_best = 0;
        for (const auto& m : want0) want_best = std::max<size_t>(want_best, m.gpu_pages);
        EXPECT_EQ(best, want_best);
        invw.match(k, out);
        expect_same(out, ref.match(k, kW), "w>0");
        if (HasFailure()) return;
      }
    }
    for (SourceId t : Generator::kSources) {
      inv0.remove_source(t);
      invw.remove_source(t);
    }
    EXPECT_EQ(inv0.nodes(), 0u);
    EXPECT_EQ(invw.nodes(), 0u);
  }
}

TEST(InventoryDifferential, PruningKeepsTheBoundAndNeverGivesAWrongHit) {
  constexpr double kW = 0.5;
  constexpr size_t kMax = 40;
  for (uint64_t seed = 11; seed <= 14; ++seed) {
    SCOPED_TRACE(seed);
    Reference ref(Generator::kGenPage);
    Generator gen(seed, ref);
    Inventory inv(opts(kMax, kW, Generator::kGenPage));
    std::vector<SourceMatch> out;
    for (int step = 0; step < 1500; ++step) {
      SourceId s = gen.source();
      EventBatch b = gen.next(s);
      inv.apply(s, b);
      ref.apply(s, b);
      ASSERT_LE(inv.nodes(), kMax);
      for (SourceId t : Generator::kSources) {
        ASSERT_LE(inv.blocks(t, true), ref.blocks(t, true));
        ASSERT_LE(inv.blocks(t, false), ref.blocks(t, false));
      }
      for (int q = 0; q < 4; ++q) {
        auto k = gen.query();
        inv.match(k, out);
        auto want = ref.match(k, kW);
        for (const SourceMatch& m : out) {
          auto it = std::find_if(want.begin(), want.end(),
                                 [&](const SourceMatch& x) { return x.source == m.source; });
          ASSERT_NE(it, want.end()) << "a hit the model does not have";
          ASSERT_LE(m.gpu_pages, it->gpu_pages);
          ASSERT_LE(m.pages, it->pages + 1e-9);
        }
      }
    }
    EXPECT_GT(inv.pruned(), 0u);
    for (SourceId t : Generator::kSources) inv.remove_source(t);
    EXPECT_EQ(inv.nodes(), 0u);
  }
}

// One writer applying batches, readers matching meanwhile (run it under TSan too). Every match
// must be internally sound and never claim more than was ever stored.
TEST(InventoryConcurrency, OneWriterManyReaders) {
  Reference ref(Generator::kGenPage);
  Generator gen(77, ref);
  std::vector<std::pair<SourceId, EventBatch>> batches;
  std::set<std::pair<SourceId, BlockKey>> ever;
  std::vector<std::vector<BlockKey>> queries;  // drawn along the way: chains of every period
  for (int i = 0; i < 3000; ++i) {
    SourceId s = gen.source();
    batches.emplace_back(s, gen.next(s));
    ref.apply(s, batches.back().second);
    for (SourceId t : Generator::kSources) {
      for (const auto& [k, m] : ref.tiers(t)) ever.emplace(t, k);
    }
    if (i % 10 == 0) queries.push_back(gen.query());
  }

  Inventory inv(opts(64, 0.5, Generator::kGenPage));
  std::atomic<bool> done{false};
  std::atomic<int> violations{0};
  auto reader = [&](size_t offset) {
    std::vector<SourceMatch> out;
    for (size_t round = 0; !done.load() || round < 2000; ++round) {
      const auto& k = queries[(offset + round) % queries.size()];
      size_t best = inv.match(k, out);
      size_t want_best = 0;
      for (size_t i = 0; i < out.size(); ++i) {
        const SourceMatch& m = out[i];
        size_t lead = 0;
        while (lead < k.size() && ever.contains({m.source, k[lead]})) ++lead;
        bool ok = m.gpu_pages <= lead && m.pages <= static_cast<double>(lead) + 1e-9 &&
                  (m.gpu_pages > 0 || m.pages > 0) && (i == 0 || out[i - 1].source < m.source);
        if (!ok) violations.fetch_add(1);
        want_best = std::max<size_t>(want_best, m.gpu_pages);
      }
      if (best != want_best) violations.fetch_add(1);
      if (round % 64 == 0 && inv.nodes() > 64 + 3) violations.fetch_add(1);
      if (round % 64 == 1) (void)(inv.bytes() + inv.blocks(1, true) + inv.pruned());
    }
  };
  std::vector<std::thread> readers;
  for (size_t r = 0; r < 3; ++r) readers.emplace_back(reader, r * 17);
  std::thread writer([&] {
    for (size_t i = 0; i < batches.size(); ++i) {
      inv.apply(batches[i].first, batches[i].second);
      if (i % 500 == 499) inv.clear(batches[i].first);
    }
    done.store(true);
  });
  writer.join();
  for (auto& t : readers) t.join();
  EXPECT_EQ(violations.load(), 0);
  EXPECT_LE(inv.nodes(), 64u);
  // Still whole afterwards: a new chain stores and matches, every source can be removed.
  inv.apply(7,
            batch({stored({1, 2}, std::nullopt, {5, 6, 7, 8}, Medium::kGpu, Generator::kGenPage)}));
  EXPECT_EQ(gpu_of(inv, keys({5, 6, 7, 8}, 0, Generator::kGenPage), 7), 2u);
  for (SourceId t : Generator::kSources) inv.remove_source(t);
  inv.remove_source(7);
  EXPECT_EQ(inv.nodes(), 0u);
}

}  // namespace
}  // namespace kvgate::kv
