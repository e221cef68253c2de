// Fuzz target: DoctorKey::check, which reads the x-kvgate-doctor header of client requests while a
// doctor run holds the key armed (gateway.h). Half the inputs carry the real key, so that the
// rule= and pin= items after it are parsed too. Checks: no pass without the exact key; a pass's
// rule and pin are pieces of the header, without spaces.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "gateway/gateway.h"

namespace {

void check(bool ok) {
  if (!ok) __builtin_trap();
}

bool piece_of(std::string_view part, std::string_view whole) {
  return part.empty() || whole.find(part) != std::string_view::npos;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const kvgate::DoctorKey key;
  if (size == 0) return 0;
  std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  const bool keyed = (data[0] & 1) != 0;
  std::string header = keyed ? key.value() + std::string(rest) : std::string(rest);
  auto pass = key.check(header);
  const bool has_key = header.starts_with(key.value()) &&
                       (header.size() == key.value().size() || header[key.value().size()] == ' ');
  check(pass.has_value() == has_key);
  if (pass) {
    check(piece_of(pass->rule, header) && piece_of(pass->pin, header));
    check(pass->rule.find(' ') == std::string::npos && pass->pin.find(' ') == std::string::npos);
  }
  return 0;
}
