// Micro-benchmarks of kv/inventory (issue 11): event ingest (blocks/s, as engines send them:
// merged BlockStored events of 32 pages) and the lookup of an 8,192-token request (512 pages of 16)
// against ~1M blocks held by 16 sources, p50/p99 per lookup from a timed loop, memory per block.
//
// The data: 2,048 conversations of 8,192 tokens, 128 per source; each starts with one of 64 shared
// 1,024-token system prompts (stored once per source that uses it, so most prompt pages have many
// holders), then 7,168 tokens of its own. Lookups replay stored conversations, chosen at random so
// the walk touches memory all over the inventory, not a cached corner of it.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <optional>
#include <span>

#include "kv/inventory.h"
#include "util/random.h"

namespace kvgate::kv {
namespace {

constexpr size_t kPage = 16;
constexpr uint32_t kSources = 16;
constexpr size_t kPrompts = 64;
constexpr size_t kPromptPages = 64;
constexpr size_t kConversations = 2048;
constexpr size_t kConvPages = 448;  // 64 + 448 = 512 pages = 8,192 tokens
constexpr size_t kPagesPerEvent = 32;

// One stored block: its engine id, its parent's (nullopt: the first page), its tokens.
struct Block {
  uint64_t id;
  std::optional<uint64_t> parent;
  std::span<const int32_t> tokens;
};

struct Workload {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::vector<int32_t>> own;        // per conversation
  std::vector<SourceId> source;                 // per conversation
  std::vector<std::vector<Block>> blocks;       // per conversation, in chain order
  std::vector<std::vector<BlockKey>> requests;  // per conversation, 512 keys
  size_t total = 0;
  // As engines send them: per conversation one batch of merged events of 32 blocks.
  std::vector<std::pair<SourceId, EventBatch>> batches() const;
  // The same blocks one per event, round robin over the conversations: consecutive nodes never
  // belong to one chain, so a lookup finds every page through the key table.
  std::vector<std::pair<SourceId, EventBatch>> scattered() const;
};

BlockStored event(std::span<const Block> blocks) {
  BlockStored s;
  s.parent_block_hash = blocks.front().parent;
  s.block_size = kPage;
  s.medium = Medium::kGpu;
  for (const Block& b : blocks) {
    s.block_hashes.push_back(b.id);
    s.token_ids.insert(s.token_ids.end(), b.tokens.begin(), b.tokens.end());
  }
  return s;
}

std::vector<std::pair<SourceId, EventBatch>> Workload::batches() const {
  std::vector<std::pair<SourceId, EventBatch>> out;
  for (size_t c = 0; c < blocks.size(); ++c) {
    EventBatch b;
    std::span<const Block> all = blocks[c];
    for (size_t p = 0; p < all.size(); p += kPagesPerEvent) {
      b.events.emplace_back(event(all.subspan(p, std::min(kPagesPerEvent, all.size() - p))));
    }
    out.emplace_back(source[c], std::move(b));
  }
  return out;
}

std::vector<std::pair<SourceId, EventBatch>> Workload::scattered() const {
  // Round d stores every chain's page at depth d (a chain that reuses a stored prompt starts at
  // depth 64), so parents always come first.
  std::vector<std::pair<SourceId, EventBatch>> out;
  constexpr size_t kDepth = kPromptPages + kConvPages;
  for (size_t d = 0; d < kDepth; ++d) {
    for (size_t c = 0; c < blocks.size(); ++c) {
      size_t skip = kDepth - blocks[c].size();
      if (d < skip) continue;
      EventBatch b;
      b.events.emplace_back(event(std::span<const Block>(&blocks[c][d - skip], 1)));
      out.emplace_back(source[c], std::move(b));
    }
  }
  return out;
}

Workload make_workload() {
  Workload w;
  Rng rng(11);
  auto random_tokens = [&](size_t n) {
    std::vector<int32_t> t(n);
    for (auto& x : t) x = static_cast<int32_t>(rng.below(150000));
    return t;
  };
  for (size_t i = 0; i < kPrompts; ++i) w.prompts.push_back(random_tokens(kPromptPages * kPage));
  for (size_t c = 0; c < kConversations; ++c) w.own.push_back(random_tokens(kConvPages * kPage));
  // Per source, the engine id of the last page of each prompt it stored (0: not stored yet).
  std::vector<std::vector<uint64_t>> prompt_tail(kSources, std::vector<uint64_t>(kPrompts, 0));
  for (size_t c = 0; c < kConversations; ++c) {
    auto s = static_cast<SourceId>(c % kSources);
    size_t prompt = rng.below(kPrompts);
    std::vector<Block> chain;
    std::optional<uint64_t> parent;
    auto add = [&](const std::vector<int32_t>& tokens) {
      for (size_t p = 0; p < tokens.size() / kPage; ++p) {
        chain.push_back(
            Block{rng.next(), parent, std::span<const int32_t>(tokens).subspan(p * kPage, kPage)});
        parent = chain.back().id;
      }
    };
    uint64_t& tail = prompt_tail[s][prompt];
    if (tail == 0) {
      add(w.prompts[prompt]);  // a source stores a prompt once
      tail = *parent;
    }
    parent = tail;
    add(w.own[c]);
    w.total += chain.size();
    w.blocks.push_back(std::move(chain));
    w.source.push_back(s);
    std::vector<int32_t> all = w.prompts[prompt];
    all.insert(all.end(), w.own[c].begin(), w.own[c].end());
    std::vector<BlockKey> keys;
    chain_keys(all, kPage, 0, keys);
    w.requests.push_back(std::move(keys));
  }
  return w;
}

const Workload& workload() {
  static const Workload w = make_workload();
  return w;
}

InventoryOptions options(size_t max_blocks) {
  InventoryOptions o;
  o.page_size = kPage;
  o.max_blocks = max_blocks;
  return o;
}

// Arg 0: no bound (everything kept); arg 1: max_blocks at half the nodes, so about half of the
// ingest also prunes.
void BM_InventoryIngest(benchmark::State& state) {
  const Workload& w = workload();
  const auto batches = w.batches();
  size_t max_blocks = state.range(0) == 0 ? size_t{4} << 20 : size_t{460} << 10;
  size_t nodes = 0;
  for (auto _ : state) {
    auto inv = std::make_unique<Inventory>(options(max_blocks));
    for (const auto& [s, b] : batches) benchmark::DoNotOptimize(inv->apply(s, b));
    state.PauseTiming();
    nodes = inv->nodes();
    state.counters["bytes_per_node"] =
        static_cast<double>(inv->bytes()) / static_cast<double>(inv->nodes());
    state.counters["pruned_k"] = static_cast<double>(inv->pruned()) / 1e3;
    inv.reset();
    state.ResumeTiming();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * w.total));
  state.counters["blocks_k"] = static_cast<double>(w.total) / 1e3;
  state.counters["nodes_k"] = static_cast<double>(nodes) / 1e3;
}
BENCHMARK(BM_InventoryIngest)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

// Steady state: the inventory full (the whole workload stored), each conversation in turn evicted
// by its engine (one BlockRemoved of its own 448 blocks) and stored again (merged events of 32):
// no growth, freed nodes reused. Items: blocks removed + blocks stored.
void BM_InventoryChurn(benchmark::State& state) {
  const Workload& w = workload();
  Inventory inv(options(size_t{4} << 20));
  for (const auto& [s, b] : w.batches()) inv.apply(s, b);
  std::vector<std::pair<EventBatch, EventBatch>> churn;  // per conversation: evict, store again
  for (const auto& chain : w.blocks) {
    std::span<const Block> own = std::span<const Block>(chain).last(kConvPages);
    EventBatch evict;
    BlockRemoved r;
    r.medium = Medium::kGpu;
    // Leaves first, as SGLang's radix cache evicts.
    for (size_t i = own.size(); i-- > 0;) r.block_hashes.push_back(own[i].id);
    evict.events.emplace_back(std::move(r));
    EventBatch store;
    for (size_t p = 0; p < own.size(); p += kPagesPerEvent) {
      store.events.emplace_back(event(own.subspan(p, std::min(kPagesPerEvent, own.size() - p))));
    }
    churn.emplace_back(std::move(evict), std::move(store));
  }
  size_t c = 0;
  for (auto _ : state) {
    SourceId s = w.source[c];
    benchmark::DoNotOptimize(inv.apply(s, churn[c].first));
    benchmark::DoNotOptimize(inv.apply(s, churn[c].second));
    c = (c + 1) % churn.size();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * 2 * kConvPages));
  state.counters["nodes_k"] = static_cast<double>(inv.nodes()) / 1e3;
}
BENCHMARK(BM_InventoryChurn);

