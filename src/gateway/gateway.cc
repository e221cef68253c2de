// gateway/gateway: see gateway.h.
#include "gateway/gateway.h"

#include <simdjson.h>

#include <set>

#include "gateway/admin.h"
#include "gateway/errors.h"
#include "gateway/knobs.h"
#include "replica/sync.h"
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
  std::string_view path;        // the metric label too
  std::optional<ApiRoute> api;  // proxied inference route; nullopt = gateway's own
  std::string_view methods;     // those allowed, as a 405 names them
};

constexpr std::string_view kPost = "POST";
constexpr std::string_view kPostPut = "POST or PUT";
constexpr std::string_view kGet = "GET";

constexpr RouteEntry kRoutes[] = {
    {"/generate", ApiRoute::kGenerate, kPost},
    {"/v1/chat/completions", ApiRoute::kChatCompletions, kPost},
    {"/v1/completions", ApiRoute::kCompletions, kPost},
    {"/v1/responses", ApiRoute::kResponses, kPost},
    {"/v1/embeddings", ApiRoute::kEmbeddings, kPost},
    {"/v1/rerank", ApiRoute::kRerank, kPost},
    {"/v1/score", ApiRoute::kScore, kPost},
    {"/v1/classify", ApiRoute::kClassifyOpenAI, kPost},
    {"/encode", ApiRoute::kEncode, kPostPut},
    {"/classify", ApiRoute::kClassify, kPostPut},
    {"/tokenize", ApiRoute::kTokenize, kPost},
    {"/detokenize", ApiRoute::kDetokenize, kPost},
    {"/v1/tokenize", std::nullopt, kPost},
    {"/v1/detokenize", std::nullopt, kPost},
    {"/v1/models", std::nullopt, kGet},
    {"/health", std::nullopt, kGet},
    {"/liveness", std::nullopt, kGet},
    {"/readiness", std::nullopt, kGet},
    {"/get_server_info", std::nullopt, kGet},
    {"/server_info", std::nullopt, kGet},
    {"/get_model_info", std::nullopt, kGet},
    {"/model_info", std::nullopt, kGet},
};
constexpr RouteEntry kResponseRoute{"/v1/responses/{id}", ApiRoute::kResponse, "GET or DELETE"};
constexpr RouteEntry kResponseCancelRoute{"/v1/responses/{id}/cancel", ApiRoute::kResponse, kPost};

// The id in /v1/responses/{id} or /v1/responses/{id}/cancel.
std::string_view response_id_of(std::string_view path) {
  std::string_view id = path.substr(std::string_view("/v1/responses/").size());
  if (id.ends_with("/cancel")) id.remove_suffix(std::string_view("/cancel").size());
  return id;
}

const RouteEntry* find_route(std::string_view path) {
  for (const auto& r : kRoutes) {
    if (r.path == path) return &r;
  }
  if (path.starts_with("/v1/responses/")) {
    return path.ends_with("/cancel") ? &kResponseCancelRoute : &kResponseRoute;
  }
  return nullptr;
}

bool allows(std::string_view methods, std::string_view method) {
  if (method == "HEAD" && methods.find("GET") != std::string_view::npos) return true;
  for (std::string_view m : {"GET", "POST", "PUT", "DELETE"}) {
    if (method == m) return methods.find(m) != std::string_view::npos;
  }
  return false;
}

// SGLang's control routes: the admin listener's (some it answers, the rest are not proxied).
bool admin_only(std::string_view path) {
  static constexpr std::string_view kAdmin[] = {"/flush_cache",
                                                "/update_weights",
                                                "/get_load",
                                                "/get_loads",
                                                "/v1/loads",
                                                "/abort_request",
                                                "/start_profile",
                                                "/stop_profile",
                                                "/workers",
                                                "/v1/rules",
                                                "/v1/config",
                                                "/release_memory_occupation",
                                                "/resume_memory_occupation",
                                                "/set_internal_state",
                                                "/get_internal_state",
                                                "/pause_generation",
                                                "/continue_generation",
                                                "/start_expert_distribution_record",
                                                "/stop_expert_distribution_record",
                                                "/dump_expert_distribution_record",
                                                "/configure_logging",
                                                "/load_lora_adapter",
                                                "/unload_lora_adapter",
                                                "/init_weights_update_group",
                                                "/update_weights_from_disk",
                                                "/update_weights_from_distributed",
                                                "/update_weights_from_tensor",
                                                "/get_weights_by_name",
                                                "/slow_down"};
  for (std::string_view a : kAdmin) {
    if (path == a || (path.starts_with(a) && path.size() > a.size() && path[a.size()] == '/')) {
      return true;
    }
  }
  return path.starts_with("/update_weights");
}

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
      api_key_(config.api_key),
      owners_(static_cast<size_t>(config.max_response_owners),
              std::chrono::seconds(config.response_owner_ttl_secs)) {}

