// Fuzz target: what discovery/etcd reads from etcd, whose keys and values any client with write
// access to the prefix controls: a worker record's JSON value, a worker key, and one line of the
// watch stream. A record that parses has a valid URL and role and survives a round trip through
// serialize_worker_record unchanged; a key that splits joins back to itself; a watch line keeps
// at most kMaxWatchEvents events, and base64 round-trips whatever bytes it decodes.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "discovery/etcd.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvgate::discovery;
  std::string_view text(reinterpret_cast<const char*>(data), size);

  WorkerRecord r;
  if (parse_worker_record(text, r).empty()) {
    if (r.url.rfind("http://", 0) != 0 && r.url.rfind("https://", 0) != 0) __builtin_trap();
    if (r.role != "regular" && r.role != "prefill" && r.role != "decode") __builtin_trap();
    if (r.dp_size < 0 || r.page_size < 0 || r.bootstrap_port < 0 || r.bootstrap_port > 65535) {
      __builtin_trap();
    }
    WorkerRecord back;
    if (!parse_worker_record(serialize_worker_record(r), back).empty()) __builtin_trap();
    if (!(back == r)) __builtin_trap();
  }

  std::string model, id;
  if (split_worker_key(text, model, id).empty()) {
    if (worker_key(model, id) != text) __builtin_trap();
  }

  EtcdWatchMessage m;
  parse_watch_line(text, m);
  if (m.events.size() > kMaxWatchEvents) __builtin_trap();

  std::string decoded;
  if (kvgate::base64_decode(text, decoded)) {
    std::string again;
    if (!kvgate::base64_decode(kvgate::base64_encode(decoded), again) || again != decoded)
      __builtin_trap();
  }
  return 0;
}
