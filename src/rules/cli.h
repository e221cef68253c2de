// rules/cli: the config subcommands of the kvgate binary.
//   kvgate check-config FILE [FLAG...]   validates FILE (with the flags, as kvgate would start with
//                                        them) without starting: every error with its line, exit
//                                        2; "FILE: ok, N rules" and exit 0 when it is valid.
//   kvgate print-config [--config FILE] [--format yaml|json] [FLAG...]
//                                        the effective configuration: every knob and every rule
//                                        with its defaults (api-key redacted).
//   kvgate print-config --rule-fields-markdown
//                                        the rule fields as Markdown (docs/configuration.md).
#pragma once

#include <iosfwd>
#include <span>
#include <string>

namespace kvgate::rules {

// `args` are the arguments after the subcommand's name. Return the process exit status.
int run_check_config_command(std::span<const std::string> args, std::ostream& out,
                             std::ostream& err);
int run_check_config_command(int argc, char** argv);
int run_print_config_command(std::span<const std::string> args, std::ostream& out,
                             std::ostream& err);
int run_print_config_command(int argc, char** argv);

}  // namespace kvgate::rules
