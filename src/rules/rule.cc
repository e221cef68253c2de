// rules/rule: see rule.h. (Interim: the minimum the pools need; the full model replaces it.)
#include "rules/rule.h"

#include <filesystem>
#include <nlohmann/json.hpp>

namespace kvgate::rules {

std::string_view to_string(Role r) {
  switch (r) {
    case Role::kPrefill:
      return "prefill";
    case Role::kDecode:
      return "decode";
    case Role::kNone:
      break;
  }
  return "none";
}

std::string_view to_string(EngineType e) {
  switch (e) {
    case EngineType::kSglang:
      return "sglang";
    case EngineType::kTrtllm:
      return "trtllm";
    case EngineType::kLlamacpp:
      return "llamacpp";
    case EngineType::kVllm:
      break;
  }
  return "vllm";
}

bool Rule::pd() const {
  for (const auto& e : endpoints) {
    if (e.role != Role::kNone) return true;
  }
  return false;
}

std::optional<Rule> rule_from_json(std::string_view, const GatewayConfig&,
                                   std::vector<FieldError>& errors) {
  errors.push_back({.field = "", .value = "", .message = "rules from JSON are not built yet"});
  return std::nullopt;
}

void validate(const Rule& rule, std::vector<FieldError>& errors) {
  if (rule.endpoints.empty()) {
    errors.push_back({.field = "endpoints", .value = "[]", .message = "a rule needs endpoints"});
  }
}

void validate_table(std::span<const Rule> rules, std::vector<FieldError>& errors) {
  for (size_t i = 0; i < rules.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (rules[i].name == rules[j].name) {
        errors.push_back({.field = "name", .value = rules[i].name, .message = "listed twice"});
      }
    }
  }
}

void validate_update(const Rule& current, const Rule& next, std::vector<FieldError>& errors) {
  if (current.kv_engine_type != next.kv_engine_type) {
    errors.push_back({.field = "kvEngineType",
                      .value = std::string(to_string(next.kv_engine_type)),
                      .message = "cannot change; delete the rule and create it again"});
  }
}

std::string to_json(const Rule& r) {
  nlohmann::ordered_json j;
  j["name"] = r.name;
  j["models"] = r.models;
  j["port"] = r.port;
  j["pathPrefix"] = r.path_prefix;
  j["mode"] = r.mode;
  j["sel"] = r.sel;
  j["kvEngineType"] = std::string(to_string(r.kv_engine_type));
  j["kvExactMode"] = r.kv_exact_mode;
  j["tokenizerPath"] = r.tokenizer_path;
  auto eps = nlohmann::ordered_json::array();
  for (const auto& e : r.endpoints) {
    eps.push_back({{"url", e.url}, {"role", std::string(to_string(e.role))}, {"weight", e.weight}});
  }
  j["endpoints"] = eps;
  return j.dump();
}

Rule rule_from_flags(const GatewayConfig& c) {
  Rule r;
  r.name = "default";
  r.mode = 4;
  r.sel = c.policy;
  r.policy_knobs = c;
  r.tokenizer_path = c.tokenizer_path;
  if (r.tokenizer_path.empty() && !c.model_path.empty() &&
      std::filesystem::exists(std::filesystem::path(c.model_path) / "tokenizer.json")) {
    r.tokenizer_path = c.model_path;
  }
  for (const auto& u : c.worker_urls) r.endpoints.push_back({.url = u});
  return r;
}

std::vector<FieldInfo> rule_fields(const GatewayConfig&) {
  return {};
}

std::string format_errors(std::span<const FieldError> errors) {
  std::string out;
  for (const auto& e : errors) {
    out += e.field.empty() ? e.message : e.field + ": " + e.message;
    out += "\n";
  }
  return out;
}

}  // namespace kvgate::rules
