// gateway/gateway: see gateway.h.
#include "gateway/gateway.h"

#include <simdjson.h>

#include <set>

#include "gateway/admin.h"
#include "gateway/errors.h"
#include "gateway/knobs.h"
#include "util/json.h"
#include "util/random.h"

namespace kvgate {
namespace {

constexpr http::Header kJsonType{"content-type", "application/json"};

// A random 32-hex-digit request id, written into `out` (which must hold 32 chars).
std::string_view new_request_id(char* out) {
  static constexpr char kHex[] = "0123456789abcdef";
  uint64_t a = thread_rng().next(), b = thread_rng().next();
  for (int i = 0; i < 16; ++i) {
    out[i] = kHex[(a >> (i * 4)) & 15];
    out[16 + i] = kHex[(b >> (i * 4)) & 15];
  }
  return std::string_view(out, 32);
}

struct RouteEntry {
  std::string_view path;
  std::optional<ApiRoute> api;  // proxied inference route; nullopt = gateway's own
};

}  // namespace

DoctorKey::DoctorKey() : key_(random_key_hex()) {}

std::optional<DoctorKey::Pass> DoctorKey::check(std::string_view header) const {
  size_t sp = header.find(' ');
  std::string_view given = header.substr(0, sp);
  // Constant time in the key's length: no early exit on the first differing byte.
  unsigned diff = given.size() == key_.size() ? 0 : 1;
  for (size_t i = 0; i < key_.size(); ++i) {
    diff |= static_cast<unsigned char>(key_[i]) ^
            static_cast<unsigned char>(i < given.size() ? given[i] : 0);
  }
  if (diff != 0) return std::nullopt;
  Pass pass;
  std::string_view rest = sp == std::string_view::npos ? std::string_view{} : header.substr(sp);
  while (!rest.empty()) {
    while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
    size_t end = rest.find(' ');
    std::string_view item = rest.substr(0, end);
    rest = end == std::string_view::npos ? std::string_view{} : rest.substr(end);
    if (item.starts_with("rule=")) pass.rule = item.substr(5);
    if (item.starts_with("pin=")) pass.pin = item.substr(4);
  }
  return pass;
}

Gateway::Gateway(const GatewayConfig& config, PoolManager& pools, GatewayMetrics& metrics)
    : config_(config),
      pools_(pools),
      metrics_(metrics),
      admission_(config.max_concurrent_requests, static_cast<size_t>(config.queue_size),
                 std::chrono::seconds(config.queue_timeout_secs)),
      retry_(retry_config(config)),
      budget_(retry_),
      rid_headers_(request_id_header_names(config)),
      timeout_(config.request_timeout_secs),
      api_key_(config.api_key) {}

Gateway::~Gateway() = default;

void Gateway::record(std::string_view route, int status, std::string_view model, bool streaming,
                     Clock::time_point start) {
  metrics_.request_counter(route, status, model, streaming).inc();
  std::chrono::duration<double> d = Clock::now() - start;
  metrics_.duration_of(route).observe(d.count());
}

awaitable<void> Gateway::answer(http::Exchange& ex, int status, std::string_view body,
                                std::string_view rid) {
  const http::Header headers[] = {kJsonType, {"x-request-id", rid}};
  co_await ex.respond(status, headers, body);
}

// `e` by value: callers pass temporaries, and GCC 12 has destroyed temporaries bound to a
// coroutine's reference parameters too early (or twice).
awaitable<void> Gateway::fail(http::Exchange& ex, GatewayError e, std::string_view rid,
                              const Worker* worker) {
  std::string body = error_body(e);
  if (!config_.debug_headers || worker == nullptr) {
    co_await answer(ex, e.status, body, rid);
    co_return;
  }
  const http::Header headers[] = {
      kJsonType, {"x-request-id", rid}, {"x-kvgate-worker", worker->url()}};
  co_await ex.respond(e.status, headers, body);
}

awaitable<void> Gateway::handle(http::Exchange& ex) {
  auto start = Clock::now();
  in_flight_.fetch_add(1, std::memory_order_relaxed);
  metrics_.in_flight_now.add(1);
  struct Done {
    Gateway* g;
    ~Done() {
      g->in_flight_.fetch_sub(1, std::memory_order_relaxed);
      g->metrics_.in_flight_now.add(-1);
    }
  } done{this};

  char generated[32];
  std::string_view rid;
  for (const auto& h : rid_headers_) {
    rid = ex.header(h);
    if (!rid.empty()) break;
  }
  // A client-supplied id travels in headers and logs: printable ASCII only, and bounded.
  bool rid_ok = !rid.empty() && rid.size() <= 256 &&
                std::all_of(rid.begin(), rid.end(), [](char c) { return c > 0x20 && c < 0x7f; });
  if (!rid_ok) rid = new_request_id(generated);

  static constexpr RouteEntry kRoutes[] = {
      {"/generate", ApiRoute::kGenerate},
      {"/v1/chat/completions", ApiRoute::kChatCompletions},
      {"/v1/completions", ApiRoute::kCompletions},
      {"/v1/embeddings", ApiRoute::kEmbeddings},
      {"/v1/rerank", ApiRoute::kRerank},
      {"/v1/models", std::nullopt},
      {"/health", std::nullopt},
      {"/liveness", std::nullopt},
      {"/readiness", std::nullopt},
      {"/get_server_info", std::nullopt},
      {"/server_info", std::nullopt},
      {"/get_model_info", std::nullopt},
      {"/model_info", std::nullopt},
  };
  std::string_view path = ex.path();
  std::string_view method = ex.method();
  const RouteEntry* route = nullptr;
  for (const auto& r : kRoutes) {
    if (r.path == path) {
      route = &r;
      break;
    }
  }
  if (!route) {
    co_await fail(ex, errors::not_found(method, path), rid);
    record("unknown", 404, "", false, start);
    co_return;
  }
  bool is_get = method == "GET" || method == "HEAD";
  bool probe = path == "/health" || path == "/liveness" || path == "/readiness";
  if (route->api ? method != "POST" : !is_get) {
    std::string_view allowed = route->api ? "POST" : "GET";
    co_await fail(ex, errors::method_not_allowed(method, path, allowed), rid);
    record(route->path, 405, "", false, start);
    co_return;
  }
  if (!probe && !api_key_.matches(ex.header("authorization"))) {
    co_await fail(ex, errors::unauthorized(), rid);
    record(route->path, 401, "", false, start);
    co_return;
  }
  if (route->api) {
    co_await proxy(ex, *route->api, rid);
    co_return;
  }
  if (path == "/v1/models") {
    co_await list_models(ex, rid);
    record(route->path, 200, "", false, start);
    co_return;
  }
  if (path == "/readiness") {
    co_await readiness(ex, rid, start);
    co_return;
  }
  if (path.ends_with("_info")) {
    // They reveal the engines' configuration: the admin listener answers them, this one only
    // with --expose-server-info (sgl-model-gateway's behaviour).
    if (!config_.expose_server_info) {
      // (A named value: GCC 12 destroys a braced temporary in a co_await expression twice.)
      GatewayError hidden{404, "invalid_request_error", "not_found",
                          std::string(path) +
                              " is answered on the admin listener (--admin-port); "
                              "--expose-server-info answers it here too"};
      co_await fail(ex, hidden, rid);
      record(route->path, 404, "", false, start);
      co_return;
    }
    co_await answer_worker_info(ex, pools_.table(), "",
                                std::chrono::seconds(config_.health_check_timeout_secs));
    record(route->path, 200, "", false, start);
    co_return;
  }
  co_await answer(ex, 200, R"({"status":"ok"})", rid);
  record(route->path, 200, "", false, start);
}

// Ready when some rule has a healthy worker (as sgl-model-gateway: one model's servers booting or
// down must not take the gateway out of a load balancer for every other model). Counts only: the
// probe is unauthenticated. Per-rule health is on the admin API (GET /workers).
awaitable<void> Gateway::readiness(http::Exchange& ex, std::string_view rid,
                                   Clock::time_point start) {
  auto table = pools_.table();
  // Ready when some pool can serve: a healthy worker, or for prefill/decode a healthy server of
  // each role (a decode server alone would wait for a prefill that cannot come).
  size_t healthy = 0, total = 0, prefill = 0, decode = 0;
  bool any_pd = false, ready = false;
  auto count_healthy = [](const WorkerSet& set) {
    return static_cast<size_t>(std::count_if(set.workers.begin(), set.workers.end(),
                                             [](const WorkerPtr& w) { return w->healthy(); }));
  };
  for (const auto& p : table->pools) {
    auto set = p->workers();
    const size_t h = count_healthy(*set);
    healthy += h;
    total += set->workers.size();
    if (p->pd()) {
      const size_t hp = count_healthy(p->prefill_workers());
      const size_t hd = count_healthy(p->decode_workers());
      any_pd = true;
      prefill += hp;
      decode += hd;
      ready = ready || (hp > 0 && hd > 0);
    } else {
      ready = ready || h > 0;
    }
  }
  std::string body = std::string(R"({"status":")") + (ready ? "ready" : "not_ready") +
                     R"(","healthy_workers":)" + std::to_string(healthy) + R"(,"total_workers":)" +
                     std::to_string(total);
  if (any_pd) {
    body += R"(,"healthy_prefill":)" + std::to_string(prefill) + R"(,"healthy_decode":)" +
            std::to_string(decode);
  }
  body += "}";
  int status = ready ? 200 : 503;
  co_await answer(ex, status, body, rid);
  record("/readiness", status, "", false, start);
}

