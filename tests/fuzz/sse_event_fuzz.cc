// Fuzz target: gateway/stream_check, which reads the first event of a worker's SSE stream
// (untrusted bytes) before the client sees anything. The first byte picks where the stream is cut,
// as reads might deliver it. Checks: first_event_end is within bounds, ends on the blank line that
// closes the event, is the first such end, and does not change as more bytes arrive; event_abort
// returns or declines on anything, never throws, and only quotes the worker's own words.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "gateway/stream_check.h"

namespace {

void check_end(std::string_view buf, std::optional<size_t> end) {
  if (!end) return;
  if (*end < 2 || *end > buf.size() || buf[*end - 1] != '\n') __builtin_trap();
  std::string_view event = buf.substr(0, *end);
  if (!event.ends_with("\n\n") && !event.ends_with("\n\r\n")) __builtin_trap();
  // The first blank line: no event is complete one byte earlier.
  if (kvgate::first_event_end(buf.substr(0, *end - 1))) __builtin_trap();
}

void check_abort(std::string_view event) {
  try {
    auto abort = kvgate::event_abort(event);
    if (abort && abort->message.size() > event.size()) __builtin_trap();
  } catch (...) {
    __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string_view buf(reinterpret_cast<const char*>(data) + 1, size - 1);
  auto end = kvgate::first_event_end(buf);
  check_end(buf, end);
  // What the gateway saw after an earlier read: an end found there is the end of the whole.
  std::string_view early = buf.substr(0, data[0] * buf.size() / 255);
  if (auto e = kvgate::first_event_end(early); e && e != end) __builtin_trap();
  if (end) check_abort(buf.substr(0, *end));
  check_abort(buf);
  return 0;
}
