// rules/config_file: see config_file.h.
#include "rules/config_file.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "replica/sync.h"
#include "rules/doc.h"

namespace kvgate::rules {
namespace {

using Json = nlohmann::ordered_json;
using Knob = flags::Knob<GatewayConfig>;
using Kind = RuleDoc::Kind;

constexpr size_t kMaxFileBytes = 16 << 20;

const Knob* find_knob(std::string_view key) {
  std::string name(key);
  std::replace(name.begin(), name.end(), '_', '-');
  for (int pass = 0; pass < 2; ++pass) {
    for (const auto& k : gateway_knobs()) {
      if (k.name == name) return &k;
    }
    if (!name.starts_with("router-")) break;
    name = name.substr(7);
  }
  return nullptr;
}

void copy_knob(const Knob& k, const GatewayConfig& from, GatewayConfig& to) {
  if (k.name == "prefill") {
    to.prefill = from.prefill;
    return;
  }
  if (k.name == "prometheus-duration-buckets") {
    to.prometheus_duration_buckets = from.prometheus_duration_buckets;
    return;
  }
  if (k.name == "prometheus-short-duration-buckets") {
    to.prometheus_short_duration_buckets = from.prometheus_short_duration_buckets;
    return;
  }
  std::visit(
      [&](auto member) {
        if constexpr (!std::is_same_v<decltype(member), std::monostate>) {
          to.*member = from.*member;
        }
      },
      k.field);
}

// A JSON value as YAML flow text: JSON with a space after each ':' and ',' of an object, which
// every YAML parser reads ("a":1 needs YAML 1.2's JSON-compatible keys).
std::string flow(const Json& v) {
  if (!v.is_object()) return v.dump(-1, ' ', false, Json::error_handler_t::replace);
  std::string out = "{";
  for (const auto& [key, value] : v.items()) {
    if (out.size() > 1) out.append(", ");
    out.append(Json(key).dump(-1, ' ', false, Json::error_handler_t::replace))
        .append(": ")
        .append(flow(value));
  }
  return out + "}";
}

std::string redacted(const Knob& k, const GatewayConfig& c) {
  if (k.name == "api-key" && !c.api_key.empty()) return Json(std::string(kRedacted)).dump();
  // A NATS URL may carry credentials (nats://user:password@host).
  if (k.name == "replica-sync") return Json(replica::redact_url(c.replica_sync)).dump();
  if (k.name == "admin-api-key" && !c.admin_api_key.empty()) {
    return Json(std::string(kRedacted)).dump();
  }
  return knob_json(k, c);
}

// The knob a message of validate(GatewayConfig) is about: "--name..." at its start.
std::string knob_named_first(const std::string& msg) {
  if (!msg.starts_with("--")) return "";
  size_t end = 2;
  while (end < msg.size() &&
         (std::isalnum(static_cast<unsigned char>(msg[end])) || msg[end] == '-'))
    ++end;
  return msg.substr(2, end - 2);
}

// "rules[3].models" with 3 an index into `index`'s domain -> the file's index; the rule made
// from the worker URLs is reported under worker-urls.
void remap_table_error(FieldError& e, const std::vector<size_t>& file_index, size_t default_at,
                       const RuleDoc& root, const std::map<std::string, int>& knob_lines) {
  if (!e.field.starts_with("rules[")) return;
  size_t close = e.field.find(']');
  size_t k = 0;
  std::from_chars(e.field.data() + 6, e.field.data() + close, k);
  if (k == default_at) {
    e.field = "worker-urls";
    auto it = knob_lines.find("worker-urls");
    e.line = it == knob_lines.end() ? 0 : it->second;
    return;
  }
  if (k < file_index.size()) {
    e.field = "rules[" + std::to_string(file_index[k]) + "]" + e.field.substr(close + 1);
    e.line = line_of(root, e.field);
  }
}

// The file's document (null: no file) merged with the command line into `out`.
bool load_doc(const RuleDoc& root, const GatewayConfig& cli,
              std::span<const std::string> cli_set_knobs, ConfigFile& out,
              std::vector<FieldError>& errors) {
  const size_t first = errors.size();
  out = ConfigFile{};
  GatewayConfig& cfg = out.config;
  std::map<std::string, int> knob_lines;  // knobs whose value comes from the file
  const RuleDoc* rules_doc = nullptr;
  int rules_line = 0;
  auto note_set = [&](std::string_view name) {
    if (std::find(out.set_knobs.begin(), out.set_knobs.end(), name) == out.set_knobs.end()) {
      out.set_knobs.emplace_back(name);
    }
  };

  if (root.kind == Kind::kMap) {
    std::vector<std::string_view> names = {"rules"};
    for (const auto& k : gateway_knobs()) {
      if (k.unsupported_reason.empty()) names.push_back(k.name);
    }
    std::vector<FieldInfo> rule_field_list = rule_fields(GatewayConfig{});
    for (const auto& m : root.members) {
      if (m.key == "rules") {
        rules_doc = &m.value;
        rules_line = m.line;
        continue;
      }
      const Knob* k = find_knob(m.key);
      if (!k) {
        bool rule_field = std::any_of(
            rule_field_list.begin(), rule_field_list.end(),
            [&](const FieldInfo& f) { return f.name == m.key && find_knob(m.key) == nullptr; });
        if (rule_field) {
          errors.push_back({m.key, "",
                            "a rule field, not a knob: put it inside a rule, under rules: (the "
                            "top level takes kvgate's flags by name)",
                            m.line});
        } else {
          errors.push_back({m.key, "",
                            "unknown key;" + suggestion(m.key, names) +
                                " (the top level takes kvgate's flags by name, as in kvgate "
                                "--help, and rules:)",
                            m.line});
        }
        continue;
      }
      std::string field(m.key);
      if (k->name == "config") {
        errors.push_back({field, m.value.brief(),
                          "a config file cannot name another: give --config on the command line",
                          m.value.line});
        continue;
      }
      bool secret = k->name == "api-key" || k->name == "admin-api-key";
      if (secret && m.value.text == kRedacted) {
        errors.push_back({field, m.value.brief(),
                          "this is the placeholder print-config writes for the key: put the real "
                          "key (better: api-key-file, a file holding it)",
                          m.value.line});
        continue;
      }
      // An empty key is no key (print-config writes api-key: "" when none is set).
      if (secret && m.value.kind == Kind::kString && m.value.text.empty()) continue;
      size_t before = errors.size();
      if (set_knob(*k, cfg, m.value, field, errors)) {
        check_knob(*k, cfg, field, errors, m.value.line);
      }
      // A knob in error keeps its default, so rules do not inherit (and report) the bad value.
      if (errors.size() > before) copy_knob(*k, GatewayConfig{}, cfg);
      knob_lines[std::string(k->name)] = m.line;
      note_set(k->name);
    }
  } else if (root.kind != Kind::kNull) {
    errors.push_back({"", root.brief(),
                      "a config file is a mapping: kvgate's flags by name (port: 30000, policy: "
                      "cache_aware, ...) and rules: [...]",
                      root.line});
    return false;
  }

  // The command line wins over the file.
  for (const auto& name : cli_set_knobs) {
    const Knob* k = find_knob(name);
    if (!k) continue;
    copy_knob(*k, cli, cfg);
    knob_lines.erase(std::string(k->name));
    note_set(k->name);
  }
  auto knob_line = [&](const std::string& name) {
    auto it = knob_lines.find(name);
    return it == knob_lines.end() ? 0 : it->second;
  };

  // The file's rules, against the merged knobs (their policy knobs' defaults).
  std::vector<size_t> file_index;
  if (rules_doc && rules_doc->kind != Kind::kNull) {
    if (rules_doc->kind != Kind::kList) {
      errors.push_back({"rules", rules_doc->brief(),
                        "expected a list of rules (rules: [{name: ..., endpoints: [...]}, ...]), "
                        "got " +
                            std::string(rules_doc->kind_name()),
                        rules_line});
    } else {
      for (size_t i = 0; i < rules_doc->items.size(); ++i) {
        auto rule =
            rule_from_doc(rules_doc->items[i], cfg, errors, "rules[" + std::to_string(i) + "].");
        if (!rule) continue;
        out.rules.push_back(std::move(*rule));
        file_index.push_back(i);
      }
    }
  }
  const bool has_file_rules =
      rules_doc && rules_doc->kind == Kind::kList && !rules_doc->items.empty();
  const bool has_workers = !cfg.worker_urls.empty() || !cfg.prefill.empty() ||
                           !cfg.decode.empty() || !cfg.discovery.empty();

  // Knob cross-checks (validate(GatewayConfig)). With rules and no worker URLs, "no workers" does
  // not apply: a stand-in URL keeps it quiet.
  if (!has_file_rules && !has_workers) {
    errors.push_back({"", "",
                      "no workers: give worker-urls (--worker-urls http://host:port ..., or "
                      "worker-urls: [...] in a config file), discovery (--discovery "
                      "dns://NAME:PORT) or rules",
                      0});
  } else {
    GatewayConfig check = cfg;
    if (!has_workers || (cfg.worker_urls.empty() && cfg.prefill.empty() && cfg.decode.empty() &&
                         !cfg.pd_disaggregation)) {
      // (--discovery alone: the rule's workers come from it)
      if (check.worker_urls.empty() && !cfg.pd_disaggregation) {
        check.worker_urls = {"http://127.0.0.1:1"};
      }
    }
    if (std::string e = validate(check); !e.empty()) {
      errors.push_back({"", "", e, knob_line(knob_named_first(e))});
    }
  }

  // The rule of the worker URLs, then the table.
  size_t default_at = SIZE_MAX;
  if (has_workers) {
    auto named_default = std::find_if(out.rules.begin(), out.rules.end(),
                                      [](const Rule& r) { return r.name == "default"; });
    if (named_default != out.rules.end()) {
      // Spelled out in the file (print-config writes it so): it must be what the URLs make.
      if (!equivalent(*named_default, rule_from_flags(cfg))) {
        size_t i = file_index[static_cast<size_t>(named_default - out.rules.begin())];
        std::string field = "rules[" + std::to_string(i) + "].name";
        errors.push_back({field, "\"default\"",
                          "the worker URLs (worker-urls) make the rule named \"default\", and "
                          "this one differs from it: rename this rule, or remove worker-urls "
                          "(this rule then stands alone), or remove this rule",
                          rules_doc ? line_of(root, field) : 0});
      }
    } else {
      default_at = out.rules.size();
      out.rules.push_back(rule_from_flags(cfg));
    }
  }
  std::vector<FieldError> table;
  validate_table(out.rules, table);
  for (auto& e : table) {
    remap_table_error(e, file_index, default_at, root, knob_lines);
    errors.push_back(std::move(e));
  }
  return errors.size() == first;
}

}  // namespace

bool load_config_text(std::string_view text, const GatewayConfig& cli,
                      std::span<const std::string> cli_set_knobs, ConfigFile& out,
                      std::vector<FieldError>& errors) {
  RuleDoc root;
  const size_t first = errors.size();
  if (!parse_yaml_doc(text, root, errors)) return false;
  bool ok = load_doc(root, cli, cli_set_knobs, out, errors);
  return ok && errors.size() == first;
}

bool load_config_file(const std::string& path, const GatewayConfig& cli,
                      std::span<const std::string> cli_set_knobs, ConfigFile& out,
                      std::vector<FieldError>& errors) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    errors.push_back({"", "",
                      std::string("cannot read it (") + std::strerror(errno) +
                          "); give the path of a YAML or JSON file kvgate can read",
                      0});
    return false;
  }
  std::string text;
  char buf[65536];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    text.append(buf, static_cast<size_t>(in.gcount()));
    if (text.size() > kMaxFileBytes) {
      errors.push_back({"", "",
                        "larger than " + std::to_string(kMaxFileBytes >> 20) +
                            " MiB; a config file this large is a mistake",
                        0});
      return false;
    }
  }
  return load_config_text(text, cli, cli_set_knobs, out, errors);
}

