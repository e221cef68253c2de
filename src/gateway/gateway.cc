// gateway/gateway: see gateway.h.
#include "gateway/gateway.h"

#include <simdjson.h>

#include <boost/asio/as_tuple.hpp>
#include <set>

#include "gateway/errors.h"
#include "gateway/usage_scanner.h"
#include "http/client.h"
#include "util/json.h"
#include "util/log.h"
#include "util/random.h"

namespace kvgate {
namespace {

constexpr size_t kRelayBufferSize = 16384;
constexpr int kClientClosedStatus = 499;  // nginx's convention for "client went away"
constexpr http::Header kJsonType{"content-type", "application/json"};

// Watching a client for disconnects costs an I/O operation per request, so it starts only for
// requests still running after kWatchDelay, found by one sweep timer per thread: short requests
// never pay for it, long generations (the ones worth cancelling) are watched.
constexpr auto kWatchDelay = std::chrono::milliseconds(20);

struct PendingWatch {
  PendingWatch* prev = this;
  PendingWatch* next = this;
  http::Exchange* ex = nullptr;
  http::UpstreamCall** current = nullptr;
  Clock::time_point since{};
  void unlink() {
    prev->next = next;
    next->prev = prev;
    prev = next = this;
  }
};

// Per request thread: the upstream keep-alive pool, spare relay buffers, pending watches.
struct ThreadState {
  explicit ThreadState(std::chrono::seconds connect_timeout)
      : pool(http::ConnectionPool::Options{512, std::chrono::seconds(30), connect_timeout}) {}
  http::ConnectionPool pool;
  std::vector<std::unique_ptr<char[]>> spare;
  PendingWatch pending;  // list head
  std::unique_ptr<asio::steady_timer> sweep;
  bool sweeping = false;
};

void sweep_watches(ThreadState& ts) {
  ts.sweep->expires_after(kWatchDelay);
  ts.sweep->async_wait([&ts](const boost::system::error_code& ec) {
    if (ec) {
      ts.sweeping = false;
      return;
    }
    auto due = Clock::now() - kWatchDelay;
    for (PendingWatch* w = ts.pending.next; w != &ts.pending;) {
      PendingWatch* next = w->next;
      if (w->since <= due) {
        w->ex->watch_disconnect([current = w->current] {
          if (*current) (*current)->abort();
        });
        w->unlink();
      }
      w = next;
    }
    if (ts.pending.next == &ts.pending) {
      ts.sweeping = false;
    } else {
      sweep_watches(ts);
    }
  });
}

// Registers a request for the sweep; on destruction stops its watch (whichever was set up).
class WatchGuard {
 public:
  WatchGuard(ThreadState& ts, http::Exchange& ex, http::UpstreamCall** current) : ex_(ex) {
    node_.ex = &ex;
    node_.current = current;
    node_.since = Clock::now();
    node_.prev = ts.pending.prev;
    node_.next = &ts.pending;
    ts.pending.prev->next = &node_;
    ts.pending.prev = &node_;
    if (!ts.sweeping) {
      if (!ts.sweep) ts.sweep = std::make_unique<asio::steady_timer>(ex.executor());
      ts.sweeping = true;
      sweep_watches(ts);
    }
  }
  ~WatchGuard() {
    node_.unlink();
    ex_.unwatch_disconnect();
  }
  WatchGuard(const WatchGuard&) = delete;
  WatchGuard& operator=(const WatchGuard&) = delete;

 private:
  http::Exchange& ex_;
  PendingWatch node_;
};

ThreadState& thread_state(std::chrono::seconds connect_timeout) {
  thread_local ThreadState state(connect_timeout);
  return state;
}

// A relay buffer borrowed from the thread's spares for the life of one response.
class RelayBuffer {
 public:
  explicit RelayBuffer(ThreadState& ts) : ts_(ts) {
    if (!ts_.spare.empty()) {
      buf_ = std::move(ts_.spare.back());
      ts_.spare.pop_back();
    } else {
      buf_.reset(new char[kRelayBufferSize]);
    }
  }
  ~RelayBuffer() {
    if (ts_.spare.size() < 1024) ts_.spare.push_back(std::move(buf_));
  }
  char* data() { return buf_.get(); }

