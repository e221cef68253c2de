// rules/rule: see rule.h. One table (fields()) lists every rule field once; parsing, validation
// of ranges, to_json and the docs walk it. The policy knobs are not restated: they are the
// "Routing policy" group of the gateway's knob table, renamed to camelCase, with the knob's own
// range and choices.
#include "rules/rule.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "discovery/source.h"
#include "http/client.h"
#include "policy/registry.h"
#include "rules/doc.h"

namespace kvgate::rules {
namespace {

using Json = nlohmann::ordered_json;
using Knob = flags::Knob<GatewayConfig>;
using Kind = RuleDoc::Kind;

std::string dump(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}
std::string json_quote(std::string_view s) {
  return dump(Json(std::string(s)));
}

constexpr std::string_view kRoutingGroup = "Routing policy";
// Knobs of the routing group a rule does not take: the policy is `sel`, the tokenizer
// `tokenizerPath`; --model-path is only another way to name the tokenizer.
constexpr std::string_view kNotPerRule[] = {"policy", "tokenizer-path", "model-path"};

enum class FieldKind {
  kName,
  kModels,
  kInt,
  kPathPrefix,
  kSel,
  kEngine,
  kHashAlgo,
  kTokenizer,
  kKnob,
  kEndpoints,
  kPdMode,
  kDiscovery,
};

struct FieldDef {
  std::string name;
  FieldKind kind;
  std::string type;
  std::string help;
  int64_t Rule::*member = nullptr;  // kInt
  int64_t min = 0;
  int64_t max = 0;
  std::vector<int64_t> choices;  // kInt: the only values allowed (else min..max)
  std::string hint;              // kInt: the fix said with a value out of range
  std::string default_note;      // docs: the default as text, when the value alone says too little
  std::string range;             // docs (kInt, kKnob: computed)
  const Knob* knob = nullptr;    // kKnob
  bool required = false;
};

std::string join(const std::vector<std::string>& v, std::string_view sep = ", ") {
  std::string out;
  for (const auto& s : v) out.append(out.empty() ? "" : std::string(sep)).append(s);
  return out;
}

std::vector<std::string> built_policies() {
  std::vector<std::string> names;
  for (const auto& p : all_policies()) {
    if (p.factory) names.emplace_back(p.name);
  }
  return names;
}

const std::vector<std::string>& vllm_hash_algos() {
  // vLLM's PrefixCachingHashAlgo (vllm/config/cache.py): "sha256" (pickle, the default),
  // "sha256_cbor", "xxhash", "xxhash_cbor".
  static const std::vector<std::string> kAlgos = {"sha256", "sha256_cbor", "xxhash", "xxhash_cbor"};
  return kAlgos;
}

const std::vector<FieldDef>& fields() {
  static const std::vector<FieldDef> kFields = [] {
    std::vector<FieldDef> t;
    auto int_field = [&](std::string name, int64_t Rule::*m, int64_t min, int64_t max,
                         std::string help, std::string hint = {}, std::string note = {}) {
      FieldDef f{.name = std::move(name), .kind = FieldKind::kInt, .type = "integer"};
      f.help = std::move(help);
      f.member = m;
      f.min = min;
      f.max = max;
      f.hint = std::move(hint);
      f.default_note = std::move(note);
      f.range = std::to_string(min) + ".." + std::to_string(max);
      t.push_back(std::move(f));
    };
    auto choice_field = [&](std::string name, int64_t Rule::*m, std::vector<int64_t> choices,
                            std::string help, std::string hint) {
      int_field(std::move(name), m, 0, 0, std::move(help), std::move(hint));
      std::vector<std::string> texts;
      texts.reserve(choices.size());
      for (auto c : choices) texts.push_back(std::to_string(c));
      t.back().range = join(texts);
      t.back().choices = std::move(choices);
    };
    t.push_back({.name = "name",
                 .kind = FieldKind::kName,
                 .type = "string",
                 .help = "The rule's name, unique among rules; the admin API addresses the rule "
                         "by it",
                 .default_note = "required",
                 .range = "A-Z a-z 0-9 _ . -, 1 to 64 characters",
                 .required = true});
    t.push_back({.name = "models",
                 .kind = FieldKind::kModels,
                 .type = "list of strings",
                 .help = "Requests whose body names one of these models come to this rule; empty: "
                         "any model (the catch-all of its port and pathPrefix). Needs mode 4 (the "
                         "body is read)",
                 .default_note = "[] (any model)",
                 .range = "each 1 to 256 bytes"});
    int_field("port", &Rule::port, 0, 65535,
              "Listener port the request arrived on; 0: any port. kvgate has one inference "
              "listener (--port): a rule's port must be that port",
              "", "0 (any)");
    t.push_back({.name = "pathPrefix",
                 .kind = FieldKind::kPathPrefix,
                 .type = "string",
                 .help = "Requests whose path starts with this; empty: any path. The proxied "
                         "paths are /generate, /v1/chat/completions, /v1/completions, "
                         "/v1/responses (and /v1/responses/{id}), /v1/embeddings, /v1/rerank, "
                         "/v1/score, /v1/classify, /encode, /classify, /tokenize, /detokenize, "
                         "/v1/tokenize and /v1/detokenize: a prefix must match one of them",
                 .default_note = "\"\" (any)",
                 .range = "empty, or a prefix of a proxied path"});
    choice_field("mode", &Rule::mode, {0, 4},
                 "0: plain proxy (request bodies are not read; round_robin, random and "
                 "power_of_two only); 4: fullproxy, AI-aware (bodies are read: every policy, "
                 "models, KV-exact, prefill/decode)",
                 "kvgate has mode 0 (plain proxy) and mode 4 (fullproxy, AI-aware); other modes "
                 "of KV-exact gateways are not built: use 4 for AI-aware routing");
    t.push_back({.name = "sel",
                 .kind = FieldKind::kSel,
                 .type = "string or integer",
                 .help = "The routing policy, with its knobs below; with kvExactMode 3, the "
                         "fallback after a KV-exact miss. Policies that read the request (all "
                         "but round_robin, random, power_of_two) need mode 4",
                 .default_note = "round_robin",
                 .range = join(built_policies()) + "; or 0 (round_robin), 8 (chwbl)"});
    t.push_back({.name = "kvEngineType",
                 .kind = FieldKind::kEngine,
                 .type = "string",
                 .help = "The engine behind the endpoints: it fixes the KV event format, the "
                         "block hash and the prefill/decode protocol. A live rule cannot change "
                         "it: delete the rule and create it again",
                 .default_note = "vllm",
                 .range = "vllm, sglang, trtllm, llamacpp"});
    choice_field("kvExactMode", &Rule::kv_exact_mode, {0, 1, 3},
                 "KV-exact routing from the engines' KV events: 0 off; 3 on a single role-less "
                 "pool; 1 with prefill/decode endpoints. Needs mode 4, tokenizerPath and an "
                 "engine whose events kvgate reads (sglang, vllm)",
                 "0 is off, 3 is KV-exact on a single role-less pool, 1 is KV-exact with "
                 "prefill/decode");
    // Up to 4096: vLLM's attention pages stop at 256 and hybrid (Mamba) models round theirs up
    // to a few thousand tokens; a larger page would outgrow most prompts, so nothing would ever
    // match, and such a value is more likely a context length typed in the wrong field.
    int_field("kvBlockSize", &Rule::kv_block_size, 1, 4096,
              "Tokens per KV page: must equal the engine's page size (SGLang: page_size in GET "
              "/get_server_info; vLLM: --block-size)",
              "set it to the engine's page size (SGLang: GET /get_server_info, page_size)");
    t.push_back({.name = "kvHashAlgo",
                 .kind = FieldKind::kHashAlgo,
                 .type = "string",
                 .help = "The engine's block hash. Leave it out: sglang -> sha256_sglang, vllm -> "
                         "sha256 (vLLM's default --prefix-caching-hash-algo), trtllm and llamacpp "
                         "-> none",
                 .default_note = "engine-derived",
                 .range = "sglang: sha256_sglang; vllm: " + join(vllm_hash_algos()) +
                          "; trtllm, llamacpp: none"});
    int_field("kvZmqPort", &Rule::kv_zmq_port, 1, 65535,
              "Port the engine's DP rank 0 publishes KV events on; rank r publishes on kvZmqPort "
              "+ r (an endpoint's kvZmqPort overrides it)");
    int_field("kvDpRankCount", &Rule::kv_dp_rank_count, 1, 8,
              "Data-parallel ranks per endpoint, each publishing KV events on its own port; "
              "with dpAware, the ranks of an endpoint whose /server_info does not say its "
              "dp_size",
              "more than 8 DP ranks per endpoint is not supported: split the deployment or reduce "
              "the rank fan-out");
    int_field("kvWarmupSec", &Rule::kv_warmup_sec, 0, 3600,
              "kv_exact: a rank is trusted once its event subscriber has been connected this "
              "long, or holds blocks; until then its requests go to sel");
    t.push_back({.name = "pd_disagg_mode",
                 .kind = FieldKind::kPdMode,
                 .type = "boolean",
                 .help =
                     "SGLang prefill/decode on or off (the name KV-exact gateways use): true needs "
                     "prefill and decode endpoints (roles 1 and 2), false none; printed back as "
                     "whether the endpoints have roles",
                 .default_note = "whether endpoints have roles",
                 .range = "true, false"});
    int_field("pdBootstrapPort", &Rule::pd_bootstrap_port, 0, 65535,
              "SGLang prefill/decode only: the prefill servers' bootstrap port (an endpoint's "
              "bootstrapPort overrides it); 0 means 8998",
              "", "0 (8998)");
    t.push_back({.name = "tokenizerPath",
                 .kind = FieldKind::kTokenizer,
                 .type = "string",
                 .help = "Model directory with tokenizer.json (+ tokenizer_config.json): "
                         "content-aware policies route on the prompt as the engine tokenizes it "
                         "(like --tokenizer-path); KV-exact routing needs it",
                 .default_note = "\"\" (none)",
                 .range = "a directory"});
    for (const auto& k : gateway_knobs()) {
      if (k.group != kRoutingGroup || !k.unsupported_reason.empty()) continue;
      if (std::find(std::begin(kNotPerRule), std::end(kNotPerRule), k.name) !=
          std::end(kNotPerRule)) {
        continue;
      }
      FieldDef f{.name = camel_case(k.name), .kind = FieldKind::kKnob, .knob = &k};
      f.help = std::string(k.help) + " (--" + std::string(k.name) + ")";
      std::visit(
          [&](auto m) {
            using M = decltype(m);
            if constexpr (std::is_same_v<M, bool GatewayConfig::*>) f.type = "boolean";
            if constexpr (std::is_same_v<M, int64_t GatewayConfig::*>) f.type = "integer";
            if constexpr (std::is_same_v<M, double GatewayConfig::*>) f.type = "number";
            if constexpr (std::is_same_v<M, std::string GatewayConfig::*>) f.type = "string";
            if constexpr (std::is_same_v<M, std::vector<std::string> GatewayConfig::*>) {
              f.type = "list of strings";
            }
          },
          k.field);
      if (!k.choices.empty()) {
        std::vector<std::string> c(k.choices.begin(), k.choices.end());
        f.range = join(c);
      } else if (f.type == "integer" || f.type == "number") {
        bool lo = k.min != -std::numeric_limits<double>::infinity();
        bool hi = k.max != std::numeric_limits<double>::infinity();
        if (lo && hi) {
          f.range = flags::format_number(k.min) + ".." + flags::format_number(k.max);
        } else if (lo) {
          f.range = ">= " + flags::format_number(k.min);
        } else if (hi) {
          f.range = "<= " + flags::format_number(k.max);
        }
      }
      t.push_back(std::move(f));
    }
    t.push_back({.name = "endpoints",
                 .kind = FieldKind::kEndpoints,
                 .type = "list of endpoints",
                 .help = "The pool's servers, each {url, role, bootstrapPort, kvZmqPort, weight} "
                         "(fields below); a plain URL string is an endpoint with the defaults",
                 .default_note = "required (unless discovery finds them)",
                 .range = "at least one, with discovery none",
                 .required = true});
    t.push_back({.name = "discovery",
                 .kind = FieldKind::kDiscovery,
                 .type = "string",
                 .help = "Find more endpoints: dns://NAME:PORT (every A/AAAA address of NAME; the "
                         "Kubernetes headless Service), dns://_service._tcp.NAME (SRV records), "
                         "?server=IP:PORT to ask that nameserver; etcd://HOST:PORT[/MODEL] (the "
                         "workers registered in etcd, e.g. by kvgate register). Re-resolved on "
                         "--discovery-interval-secs (DNS TTLs respected) or watched (etcd); the "
                         "endpoints found are added to `endpoints` live",
                 .default_note = "\"\" (none)",
                 .range = "dns://... or etcd://..."});
    return t;
  }();
  return kFields;
}

const FieldDef* find_field(std::string_view name) {
  for (const auto& f : fields()) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

std::vector<std::string_view> field_names() {
  std::vector<std::string_view> names;
  for (const auto& f : fields()) names.emplace_back(f.name);
  return names;
}

struct EndpointFieldDef {
  std::string_view name, type, default_text, range, help;
};
constexpr EndpointFieldDef kEndpointFields[] = {
    {"url", "string", "required", "http[s]://host[:port][/base]",
     "The server's address; two endpoints of a rule may not name the same server"},
    {"role", "string or integer", "none", "none, prefill, decode; or 0, 1, 2",
     "Prefill/decode role (SGLang P/D); a pool is all role-less, or prefill and decode"},
    {"bootstrapPort", "integer", "null (the rule's pdBootstrapPort)", "1..65535",
     "Prefill endpoints of SGLang P/D: this server's bootstrap port"},
    {"kvZmqPort", "integer", "null (the rule's kvZmqPort)", "1..65535",
     "This endpoint's rank-0 KV event port; rank r publishes on kvZmqPort + r"},
    {"weight", "integer", "1", "1..1000",
     "Relative capacity (stored; no policy weighs workers yet)"},
};

std::vector<std::string_view> endpoint_field_names() {
  std::vector<std::string_view> names;
  for (const auto& f : kEndpointFields) names.push_back(f.name);
  return names;
}

bool valid_name(std::string_view n) {
  return !n.empty() && n.size() <= 64 && std::all_of(n.begin(), n.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-';
  });
}

std::optional<EngineType> engine_from_string(std::string_view s) {
  std::string low = loose_name(s);
  if (low == "vllm") return EngineType::kVllm;
  if (low == "sglang") return EngineType::kSglang;
  if (low == "trtllm" || low == "tensorrtllm") return EngineType::kTrtllm;
  if (low == "llamacpp") return EngineType::kLlamacpp;
  return std::nullopt;
}

// Reads one endpoint (a mapping, or a URL string) of `doc` into `out`.
void parse_endpoint(const RuleDoc& doc, const std::string& field, Endpoint& out,
                    std::vector<FieldError>& errors) {
  auto set_url = [&](const std::string& url) {
    http::Target t;
    // Normalized when it parses; validate() reports the error of one that does not.
    out.url = http::parse_url(url, t).empty() ? t.url : url;
  };
  if (doc.kind == Kind::kString || (doc.yaml_plain && doc.is_scalar() && doc.kind != Kind::kNull)) {
    set_url(doc.text);
    return;
  }
  if (doc.kind != Kind::kMap) {
    errors.push_back({field, doc.brief(),
                      "expected an endpoint ({url: http://host:port, role: ...}) or a URL, got " +
                          std::string(doc.kind_name()),
                      doc.line});
    return;
  }
  bool has_url = false;
  for (const auto& m : doc.members) {
    std::string f = field + "." + m.key;
    const RuleDoc& v = m.value;
    if (m.key == "url") {
      std::string url;
      if (want_string(v, f, url, errors)) set_url(url);
      has_url = true;
    } else if (m.key == "role") {
      if (v.kind == Kind::kNull) continue;
      if (v.kind == Kind::kInt) {
        if (v.integer >= 0 && v.integer <= 2) {
          out.role = static_cast<Role>(v.integer);
        } else {
          errors.push_back(
              {f, v.brief(), "a role is none, prefill or decode (or 0, 1, 2)", v.line});
        }
        continue;
      }
      std::string s;
      if (!want_string(v, f, s, errors)) continue;
      std::string low = loose_name(s);
      if (low == "none") {
        out.role = Role::kNone;
      } else if (low == "prefill") {
        out.role = Role::kPrefill;
      } else if (low == "decode") {
        out.role = Role::kDecode;
      } else {
        errors.push_back({f, v.brief(), "a role is none, prefill or decode (or 0, 1, 2)", v.line});
      }
    } else if (m.key == "bootstrapPort" || m.key == "kvZmqPort") {
      if (v.kind == Kind::kNull) continue;
      int64_t n = 0;
      if (!want_int(v, f, n, errors)) continue;
      (m.key == "bootstrapPort" ? out.bootstrap_port : out.kv_zmq_port) = n;
    } else if (m.key == "weight") {
      if (v.kind != Kind::kNull) want_int(v, f, out.weight, errors);
    } else {
      errors.push_back({f, "",
                        "unknown endpoint field;" + suggestion(m.key, endpoint_field_names()) +
                            " (an endpoint has url, role, bootstrapPort, kvZmqPort, weight)",
                        m.line});
    }
  }
  if (!has_url) {
    errors.push_back(
        {field + ".url", "", "missing: every endpoint needs a url (http://host:port)", doc.line});
  }
}

void parse_field(const FieldDef& def, const RuleDoc& v, Rule& r, const std::string& field,
                 std::vector<FieldError>& errors) {
  if (v.kind == Kind::kNull && !def.required) return;  // null: the default
  switch (def.kind) {
    case FieldKind::kName:
      want_string(v, field, r.name, errors);
      return;
    case FieldKind::kModels:
      want_string_list(v, field, r.models, errors);
      return;
    case FieldKind::kInt:
      want_int(v, field, r.*def.member, errors);
      return;
    case FieldKind::kPdMode: {
      bool b = false;
      if (want_bool(v, field, b, errors)) r.pd_disagg_mode = b;
      return;
    }
    case FieldKind::kPathPrefix:
      want_string(v, field, r.path_prefix, errors);
      return;
    case FieldKind::kTokenizer:
      want_string(v, field, r.tokenizer_path, errors);
      return;
    case FieldKind::kDiscovery:
      want_string(v, field, r.discovery, errors);
      return;
    case FieldKind::kHashAlgo:
      want_string(v, field, r.kv_hash_algo, errors);
      return;
    case FieldKind::kSel:
      if (v.kind == Kind::kInt) {
        if (v.integer == 0) {
          r.sel = "round_robin";
        } else if (v.integer == 8) {
          r.sel = "chwbl";
        } else {
          errors.push_back({field, v.brief(),
                            "kvgate numbers only 0 (round_robin) and 8 (chwbl); name the policy "
                            "instead: one of " +
                                join(built_policies()),
                            v.line});
        }
        return;
      }
      want_string(v, field, r.sel, errors);
      return;
    case FieldKind::kEngine: {
      std::string s;
      if (!want_string(v, field, s, errors)) return;
      if (auto e = engine_from_string(s)) {
        r.kv_engine_type = *e;
      } else {
        errors.push_back({field, v.brief(),
                          "unknown engine: use one of vllm, sglang, trtllm, llamacpp", v.line});
      }
      return;
    }
    case FieldKind::kKnob:
      set_knob(*def.knob, r.policy_knobs, v, field, errors);
      return;
    case FieldKind::kEndpoints: {
      if (v.kind != Kind::kList) {
        errors.push_back({field, v.brief(),
                          "expected a list of endpoints ([{url: http://host:port}, ...]), got " +
                              std::string(v.kind_name()),
                          v.line});
        return;
      }
      r.endpoints.clear();
      for (size_t i = 0; i < v.items.size(); ++i) {
        Endpoint e;
        parse_endpoint(v.items[i], field + "[" + std::to_string(i) + "]", e, errors);
        r.endpoints.push_back(std::move(e));
      }
      return;
    }
  }
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

std::string where(const Rule& r) {
  return "port " + std::to_string(r.port) + (r.port == 0 ? " (any)" : "") + ", pathPrefix " +
         json_quote(r.path_prefix) + (r.path_prefix.empty() ? " (any)" : "");
}

// validate(), skipping the cross-field checks that involve a field in `failed` (a field that
// could not be read holds its default, which would make them report what was not written).
void validate_impl(const Rule& r, std::vector<FieldError>& errors,
                   const std::set<std::string, std::less<>>& failed) {
  auto skip = [&](std::initializer_list<std::string_view> involved) {
    return std::any_of(involved.begin(), involved.end(),
                       [&](std::string_view f) { return failed.count(f) > 0; });
  };
  auto err = [&](std::string field, std::string value, std::string msg) {
    errors.push_back({std::move(field), std::move(value), std::move(msg), 0});
  };
  const std::string engine(to_string(r.kv_engine_type));

  if (!skip({"name"}) && !valid_name(r.name)) {
    err("name", json_quote(r.name),
        r.name.empty() ? "missing: every rule needs a name (e.g. \"chat-pool\")"
                       : "must be 1 to 64 characters of A-Z a-z 0-9 _ . - (e.g. \"chat-pool\")");
  } else if (!skip({"name"}) && (r.name == "validate" || r.name == "." || r.name == "..")) {
    // /v1/rules/validate is a route; "." and ".." are collapsed by HTTP clients.
    err("name", json_quote(r.name), "is reserved; pick another name");
  }
  // Bounds of what a rule may hold (the admin API is trusted, but a typo in a generator should
  // not make a table that takes seconds to check or route through).
  if (r.models.size() > kMaxModelsPerRule) {
    err("models", std::to_string(r.models.size()) + " models",
        "at most " + std::to_string(kMaxModelsPerRule) + " per rule; split them over rules");
  }
  if (r.endpoints.size() > kMaxEndpointsPerRule) {
    err("endpoints", std::to_string(r.endpoints.size()) + " endpoints",
        "at most " + std::to_string(kMaxEndpointsPerRule) + " per rule; split them over rules");
  }
  for (size_t i = 0; i < r.models.size() && i < kMaxModelsPerRule; ++i) {
    const auto& m = r.models[i];
    std::string f = "models[" + std::to_string(i) + "]";
    if (m.empty() || m.size() > 256) {
      err(f, json_quote(m.substr(0, 80)), "a model name is 1 to 256 bytes");
    } else if (std::find(r.models.begin(), r.models.begin() + static_cast<long>(i), m) !=
               r.models.begin() + static_cast<long>(i)) {
      err(f, json_quote(m), "listed twice in this rule; list it once");
    }
  }
  for (const auto& def : fields()) {
    if (def.kind == FieldKind::kInt && !skip({def.name})) {
      int64_t v = r.*def.member;
      std::string msg;
      if (!def.choices.empty()) {
        if (std::find(def.choices.begin(), def.choices.end(), v) == def.choices.end()) {
          msg = "must be one of " + def.range;
        }
      } else if (v < def.min || v > def.max) {
        msg = "out of range: it must be between " + std::to_string(def.min) + " and " +
              std::to_string(def.max);
      }
      if (!msg.empty())
        err(def.name, std::to_string(v), def.hint.empty() ? msg : msg + "; " + def.hint);
    } else if (def.kind == FieldKind::kKnob && !skip({def.name})) {
      check_knob(*def.knob, r.policy_knobs, def.name, errors);
    }
  }
  if (!r.path_prefix.empty() &&
      (r.path_prefix.front() != '/' || r.path_prefix.size() > 1024 ||
       std::any_of(r.path_prefix.begin(), r.path_prefix.end(),
                   [](char c) { return static_cast<unsigned char>(c) <= ' ' || c == 0x7f; }))) {
    err("pathPrefix", json_quote(r.path_prefix.substr(0, 80)),
        "must start with '/' and hold no spaces or control characters (e.g. \"/v1\"), or be "
        "empty for any path");
  } else if (!r.path_prefix.empty()) {
    static constexpr std::string_view kProxied[] = {"/generate",       "/v1/chat/completions",
                                                    "/v1/completions", "/v1/responses/",
                                                    "/v1/embeddings",  "/v1/rerank",
                                                    "/v1/score",       "/v1/classify",
                                                    "/encode",         "/classify",
                                                    "/tokenize",       "/detokenize",
                                                    "/v1/tokenize",    "/v1/detokenize"};
    if (std::none_of(std::begin(kProxied), std::end(kProxied),
                     [&](std::string_view p) { return p.starts_with(r.path_prefix); })) {
      err("pathPrefix", json_quote(r.path_prefix.substr(0, 80)),
          "matches no path kvgate proxies (/generate, /v1/chat/completions, /v1/completions, "
          "/v1/responses, /v1/embeddings, /v1/rerank, /v1/score, /v1/classify, /encode, "
          "/classify, /tokenize, /detokenize, /v1/tokenize, /v1/detokenize): a rule with it "
          "would never be used");
    }
  }
  bool sel_ok = false;
  if (!skip({"sel"})) {
    auto built = built_policies();
    sel_ok = std::find(built.begin(), built.end(), r.sel) != built.end();
    if (!sel_ok) {
      bool known = std::any_of(all_policies().begin(), all_policies().end(),
                               [&](const PolicyInfo& p) { return p.name == r.sel; });
      if (r.sel == "kv_exact") {
        err("sel", json_quote(r.sel),
            "kv_exact is turned on by kvExactMode 3; sel names the policy for its misses: choose "
            "one of: " +
                join(built) + " (or 0 = round_robin, 8 = chwbl)");
      } else {
        err("sel", json_quote(r.sel),
            (known ? "not available in this build yet" : "unknown policy") +
                std::string("; choose one of: ") + join(built) +
                " (or 0 = round_robin, 8 = chwbl)");
      }
    }
  }

  // Endpoints and roles.
  size_t none = 0, prefill = 0, decode = 0;
  std::vector<std::string> seen;
  for (size_t i = 0; i < r.endpoints.size(); ++i) {
    const Endpoint& e = r.endpoints[i];
    std::string f = "endpoints[" + std::to_string(i) + "]";
    if (e.role == Role::kPrefill) {
      ++prefill;
    } else if (e.role == Role::kDecode) {
      ++decode;
    } else {
      ++none;
    }
    http::Target t;
    if (std::string why = http::parse_url(e.url, t); !why.empty()) {
      err(f + ".url", json_quote(e.url.substr(0, 200)), why);
    } else {
      std::string key = lower(t.url);
      auto dup = std::find(seen.begin(), seen.end(), key);
      if (dup != seen.end()) {
        err(f + ".url", json_quote(e.url),
            "the same server as endpoints[" + std::to_string(dup - seen.begin()) +
                "]; list each server once");
      }
    }
    seen.push_back(t.url.empty() ? e.url : lower(t.url));
    if (e.weight < 1 || e.weight > 1000) {
      err(f + ".weight", std::to_string(e.weight), "out of range: it must be between 1 and 1000");
    }
    if (e.bootstrap_port) {
      if (*e.bootstrap_port < 1 || *e.bootstrap_port > 65535) {
        err(f + ".bootstrapPort", std::to_string(*e.bootstrap_port),
            "out of range: it must be between 1 and 65535 (leave it out for the rule's "
            "pdBootstrapPort)");
      } else if (e.role != Role::kPrefill || r.kv_engine_type != EngineType::kSglang) {
        err(f + ".bootstrapPort", std::to_string(*e.bootstrap_port),
            "applies to prefill endpoints of SGLang prefill/decode only (role: prefill, "
            "kvEngineType: sglang); remove the field");
      }
    }
    if (e.kv_zmq_port) {
      int64_t p = *e.kv_zmq_port;
      if (p < 1 || p > 65535) {
        err(f + ".kvZmqPort", std::to_string(p), "out of range: it must be between 1 and 65535");
      } else if (e.role == Role::kDecode) {
        err(f + ".kvZmqPort", std::to_string(p),
            "a decode server caches only what its prefill server sent: KV-exact routing reads the "
            "prefill servers' events; remove the field");
      } else if (!skip({"kvDpRankCount"}) && r.kv_dp_rank_count >= 1 && r.kv_dp_rank_count <= 8 &&
                 p + r.kv_dp_rank_count - 1 > 65535) {
        err(f + ".kvZmqPort", std::to_string(p),
            "its " + std::to_string(r.kv_dp_rank_count) + " ranks publish on ports " +
                std::to_string(p) + ".." + std::to_string(p + r.kv_dp_rank_count - 1) +
                ", past 65535: choose a base port of at most " +
                std::to_string(65536 - r.kv_dp_rank_count));
      }
    }
  }
  bool endpoints_ok = !skip({"endpoints"});
  bool pd = prefill + decode > 0;
  bool role_partitioned = prefill > 0 && decode > 0 && none == 0;
  if (!r.discovery.empty() && !skip({"discovery"})) {
    discovery::Spec spec;
    if (std::string why = discovery::parse_spec(r.discovery, spec); !why.empty()) {
      err("discovery", json_quote(r.discovery.substr(0, 200)), why);
    }
  }
  if (endpoints_ok) {
    if (r.endpoints.empty() && !r.discovery.empty()) {
      // All found by discovery: nothing to check until it finds them.
    } else if (r.endpoints.empty()) {
      err("endpoints", "[]",
          "a rule needs at least one endpoint: endpoints: [{url: \"http://host:port\"}]");
    } else if (none > 0 && pd) {
      err("endpoints", "",
          "role-less endpoints mixed with prefill/decode ones: give every endpoint a role "
          "(prefill or decode) for prefill/decode, or none for a single pool");
    } else if (prefill > 0 && decode == 0) {
      err("endpoints", "",
          "prefill endpoints without a decode endpoint: prefill/decode needs at least one of "
          "each (role: decode)");
    } else if (decode > 0 && prefill == 0) {
      err("endpoints", "",
          "decode endpoints without a prefill endpoint: prefill/decode needs at least one of "
          "each (role: prefill)");
    }
    if (r.pd_disagg_mode && *r.pd_disagg_mode != pd && !skip({"pd_disagg_mode"})) {
      err("pd_disagg_mode", *r.pd_disagg_mode ? "true" : "false",
          *r.pd_disagg_mode ? "needs prefill and decode endpoints: give each endpoint a role "
                              "(prefill or 1, decode or 2)"
                            : "the endpoints have prefill/decode roles: set pd_disagg_mode: true, "
                              "or drop the roles");
    }
    if (pd && !skip({"kvEngineType"}) && r.kv_engine_type != EngineType::kSglang) {
      err("kvEngineType", json_quote(engine),
          "prefill/decode roles need kvEngineType sglang: kvgate runs SGLang's prefill/decode "
          "protocol (bootstrap_host, bootstrap_port, bootstrap_room); set kvEngineType: sglang, "
          "or drop the roles");
    }
    if (pd && !skip({"mode"}) && r.mode != 4) {
      err("mode", std::to_string(r.mode),
          "prefill/decode needs mode 4: kvgate adds the bootstrap fields to each request body; "
          "set mode: 4");
    }
  }
  if (r.pd_bootstrap_port != 0 && endpoints_ok && !skip({"kvEngineType"}) &&
      (!pd || r.kv_engine_type != EngineType::kSglang)) {
    err("pdBootstrapPort", std::to_string(r.pd_bootstrap_port),
        "applies to SGLang prefill/decode only (prefill and decode endpoints, kvEngineType "
        "sglang); remove the field");
  }

  // The policies of each side of prefill/decode.
  for (auto [name, value] : {std::pair<std::string_view, const std::string*>{
                                 "prefillPolicy", &r.policy_knobs.prefill_policy},
                             {"decodePolicy", &r.policy_knobs.decode_policy}}) {
    if (value->empty() || skip({name})) continue;
    if (endpoints_ok && !pd) {
      err(std::string(name), json_quote(*value),
          "applies to prefill/decode pools only (endpoints with roles prefill and decode); "
          "remove it, or use sel for a single pool");
    } else if (*value == "kv_exact") {
      err(std::string(name), json_quote(*value),
          name == "prefillPolicy"
              ? "KV-exact over the prefill servers is kvExactMode 1 (this field then names the "
                "policy for its misses): set kvExactMode: 1 and a policy here, or remove it"
              : "decode servers cache only what their prefill server sent, so KV-exact routing "
                "applies to the prefill side (kvExactMode 1): choose another decode policy");
    }
  }

  // What mode 0 (plain proxy: bodies not read) cannot do.
  if (r.mode == 0 && !skip({"mode"})) {
    if (sel_ok && policy_reads_request(r.sel)) {
      err("sel", json_quote(r.sel),
          "reads the request (body or routing headers), which mode 0 (plain proxy) does not: "
          "set mode: 4, or use round_robin, random or power_of_two");
    }
    if (!r.models.empty() && !skip({"models"})) {
      err("models", "[...]",
          "matching on the model needs the request body read: set mode: 4, or remove models");
    }
    if (r.policy_knobs.dp_aware && !skip({"dpAware"})) {
      err("dpAware", "true",
          "the chosen rank goes to the engine in the request body (routed_dp_rank), which mode "
          "0 (plain proxy) forwards unread: set mode: 4, or remove dpAware");
    }
  }

  // KV-exact.
  if (r.kv_exact_mode != 0 && !skip({"kvExactMode"})) {
    std::string v = std::to_string(r.kv_exact_mode);
    if (r.mode != 4 && !skip({"mode"})) {
      err("kvExactMode", v,
          "KV-exact routing needs mode 4 (fullproxy: it reads the prompt); set mode: 4");
    }
    if (endpoints_ok && r.kv_exact_mode == 3 && pd) {
      err("kvExactMode", v,
          "3 is KV-exact on a single role-less pool, and these endpoints have prefill/decode "
          "roles: use kvExactMode 1 for prefill/decode, or remove the roles");
    }
    if (endpoints_ok && r.kv_exact_mode == 1 && !role_partitioned) {
      err("kvExactMode", v,
          "1 is KV-exact with prefill/decode and needs a role-partitioned pool (at least one "
          "prefill and one decode endpoint, no role-less one): give the endpoints roles, or use "
          "kvExactMode 3 for a single pool");
    }
    if (!skip({"kvEngineType"}) &&
        (r.kv_engine_type == EngineType::kTrtllm || r.kv_engine_type == EngineType::kLlamacpp)) {
      err("kvExactMode", v,
          "kvgate cannot read " + engine +
              "'s KV events (it reads SGLang's and vLLM's): set kvExactMode 0, or run SGLang or "
              "vLLM");
    }
    if (r.tokenizer_path.empty() && !skip({"tokenizerPath"})) {
      err("tokenizerPath", "\"\"",
          "KV-exact routing matches the engine's pages of token ids, so kvgate must tokenize "
          "prompts as the engine does: set tokenizerPath to the model's directory (with "
          "tokenizer.json)");
    }
  }
  if (!r.tokenizer_path.empty() && r.mode != 4 && !skip({"tokenizerPath", "mode"})) {
    err("tokenizerPath", json_quote(r.tokenizer_path),
        "is used only in mode 4 (mode " + std::to_string(r.mode) +
            " forwards bodies unread): set mode 4, or remove tokenizerPath");
  }
  if (!skip({"kvZmqPort", "kvDpRankCount"}) && r.kv_zmq_port >= 1 && r.kv_zmq_port <= 65535 &&
      r.kv_dp_rank_count >= 1 && r.kv_dp_rank_count <= 8 &&
      r.kv_zmq_port + r.kv_dp_rank_count - 1 > 65535) {
    err("kvZmqPort", std::to_string(r.kv_zmq_port),
        std::to_string(r.kv_dp_rank_count) + " ranks publish on ports " +
            std::to_string(r.kv_zmq_port) + ".." +
            std::to_string(r.kv_zmq_port + r.kv_dp_rank_count - 1) +
            ", past 65535: choose a base port of at most " +
            std::to_string(65536 - r.kv_dp_rank_count));
  }
  if (!skip({"kvHashAlgo", "kvEngineType"}) && !r.kv_hash_algo.empty()) {
    const std::string& a = r.kv_hash_algo;
    const auto& vllm = vllm_hash_algos();
    bool vllm_algo = std::find(vllm.begin(), vllm.end(), a) != vllm.end();
    switch (r.kv_engine_type) {
      case EngineType::kSglang:
        if (a != "sha256_sglang") {
          err("kvHashAlgo", json_quote(a),
              std::string(vllm_algo ? "is vLLM's hash, and SGLang" : "SGLang") +
                  " hashes its pages with sha256_sglang: remove kvHashAlgo (it is derived from "
                  "the engine) or set sha256_sglang");
        }
        break;
      case EngineType::kVllm:
        if (!vllm_algo) {
          err("kvHashAlgo", json_quote(a),
              "vLLM's --prefix-caching-hash-algo is one of " + join(vllm) +
                  ": set the one the engines run with, or remove kvHashAlgo for vLLM's default "
                  "(sha256)");
        }
        break;
      case EngineType::kTrtllm:
      case EngineType::kLlamacpp:
        err("kvHashAlgo", json_quote(a),
            "kvgate reads no KV events of " + engine +
                ", so there is no hash to name: remove "
                "kvHashAlgo");
        break;
    }
  }
}

Json endpoint_json(const Endpoint& e) {
  Json j;
  j["url"] = e.url;
  j["role"] = std::string(to_string(e.role));
  j["bootstrapPort"] = e.bootstrap_port ? Json(*e.bootstrap_port) : Json(nullptr);
  j["kvZmqPort"] = e.kv_zmq_port ? Json(*e.kv_zmq_port) : Json(nullptr);
  j["weight"] = e.weight;
  return j;
}

Json rule_json(const Rule& r) {
  Json j;
  for (const auto& def : fields()) {
    switch (def.kind) {
      case FieldKind::kName:
        j[def.name] = r.name;
        break;
      case FieldKind::kModels:
        j[def.name] = r.models;
        break;
      case FieldKind::kInt:
        j[def.name] = r.*def.member;
        break;
      case FieldKind::kPdMode:
        j[def.name] = r.pd();
        break;
      case FieldKind::kPathPrefix:
        j[def.name] = r.path_prefix;
        break;
      case FieldKind::kSel:
        j[def.name] = r.sel;
        break;
      case FieldKind::kEngine:
        j[def.name] = std::string(to_string(r.kv_engine_type));
        break;
      case FieldKind::kHashAlgo:
        j[def.name] = r.kv_hash_algo.empty() ? std::string(default_hash_algo(r.kv_engine_type))
                                             : r.kv_hash_algo;
        break;
      case FieldKind::kTokenizer:
        j[def.name] = r.tokenizer_path;
        break;
      case FieldKind::kDiscovery:
        j[def.name] = r.discovery;
        break;
      case FieldKind::kKnob:
        j[def.name] = Json::parse(knob_json(*def.knob, r.policy_knobs));
        break;
      case FieldKind::kEndpoints: {
        Json list = Json::array();
        for (const auto& e : r.endpoints) list.push_back(endpoint_json(e));
        j[def.name] = std::move(list);
        break;
      }
    }
  }
  return j;
}

std::string md_cell(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '|')
      out += "\\|";
    else
      out.push_back(c);
  }
  return out;
}

}  // namespace

