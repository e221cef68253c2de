// kv/inventory: what every (endpoint, DP rank) of a pool caches, built from their KV events and
// keyed by kvgate's own chained block keys, so it works whatever hash the engine publishes (as
// Dynamo's and llm-d's indexers do).
//
// A block key chains over every page before it: key_0 = XXH3_64(page 0's tokens, seed = the
// chain's namespace seed), key_i = XXH3_64(page i's tokens, seed = key_{i-1}); tokens are hashed
// as int32 little-endian. The namespace seed is 0 for plain requests and is derived from the
// cache_salt and LoRA id otherwise, so salted or adapter prefixes only match their own kind.
//
// Sources (one per endpoint and DP rank) are small integers the pool assigns. For each source the
// inventory keeps the engine's block id -> node map, which resolves a BlockStored's parent and a
// BlockRemoved's ids. Each node (one key) holds the set of sources storing it, with their tier.
//
// Threads: apply/clear/remove_source from one writer thread at a time (the pool's event thread);
// match() from any number of request threads concurrently with the writer. A writer holds the
// lock for one batch at most (bounded by the batch), so a flood of events delays a lookup by at
// most one batch's work.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "kv/events.h"

namespace kvgate::kv {

using SourceId = uint32_t;
using BlockKey = uint64_t;

// The seed of a chain: 0 without salt and adapter; otherwise a 64-bit hash of them (XXH3 over the
// salt's bytes and the adapter's name, seeded by XXH3 of a fixed header holding which are present,
// the LoRA id and the salt's length), never 0. An empty salt differs from no salt, LoRA id 0 from
// no LoRA id. Engines name an adapter by id (vLLM's lora_id) or by name (SGLang's lora_name).
uint64_t chain_seed(std::optional<std::string_view> cache_salt, std::optional<int64_t> lora_id,
                    std::optional<std::string_view> lora_name = std::nullopt);
// Appends kvgate's key of each full page of `tokens` (a trailing partial page has none).
void chain_keys(std::span<const int32_t> tokens, size_t page_size, uint64_t seed,
                std::vector<BlockKey>& out);

struct InventoryOptions {
  size_t page_size = 16;
  // Nodes kept at most; past it the least recently stored or matched leaves are pruned (a pruned
  // block is a miss, never a wrong hit; its ids are forgotten). Recency is counted in batches.
  size_t max_blocks = size_t{4} << 20;
  // A page a source holds only in another tier (CPU, disk...) counts this much of a GPU page
  // (see SourceMatch::pages). 0: other tiers are not counted at all.
  double other_tier_weight = 0;
};

// What one batch did to the inventory (the event plane counts it in metrics).
struct ApplyStats {
  uint32_t stored = 0;   // blocks of BlockStored events applied (one already held counts again)
  uint32_t removed = 0;  // blocks removed from the source
  uint32_t cleared = 0;  // AllBlocksCleared events
  // A BlockStored whose parent the source never stored (events missed): its blocks are skipped,
  // and those of its ids the source held are forgotten (they now name blocks it cannot place).
  uint32_t orphans = 0;
  // A BlockStored whose block_size is not the inventory's page size, or whose token_ids do not
  // hold block_size tokens per hash: skipped (the pool's page size is wrong for this engine).
  uint32_t page_size_mismatches = 0;
  // A BlockRemoved naming a block the source does not hold (harmless; counted).
  uint32_t unknown_removals = 0;
};

// How much of a request one source holds. With G = gpu_pages and A = the count of leading pages
// the source holds in any tier (A >= G):
//   other_tier_weight w > 0: pages = G + w x (A - G): every page after the GPU run counts w, even
//     one that is on GPU again past a page that is not (the engine must load the gap first);
//   w = 0: pages = G, and other tiers are ignored (a source holding page 0 only on CPU is not
//     listed).
// GPU here means medium GPU or none (what an engine with one tier sends).
struct SourceMatch {
  SourceId source = 0;
  uint32_t gpu_pages = 0;  // leading pages held on GPU
  double pages = 0;        // G + w x (A - G), above
};

// What one source holds, as another kvgate replica can take it over (replica bootstrap): every
// node on the paths to its blocks (parents first), and its holdings.
struct SourceExport {
  struct Link {
    BlockKey key = 0;
    BlockKey parent = 0;
    bool root = false;  // no parent: a chain start (parent unused)
    bool operator==(const Link&) const = default;
  };
  struct Holding {
    uint64_t id = 0;    // the engine's block id
    BlockKey key = 0;   // the node it names
    uint8_t media = 0;  // tier bits (1: GPU or none, 2: CPU, 4: disk, 8: external, 16: other)
    bool operator==(const Holding&) const = default;
  };
  std::vector<Link> links;
  std::vector<Holding> holdings;
  bool operator==(const SourceExport&) const = default;
};

class Inventory {
 public:
  explicit Inventory(InventoryOptions options);
  ~Inventory();
  Inventory(const Inventory&) = delete;
  Inventory& operator=(const Inventory&) = delete;

  const InventoryOptions& options() const;

  // Writer side.
  ApplyStats apply(SourceId source, const EventBatch& batch);
  void clear(SourceId source);          // forget what the source holds (a resync, a flush)
  void remove_source(SourceId source);  // the same, for a source leaving the pool

  // Reader side: for the chain `keys` of a request, every source holding at least its first page
  // (in any tier counted), in `out` (cleared first; sorted by source), and the longest gpu_pages
  // among them. Allocates nothing once `out` and the thread are warm.
  size_t match(std::span<const BlockKey> keys, std::vector<SourceMatch>& out) const;

  // Replica bootstrap: what `source` holds, as export_source gives it (reader side), and taking
  // such an export over for `source` (writer side: the source is cleared first). A link whose
  // parent is not in the export nor the inventory is skipped with what hangs below it.
  SourceExport export_source(SourceId source) const;
  void import_source(SourceId source, const SourceExport& in);

  // Size, for metrics and the inventory view.
  size_t blocks(SourceId source, bool gpu) const;  // blocks the source holds in GPU / other tiers
  size_t nodes() const;
  size_t bytes() const;  // memory held, approximately (nodes, holder sets, id maps)
  uint64_t pruned() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvgate::kv
