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
#include <map>
#include <thread>

#include "discovery/register_cli.h"
#include "gateway/admin.h"
#include "gateway/config.h"
#include "gateway/discovery.h"
#include "gateway/doctor.h"
#include "gateway/gateway.h"
#include "gateway/knobs.h"
#include "gateway/pools.h"
#include "gateway/stats.h"
#include "http/server.h"
#include "policy/registry.h"
#include "replica/registry.h"
#include "replica/sync.h"
#include "rules/cli.h"
#include "rules/config_file.h"
#include "rules/rule.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/cli.h"
#include "tokenizer/piece_cache.h"
#include "tokenizer/tokenizer.h"
#include "util/log.h"
#include "workers/health.h"

using namespace kvgate;

namespace {

constexpr std::string_view kUsage =
    "kvgate [--worker-urls URL ...] [--policy NAME] [--config FILE] [options]\n"
    "       kvgate check-config FILE | print-config [--config FILE] [options] | tokenize ...\n"
    "       kvgate doctor (--admin-url URL | --config FILE) [options]   (see doctor --help)\n"
    "       kvgate register --etcd URL --url URL [--model NAME] [options]   (see register --help)";
constexpr std::string_view kIntro =
    "kvgate: a KV-cache-aware gateway for LLM inference servers (SGLang, vLLM).\n"
    "Sends each request to a healthy worker chosen by the routing policy, with retries, circuit\n"
    "breakers, admission control and Prometheus metrics. Flag names follow sgl-model-gateway\n"
    "(each may also be written with a --router- prefix, e.g. --router-policy).";
constexpr std::string_view kOutro =
    "Example:\n"
    "  kvgate --worker-urls http://127.0.0.1:30001 http://127.0.0.1:30002 --policy round_robin\n"
    "  kvgate --config kvgate.yaml          (rules for many models: see examples/)\n"
    "Endpoints: POST /generate /v1/chat/completions /v1/completions /v1/embeddings /v1/rerank;\n"
    "GET /v1/models /health /liveness /readiness; metrics on --prometheus-port at /metrics;\n"
    "rules, workers and the configuration on the admin API (--admin-port: /v1/rules, /workers).";

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

// Copies the tokenizers' piece cache counters into metric families at each scrape.
void export_piece_cache_stats(metrics::Registry& registry,
                              const std::shared_ptr<const tokenizer::PieceCache>& cache) {
  auto& lookups = registry.counter("kvgate_tokenizer_cache_lookups_total",
                                   "Pieces of prompts (text between special tokens) looked up in "
                                   "the tokenizer's piece cache, by result: hit, miss",
                                   {"result"});
  auto& evictions = registry.counter("kvgate_tokenizer_cache_evictions_total",
                                     "Pieces dropped from the tokenizer's piece cache to stay "
                                     "within --tokenizer-cache-bytes");
  auto& too_large = registry.counter("kvgate_tokenizer_cache_too_large_total",
                                     "Pieces not cached because one would take more than a "
                                     "128th of --tokenizer-cache-bytes");
  auto& entries = registry.gauge("kvgate_tokenizer_cache_entries",
                                 "Pieces held by the tokenizer's piece cache");
  auto& bytes = registry.gauge("kvgate_tokenizer_cache_bytes",
                               "Bytes the tokenizer's piece cache holds (text, ids and per-entry "
                               "overhead), at most --tokenizer-cache-bytes");
  registry.add_collector([&, cache] {
    auto st = cache->stats();
    lookups.with({"hit"}).mirror(st.hits);
    lookups.with({"miss"}).mirror(st.misses);
    evictions.with({}).mirror(st.evictions);
    too_large.with({}).mirror(st.too_large);
    entries.with({}).set(static_cast<double>(st.entries));
    bytes.with({}).set(static_cast<double>(st.bytes));
  });
}

// Copies the listener's counters into metric families at each scrape.
void export_server_stats(metrics::Registry& registry, const http::Server& server) {
  auto& connections = registry.gauge("kvgate_connections", "Client connections open now");
  auto& idle_now = registry.gauge("kvgate_connections_idle",
                                  "Client connections open now and waiting for their next request "
                                  "(keep-alive)");
  auto& parked = registry.gauge("kvgate_connections_parked",
                                "Idle client connections parked: only their socket kept (plain "
                                "TCP, idle for over a second)");
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
    idle_now.with({}).set(static_cast<double>(st->idle.load()));
    parked.with({}).set(static_cast<double>(st->parked.load()));
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
  if (argc > 1 && std::string_view(argv[1]) == "doctor") {
    // The private gateway of `doctor --config` is this binary again.
    std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
    return kvgate::doctor::run_doctor_command(argc - 2, argv + 2, self.c_str());
  }
  if (argc > 1 && std::string_view(argv[1]) == "register") {
    return kvgate::discovery::register_main(argc - 2, argv + 2);
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
  // The whole configuration: flags, and the --config file (flags win), validated together.
  rules::ConfigFile loaded;
  std::string config_path;
  {
    std::vector<rules::FieldError> errors;
    if (!rules::load_command_line(args, loaded, config_path, errors)) {
      if (errors.size() == 1 && errors[0].field == "command line") return fail(errors[0].message);
      std::string text = rules::format_errors(errors, config_path);
      while (!text.empty() && text.back() == '\n') text.pop_back();
      return fail(text);
    }
  }
  cfg = loaded.config;
  auto given = [&](std::string_view knob) {
    return std::find(loaded.set_knobs.begin(), loaded.set_knobs.end(), knob) !=
           loaded.set_knobs.end();
  };
  bool api_key_given = given("api-key");
  if (std::string e = load_api_key(cfg, api_key_given); !e.empty()) return fail(e);
  bool admin_key_given = given("admin-api-key");
  if (std::string e = load_admin_api_key(cfg, admin_key_given); !e.empty()) return fail(e);
  if (cfg.admin_api_key.empty() && !is_loopback_address(cfg.admin_host)) {
    return fail("--admin-host " + cfg.admin_host +
                " is not a loopback address and no admin key is set: anyone who can reach it "
                "could change the rules. Give --admin-api-key-file, or keep --admin-host "
                "127.0.0.1");
  }
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
  std::vector<double> buckets, short_buckets;
  for (const auto& b : cfg.prometheus_duration_buckets) buckets.push_back(std::stod(b));
  if (buckets.empty()) buckets = metrics::latency_buckets();
  for (const auto& b : cfg.prometheus_short_duration_buckets) short_buckets.push_back(std::stod(b));
  if (short_buckets.empty()) short_buckets = metrics::short_latency_buckets();
  GatewayMetrics gm(registry, buckets, short_buckets,
                    cfg.metrics_compat == "smg" ? MetricsCompat::kSmg : MetricsCompat::kNone);

  // Event loops: one per request thread, each with its own RequestThread state; the control loop
  // runs the pools' planes (health, policy upkeep), the metrics listener and signals.
  auto control = std::make_unique<asio::io_context>(1);

  // Pools: one per rule (--worker-urls and --policy make the rule "default").
  std::atomic<uint64_t> next_worker_id{1};
  std::shared_ptr<const http::TlsClientContext> worker_tls;
  std::map<std::string, std::weak_ptr<const TokenizerFiles>> tokenizers;
  // One piece cache for every tokenizer the rules load (its entries are keyed on the tokenizer).
  std::shared_ptr<tokenizer::PieceCache> piece_cache;
  if (cfg.tokenizer_cache_bytes > 0) {
    piece_cache =
        std::make_shared<tokenizer::PieceCache>(static_cast<size_t>(cfg.tokenizer_cache_bytes));
    export_piece_cache_stats(registry, piece_cache);
  }
  // Replica sync (--replica-sync): before the pools, which use it, and destroyed after them.
  std::unique_ptr<replica::Sync> replica_sync;
  if (!cfg.replica_sync.empty()) {
    replica::SyncConfig sc = sync_config(cfg);
    if (sc.name.empty()) {
      char host[256] = {};
      gethostname(host, sizeof host - 1);
      sc.name = std::string(host) + ":" + std::to_string(cfg.port);
    }
    replica_sync = std::make_unique<replica::Sync>(std::move(sc), &registry);
    if (std::string e = replica_sync->start(); !e.empty()) return fail(e);
  }
  // Its etcd registration (--replica-registry): stopped (its lease revoked) before the Sync goes.
  std::unique_ptr<replica::Registry> replica_registry;
  if (replica_sync && !cfg.replica_registry.empty()) {
    replica::RegistryConfig rc = registry_config(cfg);  // (validate() checked the URL)
    // The address clients reach this replica at: --host unless it is a wildcard.
    std::string host = cfg.host;
    if (host.empty() || host == "0.0.0.0" || host == "::") {
      char name[256] = {};
      gethostname(name, sizeof name - 1);
      host = name;
    }
    if (host.find(':') != std::string::npos) host = "[" + host + "]";
    rc.url = std::string(cfg.tls_cert_path.empty() ? "http://" : "https://") + host + ":" +
             std::to_string(cfg.port);
    replica_registry = std::make_unique<replica::Registry>(std::move(rc), *replica_sync, &registry);
    if (std::string e = replica_registry->start(); !e.empty()) return fail(e);
  }
  PoolEnv env;
  env.config = &cfg;
  env.replica = replica_sync.get();
  env.breaker = breaker_config(cfg);
  env.health = health_config(cfg);
  env.metrics = &gm;
  env.registry = &registry;
  env.control = control.get();
  env.next_worker_id = &next_worker_id;
  env.worker_tls = [&](std::shared_ptr<const http::TlsClientContext>& out) -> std::string {
    if (!worker_tls) {
      std::string err;
      worker_tls = http::TlsClientContext::create(
          cfg.worker_ca_cert_path, cfg.worker_client_cert_path, cfg.worker_client_key_path, err);
      if (!worker_tls) return err;
    }
    out = worker_tls;
    return "";
  };
  env.tokenizer = [&](const std::string& dir,
                      std::string& err) -> std::shared_ptr<const TokenizerFiles> {
    // One load per directory while some pool holds it; the map keeps only live entries.
    std::erase_if(tokenizers, [](const auto& e) { return e.second.expired(); });
    if (auto it = tokenizers.find(dir); it != tokenizers.end()) {
      if (auto held = it->second.lock()) return held;
    }
    auto files = std::make_shared<TokenizerFiles>();
    files->tokenizer = tokenizer::Tokenizer::load(dir, err);
    if (!files->tokenizer) return nullptr;
    files->tokenizer->set_piece_cache(piece_cache);  // before any request thread sees it
    std::string template_err;
    files->chat_template = tokenizer::ChatTemplate::load(dir, template_err);
    if (!files->chat_template) {
      log::warn("no usable chat template; chat requests route on their messages' text")
          .kv("dir", dir)
          .kv("why", template_err);
    }
    log::info("tokenizer loaded")
        .kv("dir", dir)
        .kv("chat_template", files->chat_template != nullptr)
        .kv("piece_cache", files->tokenizer->uses_piece_cache());
    tokenizers[dir] = files;
    return files;
  };
  // What the rules need from the machine is checked first, so errors name the flag or field.
  auto where = [&](const rules::Rule& r, std::string_view field, std::string_view flag) {
    return config_path.empty() && r.name == "default"
               ? std::string(flag)
               : "rules[" + r.name + "]." + std::string(field);
  };
  std::vector<std::shared_ptr<const TokenizerFiles>> held_tokenizers;
  for (const auto& r : loaded.rules) {
    bool https = std::any_of(r.endpoints.begin(), r.endpoints.end(), [](const rules::Endpoint& e) {
      return e.url.starts_with("https://");
    });
    if (https) {
      std::shared_ptr<const http::TlsClientContext> tls;
      if (std::string e = env.worker_tls(tls); !e.empty()) return fail(e);
    }
    if (!r.tokenizer_path.empty() && r.mode == 4) {  // as Pool::build loads it
      std::string err;
      auto files = env.tokenizer(r.tokenizer_path, err);
      if (!files) {
        return fail(where(r, "tokenizerPath", "--tokenizer-path") + " " + r.tokenizer_path + ": " +
                    err + " (point it at a directory holding the model's tokenizer.json)");
      }
      held_tokenizers.push_back(std::move(files));
    }
  }
  PoolManager pools(env);
  // Discovery: a watcher per discovery URI the rules in force use, reconciled after each change.
  DiscoveryManager discovery(*control, pools, &registry, discovery_options(cfg));
  pools.on_applied(
      [&discovery](const std::vector<rules::Rule>& in_force) { discovery.reconcile(in_force); });
  if (auto errors = pools.apply(loaded.rules, /*dry_run=*/false, RuleSource::kStartup);
      !errors.empty()) {
    std::string text = rules::format_errors(errors, config_path);
    while (!text.empty() && text.back() == '\n') text.pop_back();
    return fail(text);
  }
  held_tokenizers.clear();  // the pools hold what they use

  // Reload (SIGHUP, POST /v1/config/reload): the file read again with the same command line;
  // rules apply live, a knob that cannot change live refuses the whole reload.
  GatewayConfig cli_config;
  std::vector<std::string> cli_set;
  {
    std::vector<std::string> without_config;
    for (size_t i = 0; i < args.size(); ++i) {
      if (args[i] == "--config") {
        ++i;
      } else if (!args[i].starts_with("--config=")) {
        without_config.push_back(args[i]);
      }
    }
    cli_set = flags::parse(knobs, without_config, cli_config).set;
  }
  GatewayConfig in_force = cfg;
  std::function<std::string()> reload;
  if (!config_path.empty()) {
    reload = [&]() -> std::string {
      rules::ConfigFile next;
      std::vector<rules::FieldError> errors;
      if (!rules::load_config_file(config_path, cli_config, cli_set, next, errors)) {
        return rules::format_errors(errors, config_path);
      }
      auto has = [&](std::string_view k) {
        return std::find(next.set_knobs.begin(), next.set_knobs.end(), k) != next.set_knobs.end();
      };
      if (std::string e = load_api_key(next.config, has("api-key")); !e.empty()) return e;
      if (std::string e = load_admin_api_key(next.config, has("admin-api-key")); !e.empty()) {
        return e;
      }
      std::string restart;
      for (const auto& c : rules::diff_knobs(in_force, next.config)) {
        if (!c.live) restart += (restart.empty() ? "" : ", ") + c.name;
      }
      if (!restart.empty()) {
        return config_path + ": " + restart +
               " changed, which a running kvgate cannot apply: restart it (nothing was applied)";
      }
      if (auto e = pools.apply(next.rules, /*dry_run=*/false, RuleSource::kReload); !e.empty()) {
        return rules::format_errors(e, config_path) + "(nothing was applied)";
      }
      if (next.config.log_level != in_force.log_level) {
        log::Level lv = log::Level::kInfo;
        log::parse_level(next.config.log_level, lv);
        log::set_level(lv);
      }
      in_force = next.config;
      log::info("configuration reloaded")
          .kv("file", config_path)
          .kv("rules", pools.table()->pools.size());
      return "";
    };
  }
  for (const auto& p : pools.table()->pools) {
    const auto snapshot = p->workers();  // (held: the loop reads it)
    for (const auto& w : snapshot->workers) {
      log::info("worker").kv("rule", p->name()).kv("worker_id", w->id()).kv("worker", w->url());
    }
  }
  Gateway gateway(cfg, pools, gm);
  gateway.set_replica(replica_sync.get());
  gateway.response_owners().attach_metrics(registry);
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

  http::ServerConfig sc = server_config(cfg, static_cast<size_t>(max_connections));
  std::unique_ptr<http::Server> server;
  std::unique_ptr<http::Server> metrics_server;
  std::unique_ptr<http::Server> admin_server;
  AdminApi::Hooks admin_hooks;
  admin_hooks.reload = reload;
  // What `kvgate print-config --format json` prints, with the rules in force now.
  admin_hooks.effective_config = [&] {
    return rules::print_config(rules::ConfigFile{.config = in_force, .rules = pools.rules()},
                               /*json=*/true);
  };
  // The doctor reaches this process's own listener (which exists by the time anyone asks).
  admin_hooks.doctor_env = [&]() {
    doctor::Env env{.config = &in_force, .pools = &pools, .key = &gateway.doctor_key()};
    if (std::string e = doctor::self_target(cfg, server->port(), env.self); !e.empty()) {
      log::warn("doctor: cannot reach the gateway's own listener").kv("why", e);
    }
    return env;
  };
  // The dashboard's figures, read on the control loop when asked.
  const auto started = std::chrono::system_clock::now();
  admin_hooks.stats = [&pools, &gm, &gateway, &in_force, started](size_t recent) {
    StatsInput in{.table = pools.table(),
                  .metrics = &gm,
                  .decisions = &gateway.decisions(),
                  .in_flight = gateway.in_flight(),
                  .queue_depth = static_cast<int64_t>(gateway.admission().queued()),
                  .health_interval = std::chrono::seconds(in_force.health_check_interval_secs),
                  .started = started,
                  .recent_decisions = recent};
    return stats_text(in);
  };
  // Rules created through the API take the knobs in force (a reload may have changed them).
  admin_hooks.route_only = [&gateway](std::string_view path, std::string body,
                                      const std::function<std::string_view(std::string_view)>& h,
                                      int64_t at_us) {
    auto r = gateway.route_only(path, std::move(body), h, at_us);
    return std::pair<int, std::string>(r.status, std::move(r.body));
  };
  AdminApi admin(in_force, pools, admin_hooks);
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
    http::ServerConfig ac;
    ac.host = cfg.admin_host;
    ac.port = static_cast<uint16_t>(cfg.admin_port);
    ac.reuse_port = false;    // admin calls must not be split between two kvgates
    ac.body_limit = 4 << 20;  // a rule with thousands of endpoints fits
    ac.max_connections = 64;
    ac.idle_timeout = std::chrono::seconds(30);
    ac.header_timeout = std::chrono::seconds(10);
    ac.body_timeout = std::chrono::seconds(10);
    ac.write_timeout = std::chrono::seconds(10);
    admin_server =
        std::make_unique<http::Server>(std::vector<asio::io_context*>{control.get()}, ac,
                                       [&admin](http::Exchange& ex) { return admin.handle(ex); });
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  export_server_stats(registry, *server);
  {
    auto& rules_gauge = registry.gauge("kvgate_rules", "Rules (pools) in force");
    auto& retiring = registry.gauge("kvgate_pools_retiring",
                                    "Pools replaced or deleted that requests still hold (they "
                                    "are destroyed when the last one completes)");
    auto& changes = registry.counter("kvgate_rule_changes_total",
                                     "Rule set changes (admin API, reload) by result: applied, "
                                     "refused (invalid; nothing changed)",
                                     {"result"});
    auto& history = registry.gauge("kvgate_rule_history_versions",
                                   "Rule versions kept for GET /v1/rules/{name}/history and "
                                   "rollback, over every rule name (at most 16 per name, 1024 "
                                   "names)");
    // Collectors run on the control loop (the metrics listener's), like every rule change.
    registry.add_collector([&] {
      rules_gauge.with({}).set(static_cast<double>(pools.table()->pools.size()));
      history.with({}).set(static_cast<double>(pools.history_versions()));
      retiring.with({}).set(static_cast<double>(pools.retiring()));
      changes.with({"applied"}).mirror(pools.applied());
      changes.with({"refused"}).mirror(pools.refused());
    });
  }
  {
    auto& dropped = registry.counter("kvgate_log_dropped_lines_total",
                                     "Log lines dropped because the log queue was full (the log "
                                     "never blocks a request thread)");
    registry.add_collector([&dropped] { dropped.with({}).mirror(log::dropped_lines()); });
  }

  server->start();
  metrics_server->start();
  admin_server->start();
  pools.start();

  // Shutdown. First signal: stop accepting, close idle connections, answer in-flight requests with
  // `connection: close`, and wait for them up to the grace period; then close what is left (their
  // upstream calls are cancelled) and give the requests a moment to unwind. A second signal skips
  // the wait.
  auto signals = std::make_unique<asio::signal_set>(*control, SIGINT, SIGTERM);
  auto stop_all = [&] {
    for (auto& c : contexts) c->stop();
    control->stop();
  };
  auto drain = std::make_shared<Timer>(*control);
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
    admin_server->stop();
    pools.stop();
    asio::co_spawn(
        *control,
        [&, drain]() -> awaitable<void> {
          // Waits on `timer` (the drain timer, which a second signal cancels; or one no signal
          // touches, for the unwinding after the forced close).
          auto wait_idle = [&](Clock::time_point until, Timer& timer) -> awaitable<bool> {
            // Requests in the gateway, and connections still reading one (its head or body).
            auto busy = [&] { return gateway.in_flight() > 0 || server->busy_connections() > 0; };
            while (busy() && Clock::now() < until) {
              timer.expires_after(std::chrono::milliseconds(20));
              auto [wec] = co_await timer.async_wait(asio::as_tuple(use_awaitable));
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
            Timer unwind(*control);
            co_await wait_idle(Clock::now() + std::chrono::seconds(5), unwind);
          }
          stop_all();
        },
        asio::detached);
  };
  signals->async_wait(on_signal);
  auto hangups = std::make_unique<asio::signal_set>(*control, SIGHUP);
  std::function<void(const boost::system::error_code&, int)> on_hangup =
      [&](const boost::system::error_code& ec, int) {
        if (ec) return;
        if (!reload) {
          log::warn("SIGHUP: kvgate runs without --config; nothing to reload");
        } else if (std::string e = reload(); !e.empty()) {
          log::warn("SIGHUP: the configuration was not reloaded").kv("why", e);
        }
        hangups->async_wait(on_hangup);
      };
  hangups->async_wait(on_hangup);
  // Only now: a supervisor that signals as soon as it reads this line gets a graceful shutdown.
  log::info("kvgate listening")
      .kv("address", cfg.host + ":" + std::to_string(server->port()))
      .kv("tls", !cfg.tls_cert_path.empty())
      .kv("max_connections", max_connections)
      .kv("metrics", cfg.prometheus_host + ":" + std::to_string(metrics_server->port()))
      .kv("admin", cfg.admin_host + ":" + std::to_string(admin_server->port()))
      .kv("rules", pools.table()->pools.size())
      .kv("workers", pools.table()->total_workers())
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
  // the thread states; then the pools (their timers belong to the control loop), then the control
  // loop (destroying the health loops suspended on it).
  server.reset();
  metrics_server.reset();
  admin_server.reset();
  for (auto& ts : thread_states) ts->close();
  contexts.clear();
  thread_states.clear();
  signals.reset();
  hangups.reset();
  drain.reset();
  discovery.stop();
  pools.shutdown();
  control.reset();
  // Silent on NATS before the key goes: a heartbeat after the revoke would bring this replica
  // back into its peers' loads until they time it out.
  if (replica_sync) replica_sync->stop();
  replica_registry.reset();
  log::info("kvgate stopped");
  return 0;
}