std::string_view to_string(Role r) {
  switch (r) {
    case Role::kNone:
      return "none";
    case Role::kPrefill:
      return "prefill";
    case Role::kDecode:
      return "decode";
  }
  return "none";
}

std::string_view to_string(EngineType e) {
  switch (e) {
    case EngineType::kVllm:
      return "vllm";
    case EngineType::kSglang:
      return "sglang";
    case EngineType::kTrtllm:
      return "trtllm";
    case EngineType::kLlamacpp:
      return "llamacpp";
  }
  return "vllm";
}

bool Rule::pd() const {
  return std::any_of(endpoints.begin(), endpoints.end(),
                     [](const Endpoint& e) { return e.role != Role::kNone; });
}

std::string_view default_hash_algo(EngineType e) {
  switch (e) {
    case EngineType::kSglang:
      return "sha256_sglang";
    case EngineType::kVllm:
      return "sha256";
    case EngineType::kTrtllm:
    case EngineType::kLlamacpp:
      return "";
  }
  return "";
}

bool policy_reads_request(std::string_view policy) {
  return policy != "round_robin" && policy != "random" && policy != "power_of_two";
}

std::optional<Rule> rule_from_doc(const RuleDoc& doc, const GatewayConfig& base,
                                  std::vector<FieldError>& errors, std::string_view prefix) {
  const size_t first = errors.size();
  const std::string pre(prefix);
  if (doc.kind != Kind::kMap) {
    errors.push_back({pre.empty() ? "" : pre.substr(0, pre.size() - 1), doc.brief(),
                      "a rule is a mapping: {name: ..., endpoints: [...], ...}, got " +
                          std::string(doc.kind_name()),
                      doc.line});
    return std::nullopt;
  }
  Rule r;
  r.policy_knobs = base;
  r.kv_hash_algo.clear();
  std::set<std::string, std::less<>> failed;
  auto names = field_names();
  for (const auto& m : doc.members) {
    const FieldDef* def = find_field(m.key);
    if (!def) {
      errors.push_back({pre + m.key, "",
                        "unknown field;" + suggestion(m.key, names) +
                            " (every field: docs/configuration.md, Rules)",
                        m.line});
      failed.insert(m.key);
      continue;
    }
    size_t before = errors.size();
    parse_field(*def, m.value, r, pre + m.key, errors);
    if (errors.size() > before) failed.insert(def->name);
  }
  for (const auto& def : fields()) {
    // Endpoints may all come from discovery.
    if (def.kind == FieldKind::kEndpoints && doc.find("discovery")) continue;
    if (def.required && !doc.find(def.name)) {
      errors.push_back({pre + def.name, "",
                        def.kind == FieldKind::kName
                            ? "missing: every rule needs a name (e.g. \"chat-pool\")"
                            : "missing: every rule needs endpoints: [{url: \"http://host:port\"}]",
                        doc.line});
      failed.insert(def.name);
    }
  }
  if (r.kv_hash_algo.empty()) r.kv_hash_algo = std::string(default_hash_algo(r.kv_engine_type));
  r.policy_knobs.policy = r.sel;
  r.policy_knobs.tokenizer_path = r.tokenizer_path;
  std::vector<FieldError> invalid;
  validate_impl(r, invalid, failed);
  for (auto& e : invalid) {
    e.line = line_of(doc, e.field);
    e.field = pre + e.field;
    errors.push_back(std::move(e));
  }
  if (errors.size() > first) return std::nullopt;
  return r;
}

