// sim/main: the kvgate-sim binary. Parses the knob table, builds the tokenizer, chat template,
// engine, fault injector and HTTP server, runs one event loop per --threads, and exits 0 on
// SIGTERM/SIGINT.
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/signal_set.hpp>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <thread>

#include "http/server.h"
#include "sim/chat_template.h"
#include "sim/config.h"
#include "sim/engine.h"
#include "sim/faults.h"
#include "sim/kv_events.h"
#include "sim/pd.h"
#include "sim/server.h"
#include "sim/sim_metrics.h"
#include "sim/tokenizer.h"
#include "util/log.h"

using namespace kvgate;
using namespace kvgate::sim;

namespace {

int fail(const std::string& msg) {
  std::fprintf(stderr, "kvgate-sim: %s\n", msg.c_str());
  return 2;
}

// Binds one listener per loop and port, on cfg.port (the first one's port when cfg.port is 0)
// and the cfg.port_count - 1 ports after it.
std::string listen(const SimConfig& cfg, std::vector<std::unique_ptr<asio::io_context>>& contexts,
                   SimServer& sim, std::vector<std::unique_ptr<http::Server>>& servers) {
  http::ServerConfig sc = http_server_config(cfg);
  try {
    for (int64_t i = 0; i < cfg.port_count; ++i) {
      sc.port = static_cast<uint16_t>(cfg.port + i);
      for (auto& ctx : contexts) {
        servers.push_back(
            std::make_unique<http::Server>(std::vector<asio::io_context*>{ctx.get()}, sc,
                                           [&sim](http::Exchange& ex) { return sim.handle(ex); }));
        sc.port = servers.back()->port();
      }
    }
  } catch (const std::exception& e) {
    return e.what() + std::string(" (port ") + std::to_string(sc.port) + ")";
  }
  return "";
}

// Runs every loop (the first on this thread) until they are stopped.
void run_loops(std::vector<std::unique_ptr<asio::io_context>>& contexts) {
  std::vector<std::thread> threads;
  for (size_t i = 1; i < contexts.size(); ++i) {
    threads.emplace_back([ctx = contexts[i].get()] {
      auto guard = asio::make_work_guard(*ctx);
      ctx->run();
    });
  }
  {
    auto guard = asio::make_work_guard(*contexts[0]);
    contexts[0]->run();
  }
  for (auto& t : threads) t.join();
}

void set_log_level(const std::string& name) {
  log::Level level = log::Level::kInfo;
  log::parse_level(name == "warning" ? "warn" : name, level);
  log::set_level(level);
}

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);
  std::vector<std::string> args(argv + 1, argv + argc);
  SimConfig cfg;
  std::string error, help;
  if (!parse_sim_args(args, cfg, error, help)) return fail(error);
  if (!help.empty()) {
    std::cout << help;
    return 0;
  }
  set_log_level(cfg.log_level);

  std::string note;
  auto tokenizer = make_tokenizer(cfg.tokenizer_path, note, error);
  if (!tokenizer) return fail("--tokenizer-path: " + error);
  if (note.empty()) {
    log::info("tokenizer: the stand-in (one token per word; --tokenizer-path loads a model's)");
  } else {
    log::info("tokenizer loaded").kv("path", cfg.tokenizer_path).kv("tokenizer", note);
  }
  auto chat_template = make_chat_template(cfg.tokenizer_path);

  // KV event publishers (one per DP rank) and, on a PD prefill server, the bootstrap rendezvous.
  // Opened before the HTTP port so a port conflict is a startup error naming the endpoint.
  std::vector<std::unique_ptr<RankEventSink>> sinks;
  if (!cfg.kv_events_config.empty()) {
    KvEventsSettings kv;
    parse_kv_events_config(cfg.kv_events_config, kv);  // validated with the flags
    EngineConfig ec = engine_config(cfg);
    if (auto e = open_rank_sinks(kv, cfg.dp_size, ec.event_format, sinks); !e.empty()) {
      return fail("--kv-events-config: " + e);
    }
  }
  std::unique_ptr<BootstrapServer> bootstrap;
  if (cfg.disaggregation_mode == "prefill") {
    bootstrap = BootstrapServer::start(
        BootstrapSettings{.host = cfg.host,
                          .port = static_cast<uint16_t>(cfg.disaggregation_bootstrap_port),
                          .dp_size = static_cast<int>(cfg.dp_size),
                          .page_size = cfg.page_size},
        error);
    if (!bootstrap) return fail(error);
    cfg.disaggregation_bootstrap_port = bootstrap->port();  // reported when 0 was given
  }

  // The engine outlives the event loops (declared first, destroyed last): coroutines destroyed
  // with the loops still release their scheduler slots.
  SimMetrics metrics(cfg.served_model_name, static_cast<int>(cfg.dp_size));
  Engine engine(engine_config(cfg), *tokenizer, metrics, std::move(sinks), bootstrap.get());
  auto unhealthy_until =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(cfg.start_unhealthy_secs));
  FaultInjector faults(fault_settings(cfg), static_cast<uint64_t>(cfg.seed) ^ 0x66617531747321ull,
                       unhealthy_until);
  SimServer sim(cfg, engine, metrics, faults, *chat_template);

  // One event loop per thread, each with its own listener on the shared port (SO_REUSEPORT): a
  // listener's state then dies with its own loop at exit, never after another loop's.
  std::vector<std::unique_ptr<asio::io_context>> contexts;
  for (int64_t i = 0; i < cfg.threads; ++i) {
    contexts.push_back(std::make_unique<asio::io_context>(1));
  }
  std::vector<std::unique_ptr<http::Server>> servers;
  if (std::string e = listen(cfg, contexts, sim, servers); !e.empty()) return fail(e);
  cfg.port = servers[0]->port();  // /get_server_info reports the bound port
  if (bootstrap) bootstrap->set_http_port(cfg.port);
  for (auto& s : servers) s->start();
  log::info("kvgate-sim listening")
      .kv("address", cfg.host + ":" + std::to_string(cfg.port))
      .kv("ports", cfg.port_count)
      .kv("model", cfg.served_model_name)
      .kv("dp_size", cfg.dp_size)
      .kv("mode", cfg.instant ? "instant" : cfg.scheduler)
      .kv("time_scale", cfg.time_scale)
      .kv("page_size", cfg.page_size)
      .kv("disaggregation_mode", cfg.disaggregation_mode)
      .kv("kv_events", cfg.kv_events_config.empty() ? "off" : cfg.kv_events_config)
      .kv("threads", cfg.threads);

  asio::signal_set signals(*contexts[0], SIGINT, SIGTERM);
  signals.async_wait([&](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    log::info("shutting down").kv("signal", sig);
    for (auto& s : servers) s->stop();
    for (auto& c : contexts) c->stop();
  });
  run_loops(contexts);
  // Sequences notify their request's executor: stop the schedulers while the loops still exist.
  engine.stop();
  servers.clear();
  log::info("kvgate-sim stopped");
  return 0;
}
