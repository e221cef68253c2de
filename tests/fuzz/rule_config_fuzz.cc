// Fuzz target: the rule parser (rules/rule: rule_from_json, which reads admin API bodies) and the
// config file loader (rules/config_file: YAML, anchors and merge keys included). Any input must
// parse or fail with errors, never crash, throw or run away (nesting and alias expansion are
// bounded). Whatever parses as a rule must be valid and survive a round trip through to_json;
// whatever loads as a config must print.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "rules/config_file.h"
#include "rules/rule.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvgate;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  GatewayConfig base;
  std::vector<rules::FieldError> errors;
  if (auto rule = rules::rule_from_json(text, base, errors)) {
    if (!errors.empty()) __builtin_trap();
    rules::validate(*rule, errors);
    if (!errors.empty()) __builtin_trap();
    auto back = rules::rule_from_json(rules::to_json(*rule), base, errors);
    if (!back || !rules::equivalent(*rule, *back)) __builtin_trap();
  } else if (errors.empty()) {
    __builtin_trap();  // a refusal always says why
  }
  errors.clear();
  rules::ConfigFile file;
  std::vector<std::string> none;
  if (rules::load_config_text(text, base, none, file, errors)) {
    if (rules::print_config(file, true).empty()) __builtin_trap();
  } else if (errors.empty()) {
    __builtin_trap();
  }
  return 0;
}
