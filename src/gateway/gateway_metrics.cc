// gateway/gateway_metrics: see gateway_metrics.h.
#include "gateway/gateway_metrics.h"

#include <array>
#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

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

namespace {

const std::vector<std::string> kSignalLabels = {"rule", "worker", "rank"};

// The method label of smg_http_requests_total: sgl-model-gateway's bounded set (v1.11.0:
// GET, POST, PUT, DELETE, PATCH, HEAD, OPTIONS; any other method is OTHER), as static strings
// (the cell cache keys on their addresses).
std::string_view smg_method(std::string_view method) {
  for (std::string_view m : {"GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"}) {
    if (method == m) return m;
  }
  return "OTHER";
}

// kvgate's cache_aware branches under the names of sgl-model-gateway's tree-mode branches
// (smg v1.11.0, model_gateway/src/policies/cache_aware.rs: tree_match, spill,
// expected_wait_fallback, first_healthy_fallback); "" for a branch it has no name for and does not
// count. `imbalanced` (the load is imbalanced: affinity set aside, the least loaded worker) is
// such a decision: smg counts no decision made while imbalance suspends affinity.
std::string_view smg_cache_aware_branch(std::string_view branch) {
  if (branch == "cache_hit") return "tree_match";
  if (branch == "cache_miss_min_load") return "expected_wait_fallback";
  return "";
}

}  // namespace

std::string_view smg_endpoint(std::string_view route) {
  static constexpr std::pair<std::string_view, std::string_view> kEndpoints[] = {
      {"/v1/chat/completions", "chat"},   {"/generate", "generate"},
      {"/v1/completions", "completions"}, {"/v1/embeddings", "embeddings"},
      {"/v1/rerank", "rerank"},           {"/v1/responses", "responses"},
      {"/v1/messages", "messages"},       {"/v1/classify", "classify"},
  };
  for (const auto& [path, endpoint] : kEndpoints) {
    if (route == path) return endpoint;
  }
  return "other";
}

GatewayMetrics::GatewayMetrics(metrics::Registry& r, const std::vector<double>& buckets,
                               std::vector<double> short_buckets, MetricsCompat compat)
    : requests(r.counter("kvgate_requests_total",
                         "Requests answered, by route, HTTP status, model and streaming",
                         {"route", "status", "model", "streaming"})),
      duration(r.histogram("kvgate_request_duration_seconds",
                           "Time from request received to response complete, by route", {"route"},
                           buckets)),
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
      time_to_headers(r.histogram("kvgate_time_to_response_headers_seconds",
                                  "From the attempt's sending to the serving worker's "
                                  "response headers, by rule, worker and DP rank",
                                  kSignalLabels, buckets)),
      time_to_first_byte(r.histogram("kvgate_time_to_first_byte_seconds",
                                     "From the attempt's sending to the first body byte of the "
                                     "serving worker's answer, by rule, worker and DP rank",
                                     kSignalLabels, buckets)),
      time_to_first_token(r.histogram("kvgate_time_to_first_token_seconds",
                                      "Streams: from the attempt's sending to the first SSE event "
                                      "carrying output, by rule, worker and DP rank",
                                      kSignalLabels, buckets)),
      inter_token_latency(r.histogram("kvgate_inter_token_latency_seconds",
                                      "Streams: time between successive SSE events carrying "
                                      "output, as the gateway read them, by rule, worker and DP "
                                      "rank",
                                      kSignalLabels, short_buckets)),
      e2e_duration(r.histogram("kvgate_e2e_request_duration_seconds",
                               "From the attempt's sending to response complete, for answers a "
                               "worker served (status < 400), by rule, worker and DP rank",
                               kSignalLabels, buckets)),
      admission_queue(r.histogram("kvgate_admission_queue_seconds",
                                  "Time admitted requests waited for a concurrency slot (0 when "
                                  "one was free), by rule",
                                  {"rule"}, buckets)),
      upstream_connect(r.histogram("kvgate_upstream_connect_seconds",
                                   "Time to open a new upstream connection (TCP, and TLS for "
                                   "https), by rule and worker; reused connections are not "
                                   "observed",
                                   {"rule", "worker"}, std::move(short_buckets))),
      prompt_tokens(r.counter("kvgate_prompt_tokens_total",
                              "Prompt tokens the serving worker reported, by rule, worker and "
                              "DP rank",
                              kSignalLabels)),
      cached_tokens(r.counter("kvgate_cached_tokens_total",
                              "Prompt tokens the serving worker reported cached, by rule, worker "
                              "and DP rank",
                              kSignalLabels)),
      predicted_tokens(r.counter("kvgate_predicted_cached_tokens_total",
                                 "Prompt tokens the deciding policy expected the serving worker "
                                 "to have cached (kv_exact's matched pages, cache_aware's "
                                 "matched characters in tokens), counted for requests whose "
                                 "worker reported cached_tokens; compare with "
                                 "kvgate_cached_tokens_total, by rule, worker and DP rank",
                                 kSignalLabels)),
      generated_tokens(r.counter("kvgate_generated_tokens_total",
                                 "Tokens the serving worker reported generated "
                                 "(completion_tokens), by rule, worker and DP rank",
                                 kSignalLabels)),
      in_flight_now(in_flight.with({})),
      queue_depth_now(queue_depth.with({})) {
  if (compat != MetricsCompat::kSmg) return;
  // sgl-model-gateway's names. Where a kvgate family holds the same series, the smg name is the
  // same cells exposed again (an alias) or summed from them at scrape time: nothing is counted
  // twice on the request path. Only series whose labels kvgate's own do not carry (backend_type,
  // a selection's model) are counted a second time, and only with --metrics-compat smg.
  r.alias(worker_active, "smg_worker_requests_active",
          "Currently running requests per worker (kvgate_worker_requests_active)");
  r.alias(worker_health, "smg_worker_health",
          "Worker health status (1=healthy, 0=unhealthy) (kvgate_worker_health)");
  r.alias(worker_cb_state, "smg_worker_cb_state",
          "Circuit breaker state per worker (0=closed, 1=open, 2=half_open) "
          "(kvgate_worker_cb_state)");
  smg_router_requests = &r.counter(
      "smg_router_requests_total",
      "Total routed requests by router_type, backend_type, connection_mode, model, endpoint, "
      "streaming (counted when answered)",
      {"router_type", "backend_type", "connection_mode", "model", "endpoint", "streaming"});
  smg_selections = &r.counter("smg_worker_selection_total",
                              "Worker selection events by worker_type, connection_mode, model, "
                              "policy",
                              {"worker_type", "connection_mode", "model", "policy"});
  smg_retries =
      &r.counter("smg_worker_retries_total", "Total retry attempts by worker_type and endpoint",
                 {"worker_type", "endpoint"});
  smg_http_requests = &r.counter("smg_http_requests_total",
                                 "Total HTTP requests by method and path (kvgate_requests_total "
                                 "by route and the request's method, counted when answered)",
                                 {"method", "path"});
  auto& branch = r.counter("smg_cache_aware_policy_branch_total",
                           "Cache-aware routing decisions by branch "
                           "(kvgate_policy_branch_total{policy=\"cache_aware\"})",
                           {"branch"});
  r.add_collector([this, &branch] {
    // Sums of counters that only grow and whose cells are never removed: they only grow too.
    std::map<std::string_view, uint64_t, std::less<>> by_branch;
    branches.for_each([&](const std::vector<std::string>& v, const metrics::Counter& c) {
      if (v[0] != "cache_aware") return;
      if (std::string_view b = smg_cache_aware_branch(v[1]); !b.empty()) by_branch[b] += c.value();
    });
    for (const auto& [b, n] : by_branch) branch.with({b}).mirror(n);
  });
}

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

