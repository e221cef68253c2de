// gateway/admin: see admin.h.
#include "gateway/admin.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <boost/asio/as_tuple.hpp>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "gateway/decision_log.h"
#include "gateway/stats.h"
#include "policy/kv_exact.h"
#include "replica/sync.h"
#include "util/log.h"
#include "workers/health.h"

namespace kvgate {
namespace {

using Json = nlohmann::ordered_json;

constexpr size_t kMaxTrackedAddresses = 4096;
constexpr auto kFailureWindow = std::chrono::seconds(60);

// Coroutine parameters are taken by value: GCC 12 miscompiles a reference parameter bound to a
// caller's temporary in a co_await expression (the coroutine reads it after it is gone).
awaitable<void> reply(http::Exchange& ex, int status, Json body) {
  // (Text from engines, error details, may not be UTF-8: replaced, never a throw.)
  std::string text = status == 204
                         ? std::string()
                         : body.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
  const http::Header h[] = {{"content-type", "application/json"}};
  co_await ex.respond(status, h, text);
}

Json error_json(std::string_view type, std::string_view code, const std::string& message) {
  return Json{{"error", {{"type", type}, {"code", code}, {"message", message}}}};
}

awaitable<void> fail(http::Exchange& ex, int status, std::string code, std::string message) {
  Json body = error_json(status >= 500 ? "server_error" : "invalid_request_error", code, message);
  co_await reply(ex, status, std::move(body));
}

// 400 with every error of a rule, each naming its field, value and message.
awaitable<void> rule_errors(http::Exchange& ex, std::vector<rules::FieldError> errors) {
  Json details = Json::array();
  for (const auto& e : errors) {
    details.push_back({{"field", e.field}, {"value", e.value}, {"message", e.message}});
  }
  std::string message = std::to_string(errors.size()) +
                        (errors.size() == 1 ? " error" : " errors") +
                        " in the rule: " + rules::format_errors(errors);
  while (!message.empty() && message.back() == '\n') message.pop_back();
  Json body = error_json("invalid_request_error", "invalid_rule", message);
  body["error"]["details"] = std::move(details);
  co_await reply(ex, 400, std::move(body));
}

Json rule_json(const rules::Rule& r) {
  return Json::parse(rules::to_json(r));
}

Json rule_or_null(const std::shared_ptr<const rules::Rule>& r) {
  return r ? rule_json(*r) : Json(nullptr);
}

// RFC 3339, UTC, to the millisecond: 2025-01-31T12:00:00.000Z.
std::string rfc3339(std::chrono::system_clock::time_point t) {
  std::time_t secs = std::chrono::system_clock::to_time_t(t);
  auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char text[80];
  std::snprintf(text, sizeof text, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms));
  return text;
}

// GET /v1/rules/{name}/history: newest first.
Json history_json(const RuleHistory& h) {
  Json versions = Json::array();
  for (size_t i = h.versions.size(); i-- > 0;) {
    const RuleVersion& version = h.versions[i];
    Json v{{"version", version.version},
           {"time", rfc3339(version.time)},
           {"source", to_string(version.source)},
           {"rule", rule_or_null(version.rule)}};
    if (version.restored) v["restored"] = *version.restored;
    versions.push_back(std::move(v));
  }
  return Json{{"rule", h.name}, {"current", h.current()}, {"versions", std::move(versions)}};
}

using http::percent_decode;
using http::query_param;

// Whether JSON text nests deeper than `limit` (arrays and objects, outside strings). Checked before
// nlohmann parses or prints a body: printing recurses once per level.
bool nests_deeper_than(std::string_view text, int limit) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

constexpr int kMaxBodyDepth = 32;  // a rule nests 4 levels

// Parses a rule body; `name` (from the path) is filled in when the body has none, and must agree
// when it has one.
// The read-only view of a kv_exact rule's inventory: per (endpoint, rank) what its subscriber
// and the inventory know (gateway/stats.h).
Json inventory_json(const std::string& name, const rules::Rule& rule, const KvExactPolicy& kv) {
  return Json{{"rule", name},
              {"kvExactMode", rule.kv_exact_mode},
              {"pageSize", rule.kv_block_size},
              {"inventory", kv_sources_json(kv)}};
}

std::optional<rules::Rule> parse_rule(std::string_view body, std::string_view name,
                                      const GatewayConfig& base,
                                      std::vector<rules::FieldError>& errors) {
  if (nests_deeper_than(body, kMaxBodyDepth)) {
    errors.push_back({.field = "",
                      .value = "",
                      .message = "the body nests deeper than " + std::to_string(kMaxBodyDepth) +
                                 " levels; a rule nests 4"});
    return std::nullopt;
  }
  Json j = Json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    errors.push_back({.field = "",
                      .value = "",
                      .message = "the body must be a JSON object (a rule: {\"name\": ..., "
                                 "\"endpoints\": [...], ...})"});
    return std::nullopt;
  }
  if (!name.empty()) {
    if (!j.contains("name")) {
      j["name"] = name;
    } else if (!j["name"].is_string() || j["name"].get<std::string>() != name) {
      errors.push_back({.field = "name",
                        .value = j["name"].dump(),
                        .message = "differs from the name in the path ('" + std::string(name) +
                                   "'); rename a rule by creating the new one and deleting the "
                                   "old"});
      return std::nullopt;
    }
  }
  return rules::rule_from_json(j.dump(), base, errors);
}

Json worker_json(const Pool& pool, const Worker& w, const rules::Endpoint* ep) {
  Json j{{"id", std::to_string(w.id())},
         {"url", w.url()},
         {"rule", pool.name()},
         {"model_id", pool.rule().models.empty() ? Json(nullptr) : Json(pool.rule().models[0])},
         {"worker_type", role_label(ep ? ep->role : rules::Role::kNone)},
         {"bootstrap_port", ep && ep->bootstrap_port ? Json(*ep->bootstrap_port) : Json(nullptr)},
         {"is_healthy", w.healthy()},
         {"load", w.load()},
         {"circuit_breaker", to_string(w.breaker_state())}};
  return j;
}

