// Micro-benchmarks of cache_aware's approximate tree (issue 5): select + insert of a 4,000-char
// prompt sharing 3,500 chars with a 10M-char tree over 8 workers (p50/p99 per call, 1 and 2
// threads), memory per stored character and per node, and an eviction pass over a 64M-char tree.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <mutex>

#include "policy/cache_aware.h"
#include "prefix/approx_tree.h"
#include "prefix/chunk_index.h"
#include "util/random.h"

namespace kvgate {
namespace {

std::string random_text(Rng& rng, size_t n) {
  static const char* kWords[] = {"the ",   "cache ",  "router ",  "sends ",  "every ",  "turn ",
                                 "to ",    "server ", "holding ", "prefix ", "tokens ", "of ",
                                 "model ", "answer ", "user ",    "system "};
  std::string s;
  s.reserve(n + 8);
  while (s.size() < n) s += kWords[rng.below(16)];
  s.resize(n);
  return s;
}

// Families of prompts: a 3,500-char prefix each, with 4 variants of 500 chars, spread over 8
// workers, until the tree stores `chars` characters.
struct Corpus {
  std::vector<std::string> prefixes;
  size_t stored = 0;
};

Corpus fill(prefix::ApproxTree& tree, size_t chars, Rng& rng) {
  Corpus c;
  while (tree.stored_chars() < chars) {
    std::string prefix = random_text(rng, 3500);
    auto slot = static_cast<prefix::Slot>(1 + c.prefixes.size() % 8);
    for (int v = 0; v < 4; ++v) tree.insert(prefix + random_text(rng, 500), slot);
    c.prefixes.push_back(std::move(prefix));
  }
  c.stored = tree.stored_chars();
  return c;
}

struct Shared {
  std::once_flag once;
  std::unique_ptr<prefix::ApproxTree> tree;
  Corpus corpus;
};
Shared& shared() {
  static Shared s;
  std::call_once(s.once, [] {
    Rng rng(1);
    s.tree = std::make_unique<prefix::ApproxTree>();
    s.corpus = fill(*s.tree, 10'000'000, rng);
  });
  return s;
}

// The match + insert of cache_aware's select for one request, timed call by call.
void BM_CacheAwareSelectInsert(benchmark::State& state) {
  Shared& s = shared();
  Rng rng(100 + static_cast<uint64_t>(state.thread_index()));
  std::vector<prefix::Slot> slots{1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<size_t> matched(8);
  std::vector<std::string> prompts;
  prompts.reserve(256);
  for (int i = 0; i < 256; ++i) {
    prompts.push_back(s.corpus.prefixes[rng.below(s.corpus.prefixes.size())] +
                      random_text(rng, 500));
  }
  std::vector<double> ns;
  ns.reserve(1 << 20);
  size_t i = 0;
  for (auto _ : state) {
    const std::string& p = prompts[i++ % prompts.size()];
    auto t0 = std::chrono::steady_clock::now();
    size_t total = s.tree->match(p, slots, matched);
    size_t best = *std::max_element(matched.begin(), matched.end());
    auto pick = static_cast<prefix::Slot>(
        1 + std::distance(matched.begin(), std::max_element(matched.begin(), matched.end())));
    s.tree->insert(p, pick);
    auto t1 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(total + best);
    ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count());
  }
  std::sort(ns.begin(), ns.end());
  if (!ns.empty()) {
    state.counters["p50_us"] = ns[ns.size() / 2] / 1000;
    state.counters["p99_us"] = ns[ns.size() * 99 / 100] / 1000;
  }
}
BENCHMARK(BM_CacheAwareSelectInsert)->Threads(1)->Threads(2)->UseRealTime();

void BM_TreeMemory(benchmark::State& state) {
  Shared& s = shared();
  for (auto _ : state) benchmark::DoNotOptimize(s.tree->memory_bytes());
  double bytes = static_cast<double>(s.tree->memory_bytes());
  state.counters["stored_chars_M"] = static_cast<double>(s.tree->stored_chars()) / 1e6;
  state.counters["bytes_per_char"] = bytes / static_cast<double>(s.tree->stored_chars());
  state.counters["bytes_per_node"] = bytes / static_cast<double>(s.tree->node_count());
  state.counters["nodes_k"] = static_cast<double>(s.tree->node_count()) / 1e3;
}
BENCHMARK(BM_TreeMemory)->Iterations(1);

// One eviction pass over a 64M-character tree, down to half of each worker's share.
void BM_EvictionPass64M(benchmark::State& state) {
  for (auto _ : state) {
    state.PauseTiming();
    Rng rng(9);
    auto tree = std::make_unique<prefix::ApproxTree>();
    fill(*tree, 64'000'000, rng);
    size_t per_slot = tree->chars_of(1);
    state.ResumeTiming();
    size_t removed = tree->evict(per_slot / 2);
    state.PauseTiming();
    state.counters["removed_M"] = static_cast<double>(removed) / 1e6;
    tree.reset();
    state.ResumeTiming();
  }
}
BENCHMARK(BM_EvictionPass64M)->Iterations(1)->Unit(benchmark::kMillisecond);

}  // namespace
// cache_aware shared by replicas (--replica-sync): the chunk chain of a 4,000-byte prompt (64-byte
// chunks), its match against an index of 100,000 prompts' chains over 8 workers (what select
// pays), and applying one record (what a dispatch, or a peer's record, pays).
void BM_ChunkChain4K(benchmark::State& state) {
  Rng rng(3);
  const std::string text = random_text(rng, 4000);
  std::vector<uint64_t> chain;
  for (auto _ : state) {
    prefix::chunk_chain("model", text, 64, chain);
    benchmark::DoNotOptimize(chain.data());
  }
}
BENCHMARK(BM_ChunkChain4K);

struct ChunkCorpus {
  ChunkCorpus() : index(1 << 22) {
    Rng rng(5);
    std::vector<uint64_t> chain;
    for (int f = 0; f < 1000; ++f) {
      const std::string family = random_text(rng, 3500);
      for (int v = 0; v < 100; ++v) {
        prefix::chunk_chain("model", family + random_text(rng, 500), 64, chain);
        index.apply(chain, static_cast<uint64_t>(f % 8), int64_t{1} << 60);
      }
      if (f == 0) probe = family + random_text(rng, 500);
    }
  }
  prefix::ChunkIndex index;
  std::string probe;
};

void BM_ChunkIndexMatch(benchmark::State& state) {
  static ChunkCorpus corpus;
  std::vector<uint64_t> chain;
  prefix::chunk_chain("model", corpus.probe, 64, chain);
  const uint64_t workers[] = {0, 1, 2, 3, 4, 5, 6, 7};
  size_t matched[8];
  for (auto _ : state) {
    benchmark::DoNotOptimize(corpus.index.match(chain, workers, matched, 0));
  }
  state.counters["entries"] = static_cast<double>(corpus.index.size());
}
BENCHMARK(BM_ChunkIndexMatch)->Threads(1)->Threads(2)->UseRealTime();

void BM_ChunkIndexApply(benchmark::State& state) {
  static ChunkCorpus corpus;
  std::vector<uint64_t> chain;
  prefix::chunk_chain("model", corpus.probe, 64, chain);
  int64_t expiry = int64_t{1} << 61;
  for (auto _ : state) corpus.index.apply(chain, 3, ++expiry);
}
BENCHMARK(BM_ChunkIndexApply)->Threads(1)->Threads(2)->UseRealTime();

}  // namespace kvgate