// The inventory of the workload, stored as engines send it (layout 0) or scattered (layout 1).
Inventory& shared(int64_t layout) {
  static std::once_flag once[2];
  static std::unique_ptr<Inventory> inv[2];
  std::call_once(once[layout], [layout] {
    inv[layout] = std::make_unique<Inventory>(options(size_t{4} << 20));
    const auto batches = layout == 0 ? workload().batches() : workload().scattered();
    for (const auto& [src, b] : batches) inv[layout]->apply(src, b);
  });
  return *inv[layout];
}

// One lookup of a stored 8,192-token conversation: the 64 prompt pages with ~14 holders each,
// then 448 pages of one source. Arg: the layout (0: stored as engines send, 1: scattered).
void BM_InventoryMatch(benchmark::State& state) {
  const Workload& w = workload();
  Inventory& inv = shared(state.range(0));
  Rng rng(100 + static_cast<uint64_t>(state.thread_index()));
  std::vector<SourceMatch> out;
  out.reserve(kSources);
  std::vector<double> ns;
  ns.reserve(1 << 20);
  size_t pages = 0;
  for (auto _ : state) {
    const auto& keys = w.requests[rng.below(w.requests.size())];
    auto t0 = std::chrono::steady_clock::now();
    size_t best = inv.match(keys, out);
    auto t1 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(best);
    pages += best;
    ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count());
  }
  std::sort(ns.begin(), ns.end());
  if (!ns.empty()) {
    // Per thread, averaged over the threads (counters are summed otherwise).
    auto avg = [](double v) { return benchmark::Counter(v, benchmark::Counter::kAvgThreads); };
    state.counters["p50_us"] = avg(ns[ns.size() / 2] / 1000);
    state.counters["p99_us"] = avg(ns[ns.size() * 99 / 100] / 1000);
    state.counters["pages_per_lookup"] =
        avg(static_cast<double>(pages) / static_cast<double>(ns.size()));
  }
  if (state.thread_index() == 0) {
    state.counters["blocks_k"] = static_cast<double>(w.total) / 1e3;
    state.counters["nodes_k"] = static_cast<double>(inv.nodes()) / 1e3;
    state.counters["bytes_per_block"] =
        static_cast<double>(inv.bytes()) / static_cast<double>(w.total);
  }
}
BENCHMARK(BM_InventoryMatch)->Arg(0)->Arg(1)->Threads(1)->Threads(2)->UseRealTime();

// The request's other cost: its keys, 512 XXH3 hashes over 8,192 tokens.
void BM_InventoryChainKeys(benchmark::State& state) {
  Rng rng(5);
  std::vector<int32_t> tokens(8192);
  for (auto& t : tokens) t = static_cast<int32_t>(rng.below(150000));
  std::vector<BlockKey> keys;
  keys.reserve(512);
  for (auto _ : state) {
    keys.clear();
    chain_keys(tokens, kPage, 0, keys);
    benchmark::DoNotOptimize(keys.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * tokens.size() * 4));
}
BENCHMARK(BM_InventoryChainKeys);

}  // namespace
}  // namespace kvgate::kv
