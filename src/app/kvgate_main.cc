// app/kvgate_main: the kvgate binary. Parses the knob table, builds workers, the policy, the
// gateway and its planes, then runs one event loop per request thread plus a control loop (health
// checks, metrics listener, signals). SIGTERM/SIGINT drain requests in flight, then exit.
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/signal_set.hpp>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <thread>

#include "gateway/config.h"
#include "gateway/gateway.h"
#include "http/server.h"
#include "policy/registry.h"
#include "rules/cli.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/cli.h"
#include "tokenizer/tokenizer.h"
#include "util/log.h"
#include "workers/health.h"

using namespace kvgate;

namespace {

constexpr std::string_view kUsage = "kvgate [--worker-urls URL ...] [--policy NAME] [options]";
constexpr std::string_view kIntro =
    "kvgate: a KV-cache-aware gateway for LLM inference servers (SGLang, vLLM).\n"
    "Sends each request to a healthy worker chosen by the routing policy, with retries, circuit\n"
    "breakers, admission control and Prometheus metrics. Flag names follow sgl-model-gateway\n"
    "(each may also be written with a --router- prefix, e.g. --router-policy).";
constexpr std::string_view kOutro =
    "Example:\n"
    "  kvgate --worker-urls http://127.0.0.1:30001 http://127.0.0.1:30002 --policy round_robin\n"
    "Endpoints: POST /generate /v1/chat/completions /v1/completions /v1/embeddings /v1/rerank;\n"
    "GET /v1/models /health /liveness /readiness; metrics on --prometheus-port at /metrics.";

int fail(const std::string& msg) {
  std::fprintf(stderr, "kvgate: %s\n", msg.c_str());
  return 2;
}

}  // namespace

// jemalloc (linked in non-sanitizer builds) returns freed pages to the kernel after 10 s instead of
// its default ~1 s decay: under steady open-loop load the default purged and re-faulted pages in
// bursts (an madvise per purge, ~50 us each), which pushed p99 at half load from ~6 ms to ~500 ms
// on the proxy benchmark. A background thread does the purging: without it jemalloc purges only
// when the process allocates, so memory freed before a quiet spell (10,000 idle connections giving
// back their read buffers) would never be returned. Ignored when another allocator is linked.
extern "C" {
// NOLINTNEXTLINE(cppcoreguidelines-avoid-non-const-global-variables): jemalloc's configuration hook
const char* malloc_conf = "dirty_decay_ms:10000,muzzy_decay_ms:10000,background_thread:true";
}

namespace {

// Raises the open-file limit to its hard maximum (each client connection and each worker
// connection is a descriptor, and the soft default is often 1024) and returns the connection
// limit to use: --max-connections, or, when 0, what the limit allows with room for one worker
// connection per client connection plus the process's own descriptors (as HAProxy derives its
// maxconn).
int64_t raise_fd_limit(int64_t max_connections) {
  constexpr rlim_t kReserve = 1024;
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return max_connections > 0 ? max_connections : 4096;
  if (rl.rlim_cur < rl.rlim_max) {
    rlimit raised = rl;
    raised.rlim_cur = rl.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) rl = raised;
  }
  rlim_t limit = rl.rlim_cur == RLIM_INFINITY ? rlim_t{1} << 20 : rl.rlim_cur;
  if (max_connections == 0) {
    return static_cast<int64_t>(std::max<rlim_t>(64, (limit - std::min(limit, kReserve)) / 2));
  }
  auto needed = static_cast<rlim_t>(max_connections) * 2 + kReserve;
  if (limit < needed) {
    log::warn(
        "the open-file limit is below what --max-connections needs when every connection "
        "is busy; raise it (ulimit -n) or lower --max-connections")
        .kv("limit", static_cast<uint64_t>(limit))
        .kv("needed", static_cast<uint64_t>(needed));
  }
  return max_connections;
}