std::optional<Rule> rule_from_json(std::string_view json, const GatewayConfig& base,
                                   std::vector<FieldError>& errors) {
  RuleDoc doc;
  size_t first = errors.size();
  if (!parse_json_doc(json, doc, errors)) return std::nullopt;
  auto rule = rule_from_doc(doc, base, errors);
  if (errors.size() > first) return std::nullopt;  // a key written twice
  return rule;
}

std::string listener_mismatch(const Rule& rule, int64_t listener_port) {
  if (rule.port == 0 || rule.port == listener_port) return "";
  return "port " + std::to_string(rule.port) +
         ": kvgate listens for inference on one port (--port " + std::to_string(listener_port) +
         "), so this rule would never be used; set port to that port or remove it";
}

void validate(const Rule& rule, std::vector<FieldError>& errors) {
  validate_impl(rule, errors, {});
}

void validate_table(std::span<const Rule> rules, std::vector<FieldError>& errors) {
  auto field = [](size_t i, std::string_view f) {
    return "rules[" + std::to_string(i) + "]." + std::string(f);
  };
  if (rules.size() > kMaxRules) {
    errors.push_back({"rules", std::to_string(rules.size()) + " rules",
                      "at most " + std::to_string(kMaxRules) +
                          " rules; merge rules that share endpoints (a rule lists many models)"});
    return;
  }
  for (size_t i = 0; i < rules.size(); ++i) {
    const Rule& r = rules[i];
    for (size_t j = 0; j < i; ++j) {
      const Rule& o = rules[j];
      if (o.name == r.name) {
        errors.push_back({field(i, "name"), json_quote(r.name),
                          "two rules are named " + json_quote(r.name) + " (also rules[" +
                              std::to_string(j) + "]); give each rule its own name",
                          0});
        break;
      }
    }
    for (size_t j = 0; j < i; ++j) {
      const Rule& o = rules[j];
      if (o.port != r.port || o.path_prefix != r.path_prefix) continue;
      if (r.models.empty() && o.models.empty()) {
        errors.push_back({field(i, "models"), "[]",
                          "rules " + json_quote(o.name) + " and " + json_quote(r.name) +
                              " both take every model on " + where(r) +
                              "; at most one catch-all per port and path: list models in one of "
                              "them, or give it its own port or pathPrefix",
                          0});
        break;
      }
      bool clash = false;
      for (size_t m = 0; m < r.models.size() && !clash; ++m) {
        if (std::find(o.models.begin(), o.models.end(), r.models[m]) == o.models.end()) continue;
        errors.push_back({field(i, "models[" + std::to_string(m) + "]"), json_quote(r.models[m]),
                          "also claimed by rule " + json_quote(o.name) + " on " + where(r) +
                              "; a request must match one rule: remove it from one of them, or "
                              "give one rule its own port or pathPrefix",
                          0});
        clash = true;
      }
      if (clash) break;
    }
  }
  // A server runs in one role (SGLang's --disaggregation-mode): a plain pool would send a prefill
  // server requests without a bootstrap room, which it refuses.
  std::map<std::string, std::pair<size_t, Role>, std::less<>> roles;
  for (size_t i = 0; i < rules.size(); ++i) {
    for (size_t e = 0; e < rules[i].endpoints.size(); ++e) {
      const Endpoint& ep = rules[i].endpoints[e];
      http::Target t;
      const std::string key = http::parse_url(ep.url, t).empty() ? lower(t.url) : ep.url;
      auto [it, fresh] = roles.try_emplace(key, i, ep.role);
      if (fresh || it->second.second == ep.role) continue;
      errors.push_back(
          {field(i, "endpoints[" + std::to_string(e) + "].role"), std::string(to_string(ep.role)),
           "the server " + ep.url + " is " + std::string(to_string(it->second.second)) +
               " in rule " + json_quote(rules[it->second.first].name) +
               "; a server runs in one role: give it the same role in both rules",
           0});
    }
  }
}

