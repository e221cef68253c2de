// rules/doc: the small tree a rule or a config file is parsed into before it becomes a Rule or a
// GatewayConfig. JSON (nlohmann's SAX parser) and YAML (yaml-cpp's event parser) both build it;
// each value remembers its line (YAML; 0 for JSON), a key written twice is an error instead of a
// silent overwrite, and nesting and alias expansion are bounded so hostile input cannot exhaust the
// stack or memory. Internal to rules/ (rule.cc, config_file.cc) and its tests.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gateway/config.h"
#include "rules/rule.h"

namespace kvgate::rules {

struct RuleDoc {
  enum class Kind : uint8_t { kNull, kBool, kInt, kDouble, kString, kList, kMap };
  struct Member;

  Kind kind = Kind::kNull;
  bool boolean = false;
  int64_t integer = 0;
  double number = 0;  // kDouble (kInt: also set)
  // Scalars: the text as written (kString: the string itself).
  std::string text;
  // An unquoted YAML scalar: it may stand for a string wherever one is expected (`host: 0.0.0.0`,
  // `models: [3.5]`), as YAML does not make anyone quote text.
  bool yaml_plain = false;
  int line = 0;                 // 1-based; 0: not known (JSON)
  std::vector<RuleDoc> items;   // kList
  std::vector<Member> members;  // kMap, in the order written

  bool is_scalar() const { return kind != Kind::kList && kind != Kind::kMap; }
  // The member `key` of a map, or null.
  const RuleDoc* find(std::string_view key) const;
  // The value as an error shows it: scalars as JSON (strings quoted, long ones cut), "[...]" for a
  // list and "{...}" for a map.
  std::string brief() const;
  // "an integer", "a string", "a list", ... (for "expected X, got Y").
  std::string_view kind_name() const;
};

struct RuleDoc::Member {
  std::string key;
  int line = 0;
  RuleDoc value;
};

// Bounds for untrusted documents.
constexpr size_t kMaxDocDepth = 32;
constexpr size_t kMaxDocNodes = 200000;  // values, aliases expanded

// Parses JSON text into `out`. Returns false with the errors appended (not JSON, a key written
// twice, nesting deeper than kMaxDocDepth).
bool parse_json_doc(std::string_view text, RuleDoc& out, std::vector<FieldError>& errors);
// Parses one YAML document (JSON is YAML) into `out`; an empty text is a null document. Anchors
// and aliases are expanded (within kMaxDocNodes) and `<<` merge keys applied. Returns false with
// the errors appended, each with its line.
bool parse_yaml_doc(std::string_view text, RuleDoc& out, std::vector<FieldError>& errors);

// The line of `path` ("endpoints[1].role") inside `doc`, or of its nearest ancestor written in
// the document (a field left out takes its rule's line).
int line_of(const RuleDoc& doc, std::string_view path);

// Builds a rule from its document (see rule_from_json). `prefix` is prepended to every error's
// field ("rules[2]."), and errors take their line from `doc`.
std::optional<Rule> rule_from_doc(const RuleDoc& doc, const GatewayConfig& base,
                                  std::vector<FieldError>& errors, std::string_view prefix = {});

// A knob of the gateway's table set from a document value, with the type the knob's field has
// (and, for custom knobs such as --prefill, the values its handler takes). `field` names it in
// errors. Returns false with an error appended.
bool set_knob(const flags::Knob<GatewayConfig>& knob, GatewayConfig& config, const RuleDoc& value,
              const std::string& field, std::vector<FieldError>& errors);
// The knob's range and choices checked on its value in `config` (errors appended).
void check_knob(const flags::Knob<GatewayConfig>& knob, const GatewayConfig& config,
                const std::string& field, std::vector<FieldError>& errors, int line = 0);
// The knob's value in `config` as JSON text ("0.3", "\"random\"", "[\"a\", \"b\"]", "true").
// Custom knobs: --prefill as [[URL, PORT|null], ...], --prometheus-duration-buckets and
// --prometheus-short-duration-buckets as numbers.
std::string knob_json(const flags::Knob<GatewayConfig>& knob, const GatewayConfig& config);

// Typed reads of a value for `field`: each returns false and appends "expected X, got Y" (with a
// hint when the text would do without its quotes) when the value has another type.
bool want_int(const RuleDoc& v, const std::string& field, int64_t& out,
              std::vector<FieldError>& errors);
bool want_number(const RuleDoc& v, const std::string& field, double& out,
                 std::vector<FieldError>& errors);
bool want_bool(const RuleDoc& v, const std::string& field, bool& out,
               std::vector<FieldError>& errors);
// A string, or an unquoted YAML scalar's text.
bool want_string(const RuleDoc& v, const std::string& field, std::string& out,
                 std::vector<FieldError>& errors);
// A list of strings (`single_ok`: one string stands for a list of one).
bool want_string_list(const RuleDoc& v, const std::string& field, std::vector<std::string>& out,
                      std::vector<FieldError>& errors, bool single_ok = false);

// "cache-threshold" -> "cacheThreshold".
std::string camel_case(std::string_view kebab);
// Letters only, lower-cased: "kv_exact-Mode" and "kvExactMode" both give "kvexactmode".
std::string loose_name(std::string_view name);
// " did you mean 'X'?" for the closest of `names` (the same name in another spelling first), or "".
std::string suggestion(std::string_view name, const std::vector<std::string_view>& names);

}  // namespace kvgate::rules
