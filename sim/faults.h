// sim/faults: fault injection for tests. Decides, per generation request, whether it fails with
// a status, hangs, has its connection dropped mid-response, or is aborted by the (simulated)
// scheduler before its first token; holds the unhealthy window of /health. Settings start from the
// flags and change at runtime through POST /sim/faults.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

#include "http/io.h"
#include "sim/config.h"
#include "util/random.h"

namespace kvgate::sim {

struct FaultSettings {
  double fail_rate = 0;
  int64_t fail_status = 500;
  double hang_rate = 0;
  double drop_rate = 0;  // --drop-mid-stream-rate
  int64_t drop_after_chunks = 1;
  double abort_rate = 0;  // --abort-first-event-rate
};

// The settings the flags ask for.
FaultSettings fault_settings(const SimConfig& c);

// kAbort: answered as SGLang answers a request its scheduler aborts before the first token (503):
// a stream gets 200 and the abort as its first event, a whole answer the error status.
enum class Fault { kNone, kFail, kHang, kDrop, kAbort };

class FaultInjector {
 public:
  // `seed` makes decisions reproducible; unhealthy until `unhealthy_until`.
  FaultInjector(FaultSettings settings, uint64_t seed, Clock::time_point unhealthy_until);

  // One uniform draw: [0, fail) fails, then hang, then drop, then abort; else kNone. Thread-safe;
  // no lock and no draw while every rate is 0.
  Fault decide();
  FaultSettings settings() const;
  bool healthy(Clock::time_point now = Clock::now()) const;

  // Applies a JSON object with any of fail_rate, fail_status, hang_rate, drop_mid_stream_rate,
  // drop_after_chunks, abort_first_event_rate, unhealthy (bool), unhealthy_secs (number). All or
  // nothing: returns "" or the 400 message naming the field.
  std::string update(std::string& body);
  // The current settings as JSON (the answer of GET/POST /sim/faults).
  std::string to_json() const;

 private:
  mutable std::mutex mu_;
  FaultSettings settings_;
  Rng rng_;
  std::atomic<bool> any_{false};
  std::atomic<int64_t> unhealthy_until_ns_;
};

}  // namespace kvgate::sim