void validate_update(const Rule& current, const Rule& next, std::vector<FieldError>& errors) {
  if (current.name != next.name) {
    errors.push_back({"name", json_quote(next.name),
                      "a rule keeps its name (this is " + json_quote(current.name) +
                          "): create a rule with the new name and delete the old one",
                      0});
  }
  if (current.kv_engine_type != next.kv_engine_type) {
    errors.push_back({"kvEngineType", json_quote(to_string(next.kv_engine_type)),
                      "cannot change from " + std::string(to_string(current.kv_engine_type)) +
                          " on a live rule (its KV inventory and hash space belong to the old "
                          "engine): delete the rule and create it again",
                      0});
  }
}

std::string to_json(const Rule& rule) {
  return dump(rule_json(rule));
}

bool equivalent(const Rule& a, const Rule& b) {
  return rule_json(a) == rule_json(b);
}

Rule rule_from_flags(const GatewayConfig& c) {
  Rule r;
  r.name = "default";
  r.mode = 4;
  r.sel = c.policy;
  r.kv_engine_type = c.backend == "vllm" ? EngineType::kVllm : EngineType::kSglang;
  r.kv_hash_algo = std::string(default_hash_algo(r.kv_engine_type));
  r.policy_knobs = c;
  r.tokenizer_path = c.tokenizer_path;
  if (r.tokenizer_path.empty() && !c.model_path.empty()) {
    std::error_code ec;
    if (std::filesystem::exists(std::filesystem::path(c.model_path) / "tokenizer.json", ec)) {
      r.tokenizer_path = c.model_path;
    }
  }
  r.policy_knobs.tokenizer_path = r.tokenizer_path;
  auto add = [&](const std::string& url, Role role, std::optional<int64_t> bootstrap) {
    Endpoint e;
    http::Target t;
    e.url = http::parse_url(url, t).empty() ? t.url : url;
    e.role = role;
    e.bootstrap_port = bootstrap;
    r.endpoints.push_back(std::move(e));
  };
  for (const auto& u : c.worker_urls) add(u, Role::kNone, std::nullopt);
  r.discovery = c.discovery;
  for (const auto& p : c.prefill) {
    add(p.url, Role::kPrefill,
        p.bootstrap_port ? std::optional<int64_t>(*p.bootstrap_port) : std::nullopt);
  }
  for (const auto& d : c.decode) add(d, Role::kDecode, std::nullopt);
  r.kv_block_size = c.kv_block_size;
  r.kv_zmq_port = c.kv_zmq_port;
  r.kv_dp_rank_count = c.kv_dp_rank_count;
  r.kv_warmup_sec = c.kv_warmup_secs;
  // The command line's ways to say KV-exact: --policy kv_exact (kvExactMode 3, or 1 with
  // prefill/decode), --prefill-policy kv_exact (kvExactMode 1); --kv-fallback-policy decides
  // its misses.
  if (c.policy == "kv_exact") {
    r.kv_exact_mode = r.pd() ? 1 : 3;
    r.sel = c.kv_fallback_policy;
    r.policy_knobs.policy = r.sel;
  }
  if (r.pd() && c.prefill_policy == "kv_exact") {
    r.kv_exact_mode = 1;
    r.policy_knobs.prefill_policy = c.kv_fallback_policy;
  }
  return r;
}

