// gateway/gateway_metrics: the metric families of the kvgate binary (names prefixed kvgate_; see
// docs/metrics.md). Created once at startup; handlers keep references.
#pragma once

#include <set>
#include <shared_mutex>
#include <string>
#include <string_view>

#include "metrics/metrics.h"

namespace kvgate {

// Bounds the distinct values a label may take (request bodies are untrusted): the first `limit`
// distinct values pass, later ones read "other".
class LabelLimiter {
 public:
  explicit LabelLimiter(size_t limit);
  std::string_view admit(std::string_view value);

 private:
  std::string_view admit_locked(std::string_view value);

  size_t limit_;
  uint64_t id_;  // never reused: what each thread's cache of admitted values keys on
  std::shared_mutex mu_;
  std::set<std::string, std::less<>> seen_;
};

struct GatewayMetrics {
  GatewayMetrics(metrics::Registry& r, std::vector<double> duration_buckets);

  // Per-request cells, resolved once per thread and label set. Label arguments must be strings
  // with static storage (or LabelLimiter results): the cache keys on their addresses.
  metrics::Counter& request_counter(std::string_view route, int status, std::string_view model,
                                    bool streaming);
  metrics::Histogram& duration_of(std::string_view route);
  metrics::Counter& branch_counter(std::string_view policy, std::string_view branch);

  metrics::CounterFamily& requests;
  metrics::HistogramFamily& duration;
  metrics::GaugeFamily& in_flight;
  metrics::GaugeFamily& worker_active;
  metrics::GaugeFamily& worker_health;
  metrics::GaugeFamily& worker_cb_state;
  metrics::GaugeFamily& worker_load;
  metrics::CounterFamily& worker_requests;
  metrics::CounterFamily& worker_failures;
  metrics::CounterFamily& retries;
  metrics::CounterFamily& upstream_errors;
  metrics::CounterFamily& selections;
  metrics::CounterFamily& branches;
  metrics::GaugeFamily& queue_depth;
  metrics::CounterFamily& admission_rejected;
  metrics::CounterFamily& client_disconnects;
  metrics::CounterFamily& retries_denied;
  metrics::CounterFamily& stream_aborts;
  metrics::GaugeFamily& worker_role;
  metrics::CounterFamily& pd_prefill_failures;
  metrics::CounterFamily& worker_load_poll_failures;
  LabelLimiter models{64};
  metrics::Gauge& in_flight_now;
  metrics::Gauge& queue_depth_now;
};

}  // namespace kvgate
