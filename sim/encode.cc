// sim/encode: see encode.h.
#include "sim/encode.h"

#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>

#include "sim/pooling.h"
#include "sim/request.h"
#include "sim/responses.h"
#include "util/json.h"
#include "util/random.h"

namespace kvgate::sim {
namespace {

constexpr http::Header kJson[] = {{"content-type", "application/json"}};
constexpr std::string_view kDefaultModelName = "default";  // protocol.DEFAULT_MODEL_NAME

// Submits every request and waits until each one's prefill is done (max_new_tokens 0: a sequence
// finishes at its prefill). False when the client went away first (the sequences are cancelled).
awaitable<bool> prefill_all(http::Exchange& ex, Engine& engine, std::vector<GenerationRequest> reqs,
                            std::vector<std::shared_ptr<Sequence>>& seqs) {
  auto notifier = std::make_shared<Notifier>(ex.executor());
  ex.watch_disconnect([notifier] { notifier->notify(); });
  seqs.clear();
  for (auto& r : reqs) seqs.push_back(engine.submit(std::move(r), notifier));
  for (;;) {
    bool all = true;
    for (const auto& s : seqs) all = all && s->finished();
    if (all) co_return true;
    co_await notifier->wait();
    if (ex.client_gone()) {
      for (const auto& s : seqs) s->cancel();
      co_return false;
    }
  }
}

void append_embedding_object(std::string& out, const Engine& engine, const Sequence& s,
                             bool classify) {
  std::vector<int32_t> none;
  Progress p;
  s.read(0, none, p);
  const GenerationRequest& r = s.request();
  out.append(R"({"embedding":)");
  if (classify) {
    // A reward model's one score.
    Rng rng(PseudoText::prompt_hash(r.prompt, 0x726577));
    out.push_back('[');
    append_double(out, std::round((rng.uniform() * 8 - 4) * 1e6) / 1e6);
    out.push_back(']');
  } else {
    append_embedding(out, r.prompt);
  }
  out.append(R"(,"meta_info":{"id":)");
  json::append_string(out, r.rid);
  out.append(R"(,"finish_reason":)");
  if (p.finish && p.finish->kind == FinishReason::Kind::kAbort) {
    out.append(R"({"type":"abort","message":)");
    json::append_string(out, p.finish->message);
    out.append(R"(,"status_code":null,"err_type":null})");
  } else {
    out.append(R"({"type":"length","length":0})");
  }
  out.append(R"(,"prompt_tokens":)");
  append_int(out, static_cast<int64_t>(r.prompt.size()));
  out.append(R"(,"weight_version":)");
  json::append_string(out, kWeightVersion);
  out.append(R"(,"total_retractions":0,"dp_rank":)");
  const int rank = engine.meta_dp_rank(s.dp_rank());
  if (rank < 0) {
    out.append("null");
  } else {
    append_int(out, rank);
  }
  out.append(R"(,"e2e_latency":)");
  append_double(out, std::chrono::duration<double>(p.finished_at - s.arrival()).count());
  out.append("}}");
}

awaitable<void> respond_generate_error(http::Exchange& ex, std::string_view message) {
  std::string body;
  append_generate_error(body, message);
  co_await ex.respond(400, kJson, body);
}

awaitable<void> respond_openai_error(http::Exchange& ex, std::string_view message) {
  std::string body;
  append_openai_error(body, message, 400);
  co_await ex.respond(400, kJson, body);
}

bool flag(const nlohmann::json& o, const char* key) {
  auto it = o.find(key);
  return it != o.end() && it->is_boolean() && it->get<bool>();
}

// ScoringRequest's prompts: query + item (item + query with item_first), text concatenated then
// tokenized, or token ids concatenated. "" or the ValueError's message.
std::string score_prompts(const nlohmann::json& o, const Tokenizer& tok,
                          std::vector<std::vector<int32_t>>& prompts) {
  const nlohmann::json query = o.value("query", nlohmann::json());
  const nlohmann::json items = o.value("items", nlohmann::json());
  const bool item_first = flag(o, "item_first");
  if (query.is_string() &&
      (items.is_string() || (items.is_array() && (items.empty() || items.front().is_string())))) {
    std::vector<std::string> list;
    if (items.is_string()) {
      list.push_back(items.get<std::string>());
    } else {
      for (const auto& i : items) {
        if (!i.is_string()) return "'items' must be a string or a list of strings";
        list.push_back(i.get<std::string>());
      }
    }
    for (const auto& item : list) {
      const std::string q = query.get<std::string>();
      tok.encode(item_first ? item + q : q + item, prompts.emplace_back());
    }
    return "";
  }
  if (query.is_array() && items.is_array() && !items.empty() && items.front().is_array()) {
    auto ids = [&tok](const nlohmann::json& a, std::vector<int32_t>& out) {
      for (const auto& v : a) {
        if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
            v.get<int64_t>() >= tok.vocab_size()) {
          return false;
        }
        out.push_back(v.get<int32_t>());
      }
      return true;
    };
    std::vector<int32_t> q;
    if (!ids(query, q)) return "'query' must be a list of token ids";
    for (const auto& item : items) {
      std::vector<int32_t> it;
      if (!item.is_array() || !ids(item, it)) return "'items' must be lists of token ids";
      auto& p = prompts.emplace_back();
      const auto& first = item_first ? it : q;
      const auto& second = item_first ? q : it;
      p.insert(p.end(), first.begin(), first.end());
      p.insert(p.end(), second.begin(), second.end());
    }
    return "";
  }
  return "Invalid combination of query/items types for score_request.";
}

}  // namespace