bool load_command_line(std::span<const std::string> args, ConfigFile& out, std::string& config_path,
                       std::vector<FieldError>& errors) {
  config_path.clear();
  std::vector<std::string> rest;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string_view a = args[i];
    std::optional<std::string> value;
    if (a == "--config") {
      if (i + 1 >= args.size()) {
        errors.push_back(
            {"command line", "", "--config needs a value: --config FILE (YAML or JSON)", 0});
        return false;
      }
      value = args[++i];
    } else if (a.starts_with("--config=")) {
      value = std::string(a.substr(9));
    } else {
      rest.emplace_back(a);
      continue;
    }
    if (!config_path.empty()) {
      errors.push_back({"command line", "", "--config is given twice; give one file", 0});
      return false;
    }
    config_path = *value;
    if (config_path.empty()) {
      errors.push_back({"command line", "", "--config needs a file name", 0});
      return false;
    }
  }
  GatewayConfig cli;
  auto parsed = flags::parse(gateway_knobs(), rest, cli);
  if (!parsed.ok) {
    errors.push_back({"command line", "", parsed.error, 0});
    return false;
  }
  if (!parsed.positional.empty()) {
    errors.push_back(
        {"command line", "", "unexpected argument '" + parsed.positional[0] + "' (see --help)", 0});
    return false;
  }
  if (!config_path.empty()) return load_config_file(config_path, cli, parsed.set, out, errors);
  return load_doc(RuleDoc{}, cli, parsed.set, out, errors);
}

