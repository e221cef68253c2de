// gateway/gateway: see gateway.h.
#include "gateway/gateway.h"

#include <simdjson.h>

#include <boost/asio/as_tuple.hpp>
#include <cstdio>
#include <cstdlib>
#include <set>

#include "gateway/admin.h"
#include "gateway/errors.h"
#include "gateway/stream_check.h"
#include "gateway/usage_scanner.h"
#include "http/client.h"
#include "request/body_rewrite.h"
#include "util/json.h"
#include "util/log.h"
#include "util/random.h"

namespace kvgate {
namespace {

constexpr size_t kRelayBufferSize = 16384;
constexpr int kClientClosedStatus = 499;  // nginx's convention for "client went away"
constexpr http::Header kJsonType{"content-type", "application/json"};
// A stream's first event is read before the client sees anything (it may be an abort): at most
// this much of it. A longer first event is relayed without the check.
constexpr size_t kFirstEventLimit = 65536;
// A refused answer (429/503...) is kept, up to this size, to give the client when no retry works.
constexpr size_t kSavedAnswerLimit = 65536;
// Longest `model` a request may name (OpenAI and Hugging Face ids are far shorter).
constexpr size_t kMaxModelNameBytes = 256;

// Watching a client for disconnects costs an I/O operation per request, so it starts only for
// requests still running after kWatchDelay, found by one sweep timer per thread: short requests
// never pay for it, long ones (queued, or long generations: the ones worth cancelling) are watched.
constexpr auto kWatchDelay = std::chrono::milliseconds(20);

// Per-site limits of the warnings a failing worker can make on every request (a dead worker
// under load would otherwise write thousands of lines a second; suppressed ones are counted on
// the next line of the site).
log::RateLimit kLogAttemptFailed(20, std::chrono::seconds(10));
log::RateLimit kLogRetryableStatus(20, std::chrono::seconds(10));
log::RateLimit kLogNoFirstEvent(20, std::chrono::seconds(10));
log::RateLimit kLogFirstEventAbort(20, std::chrono::seconds(10));
log::RateLimit kLogMidResponse(20, std::chrono::seconds(10));

// What a client going away cancels: its wait in the admission queue, its upstream call.
struct Cancel {
  Admission* admission = nullptr;
  std::shared_ptr<Admission::Waiter> waiter;
  http::UpstreamCall* call = nullptr;
  asio::steady_timer* backoff = nullptr;  // a retry's wait (its Retry-After may be long)
  void fire() {
    if (waiter && admission) admission->cancel(waiter);
    if (call) call->abort();
    if (backoff) backoff->cancel();
  }
};

struct PendingWatch {
  PendingWatch* prev = this;
  PendingWatch* next = this;
  http::Exchange* ex = nullptr;
  Cancel* cancel = nullptr;
  Clock::time_point since{};
  void unlink() {
    prev->next = next;
    next->prev = prev;
    prev = next = this;
  }
};

}  // namespace

struct RequestThread::State {
  explicit State(const GatewayConfig& c)
      : pool(http::ConnectionPool::Options{
            static_cast<size_t>(c.max_idle_connections_per_worker),
            std::chrono::milliseconds(c.worker_idle_connection_timeout_ms),
            std::chrono::seconds(c.connect_timeout_secs)}) {}
  http::ConnectionPool pool;
  std::vector<std::unique_ptr<char[]>> spare;
  PendingWatch pending;  // list head
  std::unique_ptr<asio::steady_timer> sweep;
  std::unique_ptr<asio::steady_timer> reaper;
  bool sweeping = false;
  bool closed = false;
};

namespace {

thread_local RequestThread::State* tl_state = nullptr;

// The calling thread's state, bound by whoever runs the thread (RequestThread::bind).
RequestThread::State& thread_state() {
  if (!tl_state) {
    std::fprintf(stderr, "kvgate: a request ran on a thread without RequestThread::bind()\n");
    std::abort();
  }
  return *tl_state;
}

// Drops idle upstream connections past their reuse time, once a second: a worker closes its end
// of them soon after (uvicorn: 5 s), and they would sit half-closed until the next request to
// that worker.
void start_reaper(RequestThread::State& ts, const asio::any_io_executor& ex) {
  if (ts.reaper || ts.closed) return;
  ts.reaper = std::make_unique<asio::steady_timer>(ex);
  struct Loop {
    RequestThread::State* ts;
    void operator()(const boost::system::error_code& ec) const {
      if (ec || ts->closed || !ts->reaper) return;
      ts->pool.reap(Clock::now());
      ts->reaper->expires_after(std::chrono::seconds(1));
      ts->reaper->async_wait(*this);
    }
  };
  ts.reaper->expires_after(std::chrono::seconds(1));
  ts.reaper->async_wait(Loop{&ts});
}

void sweep_watches(RequestThread::State& ts) {
  ts.sweep->expires_after(kWatchDelay);
  ts.sweep->async_wait([&ts](const boost::system::error_code& ec) {
    if (ec || ts.closed) {
      ts.sweeping = false;
      return;
    }
    auto due = Clock::now() - kWatchDelay;
    for (PendingWatch* w = ts.pending.next; w != &ts.pending;) {
      PendingWatch* next = w->next;
      if (w->since <= due) {
        w->ex->watch_disconnect([cancel = w->cancel] { cancel->fire(); });
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
  WatchGuard(RequestThread::State& ts, http::Exchange& ex, Cancel* cancel) : ex_(ex) {
    node_.ex = &ex;
    node_.cancel = cancel;
    node_.since = Clock::now();
    node_.prev = ts.pending.prev;
    node_.next = &ts.pending;
    ts.pending.prev->next = &node_;
    ts.pending.prev = &node_;
    if (!ts.sweeping && !ts.closed) {
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

// A relay buffer borrowed from the thread's spares for the life of one response.
class RelayBuffer {
 public:
  explicit RelayBuffer(RequestThread::State& ts) : ts_(ts) {
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
  RelayBuffer(const RelayBuffer&) = delete;
  RelayBuffer& operator=(const RelayBuffer&) = delete;
  char* data() { return buf_.get(); }

 private:
  RequestThread::State& ts_;
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

// What a policy may read of the request's headers. X-SMG-Target-Worker pins a worker: only
// honoured when the operator allows it (--allow-target-worker-header).
struct HeaderView {
  const http::Exchange* ex;
  bool allow_target;
};
std::string_view header_of(const void* self, std::string_view name) {
  const auto* v = static_cast<const HeaderView*>(self);
  if (!v->allow_target && http::iequals(name, "x-smg-target-worker")) return {};
  return v->ex->header(name);
}

// Header names a message lists in its Connection header(s): hop-by-hop for this message only.
class ConnectionTokens {
 public:
  void add(std::string_view value) {
    while (!value.empty()) {
      size_t comma = value.find(',');
      std::string_view t = value.substr(0, comma);
      value = comma == std::string_view::npos ? std::string_view{} : value.substr(comma + 1);
      while (!t.empty() && (t.front() == ' ' || t.front() == '\t')) t.remove_prefix(1);
      while (!t.empty() && (t.back() == ' ' || t.back() == '\t')) t.remove_suffix(1);
      if (!t.empty() && tokens_.size() < 32) tokens_.push_back(t);
    }
  }
  bool contains(std::string_view name) const {
    for (auto t : tokens_) {
      if (http::iequals(t, name)) return true;
    }
    return false;
  }
  bool empty() const { return tokens_.empty(); }

 private:
  std::vector<std::string_view> tokens_;
};

// A Forwarded "for=" node (RFC 7239): IPv6 addresses quoted and bracketed.
std::string forwarded_node(const std::string& addr) {
  if (addr.find(':') != std::string::npos) return "\"[" + addr + "]\"";
  return addr.empty() ? "unknown" : addr;
}

struct RouteEntry {
  std::string_view path;
  std::optional<ApiRoute> api;  // proxied inference route; nullopt = gateway's own
};

// How an attempt's outcome counts for the worker's circuit breaker.
enum class Verdict { kSuccess, kFailure, kNeutral };

// A dispatch to one worker: opened with the policy's on_dispatched and the worker's in-flight
// count; closed exactly once with the outcome (policy on_completed, breaker), on every path,
// including a coroutine destroyed at shutdown (then as a client abort).
class Dispatch {
 public:
  Dispatch(Policy& policy, RouteContext& ctx, const Decision& d, CircuitBreaker::Pass pass)
      : policy_(policy), ctx_(ctx), d_(d), pass_(pass) {
    try {
      policy_.on_dispatched(d_, ctx_);
    } catch (...) {
      d_.worker->record_neutral(pass_);  // a trial pass must never be lost
      throw;
    }
    d_.worker->begin_request();
  }
  ~Dispatch() {
    if (!done_) {
      finish(Outcome{.status = kClientClosedStatus, .ok = false, .started = started_guess},
             Verdict::kNeutral);
    }
    d_.worker->end_request();
  }
  Dispatch(const Dispatch&) = delete;
  Dispatch& operator=(const Dispatch&) = delete;

  void finish(const Outcome& o, Verdict v) {
    if (done_) return;
    done_ = true;
    Worker& w = *d_.worker;
    switch (v) {
      case Verdict::kSuccess:
        w.record_success(pass_);
        break;
      case Verdict::kFailure:
        w.record_failure(pass_, Clock::now());
        break;
      case Verdict::kNeutral:
        w.record_neutral(pass_);
        break;
    }
    policy_.on_completed(d_, ctx_, o);
  }
  bool trial() const { return pass_ == CircuitBreaker::Pass::kTrial; }
  // For the destructor: whether the worker may have the request (true until known otherwise).
  bool started_guess = true;

 private:
  Policy& policy_;
  RouteContext& ctx_;
  Decision d_;
  CircuitBreaker::Pass pass_;
  bool done_ = false;
};

// A worker's answer kept to give the client when no retry works out (its own 429/503...).
struct SavedAnswer {
  int status = 0;
  std::string content_type;
  std::string retry_after;
  std::string body;
};

// Holds a retry slot of the budget until released or destroyed.
class BudgetSlot {
 public:
  explicit BudgetSlot(RetryBudget& b) : budget_(b) {}
  ~BudgetSlot() { release(); }
  BudgetSlot(const BudgetSlot&) = delete;
  BudgetSlot& operator=(const BudgetSlot&) = delete;
  bool acquire() {
    release();
    held_ = budget_.try_acquire();
    return held_;
  }
  void release() {
    if (held_) budget_.release();
    held_ = false;
  }

 private:
  RetryBudget& budget_;
  bool held_ = false;
};

}  // namespace

RequestThread::RequestThread(const GatewayConfig& config)
    : state_(std::make_unique<State>(config)) {}
RequestThread::~RequestThread() = default;

void RequestThread::bind() {
  tl_state = state_.get();
}

void RequestThread::close() {
  state_->closed = true;
  state_->pool.close();
  state_->sweep.reset();
  state_->reaper.reset();
}

Gateway::Gateway(const GatewayConfig& config, PoolManager& pools, GatewayMetrics& metrics)
    : config_(config),
      pools_(pools),
      metrics_(metrics),
      admission_(config.max_concurrent_requests, static_cast<size_t>(config.queue_size),
                 std::chrono::seconds(config.queue_timeout_secs)),
      retry_{
          .max_attempts = config.disable_retries ? 1 : static_cast<int>(config.retry_max_retries),
          .initial_backoff = std::chrono::milliseconds(config.retry_initial_backoff_ms),
          .max_backoff = std::chrono::milliseconds(config.retry_max_backoff_ms),
          .multiplier = config.retry_backoff_multiplier,
          .jitter = config.retry_jitter_factor,
          .budget_percent = config.retry_budget_percent,
          .budget_min_concurrency = config.retry_budget_min_concurrency},
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
    co_await fail(ex, errors::method_not_allowed(method, path, route->api ? "POST" : "GET"), rid);
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
  size_t healthy = 0, total = 0;
  for (const auto& p : table->pools) {
    healthy += p->registry().healthy_count();
    total += p->workers()->workers.size();
  }
  std::string body = std::string(R"({"status":")") + (healthy ? "ready" : "not_ready") +
                     R"(","healthy_workers":)" + std::to_string(healthy) + R"(,"total_workers":)" +
                     std::to_string(total) + "}";
  int status = healthy ? 200 : 503;
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

awaitable<void> Gateway::proxy(http::Exchange& ex, ApiRoute route, std::string_view rid) {
  auto start = Clock::now();
  auto deadline = start + timeout_;
  std::string_view route_label = to_string(route);
  RequestThread::State& ts = thread_state();
  start_reaper(ts, ex.executor());
  budget_.request_started();
  struct EndRequest {
    RetryBudget& b;
    ~EndRequest() { b.request_ended(); }
  } end_request{budget_};

  auto client_left = [&](std::string_view model, bool stream) {
    metrics_.client_disconnects.with({}).inc();
    record(route_label, kClientClosedStatus, model, stream, start);
  };
  auto bad_request = [&](std::string err) -> awaitable<void> {
    co_await fail(ex, errors::bad_json(std::move(err)), rid);
    record(route_label, 400, "", false, start);
  };

  // Phase: resolve. The rule table may change at any time; this request keeps the pool it
  // resolved (and with it the policy that decides and hears the completion) until it is done.
  // Only when rules name models is the body read here, for its model alone (cheap next to the
  // parse below, which waits for admission).
  RequestInfo info;
  bool parsed = false;
  std::shared_ptr<Pool> pool;
  {
    auto table = pools_.table();
    uint16_t port = ex.local_port();
    std::string parse_error;
    if (table->needs_model(port, ex.path())) {
      parse_error = parse_request(route, ex.body(), info);
      parsed = parse_error.empty();
      if (!parsed) info = RequestInfo{};  // no model: a catch-all rule may still take it
    }
    pool = table->resolve(port, ex.path(), info.model);
    if (!pool && !parse_error.empty()) {
      co_await bad_request(std::move(parse_error));
      co_return;
    }
  }
  if (!pool) {
    GatewayError ge = parsed ? errors::model_not_found(info.model) : errors::no_rule(ex.path());
    co_await fail(ex, ge, rid);
    record(route_label, ge.status, "", false, start);
    co_return;
  }
  Admission& admission = admission_;
  Policy& policy = pool->policy();

  // A client that goes away cancels what the request waits for (queue slot, upstream call).
  Cancel cancel;
  cancel.admission = &admission;
  WatchGuard watch(ts, ex, &cancel);

  // Phase: admit. Before parsing: parsing, rendering and tokenizing cost CPU in proportion to the
  // body, and only admitted requests may spend it.
  struct Slot {
    Admission* a = nullptr;
    ~Slot() {
      if (a) a->release();
    }
  } slot;
  if (admission.enabled()) {
    metrics_.queue_depth_now.add(1);
    auto r = co_await admission.acquire(ex.executor(), &cancel.waiter);
    metrics_.queue_depth_now.add(-1);
    cancel.waiter.reset();
    if (r == Admission::Result::kAdmitted) slot.a = &admission;
    if (r == Admission::Result::kCancelled || ex.client_gone()) {
      client_left("", false);
      co_return;
    }
    if (r == Admission::Result::kQueueFull) {
      metrics_.admission_rejected.with({"queue_full"}).inc();
      co_await fail(ex, errors::queue_full(admission.queue_size()), rid);
      record(route_label, 429, "", false, start);
      co_return;
    }
    if (r == Admission::Result::kTimeout) {
      metrics_.admission_rejected.with({"timeout"}).inc();
      co_await fail(ex, errors::queue_timeout(static_cast<long>(config_.queue_timeout_secs)), rid);
      record(route_label, 408, "", false, start);
      co_return;
    }
  }

  // Phase: parse (a pool in mode 0 proxies without reading bodies).
  const ParseOptions& options = pool->parse_options();
  bool wants_content = options.want_text || options.want_tokens;
  if (pool->reads_body() && (!parsed || wants_content)) {
    info = RequestInfo{};
    if (std::string err = parse_request(route, ex.body(), info, options); !err.empty()) {
      co_await bad_request(std::move(err));
      co_return;
    }
  }
  if (info.model.size() > kMaxModelNameBytes) {
    // A model name becomes a metric label and a prefix-tree key: bounded like any client input.
    co_await fail(ex,
                  errors::invalid_request("'model' is " + std::to_string(info.model.size()) +
                                          " bytes long; model names are at most " +
                                          std::to_string(kMaxModelNameBytes) + " bytes"),
                  rid);
    record(route_label, 400, "", false, start);
    co_return;
  }
  std::string_view model = metrics_.models.admit(info.model);
  HeaderView header_view{&ex, config_.allow_target_worker_header};
  RouteContext ctx;
  ctx.request = &info;
  ctx.header_fn = &header_of;
  ctx.header_self = &header_view;

  // Request headers forwarded upstream: not hop-by-hop (nor named in Connection), not those the
  // upstream call sets; X-Forwarded-For and Forwarded extended with this client.
  ConnectionTokens conn_tokens;
  std::string xff, forwarded;
  ex.for_each_header([&](std::string_view name, std::string_view value) {
    if (http::iequals(name, "connection")) conn_tokens.add(value);
  });
  http::HeaderBuffer<24> fwd;
  ex.for_each_header([&](std::string_view name, std::string_view value) {
    auto kind = http::classify_header(name);
    if (kind != http::HeaderKind::kOther && kind != http::HeaderKind::kContentType) return;
    if (!conn_tokens.empty() && conn_tokens.contains(name)) return;
    if (http::iequals(name, "x-forwarded-for")) {
      xff.append(value).append(", ");
      return;
    }
    if (http::iequals(name, "forwarded")) {
      forwarded.append(value).append(", ");
      return;
    }
    if (!config_.allow_target_worker_header && http::iequals(name, "x-smg-target-worker")) return;
    fwd.push_back({name, value});
  });
  const std::string& client_addr = ex.remote_address();
  xff.append(client_addr.empty() ? "unknown" : client_addr);
  forwarded.append("for=").append(forwarded_node(client_addr));
  forwarded.append(ex.secure() ? ";proto=https" : ";proto=http");
  fwd.push_back({"x-forwarded-for", xff});
  fwd.push_back({"forwarded", forwarded});
  fwd.push_back({"x-request-id", rid});

  // Phases select / send / retry.
  auto set = pool->workers();  // keeps every worker of this request alive
  std::vector<uint64_t> failed;
  std::vector<Worker*> charge_if_served;  // answered 500 once: charged if another worker serves
  int ran_and_failed = 0;                 // 500 answers: at most one is retried
  int attempts_made = 0;
  int denied = 0;
  http::CallError last_error = http::CallError::kNone;
  std::optional<SavedAnswer> saved;
  std::optional<std::chrono::milliseconds> retry_after;
  BudgetSlot budget_slot(budget_);
  asio::steady_timer backoff_timer(ex.executor());
  cancel.backoff = &backoff_timer;
  struct ClearBackoff {
    Cancel& c;
    ~ClearBackoff() { c.backoff = nullptr; }
  } clear_backoff{cancel};
  std::chrono::milliseconds next_delay{0};  // the wait may_retry() checked, used as checked
  bool skip_backoff = false;                // the last round made no attempt (breaker turned)
  std::vector<Worker*> candidates;
  candidates.reserve(set->workers.size());

  auto list_candidates = [&](Clock::time_point now) {
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
  };
  // Whether another attempt may follow one that failed safely; takes the budget slot if so.
  auto may_retry = [&]() -> std::string_view {
    if (attempts_made >= retry_.max_attempts) return "attempts";
    auto now = Clock::now();
    auto wait = backoff_delay(retry_, attempts_made - 1, thread_rng().uniform());
    if (retry_after) {
      if (*retry_after > retry_.max_backoff) return "retry_after";
      wait = std::max(wait, *retry_after);
    }
    if (now + wait >= deadline) return "deadline";
    next_delay = wait;
    list_candidates(now);
    if (candidates.empty()) return "no_worker";
    if (!budget_slot.acquire()) return "budget";
    return "";
  };
  auto retry_denied = [&](std::string_view why) {
    metrics_.retries_denied.with({why}).inc();
    log::debug("not retrying").kv("rid", rid).kv("why", why).kv("attempts", attempts_made);
  };

  for (;;) {
    if (attempts_made > 0 && !skip_backoff) {
      metrics_.retries.with({route_label}).inc();
      retry_after.reset();
      backoff_timer.expires_after(next_delay);
      co_await backoff_timer.async_wait(asio::as_tuple(asio::use_awaitable));
      if (ex.client_gone()) {
        client_left(model, info.stream);
        co_return;
      }
    }
    skip_backoff = false;
    auto now = Clock::now();
    list_candidates(now);
    if (candidates.empty()) {
      if (attempts_made == 0) {
        co_await fail(ex, errors::no_worker(set->workers.size()), rid);
        record(route_label, 503, model, info.stream, start);
        co_return;
      }
      break;
    }
    Decision d = policy.select(candidates, ctx);
    Worker* w = d.worker;
    if (w == nullptr) {
      metrics_.branch_counter(policy.name(), d.branch).inc();
      if (attempts_made > 0) break;
      co_await fail(ex, errors::policy_refused(policy.name(), d.branch), rid);
      record(route_label, 503, model, info.stream, start);
      co_return;
    }
    CircuitBreaker::Pass pass = w->admit(now);
    if (pass == CircuitBreaker::Pass::kDenied) {
      // Its breaker turned (another request took the half-open trial): choose again, bounded.
      failed.push_back(w->id());
      if (++denied > static_cast<int>(set->workers.size()) + 1) break;
      skip_backoff = true;  // no attempt was made: nothing to back off from
      continue;
    }
    if (metrics::Counter* c = pool->selected(*w)) c->inc();
    metrics_.branch_counter(policy.name(), d.branch).inc();
    ++attempts_made;
    Dispatch dispatch(policy, ctx, d, pass);
    http::UpstreamCall call(ex.executor(), ts.pool, w->target(), w->id());
    call.set_deadline(deadline);
    cancel.call = &call;
    struct ClearCall {
      Cancel& c;
      ~ClearCall() { c.call = nullptr; }
    } clear_call{cancel};
    // Tags a log line with the attempt (the line is written at the end of the full expression).
    auto log_attempt = [&](log::Line&& line) -> log::Line& {
      return line.kv("rid", rid)
          .kv("worker_id", w->id())
          .kv("worker", w->url())
          .kv("attempt", attempts_made);
    };

    // Phase: send.
    // Body rewrites (fields added, the rest forwarded byte for byte): the rank the policy chose.
    std::string rewritten;
    std::string_view body = ex.body();
    if (d.dp_rank && pool->reads_body()) {
      const BodyField rank{"routed_dp_rank", std::to_string(*d.dp_rank)};
      rewritten = add_fields(body, {&rank, 1});
      if (!rewritten.empty()) body = rewritten;
    }
    http::CallError e = co_await call.start(ex.method(), ex.target(), fwd, body);
    dispatch.started_guess = call.request_sent();
    if (e == http::CallError::kAborted || ex.client_gone()) {
      call.abort();
      dispatch.finish(Outcome{.status = kClientClosedStatus, .started = call.request_sent()},
                      Verdict::kNeutral);
      client_left(model, info.stream);
      co_return;
    }
    if (e != http::CallError::kNone) {
      last_error = e;
      metrics_.upstream_errors.with({w->url(), http::to_string(e)}).inc();
      log_attempt(log::warn(kLogAttemptFailed, "upstream attempt failed"))
          .kv("error", http::to_string(e))
          .kv("detail", call.error_detail())
          .kv("request_sent", call.request_sent());
      dispatch.finish(Outcome{.status = 502, .started = call.request_sent()}, Verdict::kFailure);
      if (e == http::CallError::kTimeout) {
        co_await fail(ex, errors::upstream_timeout(static_cast<long>(timeout_.count())), rid, w);
        record(route_label, 504, model, info.stream, start);
        co_return;
      }
      if (call.request_sent()) {
        // The worker received the whole request: it may be running it. Not retried.
        retry_denied("unsafe");
        GatewayError ge = e == http::CallError::kProtocol ? errors::upstream_protocol(w->id())
                                                          : errors::upstream_no_answer(w->id());
        co_await fail(ex, ge, rid, w);
        record(route_label, ge.status, model, info.stream, start);
        co_return;
      }
      failed.push_back(w->id());
      if (auto why = may_retry(); !why.empty()) {
        retry_denied(why);
        break;
      }
      continue;
    }

    int status = call.status();
    // A 500 says the worker ran the request and failed: retried once, elsewhere. (A 504 is not
    // retried: the request may still be running behind whatever timed out.)
    bool ran = status == 500;
    bool retryable = retryable_status(status) && !(ran && ran_and_failed > 0);
    if (retryable) {
      // Phase: retry (a status). The worker's Retry-After is honoured; when no retry may follow,
      // this answer is the client's (below), not a gateway error.
      retry_after.reset();
      if (auto ra = call.header("retry-after"); !ra.empty()) {
        retry_after = parse_retry_after(ra, std::chrono::system_clock::now());
      }
      if (auto why = may_retry(); !why.empty()) {
        retry_denied(why);
      } else {
        metrics_.upstream_errors.with({w->url(), "status_" + std::to_string(status)}).inc();
        log_attempt(log::warn(kLogRetryableStatus, "upstream answered a retryable status"))
            .kv("status", status);
        SavedAnswer answer{.status = status,
                           .content_type = std::string(call.header("content-type")),
                           .retry_after = std::string(call.header("retry-after"))};
        // (GCC 12 miscompiles co_await inside an if condition: awaited into a variable first.)
        http::CallError read = co_await call.read_all(answer.body, kSavedAnswerLimit);
        if (read == http::CallError::kNone) saved = std::move(answer);
        // A 500/504 ran the request and failed: it counts against the worker only if another
        // worker then serves the same request (else the request, not the worker, is at fault).
        Verdict v = ran             ? (dispatch.trial() ? Verdict::kFailure : Verdict::kNeutral)
                    : status >= 500 ? Verdict::kFailure
                                    : Verdict::kNeutral;
        if (ran) {
          ++ran_and_failed;
          if (!dispatch.trial()) charge_if_served.push_back(w);
        }
        dispatch.finish(Outcome{.status = status, .started = !refused_status(status)}, v);
        failed.push_back(w->id());
        continue;
      }
    }

    // Phase: a stream's first event, read before the client sees anything. An abort there with a
    // worker-side status (503 queue full, a failed PD transfer...) is a failed attempt, retried
    // like that status when it may be; one naming a client error (4xx) or no status at all (SGLang
    // sends a request's ValueError this way: input too long...) is the request's own answer.
    std::string pre;             // body bytes read before committing
    bool worker_abort = false;   // relayed a worker-side abort: a failure for the breaker
    bool abort_ran = false;      // ... with status 500 (ran and failed, like an HTTP 500)
    int abort_status = 0;        // ... the status it stands for
    bool request_abort = false;  // the first event is the request's own error
    bool sse = call.header("content-type").starts_with("text/event-stream");
    RelayBuffer buf(ts);
    if (sse && status == 200 && !call.done()) {
      http::CallError re = http::CallError::kNone;
      while (pre.size() < kFirstEventLimit && !first_event_end(pre)) {
        size_t n = co_await call.read_some(buf.data(), kRelayBufferSize, re);
        if (n == 0 || re != http::CallError::kNone) break;
        pre.append(buf.data(), n);
      }
      if (re == http::CallError::kAborted || ex.client_gone()) {
        call.abort();
        dispatch.finish(Outcome{.status = kClientClosedStatus, .started = true}, Verdict::kNeutral);
        client_left(model, info.stream);
        co_return;
      }
      if (re != http::CallError::kNone && pre.empty()) {
        // Headers, then nothing: the worker had the request; not retried.
        metrics_.upstream_errors.with({w->url(), "stream_" + std::string(http::to_string(re))})
            .inc();
        log_attempt(log::warn(kLogNoFirstEvent, "upstream stream ended before its first event"))
            .kv("error", http::to_string(re))
            .kv("detail", call.error_detail());
        dispatch.finish(Outcome{.status = 502, .started = true}, Verdict::kFailure);
        GatewayError ge = re == http::CallError::kTimeout
                              ? errors::upstream_timeout(static_cast<long>(timeout_.count()))
                              : errors::upstream_no_answer(w->id());
        co_await fail(ex, ge, rid, w);
        record(route_label, ge.status, model, info.stream, start);
        co_return;
      }
      if (auto end = first_event_end(pre)) {
        if (auto abort = event_abort(std::string_view(pre).substr(0, *end))) {
          // An engine-side abort naming no status (SGLang's FINISH_ABORT from an abort or a
          // drain) is the worker's doing: treated as a 503. An error object naming none is the
          // request's (SGLang streams a request's ValueError that way).
          int as = abort->status == 0 && abort->finish_abort ? 503 : abort->status;
          bool request_error = as == 0 || (as >= 400 && as < 500 && as != 408 && as != 429);
          request_abort = request_error;
          abort_status = as;
          log_attempt(
              log::warn(kLogFirstEventAbort, "upstream aborted the stream in its first event"))
              .kv("message", abort->message)
              .kv("status", as)
              .kv("request_error", request_error);
          if (!request_error) {
            metrics_.stream_aborts.with({w->url()}).inc();
            worker_abort = true;
            bool ran_abort = as == 500;
            abort_ran = ran_abort;
            if (retryable_status(as) && !(ran_abort && ran_and_failed > 0)) {
              if (auto why = may_retry(); !why.empty()) {
                retry_denied(why);  // the abort goes to the client as the worker sent it
              } else {
                call.abort();
                Verdict v = ran_abort   ? (dispatch.trial() ? Verdict::kFailure : Verdict::kNeutral)
                            : as >= 500 ? Verdict::kFailure
                                        : Verdict::kNeutral;
                if (ran_abort) {
                  ++ran_and_failed;
                  if (!dispatch.trial()) charge_if_served.push_back(w);
                }
                dispatch.finish(Outcome{.status = as, .started = ran_abort}, v);
                last_error = http::CallError::kNone;
                saved.reset();
                failed.push_back(w->id());
                continue;
              }
            }
          }
        }
      }
    }

    // Phase: relay. Committed to this answer: from here on nothing is retried.
    for (Worker* charged : charge_if_served) {
      // Charged only when this worker serves the request (not when it, too, answers an error).
      if (charged != w && status < 400 && !worker_abort && !request_abort) {
        charged->record_failure(CircuitBreaker::Pass::kNormal, now);
      }
    }
    charge_if_served.clear();
    ConnectionTokens resp_tokens;
    call.for_each_header([&](std::string_view name, std::string_view value) {
      if (http::iequals(name, "connection")) resp_tokens.add(value);
    });
    http::HeaderBuffer<24> out;
    call.for_each_header([&](std::string_view name, std::string_view value) {
      switch (http::classify_header(name)) {
        case http::HeaderKind::kContentType:
        case http::HeaderKind::kOther:
        case http::HeaderKind::kHost:
        case http::HeaderKind::kExpect:
          if (resp_tokens.empty() || !resp_tokens.contains(name)) out.push_back({name, value});
          break;
        default:  // hop-by-hop, content-length (we frame the body), x-request-id (ours)
          break;
      }
    });
    out.push_back({"x-request-id", rid});
    std::string route_header, attempts_header;
    if (config_.debug_headers) {
      route_header = std::string(policy.name()) + "/" + std::string(d.branch);
      attempts_header = std::to_string(attempts_made);
      out.push_back({"x-kvgate-worker", w->url()});
      out.push_back({"x-kvgate-route", route_header});
      out.push_back({"x-kvgate-attempts", attempts_header});
    }

    int final_status = status;
    // As an HTTP answer of the same status would count: a 500 after one elsewhere is the
    // request's fault, not this worker's; a relayed 408/429 abort is backpressure (neutral).
    Verdict verdict = worker_abort                ? (abort_status < 500                ? Verdict::kNeutral
                                                     : abort_ran && ran_and_failed > 0 ? Verdict::kNeutral
                                                                                       : Verdict::kFailure)
                      : status < 500              ? Verdict::kSuccess
                      : ran && ran_and_failed > 0 ? Verdict::kNeutral
                                                  : Verdict::kFailure;
    UsageScanner usage;
    bool scan_usage = pool->wants_usage() && status < 400;
    if (call.done()) {
      bool sent = co_await ex.respond(status, out, "");
      if (!sent) final_status = kClientClosedStatus;
    } else {
      auto length = call.content_length();
      co_await ex.begin_body(status, out, length);
      bool ok = true;
      if (!pre.empty()) {
        if (scan_usage) usage.feed(pre);
        ok = co_await ex.write_body(pre);
      }
      for (; ok;) {
        http::CallError re = http::CallError::kNone;
        size_t n = co_await call.read_some(buf.data(), kRelayBufferSize, re);
        if (n > 0 && scan_usage) usage.feed(std::string_view(buf.data(), n));
        if (n > 0) {
          bool written = co_await ex.write_body(std::string_view(buf.data(), n));
          if (!written) {
            ok = false;
            break;
          }
        }
        if (re == http::CallError::kAborted || ex.client_gone()) {
          ok = false;
          break;
        }
        if (re != http::CallError::kNone) {
          // The response started: the client cannot be given another one. End it visibly.
          metrics_.upstream_errors
              .with({w->url(), "mid_response_" + std::string(http::to_string(re))})
              .inc();
          log_attempt(log::warn(kLogMidResponse, "upstream failed mid-response"))
              .kv("error", http::to_string(re))
              .kv("detail", call.error_detail());
          GatewayError ge = re == http::CallError::kTimeout
                                ? errors::upstream_timeout(static_cast<long>(timeout_.count()))
                                : errors::upstream_failed(w->id());
          if (!ex.response_started()) {
            // Nothing reached the client yet (a stream's head waits for its first bytes): a
            // plain error answer is still possible.
            co_await fail(ex, ge, rid, w);
          } else if (sse && !length) {
            std::string event = "data: " + error_body(ge) + "\n\ndata: [DONE]\n\n";
            co_await ex.write_body(event);
            co_await ex.end_body();
          } else {
            ex.close_after();
          }
          final_status = ge.status;
          verdict = Verdict::kFailure;
          break;
        }
        if (n == 0) {
          bool ended = co_await ex.end_body();
          if (!ended) ok = false;
          break;
        }
      }
      if (!ok) {
        call.abort();
        final_status = kClientClosedStatus;
      }
    }
    if (final_status == kClientClosedStatus) {
      metrics_.client_disconnects.with({}).inc();
      verdict = Verdict::kNeutral;
    }
    dispatch.finish(Outcome{.status = final_status,
                            .ok = final_status < 400,
                            .cached_tokens = usage.cached_tokens(),
                            .prompt_tokens = usage.prompt_tokens(),
                            .started = true},
                    verdict);
    record(route_label, final_status, model, info.stream, start);
    co_return;
  }

  // No attempt produced an answer to relay: the last refusal a worker sent, else a gateway error.
  if (ex.client_gone()) {
    client_left(model, info.stream);
    co_return;
  }
  if (saved) {
    http::HeaderBuffer<4> h;
    h.push_back({"content-type", saved->content_type.empty() ? std::string_view("application/json")
                                                             : saved->content_type});
    if (!saved->retry_after.empty()) h.push_back({"retry-after", saved->retry_after});
    h.push_back({"x-request-id", rid});
    co_await ex.respond(saved->status, h, saved->body);
    record(route_label, saved->status, model, info.stream, start);
    co_return;
  }
  GatewayError ge = last_error != http::CallError::kNone
                        ? errors::upstream_unreachable(attempts_made)
                        : errors::no_worker(set->workers.size());
  co_await fail(ex, ge, rid);
  record(route_label, ge.status, model, info.stream, start);
}

}  // namespace kvgate
