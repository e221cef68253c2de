// Fuzz target: what workers report on /get_load and /v1/models (parsed by the health plane).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "workers/health.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  (void)kvgate::parse_load_report(text);
  (void)kvgate::parse_model_list(text);
  return 0;
}
