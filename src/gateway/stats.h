// gateway/stats: GET /v1/stats on the admin listener, the JSON the dashboard (/ui) polls every
// second and scripts can read: the rules and their workers (role, health, breaker, in flight,
// reported load, attempts, usage and what the policy predicted), kv_exact's sources per
// (endpoint, DP rank), decisions per policy branch, time to first token, and the last routing
// decisions explained (gateway/decision_log.h). Counters are cumulative since start, as in
// /metrics (a reader takes differences); the figures are read from the same cells /metrics
// exposes, so the page and Prometheus never disagree. docs/operations.md describes the fields.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "gateway/decision_log.h"
#include "gateway/gateway_metrics.h"
#include "gateway/pools.h"

namespace kvgate {

class KvExactPolicy;

struct StatsInput {
  std::shared_ptr<const RuleTable> table;
  const GatewayMetrics* metrics = nullptr;
  const DecisionLog* decisions = nullptr;
  int64_t in_flight = 0;
  int64_t queue_depth = 0;
  std::chrono::seconds health_interval{0};
  std::chrono::system_clock::time_point started;
  size_t recent_decisions = 100;  // at most DecisionLog::kCapacity
};

nlohmann::ordered_json stats_json(const StatsInput& in);
// stats_json as the text GET /v1/stats answers: bytes that are not UTF-8 (an engine's error text
// in a parity detail) replaced by U+FFFD, never a throw.
std::string stats_text(const StatsInput& in);

// What kv_exact knows of each of a rule's (endpoint, rank) sources (GET /v1/rules/{name}/inventory
// and the stats' "kv"): subscriber state, blocks, last event, page-size and tokenizer parity,
// routing counts.
nlohmann::ordered_json kv_sources_json(const KvExactPolicy& kv);

}  // namespace kvgate
