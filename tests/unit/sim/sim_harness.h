// tests/unit/sim/sim_harness: one kvgate-sim in process, configured from command-line flags, as
// main() wires it (engine, KV event publishers, PD bootstrap server) on a loopback port, with its
// event loop on a thread. Shared by the sim unit tests.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "http/server.h"
#include "sim/config.h"
#include "sim/engine.h"
#include "sim/faults.h"
#include "sim/kv_events.h"
#include "sim/pd.h"
#include "sim/server.h"

namespace kvgate::sim {

// A base port such that base .. base + n - 1 are all free on 127.0.0.1 a moment ago (KV event
// publishers take one port per DP rank, replay sockets as many again).
inline int free_port_range(int n) {
  for (int attempt = 0; attempt < 200; ++attempt) {
    // Below the ephemeral range (32768+), where outgoing connections pick their ports.
    const int base = 10000 + static_cast<int>((::getpid() * 7919 + attempt * 104729) % 20000);
    bool ok = true;
    for (int p = base; p < base + n && ok; ++p) {
      int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<uint16_t>(p));
      a.sin_addr.s_addr = htonl(INADDR_ANY);
      ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
      ::close(fd);
    }
    if (ok) return base;
  }
  throw std::runtime_error("no range of free ports");
}

class Sim {
 public:
  explicit Sim(std::vector<std::string> args) {
    args.insert(args.begin(), {"--port", "0"});
    std::string error, help;
    if (!parse_sim_args(args, cfg, error, help)) throw std::runtime_error(error);
    std::string note;
    tokenizer = make_tokenizer(cfg.tokenizer_path, note, error);
    chat_template = make_chat_template(cfg.tokenizer_path);
    metrics = std::make_unique<SimMetrics>(cfg.served_model_name, static_cast<int>(cfg.dp_size));
    EngineConfig ec = engine_config(cfg);
    std::vector<std::unique_ptr<RankEventSink>> sinks;
    if (!cfg.kv_events_config.empty()) {
      KvEventsSettings kv;
      parse_kv_events_config(cfg.kv_events_config, kv);
      if (auto e = open_rank_sinks(kv, cfg.dp_size, ec.event_format, sinks); !e.empty()) {
        throw std::runtime_error(e);
      }
    }
    if (cfg.disaggregation_mode == "prefill") {
      bootstrap = BootstrapServer::start(
          BootstrapSettings{.host = "127.0.0.1",
                            .port = static_cast<uint16_t>(cfg.disaggregation_bootstrap_port),
                            .dp_size = static_cast<int>(cfg.dp_size),
                            .page_size = cfg.page_size},
          error);
      if (!bootstrap) throw std::runtime_error(error);
      cfg.disaggregation_bootstrap_port = bootstrap->port();
    }
    engine = std::make_unique<Engine>(ec, *tokenizer, *metrics, std::move(sinks), bootstrap.get());
    faults = std::make_unique<FaultInjector>(
        fault_settings(cfg), 1,
        Clock::now() +
            std::chrono::milliseconds(static_cast<int64_t>(cfg.start_unhealthy_secs * 1000)));
    sim = std::make_unique<SimServer>(cfg, *engine, *metrics, *faults, *chat_template);
    http::ServerConfig sc = http_server_config(cfg);
    sc.host = "127.0.0.1";
    server = std::make_unique<http::Server>(std::vector<asio::io_context*>{&ctx}, sc,
                                            [this](http::Exchange& ex) { return sim->handle(ex); });
    port = server->port();
    cfg.port = port;  // as main() does: /get_server_info reports the bound port
    if (bootstrap) bootstrap->set_http_port(port);
    server->start();
    thread = std::thread([this] {
      auto guard = asio::make_work_guard(ctx);
      ctx.run();
    });
  }
  ~Sim() {
    asio::post(ctx, [this] { server->stop(); });
    ctx.stop();
    thread.join();
    engine->stop();
  }
  RankLoad load(int rank = 0) { return engine->loads()[static_cast<size_t>(rank)]; }

  SimConfig cfg;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<ChatTemplate> chat_template;
  std::unique_ptr<SimMetrics> metrics;
  std::unique_ptr<BootstrapServer> bootstrap;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<FaultInjector> faults;
  std::unique_ptr<SimServer> sim;
  asio::io_context ctx{1};
  std::unique_ptr<http::Server> server;
  int port = 0;
  std::thread thread;
};

}  // namespace kvgate::sim