awaitable<void> Gateway::list_models(http::Exchange& ex, std::string_view rid) {
  auto table = pools_.table();
  std::set<std::string, std::less<>> seen;
  std::string body = R"({"object":"list","data":[)";
  bool first = true;
  simdjson::dom::parser parser;
  auto add = [&](std::string_view entry) {
    if (!first) body.push_back(',');
    body.append(entry);
    first = false;
  };
  for (const auto& p : table->pools) {
    // A rule naming its models lists them (owned by the rule); a catch-all lists what its
    // healthy workers serve.
    for (const auto& m : p->rule().models) {
      if (!seen.emplace(m).second) continue;
      std::string entry = R"({"id":)";
      json::append_string(entry, m);
      entry.append(R"(,"object":"model","owned_by":"kvgate"})");
      add(entry);
    }
    if (!p->rule().models.empty()) continue;
    for (const auto& w : p->workers()->workers) {
      if (!w->healthy()) continue;
      for (const auto& m : w->models()) {
        std::string_view id;
        simdjson::dom::element e;
        if (parser.parse(m).get(e) || e["id"].get_string().get(id)) continue;
        if (!seen.emplace(id).second) continue;
        add(m);
      }
    }
  }
  body.append("]}");
  co_await answer(ex, 200, body, rid);
}

}  // namespace kvgate