std::vector<double> label_scores(const Engine& engine, std::span<const int32_t> prompt,
                                 std::span<const int32_t> labels, bool apply_softmax) {
  // The model's next token after the prompt is the position's actual token; the labels' logprobs
  // are the model's at that position (the first output position).
  const std::vector<int32_t> next = engine.model().generate(prompt, engine.seed(), 1);
  const auto pos = static_cast<int64_t>(prompt.size());
  std::vector<double> lp;
  lp.reserve(labels.size());
  for (int32_t id : labels) lp.push_back(engine.logprob_model().logprob_of(next[0], pos, id));
  if (!apply_softmax) {
    for (double& x : lp) x = std::exp(x);
    return lp;
  }
  double max = -INFINITY;
  for (double x : lp) max = std::max(max, x);
  double sum = 0;
  for (double& x : lp) {
    x = std::exp(x - max);
    sum += x;
  }
  for (double& x : lp) x /= sum;
  return lp;
}

EncodeHandler::EncodeHandler(const SimConfig& config, Engine& engine,
                             const ChatTemplate& chat_template)
    : config_(config),
      engine_(engine),
      chat_template_(chat_template),
      lora_adapters_(lora_names(config)) {}

awaitable<void> EncodeHandler::encode(http::Exchange& ex, bool classify) {
  // EmbeddingReqInput takes /generate's input fields; max_new_tokens is 0 whatever the body says.
  ParsedRequest req;
  RequestLimits limits{.default_max_new_tokens = 0,
                       .context_length = config_.context_length,
                       .max_req_input_len = max_req_input_len(config_)};
  std::string err =
      parse_request(Route::kGenerate, ex.body(), engine_.tokenizer(), chat_template_, limits, req);
  if (err.empty()) err = check_loras(req, config_.enable_lora, lora_adapters_);
  if (err.empty()) err = engine_.check_rank(req.routed_dp_rank);
  if (!err.empty()) {
    co_await respond_generate_error(ex, err);
    co_return;
  }
  if (std::string full = engine_.check_queue(req.routed_dp_rank, req.prompts.size());
      !full.empty()) {
    std::string body;
    append_http_exception_error(body, full, 503);
    co_await ex.respond(503, kJson, body);
    co_return;
  }
  std::vector<GenerationRequest> reqs;
  for (size_t i = 0; i < req.prompts.size(); ++i) {
    GenerationRequest g{std::move(req.prompts[i]), SamplingParams{.max_new_tokens = 0},
                        req.rids[i].empty() ? random_hex() : req.rids[i], req.routed_dp_rank};
    g.ns = req.cache_namespace(i);
    reqs.push_back(std::move(g));
  }
  std::vector<std::shared_ptr<Sequence>> seqs;
  bool done = co_await prefill_all(ex, engine_, std::move(reqs), seqs);
  if (!done) co_return;
  std::string body;
  if (req.batch) body.push_back('[');
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (i) body.push_back(',');
    append_embedding_object(body, engine_, *seqs[i], classify);
  }
  if (req.batch) body.push_back(']');
  co_await ex.respond(200, kJson, body);
}

