// bench/report: what a run measured, summarized, and the outputs of kvgate-bench: a text table for
// the terminal, JSON for machines, Markdown for people and an SVG chart (TTFT distribution and hit
// rate per policy).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "bench/driver.h"

namespace kvgate::bench {

struct Summary {
  std::string label;  // the policy (compare) or "run"
  size_t requests = 0;
  size_t errors = 0;
  double wall_s = 0;
  double output_tokens_per_s = 0;
  double ttft_p50 = 0, ttft_p90 = 0, ttft_p99 = 0;  // ms
  double itl_p50 = 0, itl_p99 = 0;
  double e2e_p50 = 0, e2e_p99 = 0;
  double hit_rate = -1;         // sum cached / sum prompt tokens the workers reported
  double server_hit_rate = -1;  // from the servers' /metrics counters
  double upper_bound = -1;      // the workload's own bound (infinite cache, perfect routing)
  double spread_requests = 0;   // max / mean requests per worker
  double spread_tokens = 0;     // max / mean prompt tokens per worker
  std::map<std::string, size_t> worker_requests;
  std::vector<double> ttft_ms;  // sorted samples (for the chart)
  // The gateways' own routing counters, summed over replicas (kv_exact: "kv_exact_hits",
  // "kv_exact_miss_<reason>"); empty for other policies.
  std::map<std::string, double> routing;
  std::string first_error;
  // Several kvgates (compare --gateways, or an entry's :gateways=N): how many, whether they shared
  // state (:sync, through NATS), the share of sampled requests every one of them would route to
  // the same worker and rank once the run was over (their route-only endpoint), and the sync
  // traffic per request (bytes the kvgates published, summed).
  int gateways = 1;
  bool synced = false;
  double agreement = -1;
  double live_agreement = -1;   // the same, asked as each request was sent (at most 2,000)
  size_t live_asked = 0;        // requests asked live
  size_t live_late = 0;         // of them, some kvgate decided > 1 ms after the moment asked
  size_t live_agreed = 0;       // answered alike
  size_t live_late_agreed = 0;  // late, and answered alike all the same
  // The live agreement of the questions answered on time (-1: none was).
  double live_on_time() const {
    if (live_asked <= live_late || live_agreement < 0 || live_agreed < live_late_agreed) return -1;
    return static_cast<double>(live_agreed - live_late_agreed) /
           static_cast<double>(live_asked - live_late);
  }
  double sync_bytes_per_request = -1;
};

double percentile(std::vector<double> v, double p);  // p in [0, 100]
Summary summarize(const std::string& label, const RunResult& run, double upper_bound,
                  double server_hit_rate);

std::string table(const std::vector<Summary>& rows, bool with_bound);
std::string to_json(const std::vector<Summary>& rows, const std::string& workload,
                    const std::string& description);
std::string to_markdown(const std::vector<Summary>& rows, const std::string& workload,
                        const std::string& description, const std::string& setup);
std::string to_svg(const std::vector<Summary>& rows, const std::string& title);

}  // namespace kvgate::bench
