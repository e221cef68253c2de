// gateway/doctor: see doctor.h.
#include "gateway/doctor.h"

#include <algorithm>
#include <array>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <utility>

#include "gateway/pool.h"
#include "policy/kv_exact.h"
#include "policy/kv_parity.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "util/json.h"
#include "util/random.h"

namespace kvgate::doctor {
namespace {

using Json = nlohmann::ordered_json;
using std::chrono::milliseconds;

constexpr std::string_view kStepNames[] = {
    "",         "model readiness", "pool homogeneity", "proxy path", "event plane",
    "kv_exact", "inventory",       "selector",
};

// A text whose ids tell tokenizers apart: accents, an emoji, digits, code, doubled spaces.
constexpr std::string_view kTokenizerProbe =
    "kvgate doctor: tokenizer parity. Ünïcödé café, naïve 🚀 12345 67.89e-3 `x = y + 1;` "
    "double  spaces\ttab, <tag> and \"quotes\".";

std::string ms_text(milliseconds d) {
  return std::to_string(d.count()) + " ms";
}

// One run over one rule.
struct Run {
  const Env& env;
  Options opt;
  Executor ex;
  std::shared_ptr<const RuleTable> table;
  std::shared_ptr<Pool> pool;
  rules::Rule rule;
  std::vector<WorkerPtr> workers;
  const KvExactPolicy* kv = nullptr;
  std::string model;  // for request bodies: the rule's first model, else the engine's
  uint64_t nonce = 0;
  // Step 2's reading of each endpoint's /get_server_info (also used by step 4).
  std::map<std::string, Json> server_info;

  std::string next_nonce() {
    static constexpr char kHex[] = "0123456789abcdef";
    std::string s;
    uint64_t v = nonce++;
    for (int i = 0; i < 16; ++i) s.push_back(kHex[(v >> (i * 4)) & 15]);
    return s;
  }

  awaitable<http::FetchResult> direct(const Worker& w, std::string_view method,
                                      std::string_view path, std::string_view body = {}) {
    static constexpr http::Header kJson[] = {{"content-type", "application/json"}};
    http::HeaderList headers;
    if (!body.empty()) headers = kJson;
    co_return co_await http::fetch(ex, w.target(), method, path, opt.request_timeout, body,
                                   headers);
  }

  // The doctor's header: the key, the rule, and the worker to pin (or none).
  std::string doctor_header(std::string_view pin) const {
    std::string h = env.key->value() + " rule=" + rule.name;
    if (!pin.empty()) h += " pin=" + std::string(pin);
    return h;
  }

  // A chat body with `content`, one token, `model` when known.
  std::string chat_body(std::string_view content, int rank = -1) const {
    std::string b = "{";
    if (!model.empty()) {
      b += "\"model\":";
      json::append_string(b, model);
      b += ',';
    }
    b += "\"messages\":[{\"role\":\"user\",\"content\":";
    json::append_string(b, content);
    b += "}],\"max_tokens\":1,\"temperature\":0,\"stream\":false";
    if (rank >= 0) {
      b += ',';
      json::append_string(b, env.config->dp_rank_field);
      b += ':' + std::to_string(rank);
    }
    b += '}';
    return b;
  }

  // A 1-token completion of `prompt` (what every engine serves, chat template or not).
  std::string completion_body(std::string_view prompt) const {
    std::string b = "{";
    if (!model.empty()) {
      b += "\"model\":";
      json::append_string(b, model);
      b += ',';
    }
    b += "\"prompt\":";
    json::append_string(b, prompt);
    b += ",\"max_tokens\":1,\"temperature\":0}";
    return b;
  }

