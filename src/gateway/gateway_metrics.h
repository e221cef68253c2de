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

// The cells of one (rule, worker, rank) for the request signals (docs/metrics.md: time to first
// token, inter-token latency, end to end, tokens). Made once by the pool that serves the worker
// (Pool::signals), then updated without a lock. (Upstream connect time is per (rule, worker):
// Pool::connect_time.)
struct SignalCells {
  metrics::Histogram* headers = nullptr;      // kvgate_time_to_response_headers_seconds
  metrics::Histogram* first_byte = nullptr;   // kvgate_time_to_first_byte_seconds
  metrics::Histogram* first_token = nullptr;  // kvgate_time_to_first_token_seconds
  metrics::Histogram* itl = nullptr;          // kvgate_inter_token_latency_seconds
  metrics::Histogram* e2e = nullptr;          // kvgate_e2e_request_duration_seconds
  metrics::Counter* prompt_tokens = nullptr;
  metrics::Counter* cached_tokens = nullptr;
  metrics::Counter* predicted_tokens = nullptr;  // kvgate_predicted_cached_tokens_total
  metrics::Counter* generated_tokens = nullptr;
};

// --metrics-compat: also export sgl-model-gateway's series (docs/metrics.md).
enum class MetricsCompat { kNone, kSmg };

struct GatewayMetrics {
  GatewayMetrics(metrics::Registry& r, const std::vector<double>& duration_buckets,
                 std::vector<double> short_buckets = metrics::short_latency_buckets(),
                 MetricsCompat compat = MetricsCompat::kNone);

  // Per-request cells, resolved once per thread and label set. Label arguments must be strings
  // with static storage (or LabelLimiter results): the cache keys on their addresses.
  metrics::Counter& request_counter(std::string_view route, int status, std::string_view model,
                                    bool streaming);
  metrics::Histogram& duration_of(std::string_view route);
  metrics::Counter& branch_counter(std::string_view policy, std::string_view branch);

  // The request signals' cells of (rule, worker, rank); rank "" when the decision named none.
  // Takes the families' locks: Pool::signals calls it once per (pool, worker, rank).
  SignalCells signal_cells(std::string_view rule, std::string_view worker, std::string_view rank);

  // --metrics-compat smg: the series kvgate's own do not carry (their labels are not in kvgate's
  // families); null without it. Label arguments as for request_counter (static storage or
  // LabelLimiter results). `route`: kvgate's route label (smg's endpoint is made from it).
  metrics::Counter* smg_router_request(std::string_view model, std::string_view route,
                                       bool streaming, bool pd);
  // smg_http_requests_total: `method` the request's (any string: the label is one of
  // sgl-model-gateway's methods or OTHER), `route` kvgate's route label (static storage).
  metrics::Counter* smg_http_request(std::string_view method, std::string_view route);
  metrics::Counter* smg_selection(std::string_view worker_type, std::string_view model,
                                  std::string_view policy);
  void smg_retry(std::string_view worker_type, std::string_view endpoint);
  bool smg() const { return smg_router_requests != nullptr; }

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
  // Request signals, per (rule, worker, rank) through SignalCells; queue time per rule.
  metrics::HistogramFamily& time_to_headers;
  metrics::HistogramFamily& time_to_first_byte;
  metrics::HistogramFamily& time_to_first_token;
  metrics::HistogramFamily& inter_token_latency;
  metrics::HistogramFamily& e2e_duration;
  metrics::HistogramFamily& admission_queue;
  metrics::HistogramFamily& upstream_connect;
  metrics::CounterFamily& prompt_tokens;
  metrics::CounterFamily& cached_tokens;
  metrics::CounterFamily& predicted_tokens;
  metrics::CounterFamily& generated_tokens;
  // --metrics-compat smg (null without it).
  metrics::CounterFamily* smg_router_requests = nullptr;
  metrics::CounterFamily* smg_http_requests = nullptr;
  metrics::CounterFamily* smg_selections = nullptr;
  metrics::CounterFamily* smg_retries = nullptr;
  LabelLimiter models{64};
  metrics::Gauge& in_flight_now;
  metrics::Gauge& queue_depth_now;
};

// sgl-model-gateway's endpoint label of a route path ("chat", "generate", ...; "other").
std::string_view smg_endpoint(std::string_view route);

}  // namespace kvgate
