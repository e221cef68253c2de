// Fuzz target: ResponseOwners::find_id, which reads the beginning of every /v1/responses answer
// (untrusted bytes from a worker) for the new response's id.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "gateway/response_owners.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  std::string_view id = kvgate::ResponseOwners::find_id(text);
  if (id.empty()) return 0;
  // A valid id, and a part of the text (a view into it).
  if (!kvgate::ResponseOwners::valid_id(id)) __builtin_trap();
  if (id.data() < text.data() || id.data() + id.size() > text.data() + text.size()) {
    __builtin_trap();
  }
  return 0;
}
