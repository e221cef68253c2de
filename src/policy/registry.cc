// policy/registry: see registry.h. One line per policy.
#include "policy/registry.h"

#include <vector>

#include "policy/power_of_two.h"
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
      {"cache_aware", "approximate prefix tree + load balance (sgl-model-gateway's default)", {}},
      {"prefix_hash", "hash of the prompt's first tokens on a bounded-load ring", {}},
      {"manual", "X-SMG-Routing-Key sticky placement", {}},
      {"consistent_hashing", "routing key / header hashing on a ring", {}},
      {"bucket", "request-length bands per worker", {}},
      {"chwbl", "consistent hashing with bounded loads", {}},
      {"kv_exact", "exact KV-event inventory, longest real prefix match", {}},
  };
  return kPolicies;
}

std::unique_ptr<Policy> make_policy(const PolicyConfig& config, std::string& error) {
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
