// Tests for rules/cli: `kvgate check-config` and `kvgate print-config` (exit status, output,
// help), and every file in examples/ loads and validates.
#include "rules/cli.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "rules/config_file.h"

namespace kvgate::rules {
namespace {

namespace fs = std::filesystem;

struct Result {
  int status;
  std::string out, err;
};

Result check(std::vector<std::string> args) {
  std::ostringstream out, err;
  int status = run_check_config_command(args, out, err);
  return {status, out.str(), err.str()};
}

Result print(std::vector<std::string> args) {
  std::ostringstream out, err;
  int status = run_print_config_command(args, out, err);
  return {status, out.str(), err.str()};
}

class TempFile {
 public:
  explicit TempFile(std::string_view text) {
    static int n = 0;
    path_ = (fs::temp_directory_path() / ("kvgate-cli-test-" + std::to_string(::getpid()) + "-" +
                                          std::to_string(n++) + ".yaml"))
                .string();
    std::ofstream(path_) << text;
  }
  ~TempFile() { fs::remove(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(CheckConfig, ValidFile) {
  TempFile f("rules:\n  - {name: a, models: [m], mode: 4, endpoints: [http://127.0.0.1:1]}\n");
  auto r = check({f.path()});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, f.path() + ": ok, 1 rule\n");
  // With flags after the file, as kvgate would start.
  r = check({f.path(), "--worker-urls", "http://127.0.0.1:2", "--policy", "random"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, f.path() + ": ok, 2 rules\n");
}

TEST(CheckConfig, InvalidFilePrintsEveryErrorWithItsLine) {
  TempFile f("port: x\nrules:\n  - name: a\n    mode: 7\n    endpoints: [http://127.0.0.1:1]\n");
  auto r = check({f.path()});
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find(f.path() + ":1: port: \"x\": expected an integer, got a string"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find(f.path() + ":4: rules[0].mode: 7: must be one of 0, 4"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("kvgate check-config: 2 errors in " + f.path()), std::string::npos) << r.err;
}

TEST(CheckConfig, UsageAndHelp) {
  auto r = check({});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("give the file to check"), std::string::npos);
  r = check({"--help"});
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.out.find("Usage: kvgate check-config FILE"), std::string::npos);
  r = check({"/nonexistent.yaml"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("/nonexistent.yaml: cannot read it"), std::string::npos) << r.err;
  // What startup reads is read: an empty key file stops kvgate, so it fails the check.
  TempFile key("");
  TempFile f("worker-urls: [http://127.0.0.1:1]\napi-key-file: " + key.path() + "\n");
  r = check({f.path()});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("is empty: write the key on its first line"), std::string::npos) << r.err;
}

TEST(PrintConfig, YamlJsonAndRedaction) {
  auto r = print({"--worker-urls", "http://127.0.0.1:1", "--api-key", "s3cret"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out.find("s3cret"), std::string::npos);
  EXPECT_NE(r.out.find("rules:\n  - name: \"default\"\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("max-concurrent-requests: -1\n"), std::string::npos);

  r = print({"--format", "json", "--worker-urls", "http://127.0.0.1:1"});
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["rules"][0]["sel"], "cache_aware");

  r = print({"--format", "toml"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("choose yaml or json"), std::string::npos);

  r = print({});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("no workers"), std::string::npos) << r.err;

  r = print({"--help"});
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.out.find("--rule-fields-markdown"), std::string::npos);

  r = print({"--rule-fields-markdown"});
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out, rule_fields_markdown());
}

TEST(Examples, EveryExampleLoadsAndValidates) {
  fs::path dir = fs::path(KVGATE_SOURCE_DIR) / "examples";
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    auto ext = e.path().extension();
    if (ext != ".yaml" && ext != ".yml" && ext != ".json") continue;
    ++files;
    ConfigFile out;
    std::vector<FieldError> errors;
    std::vector<std::string> none;
    bool ok = load_config_file(e.path().string(), GatewayConfig{}, none, out, errors);
    EXPECT_TRUE(ok) << format_errors(errors, e.path().string());
    EXPECT_FALSE(out.rules.empty()) << e.path();
    // What print-config shows of it reads back to the same configuration.
    std::string printed = print_config(out, false);
    ConfigFile back;
    ASSERT_TRUE(load_config_text(printed, GatewayConfig{}, none, back, errors))
        << format_errors(errors) << printed;
    EXPECT_EQ(print_config(back, false), printed);
  }
  EXPECT_GE(files, 4u);
}

TEST(Examples, EveryExampleStartsAsCheckConfigSays) {
  // Every example is valid and this build runs it (prefill/decode and kvExactMode 1 included):
  // check-config says ok.
  fs::path dir = fs::path(KVGATE_SOURCE_DIR) / "examples";
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    auto ext = e.path().extension();
    if (ext != ".yaml" && ext != ".yml" && ext != ".json") continue;
    ++files;
    std::ostringstream o, er;
    const std::vector<std::string> args = {e.path().string()};
    EXPECT_EQ(run_check_config_command(args, o, er), 0) << e.path() << er.str();
    EXPECT_NE(o.str().find(": ok, "), std::string::npos) << o.str();
  }
  EXPECT_GE(files, 4u);
}

}  // namespace
}  // namespace kvgate::rules
