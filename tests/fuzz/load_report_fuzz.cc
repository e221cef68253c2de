// Fuzz target: what workers report on /get_load and /v1/models (parsed by the health plane).
// Checks: a load is never negative (whatever numbers the worker sends); every model entry is a JSON
// object again (the gateway re-parses them to answer /v1/models).
#include <simdjson.h>

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "workers/health.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  if (auto load = kvgate::parse_load_report(text); load && *load < 0) __builtin_trap();
  if (auto models = kvgate::parse_model_list(text)) {
    simdjson::dom::parser parser;
    for (const auto& m : *models) {
      simdjson::dom::object o;
      if (parser.parse(m).get_object().get(o)) __builtin_trap();
    }
  }
  return 0;
}