std::vector<FieldInfo> rule_fields(const GatewayConfig& base) {
  std::vector<FieldInfo> out;
  Rule defaults;
  for (const auto& def : fields()) {
    FieldInfo f{def.name, def.type, def.default_note, def.range, def.help};
    if (f.default_text.empty()) {
      if (def.kind == FieldKind::kInt) {
        f.default_text = std::to_string(defaults.*def.member);
      } else if (def.kind == FieldKind::kKnob) {
        f.default_text = flags::default_text(*def.knob, base);
        if (f.default_text.empty()) f.default_text = "\"\"";
      }
    }
    out.push_back(std::move(f));
  }
  return out;
}

std::string rule_fields_markdown() {
  std::string out = "| Field | Type | Default | Range | Meaning |\n|---|---|---|---|---|\n";
  for (const auto& f : rule_fields(GatewayConfig{})) {
    out.append("| `")
        .append(f.name)
        .append("` | ")
        .append(f.type)
        .append(" | ")
        .append(md_cell(f.default_text))
        .append(" | ")
        .append(md_cell(f.range_text.empty() ? "-" : f.range_text))
        .append(" | ")
        .append(md_cell(f.help))
        .append(" |\n");
  }
  out.append(
      "\nEach endpoint:\n\n| Field | Type | Default | Range | Meaning |\n|---|---|---|---|---|\n");
  for (const auto& f : kEndpointFields) {
    out.append("| `")
        .append(f.name)
        .append("` | ")
        .append(f.type)
        .append(" | ")
        .append(md_cell(f.default_text))
        .append(" | ")
        .append(md_cell(f.range))
        .append(" | ")
        .append(md_cell(f.help))
        .append(" |\n");
  }
  return out;
}

std::string format_errors(std::span<const FieldError> errors, std::string_view file) {
  std::string out;
  for (const auto& e : errors) {
    if (!file.empty()) {
      out.append(file);
      if (e.line > 0) out.append(":").append(std::to_string(e.line));
      out.append(": ");
    } else if (e.line > 0) {
      out.append("line ").append(std::to_string(e.line)).append(": ");
    }
    if (!e.field.empty()) out.append(e.field).append(": ");
    if (!e.value.empty()) out.append(e.value).append(": ");
    out.append(e.message).append("\n");
  }
  return out;
}

}  // namespace kvgate::rules
