// gateway/gateway_metrics: see gateway_metrics.h.
#include "gateway/gateway_metrics.h"

#include <mutex>

namespace kvgate {

std::string_view LabelLimiter::admit(std::string_view value) {
  {
    std::shared_lock lock(mu_);
    auto it = seen_.find(value);
    if (it != seen_.end()) return *it;
    if (seen_.size() >= limit_) return "other";
  }
  std::unique_lock lock(mu_);
  if (seen_.size() >= limit_) {
    auto it = seen_.find(value);
    return it != seen_.end() ? std::string_view(*it) : std::string_view("other");
  }
  return *seen_.emplace(value).first;
}

GatewayMetrics::GatewayMetrics(metrics::Registry& r, std::vector<double> buckets)
    : requests(r.counter("kvgate_requests_total",
                         "Requests answered, by route, HTTP status, model and streaming",
                         {"route", "status", "model", "streaming"})),
      duration(r.histogram("kvgate_request_duration_seconds",
                           "Time from request received to response complete, by route", {"route"},
                           std::move(buckets))),
      in_flight(r.gauge("kvgate_requests_in_flight", "Requests being handled now")),
      worker_active(r.gauge("kvgate_worker_requests_active",
                            "Requests in flight to each worker through this gateway", {"worker"})),
      worker_health(
          r.gauge("kvgate_worker_health", "1 when the worker passes health checks", {"worker"})),
      worker_cb_state(r.gauge("kvgate_worker_cb_state",
                              "Circuit breaker state: 0 closed, 1 open, 2 half-open", {"worker"})),
      worker_load(r.gauge("kvgate_worker_reported_load",
                          "Running + waiting requests the worker last reported on /get_load",
                          {"worker"})),
      worker_requests(r.counter("kvgate_worker_requests_total",
                                "Attempts sent to each worker (retries included)", {"worker"})),
      worker_failures(r.counter("kvgate_worker_failures_total",
                                "Attempts that failed (connect error, reset, timeout or 5xx)",
                                {"worker"})),
      retries(r.counter("kvgate_retries_total", "Attempts beyond the first, by route", {"route"})),
      upstream_errors(r.counter("kvgate_upstream_errors_total",
                                "Failed upstream attempts by worker and kind", {"worker", "kind"})),
      selections(r.counter("kvgate_worker_selection_total", "Workers chosen by the routing policy",
                           {"policy", "worker"})),
      branches(r.counter("kvgate_policy_branch_total",
                         "Routing decisions by policy and the branch that decided",
                         {"policy", "branch"})),
      queue_depth(
          r.gauge("kvgate_admission_queue_depth", "Requests waiting for a concurrency slot")),
      admission_rejected(r.counter("kvgate_admission_rejected_total",
                                   "Requests refused by admission control (queue_full, timeout)",
                                   {"reason"})),
      client_disconnects(r.counter("kvgate_client_disconnects_total",
                                   "Requests whose client went away before the response ended")) {}

}  // namespace kvgate