SignalCells GatewayMetrics::signal_cells(std::string_view rule, std::string_view worker,
                                         std::string_view rank) {
  SignalCells c;
  c.headers = &time_to_headers.with({rule, worker, rank});
  c.first_byte = &time_to_first_byte.with({rule, worker, rank});
  c.first_token = &time_to_first_token.with({rule, worker, rank});
  c.itl = &inter_token_latency.with({rule, worker, rank});
  c.e2e = &e2e_duration.with({rule, worker, rank});
  c.prompt_tokens = &prompt_tokens.with({rule, worker, rank});
  c.cached_tokens = &cached_tokens.with({rule, worker, rank});
  c.predicted_tokens = &predicted_tokens.with({rule, worker, rank});
  c.generated_tokens = &generated_tokens.with({rule, worker, rank});
  return c;
}

metrics::Counter* GatewayMetrics::smg_router_request(std::string_view model, std::string_view route,
                                                     bool streaming, bool pd) {
  if (!smg_router_requests) return nullptr;
  thread_local CellCache<metrics::Counter> cache;
  PtrKey key{model.data(), route.data(),
             (streaming ? 1u : 0u) | (pd ? 2u : 0u) | (model.empty() ? 4u : 0u)};
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  auto& cell = smg_router_requests->with({"http", pd ? "pd" : "regular", "http", model,
                                          smg_endpoint(route), streaming ? "true" : "false"});
  cache.emplace(key, &cell);
  return &cell;
}

metrics::Counter* GatewayMetrics::smg_http_request(std::string_view method,
                                                   std::string_view route) {
  if (!smg_http_requests) return nullptr;
  thread_local CellCache<metrics::Counter> cache;
  const std::string_view m = smg_method(method);
  PtrKey key{m.data(), route.data(), route.size()};
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  auto& cell = smg_http_requests->with({m, route});
  cache.emplace(key, &cell);
  return &cell;
}

metrics::Counter* GatewayMetrics::smg_selection(std::string_view worker_type,
                                                std::string_view model, std::string_view policy) {
  if (!smg_selections) return nullptr;
  thread_local CellCache<metrics::Counter> cache;
  PtrKey key{model.data(), policy.data(),
             reinterpret_cast<uintptr_t>(worker_type.data()) * 2 + (model.empty() ? 1u : 0u)};
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  auto& cell = smg_selections->with({worker_type, "http", model, policy});
  cache.emplace(key, &cell);
  return &cell;
}

void GatewayMetrics::smg_retry(std::string_view worker_type, std::string_view endpoint) {
  if (smg_retries) smg_retries->with({worker_type, endpoint}).inc();  // (a retry's path: rare)
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