 private:
  ThreadState& ts_;
  std::unique_ptr<char[]> buf_;
};

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

bool constant_time_equals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

std::string_view header_of(const void* self, std::string_view name) {
  return static_cast<const http::Exchange*>(self)->header(name);
}

struct RouteEntry {
  std::string_view path;
  std::optional<ApiRoute> api;  // proxied inference route; nullopt = gateway's own
};

}  // namespace

Gateway::Gateway(const GatewayConfig& config, WorkerRegistry& registry,
                 std::unique_ptr<Policy> policy, GatewayMetrics& metrics)
    : config_(config),
      registry_(registry),
      policy_(std::move(policy)),
      metrics_(metrics),
      admission_(config.max_concurrent_requests, static_cast<size_t>(config.queue_size),
                 std::chrono::seconds(config.queue_timeout_secs)),
      rid_headers_(request_id_header_names(config)),
      timeout_(config.request_timeout_secs),
      parse_options_(policy_->parse_options()),
      wants_usage_(policy_->wants_usage()) {
  retry_.max_attempts = config.disable_retries ? 1 : static_cast<int>(config.retry_max_retries);
  retry_.initial_backoff = std::chrono::milliseconds(config.retry_initial_backoff_ms);
  retry_.max_backoff = std::chrono::milliseconds(config.retry_max_backoff_ms);
  retry_.multiplier = config.retry_backoff_multiplier;
  retry_.jitter = config.retry_jitter_factor;
}

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

awaitable<void> Gateway::fail(http::Exchange& ex, const GatewayError& e, std::string_view rid) {
  co_await answer(ex, e.status, error_body(e), rid);
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
  if (rid.empty() || rid.size() > 256) {
    rid = new_request_id(generated);
  }

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
    co_await fail(ex, errors::method_not_allowed(method, path, route->api ? "POST" : "GET"), rid);
    record(route->path, 405, "", false, start);
    co_return;
  }
  if (!config_.api_key.empty() && !probe) {
    std::string_view auth = ex.header("authorization");
    if (!auth.starts_with("Bearer ") || !constant_time_equals(auth.substr(7), config_.api_key)) {
      co_await fail(ex, errors::unauthorized(), rid);
      record(route->path, 401, "", false, start);
      co_return;
    }
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
    auto set = registry_.snapshot();
    size_t healthy = registry_.healthy_count();
    std::string body = std::string(R"({"status":")") + (healthy ? "ready" : "not_ready") +
                       R"(","healthy_workers":)" + std::to_string(healthy) +
                       R"(,"total_workers":)" + std::to_string(set->workers.size()) + "}";
    int status = healthy ? 200 : 503;
    co_await answer(ex, status, body, rid);
    record(route->path, status, "", false, start);
    co_return;
  }
  co_await answer(ex, 200, R"({"status":"ok"})", rid);
  record(route->path, 200, "", false, start);
}

awaitable<void> Gateway::list_models(http::Exchange& ex, std::string_view rid) {
  auto set = registry_.snapshot();
  std::set<std::string> seen;
  std::string body = R"({"object":"list","data":[)";
  bool first = true;
  simdjson::dom::parser parser;
  for (const auto& w : set->workers) {
    if (!w->healthy()) continue;
    for (const auto& m : w->models()) {
      std::string_view id;
      simdjson::dom::element e;
      if (parser.parse(m).get(e) || e["id"].get_string().get(id)) continue;
      if (!seen.emplace(id).second) continue;
      if (!first) body.push_back(',');
      body.append(m);
      first = false;
    }
  }
  body.append("]}");
  co_await answer(ex, 200, body, rid);
}

