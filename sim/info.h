// sim/info: the bodies of the informational endpoints, as SGLang shapes them: /get_server_info
// (alias /server_info), /get_model_info, /get_load, /v1/loads and /v1/models. Pure functions of
// the configuration and the ranks' loads.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "sim/config.h"
#include "sim/scheduler.h"

namespace kvgate::sim {

inline constexpr std::string_view kSimVersion = "0.1.0-kvgate-sim";

std::string server_info_json(const SimConfig& c, std::span<const RankLoad> loads, bool healthy);
std::string model_info_json(const SimConfig& c);
// [{"dp_rank","num_reqs","num_waiting_reqs","num_tokens"}...]
std::string get_load_json(std::span<const RankLoad> loads);
// {"timestamp","version","dp_rank_count","loads":[...]}; `unix_seconds` is the timestamp.
std::string v1_loads_json(std::span<const RankLoad> loads, double unix_seconds);
std::string models_json(const SimConfig& c, int64_t created);

}  // namespace kvgate::sim
