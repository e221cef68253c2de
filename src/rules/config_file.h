// rules/config_file: `kvgate --config FILE`. The file is YAML (JSON is YAML too): its top-level
// keys are kvgate's knobs by their flag names (`port`, `policy`, `worker-urls`,
// `max-concurrent-requests`; snake_case and the router- prefix also work) plus `rules:`, a list of
// rule mappings (rules/rule.h). Flags given on the command line win over the file. When worker
// URLs are given (flag or file key) they become the rule "default" (rule_from_flags) next to the
// file's rules; a file rule named "default" must then be exactly that rule (print-config writes
// it out), else it is an error.
//
// Every error names the key (a path: "rules[1].endpoints[0].url"), the value, the fix and the
// line of the file.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gateway/config.h"
#include "rules/rule.h"

namespace kvgate::rules {

struct ConfigFile {
  // Defaults, then the file's knobs, then the knobs given on the command line.
  GatewayConfig config;
  // The file's rules in file order, then "default" from the worker URLs when there are any.
  std::vector<Rule> rules;
  // Knob names (flag spelling) set by the file or the command line, once each. Pass the
  // membership of "api-key" to load_api_key().
  std::vector<std::string> set_knobs;
};

// Reads FILE and merges it with the command line: `cli` is the config flags::parse() filled and
// `cli_set_knobs` its ParseOutcome::set. Validates everything kvgate would refuse at startup (the
// knobs and their cross-field checks, each rule, the rule table), except what needs the machine
// (files named by paths are not opened). Returns false with every error in `errors`, each with
// its line; format them with format_errors(errors, path).
bool load_config_file(const std::string& path, const GatewayConfig& cli,
                      std::span<const std::string> cli_set_knobs, ConfigFile& out,
                      std::vector<FieldError>& errors);
// The same on the file's text (tests, fuzzing).
bool load_config_text(std::string_view text, const GatewayConfig& cli,
                      std::span<const std::string> cli_set_knobs, ConfigFile& out,
                      std::vector<FieldError>& errors);

// The whole startup configuration from the command line (argv without the program name): flags,
// and the file of `--config FILE` (or `--config=FILE`) when there is one. Without a file, the
// worker URLs become the rule "default". Sets `config_path` to FILE ("" without one). Returns
// false with every error in `errors` (a flag error has the field "command line" and no line).
// --help and --help-markdown are not handled here: look for them first. What startup does after
// this: load_api_key(out.config, "api-key" in out.set_knobs).
bool load_command_line(std::span<const std::string> args, ConfigFile& out, std::string& config_path,
                       std::vector<FieldError>& errors);

// One knob whose value differs between two configs (for a reload: SIGHUP re-reads the file).
struct KnobChange {
  std::string name;    // flag name
  std::string before;  // values as JSON text (secrets redacted)
  std::string after;
  bool live = false;  // whether a running kvgate can take the change without a restart
};
// Every knob that differs, in the knob table's order. Live: the routing policy knobs and
// worker-urls (they rebuild the "default" rule's pool) and log-level; every other knob (listener,
// threads, TLS, metrics, timeouts, admission, retries, breakers, health) needs a restart.
std::vector<KnobChange> diff_knobs(const GatewayConfig& before, const GatewayConfig& after);

// The effective configuration: every knob (by flag name, in the table's order, api-key
// redacted) and every rule with every field. `json`: one JSON object; else YAML that
// load_config_file() reads back to the same configuration.
std::string print_config(const ConfigFile& config, bool json);

// The value print_config() writes for a secret; a file that holds it is refused.
inline constexpr std::string_view kRedacted = "<redacted>";

}  // namespace kvgate::rules
