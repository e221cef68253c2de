// gateway/gateway_metrics: see gateway_metrics.h.
#include "gateway/gateway_metrics.h"

#include <array>
#include <atomic>
#include <mutex>
#include <string>
#include <unordered_map>

namespace kvgate {

namespace {
std::atomic<uint64_t> next_limiter_id{1};

// Each thread's last admitted values (a handful of models): a request's label without the
// shared lock, whose reference count every request thread would otherwise write. An entry points
// into its limiter's set, which only grows, and names the limiter by an id no other limiter
// gets, so entries of a limiter that is gone never match.
struct AdmittedCache {
  struct Entry {
    uint64_t limiter = 0;
    std::string_view value;  // the limiter's own copy
  };
  static constexpr size_t kSize = 8;
  std::array<Entry, kSize> entries{};
  size_t next = 0;
};
}  // namespace

LabelLimiter::LabelLimiter(size_t limit)
    : limit_(limit), id_(next_limiter_id.fetch_add(1, std::memory_order_relaxed)) {}

std::string_view LabelLimiter::admit(std::string_view value) {
  thread_local AdmittedCache cache;
  for (const auto& e : cache.entries) {
    if (e.limiter == id_ && e.value == value) return e.value;
  }
  std::string_view admitted = admit_locked(value);
  if (admitted.data() != value.data() && admitted == value) {  // admitted as itself: cache it
    cache.entries[cache.next] = {id_, admitted};
    cache.next = (cache.next + 1) % AdmittedCache::kSize;
  }
  return admitted;
}

std::string_view LabelLimiter::admit_locked(std::string_view value) {
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
                                   "Requests whose client went away before the response ended")),
      retries_denied(r.counter("kvgate_retries_denied_total",
                               "Failed attempts not retried, by reason (unsafe: the worker had "
                               "the whole request; budget, deadline, retry_after, attempts, "
                               "no_worker)",
                               {"reason"})),
      stream_aborts(r.counter("kvgate_upstream_stream_aborts_total",
                              "Streams a worker aborted in their first event (HTTP 200, then an "
                              "abort or error event), by worker",
                              {"worker"})),
      worker_role(
          r.gauge("kvgate_worker_role",
                  "1 for each worker, labelled with its role: regular, or prefill / decode in "
                  "a prefill/decode pool (sgl-model-gateway's worker types); join on worker "
                  "for any worker series by role",
                  {"worker", "role"})),
      pd_prefill_failures(r.counter("kvgate_pd_prefill_failures_total",
                                    "Prefill/decode: prefill halves that failed (no answer, an "
                                    "error status or an aborted stream), by prefill worker; "
                                    "their decode requests were aborted",
                                    {"worker"})),
      worker_load_poll_failures(r.counter("kvgate_worker_load_poll_failures_total",
                                          "Failed /get_load polls, by worker", {"worker"})),
      in_flight_now(in_flight.with({})),
      queue_depth_now(queue_depth.with({})) {}

namespace {

std::string_view status_label(int status) {
  static const std::vector<std::string> kLabels = [] {
    std::vector<std::string> v(600);
    for (int i = 0; i < 600; ++i) v[i] = std::to_string(i);
    return v;
  }();
  return status >= 0 && status < 600 ? std::string_view(kLabels[status]) : "other";
}

// Thread-local map from label addresses to a cell: after warm-up a lookup is one hash probe,
// with no lock and no string building.
struct PtrKey {
  const void* a;
  const void* b;
  uintptr_t c;
  bool operator==(const PtrKey&) const = default;
};
struct PtrKeyHash {
  size_t operator()(const PtrKey& k) const {
    uintptr_t h = reinterpret_cast<uintptr_t>(k.a) * 0x9e3779b97f4a7c15ull;
    h ^= reinterpret_cast<uintptr_t>(k.b) + 0x7f4a7c159e3779b9ull + (h << 6) + (h >> 2);
    h ^= k.c + 0x9e3779b9ull + (h << 6) + (h >> 2);
    return static_cast<size_t>(h);
  }
};
template <class Cell>
using CellCache = std::unordered_map<PtrKey, Cell*, PtrKeyHash>;

}  // namespace

metrics::Counter& GatewayMetrics::request_counter(std::string_view route, int status,
                                                  std::string_view model, bool streaming) {
  thread_local CellCache<metrics::Counter> cache;
  PtrKey key{
      route.data(), model.data(),
      (static_cast<uintptr_t>(status) << 2) | (streaming ? 1u : 0u) | (model.empty() ? 2u : 0u)};
  auto it = cache.find(key);
  if (it != cache.end()) return *it->second;
  auto& cell = requests.with({route, status_label(status), model, streaming ? "true" : "false"});
  cache.emplace(key, &cell);
  return cell;
}

metrics::Histogram& GatewayMetrics::duration_of(std::string_view route) {
  thread_local CellCache<metrics::Histogram> cache;
  PtrKey key{route.data(), nullptr, route.size()};
  auto it = cache.find(key);
  if (it != cache.end()) return *it->second;
  auto& cell = duration.with({route});
  cache.emplace(key, &cell);
  return cell;
}

metrics::Counter& GatewayMetrics::branch_counter(std::string_view policy, std::string_view branch) {
  thread_local CellCache<metrics::Counter> cache;
  PtrKey key{policy.data(), branch.data(), branch.size()};
  auto it = cache.find(key);
  if (it != cache.end()) return *it->second;
  auto& cell = branches.with({policy, branch});
  cache.emplace(key, &cell);
  return cell;
}

}  // namespace kvgate
