// policy/registry: policy names -> factories. Adding a policy = one file in policy/, one line in
// registry.cc, one test. Names of sgl-model-gateway policies kvgate has not built yet are listed
// too, so asking for one fails at startup with a message instead of a silent fallback.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "metrics/metrics.h"
#include "policy/policy.h"

namespace kvgate {
namespace replica {
class Sync;
}  // namespace replica

// Built by policy_config() (gateway/knobs.h) from the knob table, which holds the defaults: the
// fields have none of their own.
struct PolicyConfig {
  std::string name;
  uint64_t seed = 0;  // 0: from the OS
  // cache_aware (and bucket's imbalance override)
  double cache_threshold = 0;
  int64_t balance_abs_threshold = 0;
  double balance_rel_threshold = 0;
  int64_t eviction_interval_secs = 0;
  int64_t max_tree_size = 0;
  int64_t max_prefix_trees = 0;
  // prefix_hash
  int64_t prefix_token_count = 0;
  double prefix_hash_load_factor = 0;
  // manual
  int64_t max_idle_secs = 0;
  std::string manual_assignment_mode;  // random, min_load, min_group
  int64_t max_routing_keys = 0;
  // chwbl
  int64_t chwbl_key_chars = 0;
  double chwbl_load_factor = 0;
  // bucket
  int64_t bucket_refit_secs = 0;
  // --dp-aware (a rule's dpAware): the policy `name` over one target per data-parallel rank of
  // each worker (policy/dp_aware); ranks of a worker whose /server_info has not said its dp_size:
  // dp_default_ranks (kvDpRankCount). Not for kv_exact, which is per rank already.
  bool dp_aware = false;
  int64_t dp_default_ranks = 0;
  // kv_exact (a kvExactMode 3 rule): its events and inventory; `name` is then the fallback.
  struct KvExact {
    bool enabled = false;
    int64_t page_size = 0;  // kvBlockSize: the engines' page size
    int64_t dp_ranks = 0;   // kvDpRankCount
    int64_t zmq_port = 0;   // kvZmqPort: rank 0's publisher port (rank r: + r)
    std::map<std::string, int64_t, std::less<>> endpoint_ports;  // an endpoint's own kvZmqPort
    std::chrono::seconds warmup{0};                              // kvWarmupSec
    double load_tokens = 0;  // cost of one active request, in prefill tokens
    double other_tier_weight = 0;
    size_t max_blocks = 0;
    std::chrono::milliseconds predict_ttl{0};  // predict on route; 0: off
    bool parity_probe = false;                 // tokenizer parity probes (kv_parity.h)
    // kvHashAlgo: the engine's block hash, recomputed from events to check parity when it can be
    // (sha256_sglang, vLLM's sha256_cbor); anything else is not checked.
    std::string hash_algo;
    bool operator==(const KvExact&) const = default;
  } kv;
  // Where policies register their own metrics (null in unit tests that do not look, and for
  // policies built for a dry run), and the rule (pool) their series are labelled with.
  metrics::Registry* registry = nullptr;
  std::string rule;
  // Several kvgate replicas share state through it (--replica-sync; null: this replica alone):
  // cache_aware then routes on the chunk index every replica builds alike (prefix/chunk_index.h).
  replica::Sync* replica = nullptr;
  bool operator==(const PolicyConfig&) const = default;
};

struct PolicyInfo {
  std::string_view name;
  std::string_view summary;
  std::function<std::unique_ptr<Policy>(const PolicyConfig&)> factory;  // empty: not built yet
};

std::span<const PolicyInfo> all_policies();
// Builds the policy `config.name`; on failure returns null and sets `error`.
std::unique_ptr<Policy> make_policy(const PolicyConfig& config, std::string& error);

}  // namespace kvgate
