// rules/cli: `kvgate check-config` and `kvgate print-config`. See cli.h.
#include "rules/cli.h"

#include <algorithm>
#include <iostream>
#include <vector>

#include "rules/config_file.h"

namespace kvgate::rules {
namespace {

constexpr std::string_view kCheckHelp =
    "Usage: kvgate check-config FILE [FLAG...]\n"
    "\n"
    "Checks a kvgate config file without starting the gateway: the knobs (kvgate's flags by\n"
    "name), every rule and the rule table, merged with the flags given after FILE exactly as\n"
    "`kvgate --config FILE FLAG...` would merge them (a flag wins over the file). Prints every\n"
    "error with its line (FILE:LINE: field: value: what is wrong and the fix) and exits with 2;\n"
    "prints \"FILE: ok, N rules\" and exits with 0 when kvgate would start with it.\n"
    "Paths the file names (tokenizerPath, TLS files) are not opened; api-key-file is read.\n"
    "\n"
    "Example:\n"
    "  kvgate check-config examples/cache-aware.yaml\n"
    "  kvgate check-config gateway.yaml --port 8080\n"
    "\n"
    "File format: docs/configuration.md (\"Config file\" and \"Rules\").\n";

constexpr std::string_view kPrintHelp =
    "Usage: kvgate print-config [--config FILE] [--format yaml|json] [FLAG...]\n"
    "       kvgate print-config --rule-fields-markdown\n"
    "\n"
    "Prints the configuration kvgate would run with: every knob by its flag name (defaults\n"
    "included, api-key redacted) and every rule with every field, from the flags and the file\n"
    "of --config (a flag wins over the file; worker URLs become the rule \"default\"). The YAML\n"
    "output is a config file kvgate reads back. An invalid configuration prints its errors and\n"
    "exits with 2.\n"
    "\n"
    "  --config FILE            YAML or JSON config file\n"
    "  --format yaml|json       Output format [default: yaml]\n"
    "  --rule-fields-markdown   Print every rule field (type, default, range, meaning) as "
    "Markdown\n"
    "  -h, --help               Show this help and exit\n"
    "\n"
    "Example:\n"
    "  kvgate print-config --worker-urls http://127.0.0.1:30001 --policy round_robin\n"
    "  kvgate print-config --config examples/two-models.yaml --format json\n";

bool wants_help(std::span<const std::string> args) {
  return std::any_of(args.begin(), args.end(),
                     [](const std::string& a) { return a == "-h" || a == "--help"; });
}

std::string plural(size_t n, std::string_view one) {
  return std::to_string(n) + " " + std::string(one) + (n == 1 ? "" : "s");
}

// Loads the command line; on failure prints the errors and returns false.
bool load(std::span<const std::string> args, ConfigFile& cfg, std::string& path, std::ostream& err,
          std::string_view command) {
  std::vector<FieldError> errors;
  bool ok = load_command_line(args, cfg, path, errors);
  if (ok) {
    // What startup does next: read --api-key-file (an unreadable or empty key file stops it).
    bool api_key_given =
        std::find(cfg.set_knobs.begin(), cfg.set_knobs.end(), "api-key") != cfg.set_knobs.end();
    GatewayConfig copy = cfg.config;
    if (std::string e = load_api_key(copy, api_key_given); !e.empty()) {
      errors.push_back({"", "", e, 0});
    }
  }
  if (errors.empty()) return true;
  err << format_errors(errors, path);
  err << "kvgate " << command << ": " << plural(errors.size(), "error")
      << (path.empty() ? "" : " in " + path) << "\n";
  return false;
}

std::vector<std::string> to_args(int argc, char** argv) {
  return std::vector<std::string>(argv, argv + argc);
}

}  // namespace

int run_check_config_command(std::span<const std::string> args, std::ostream& out,
                             std::ostream& err) {
  if (wants_help(args)) {
    out << kCheckHelp;
    return 0;
  }
  std::vector<std::string> a(args.begin(), args.end());
  if (!a.empty() && !a[0].starts_with("-")) a.insert(a.begin(), "--config");
  if (std::find_if(a.begin(), a.end(), [](const std::string& s) {
        return s == "--config" || s.starts_with("--config=");
      }) == a.end()) {
    err << "kvgate check-config: give the file to check: kvgate check-config FILE (see --help)\n";
    return 2;
  }
  ConfigFile cfg;
  std::string path;
  if (!load(a, cfg, path, err, "check-config")) return 2;
  bool refused = false;
  for (const auto& r : cfg.rules) {
    if (std::string why = listener_mismatch(r, cfg.config.port); !why.empty()) {
      err << path << ": rule " << r.name << ": " << why << "\n";
      refused = true;
    }
  }
  if (refused) {
    err << path << ": valid, but kvgate would refuse to start with it (see above)\n";
    return 2;
  }
  out << path << ": ok, " << plural(cfg.rules.size(), "rule") << "\n";
  return 0;
}

int run_check_config_command(int argc, char** argv) {
  auto args = to_args(argc, argv);
  return run_check_config_command(args, std::cout, std::cerr);
}

int run_print_config_command(std::span<const std::string> args, std::ostream& out,
                             std::ostream& err) {
  if (wants_help(args)) {
    out << kPrintHelp;
    return 0;
  }
  std::vector<std::string> rest;
  std::string format = "yaml";
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--rule-fields-markdown") {
      out << rule_fields_markdown();
      return 0;
    }
    if (a == "--format" || a.starts_with("--format=")) {
      if (a == "--format" && i + 1 >= args.size()) {
        err << "kvgate print-config: --format needs a value: yaml or json\n";
        return 2;
      }
      format = a == "--format" ? args[++i] : a.substr(9);
      if (format != "yaml" && format != "json") {
        err << "kvgate print-config: --format '" << format
            << "' is not a format; choose yaml or json\n";
        return 2;
      }
      continue;
    }
    rest.push_back(a);
  }
  ConfigFile cfg;
  std::string path;
  if (!load(rest, cfg, path, err, "print-config")) return 2;
  out << print_config(cfg, format == "json");
  return 0;
}

int run_print_config_command(int argc, char** argv) {
  auto args = to_args(argc, argv);
  return run_print_config_command(args, std::cout, std::cerr);
}

}  // namespace kvgate::rules