  // `body` with "model" added (make_probe's bodies carry none).
  std::string with_model(std::string body) const {
    if (model.empty() || body.empty() || body[0] != '{') return body;
    std::string m = "\"model\":";
    json::append_string(m, model);
    m += ',';
    body.insert(1, m);
    return body;
  }
};

// Sends `body` to the gateway's own listener as the doctor (debug headers back).
awaitable<http::FetchResult> through(Executor ex, http::Target self, std::string doctor,
                                     std::string api_key, std::string body, milliseconds timeout,
                                     std::string path = "/v1/chat/completions") {
  std::string auth = api_key.empty() ? "" : "Bearer " + api_key;
  std::vector<http::Header> headers{{"content-type", "application/json"},
                                    {"x-kvgate-doctor", doctor}};
  if (!auth.empty()) headers.push_back({"authorization", auth});
  co_return co_await http::fetch(ex, self, "POST", path, timeout, body, headers,
                                 /*keep_headers=*/true);
}

awaitable<http::FetchResult> through(Run& r, std::string body, std::string_view pin = {},
                                     std::string path = "/v1/chat/completions") {
  std::string doctor = r.doctor_header(pin);
  co_return co_await through(r.ex, r.env.self, std::move(doctor), r.env.config->api_key,
                             std::move(body), r.opt.request_timeout, std::move(path));
}

// Many requests through the gateway at once; results in order.
awaitable<std::vector<http::FetchResult>> through_all(Run& r, std::vector<std::string> bodies) {
  struct Join {
    explicit Join(const Executor& ex, size_t n) : results(n), left(n), timer(ex) {}
    std::vector<http::FetchResult> results;
    size_t left;
    Timer timer;
  };
  auto join = std::make_shared<Join>(r.ex, bodies.size());
  for (size_t i = 0; i < bodies.size(); ++i) {
    asio::co_spawn(
        r.ex,
        [join, i, ex = r.ex, self = r.env.self, doctor = r.doctor_header({}),
         key = r.env.config->api_key, body = std::move(bodies[i]),
         timeout = r.opt.request_timeout]() -> awaitable<void> {
          join->results[i] = co_await through(ex, self, doctor, key, body, timeout);
          if (--join->left == 0) join->timer.cancel();
        },
        asio::detached);
  }
  if (join->left > 0) {
    join->timer.expires_at(Clock::time_point::max());
    co_await join->timer.async_wait(asio::as_tuple(use_awaitable));
  }
  co_return std::move(join->results);
}

awaitable<void> sleep_for(Executor ex, milliseconds d) {
  Timer t(ex);
  t.expires_after(d);
  co_await t.async_wait(asio::as_tuple(use_awaitable));
}

// Polls `done` every 50 ms until it holds, `limit` passes or the run's client goes away;
// returns whether it held.
template <typename F>
awaitable<bool> wait_until(Run& r, milliseconds limit, F done) {
  auto until = Clock::now() + limit;
  while (!done()) {
    if (Clock::now() >= until || (r.opt.cancelled && r.opt.cancelled())) co_return false;
    co_await sleep_for(r.ex, milliseconds(50));
  }
  co_return true;
}

// Whether something accepts TCP connections at "tcp://host:port": "" or why not.
awaitable<std::string> tcp_reachable(Executor ex, std::string_view endpoint, milliseconds limit) {
  std::string_view hp = endpoint;
  if (hp.starts_with("tcp://")) hp.remove_prefix(6);
  size_t colon = hp.rfind(':');
  if (colon == std::string_view::npos) co_return "not a tcp://host:port address";
  std::string host(hp.substr(0, colon));
  std::string port(hp.substr(colon + 1));
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  asio::ip::basic_resolver<asio::ip::tcp, Executor> resolver(ex);
  auto [rec, results] = co_await resolver.async_resolve(host, port, asio::as_tuple(use_awaitable));
  if (rec || results.empty()) co_return "the address does not resolve: " + rec.message();
  // Shared with the timer's handler, which may run after this frame is gone.
  struct Attempt {
    explicit Attempt(const Executor& ex) : socket(ex) {}
    asio::basic_stream_socket<asio::ip::tcp, Executor> socket;
    bool timed_out = false;
  };
  auto attempt = std::make_shared<Attempt>(ex);
  Timer timer(ex);
  timer.expires_after(limit);
  timer.async_wait([attempt](const boost::system::error_code& ec) {
    if (ec) return;  // cancelled: the connect ended first
    attempt->timed_out = true;
    boost::system::error_code ignored;
    attempt->socket.close(ignored);
  });
  auto [cec] = co_await attempt->socket.async_connect(results.begin()->endpoint(),
                                                      asio::as_tuple(use_awaitable));
  timer.cancel();
  if (attempt->timed_out) co_return "no answer within " + ms_text(limit);
  if (cec) co_return cec.message();
  boost::system::error_code ignored;
  attempt->socket.close(ignored);
  co_return "";
}

std::optional<Json> parse_json(const std::string& body) {
  Json j = Json::parse(body, nullptr, false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

std::string call_error(const http::FetchResult& r) {
  if (r.error != http::CallError::kNone) {
    return std::string(http::to_string(r.error)) + (r.detail.empty() ? "" : ": " + r.detail);
  }
  std::string body = r.body.substr(0, 200);
  std::replace(body.begin(), body.end(), '\n', ' ');
  std::string out = "status " + std::to_string(r.status) + (body.empty() ? "" : ": " + body);
  // The gateway's id of the request, to find it in kvgate's log.
  if (std::string_view rid = r.header("x-request-id"); !rid.empty()) {
    out += " (x-request-id ";
    out += rid;
    out += ')';
  }
  return out;
}

bool ok_answer(const http::FetchResult& r) {
  return r.error == http::CallError::kNone && r.status >= 200 && r.status < 300;
}

// The cached prompt tokens an answer reports (OpenAI usage or SGLang meta_info), if any.
// The cached prompt tokens an OpenAI answer reports, if any. SGLang with --enable-cache-report
// leaves prompt_tokens_details out (null) when nothing was cached: with `reports_cache` (the
// engine's /get_server_info says it reports) an answer with usage but no details means 0.
std::optional<int64_t> cached_tokens(const std::string& body, bool reports_cache) {
  auto j = parse_json(body);
  if (!j || !j->is_object()) return std::nullopt;
  auto u = j->find("usage");
  if (u == j->end() || !u->is_object()) return std::nullopt;
  if (auto d = u->find("prompt_tokens_details"); d != u->end() && d->is_object()) {
    if (auto c = d->find("cached_tokens"); c != d->end() && c->is_number_integer()) {
      return c->get<int64_t>();
    }
  }
  if (reports_cache && u->contains("prompt_tokens")) return 0;
  return std::nullopt;
}

// A value of /get_server_info as text ("" when missing).
std::string info_text(const Json& info, std::string_view key) {
  auto it = info.find(std::string(key));
  if (it == info.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array() && !it->empty() && (*it)[0].is_string()) return (*it)[0].get<std::string>();
  return it->dump();
}

// Marks `s` failed with `fix` (the first failure's fix is the step's).
void fail(Step& s, std::string line, std::string fix) {
  if (s.status != Status::kFail) s.fix = std::move(fix);  // a warning's fix gives way
  s.status = Status::kFail;
  s.lines.push_back("FAIL " + std::move(line));
}

void warn(Step& s, std::string line, std::string fix) {
  if (s.status != Status::kFail) s.status = Status::kWarn;
  s.lines.push_back("WARN " + std::move(line));
  if (s.fix.empty()) s.fix = std::move(fix);
}

// ---- step 1: model readiness -------------------------------------------------------------

awaitable<Step> model_readiness(Run& r) {
  Step s{.number = 1, .name = std::string(kStepNames[1]), .status = Status::kPass};
  milliseconds slowest{0};
  int served = 0;
  for (const auto& w : r.workers) {
    rules::Role role = r.pool->role(*w);
    if (role != rules::Role::kNone) {
      // A prefill or decode server alone cannot finish a completion: its health only here; the
      // pair is proven through the gateway in step 3.
      auto h = co_await r.direct(*w, "GET", "/health");
      if (!ok_answer(h)) {
        fail(s,
             w->url() + " (" + (role == rules::Role::kPrefill ? "prefill" : "decode") +
                 "): /health " + call_error(h),
             "bring " + w->url() + " up: kvgate can route only to an engine that serves");
      } else {
        s.lines.push_back("ok   " + w->url() + " (" +
                          (role == rules::Role::kPrefill ? "prefill" : "decode") +
                          "): /health 200 (a completion needs both halves: step 3)");
        ++served;
      }
      continue;
    }
    std::string model = r.model;
    if (model.empty()) {
      auto m = co_await r.direct(*w, "GET", "/v1/models");
      if (auto j = ok_answer(m) ? parse_json(m.body) : std::nullopt) {
        if (j->contains("data") && (*j)["data"].is_array() && !(*j)["data"].empty() &&
            (*j)["data"][0].contains("id") && (*j)["data"][0]["id"].is_string()) {
          model = (*j)["data"][0]["id"].get<std::string>();
        }
      }
    }
    std::string saved = std::exchange(r.model, model);
    std::string body = r.completion_body("kvgate doctor: are you ready?");
    r.model = saved;
    auto t0 = Clock::now();
    auto c = co_await r.direct(*w, "POST", "/v1/completions", body);
    auto took = std::chrono::duration_cast<milliseconds>(Clock::now() - t0);
    if (!ok_answer(c)) {
      fail(s, w->url() + ": a 1-token completion failed: " + call_error(c),
           "make " + w->url() +
               " serve completions (check its log and model); kvgate can "
               "route only to an engine that serves");
      continue;
    }
    ++served;
    slowest = std::max(slowest, took);
    s.lines.push_back("ok   " + w->url() + ": 1-token completion in " + ms_text(took));
    if (r.model.empty() && !model.empty()) r.model = model;
  }
  s.measured = std::to_string(served) + " of " + std::to_string(r.workers.size()) +
               " endpoints serve directly; slowest completion " + ms_text(slowest);
  co_return s;
}

// ---- step 2: pool homogeneity ------------------------------------------------------------

// First position where two id lists differ (their common length when one is a prefix).
size_t first_difference(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return i;
}

std::string id_at(const std::vector<int32_t>& ids, size_t i) {
  return i < ids.size() ? std::to_string(ids[i]) : "(end)";
}

awaitable<std::optional<Json>> read_server_info(Run& r, const Worker& w) {
  auto i = co_await r.direct(w, "GET", "/get_server_info");
  if (ok_answer(i)) {
    if (auto j = parse_json(i.body); j && j->is_object()) co_return j;
  }
  auto i2 = co_await r.direct(w, "GET", "/server_info");
  if (ok_answer(i2)) {
    if (auto j = parse_json(i2.body); j && j->is_object()) co_return j;
  }
  co_return std::nullopt;
}

awaitable<Step> pool_homogeneity(Run& r) {
  Step s{.number = 2, .name = std::string(kStepNames[2]), .status = Status::kPass};
  const bool kv_on = r.rule.kv_exact_mode != 0;
  const tokenizer::Tokenizer* tok = r.pool->parse_options().tokenizer;
  std::vector<int32_t> ours;
  if (tok) tok->encode(kTokenizerProbe, true, ours);
  // Each property: value -> the endpoints reporting it.
  std::map<std::string, std::map<std::string, std::vector<std::string>>> seen;
  std::map<std::string, std::vector<int32_t>> ids;  // url -> the engine's ids of the probe
  std::vector<std::string> no_info, no_tokenize;
  for (const auto& w : r.workers) {
    auto info = co_await read_server_info(r, *w);
    if (!info) {
      no_info.push_back(w->url());
    } else {
      r.server_info[w->url()] = *info;
      std::string served = info_text(*info, "served_model_name");
      if (served.empty()) served = info_text(*info, "model_path");
      seen["served model"][served].push_back(w->url());
      seen["page size"][info_text(*info, "page_size")].push_back(w->url());
      std::string dp = info_text(*info, "dp_size");
      seen["dp size"][dp.empty() ? "1" : dp].push_back(w->url());
      seen["engine version"][info_text(*info, "version")].push_back(w->url());
    }
    std::string body = "{\"prompt\":";
    json::append_string(body, kTokenizerProbe);
    body += ",\"add_special_tokens\":true}";
    std::optional<std::vector<int32_t>> got;
    static constexpr std::array<std::string_view, 2> kTokenizePaths = {"/v1/tokenize", "/tokenize"};
    for (std::string_view path : kTokenizePaths) {
      auto t = co_await r.direct(*w, "POST", path, body);
      if (!ok_answer(t)) continue;
      auto j = parse_json(t.body);
      if (!j || !j->contains("tokens") || !(*j)["tokens"].is_array()) continue;
      std::vector<int32_t> v;
      for (const auto& x : (*j)["tokens"]) {
        if (x.is_number_integer()) v.push_back(x.get<int32_t>());
      }
      got = std::move(v);
      break;
    }
    if (got) {
      ids[w->url()] = *got;
    } else {
      no_tokenize.push_back(w->url());
    }
  }
  auto agree = [&](const std::string& what, bool fatal, const std::string& fix) -> std::string {
    auto it = seen.find(what);
    if (it == seen.end() || it->second.empty()) return "";
    if (it->second.size() == 1) return it->second.begin()->first;
    std::string line = "the endpoints report different " + what + "s:";
    for (const auto& [value, urls] : it->second) {
      line += " " + (value.empty() ? std::string("(none)") : value) + " at";
      for (const auto& u : urls) line += " " + u;
      line += ";";
    }
    if (fatal) {
      fail(s, line, fix);
    } else {
      warn(s, line, fix);
    }
    return "";
  };
  std::string served = agree("served model", true,
                             "serve one model behind a rule (one rule per model: rules match "
                             "requests by model)");
  std::string page = agree("page size", kv_on,
                           "run every engine of the rule with the same --page-size (kv_exact "
                           "keys pages of kvBlockSize tokens)");
  std::string dp = agree("dp size", kv_on, "run every engine of the rule with the same --dp-size");
  std::string version = agree("engine version", false,
                              "pin one reviewed engine build for the whole pool: a mixed fleet "
                              "can hash, template or report differently");
  if (kv_on && !page.empty() && page != std::to_string(r.rule.kv_block_size)) {
    fail(s,
         "the engines' page size is " + page + ", the rule's kvBlockSize is " +
             std::to_string(r.rule.kv_block_size),
         "set kvBlockSize to " + page + " (the engines' --page-size)");
  }
  if (kv_on && !dp.empty() && dp != std::to_string(r.rule.kv_dp_rank_count)) {
    fail(s,
         "the engines run " + dp + " DP rank(s), the rule's kvDpRankCount is " +
             std::to_string(r.rule.kv_dp_rank_count),
         "set kvDpRankCount to " + dp + " (the engines' --dp-size: one event publisher per rank)");
  }
  // Tokenizers: every engine's ids of the probe text alike, and kvgate's when it has one.
  const std::vector<int32_t>* first = nullptr;
  std::string first_url;
  for (const auto& [url, v] : ids) {
    if (!first) {
      first = &v;
      first_url = url;
      continue;
    }
    if (v != *first) {
      size_t at = first_difference(*first, v);
      std::string line = "the tokenizers differ: ";
      line += url;
      line += " and " + first_url + " give other ids for the probe text (first at position ";
      fail(s, line + std::to_string(at) + ": " + id_at(v, at) + " vs " + id_at(*first, at) + ")",
           "serve the same tokenizer (model files) on every endpoint of the rule");
    }
  }
  if (tok && first) {
    for (const auto& [url, v] : ids) {
      if (v == ours) continue;
      size_t at = first_difference(ours, v);
      fail(s,
           "kvgate's tokenizer (tokenizerPath " + r.rule.tokenizer_path + ") is not " + url +
               "'s: other ids for the probe text (first at position " + std::to_string(at) +
               ": kvgate " + id_at(ours, at) + ", engine " + id_at(v, at) + ")",
           "set the rule's tokenizerPath to the directory of the engines' own tokenizer.json "
           "(kv_exact must produce the engine's exact ids)");
      break;
    }
  }
  if (!no_info.empty()) {
    std::string urls;
    for (const auto& u : no_info) urls += " " + u;
    if (r.rule.kv_engine_type == rules::EngineType::kSglang || kv_on) {
      warn(s, "no /get_server_info from" + urls + ": model, page size and DP size unchecked there",
           "check by hand that the engines' --page-size and --dp-size are the rule's kvBlockSize "
           "and kvDpRankCount");
    }
  }
  if (!no_tokenize.empty()) {
    std::string urls;
    for (const auto& u : no_tokenize) urls += " " + u;
    s.lines.push_back("note no /v1/tokenize or /tokenize at" + urls +
                      ": the tokenizer is checked through the events in step 5");
  }
  s.measured = "model " + (served.empty() ? std::string("?") : served) + ", page size " +
               (page.empty() ? std::string("?") : page) + ", dp size " +
               (dp.empty() ? std::string("?") : dp) + ", version " +
               (version.empty() ? std::string("?") : version) + "; tokenizer ids " +
               (ids.empty() ? std::string("not reported")
                            : std::to_string(ids.size()) + " endpoint(s) " +
                                  (s.status == Status::kFail ? "checked" : "agree") +
                                  (tok ? " with kvgate's" : "") + " (" +
                                  std::to_string(ids.begin()->second.size()) + " tokens)");
  if (r.model.empty() && !served.empty()) r.model = served;
  co_return s;
}

// ---- step 3: proxy path ------------------------------------------------------------------

awaitable<Step> proxy_path(Run& r) {
  Step s{.number = 3, .name = std::string(kStepNames[3]), .status = Status::kPass};
  int ok = 0;
  if (r.pool->pd()) {
    // A pair per request: as many requests as endpoints, and the pairs they took.
    std::map<std::string, int> used;
    for (size_t i = 0; i < r.workers.size(); ++i) {
      std::string body = r.completion_body("kvgate doctor: proxy path " + r.next_nonce());
      const std::string_view no_pin;
      auto a = co_await through(r, std::move(body), no_pin, "/v1/completions");
      if (!ok_answer(a)) {
        fail(s, "a request through the gateway failed: " + call_error(a),
             "fix what the answer names (kvgate's log has the request under its x-request-id)");
        continue;
      }
      ++ok;
      ++used[std::string(a.header("x-kvgate-prefill-worker")) + " -> " +
             std::string(a.header("x-kvgate-worker"))];
    }
    for (const auto& [pair, n] : used) {
      s.lines.push_back("ok   " + pair + ": " + std::to_string(n) + " request(s)");
    }
    s.measured = std::to_string(ok) + " of " + std::to_string(r.workers.size()) +
                 " prefill/decode requests through the gateway succeeded";
    co_return s;
  }
  for (const auto& w : r.workers) {
    auto t0 = Clock::now();
    std::string body = r.completion_body("kvgate doctor: proxy path " + r.next_nonce());
    auto a = co_await through(r, std::move(body), w->url(), "/v1/completions");
    auto took = std::chrono::duration_cast<milliseconds>(Clock::now() - t0);
    if (!ok_answer(a)) {
      std::string state = w->healthy() ? "healthy" : "unhealthy";
      state += ", breaker " + std::string(to_string(w->breaker().state()));
      fail(s, w->url() + " (" + state + "): " + call_error(a),
           w->healthy()
               ? "fix what the answer names (kvgate's log has the request under its x-request-id)"
               : "the gateway's health check marks " + w->url() +
                     " unhealthy: make its health endpoint answer, or check "
                     "--health-check-endpoint and the health thresholds");
      continue;
    }
    if (a.header("x-kvgate-worker") != w->url()) {
      fail(s,
           w->url() + ": the answer came from " + std::string(a.header("x-kvgate-worker")) +
               " instead",
           "report this: a request pinned by the doctor must reach its worker");
      continue;
    }
    ++ok;
    s.lines.push_back("ok   " + w->url() + ": through the gateway in " + ms_text(took));
  }
  s.measured = std::to_string(ok) + " of " + std::to_string(r.workers.size()) +
               " endpoints served a request through the gateway (kv_exact bypassed)";
  co_return s;
}

// ---- step 4: event plane -----------------------------------------------------------------

struct SourceView {
  kv::SourceSpec spec;
  kv::SourceStatus status;
};

std::vector<SourceView> sources_of(const KvExactPolicy& kv) {
  std::vector<SourceView> out;
  for (auto& [spec, st] : kv.sources()) out.push_back({spec, st});
  std::sort(out.begin(), out.end(), [](const SourceView& a, const SourceView& b) {
    return std::tie(a.spec.endpoint, a.spec.rank) < std::tie(b.spec.endpoint, b.spec.rank);
  });
  return out;
}

std::string where(const kv::SourceSpec& s) {
  return s.endpoint + " rank " + std::to_string(s.rank) + " (" + s.pub + ")";
}

std::string skip_reason() {
  return "kv_exact is off for this rule (kvExactMode 0): no event plane, no inventory";
}

// A request straight to each (endpoint, rank) of `which`, several pages long and unique, so that
// each rank stores blocks and publishes them.
awaitable<void> probe_ranks(Run& r, const std::vector<SourceView>& which, Step& s) {
  if (r.pool->pd()) {
    // A prefill server alone cannot run a request: pairs through the gateway, twice as many as
    // ranks to warm (kv_exact, or the P/D ladder, spreads them).
    for (size_t i = 0; i < 2 * which.size(); ++i) {
      std::string text = "kvgate doctor: warm rank " + r.next_nonce() + ".";
      while (text.size() < 40 * static_cast<size_t>(std::max<int64_t>(1, r.rule.kv_block_size)))
        text += " The quick brown fox jumps over the lazy dog.";
      std::string body = r.chat_body(text);
      auto a = co_await through(r, std::move(body));
      if (!ok_answer(a)) s.lines.push_back("note a warm request failed: " + call_error(a));
    }
    co_return;
  }
  auto all = sources_of(*r.kv);
  for (const auto& src : which) {
    const Worker* w = nullptr;
    for (const auto& x : r.workers) {
      if (x->url() == src.spec.endpoint) w = x.get();
    }
    if (!w) continue;
    // Several pages (about 4 characters a token).
    std::string text = "kvgate doctor: warm rank " + r.next_nonce() + ".";
    const size_t chars = std::min<size_t>(
        8000, 40 * static_cast<size_t>(std::max<int64_t>(1, r.rule.kv_block_size)) + 200);
    while (text.size() < chars) text += " The quick brown fox jumps over the lazy dog.";
    size_t ranks = 0;
    for (const auto& other : all) ranks += other.spec.endpoint == src.spec.endpoint ? 1 : 0;
    int rank = ranks > 1 ? src.spec.rank : -1;  // a one-rank engine gets no rank field
    const std::string body = r.chat_body(text, rank);
    auto a = co_await r.direct(*w, "POST", "/v1/chat/completions", body);
    if (!ok_answer(a)) {
      s.lines.push_back("note the request to " + where(src.spec) + " failed: " + call_error(a));
    }
  }
}

awaitable<Step> event_plane(Run& r) {
  Step s{.number = 4, .name = std::string(kStepNames[4]), .status = Status::kPass};
  const KvExactPolicy& kv = *r.kv;
  // The rule against what each engine says it publishes.
  for (const auto& w : r.workers) {
    auto info = w->kv_events();
    const rules::Endpoint* ep = nullptr;
    for (const auto& e : r.rule.endpoints) {
      if (e.url == w->url()) ep = &e;
    }
    int64_t rule_port = ep && ep->kv_zmq_port ? *ep->kv_zmq_port : r.rule.kv_zmq_port;
    if (!info) {
      auto it = r.server_info.find(w->url());
      if (it == r.server_info.end()) {
        auto si = co_await read_server_info(r, *w);
        if (si) it = r.server_info.emplace(w->url(), *si).first;
      }
      if (it != r.server_info.end() && it->second.contains("kv_events_config") &&
          it->second["kv_events_config"].is_null()) {
        fail(s, w->url() + " reports no kv_events_config: its KV events are off",
             "start the engine with --kv-events-config '{\"publisher\":\"zmq\",\"endpoint\":"
             "\"tcp://*:" +
                 std::to_string(rule_port) + "\"}'");
      }
      continue;
    }
    if (info->port_base != rule_port) {
      fail(s,
           "the rule says kvZmqPort " + std::to_string(rule_port) + ", " + w->url() +
               " publishes rank 0 on " + std::to_string(info->port_base) +
               " (kv_events of its /get_server_info)",
           "set kvZmqPort to " + std::to_string(info->port_base));
    }
    if (info->dp_size != r.rule.kv_dp_rank_count) {
      fail(s,
           w->url() + " publishes " + std::to_string(info->dp_size) +
               " rank(s), the rule's kvDpRankCount is " + std::to_string(r.rule.kv_dp_rank_count),
           "set kvDpRankCount to " + std::to_string(info->dp_size));
    }
    if (info->host.empty() || info->host == "*" || info->host == "0.0.0.0" || info->host == "::") {
      warn(s,
           w->url() + "'s publishers listen on every address (tcp://" +
               (info->host.empty() ? std::string("*") : info->host) + ":" +
               std::to_string(info->port_base) +
               "): whoever reaches that host can read its KV events; kvgate cannot tell from "
               "here whether a firewall limits them to the gateways: judge it",
           "restrict the event ports to the gateways (firewall or network policy), or bind "
           "the publisher to the gateway-facing address");
    }
  }
  auto sources = sources_of(kv);
  if (sources.empty()) {
    fail(s, "kv_exact follows no (endpoint, rank)", "give the rule endpoints");
    co_return s;
  }
  // Reachable, then connected.
  for (const auto& src : sources) {
    std::string why =
        co_await tcp_reachable(r.ex, src.spec.pub, std::min(r.opt.settle, milliseconds(3000)));
    if (!why.empty()) {
      fail(s, "nothing accepts connections at " + where(src.spec) + ": " + why,
           "start the engine with --kv-events-config (publisher zmq) on that port, or set "
           "kvZmqPort (per endpoint: kvZmqPort of the endpoint) to the port it publishes on");
    }
  }
  if (s.status == Status::kFail) {
    s.measured = std::to_string(sources.size()) + " (endpoint, rank) publishers expected";
    co_return s;
  }
  co_await wait_until(r, r.opt.settle, [&] {
    for (const auto& src : sources_of(kv)) {
      if (!src.status.connected) return false;
    }
    return true;
  });
  // A request to each rank directly: its events must arrive.
  // What changed during this step is judged, not what the sources saw since the pool was built
  // (an old bad batch, an engine build long gone).
  std::map<kv::SourceId, uint64_t> before, errors_before;
  std::map<kv::SourceId, KvExactPolicy::SourceCounts> counts_before;
  for (const auto& src : sources_of(kv)) {
    before[src.spec.id] = src.status.messages;
    errors_before[src.spec.id] = src.status.decode_errors;
    counts_before[src.spec.id] = kv.counts(src.spec.id);
  }
  co_await probe_ranks(r, sources, s);
  co_await wait_until(r, r.opt.settle, [&] {
    for (const auto& src : sources_of(kv)) {
      if (src.status.messages <= before[src.spec.id]) return false;
    }
    return true;
  });
  uint64_t checked = 0, mismatched = 0;
  bool map_shaped = false;
  for (const auto& src : sources_of(kv)) {
    auto c = kv.counts(src.spec.id);
    const auto& c0 = counts_before[src.spec.id];
    checked += c.hash_checked >= c0.hash_checked ? c.hash_checked - c0.hash_checked : 0;
    mismatched +=
        c.hash_mismatched >= c0.hash_mismatched ? c.hash_mismatched - c0.hash_mismatched : 0;
    map_shaped = map_shaped || c.map_batches > c0.map_batches;
    // (A source whose spec changed meanwhile starts its counts again.)
    const uint64_t e0 = errors_before[src.spec.id];
    const uint64_t decode_errors =
        src.status.decode_errors >= e0 ? src.status.decode_errors - e0 : src.status.decode_errors;
    if (!src.status.connected) {
      fail(s, "the subscriber of " + where(src.spec) + " is not connected",
           "make the publisher reachable from the gateway (address, port, firewall)");
      continue;
    }
    if (c.page_size_mismatch) {
      fail(s,
           where(src.spec) + ": its events carry " + std::to_string(c.engine_block_size) +
               "-token pages, the rule's kvBlockSize is " + std::to_string(r.rule.kv_block_size) +
               " (kv_exact leaves the rank out)",
           "set kvBlockSize to " + std::to_string(c.engine_block_size) +
               " (the engines' --page-size)");
    }
    if (decode_errors > 0) {
      fail(s,
           where(src.spec) + ": " + std::to_string(decode_errors) +
               " message(s) during the check could not be decoded as KV events",
           "point kvZmqPort at the engine's KV event publisher (another service answers there), "
           "or upgrade kvgate for this engine build");
    }
    if (src.status.messages <= before[src.spec.id] && r.pool->pd()) {
      warn(s,
           where(src.spec) +
               ": connected, but no event arrived after the requests through the "
               "gateway (with prefill/decode the doctor cannot aim at a rank)",
           "send traffic and run the doctor again; check the engine's --kv-events-config if it "
           "stays silent");
      continue;
    }
    if (src.status.messages <= before[src.spec.id]) {
      fail(s,
           where(src.spec) +
               ": connected, but no event arrived after a request to this rank "
               "(sequence " +
               (src.status.messages ? std::to_string(src.status.last_seq) : "none") + ")",
           "check the engine's --kv-events-config endpoint and topic: kvgate subscribes to "
           "port kvZmqPort + rank");
      continue;
    }
    s.lines.push_back("ok   " + where(src.spec) + ": connected, sequence at " +
                      std::to_string(src.status.last_seq) + ", " +
                      std::to_string(src.status.messages) + " batches");
  }
  const bool sglang = r.rule.kv_engine_type == rules::EngineType::kSglang;
  if (map_shaped && sglang) {
    fail(
        s,
        "the events arrive in vLLM's shape (batches as maps), not SGLang's, though kvEngineType "
        "is sglang" +
            (mismatched ? " (and " + std::to_string(mismatched) + " of " + std::to_string(checked) +
                              " block ids are not SGLang's hashes of their tokens)"
                        : std::string()),
        "set kvEngineType to vllm (or make the engine publish SGLang's format)");
  } else if (mismatched > 0) {
    fail(s,
         std::to_string(mismatched) + " of " + std::to_string(checked) +
             " block ids the engines published are not kvHashAlgo's hashes of their tokens",
         std::string("set kvEngineType (and kvHashAlgo) to the engine's: ") +
             (sglang ? "the ids are not sha256_sglang; is the engine vLLM (sha256_cbor)?"
                     : "the ids are not sha256_cbor; is the engine SGLang (sha256_sglang)?"));
  }
  s.measured = std::to_string(sources.size()) + " (endpoint, rank) publishers: reachable, " +
               (s.status == Status::kFail ? "not all healthy" : "connected, sequences advancing") +
               "; " + std::to_string(checked) + " block ids hash-checked, " +
               std::to_string(mismatched) + " mismatched";
  co_return s;
}

// ---- step 5: kv_exact --------------------------------------------------------------------

// kv_exact's tokenizer parity probe of every connected (endpoint, rank), run again now: what
// did not match, each with its first differing token.
// What kv_exact's tokenizer parity probes of the connected ranks, run again now, found.
struct ParityCheck {
  bool ran = false;                   // false: nothing to probe (no tokenizer, probes off, none
  std::string why_not;                //   connected): why_not says
  std::vector<std::string> failures;  // ranks whose ids differ, or whose probe failed
  std::vector<std::string> pending;   // ranks whose probe had not answered by the limit
};

awaitable<ParityCheck> parity_check(Run& r) {
  const KvExactPolicy& kv = *r.kv;
  ParityCheck out;
  // Each connected rank's count of probe results now: the answer to this request is a newer one,
  // or two newer when a probe was already running (its result predates the request).
  std::map<kv::SourceId, uint64_t> want;
  for (const auto& src : sources_of(kv)) {
    if (!src.status.connected) continue;
    auto p = kv.parity(src.spec.id);
    if (p.state == "off") {
      out.why_not = "tokenizer parity probes are off: " + p.detail;
      co_return out;
    }
    want[src.spec.id] = p.probes_done + (p.state == "pending" ? 2 : 1);
  }
  if (want.empty()) {
    out.why_not = "no connected rank to probe";
    co_return out;
  }
  out.ran = true;
  kv.request_parity_probes();
  // kv_exact probes two ranks at a time, each with up to 30 s for its answer and 5 s for its
  // events, launched on its 1-second period: a busy pool gets that long per round.
  auto answered = [&] {
    for (const auto& src : sources_of(kv)) {
      auto it = want.find(src.spec.id);
      if (it == want.end() || !src.status.connected) continue;  // gone meanwhile: not awaited
      if (kv.parity(src.spec.id).probes_done < it->second) return false;
    }
    return true;
  };
  const auto rounds = static_cast<int64_t>((want.size() + 1) / 2);
  const milliseconds limit = std::min<milliseconds>(
      std::max<milliseconds>(r.opt.settle, std::chrono::seconds(37) * rounds),
      std::chrono::minutes(3));
  co_await wait_until(r, limit, answered);
  for (const auto& src : sources_of(kv)) {
    auto it = want.find(src.spec.id);
    if (it == want.end()) continue;
    auto p = kv.parity(src.spec.id);
    if (!src.status.connected) {
      out.pending.push_back(where(src.spec) + " disconnected during its parity probe");
    } else if (p.probes_done < it->second) {
      out.pending.push_back("the tokenizer parity probe of " + where(src.spec) +
                            " gave no answer within " + ms_text(limit) + " (state " + p.state +
                            ")");
    } else if (p.state == "mismatch" || p.state == "not_found" || p.state == "error") {
      out.failures.push_back("tokenizer or chat template (parity probe of " + where(src.spec) +
                             ": " + p.state + "): " + p.detail);
    }
  }
  co_return out;
}

// The likely causes of kv_exact not matching, from its own self-checks (parity probes run now).
awaitable<std::vector<std::string>> diagnose(Run& r) {
  const KvExactPolicy& kv = *r.kv;
  std::vector<std::string> causes;
  for (const auto& src : sources_of(kv)) {
    auto c = kv.counts(src.spec.id);
    if (c.page_size_mismatch) {
      causes.push_back("page size: " + where(src.spec) + " publishes " +
                       std::to_string(c.engine_block_size) + "-token pages, kvBlockSize is " +
                       std::to_string(r.rule.kv_block_size) + ": set kvBlockSize to " +
                       std::to_string(c.engine_block_size));
    }
    if (c.hash_mismatched) {
      causes.push_back("hash algorithm: " + std::to_string(c.hash_mismatched) + " block ids of " +
                       where(src.spec) + " are not kvHashAlgo's: check kvEngineType/kvHashAlgo");
    }
  }
  auto parity = co_await parity_check(r);
  causes.insert(causes.end(), parity.failures.begin(), parity.failures.end());
  co_return causes;
}

awaitable<Step> kv_exact_step(Run& r) {
  Step s{.number = 5, .name = std::string(kStepNames[5]), .status = Status::kPass};
  const KvExactPolicy& kv = *r.kv;
  const auto& po = r.pool->parse_options();
  if (!po.tokenizer || !po.chat_template) {
    fail(s, "the rule has no tokenizer and chat template: kv_exact keys no request",
         "set tokenizerPath to a directory with the model's tokenizer.json and "
         "tokenizer_config.json (its chat template)");
    co_return s;
  }
  const auto page = static_cast<size_t>(std::max<int64_t>(1, r.rule.kv_block_size));
  kv_parity::Probe probe;
  std::string err;
  const uint64_t nonce = thread_rng().next();  // unique, not secret
  if (!kv_parity::make_probe(*po.tokenizer, *po.chat_template, page, nonce, -1, probe, err,
                             r.env.config->dp_rank_field)) {
    fail(s, "kvgate cannot build a probe: " + err, "check the rule's tokenizer and chat template");
    co_return s;
  }
  const size_t full = probe.ids.size() / page;
  std::string body = r.with_model(probe.body);
  auto first = co_await through(r, body);
  if (!ok_answer(first)) {
    fail(s, "the first probe through the gateway failed: " + call_error(first),
         "fix what the answer names (step 3 proved the plain proxy path)");
    co_return s;
  }
  s.lines.push_back("ok   first probe (" + std::to_string(probe.ids.size()) + " tokens, " +
                    std::to_string(full) +
                    " full pages): " + std::string(first.header("x-kvgate-route")) + " to " +
                    std::string(first.header("x-kvgate-worker")) +
                    (first.header("x-kvgate-dp-rank").empty()
                         ? std::string()
                         : " rank " + std::string(first.header("x-kvgate-dp-rank"))));
  // Its pages must show up in the inventory, stored by the events of the rank that ran it.
  kv::SourceId holder = 0;
  size_t held = 0;
  co_await wait_until(r, r.opt.settle, [&] {
    for (const auto& [src, pages] : kv.held_pages(probe.ids)) {
      if (pages > held) {
        held = pages;
        holder = src;
      }
    }
    return held + 1 >= full && held > 0;
  });
  uint64_t blocks = 0;
  for (const auto& src : sources_of(kv)) blocks += kv.inventory().blocks(src.spec.id, true);
  std::optional<SourceView> holder_view;
  for (const auto& src : sources_of(kv)) {
    if (src.spec.id == holder) holder_view = src;
  }
  auto give_cause = [&](std::string line, const std::vector<std::string>& causes) {
    if (causes.empty()) {
      fail(s, std::move(line),
           "compare kvgate's ids with the engine's (kvgate tokenize, and the engine's "
           "/tokenize) and the events' block_size; kvgate's log names what it saw");
      return;
    }
    fail(s, std::move(line) + "; likely cause: " + causes[0], causes[0]);
    for (size_t i = 1; i < causes.size(); ++i) s.lines.push_back("     also: " + causes[i]);
  };
  if (!holder_view) {
    auto causes = co_await diagnose(r);
    give_cause("no (endpoint, rank) holds the probe's pages under kvgate's keys after " +
                   ms_text(r.opt.settle) + " (the inventory holds " + std::to_string(blocks) +
                   " blocks)",
               causes);
    s.measured = "0 of " + std::to_string(full) + " probe pages found in the inventory";
    co_return s;
  }
  // kv_exact routes to a rank once it trusts it (kvWarmupSec, or blocks held: checked each
  // second).
  kv::SourceId trusted_id = holder_view->spec.id;
  bool trusted = co_await wait_until(r, r.opt.settle, [&] { return kv.ready(trusted_id); });
  if (!trusted) {
    fail(s,
         where(holder_view->spec) +
             " holds the probe's pages but kv_exact does not trust it "
             "yet after " +
             ms_text(r.opt.settle),
         "wait for the warmup (kvWarmupSec " + std::to_string(r.rule.kv_warmup_sec) +
             " s, or blocks held) and run the doctor again");
    co_return s;
  }
  // Whether the holder was busy when the repeat was routed: kv_exact weighs load against the
  // pages held, so a busy holder may rightly lose a short probe to an idle rank.
  auto load = kv.counts(trusted_id);
  auto second = co_await through(r, body);
  auto load_after = kv.counts(trusted_id);
  const bool holder_busy = load.active > 0 || load.pending_prefill > 0 || load_after.active > 1 ||
                           load_after.pending_prefill > 0;
  if (!ok_answer(second)) {
    fail(s, "the second probe through the gateway failed: " + call_error(second),
         "fix what the answer names");
    co_return s;
  }
  std::string route(second.header("x-kvgate-route"));
  std::string worker(second.header("x-kvgate-worker"));
  std::string rank(second.header("x-kvgate-dp-rank"));
  bool reports_cache = false;
  {
    auto it = r.server_info.find(holder_view->spec.endpoint);
    if (it == r.server_info.end()) {
      const Worker* hw = nullptr;
      for (const auto& x : r.workers) {
        if (x->url() == holder_view->spec.endpoint) hw = x.get();
      }
      if (hw) {
        auto si = co_await read_server_info(r, *hw);
        if (si) it = r.server_info.emplace(hw->url(), *si).first;
      }
    }
    if (it != r.server_info.end()) {
      auto f = it->second.find("enable_cache_report");
      reports_cache = f != it->second.end() && f->is_boolean() && f->get<bool>();
    }
  }
  auto cached = cached_tokens(second.body, reports_cache);
  std::string at = worker + (rank.empty() ? "" : " rank " + rank);
  const bool elsewhere = worker != holder_view->spec.endpoint ||
                         (!rank.empty() && rank != std::to_string(holder_view->spec.rank));
  // Load can only move a repeat that matched: a kv_exact_balance (an idle rank beat the holder)
  // or a hit on another holder. A miss matched nothing anywhere, whatever the load.
  if (holder_busy &&
      (route == "kv_exact/kv_exact_balance" || (route == "kv_exact/kv_exact_hit" && elsewhere))) {
    warn(s,
         "the repeated probe went to " + at + " (" + route + ") while " + where(holder_view->spec) +
             ", which holds " + std::to_string(held) +
             " of its pages, was busy (kv_exact weighs load against cached pages)",
         "run the doctor when the pool is quieter to prove the hit; nothing says it is wrong");
  } else if (route != "kv_exact/kv_exact_hit") {
    auto causes = co_await diagnose(r);
    give_cause("the repeated probe was not a kv_exact hit (" + route + " to " + at + ") though " +
                   where(holder_view->spec) + " holds " + std::to_string(held) + " of its pages",
               causes);
  } else if (elsewhere) {
    fail(s,
         "the repeated probe hit " + at + ", but the events stored its pages on " +
             where(holder_view->spec),
         "report this with kvgate's log: the inventory and the decision disagree");
  } else if (!cached) {
    warn(s,
         "kv_exact hit " + at + " with " + std::to_string(held) +
             " pages, but the engine reported no cached_tokens to confirm it",
         "report cached tokens so hits can be confirmed: SGLang --enable-cache-report, vLLM "
         "--enable-prompt-tokens-details");
  } else if (*cached <= 0) {
    auto causes = co_await diagnose(r);
    give_cause("kv_exact hit " + at + " expecting " + std::to_string(held * page) +
                   " cached tokens, the engine reported 0",
               causes);
  } else {
    s.lines.push_back("ok   second probe: kv_exact hit on " + at + ", " + std::to_string(held) +
                      " pages expected (" + std::to_string(held * page) +
                      " tokens), engine reported " + std::to_string(*cached) + " cached");
  }
  if (s.status != Status::kFail) {
    // One rank proven; the others must produce kvgate's ids too (a pool with one odd engine
    // passes the probe whenever it lands elsewhere).
    auto parity = co_await parity_check(r);
    for (const auto& p : parity.failures) {
      fail(s, p,
           "serve the rule's tokenizer and chat template on every engine (tokenizerPath must be "
           "the engines' own model directory)");
    }
    for (const auto& p : parity.pending) {
      warn(s, p, "run the doctor again when the pool is quieter to finish the parity check");
    }
    if (!parity.ran) {
      s.lines.push_back("note tokenizer parity probe not run: " + parity.why_not);
    } else if (parity.failures.empty() && parity.pending.empty()) {
      s.lines.emplace_back("ok   tokenizer parity probe: every rank matches");
    }
  }
  s.measured = "probe of " + std::to_string(full) + " pages: " + std::to_string(held) +
               " stored by " + where(holder_view->spec) + "; repeat routed " + route + " to " + at +
               ", cached_tokens " + (cached ? std::to_string(*cached) : "not reported");
  co_return s;
}

// ---- step 6: inventory readiness ---------------------------------------------------------

awaitable<Step> inventory_step(Run& r) {
  Step s{.number = 6, .name = std::string(kStepNames[6]), .status = Status::kPass};
  const KvExactPolicy& kv = *r.kv;
  uint64_t total = 0;
  size_t ready = 0;
  // Warm traffic first, to every rank holding nothing yet (steps 4 and 5 sent some).
  std::vector<SourceView> empty;
  for (const auto& src : sources_of(kv)) {
    if (kv.inventory().blocks(src.spec.id, true) == 0) empty.push_back(src);
  }
  if (!empty.empty()) {
    co_await probe_ranks(r, empty, s);
    co_await wait_until(r, r.opt.settle, [&] {
      for (const auto& src : empty) {
        if (kv.inventory().blocks(src.spec.id, true) == 0) return false;
      }
      return true;
    });
  }
  auto sources = sources_of(kv);
  auto now = std::chrono::system_clock::now();
  for (const auto& src : sources) {
    uint64_t blocks = kv.inventory().blocks(src.spec.id, true);
    total += blocks;
    bool trusted = kv.ready(src.spec.id);
    ready += trusted ? 1 : 0;
    std::string age =
        src.status.messages
            ? std::to_string(
                  std::chrono::duration_cast<milliseconds>(now - src.status.last_message).count()) +
                  " ms ago"
            : "never";
    std::string line = where(src.spec) + ": " + std::to_string(blocks) + " blocks, last event " +
                       age + ", " + (trusted ? "trusted" : "warming up");
    if (blocks == 0) {
      fail(s, line + ": no blocks after warm traffic",
           "connected subscribers receive no stored events: check the engine's KV event "
           "settings (and step 4)");
    } else if (!trusted) {
      warn(s, line,
           "wait: a rank is trusted once it holds blocks or has been connected kvWarmupSec (" +
               std::to_string(r.rule.kv_warmup_sec) + " s); until then misses use the fallback");
    } else {
      s.lines.push_back("ok   " + line);
    }
  }
  s.measured = std::to_string(total) + " blocks over " + std::to_string(sources.size()) +
               " (endpoint, rank); " + std::to_string(ready) + " trusted";
  co_return s;
}

// ---- step 7: selector --------------------------------------------------------------------

std::string selector_settings(const rules::Rule& rule) {
  const GatewayConfig& k = rule.policy_knobs;
  std::string sel = rule.sel;
  std::string out = "fallback selector " + sel;
  char buf[64];
  if (sel == "chwbl") {
    std::snprintf(buf, sizeof buf, "%.2f", k.chwbl_load_factor);
    out += " (bounded load: chwblLoadFactor " + std::string(buf) + ")";
  } else if (sel == "prefix_hash") {
    std::snprintf(buf, sizeof buf, "%.2f", k.prefix_hash_load_factor);
    out += " (bounded load: prefixHashLoadFactor " + std::string(buf) + ")";
  } else if (sel == "cache_aware") {
    std::snprintf(buf, sizeof buf, "%.2f", k.balance_rel_threshold);
    out += " (balance: balanceAbsThreshold " + std::to_string(k.balance_abs_threshold) +
           ", balanceRelThreshold " + buf + ")";
  } else {
    out += " (no bounded-load setting)";
  }
  return out;
}

awaitable<Step> selector_step(Run& r) {
  Step s{.number = 7, .name = std::string(kStepNames[7]), .status = Status::kPass};
  size_t n = r.opt.concurrency > 0
                 ? static_cast<size_t>(r.opt.concurrency)
                 : std::min<size_t>(64, 4 * std::max<size_t>(1, r.workers.size()));
  std::vector<std::string> bodies;
  for (size_t i = 0; i < n; ++i) {
    bodies.push_back(
        r.chat_body("kvgate doctor: selector probe " + r.next_nonce() + " " + std::to_string(i)));
  }
  auto results = co_await through_all(r, std::move(bodies));
  std::map<std::string, int> per_worker;
  for (const auto& w : r.workers) {
    if (r.pool->role(*w) != rules::Role::kPrefill) per_worker[w->url()] = 0;
  }
  std::map<std::string, int> branches;
  int failed = 0;
  std::string failure;
  for (const auto& a : results) {
    if (!ok_answer(a)) {
      ++failed;
      if (failure.empty()) failure = call_error(a);
      continue;
    }
    ++per_worker[std::string(a.header("x-kvgate-worker"))];
    ++branches[std::string(a.header("x-kvgate-route"))];
  }
  int most = 0, total = 0;
  for (const auto& [url, c] : per_worker) {
    most = std::max(most, c);
    total += c;
    s.lines.push_back("     " + url + ": " + std::to_string(c) + " of " + std::to_string(n));
  }
  double mean = per_worker.empty() ? 0 : static_cast<double>(total) / per_worker.size();
  double spread = mean > 0 ? most / mean : 0;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", spread);
  std::string branch_text;
  for (const auto& [b, c] : branches) branch_text += " " + b + "=" + std::to_string(c);
  s.measured = selector_settings(r.rule) + "; " + std::to_string(n) +
               " concurrent unique requests: spread max/mean " + buf + ", branches" + branch_text;
  if (failed > 0) {
    fail(s,
         std::to_string(failed) + " of " + std::to_string(n) +
             " concurrent requests failed: " + failure,
         "fix what the answers name (admission limits: --max-concurrent-requests, "
         "--queue-size)");
  } else if (per_worker.size() > 1 && std::any_of(per_worker.begin(), per_worker.end(),
                                                  [](auto& e) { return e.second == 0; })) {
    warn(s, "an endpoint took none of the concurrent requests",
         "judge whether the fallback selector's spread suits your traffic (round_robin spreads "
         "cold requests evenly; chwbl keeps prompt families together up to its load bound)");
  } else if (spread > 2.0) {
    warn(s, std::string("spread max/mean ") + buf + " under concurrency",
         "lower the bounded-load factor for a tighter spread, or pick round_robin");
  }
  co_return s;
}

}  // namespace

std::string_view to_string(Status s) {
  switch (s) {
    case Status::kPass:
      return "PASS";
    case Status::kWarn:
      return "WARN";
    case Status::kFail:
      return "FAIL";
    case Status::kSkip:
      return "SKIP";
  }
  return "?";
}

bool Report::ok() const {
  return failed_step() == 0;
}

int Report::failed_step() const {
  for (const auto& s : steps) {
    if (s.status == Status::kFail) return s.number;
  }
  return 0;
}

bool parse_steps(std::string_view text, int& first, int& last) {
  auto digit = [](char c) { return c >= '1' && c <= '7'; };
  if (text.size() == 1 && digit(text[0])) {
    first = last = text[0] - '0';
    return true;
  }
  if (text.size() == 3 && digit(text[0]) && text[1] == '-' && digit(text[2]) &&
      text[0] <= text[2]) {
    first = text[0] - '0';
    last = text[2] - '0';
    return true;
  }
  return false;
}

std::string self_target(const GatewayConfig& config, uint16_t bound_port, http::Target& out) {
  std::string host = config.host;
  if (host.empty() || host == "0.0.0.0") host = "127.0.0.1";
  if (host == "::" || host == "[::]") host = "::1";
  bool v6 = host.find(':') != std::string::npos;
  std::string url = "http://" + (v6 ? "[" + host + "]" : host) + ":" + std::to_string(bound_port);
  if (std::string e = http::parse_url(url, out); !e.empty()) return e;
  return http::resolve(out);
}

awaitable<Report> run(Env env, std::string rule_name, Options options) {
  Report report;
  report.rule = rule_name;
  // (No co_await inside the aggregate's initializer: GCC 12 builds such a frame wrongly.)
  Executor ex = co_await asio::this_coro::executor;
  Run r{.env = env, .opt = options, .ex = ex};
  r.table = env.pools->table();
  for (const auto& p : r.table->pools) {
    if (p->name() == rule_name) r.pool = p;
  }
  if (!r.pool) {
    report.steps.push_back(Step{.number = options.first,
                                .name = std::string(kStepNames[options.first]),
                                .status = Status::kFail,
                                .measured = "no rule named '" + rule_name + "'",
                                .fix = "check the name (GET /v1/rules): it may have been "
                                       "deleted or renamed"});
    co_return report;
  }
  r.rule = r.pool->rule();
  r.workers = r.pool->workers()->workers;
  r.kv = dynamic_cast<const KvExactPolicy*>(&r.pool->policy());
  if (!r.rule.models.empty()) r.model = r.rule.models[0];
  r.nonce = thread_rng().next();
  env.key->arm();
  struct Disarm {
    DoctorKey* key;
    ~Disarm() { key->disarm(); }
  } disarm{env.key};
  const auto started = Clock::now();
  // Workers just added (a rule change) are unhealthy until their first health check passes: the
  // steps through the gateway wait for them, up to a settle.
  if (options.last >= 3) {
    co_await wait_until(r, std::min<milliseconds>(r.opt.settle, std::chrono::seconds(30)), [&] {
      return std::all_of(r.workers.begin(), r.workers.end(),
                         [](const WorkerPtr& w) { return w->healthy(); });
    });
  }
  std::string stop_reason;
  for (int n = options.first; n <= options.last; ++n) {
    if (stop_reason.empty()) {
      if (report.failed_step() != 0) {
        stop_reason = "not run: step " + std::to_string(report.failed_step()) + " failed";
      } else if ((options.cancelled && options.cancelled()) ||
                 (options.limit.count() > 0 && Clock::now() - started > options.limit)) {
        // Unfinished is not passed: the steps left are what nobody checked.
        const bool gone = options.cancelled && options.cancelled();
        report.steps.push_back(Step{
            .number = n,
            .name = std::string(kStepNames[n]),
            .status = Status::kFail,
            .measured =
                gone ? "the run stopped: its client went away"
                     : "the run stopped: its time limit (" + ms_text(options.limit) + ") passed",
            .fix = "run the doctor again (steps " + std::to_string(n) + "-" +
                   std::to_string(options.last) + " were not checked)"});
        stop_reason = "not run: the run stopped";
        continue;
      } else if (env.pools->table()->find(rule_name) != r.pool.get()) {
        // Its requests would go through the new pool while this one's state is read.
        report.steps.push_back(Step{.number = n,
                                    .name = std::string(kStepNames[n]),
                                    .status = Status::kFail,
                                    .measured = "the rule changed (or went) during the run",
                                    .fix = "run the doctor again on the rule in force"});
        stop_reason = "not run: the rule changed";
        continue;
      }
    }
    if (!stop_reason.empty()) {
      report.steps.push_back(Step{.number = n,
                                  .name = std::string(kStepNames[n]),
                                  .status = Status::kSkip,
                                  .measured = stop_reason});
      continue;
    }
    Step s;
    if (n >= 4 && n <= 6 && !r.kv) {
      s = Step{.number = n,
               .name = std::string(kStepNames[n]),
               .status = Status::kSkip,
               .measured = skip_reason()};
    } else {
      switch (n) {
        case 1:
          s = co_await model_readiness(r);
          break;
        case 2:
          s = co_await pool_homogeneity(r);
          break;
        case 3:
          s = co_await proxy_path(r);
          break;
        case 4:
          s = co_await event_plane(r);
          break;
        case 5:
          s = co_await kv_exact_step(r);
          break;
        case 6:
          s = co_await inventory_step(r);
          break;
        default:
          s = co_await selector_step(r);
          break;
      }
    }
    report.steps.push_back(std::move(s));
  }
  if (report.ok() && env.pools->table()->find(rule_name) != r.pool.get() && !report.steps.empty()) {
    // Changed during the last step: what it measured mixed the old pool and the new.
    Step& last = report.steps.back();
    fail(last, "the rule changed (or went) during this step",
         "run the doctor again on the rule in force");
  }
  co_return report;
}

nlohmann::ordered_json to_json(const Report& r) {
  Json steps = Json::array();
  for (const auto& s : r.steps) {
    steps.push_back(Json{{"step", s.number},
                         {"name", s.name},
                         {"status", to_string(s.status)},
                         {"measured", s.measured},
                         {"fix", s.fix.empty() ? Json(nullptr) : Json(s.fix)},
                         {"details", s.lines}});
  }
  return Json{{"rule", r.rule},
              {"ok", r.ok()},
              {"failed_step", r.failed_step() ? Json(r.failed_step()) : Json(nullptr)},
              {"steps", std::move(steps)}};
}

std::string format_text(const nlohmann::ordered_json& report) {
  std::string out = "rule " + report.value("rule", std::string("?")) + "\n";
  for (const auto& s : report.value("steps", Json::array())) {
    out += "  " + s.value("status", std::string("?")) + "  " + std::to_string(s.value("step", 0)) +
           " " + s.value("name", std::string()) + ": " + s.value("measured", std::string()) + "\n";
    for (const auto& line : s.value("details", Json::array())) {
      if (line.is_string()) out += "          " + line.get<std::string>() + "\n";
    }
    if (s.contains("fix") && s["fix"].is_string()) {
      out += "        fix: " + s["fix"].get<std::string>() + "\n";
    }
  }
  bool ok = report.value("ok", false);
  int warnings = 0;
  for (const auto& s : report.value("steps", Json::array())) {
    warnings += s.value("status", std::string()) == "WARN" ? 1 : 0;
  }
  if (!ok) {
    out += "  stopped at step " + std::to_string(report.value("failed_step", 0)) + "\n";
  } else if (warnings > 0) {
    out +=
        "  no step failed; " + std::to_string(warnings) + " warning(s) for the operator to judge\n";
  } else {
    out += "  all steps passed\n";
  }
  return out;
}

}  // namespace kvgate::doctor