awaitable<void> EncodeHandler::score(http::Exchange& ex) {
  const nlohmann::json o = nlohmann::json::parse(ex.body(), nullptr, false);
  if (o.is_discarded() || !o.is_object()) {
    co_await respond_openai_error(ex, "the request body must be a JSON object");
    co_return;
  }
  const nlohmann::json labels_json = o.value("label_token_ids", nlohmann::json());
  if (labels_json.is_null()) {
    co_await respond_openai_error(ex, "label_token_ids must be provided");
    co_return;
  }
  std::vector<int32_t> labels;
  std::string err;
  if (!labels_json.is_array()) err = "'label_token_ids' must be a list of token ids";
  for (size_t i = 0; err.empty() && i < labels_json.size(); ++i) {
    const auto& v = labels_json[i];
    if (!v.is_number_integer()) {
      err = "'label_token_ids' must be a list of token ids";
    } else if (v.get<int64_t>() < 0 || v.get<int64_t>() >= engine_.tokenizer().vocab_size()) {
      err = "Token ID " + std::to_string(v.get<int64_t>()) + " is out of vocabulary (vocab size: " +
            std::to_string(engine_.tokenizer().vocab_size()) + ")";
    } else {
      labels.push_back(v.get<int32_t>());
    }
  }
  std::vector<std::vector<int32_t>> prompts;
  if (err.empty()) err = score_prompts(o, engine_.tokenizer(), prompts);
  for (size_t i = 0; err.empty() && i < prompts.size(); ++i) {
    const auto n = static_cast<int64_t>(prompts[i].size());
    if (n == 0) err = "the prompt is empty (0 tokens)";
    if (n >= config_.context_length) {
      err = "The input (" + std::to_string(n) +
            " tokens) is longer than the model's context length (" +
            std::to_string(config_.context_length) + " tokens).";
    }
  }
  if (!err.empty()) {
    co_await respond_openai_error(ex, err);
    co_return;
  }
  const bool softmax = flag(o, "apply_softmax");
  std::vector<GenerationRequest> reqs;
  for (auto& p : prompts) {
    GenerationRequest g{std::move(p), SamplingParams{.max_new_tokens = 0}, random_hex(),
                        std::nullopt};
    // score_request asks the next token's logprobs of the labels (logprob_start_len -1).
    g.logprob = LogprobParams{.return_logprob = true, .token_ids = labels};
    reqs.push_back(std::move(g));
  }
  std::vector<std::shared_ptr<Sequence>> seqs;
  bool done = co_await prefill_all(ex, engine_, std::move(reqs), seqs);
  if (!done) co_return;
  std::string body = R"({"scores":[)";
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (i) body.push_back(',');
    body.push_back('[');
    auto scores = label_scores(engine_, seqs[i]->request().prompt, labels, softmax);
    for (size_t j = 0; j < scores.size(); ++j) {
      if (j) body.push_back(',');
      append_double(body, scores[j]);
    }
    body.push_back(']');
  }
  body.append(R"(],"pooled_hidden_states":null,"model":)");
  auto model = o.find("model");
  json::append_string(body, model != o.end() && model->is_string()
                                ? model->get<std::string>()
                                : std::string(kDefaultModelName));
  body.append(R"(,"usage":null,"object":"scoring"})");
  co_await ex.respond(200, kJson, body);
}

}  // namespace kvgate::sim
