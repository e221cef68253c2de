// sim/server: see server.h.
#include "sim/server.h"

#include <chrono>
#include <ctime>
#include <nlohmann/json.hpp>
#include <optional>

#include "sim/info.h"
#include "sim/pooling.h"
#include "sim/tokenizer_routes.h"
#include "util/json.h"
#include "util/log.h"

namespace kvgate::sim {
namespace {

constexpr http::Header kJson[] = {{"content-type", "application/json"}};
constexpr http::Header kText[] = {{"content-type", "text/plain; charset=utf-8"}};
constexpr http::Header kMetrics[] = {{"content-type", "text/plain; version=0.0.4; charset=utf-8"}};

enum class Method { kGet, kPost };

bool method_ok(std::string_view m, Method want) {
  switch (want) {
    case Method::kGet:
      return m == "GET" || m == "HEAD";
    case Method::kPost:
      return m == "POST" || m == "PUT";
  }
  return false;
}

std::optional<Route> generation_route(std::string_view path) {
  if (path == "/v1/chat/completions") return Route::kChatCompletions;
  if (path == "/generate") return Route::kGenerate;
  if (path == "/v1/completions") return Route::kCompletions;
  return std::nullopt;
}

constexpr std::string_view kResponsesPrefix = "/v1/responses/";

awaitable<void> method_not_allowed(http::Exchange& ex) {
  co_await ex.respond(405, kJson, R"({"detail":"Method Not Allowed"})");
}

// Python's time.perf_counter(): seconds on a monotonic clock.
double monotonic_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

http::ServerConfig http_server_config(const SimConfig& cfg) {
  http::ServerConfig sc;
  sc.host = cfg.host;
  sc.port = static_cast<uint16_t>(cfg.port);
  sc.idle_timeout = std::chrono::seconds(cfg.timeout_keep_alive);
  return sc;
}

SimServer::SimServer(const SimConfig& config, Engine& engine, SimMetrics& metrics,
                     FaultInjector& faults, const ChatTemplate& chat_template)
    : config_(config),
      engine_(engine),
      metrics_(metrics),
      faults_(faults),
      generation_(config, engine, faults, chat_template),
      encode_(config, engine, chat_template) {}

awaitable<void> SimServer::handle(http::Exchange& ex) {
  const std::string_view path = ex.path();
  const std::string_view m = ex.method();
  if (auto route = generation_route(path)) {
    if (!method_ok(m, Method::kPost)) {
      co_await method_not_allowed(ex);
    } else {
      co_await generation_.handle(ex, *route);
    }
  } else if (path == "/v1/responses") {
    // @app.post: POST only (PUT too is a 405, unlike the other generation routes).
    if (m != "POST") {
      co_await method_not_allowed(ex);
    } else {
      co_await generation_.handle(ex, Route::kResponses);
    }
  } else if (path.starts_with(kResponsesPrefix) && path.size() > kResponsesPrefix.size()) {
    co_await stored_response(ex, path.substr(kResponsesPrefix.size()));
  } else if (path == "/encode" || path == "/classify") {
    if (!method_ok(m, Method::kPost)) {
      co_await method_not_allowed(ex);
    } else {
      co_await encode_.encode(ex, path == "/classify");
    }
  } else if (path == "/v1/score") {
    if (m != "POST") {
      co_await method_not_allowed(ex);
    } else {
      co_await encode_.score(ex);
    }
  } else if (path == "/v1/embeddings" || path == "/v1/rerank") {
    co_await pooling(ex, path);
  } else if (path == "/tokenize" || path == "/v1/tokenize" || path == "/detokenize" ||
             path == "/v1/detokenize") {
    co_await tokenizer_route(ex, path);
  } else if (path == "/health" || path == "/health_generate") {
    co_await health(ex);
  } else if (path == "/metrics" && config_.enable_metrics) {
    co_await metrics(ex);
  } else if (path == "/flush_cache") {
    co_await flush_cache(ex);
  } else if (path == "/sim/faults") {
    co_await sim_faults(ex);
  } else if (path == "/abort_request") {
    if (m != "POST") {
      co_await method_not_allowed(ex);
    } else {
      co_await abort_request(ex);
    }
  } else if (path == "/v1/loads" && method_ok(m, Method::kGet)) {
    const std::string_view target = ex.target();
    const size_t q = target.find('?');
    LoadsAnswer a = v1_loads(
        config_, engine_.loads(),
        q == std::string_view::npos ? std::string_view() : target.substr(q + 1), unix_now());
    if (a.prometheus) {
      co_await ex.respond(a.status, kMetrics, a.body);
    } else {
      co_await ex.respond(a.status, kJson, a.body);
    }
  } else if (std::string body; !info_body(path, body)) {
    co_await ex.respond(404, kJson, R"({"detail":"Not Found"})");
  } else if (!method_ok(m, Method::kGet)) {
    co_await method_not_allowed(ex);
  } else {
    co_await ex.respond(200, kJson, body);
  }
}

bool SimServer::info_body(std::string_view path, std::string& body) {
  if (path == "/get_server_info" || path == "/server_info") {
    auto loads = engine_.loads();
    body = server_info_json(config_, loads, faults_.healthy());
  } else if (path == "/get_model_info" || path == "/model_info") {
    body = model_info_json(config_);
  } else if (path == "/get_load") {
    body = get_load_json(engine_.loads(), monotonic_now());
  } else if (path == "/v1/loads") {
    body = v1_loads(config_, engine_.loads(), {}, unix_now()).body;  // another method: 405
  } else if (path == "/v1/models") {
    body = models_json(config_, static_cast<int64_t>(std::time(nullptr)));
  } else {
    return false;
  }
  return true;
}

awaitable<void> SimServer::pooling(http::Exchange& ex, std::string_view path) {
  if (!method_ok(ex.method(), Method::kPost)) {
    co_await method_not_allowed(ex);
    co_return;
  }
  std::string body;
  const Tokenizer& tok = engine_.tokenizer();
  int status = path == "/v1/embeddings" ? embeddings_response(ex.body(), tok, body)
                                        : rerank_response(ex.body(), tok, body);
  co_await ex.respond(status, kJson, body);
}

awaitable<void> SimServer::tokenizer_route(http::Exchange& ex, std::string_view path) {
  // SGLang registers these with @app.post alone: PUT is a 405 here, unlike the generation routes.
  if (ex.method() != "POST") {
    co_await method_not_allowed(ex);
    co_return;
  }
  std::string body;
  const Tokenizer& tok = engine_.tokenizer();
  int status = path.ends_with("/tokenize")
                   ? tokenize_response(ex.body(), tok, config_.context_length, body)
                   : detokenize_response(ex.body(), tok, body);
  co_await ex.respond(status, kJson, body);
}

awaitable<void> SimServer::health(http::Exchange& ex) {
  // SGLang answers an empty body: 200 when serving, 503 while starting.
  int status = faults_.healthy() ? 200 : 503;
  co_await ex.respond(status, {}, "");
}

awaitable<void> SimServer::metrics(http::Exchange& ex) {
  for (const RankLoad& l : engine_.loads()) {
    RankMetrics& m = metrics_.rank(l.dp_rank);
    m.running->set(static_cast<double>(l.running));
    m.queued->set(static_cast<double>(l.waiting));
    m.used_tokens->set(static_cast<double>(l.used_tokens));
    m.token_usage->set(l.token_usage());
    m.cache_hit_rate->set(l.cache_hit_rate);
  }
  co_await ex.respond(200, kMetrics, metrics_.expose());
}

awaitable<void> SimServer::flush_cache(http::Exchange& ex) {
  // SGLang's answer text, with 400 while requests run or wait.
  bool ok = engine_.flush_cache();
  int status = ok ? 200 : 400;
  co_await ex.respond(status, kText,
                      "Cache flushed.\nPlease check backend logs for more details. (When there "
                      "are running or waiting requests, the operation will not be performed.)\n");
}

awaitable<void> SimServer::abort_request(http::Exchange& ex) {
  // SGLang's AbortReq body: {"rid": "", "abort_all": false}; FastAPI answers 422 for a body that
  // is not one.
  std::string_view invalid;
  std::string rid;
  bool abort_all = false;
  nlohmann::json j = nlohmann::json::parse(ex.body(), nullptr, false);
  if (ex.body().empty()) {
    invalid =
        R"({"detail":[{"type":"missing","loc":["body"],"msg":"Field required","input":null}]})";
  } else if (!j.is_object()) {
    invalid =
        R"({"detail":[{"type":"json_invalid","loc":["body",0],"msg":"JSON decode error","input":{},"ctx":{"error":"Expecting value"}}]})";
  } else if (j.contains("rid") && !j["rid"].is_string()) {
    invalid =
        R"({"detail":[{"type":"string_type","loc":["body","rid"],"msg":"Input should be a valid string"}]})";
  } else if (j.contains("abort_all") && !j["abort_all"].is_boolean()) {
    invalid =
        R"({"detail":[{"type":"bool_type","loc":["body","abort_all"],"msg":"Input should be a valid boolean"}]})";
  } else {
    rid = j.value("rid", std::string());
    abort_all = j.value("abort_all", false);
  }
  if (!invalid.empty()) {
    co_await ex.respond(422, kJson, invalid);
    co_return;
  }
  size_t n = generation_.abort(rid, abort_all);
  log::info("abort_request").kv("rid", rid).kv("abort_all", abort_all).kv("aborted", n);
  co_await ex.respond(200, {}, "");
}

awaitable<void> SimServer::stored_response(http::Exchange& ex, std::string_view rest) {
  // SGLang registers GET /v1/responses/{response_id} and POST .../{response_id}/cancel, and no
  // DELETE: another method on a known path is FastAPI's 405, any other path its 404.
  const size_t slash = rest.find('/');
  const std::string_view id = rest.substr(0, slash);
  const std::string_view tail = slash == std::string_view::npos ? "" : rest.substr(slash);
  const std::string_view m = ex.method();
  if (tail.empty()) {
    if (!method_ok(m, Method::kGet)) {
      co_await method_not_allowed(ex);
      co_return;
    }
    ResponsesError r = generation_.retrieve(id);
    co_await ex.respond(r.status, kJson, r.body);
  } else if (tail == "/cancel") {
    if (m != "POST") {
      co_await method_not_allowed(ex);
      co_return;
    }
    ResponsesError r = generation_.cancel(id);
    co_await ex.respond(r.status, kJson, r.body);
  } else {
    co_await ex.respond(404, kJson, R"({"detail":"Not Found"})");
  }
}

awaitable<void> SimServer::sim_faults(http::Exchange& ex) {
  if (ex.method() == "POST" || ex.method() == "PUT") {
    if (std::string err = faults_.update(ex.body()); !err.empty()) {
      std::string body = R"({"error":{"message":)";
      json::append_string(body, err);
      body.append("}}");
      co_await ex.respond(400, kJson, body);
      co_return;
    }
    log::info("faults changed").kv("faults", faults_.to_json());
  }
  co_await ex.respond(200, kJson, faults_.to_json());
}

}  // namespace kvgate::sim
