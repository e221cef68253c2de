// sim/info: the bodies of the informational endpoints, as SGLang shapes them: /get_server_info
// (alias /server_info), /get_model_info, /get_load, /v1/loads and /v1/models. Pure functions of
// the configuration and the ranks' loads.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "sim/config.h"
#include "sim/scheduler.h"

namespace kvgate::sim {

inline constexpr std::string_view kSimVersion = "0.1.0-kvgate-sim";

std::string server_info_json(const SimConfig& c, std::span<const RankLoad> loads, bool healthy);
std::string model_info_json(const SimConfig& c);
// /get_load (deprecated in SGLang, a shim over /v1/loads?include=core): per rank
// {"dp_rank","num_reqs","num_waiting_reqs","num_tokens","num_pending_tokens","ts_tic"}, num_reqs =
// running + waiting, num_tokens = used + waiting-queue tokens (num_total_tokens), ts_tic =
// `monotonic_seconds` (Python's time.perf_counter()).
std::string get_load_json(std::span<const RankLoad> loads, double monotonic_seconds);

// /v1/loads (SGLang's entrypoints/v1_loads.py) with its query parameters: dp_rank (one rank; out
// of range: no loads), include (comma-separated sections core, memory, spec, lora, disagg, queues,
// all; default all; anything else is 400 {"detail"}), format=prometheus (text, one gauge per
// numeric field, label dp_rank). JSON: {"timestamp","version","accelerator","num_accelerators",
// "loads":[{core fields..., sections...}]}.
struct LoadsAnswer {
  int status = 200;
  bool prometheus = false;  // text/plain exposition instead of JSON
  std::string body;
};
LoadsAnswer v1_loads(const SimConfig& c, std::span<const RankLoad> loads, std::string_view query,
                     double unix_seconds);

// The value of `key` in a URL query string ("a=1&b=2"), percent-decoded; nullopt when absent.
std::optional<std::string> query_param(std::string_view query, std::string_view key);
std::string models_json(const SimConfig& c, int64_t created);

}  // namespace kvgate::sim
