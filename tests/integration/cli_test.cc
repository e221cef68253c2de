// Integration tests of the kvgate binary's command line: --help, bad flags, startup errors.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "support/process.h"

namespace kvgate::testing {
namespace {

TEST(Cli, HelpReadsWell) {
  auto r = run("kvgate", {"--help"});
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.output.find("Usage: kvgate"), std::string::npos);
  EXPECT_NE(r.output.find("--worker-urls"), std::string::npos);
  EXPECT_NE(r.output.find("Circuit breaker:"), std::string::npos);
}

TEST(Cli, UnknownFlagFailsWithSuggestion) {
  auto r = run("kvgate", {"--worker-urls", "http://127.0.0.1:1", "--polciy", "random"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("did you mean '--policy'"), std::string::npos) << r.output;
}

TEST(Cli, InvalidValueFails) {
  auto r = run("kvgate", {"--worker-urls", "http://127.0.0.1:1", "--retry-max-retries", "zero"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("--retry-max-retries: 'zero' is not an integer"), std::string::npos)
      << r.output;
}

TEST(Cli, KvExactWithoutATokenizerFailsAtStartup) {
  auto r = run("kvgate", {"--worker-urls", "http://127.0.0.1:1", "--policy", "kv_exact"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("give --tokenizer-path"), std::string::npos) << r.output;
}

TEST(Cli, MissingTokenizerIsAStartupError) {
  auto r = run("kvgate",
               {"--worker-urls", "http://127.0.0.1:1", "--tokenizer-path", "/nonexistent/model",
                "--port", "0", "--prometheus-port", "0", "--admin-port", "0"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("--tokenizer-path /nonexistent/model: cannot open"), std::string::npos)
      << r.output;
}

TEST(Cli, CheckConfigAndPrintConfig) {
  std::string example = std::string(KVGATE_SOURCE_DIR) + "/examples/cache-aware.yaml";
  auto ok = run("kvgate", {"check-config", example});
  EXPECT_EQ(ok.status, 0) << ok.output;
  EXPECT_NE(ok.output.find("cache-aware.yaml: ok, 1 rule"), std::string::npos) << ok.output;
  auto bad = run("kvgate", {"check-config", example, "--port", "99999"});
  EXPECT_EQ(bad.status, 2) << bad.output;
  EXPECT_NE(bad.output.find("--port: 99999 is out of range"), std::string::npos) << bad.output;
  auto print = run("kvgate", {"print-config", "--config", example, "--format", "json"});
  EXPECT_EQ(print.status, 0) << print.output;
  EXPECT_NE(print.output.find("\"cacheThreshold\": 0.5"), std::string::npos) << print.output;
}

TEST(Cli, UnbindableAddressIsAClearError) {
  // 203.0.113.0/24 is TEST-NET-3: never a local address, so bind() fails.
  auto r = run("kvgate", {"--worker-urls", "http://127.0.0.1:1", "--policy", "round_robin",
                          "--host", "203.0.113.7", "--port", "1", "--prometheus-port", "0"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("cannot listen on 203.0.113.7:1"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace kvgate::testing

namespace kvgate::testing {
namespace {

std::string trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  size_t i = 0;
  while (i < s.size() && s[i] == '\n') ++i;
  return s.substr(i);
}

TEST(Docs, ConfigurationMatchesBinaries) {
  std::ifstream in(std::string(KVGATE_SOURCE_DIR) + "/docs/configuration.md");
  std::stringstream doc;
  doc << in.rdbuf();
  for (const char* bin : {"kvgate", "kvgate-sim"}) {
    auto r = run(bin, {"--help-markdown"});
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(doc.str().find(trimmed(r.output)), std::string::npos)
        << "docs/configuration.md is out of date for " << bin << ": run scripts/gen-docs";
  }
  auto rules = run("kvgate", {"print-config", "--rule-fields-markdown"});
  ASSERT_EQ(rules.status, 0) << rules.output;
  EXPECT_NE(doc.str().find(trimmed(rules.output)), std::string::npos)
      << "docs/configuration.md is out of date for the rule fields: run scripts/gen-docs";
}

}  // namespace
}  // namespace kvgate::testing