// Copies the listener's counters into metric families at each scrape.
void export_server_stats(metrics::Registry& registry, const http::Server& server) {
  auto& connections = registry.gauge("kvgate_connections", "Client connections open now");
  auto& accepted =
      registry.counter("kvgate_connections_accepted_total", "Client connections accepted");
  auto& refused =
      registry.counter("kvgate_connections_refused_total",
                       "Client connections closed at once because --max-connections were open");
  auto& idle = registry.counter("kvgate_connections_idle_closed_total",
                                "Keep-alive connections closed while idle (keep-alive timeout or "
                                "shutdown)");
  auto& write_timeouts =
      registry.counter("kvgate_client_write_timeouts_total",
                       "Clients disconnected because they took no response bytes within "
                       "--client-write-timeout-secs");
  auto& rejected = registry.counter("kvgate_http_rejected_total",
                                    "Requests refused before reaching the gateway, by reason "
                                    "(malformed, too large, too slow, TLS handshake)",
                                    {"reason"});
  const http::ServerStats* st = &server.stats();
  registry.add_collector([&, st] {
    connections.with({}).set(static_cast<double>(st->connections.load()));
    accepted.with({}).mirror(st->accepted.load());
    refused.with({}).mirror(st->refused.load());
    idle.with({}).mirror(st->idle_closed.load());
    write_timeouts.with({}).mirror(st->write_timeouts.load());
    for (size_t k = 0; k < http::ServerStats::kRejectKinds; ++k) {
      rejected.with({http::ServerStats::reject_name(k)}).mirror(st->rejected[k].load());
    }
  });
}

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);
  if (argc > 1 && std::string_view(argv[1]) == "tokenize") {
    return kvgate::tokenizer::run_tokenize_command(argc - 2, argv + 2);
  }
  if (argc > 1 && std::string_view(argv[1]) == "check-config") {
    return kvgate::rules::run_check_config_command(argc - 2, argv + 2);
  }
  if (argc > 1 && std::string_view(argv[1]) == "print-config") {
    return kvgate::rules::run_print_config_command(argc - 2, argv + 2);
  }
  std::vector<std::string> args(argv + 1, argv + argc);
  GatewayConfig cfg;
  auto knobs = gateway_knobs();
  auto parsed = flags::parse(knobs, args, cfg);
  if (!parsed.ok) return fail(parsed.error);
  if (parsed.help) {
    std::cout << flags::help(knobs, kUsage, kIntro, kOutro);
    return 0;
  }
  if (parsed.help_markdown) {
    std::cout << flags::markdown(knobs);
    return 0;
  }
  if (!parsed.positional.empty()) {
    return fail("unexpected argument '" + parsed.positional[0] + "' (see --help)");
  }
  if (std::string e = validate(cfg); !e.empty()) return fail(e);
  bool api_key_given =
      std::find(parsed.set.begin(), parsed.set.end(), "api-key") != parsed.set.end();
  if (std::string e = load_api_key(cfg, api_key_given); !e.empty()) return fail(e);
  log::Level level = log::Level::kInfo;
  log::parse_level(cfg.log_level, level);
  log::set_level(level);
  if (!cfg.log_dir.empty()) {
    std::string path = cfg.log_dir + "/kvgate.log";
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) return fail("--log-dir: cannot open " + path + ": " + std::strerror(errno));
    ::dup2(fd, STDERR_FILENO);
    ::close(fd);
  }
  int64_t max_connections = raise_fd_limit(cfg.max_connections);

  // Metrics.
  metrics::Registry registry;
  std::vector<double> buckets;
  for (const auto& b : cfg.prometheus_duration_buckets) buckets.push_back(std::stod(b));
  if (buckets.empty()) buckets = metrics::latency_buckets();
  GatewayMetrics gm(registry, buckets);

  // Workers.
  BreakerConfig breaker;
  breaker.enabled = !cfg.disable_circuit_breaker;
  breaker.failure_threshold = static_cast<uint32_t>(cfg.cb_failure_threshold);
  breaker.success_threshold = static_cast<uint32_t>(cfg.cb_success_threshold);
  breaker.open_timeout = std::chrono::seconds(cfg.cb_timeout_duration_secs);
  std::shared_ptr<const http::TlsClientContext> worker_tls;
  WorkerRegistry workers;
  auto set = std::make_shared<WorkerSet>();
  uint64_t next_id = 1;
  for (const auto& url : cfg.worker_urls) {
    http::Target t;
    http::parse_url(url, t);  // validated already
    if (std::string e = http::resolve(t); !e.empty()) return fail("--worker-urls: " + e);
    if (t.https) {
      if (!worker_tls) {
        std::string err;
        worker_tls = http::TlsClientContext::create(
            cfg.worker_ca_cert_path, cfg.worker_client_cert_path, cfg.worker_client_key_path, err);
        if (!worker_tls) return fail(err);
      }
      t.tls = worker_tls;
    }
    auto w = std::make_shared<Worker>(next_id++, std::move(t), breaker);
    WorkerMetrics wm;
    wm.inflight = &gm.worker_active.with({w->url()});
    wm.health = &gm.worker_health.with({w->url()});
    wm.cb_state = &gm.worker_cb_state.with({w->url()});
    wm.reported_load = &gm.worker_load.with({w->url()});
    wm.requests = &gm.worker_requests.with({w->url()});
    wm.failures = &gm.worker_failures.with({w->url()});
    wm.selected = &gm.selections.with({cfg.policy, w->url()});
    wm.load_poll_failures = &gm.worker_load_poll_failures.with({w->url()});
    w->attach_metrics(wm);
    log::info("worker").kv("worker_id", w->id()).kv("worker", w->url());
    set->workers.push_back(std::move(w));
  }
  workers.publish(set);

  // Policy.
  PolicyConfig pc;
  pc.name = cfg.policy;
  pc.seed = static_cast<uint64_t>(cfg.policy_seed);
  pc.cache_threshold = cfg.cache_threshold;
  pc.balance_abs_threshold = cfg.balance_abs_threshold;
  pc.balance_rel_threshold = cfg.balance_rel_threshold;
  pc.eviction_interval_secs = cfg.eviction_interval;
  pc.max_tree_size = cfg.max_tree_size;
  pc.max_prefix_trees = cfg.max_prefix_trees;
  pc.prefix_token_count = cfg.prefix_token_count;
  pc.prefix_hash_load_factor = cfg.prefix_hash_load_factor;
  pc.max_idle_secs = cfg.max_idle_secs;
  pc.manual_assignment_mode = cfg.manual_assignment_mode;
  pc.max_routing_keys = cfg.max_routing_keys;
  pc.chwbl_key_chars = cfg.chwbl_key_chars;
  pc.chwbl_load_factor = cfg.chwbl_load_factor;
  pc.bucket_refit_secs = cfg.bucket_refit_secs;
  pc.registry = &registry;
  std::string err;
  auto policy = make_policy(pc, err);
  if (!policy) return fail("--policy: " + err);
  policy->on_workers_changed(*set);
  bool poll_load = policy->uses_reported_load();

  // Tokenizer and chat template (--tokenizer-path, or --model-path as a local directory).
  std::string tok_dir = cfg.tokenizer_path;
  if (tok_dir.empty() && !cfg.model_path.empty() &&
      std::filesystem::exists(std::filesystem::path(cfg.model_path) / "tokenizer.json")) {
    tok_dir = cfg.model_path;
  }
  std::unique_ptr<tokenizer::Tokenizer> tok;
  std::unique_ptr<tokenizer::ChatTemplate> chat_template;
  if (!tok_dir.empty()) {
    tok = tokenizer::Tokenizer::load(tok_dir, err);
    if (!tok) {
      return fail("--tokenizer-path " + tok_dir + ": " + err +
                  " (point it at a directory holding the model's tokenizer.json)");
    }
    std::string template_err;
    chat_template = tokenizer::ChatTemplate::load(tok_dir, template_err);
    if (!chat_template) {
      log::warn("no usable chat template; chat requests route on their messages' text")
          .kv("dir", tok_dir)
          .kv("why", template_err);
    }
    log::info("tokenizer loaded").kv("dir", tok_dir).kv("chat_template", chat_template != nullptr);
  }
  Gateway gateway(cfg, workers, std::move(policy), gm);
  gateway.set_tokenizer(tok.get(), chat_template.get());
  {
    auto& budget_gauge =
        registry.gauge("kvgate_retry_budget_in_use",
                       "Retries in progress, and how many the budget allows now", {"kind"});
    const RetryBudget* budget = &gateway.retry_budget();
    registry.add_collector([&budget_gauge, budget] {
      budget_gauge.with({"in_progress"}).set(static_cast<double>(budget->retries_in_progress()));
      budget_gauge.with({"allowed"}).set(static_cast<double>(budget->allowed()));
    });
  }

  // Event loops: one per request thread, each with its own RequestThread state; the control loop
  // runs the health plane, the metrics listener and signals.
  unsigned n = cfg.threads > 0 ? static_cast<unsigned>(cfg.threads)
                               : std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::unique_ptr<RequestThread>> thread_states;
  std::vector<std::unique_ptr<asio::io_context>> contexts;
  std::vector<asio::io_context*> ctx_ptrs;
  for (unsigned i = 0; i < n; ++i) {
    thread_states.push_back(std::make_unique<RequestThread>(cfg));
    // One thread runs each loop and only it touches the loop's sockets and timers (other threads
    // only post to it), so the reactor needs no per-descriptor locking.
    contexts.push_back(std::make_unique<asio::io_context>(BOOST_ASIO_CONCURRENCY_HINT_UNSAFE_IO));
    ctx_ptrs.push_back(contexts.back().get());
  }
  auto control = std::make_unique<asio::io_context>(1);

  http::ServerConfig sc;
  sc.host = cfg.host;
  sc.port = static_cast<uint16_t>(cfg.port);
  sc.body_limit = static_cast<uint64_t>(cfg.max_payload_size);
  sc.idle_timeout = std::chrono::seconds(cfg.client_keepalive_timeout_secs);
  sc.header_timeout = std::chrono::seconds(cfg.client_header_timeout_secs);
  sc.body_timeout = std::chrono::seconds(cfg.client_body_timeout_secs);
  sc.write_timeout = std::chrono::seconds(cfg.client_write_timeout_secs);
  sc.max_connections = static_cast<size_t>(max_connections);
  sc.tls_cert_path = cfg.tls_cert_path;
  sc.tls_key_path = cfg.tls_key_path;
  std::unique_ptr<http::Server> server;
  std::unique_ptr<http::Server> metrics_server;
  try {
    server = std::make_unique<http::Server>(
        ctx_ptrs, sc, [&gateway](http::Exchange& ex) { return gateway.handle(ex); });
    http::ServerConfig mc;
    mc.host = cfg.prometheus_host;
    mc.port = static_cast<uint16_t>(cfg.prometheus_port);
    mc.body_limit = 4096;
    mc.max_connections = 256;
    // A scraper asks and goes: short timeouts, so idle sockets cannot hold the 256 places.
    mc.idle_timeout = std::chrono::seconds(5);
    mc.header_timeout = std::chrono::seconds(5);
    mc.body_timeout = std::chrono::seconds(5);
    mc.write_timeout = std::chrono::seconds(10);
    metrics_server = std::make_unique<http::Server>(
        std::vector<asio::io_context*>{control.get()}, mc,
        [&registry](http::Exchange& ex) -> awaitable<void> {
          // Only what a scraper needs: GET /metrics and /health (and HEAD). Nothing else is
          // answered on this listener, which often listens on every address.
          const http::Header text[] = {{"content-type", "text/plain; charset=utf-8"}};
          std::string_view p = ex.path();
          bool known = p == "/metrics" || p == "/health";
          if (!known) {
            co_await ex.respond(404, text, "not found; metrics are at GET /metrics\n");
          } else if (ex.method() != "GET" && ex.method() != "HEAD") {
            const http::Header allow[] = {text[0], {"allow", "GET, HEAD"}};
            co_await ex.respond(405, allow, "method not allowed; use GET\n");
          } else if (p == "/health") {
            co_await ex.respond(200, text, "ok\n");
          } else {
            const http::Header h[] = {{"content-type", "text/plain; version=0.0.4; charset=utf-8"}};
            co_await ex.respond(200, h, registry.expose());
          }
        });
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  export_server_stats(registry, *server);
  {
    auto& dropped = registry.counter("kvgate_log_dropped_lines_total",
                                     "Log lines dropped because the log queue was full (the log "
                                     "never blocks a request thread)");
    registry.add_collector([&dropped] { dropped.with({}).mirror(log::dropped_lines()); });
  }

  HealthConfig hc;
  hc.interval = std::chrono::seconds(cfg.health_check_interval_secs);
  hc.timeout = std::chrono::seconds(cfg.health_check_timeout_secs);
  hc.endpoint = cfg.health_check_endpoint;
  hc.failure_threshold = static_cast<uint32_t>(cfg.health_failure_threshold);
  hc.success_threshold = static_cast<uint32_t>(cfg.health_success_threshold);
  hc.poll_load = poll_load;
  hc.load_interval = std::chrono::milliseconds(cfg.load_check_interval_ms);
  auto health = std::make_unique<HealthPlane>(*control, workers, hc);

  server->start();
  metrics_server->start();
  health->start();
  // Policy upkeep (tree eviction, band refits, key expiry) on the control thread.
  if (auto period = gateway.policy().period(); period.count() > 0) {
    asio::co_spawn(
        *control,
        [&gateway, period, ctl = control.get()]() -> awaitable<void> {
          asio::steady_timer t(*ctl);
          for (;;) {
            t.expires_after(period);
            auto [ec] = co_await t.async_wait(asio::as_tuple(asio::use_awaitable));
            if (ec) co_return;
            gateway.policy().on_period();
          }
        },
        asio::detached);
  }

  // Shutdown. First signal: stop accepting, close idle connections, answer in-flight requests with
  // `connection: close`, and wait for them up to the grace period; then close what is left (their
  // upstream calls are cancelled) and give the requests a moment to unwind. A second signal skips
  // the wait.
  auto signals = std::make_unique<asio::signal_set>(*control, SIGINT, SIGTERM);
  auto stop_all = [&] {
    for (auto& c : contexts) c->stop();
    control->stop();
  };
  auto drain = std::make_shared<asio::steady_timer>(*control);
  std::function<void(const boost::system::error_code&, int)> on_signal;
  bool shutting_down = false;
  on_signal = [&](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    if (shutting_down) {
      log::warn("second signal: closing every connection now").kv("signal", sig);
      drain->cancel();
      return;
    }
    shutting_down = true;
    signals->async_wait(on_signal);
    log::info("shutting down").kv("signal", sig).kv("in_flight", gateway.in_flight());
    server->stop();
    metrics_server->stop();
    health->stop();
    asio::co_spawn(
        *control,
        [&, drain]() -> awaitable<void> {
          // Waits on `timer` (the drain timer, which a second signal cancels; or one no signal
          // touches, for the unwinding after the forced close).
          auto wait_idle = [&](Clock::time_point until,
                               asio::steady_timer& timer) -> awaitable<bool> {
            // Requests in the gateway, and connections still reading one (its head or body).
            auto busy = [&] { return gateway.in_flight() > 0 || server->busy_connections() > 0; };
            while (busy() && Clock::now() < until) {
              timer.expires_after(std::chrono::milliseconds(20));
              auto [wec] = co_await timer.async_wait(asio::as_tuple(asio::use_awaitable));
              if (wec) co_return false;  // a second signal
            }
            co_return !busy();
          };
          bool idle = co_await wait_idle(
              Clock::now() + std::chrono::seconds(cfg.shutdown_grace_period_secs), *drain);
          if (!idle) {
            log::warn("grace period over; closing requests in flight")
                .kv("in_flight", gateway.in_flight());
            server->close_all();
            asio::steady_timer unwind(*control);
            co_await wait_idle(Clock::now() + std::chrono::seconds(5), unwind);
          }
          stop_all();
        },
        asio::detached);
  };
  signals->async_wait(on_signal);
  // Only now: a supervisor that signals as soon as it reads this line gets a graceful shutdown.
  log::info("kvgate listening")
      .kv("address", cfg.host + ":" + std::to_string(server->port()))
      .kv("tls", !cfg.tls_cert_path.empty())
      .kv("max_connections", max_connections)
      .kv("metrics", cfg.prometheus_host + ":" + std::to_string(metrics_server->port()))
      .kv("policy", cfg.policy)
      .kv("workers", cfg.worker_urls.size())
      .kv("threads", n);

  std::vector<std::thread> threads;
  threads.reserve(contexts.size());
  for (size_t i = 0; i < contexts.size(); ++i) {
    threads.emplace_back([ctx = contexts[i].get(), ts = thread_states[i].get()] {
      ts->bind();
      auto guard = asio::make_work_guard(*ctx);
      ctx->run();
    });
  }
  {
    auto guard = asio::make_work_guard(*control);
    control->run();
  }
  for (auto& t : threads) t.join();

  // Teardown, in dependency order: listeners (their acceptors belong to the loops), then each
  // loop's pooled connections, then the loops themselves (destroying what is still suspended on
  // them, which may touch the thread states, the gateway and the workers: all still alive), then
  // the thread states; the control loop before the health plane its coroutines belong to.
  server.reset();
  metrics_server.reset();
  for (auto& ts : thread_states) ts->close();
  contexts.clear();
  thread_states.clear();
  signals.reset();
  drain.reset();
  control.reset();
  health.reset();
  log::info("kvgate stopped");
  return 0;
}
