// sim/server: kvgate-sim's HTTP surface. Routes each exchange: the generation routes (and
// /v1/responses) go to the GenerationHandler; /encode, /classify and /v1/score to the
// EncodeHandler (through the engine); embeddings and rerank to sim/pooling; /tokenize and
// /detokenize (and their /v1/ aliases) to sim/tokenizer_routes; health, server info, loads, models,
// metrics, cache flush, /abort_request and the test-control endpoint /sim/faults are answered here.
// Unknown paths get FastAPI's 404 {"detail":"Not Found"}.
#pragma once

#include "http/server.h"
#include "sim/config.h"
#include "sim/encode.h"
#include "sim/engine.h"
#include "sim/faults.h"
#include "sim/generation.h"
#include "sim/sim_metrics.h"

namespace kvgate::sim {

// The HTTP server settings of --host, --port and --timeout-keep-alive (an idle keep-alive
// connection is closed after that many seconds, as uvicorn closes SGLang's).
http::ServerConfig http_server_config(const SimConfig& cfg);

class SimServer {
 public:
  SimServer(const SimConfig& config, Engine& engine, SimMetrics& metrics, FaultInjector& faults,
            const ChatTemplate& chat_template);
  awaitable<void> handle(http::Exchange& ex);

 private:
  // The body of a GET info endpoint; false for an unknown path.
  bool info_body(std::string_view path, std::string& body);
  awaitable<void> pooling(http::Exchange& ex, std::string_view path);
  // /tokenize, /detokenize and their /v1/ aliases (sim/tokenizer_routes).
  awaitable<void> tokenizer_route(http::Exchange& ex, std::string_view path);
  awaitable<void> health(http::Exchange& ex);
  awaitable<void> metrics(http::Exchange& ex);
  awaitable<void> flush_cache(http::Exchange& ex);
  awaitable<void> sim_faults(http::Exchange& ex);
  awaitable<void> abort_request(http::Exchange& ex);
  // GET /v1/responses/{id}, POST /v1/responses/{id}/cancel (`rest`: the path after the prefix).
  awaitable<void> stored_response(http::Exchange& ex, std::string_view rest);

  const SimConfig& config_;
  Engine& engine_;
  SimMetrics& metrics_;
  FaultInjector& faults_;
  GenerationHandler generation_;
  EncodeHandler encode_;
};

}  // namespace kvgate::sim