const rules::Endpoint* endpoint_of(const Pool& pool, const Worker& w) {
  for (const auto& ep : pool.rule().endpoints) {
    http::Target t;
    if (http::parse_url(ep.url, t).empty() && t.url == w.url()) return &ep;
  }
  return nullptr;
}

}  // namespace

bool is_loopback_address(std::string_view host) {
  if (host == "localhost") return true;
  std::string h(host);
  in_addr v4{};
  if (::inet_pton(AF_INET, h.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (::inet_pton(AF_INET6, h.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;
}

// The host of a Host header value ("127.0.0.1:29001", "[::1]:29001", "localhost").
std::string_view host_of(std::string_view value) {
  if (value.starts_with('[')) {
    size_t close = value.find(']');
    return close == std::string_view::npos ? value : value.substr(1, close - 1);
  }
  size_t colon = value.find(':');
  if (colon != std::string_view::npos && value.find(':', colon + 1) == std::string_view::npos) {
    return value.substr(0, colon);
  }
  return value;
}

AdminApi::AdminApi(const GatewayConfig& config, PoolManager& pools, Hooks hooks)
    : config_(config), pools_(pools), hooks_(std::move(hooks)), key_(config.admin_api_key) {}

awaitable<void> AdminApi::handle(http::Exchange& ex) {
  // Browsers: a web page may send requests to a loopback port (cross-site, or after DNS
  // rebinding). Requests a browser makes carry Origin (or Sec-Fetch-Site); this API answers none
  // of them. Without a key, Host must name a loopback address (a rebound name does not), and
  // bodies must be JSON (a cross-site form or text/plain POST needs no preflight).
  std::string_view path = ex.path();
  std::string_view method = ex.method();
  // The dashboard's routes are the exception, read-only: its page and assets (GET /ui...: any
  // navigation may open them; they carry no data), and GET /v1/stats from the page itself
  // (Sec-Fetch-Site same-origin; "none": typed in the address bar).
  const bool reading = method == "GET" || method == "HEAD";
  const bool ui_page = reading && is_ui_path(path);
  const bool stats = reading && path == "/v1/stats";
  if (!ex.header("origin").empty() || !ex.header("sec-fetch-site").empty()) {
    std::string_view site = ex.header("sec-fetch-site");
    const bool allowed = ui_page || (stats && (site == "same-origin" || site == "none"));
    if (!allowed) {
      co_await fail(ex, 403, "browser_request",
                    "the admin API does not answer browsers (the request carries Origin or "
                    "Sec-Fetch-Site), except the dashboard at GET /ui and its GET /v1/stats from "
                    "the page itself; use curl or a client library");
      co_return;
    }
  }
  if (!key_.set() && !is_loopback_address(host_of(ex.header("host")))) {
    co_await fail(ex, 403, "host_not_loopback",
                  "without an admin key the admin API answers only requests addressed to a "
                  "loopback address (Host: 127.0.0.1); set --admin-api-key-file to use a name");
    co_return;
  }
  if (!ex.body().empty() && !ex.header("content-type").starts_with("application/json")) {
    co_await fail(ex, 415, "unsupported_media_type",
                  "send the body as JSON with 'Content-Type: application/json'");
    co_return;
  }
  auto now = Clock::now();
  const std::string& addr = ex.remote_address();
  // The right key always passes (keys are at least 16 characters: guessing one is hopeless even
  // unthrottled), so nobody sharing the operator's address can lock the operator out; wrong
  // keys from an address that failed too often are refused without counting.
  bool authorized = key_.matches(ex.header("authorization"));
  // The dashboard: its session cookie (GET /ui... and /v1/stats only), or the key given once as
  // /ui?token=KEY, which opens a session and redirects to /ui without the token in the URL.
  std::string_view token = ui_page ? http::query_param(ex.target(), "token") : std::string_view{};
  bool offered_key = !ex.header("authorization").empty() || !token.empty();
  if (!authorized && (ui_page || stats) && key_.set()) {
    authorized = session_valid(ex, now);
  }
  if (!token.empty() && (!key_.set() || key_.matches("Bearer " + http::percent_decode(token)))) {
    // (No key: nothing to check; the token is dropped all the same.)
    failures_.erase(std::string(addr));
    co_await ui_login(ex, now);
    co_return;
  }
  if (!token.empty()) authorized = false;  // a wrong token is a failed attempt
  if (auto it = failures_.find(addr);
      !authorized && it != failures_.end() && it->second.blocked_until > now) {
    auto secs = std::chrono::duration_cast<std::chrono::seconds>(it->second.blocked_until - now);
    // (Strings built first: GCC 12 miscompiles temporaries in an array initializer here.)
    std::string retry_after = std::to_string(secs.count() + 1);
    std::string body = error_json("rate_limit_error", "too_many_auth_failures",
                                  "too many failed authentications from this address; wait and "
                                  "retry with the right admin key")
                           .dump();
    const http::Header refused[] = {{"content-type", "application/json"},
                                    {"retry-after", retry_after}};
    co_await ex.respond(429, refused, body);
    co_return;
  }
  if (!authorized && (ui_page || stats) && !offered_key) {
    // A browser without a session (or with one expired or from before a restart): told how to
    // open one. Not counted as a failed authentication: it offered no key. A navigation from
    // another site (a link in a runbook) carries no SameSite=Strict cookie: it is sent back to
    // the page from the page's own origin once, which does.
    std::string_view site = ex.header("sec-fetch-site");
    // (Once: a browser that still called the reload cross-site gets the sign-in page.)
    const bool bounce = ui_page && (site == "cross-site" || site == "same-site") &&
                        http::query_param(ex.target(), "bounced").empty();
    co_await ui_unauthorized(ex, stats, bounce);
    co_return;
  }
  if (!authorized) {
    if (failures_.size() >= kMaxTrackedAddresses && !failures_.contains(addr)) {
      std::erase_if(failures_, [&](const auto& kv) { return kv.second.blocked_until <= now; });
      if (failures_.size() >= kMaxTrackedAddresses) failures_.erase(failures_.begin());
    }
    auto& f = failures_[addr];
    if (now - f.window > kFailureWindow) {
      f.window = now;
      f.count = 0;
    }
    if (++f.count >= kMaxAuthFailures) {
      f.blocked_until = now + kFailureWindow;
      log::warn("admin API: too many failed authentications; refusing the address for a minute")
          .kv("client", addr);
    }
    std::string denied_body =
        error_json("authentication_error", "invalid_admin_key",
                   "missing or wrong admin key: send 'Authorization: Bearer KEY' "
                   "with the key of --admin-api-key-file")
            .dump();
    const http::Header denied[] = {{"content-type", "application/json"},
                                   {"www-authenticate", "Bearer"}};
    co_await ex.respond(401, denied, denied_body);
    co_return;
  }
  failures_.erase(std::string(addr));

  if (ui_page) {
    co_await ui_route(ex);
    co_return;
  }
  if (stats) {
    // ?decisions=N: the newest N decisions (default 100, at most the log's 256).
    size_t recent = 100;
    if (std::string_view n = query_param(ex.target(), "decisions"); !n.empty()) {
      size_t v = 0;
      auto [end, ec] = std::from_chars(n.data(), n.data() + n.size(), v);
      if (ec != std::errc() || end != n.data() + n.size()) {
        co_await fail(ex, 400, "invalid_parameter",
                      "decisions must be a count of recent decisions (0 to " +
                          std::to_string(DecisionLog::kCapacity) + "), not '" +
                          std::string(n.substr(0, 32)) + "'");
        co_return;
      }
      recent = std::min(v, DecisionLog::kCapacity);
    }
    std::string body = hooks_.stats ? hooks_.stats(recent) : std::string("{}\n");
    const http::Header h[] = {{"content-type", "application/json"},
                              {"cache-control", "no-store"},
                              {"x-content-type-options", "nosniff"}};
    co_await ex.respond(200, h, body);
    co_return;
  }
  if (is_ui_path(path) || path == "/v1/stats") {
    const http::Header allow[] = {{"content-type", "application/json"}, {"allow", "GET, HEAD"}};
    std::string body = error_json("invalid_request_error", "method_not_allowed",
                                  "the dashboard's routes are read-only: use GET")
                           .dump();
    co_await ex.respond(405, allow, body);
    co_return;
  }
  if (path == "/v1/rules" || path.starts_with("/v1/rules/")) {
    co_await rules_route(ex, path.substr(std::string_view("/v1/rules").size()));
    co_return;
  }
  if (path == "/workers" || path.starts_with("/workers/")) {
    co_await workers_route(ex, path.substr(std::string_view("/workers").size()));
    co_return;
  }
  if (path == "/flush_cache") {
    if (method != "POST") {
      co_await fail(ex, 405, "method_not_allowed", "use POST /flush_cache");
      co_return;
    }
    co_await fan_out(ex, "POST", "/flush_cache");
    co_return;
  }
  if (path == "/get_loads") {
    if (method != "GET") {
      co_await fail(ex, 405, "method_not_allowed", "use GET /get_loads");
      co_return;
    }
    co_await fan_out(ex, "GET", "/get_load");
    co_return;
  }
  if (path == "/get_server_info" || path == "/server_info" || path == "/get_model_info" ||
      path == "/model_info") {
    co_await answer_worker_info(ex, pools_.table(), query_param(ex.target(), "rule"),
                                std::chrono::seconds(config_.health_check_timeout_secs));
    co_return;
  }
  if (path == "/v1/route") {
    // The route-only debug endpoint: the decision the request path would make, without sending.
    if (method != "POST") {
      co_await fail(ex, 405, "method_not_allowed",
                    "use POST /v1/route?path=/v1/chat/completions with the request's body");
      co_return;
    }
    if (!hooks_.route_only) {
      co_await fail(ex, 404, "not_found", "this kvgate has no request path to ask");
      co_return;
    }
    std::string target_path(query_param(ex.target(), "path"));
    if (target_path.empty()) target_path = "/v1/chat/completions";
    // ?at=UNIX_MICROSECONDS: decide at that moment (within a second of now; a moment ahead is
    // waited for), so that several replicas asked the same question answer for one instant
    // (agreement checks), not each at whenever the question reached it.
    std::optional<int64_t> asked_at;
    if (std::string_view at = query_param(ex.target(), "at"); !at.empty()) {
      int64_t at_us = 0;
      const auto [end, ec] = std::from_chars(at.data(), at.data() + at.size(), at_us);
      const int64_t now_us = replica::Sync::now_us();  // the clock origins are in
      // Within a second of now: the shared figures keep only their last change before a moment
      // (util/versioned.h), so a moment past is answered for exactly only if nothing changed
      // twice since (late_us tells the asker how far past it was).
      if (ec != std::errc{} || end != at.data() + at.size() || at_us > now_us + 1'000'000 ||
          at_us < now_us - 1'000'000) {
        co_await fail(ex, 400, "bad_at",
                      "?at= takes a moment in unix microseconds within one second of now (" +
                          std::string(at) + ")");
        co_return;
      }
      if (at_us > now_us) {
        Timer t(ex.executor());
        t.expires_after(std::chrono::microseconds(at_us - now_us));
        co_await t.async_wait(asio::as_tuple(use_awaitable));
      }
      asked_at = at_us;
    }
    // Routing headers of the request (sticky keys, a pinned worker) are the admin request's own.
    auto header = [&ex](std::string_view name) { return ex.header(name); };
    const int64_t decided_us = replica::Sync::now_us();
    auto [status, body] =
        hooks_.route_only(target_path, std::string(ex.body()), header, asked_at.value_or(0));
    if (asked_at && status == 200 && body.starts_with("{")) {
      // How long after the moment asked it decided (the question arrived late, or the loop was
      // busy): an agreement check counts such answers apart.
      body.insert(
          1, "\"late_us\":" + std::to_string(std::max<int64_t>(0, decided_us - *asked_at)) + ",");
    }
    const http::Header json_type[] = {{"content-type", "application/json"},
                                      {"cache-control", "no-store"}};
    co_await ex.respond(status, json_type, body);
    co_return;
  }
  if (path == "/v1/config" && method == "GET") {
    std::string config_body =
        hooks_.effective_config ? hooks_.effective_config() : std::string("{}\n");
    const http::Header json_type[] = {{"content-type", "application/json"}};
    co_await ex.respond(200, json_type, config_body);
    co_return;
  }
  if (path == "/v1/config/reload" && method == "POST") {
    if (!hooks_.reload) {
      co_await fail(ex, 409, "no_config_file",
                    "kvgate runs without --config: there is no file to reload; change rules "
                    "with /v1/rules");
      co_return;
    }
    std::string err = hooks_.reload();
    if (!err.empty()) {
      co_await fail(ex, 400, "invalid_config", err);
      co_return;
    }
    Json out{{"status", "reloaded"}, {"rules", pools_.rules().size()}};
    co_await reply(ex, 200, out);
    co_return;
  }
  co_await fail(ex, 404, "not_found",
                "no admin route " + std::string(method) + " " + std::string(path) +
                    " (routes: /v1/rules, /v1/rules/{name}, /v1/rules/validate, "
                    "/v1/rules/{name}/inventory, /v1/rules/{name}/parity, "
                    "/v1/rules/{name}/history, /v1/rules/{name}/rollback, /workers, /workers/{id}, "
                    "/flush_cache, "
                    "/get_loads, /get_server_info, /get_model_info, /v1/config, "
                    "/v1/config/reload, /v1/route, /v1/stats, /ui)");
}

awaitable<void> AdminApi::rules_route(http::Exchange& ex, std::string_view rest) {
  std::string_view method = ex.method();
  if (rest.empty() || rest == "/") {
    if (method == "GET") {
      Json list = Json::array();
      for (const auto& r : pools_.rules()) list.push_back(rule_json(r));
      Json out{{"rules", std::move(list)}};
      co_await reply(ex, 200, out);
    } else if (method == "POST") {
      std::vector<rules::FieldError> errors;
      auto rule = parse_rule(ex.body(), "", config_, errors);
      if (!rule) {
        co_await rule_errors(ex, errors);
        co_return;
      }
      if (pools_.rule(rule->name)) {
        co_await fail(
            ex, 409, "rule_exists",
            "a rule named '" + rule->name + "' exists; change it with PUT /v1/rules/" + rule->name);
        co_return;
      }
      std::string name = rule->name;
      errors = pools_.upsert(std::move(*rule), nullptr, RuleSource::kApi);
      if (!errors.empty()) {
        co_await rule_errors(ex, errors);
        co_return;
      }
      log::info("admin API: rule created").kv("rule", name).kv("client", ex.remote_address());
      Json created_rule = rule_json(*pools_.rule(name));
      co_await reply(ex, 201, std::move(created_rule));
    } else {
      co_await fail(ex, 405, "method_not_allowed", "use GET or POST /v1/rules");
    }
    co_return;
  }
  rest.remove_prefix(1);  // '/'
  if (rest == "validate") {
    if (method != "POST") {
      co_await fail(ex, 405, "method_not_allowed", "use POST /v1/rules/validate");
      co_return;
    }
    std::vector<rules::FieldError> errors;
    auto rule = parse_rule(ex.body(), "", config_, errors);
    if (rule) {
      // As a create or an update would be: the whole table checked and built, nothing changed.
      auto all = pools_.rules();
      bool replaced = false;
      for (auto& r : all) {
        if (r.name == rule->name) {
          r = *rule;
          replaced = true;
        }
      }
      if (!replaced) all.push_back(*rule);
      errors = pools_.apply(std::move(all), /*dry_run=*/true);
    }
    if (!errors.empty()) {
      co_await rule_errors(ex, errors);
      co_return;
    }
    Json out{{"valid", true}, {"rule", rule_json(*rule)}};
    co_await reply(ex, 200, out);
    co_return;
  }
  size_t slash = rest.find('/');
  std::string name(rest.substr(0, slash));
  std::string_view sub = slash == std::string_view::npos ? "" : rest.substr(slash);
  if (sub == "/history") {
    if (method != "GET") {
      co_await fail(ex, 405, "method_not_allowed", "the history is read-only: use GET");
      co_return;
    }
    auto h = pools_.history(name);
    if (!h) {
      co_await fail(ex, 404, "rule_not_found",
                    "no rule named '" + name +
                        "' was ever seen (or it was deleted long ago and its history is "
                        "forgotten)");
      co_return;
    }
    co_await reply(ex, 200, history_json(*h));
    co_return;
  }
  if (sub == "/rollback") {
    if (method != "POST") {
      co_await fail(ex, 405, "method_not_allowed",
                    "use POST /v1/rules/" + name + "/rollback (optionally ?to=VERSION)");
      co_return;
    }
    std::optional<uint64_t> to;
    if (std::string_view given = query_param(ex.target(), "to"); !given.empty()) {
      uint64_t n = 0;
      auto [end, ec] = std::from_chars(given.data(), given.data() + given.size(), n);
      if (ec != std::errc() || end != given.data() + given.size() || n == 0) {
        co_await fail(ex, 400, "invalid_version",
                      "?to= takes a version number (1, 2, ...; GET /v1/rules/" + name +
                          "/history lists them), not '" + std::string(given.substr(0, 32)) + "'");
        co_return;
      }
      to = n;
    }
    RollbackResult result;
    auto errors = pools_.rollback(name, to, &result);
    using Status = RollbackResult::Status;
    switch (result.status) {
      case Status::kDone:
        break;
      case Status::kUnknownRule:
        co_await fail(ex, 404, "rule_not_found", errors.at(0).message);
        co_return;
      case Status::kUnknownVersion:
        co_await fail(ex, 404, "version_not_found", errors.at(0).message);
        co_return;
      case Status::kNothingToDo:
        co_await fail(ex, 409, "nothing_to_roll_back", errors.at(0).message);
        co_return;
      case Status::kInvalid:
        co_await rule_errors(ex, std::move(errors));
        co_return;
    }
    log::info("admin API: rule rolled back").kv("rule", name).kv("client", ex.remote_address());
    // "rule" is the name, as in the history and inventory answers; the rule now in force (every
    // field; null when the rollback deleted it) is "in_force".
    Json out{{"rule", name},
             {"restored", result.restored},
             {"version", result.version},
             {"action", to_string(result.action)},
             {"in_force", rule_or_null(result.rule)}};
    co_await reply(ex, 200, out);
    co_return;
  }
  if (sub == "/inventory" || sub == "/parity") {
    const bool probe = sub == "/parity";
    if (!probe && method != "GET") {
      co_await fail(ex, 405, "method_not_allowed", "the inventory is read-only: use GET");
      co_return;
    }
    if (probe && method != "POST") {
      co_await fail(ex, 405, "method_not_allowed",
                    "POST /v1/rules/{name}/parity starts a tokenizer parity probe of every "
                    "(endpoint, rank); GET .../inventory shows the results");
      co_return;
    }
    auto rule = pools_.rule(name);
    if (!rule) {
      co_await fail(ex, 404, "rule_not_found", "no rule named '" + name + "'");
      co_return;
    }
    auto table = pools_.table();
    const Pool* pool = table->find(name);
    const auto* kv = pool ? dynamic_cast<const KvExactPolicy*>(&pool->policy()) : nullptr;
    if (!kv) {
      Json off{{"rule", name},
               {"kvExactMode", rule->kv_exact_mode},
               {"inventory", nullptr},
               {"message",
                "kv_exact routing is off for this rule (kvExactMode 0): no "
                "block inventory is kept"}};
      co_await reply(ex, 200, off);
      co_return;
    }
    if (probe) {
      kv->request_parity_probes();
      Json out{{"rule", name},
               {"probing", kv->sources().size()},
               {"message",
                "a parity probe goes to every connected (endpoint, rank) within a second; "
                "GET /v1/rules/" +
                    name + "/inventory shows tokenizer_parity per rank"}};
      co_await reply(ex, 202, out);
      co_return;
    }
    co_await reply(ex, 200, inventory_json(name, *rule, *kv));
    co_return;
  }
  if (sub == "/doctor") {
    co_await doctor_route(ex, name);
    co_return;
  }
  if (!sub.empty()) {
    co_await fail(ex, 404, "not_found",
                  "no admin route under /v1/rules/" + name + std::string(sub));
    co_return;
  }
  if (method == "GET") {
    auto rule = pools_.rule(name);
    if (!rule) {
      co_await fail(ex, 404, "rule_not_found", "no rule named '" + name + "'");
      co_return;
    }
    co_await reply(ex, 200, rule_json(*rule));
  } else if (method == "PUT") {
    std::vector<rules::FieldError> errors;
    auto rule = parse_rule(ex.body(), name, config_, errors);
    if (!rule) {
      co_await rule_errors(ex, errors);
      co_return;
    }
    std::string verify = percent_decode(query_param(ex.target(), "verify"));
    if (!verify.empty() && verify != "true" && verify != "false") {
      co_await fail(ex, 400, "invalid_request",
                    "verify must be true or false, not '" + verify + "'");
      co_return;
    }
    if (verify == "true") {
      co_await verified_put(ex, name, std::move(*rule));
      co_return;
    }
    bool created = false;
    errors = pools_.upsert(std::move(*rule), &created, RuleSource::kApi);
    if (!errors.empty()) {
      co_await rule_errors(ex, errors);
      co_return;
    }
    log::info(created ? "admin API: rule created" : "admin API: rule updated")
        .kv("rule", name)
        .kv("client", ex.remote_address());
    Json updated_rule = rule_json(*pools_.rule(name));
    int status = created ? 201 : 200;
    co_await reply(ex, status, std::move(updated_rule));
  } else if (method == "DELETE") {
    if (!pools_.remove(name, RuleSource::kApi)) {
      co_await fail(ex, 404, "rule_not_found", "no rule named '" + name + "'");
      co_return;
    }
    log::info("admin API: rule deleted").kv("rule", name).kv("client", ex.remote_address());
    co_await reply(ex, 204, Json());
  } else {
    co_await fail(ex, 405, "method_not_allowed", "use GET, PUT or DELETE /v1/rules/" + name);
  }
}

awaitable<void> AdminApi::workers_route(http::Exchange& ex, std::string_view rest) {
  std::string_view method = ex.method();
  auto table = pools_.table();
  if (rest.empty() || rest == "/") {
    if (method == "GET") {
      Json list = Json::array();
      for (const auto& p : table->pools) {
        const auto snapshot = p->workers();  // (held: the loop reads it)
        for (const auto& w : snapshot->workers) {
          list.push_back(worker_json(*p, *w, endpoint_of(*p, *w)));
        }
      }
      size_t total = list.size();
      Json out{{"workers", std::move(list)}, {"total", total}};
      co_await reply(ex, 200, out);
      co_return;
    }
    if (method != "POST") {
      co_await fail(ex, 405, "method_not_allowed", "use GET or POST /workers");
      co_return;
    }
    // {"url", "model_id"?, "worker_type"?: regular|prefill|decode, "bootstrap_port"?, "rule"?}:
    // added to the rule named, else to the rule serving model_id, else to the rule "default".
    Json j = nests_deeper_than(ex.body(), kMaxBodyDepth) ? Json()
                                                         : Json::parse(ex.body(), nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("url") || !j["url"].is_string()) {
      co_await fail(ex, 400, "invalid_worker",
                    "the body must be a JSON object with \"url\" (and optionally \"model_id\", "
                    "\"worker_type\", \"bootstrap_port\", \"rule\")");
      co_return;
    }
    for (const auto& [key, value] : j.items()) {
      static constexpr std::string_view kKnown[] = {"url", "model_id", "worker_type",
                                                    "bootstrap_port", "rule"};
      if (std::find(std::begin(kKnown), std::end(kKnown), key) == std::end(kKnown)) {
        // A typo ("modle_id") would add the worker somewhere else than meant.
        std::string why = "unknown field \"" + key.substr(0, 64) +
                          "\"; the fields are url, model_id, worker_type, bootstrap_port, rule";
        co_await fail(ex, 400, "invalid_worker", why);
        co_return;
      }
    }
    for (const char* key : {"rule", "model_id", "worker_type"}) {
      if (j.contains(key) && !j[key].is_string() && !j[key].is_null()) {
        co_await fail(ex, 400, "invalid_worker", std::string("\"") + key + "\" must be a string");
        co_return;
      }
    }
    if (j.contains("bootstrap_port") && !j["bootstrap_port"].is_number_integer() &&
        !j["bootstrap_port"].is_null()) {
      co_await fail(ex, 400, "invalid_worker", "\"bootstrap_port\" must be an integer");
      co_return;
    }
    auto text = [&](const char* key, const char* dflt) {
      return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string(dflt);
    };
    std::string rule_name = text("rule", "");
    std::string model = text("model_id", "");
    if (rule_name.empty() && !model.empty()) {
      // The rule listing the model (whatever its port or path), else none: a catch-all takes
      // it only when named.
      for (const auto& p : table->pools) {
        const auto& models = p->rule().models;
        if (std::find(models.begin(), models.end(), model) != models.end()) {
          rule_name = p->name();
          break;
        }
      }
    }
    if (rule_name.empty()) rule_name = "default";
    auto rule = pools_.rule(rule_name);
    if (!rule) {
      co_await fail(ex, 404, "rule_not_found",
                    "no rule '" + rule_name +
                        "' to add the worker to; name one with \"rule\" or create it first");
      co_return;
    }
    rules::Endpoint ep;
    ep.url = j["url"].get<std::string>();
    std::string type = text("worker_type", "regular");
    if (type == "prefill") {
      ep.role = rules::Role::kPrefill;
    } else if (type == "decode") {
      ep.role = rules::Role::kDecode;
    } else if (type != "regular") {
      co_await fail(ex, 400, "invalid_worker",
                    "worker_type '" + type + "' is not one of regular, prefill, decode");
      co_return;
    }
    if (j.contains("bootstrap_port") && j["bootstrap_port"].is_number_integer()) {
      ep.bootstrap_port = j["bootstrap_port"].get<int64_t>();
    }
    http::Target t;
    if (std::string e = http::parse_url(ep.url, t); !e.empty()) {
      co_await fail(ex, 400, "invalid_worker", "url: " + e);
      co_return;
    }
    for (const auto& other : rule->endpoints) {
      http::Target o;
      if (http::parse_url(other.url, o).empty() && o.url == t.url) {
        co_await fail(ex, 409, "worker_exists",
                      "rule '" + rule_name + "' already has worker " + t.url);
        co_return;
      }
    }
    rule->endpoints.push_back(std::move(ep));
    auto errors = pools_.upsert(*rule, nullptr, RuleSource::kWorkers);
    if (!errors.empty()) {
      co_await rule_errors(ex, errors);
      co_return;
    }
    log::info("admin API: worker added")
        .kv("rule", rule_name)
        .kv("worker", t.url)
        .kv("client", ex.remote_address());
    table = pools_.table();
    const Pool* p = table->find(rule_name);
    const auto snapshot = p->workers();  // (held: the loop reads it)
    for (const auto& w : snapshot->workers) {
      if (w->url() == t.url) {
        co_await reply(ex, 201, worker_json(*p, *w, endpoint_of(*p, *w)));
        co_return;
      }
    }
    Json out{{"url", t.url}, {"rule", rule_name}};
    co_await reply(ex, 201, out);
    co_return;
  }
  // /workers/{id}: the worker's id, or its URL percent-encoded.
  std::string id = percent_decode(rest.substr(1));
  std::vector<std::pair<std::shared_ptr<Pool>, WorkerPtr>> found;
  for (const auto& p : table->pools) {
    const auto snapshot = p->workers();  // (held: the loop reads it)
    for (const auto& w : snapshot->workers) {
      if (std::to_string(w->id()) == id || w->url() == id) found.emplace_back(p, w);
    }
  }
  if (found.empty()) {
    co_await fail(ex, 404, "worker_not_found",
                  "no worker '" + id + "' (give its id from GET /workers, or its URL)");
    co_return;
  }
  if (method == "GET") {
    co_await reply(ex, 200,
                   worker_json(*found[0].first, *found[0].second,
                               endpoint_of(*found[0].first, *found[0].second)));
    co_return;
  }
  if (method != "DELETE") {
    co_await fail(ex, 405, "method_not_allowed", "use GET or DELETE /workers/{id}");
    co_return;
  }
  // Out of every rule that lists it, in one change.
  auto all = pools_.rules();
  std::string url = found[0].second->url();
  for (auto& r : all) {
    std::erase_if(r.endpoints, [&](const rules::Endpoint& ep) {
      http::Target t;
      return http::parse_url(ep.url, t).empty() && t.url == url;
    });
  }
  auto errors = pools_.apply(std::move(all), /*dry_run=*/false, RuleSource::kWorkers);
  if (!errors.empty()) {
    co_await rule_errors(ex, errors);
    co_return;
  }
  log::info("admin API: worker removed").kv("worker", url).kv("client", ex.remote_address());
  co_await reply(ex, 204, Json());
}

awaitable<void> AdminApi::fan_out(http::Exchange& ex, std::string_view method,
                                  std::string_view path) {
  auto table = pools_.table();
  auto timeout = std::chrono::seconds(config_.health_check_timeout_secs);
  Json results = Json::array();
  bool all_ok = true;
  std::set<std::string> seen;
  for (const auto& p : table->pools) {
    const auto snapshot = p->workers();  // (held: the loop reads it)
    for (const auto& w : snapshot->workers) {
      if (!seen.insert(w->url()).second) continue;
      auto r = co_await http::fetch(ex.executor(), w->target(), method, path, timeout);
      Json entry{{"worker", w->url()}, {"rule", p->name()}};
      bool ok = r.error == http::CallError::kNone && r.status >= 200 && r.status < 300;
      all_ok = all_ok && ok;
      if (r.error != http::CallError::kNone) {
        entry["error"] = std::string(http::to_string(r.error)) + ": " + r.detail;
      } else {
        entry["status"] = r.status;
      }
      if (path == "/get_load") {
        auto load = ok ? parse_load_report(r.body) : std::nullopt;
        entry["load"] = load ? Json(*load) : Json(nullptr);
      }
      results.push_back(std::move(entry));
    }
  }
  Json out{{"status", all_ok ? "ok" : "partial"}, {"workers", std::move(results)}};
  int status = all_ok ? 200 : 206;
  co_await reply(ex, status, out);
}

std::string AdminApi::doctor_busy() const {
  if (!doctor_running_) return "";
  return "a doctor run is in progress on this gateway (rule '" + doctor_rule_ +
         "'); try again when it ends";
}

// PUT /v1/rules/{name}?verify=true: the change applied, then the doctor's steps 4-6 (event
// plane, kv_exact, inventory) run on the new rule, waiting up to ?timeout= seconds (30) for its
// signals; a failing step rolls the rule back to the version this change replaced (unless
// someone changed it again meanwhile). 200/201 with the report when it held; 409 with the report
// and what was restored when it did not.
awaitable<void> AdminApi::verified_put(http::Exchange& ex, const std::string& name,
                                       rules::Rule rule) {
  if (!hooks_.doctor_env) {
    co_await fail(ex, 501, "not_available", "this kvgate runs without the doctor: no verify");
    co_return;
  }
  long timeout = 30;
  if (std::string v = percent_decode(query_param(ex.target(), "timeout")); !v.empty()) {
    char* end = nullptr;
    long n = std::strtol(v.c_str(), &end, 10);
    if (end == v.c_str() || *end != '\0' || n < 1 || n > 600) {
      co_await fail(ex, 400, "invalid_request",
                    "timeout must be a whole number of seconds from 1 to 600, not '" + v + "'");
      co_return;
    }
    timeout = n;
  }
  if (rule.kv_exact_mode == 0) {
    co_await fail(ex, 400, "invalid_request",
                  "verify checks kv_exact's event plane, cached pages and inventory (the doctor's "
                  "steps 4-6), and this rule has kvExactMode 0: PUT it without verify, then run "
                  "POST /v1/rules/" +
                      name + "/doctor?steps=1-3 (or kvgate doctor --steps 1-3)");
    co_return;
  }
  if (std::string busy = doctor_busy(); !busy.empty()) {
    co_await fail(ex, 409, "doctor_running", busy);
    co_return;
  }
  DoctorSlot slot(*this, name);
  auto before_history = pools_.history(name);
  const uint64_t before = before_history ? before_history->current() : 0;
  bool created = false;
  auto errors = pools_.upsert(std::move(rule), &created, RuleSource::kApi);
  if (!errors.empty()) {
    co_await rule_errors(ex, errors);
    co_return;
  }
  auto history = pools_.history(name);
  const uint64_t made = history ? history->current() : 0;
  // The version this change replaced: the one in force before it, or for a name without history
  // the version "absent" its creation recorded first. None when the rule was already this.
  std::optional<uint64_t> replaced;
  if (made > before) replaced = before > 0 ? before : made - 1;
  log::info(created ? "admin API: rule created, verifying" : "admin API: rule updated, verifying")
      .kv("rule", name)
      .kv("client", ex.remote_address());
  doctor::Options options;
  options.first = 4;
  options.last = 6;
  options.settle = std::chrono::seconds(timeout);
  options.limit = std::chrono::minutes(5);
  // A client that hangs up ends the run between steps (the watch goes with this handler).
  ex.watch_disconnect([] {});
  options.cancelled = [&ex] { return ex.client_gone(); };
  doctor::Env env = hooks_.doctor_env();
  auto report = co_await doctor::run(env, name, options);
  Json out{{"verified", report.ok()}, {"report", doctor::to_json(report)}};
  if (report.ok()) {
    auto now = pools_.rule(name);
    out["rule"] = now ? rule_json(*now) : Json(nullptr);
    const int status = created ? 201 : 200;
    co_await reply(ex, status, std::move(out));
    co_return;
  }
  auto after = pools_.history(name);
  std::string why;
  if (!replaced) {
    why = "the rule was already exactly this: nothing to roll back";
  } else if (!after || after->current() != made) {
    why = "the rule changed again while it was verified: not rolled back (see its history)";
  } else {
    RollbackResult rb;
    auto rerrors = pools_.rollback(name, *replaced, &rb);
    if (rerrors.empty()) {
      log::warn("admin API: verification failed; the rule was rolled back")
          .kv("rule", name)
          .kv("failed_step", report.failed_step())
          .kv("restored", rb.restored);
      out["rolled_back"] = true;
      out["restored"] = rb.restored;
      out["version"] = rb.version;
      out["action"] = to_string(rb.action);
      out["in_force"] = rb.rule ? rule_json(*rb.rule) : Json(nullptr);
      out["error"] = error_json("verification_failed", "rolled_back",
                                "step " + std::to_string(report.failed_step()) +
                                    " failed on the new rule: version " +
                                    std::to_string(rb.restored) + " was restored")["error"];
      co_await reply(ex, 409, std::move(out));
      co_return;
    }
    why = "the rollback was refused: " + rerrors[0].message;
  }
  log::warn("admin API: verification failed; the rule stays").kv("rule", name).kv("why", why);
  out["rolled_back"] = false;
  out["error"] = error_json(
      "verification_failed", "not_rolled_back",
      "step " + std::to_string(report.failed_step()) + " failed on the new rule; " + why)["error"];
  auto now = pools_.rule(name);
  out["in_force"] = now ? rule_json(*now) : Json(nullptr);
  co_await reply(ex, 409, std::move(out));
}

// POST /v1/rules/{name}/doctor: the doctor's steps on one rule; 200 with its report whatever
// the steps found (the report's "ok" says).
awaitable<void> AdminApi::doctor_route(http::Exchange& ex, const std::string& name) {
  if (ex.method() != "POST") {
    co_await fail(ex, 405, "method_not_allowed",
                  "POST /v1/rules/{name}/doctor runs the doctor's steps on the rule");
    co_return;
  }
  if (!hooks_.doctor_env) {
    co_await fail(ex, 501, "not_available", "this kvgate runs without the doctor");
    co_return;
  }
  if (!pools_.rule(name)) {
    co_await fail(ex, 404, "rule_not_found", "no rule named '" + name + "'");
    co_return;
  }
  doctor::Options options;
  std::string_view target = ex.target();
  std::string steps = percent_decode(query_param(target, "steps"));
  if (!steps.empty() && !doctor::parse_steps(steps, options.first, options.last)) {
    co_await fail(ex, 400, "invalid_request",
                  "steps must be a step or a range within 1-7 (e.g. 4-6), not '" + steps + "'");
    co_return;
  }
  auto seconds = [&](std::string_view key, long lo, long hi, long& out) -> std::string {
    std::string v = percent_decode(query_param(target, key));
    if (v.empty()) return "";
    char* end = nullptr;
    long n = std::strtol(v.c_str(), &end, 10);
    if (end == v.c_str() || *end != '\0' || n < lo || n > hi) {
      return std::string(key) + " must be a whole number from " + std::to_string(lo) + " to " +
             std::to_string(hi) + ", not '" + v + "'";
    }
    out = n;
    return "";
  };
  long timeout = 30, settle = 10, concurrency = 0;
  std::string bad = seconds("timeout", 1, 3600, timeout);
  if (bad.empty()) bad = seconds("settle", 1, 600, settle);
  if (bad.empty()) bad = seconds("concurrency", 1, 1024, concurrency);
  if (!bad.empty()) {
    co_await fail(ex, 400, "invalid_request", bad);
    co_return;
  }
  options.request_timeout = std::chrono::seconds(timeout);
  options.settle = std::chrono::seconds(settle);
  options.concurrency = static_cast<int>(concurrency);
  options.limit = std::chrono::minutes(10);
  // A client that hangs up ends the run between steps (the watch goes with this handler).
  ex.watch_disconnect([] {});
  options.cancelled = [&ex] { return ex.client_gone(); };
  if (std::string busy = doctor_busy(); !busy.empty()) {
    co_await fail(ex, 409, "doctor_running", busy);
    co_return;
  }
  DoctorSlot slot(*this, name);
  doctor::Env env = hooks_.doctor_env();
  auto report = co_await doctor::run(env, name, options);
  co_await reply(ex, 200, doctor::to_json(report));
}

awaitable<void> answer_worker_info(http::Exchange& ex, std::shared_ptr<const RuleTable> table,
                                   std::string_view rule, std::chrono::milliseconds timeout) {
  const Pool* pool =
      rule.empty() ? (table->pools.empty() ? nullptr : table->pools[0].get()) : table->find(rule);
  const WorkerPtr chosen = pool ? pool->first_healthy() : nullptr;
  if (!chosen) {
    std::string why = pool ? "no healthy worker in rule '" + pool->name() + "'"
                           : "no rule '" + std::string(rule) + "' (add ?rule=NAME)";
    co_await fail(ex, 503, "no_available_workers", why);
    co_return;
  }
  auto r = co_await http::fetch(ex.executor(), chosen->target(), "GET", ex.path(), timeout);
  if (r.error != http::CallError::kNone) {
    co_await fail(
        ex, 502, "upstream_failed",
        "worker " + std::to_string(chosen->id()) + " did not answer " + std::string(ex.path()));
    co_return;
  }
  const http::Header h[] = {{"content-type", "application/json"}};
  co_await ex.respond(r.status, h, r.body);
}

}  // namespace kvgate
