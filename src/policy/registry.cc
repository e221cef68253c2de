// policy/registry: see registry.h. One line per policy.
#include "policy/registry.h"

#include <vector>

#include "policy/bucket.h"
#include "policy/cache_aware.h"
#include "policy/chwbl.h"
#include "policy/consistent_hashing.h"
#include "policy/dp_aware.h"
#include "policy/kv_exact.h"
#include "policy/manual.h"
#include "policy/power_of_two.h"
#include "policy/prefix_hash.h"
#include "policy/random.h"
#include "policy/round_robin.h"

namespace kvgate {

std::span<const PolicyInfo> all_policies() {
  static const std::vector<PolicyInfo> kPolicies = {
      {"round_robin", "each available worker in turn",
       [](const PolicyConfig&) { return std::make_unique<RoundRobinPolicy>(); }},
      {"random", "a uniformly random available worker",
       [](const PolicyConfig& c) { return std::make_unique<RandomPolicy>(c.seed); }},
      {"power_of_two", "the less loaded of two random workers",
       [](const PolicyConfig& c) { return std::make_unique<PowerOfTwoPolicy>(c.seed); }},
      {"cache_aware", "approximate prefix tree + load balance (sgl-model-gateway's default)",
       [](const PolicyConfig& c) { return std::make_unique<CacheAwarePolicy>(c); }},
      {"prefix_hash", "hash of the prompt's first tokens on a bounded-load ring",
       [](const PolicyConfig& c) { return std::make_unique<PrefixHashPolicy>(c); }},
      {"manual", "X-SMG-Routing-Key sticky placement",
       [](const PolicyConfig& c) { return std::make_unique<ManualPolicy>(c); }},
      {"consistent_hashing", "routing key / header hashing on a ring",
       [](const PolicyConfig& c) { return std::make_unique<ConsistentHashingPolicy>(c); }},
      {"bucket", "request-length bands per worker",
       [](const PolicyConfig& c) { return std::make_unique<BucketPolicy>(c); }},
      {"chwbl", "consistent hashing with bounded loads",
       [](const PolicyConfig& c) { return std::make_unique<ChwblPolicy>(c); }},
      // Built over a fallback by make_policy (kv.enabled), never by name: not a `sel`.
      {"kv_exact", "the engines' KV events: route to the (endpoint, rank) holding the prefix", {}},
  };
  return kPolicies;
}

std::unique_ptr<Policy> make_policy(const PolicyConfig& config, std::string& error) {
  if (config.kv.enabled) {
    // kv_exact over the fallback `name` names.
    PolicyConfig inner = config;
    inner.kv.enabled = false;
    // kv_exact picks the rank itself, for its fallback's choices too: --dp-aware adds nothing.
    inner.dp_aware = false;
    if (inner.name == "kv_exact") {
      error =
          "kv_exact needs a fallback policy for misses (sel / --kv-fallback-policy), not itself";
      return nullptr;
    }
    auto fallback = make_policy(inner, error);
    if (!fallback) return nullptr;
    return std::make_unique<KvExactPolicy>(config, std::move(fallback));
  }
  if (config.dp_aware && config.name != "kv_exact") {
    PolicyConfig inner = config;
    inner.dp_aware = false;
    auto policy = make_policy(inner, error);
    if (!policy) return nullptr;
    return std::make_unique<DpAwarePolicy>(config, std::move(policy));
  }
  if (config.name == "kv_exact") {
    error =
        "kv_exact is turned on by a rule's kvExactMode 3 (or --policy kv_exact for the "
        "command line's rule), with sel naming the fallback policy";
    return nullptr;
  }
  std::string built;
  for (const auto& p : all_policies()) {
    if (p.factory) built += (built.empty() ? "" : ", ") + std::string(p.name);
  }
  for (const auto& p : all_policies()) {
    if (p.name != config.name) continue;
    if (!p.factory) {
      error = "policy '" + config.name + "' (" + std::string(p.summary) +
              ") is not available in this build yet; choose one of: " + built;
      return nullptr;
    }
    return p.factory(config);
  }
  error = "unknown policy '" + config.name + "'; choose one of: " + built;
  return nullptr;
}

}  // namespace kvgate
