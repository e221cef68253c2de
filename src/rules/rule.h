// rules/rule: a rule is what an operator writes to get one pool of workers: which requests it
// takes (models, listener port, path prefix), how it routes them (mode, sel and the policy's own
// knobs, kv_exact, P/D) and its endpoints. Field names are the ones users of KV-exact gateways
// know (mode, sel, kvEngineType, kvExactMode, kvBlockSize, kvZmqPort, kvDpRankCount, ...); one
// table (rule_fields()) gives each its name, default, range and help, and drives parsing,
// validation, the effective rule printed back, and docs/configuration.md.
//
// A rule arrives as a JSON object (admin API) or a YAML mapping (config file); both become a
// RuleDoc (a small tree that remembers each value's line) and then a Rule. Validation reports
// every error at once, each naming the field, the value and the fix.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gateway/config.h"

namespace kvgate::rules {

// Bounds: rules in a table, models and endpoints in a rule.
inline constexpr size_t kMaxRules = 1024;
inline constexpr size_t kMaxModelsPerRule = 1024;
inline constexpr size_t kMaxEndpointsPerRule = 4096;
// SGLang's --disaggregation-bootstrap-port default (a rule's pdBootstrapPort 0).
inline constexpr int64_t kDefaultBootstrapPort = 8998;

enum class Role { kNone, kPrefill, kDecode };
std::string_view to_string(Role r);

struct Endpoint {
  std::string url;  // normalized (http::parse_url): scheme://host:port, no trailing slash
  Role role = Role::kNone;
  std::optional<int64_t> bootstrap_port;  // P/D prefill: SGLang's bootstrap port
  std::optional<int64_t> kv_zmq_port;     // this endpoint's rank-0 event port (else the rule's)
  int64_t weight = 1;
  bool operator==(const Endpoint&) const = default;
};

enum class EngineType { kVllm, kSglang, kTrtllm, kLlamacpp };
std::string_view to_string(EngineType e);

struct Rule {
  std::string name;  // [A-Za-z0-9_.-], 1..64 chars; unique in the table
  // Which requests it takes. Empty models: any model (the catch-all of its port/path).
  std::vector<std::string> models;
  int64_t port = 0;         // listener port the request came in on; 0: any
  std::string path_prefix;  // "" : any path
  // How it routes.
  int64_t mode = 0;                 // 0: plain proxy (bodies not read); 4: fullproxy, AI-aware
  std::string sel = "round_robin";  // a policy name (registry); numbers 0 and 8 accepted on input
  EngineType kv_engine_type = EngineType::kVllm;
  int64_t kv_exact_mode = 0;  // 0 off, 3 single role-less pool, 1 P/D
  int64_t kv_block_size = 16;
  std::string kv_hash_algo;  // effective (engine-derived when not given)
  int64_t kv_zmq_port = 5557;
  int64_t kv_dp_rank_count = 1;
  int64_t kv_warmup_sec = 30;
  int64_t pd_bootstrap_port = 0;  // 0: 8998
  // pd_disagg_mode as written (KV-exact gateways' P/D switch): must agree with the endpoints'
  // roles.
  std::optional<bool> pd_disagg_mode;
  std::string tokenizer_path;
  // The policy's own knobs, defaulting to the gateway's command-line values: the routing group
  // of the knob table, written in camelCase in a rule (cache-threshold -> cacheThreshold).
  GatewayConfig policy_knobs;
  std::vector<Endpoint> endpoints;
  // Where more endpoints come from (discovery/source.h: dns://..., etcd://...): what it finds is
  // added to `endpoints` (which may then be empty) while it finds it. "" : none.
  std::string discovery;

  bool pd() const;  // endpoints carry prefill/decode roles
};

// One error of a rule: the field (a path: "endpoints[2].role"), the value as written, what is
// wrong and how to fix it, and the line in the config file when it came from one (0 if not).
struct FieldError {
  std::string field;
  std::string value;
  std::string message;
  int line = 0;
};

// A parsed JSON or YAML value that remembers where it was written (rules/doc.h).
struct RuleDoc;

// Builds a rule from a JSON object (the admin API's body). `base` gives the policy knobs'
// defaults (the command line). Type errors, unknown fields (with a did-you-mean) and everything
// validate() finds are reported together; returns nullopt with every error in `errors`, else a
// rule that passes validate(). Its kvHashAlgo is filled (engine-derived when not given), and
// policy_knobs.policy / policy_knobs.tokenizer_path mirror sel / tokenizerPath, so policy_knobs
// alone describes the pool's policy.
std::optional<Rule> rule_from_json(std::string_view json, const GatewayConfig& base,
                                   std::vector<FieldError>& errors);

// Checks one rule on its own (all errors appended; empty: valid).
void validate(const Rule& rule, std::vector<FieldError>& errors);
// Checks rules together: unique names, no model claimed twice on the same port/path, at most one
// catch-all per port/path.
void validate_table(std::span<const Rule> rules, std::vector<FieldError>& errors);
// A rule naming a listener port kvgate does not listen on ("" when it matches or names none).
std::string listener_mismatch(const Rule& rule, int64_t listener_port);

// Whether `next` may replace `current` live (kvEngineType may not change: delete and recreate).
void validate_update(const Rule& current, const Rule& next, std::vector<FieldError>& errors);

// The effective rule as JSON, every field with its value (defaults included), in the table's
// order (compact, one line). rule_from_json(to_json(r)) gives r back.
std::string to_json(const Rule& rule);

// Whether two rules are the same in every field of the table (the policy knobs: those a rule
// sets; the rest of policy_knobs is not compared).
bool equivalent(const Rule& a, const Rule& b);

// The default rule made from --worker-urls and --policy (named "default", mode 4, any model, any
// port and path), with --backend as its engine, the routing knobs of `config`, and its tokenizer
// from --tokenizer-path (or --model-path when that is a directory holding tokenizer.json).
// --prefill / --decode servers become prefill / decode endpoints.
Rule rule_from_flags(const GatewayConfig& config);

// The hash kvHashAlgo takes when a rule does not give one: sglang -> "sha256_sglang", vllm ->
// "sha256" (vLLM's own default --prefix-caching-hash-algo); trtllm, llamacpp -> "" (kvgate reads
// no KV events of theirs).
std::string_view default_hash_algo(EngineType e);

// Whether a policy reads the request (its body or routing headers) and so needs mode 4: every
// policy but round_robin, random and power_of_two.
bool policy_reads_request(std::string_view policy);

// The rule fields' table (name, default, range, help), for docs and print-config. Defaults of
// the policy knobs are `base`'s.
struct FieldInfo {
  std::string name;
  std::string type;  // "integer", "string", "list of strings", ...
  std::string default_text;
  std::string range_text;
  std::string help;
};
std::vector<FieldInfo> rule_fields(const GatewayConfig& base);
// Every rule field and endpoint field as Markdown tables (docs/configuration.md; `kvgate
// print-config --rule-fields-markdown`).
std::string rule_fields_markdown();

// "field: value: message" lines, one per error (for logs and check-config). With `file`, each
// line starts with "file:line: " ("file: " when the line is not known).
std::string format_errors(std::span<const FieldError> errors, std::string_view file = {});

}  // namespace kvgate::rules