awaitable<void> Gateway::proxy(http::Exchange& ex, ApiRoute route, std::string_view rid) {
  auto start = Clock::now();
  std::string_view route_label = to_string(route);
  RequestInfo info;
  if (std::string err = parse_request(route, ex.body(), info, parse_options_); !err.empty()) {
    co_await fail(ex, errors::bad_json(std::move(err)), rid);
    record(route_label, 400, "", false, start);
    co_return;
  }
  std::string_view model = metrics_.models.admit(info.model);

  // Admission: wait for a slot, or refuse.
  struct Slot {
    Admission* a = nullptr;
    ~Slot() {
      if (a) a->release();
    }
  } slot;
  if (admission_.enabled()) {
    metrics_.queue_depth_now.add(1);
    auto r = co_await admission_.acquire(ex.executor());
    metrics_.queue_depth_now.add(-1);
    if (r == Admission::Result::kQueueFull) {
      metrics_.admission_rejected.with({"queue_full"}).inc();
      co_await fail(ex, errors::queue_full(admission_.queue_size()), rid);
      record(route_label, 429, model, info.stream, start);
      co_return;
    }
    if (r == Admission::Result::kTimeout) {
      metrics_.admission_rejected.with({"timeout"}).inc();
      co_await fail(ex, errors::queue_timeout(static_cast<long>(config_.queue_timeout_secs)), rid);
      record(route_label, 408, model, info.stream, start);
      co_return;
    }
    slot.a = &admission_;
  }

  auto deadline = start + timeout_;
  RouteContext ctx;
  ctx.request = &info;
  ctx.header_fn = &header_of;
  ctx.header_self = &ex;

  // Request headers forwarded upstream: all but hop-by-hop ones and those the client call sets.
  http::HeaderBuffer<24> fwd;
  ex.for_each_header([&](std::string_view name, std::string_view value) {
    auto kind = http::classify_header(name);
    if (kind == http::HeaderKind::kOther || kind == http::HeaderKind::kContentType) {
      fwd.push_back({name, value});  // not hop-by-hop, and not one the upstream call sets
    }
  });
  fwd.push_back({"x-request-id", rid});

  ThreadState& ts = thread_state(std::chrono::seconds(config_.connect_timeout_secs));
  http::UpstreamCall* current = nullptr;
  WatchGuard watch(ts, ex, &current);

  std::vector<uint64_t> failed;
  std::string last_worker;
  std::string last_detail;
  bool last_was_connect = false;
  int attempts_made = 0;
  asio::steady_timer backoff_timer(ex.executor());
  thread_local std::vector<Worker*> candidates;

  for (int attempt = 0; attempt < retry_.max_attempts; ++attempt) {
    if (attempt > 0) {
      metrics_.retries.with({route_label}).inc();
      auto delay = backoff_delay(retry_, attempt - 1, thread_rng().uniform());
      if (Clock::now() + delay >= deadline) break;
      backoff_timer.expires_after(delay);
      co_await backoff_timer.async_wait(asio::as_tuple(asio::use_awaitable));
      if (ex.client_gone()) {
        metrics_.client_disconnects.with({}).inc();
        record(route_label, kClientClosedStatus, model, info.stream, start);
        co_return;
      }
    }
    auto set = registry_.snapshot();
    auto now = Clock::now();
    candidates.clear();
    for (const auto& w : set->workers) {
      if (std::find(failed.begin(), failed.end(), w->id()) != failed.end()) continue;
      if (w->available(now)) candidates.push_back(w.get());
    }
    if (candidates.empty() && !failed.empty()) {
      for (const auto& w : set->workers) {  // every worker failed once: try them again
        if (w->available(now)) candidates.push_back(w.get());
      }
    }
    if (candidates.empty()) {
      if (attempts_made == 0) {
        co_await fail(ex, errors::no_worker(set->workers.size()), rid);
        record(route_label, 503, model, info.stream, start);
        co_return;
      }
      break;
    }
    Decision d = policy_->select(candidates, ctx);
    Worker* w = d.worker;
    if (w == nullptr) {
      metrics_.branch_counter(policy_->name(), d.branch).inc();
      co_await fail(ex, errors::policy_refused(policy_->name(), d.branch), rid);
      record(route_label, 503, model, info.stream, start);
      co_return;
    }
    const auto& m = w->metrics();
    (void)m;
    if (w->metrics().selected) w->metrics().selected->inc();
    metrics_.branch_counter(policy_->name(), d.branch).inc();
    policy_->on_dispatched(d, ctx);
    ++attempts_made;

    w->begin_request();
    struct EndRequest {
      Worker* w;
      ~EndRequest() { w->end_request(); }
    } end_request{w};
    http::UpstreamCall call(ex.executor(), ts.pool, w->target(), w->id());
    call.set_deadline(deadline);
    current = &call;
    struct ClearCurrent {
      http::UpstreamCall*& c;
      ~ClearCurrent() { c = nullptr; }
    } clear_current{current};

    http::CallError e = co_await call.start(ex.method(), ex.target(), fwd, ex.body());
    if (e == http::CallError::kAborted || ex.client_gone()) {
      metrics_.client_disconnects.with({}).inc();
      record(route_label, kClientClosedStatus, model, info.stream, start);
      co_return;
    }
    if (e != http::CallError::kNone) {
      metrics_.upstream_errors.with({w->url(), http::to_string(e)}).inc();
      w->record_failure(Clock::now());
      log::warn("upstream attempt failed")
          .kv("rid", rid)
          .kv("worker", w->url())
          .kv("error", http::to_string(e))
          .kv("detail", call.error_detail())
          .kv("attempt", attempt + 1);
      if (e == http::CallError::kTimeout) {
        co_await fail(ex, errors::upstream_timeout(w->url(), static_cast<long>(timeout_.count())),
                      rid);
        record(route_label, 504, model, info.stream, start);
        policy_->on_completed(d, ctx, Outcome{504, false, std::nullopt, std::nullopt});
        co_return;
      }
      failed.push_back(w->id());
      last_worker = w->url();
      last_detail = std::string(http::to_string(e)) + ": " + call.error_detail();
      last_was_connect = true;
      continue;
    }

    int status = call.status();
    if (retryable_status(status) && attempt + 1 < retry_.max_attempts && Clock::now() < deadline) {
      metrics_.upstream_errors.with({w->url(), "status_" + std::to_string(status)}).inc();
      if (status >= 500) w->record_failure(Clock::now());
      log::warn("upstream answered a retryable status")
          .kv("rid", rid)
          .kv("worker", w->url())
          .kv("status", status)
          .kv("attempt", attempt + 1);
      call.abort();
      failed.push_back(w->id());
      last_worker = w->url();
      last_detail = "status " + std::to_string(status);
      last_was_connect = false;
      continue;
    }
    if (status >= 500) {
      w->record_failure(Clock::now());
    } else {
      w->record_success();
    }

    // Commit to this response: from here on nothing is retried.
    http::HeaderBuffer<24> out;
    bool sse = false;
    call.for_each_header([&](std::string_view name, std::string_view value) {
      switch (http::classify_header(name)) {
        case http::HeaderKind::kContentType:
          sse = value.starts_with("text/event-stream");
          [[fallthrough]];
        case http::HeaderKind::kOther:
        case http::HeaderKind::kHost:
        case http::HeaderKind::kExpect:
          out.push_back({name, value});
          break;
        default:  // hop-by-hop, content-length (we frame the body), x-request-id (ours)
          break;
      }
    });
    out.push_back({"x-request-id", rid});
    std::string route_header, attempts_header;
    if (config_.debug_headers) {
      route_header = std::string(policy_->name()) + "/" + std::string(d.branch);
      attempts_header = std::to_string(attempts_made);
      out.push_back({"x-kvgate-worker", w->url()});
      out.push_back({"x-kvgate-route", route_header});
      out.push_back({"x-kvgate-attempts", attempts_header});
    }

    int final_status = status;
    UsageScanner usage;
    bool scan_usage = wants_usage_ && status < 400;
    if (call.done()) {
      if (!co_await ex.respond(status, out, "")) final_status = kClientClosedStatus;
    } else {
      auto length = call.content_length();
      co_await ex.begin_body(status, out, length);
      if (sse) co_await ex.flush();  // a stream's client sees the status before the first token
      RelayBuffer buf(ts);
      for (;;) {
        http::CallError re = http::CallError::kNone;
        size_t n = co_await call.read_some(buf.data(), kRelayBufferSize, re);
        if (n > 0 && scan_usage) usage.feed(std::string_view(buf.data(), n));
        if (n > 0 && !co_await ex.write_body(std::string_view(buf.data(), n))) {
          call.abort();
          final_status = kClientClosedStatus;
          break;
        }
        if (re == http::CallError::kAborted || ex.client_gone()) {
          final_status = kClientClosedStatus;
          break;
        }
        if (re != http::CallError::kNone) {
          // The response started: the client cannot be given another one. End it visibly.
          metrics_.upstream_errors
              .with({w->url(), "mid_response_" + std::string(http::to_string(re))})
              .inc();
          w->record_failure(Clock::now());
          log::warn("upstream failed mid-response")
              .kv("rid", rid)
              .kv("worker", w->url())
              .kv("error", http::to_string(re))
              .kv("detail", call.error_detail());
          if (sse && !length) {
            GatewayError ge =
                re == http::CallError::kTimeout
                    ? errors::upstream_timeout(w->url(), static_cast<long>(timeout_.count()))
                    : errors::upstream_failed(w->url(), call.error_detail());
            std::string event = "data: " + error_body(ge) + "\n\ndata: [DONE]\n\n";
            co_await ex.write_body(event);
            co_await ex.end_body();
          } else {
            ex.close_after();
          }
          final_status = re == http::CallError::kTimeout ? 504 : 502;
          break;
        }
        if (n == 0) {
          if (!co_await ex.end_body()) final_status = kClientClosedStatus;
          break;
        }
      }
    }
    if (final_status == kClientClosedStatus) metrics_.client_disconnects.with({}).inc();
    policy_->on_completed(
        d, ctx,
        Outcome{final_status, final_status < 400, usage.cached_tokens(), usage.prompt_tokens()});
    record(route_label, final_status, model, info.stream, start);
    co_return;
  }

  // Every attempt failed before a response could be relayed.
  GatewayError ge = last_was_connect || !last_worker.empty()
                        ? errors::upstream_unreachable(last_worker, attempts_made, last_detail)
                        : errors::no_worker(registry_.snapshot()->workers.size());
  co_await fail(ex, ge, rid);
  record(route_label, ge.status, model, info.stream, start);
}

}  // namespace kvgate
