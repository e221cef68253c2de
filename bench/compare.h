// bench/compare: `kvgate-bench compare`. Starts N kvgate-sim servers on loopback, then for each
// policy a fresh kvgate (or `replicas` of them) in front of them (sims flushed first), runs the
// same workload through it, and summarizes every run side by side. Everything it starts, it stops.
// With kv_exact among the policies the sims publish their KV events (ZeroMQ, a port run per sim,
// one port per DP rank), and each kv_exact kvgate finds them from the sims' /server_info; the
// workload starts once every (sim, rank) subscriber of every replica is connected and trusted,
// with an empty inventory.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "bench/driver.h"
#include "bench/report.h"

namespace kvgate::bench {

struct CompareOptions {
  std::vector<std::string> policies;
  int sims = 4;
  std::vector<std::string> sim_args;      // for every sim (cache size, timing, tokenizer...)
  std::vector<std::string> gateway_args;  // for every kvgate
  std::string bin_dir;                    // where kvgate and kvgate-sim are
  std::string log_dir;                    // process logs
  DriverConfig driver;                    // url is filled in per policy
  int page_size = 1;
  std::string tokenizer_path;
  int sim_dp_size = 1;  // --dp-size of every sim
  int replicas = 1;     // kvgates per policy, the driver alternating them
  // Prefill/decode: the `sims` are prefill servers, with this many decode servers beside them;
  // each policy is kvgate's --prefill-policy. 0: one plain pool.
  int pd_decode = 0;
  std::string pd_decode_policy = "round_robin";
  std::string kv_fallback = "round_robin";  // kv_exact's --kv-fallback-policy
  std::function<void(const std::string& policy, const RequestRecord&, size_t done)> on_request;
  std::function<void(const std::string& line)> on_status;
};

// Returns one summary per policy, or sets `error` (a process did not start, naming its log).
std::vector<Summary> compare(const Workload& w, const CompareOptions& o, std::string& error);

// Scrapes a server's /metrics: prompt tokens and cached tokens counted so far (sglang:* counters).
struct ServerCounters {
  double prompt_tokens = 0;
  double cached_tokens = 0;
  bool ok = false;
};
ServerCounters scrape(const std::string& url);
ServerCounters parse_counters(std::string_view metrics_text);

}  // namespace kvgate::bench