Gateway::~Gateway() = default;

void Gateway::record(const http::Exchange& ex, std::string_view route, int status,
                     std::string_view model, bool streaming, Clock::time_point start) {
  metrics_.request_counter(route, status, model, streaming).inc();
  if (metrics::Counter* c = metrics_.smg_http_request(ex.method(), route)) [[unlikely]] {
    c->inc();
  }
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

  std::string_view path = ex.path();
  std::string_view method = ex.method();
  const RouteEntry* route = find_route(path);
  if (!route) {
    GatewayError e =
        admin_only(path) ? errors::admin_route(method, path) : errors::not_found(method, path);
    co_await fail(ex, e, rid);
    record(ex, "unknown", 404, "", false, start);
    co_return;
  }
  if (route->api == ApiRoute::kResponse && !ResponseOwners::valid_id(response_id_of(path))) {
    GatewayError bad{404, "invalid_request_error", "not_found",
                     std::string(method) + " " + std::string(path.substr(0, 256)) +
                         ": not a response id (they read resp_ and letters, digits, _ or -)"};
    co_await fail(ex, bad, rid);
    record(ex, route->path, 404, "", false, start);
    co_return;
  }
  bool probe = is_probe_path(path);
  if (!allows(route->methods, method)) {
    co_await fail(ex, errors::method_not_allowed(method, path, route->methods), rid);
    record(ex, route->path, 405, "", false, start);
    co_return;
  }
  if (!probe && !api_key_.matches(ex.header("authorization"))) {
    co_await fail(ex, errors::unauthorized(), rid);
    record(ex, route->path, 401, "", false, start);
    co_return;
  }
  if (path == "/v1/tokenize" || path == "/v1/detokenize") {
    co_await tokenize(ex, rid, path == "/v1/detokenize", start);
    co_return;
  }
  if (route->api) {
    co_await proxy(ex, *route->api, route->path, rid);
    co_return;
  }

  if (path == "/v1/models") {
    co_await list_models(ex, rid);
    record(ex, route->path, 200, "", false, start);
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
      record(ex, route->path, 404, "", false, start);
      co_return;
    }
    if (path == "/get_model_info" || path == "/model_info") {
      co_await model_info(ex, rid, start);
      co_return;
    }
    co_await answer_worker_info(ex, pools_.table(), "",
                                std::chrono::seconds(config_.health_check_timeout_secs));
    record(ex, route->path, 200, "", false, start);
    co_return;
  }
  co_await answer(ex, 200, R"({"status":"ok"})", rid);
  record(ex, route->path, 200, "", false, start);
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
  // kv_exact's ranks per rule: how many are trusted, which are not yet and why (cold: began
  // mid-stream; pending: no event yet).
  std::string kv;
  for (const auto& p : table->pools) {
    std::string d = p->policy().readiness_details();
    if (d.empty()) continue;
    kv += (kv.empty() ? "" : ",") + json::quote(p->name()) + ":" + d;
  }
  if (!kv.empty()) body += R"(,"kv_exact":{)" + kv + "}";
  // Replicas: a replica cut off from NATS still serves (ready) on its own state, and says so.
  if (replica_) {
    body += R"(,"replica_sync":)" + replica_->status_json();
    if (!replica_->connected()) body += R"(,"degraded":["replica_sync_disconnected"])";
  }
  body += "}";
  int status = ready ? 200 : 503;
  co_await answer(ex, status, body, rid);
  record(ex, "/readiness", status, "", false, start);
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
    const auto snapshot = p->workers();  // (held: the loop reads it)
    for (const auto& w : snapshot->workers) {
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

namespace kvgate {
namespace {

// The context length an engine of `pool` advertises for its model on /v1/models (-1 unknown:
// sgl-model-gateway's answer without one).
int64_t max_model_len(const Pool& pool) {
  simdjson::dom::parser parser;
  const auto snapshot = pool.workers();  // (held: the loop reads it)
  for (const auto& w : snapshot->workers) {
    if (!w->healthy()) continue;
    for (const auto& m : w->models()) {
      int64_t len = 0;
      simdjson::dom::element e;
      if (!parser.parse(m).get(e) && !e["max_model_len"].get_int64().get(len)) return len;
    }
  }
  return -1;
}

void append_ids(std::string& out, const std::vector<int32_t>& ids) {
  out.push_back('[');
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out.push_back(',');
    out.append(std::to_string(ids[i]));
  }
  out.push_back(']');
}

// Reads a list of token ids, each in [0, vocab); "" or what is wrong.
std::string read_ids(simdjson::dom::array a, int32_t vocab, std::vector<int32_t>& out) {
  for (simdjson::dom::element v : a) {
    int64_t id = 0;
    if (v.get_int64().get(id)) return "\"tokens\" must hold integers";
    if (id < 0 || id >= vocab) {
      return "token id " + std::to_string(id) + " is outside the vocabulary (0.." +
             std::to_string(vocab - 1) + ")";
    }
    out.push_back(static_cast<int32_t>(id));
  }
  return "";
}

}  // namespace

// sgl-model-gateway's /v1/tokenize {model, prompt: str | [str], add_special_tokens = true} ->
// {tokens, count, max_model_len}, and /v1/detokenize {model, tokens: [id] | [[id]],
// skip_special_tokens = true} -> {text}. kvgate also takes `messages` (a chat) on /v1/tokenize:
// rendered with the rule's chat template and tokenized as the engine's chat route does (no special
// tokens added: the template writes them), which are the ids kv_exact routes on.
awaitable<void> Gateway::tokenize(http::Exchange& ex, std::string_view rid, bool detokenize,
                                  Clock::time_point start) {
  const std::string_view label = detokenize ? "/v1/detokenize" : "/v1/tokenize";
  std::string_view model;
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  simdjson::dom::object obj;
  const std::string& body = ex.body();
  if (parser.parse(body).get(doc) || doc.get_object().get(obj)) {
    co_await fail(ex, errors::bad_json("request body must be a JSON object"), rid);
    record(ex, label, 400, "", false, start);
    co_return;
  }
  if (obj["model"].get_string().get(model)) model = "";
  auto table = pools_.table();
  std::shared_ptr<Pool> pool = table->resolve(ex.local_port(), ex.path(), model);
  if (!pool) {
    GatewayError e = model.empty() ? errors::no_rule(ex.path()) : errors::model_not_found(model);
    co_await fail(ex, e, rid);
    record(ex, label, e.status, "", false, start);
    co_return;
  }
  const tokenizer::Tokenizer* tok = pool->parse_options().tokenizer;
  if (!tok) {
    // No tokenizer in the rule (tokenizerPath, kvExactMode): its engines answer, as SGLang does.
    const ApiRoute route = detokenize ? ApiRoute::kDetokenize : ApiRoute::kTokenize;
    co_await proxy(ex, route, label, rid);
    co_return;
  }
  // Tokenizing and rendering cost CPU in proportion to the body: admitted like a proxied request.
  struct Slot {
    Admission* held = nullptr;
    Slot() = default;
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;
    ~Slot() {
      if (held) held->release();
    }
  } slot;
  if (admission_.enabled()) {
    metrics_.queue_depth_now.add(1);
    const auto queued = Clock::now();
    auto admitted = co_await admission_.acquire(ex.executor());
    metrics_.queue_depth_now.add(-1);
    if (admitted == Admission::Result::kAdmitted) {
      pool->queue_time().observe(std::chrono::duration<double>(Clock::now() - queued).count());
    }
    if (admitted != Admission::Result::kAdmitted) {
      const bool full = admitted == Admission::Result::kQueueFull;
      metrics_.admission_rejected.with({full ? "queue_full" : "timeout"}).inc();
      GatewayError e = full ? errors::queue_full(admission_.queue_size())
                            : errors::queue_timeout(static_cast<long>(config_.queue_timeout_secs));
      int status = e.status;
      co_await fail(ex, e, rid);
      record(ex, label, status, "", false, start);
      co_return;
    }
    slot.held = &admission_;
  }
  auto bad = [&](std::string why) {
    return GatewayError{400, "invalid_request_error", "invalid_request", std::move(why)};
  };
  std::optional<GatewayError> error;
  std::string out;
  if (detokenize) {
    bool skip = true;
    if (obj["skip_special_tokens"].get_bool().get(skip)) skip = true;
    simdjson::dom::array tokens;
    if (obj["tokens"].get_array().get(tokens)) {
      error = bad("\"tokens\" must be a list of token ids, or a list of such lists");
    } else {
      const bool batch = tokens.size() > 0 && tokens.at(0).value_unsafe().is_array();
      std::vector<std::string> texts;
      std::vector<int32_t> ids;
      if (batch) {
        for (simdjson::dom::element seq : tokens) {
          simdjson::dom::array a;
          ids.clear();
          std::string why = seq.get_array().get(a) ? "\"tokens\" mixes lists and ids"
                                                   : read_ids(a, tok->vocab_size(), ids);
          if (!why.empty()) {
            error = bad(std::move(why));
            break;
          }
          texts.push_back(tok->decode(ids, skip));
        }
      } else {
        std::string why = read_ids(tokens, tok->vocab_size(), ids);
        if (why.empty()) {
          texts.push_back(tok->decode(ids, skip));
        } else {
          error = bad(std::move(why));
        }
      }
      out = R"({"text":)";
      if (batch) out.push_back('[');
      for (size_t i = 0; i < texts.size(); ++i) {
        if (i) out.push_back(',');
        json::append_string(out, texts[i]);
      }
      if (batch) out.push_back(']');
      out.push_back('}');
    }
  } else {
    bool add_special = true;
    if (obj["add_special_tokens"].get_bool().get(add_special)) add_special = true;
    std::vector<std::vector<int32_t>> seqs;
    bool batch = false;
    simdjson::dom::element prompt;
    simdjson::dom::array messages;
    if (!obj["messages"].get_array().get(messages)) {
      const tokenizer::ChatTemplate* tmpl = pool->parse_options().chat_template;
      std::string text, why;
      if (!tmpl) {
        error = bad("rule '" + pool->name() + "' has no chat template to render `messages` with");
      } else if (!tmpl->render_request_json(simdjson::minify(messages), "", true, "", text, why)) {
        error = bad("the chat template rejected the messages: " + why);
      } else {
        seqs.push_back(tok->encode(text, false));
      }
    } else if (!obj["prompt"].get(prompt)) {
      std::string_view s;
      simdjson::dom::array list;
      if (!prompt.get_string().get(s)) {
        seqs.push_back(tok->encode(s, add_special));
      } else if (!prompt.get_array().get(list)) {
        batch = true;
        for (simdjson::dom::element item : list) {
          if (item.get_string().get(s)) {
            error = bad("\"prompt\" must be a string or a list of strings");
            break;
          }
          seqs.push_back(tok->encode(s, add_special));
        }
      } else {
        error = bad("\"prompt\" must be a string or a list of strings");
      }
    } else {
      error = bad("give \"prompt\" (a string or a list of strings) or \"messages\" (a chat)");
    }
    out = R"({"tokens":)";
    if (batch) out.push_back('[');
    for (size_t i = 0; i < seqs.size(); ++i) {
      if (i) out.push_back(',');
      append_ids(out, seqs[i]);
    }
    if (batch) out.append(R"(],"count":[)");
    if (!batch) out.append(R"(,"count":)");
    for (size_t i = 0; i < seqs.size(); ++i) {
      if (i) out.push_back(',');
      out.append(std::to_string(seqs[i].size()));
    }
    if (batch) out.push_back(']');
    out.append(R"(,"max_model_len":)").append(std::to_string(max_model_len(*pool))).append("}");
  }
  if (error) {
    int status = error->status;
    co_await fail(ex, *error, rid);
    record(ex, label, status, "", false, start);
    co_return;
  }
  co_await answer(ex, 200, out, rid);
  record(ex, label, 200, "", false, start);
}

// The engine's /get_model_info for the model the query names, else for the first rule's model.
awaitable<void> Gateway::model_info(http::Exchange& ex, std::string_view rid,
                                    Clock::time_point start) {
  auto table = pools_.table();
  std::string model = http::percent_decode(http::query_param(ex.target(), "model"));
  const Pool* pool = nullptr;
  if (model.empty()) {
    pool = table->pools.empty() ? nullptr : table->pools[0].get();
  } else if (auto p = table->resolve(ex.local_port(), "/v1/chat/completions", model)) {
    pool = p.get();
  }
  const WorkerPtr chosen = pool ? pool->first_healthy() : nullptr;
  if (!chosen) {
    GatewayError e = !model.empty() && !pool
                         ? errors::model_not_found(model)
                         : GatewayError{503, "server_error", "no_available_workers",
                                        pool ? "no healthy worker in rule '" + pool->name() + "'"
                                             : std::string("no rule is configured")};
    int status = e.status;
    co_await fail(ex, e, rid);
    record(ex, "/get_model_info", status, "", false, start);
    co_return;
  }
  // The client's credentials go with it: an engine run with --api-key asks for them.
  const std::string auth(ex.header("authorization"));
  const http::Header auth_header[] = {{"authorization", auth}};
  const http::HeaderList headers(auth_header, auth.empty() ? 0 : 1);
  auto r =
      co_await http::fetch(ex.executor(), chosen->target(), "GET", "/get_model_info",
                           std::chrono::seconds(config_.health_check_timeout_secs), {}, headers);
  if (r.error != http::CallError::kNone) {
    GatewayError e = errors::upstream_no_answer(chosen->id());
    int status = e.status;
    co_await fail(ex, e, rid, chosen.get());
    record(ex, "/get_model_info", status, "", false, start);
    co_return;
  }
  const http::Header h[] = {kJsonType, {"x-request-id", rid}};
  co_await ex.respond(r.status, h, r.body);
  record(ex, "/get_model_info", r.status, "", false, start);
}

namespace {
struct RouteOnlyHeaders {
  const std::function<std::string_view(std::string_view)>* fn;
};
std::string_view route_only_header(const void* self, std::string_view name) {
  return (*static_cast<const RouteOnlyHeaders*>(self)->fn)(name);
}
}  // namespace

Gateway::RouteOnly Gateway::route_only(
    std::string_view path, std::string body,
    const std::function<std::string_view(std::string_view)>& header, int64_t at_us) const {
  auto error = [](int status, std::string_view code, std::string_view message) {
    return RouteOnly{status, R"({"error":{"type":"invalid_request_error","code":)" +
                                 json::quote(code) + R"(,"message":)" + json::quote(message) +
                                 "}}"};
  };
  const RouteEntry* entry = find_route(path);
  if (!entry || !entry->api || *entry->api == ApiRoute::kResponse) {
    return error(400, "bad_path",
                 "?path= must name a route the gateway routes (/v1/chat/completions, "
                 "/v1/completions, /generate, ...)");
  }
  const ApiRoute route = *entry->api;
  auto table = pools_.table();
  const auto port = static_cast<uint16_t>(config_.port);
  body.reserve(body.size() + http::kBodyPadding);
  RequestInfo info;
  std::string parse_error;
  if (table->needs_model(port, path) || route == ApiRoute::kResponses) {
    parse_error = parse_request(route, body, info);
    if (!parse_error.empty()) info = RequestInfo{};
  }
  std::shared_ptr<Pool> pool = table->resolve(port, path, info.model);
  if (!pool) {
    return error(404, "rule_not_found",
                 parse_error.empty() ? "no rule takes this request (model '" + info.model + "')"
                                     : parse_error);
  }
  if (pool->reads_body()) {
    const ParseOptions& options = pool->parse_options();
    info = RequestInfo{};
    if (std::string err = parse_request(route, body, info, options); !err.empty()) {
      return error(400, "bad_json", err);
    }
  }
  RouteContext ctx;
  ctx.request = &info;
  ctx.route_only = true;
  ctx.at_us = at_us;
  RouteOnlyHeaders headers{&header};
  ctx.header_fn = &route_only_header;
  ctx.header_self = &headers;
  auto pick = [&](AvailabilityIndex& index, Policy& policy, std::string& out) {
    CandidateList candidates;
    candidates.list(index, {}, Clock::now());
    if (candidates.empty()) return false;
    ctx.candidates = candidates.view();
    Decision d = policy.select(candidates.workers(), ctx);
    ctx.candidates = {};
    out += R"({"policy":)" + json::quote(policy.name()) + R"(,"branch":)" + json::quote(d.branch);
    if (!d.inner_branch.empty()) out += R"(,"fallback_branch":)" + json::quote(d.inner_branch);
    out += R"(,"worker":)" + (d.worker ? json::quote(d.worker->url()) : std::string("null"));
    if (d.worker) out += R"(,"worker_id":)" + std::to_string(d.worker->id());
    out += R"(,"dp_rank":)" + (d.dp_rank ? std::to_string(*d.dp_rank) : std::string("null"));
    out += R"(,"predicted_chars":)" + std::to_string(d.predicted_chars) +
           R"(,"predicted_tokens":)" + std::to_string(d.predicted_tokens) + "}";
    return true;
  };
  std::string out = R"({"rule":)" + json::quote(pool->name()) + R"(,"model":)" +
                    json::quote(info.model) + R"(,"decision":)";
  if (!pick(pool->available(), pool->policy(), out)) {
    return error(503, "no_available_worker",
                 "no worker of rule '" + pool->name() + "' is available (see /readiness)");
  }
  if (pool->pd()) {
    out += R"(,"decode":)";
    if (!pick(pool->decode_available(), pool->decode_policy(), out)) out += "null";
  }
  out += "}";
  return RouteOnly{200, std::move(out)};
}

}  // namespace kvgate
