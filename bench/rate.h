// bench/rate: an open-loop load at a fixed request rate (evenly spaced), for latency at a given
// fraction of a proxy's capacity: a closed loop (wrk) measures saturation, not latency under a
// normal load. Requests are POSTs of one body, answers read whole; latency has microsecond
// resolution.
#pragma once

#include <string>
#include <vector>

namespace kvgate::bench {

struct RateOptions {
  std::string url;
  std::string path = "/v1/chat/completions";
  std::string body;
  double rate = 1000;  // requests per second
  double seconds = 5;
  int max_in_flight = 4096;  // requests past this are counted as dropped, not sent
};

struct RateResult {
  size_t sent = 0;
  size_t errors = 0;   // transport errors and non-2xx
  size_t dropped = 0;  // not sent: too many in flight (the target cannot keep up)
  double achieved_rate = 0;
  std::vector<double> latency_us;  // sorted
  std::string fatal;
};

RateResult run_rate(const RateOptions& o);

}  // namespace kvgate::bench