std::vector<KnobChange> diff_knobs(const GatewayConfig& before, const GatewayConfig& after) {
  std::vector<KnobChange> out;
  for (const auto& k : gateway_knobs()) {
    if (!k.unsupported_reason.empty()) continue;
    std::string a = redacted(k, before), b = redacted(k, after);
    if (a == b && !(k.name == "api-key" && before.api_key != after.api_key) &&
        !(k.name == "admin-api-key" && before.admin_api_key != after.admin_api_key) &&
        !(k.name == "replica-sync" && before.replica_sync != after.replica_sync)) {
      continue;
    }
    bool live = k.group == "Routing policy" || k.name == "worker-urls" || k.name == "log-level";
    out.push_back({std::string(k.name), a, b, live});
  }
  return out;
}

std::string print_config(const ConfigFile& c, bool json) {
  std::vector<std::pair<std::string, std::string>> knobs;  // name, JSON text
  for (const auto& k : gateway_knobs()) {
    if (!k.unsupported_reason.empty() || k.name == "config") continue;
    knobs.emplace_back(std::string(k.name), redacted(k, c.config));
  }
  std::vector<std::string> rules;
  for (const auto& r : c.rules) rules.push_back(to_json(r));
  if (json) {
    Json root;
    for (const auto& [name, value] : knobs) root[name] = Json::parse(value);
    Json list = Json::array();
    for (const auto& r : rules) list.push_back(Json::parse(r));
    root["rules"] = std::move(list);
    return root.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
  }
  // YAML in block style at the top, each value written as JSON (a JSON value is a YAML flow
  // value), so strings keep their quotes and nothing is re-typed on the way back.
  std::string out =
      "# kvgate print-config: the effective configuration, every knob and every rule with its\n"
      "# defaults (kvgate --config FILE reads it back).\n";
  for (const auto& [name, value] : knobs) out.append(name).append(": ").append(value).append("\n");
  if (rules.empty()) {
    out.append("rules: []\n");
    return out;
  }
  out.append("rules:\n");
  for (const auto& text : rules) {
    Json r = Json::parse(text);
    bool first = true;
    for (const auto& [key, value] : r.items()) {
      out.append(first ? "  - " : "    ").append(key).append(":");
      first = false;
      if (key == "endpoints" && !value.empty()) {
        out.append("\n");
        for (const auto& e : value) out.append("      - ").append(flow(e)).append("\n");
        continue;
      }
      out.append(" ").append(flow(value)).append("\n");
    }
  }
  return out;
}

}  // namespace kvgate::rules
