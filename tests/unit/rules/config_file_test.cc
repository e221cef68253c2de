// Tests for rules/config_file: the YAML config file (knobs by flag name and rules), errors with
// their line numbers, command-line flags winning over the file, the rule made from worker URLs,
// print-config's output read back, and the knob diff a reload reports.
#include "rules/config_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "rules/doc.h"

namespace kvgate::rules {
namespace {

struct Loaded {
  bool ok = false;
  ConfigFile file;
  std::vector<FieldError> errors;
  std::string text() const { return format_errors(errors, "gw.yaml"); }
};

// Loads `yaml` as if kvgate were started with `args` and --config.
Loaded load(std::string_view yaml, std::vector<std::string> args = {}) {
  Loaded l;
  GatewayConfig cli;
  auto parsed = flags::parse(gateway_knobs(), args, cli);
  EXPECT_TRUE(parsed.ok) << parsed.error;
  l.ok = load_config_text(yaml, cli, parsed.set, l.file, l.errors);
  EXPECT_EQ(l.ok, l.errors.empty()) << l.text();
  return l;
}

const char* kTwoPools = R"(# two pools
port: 31000
max_concurrent_requests: 64     # snake_case works too
router-queue-size: 10           # and the router- prefix
cache-threshold: 0.6            # the rules' policy knobs default to it
rules:
  - name: a
    models: [m1]
    mode: 4
    sel: cache_aware
    endpoints: [http://127.0.0.1:1]
  - name: b
    mode: 4
    sel: cache_aware
    cacheThreshold: 0.2
    endpoints:
      - url: http://127.0.0.1:2
)";

TEST(ConfigFile, KnobsAndRules) {
  auto l = load(kTwoPools);
  ASSERT_TRUE(l.ok) << l.text();
  EXPECT_EQ(l.file.config.port, 31000);
  EXPECT_EQ(l.file.config.max_concurrent_requests, 64);
  EXPECT_EQ(l.file.config.queue_size, 10);
  ASSERT_EQ(l.file.rules.size(), 2u);
  EXPECT_EQ(l.file.rules[0].name, "a");
  EXPECT_DOUBLE_EQ(l.file.rules[0].policy_knobs.cache_threshold, 0.6);
  EXPECT_DOUBLE_EQ(l.file.rules[1].policy_knobs.cache_threshold, 0.2);
  for (const char* k : {"port", "max-concurrent-requests", "queue-size", "cache-threshold"}) {
    EXPECT_NE(std::find(l.file.set_knobs.begin(), l.file.set_knobs.end(), k),
              l.file.set_knobs.end())
        << k;
  }
}

TEST(ConfigFile, FlagsWinOverTheFile) {
  auto l = load(kTwoPools, {"--port", "8080", "--cache-threshold", "0.9", "--queue-size", "5"});
  ASSERT_TRUE(l.ok) << l.text();
  EXPECT_EQ(l.file.config.port, 8080);
  EXPECT_EQ(l.file.config.queue_size, 5);
  EXPECT_EQ(l.file.config.max_concurrent_requests, 64);  // not on the command line: the file's
  // The command line's routing knobs are the rules' defaults too; a rule's own value still wins.
  EXPECT_DOUBLE_EQ(l.file.rules[0].policy_knobs.cache_threshold, 0.9);
  EXPECT_DOUBLE_EQ(l.file.rules[1].policy_knobs.cache_threshold, 0.2);
  // A flag left at its default on the command line does not override the file.
  auto l2 = load(kTwoPools, {"--host", "127.0.0.1"});
  EXPECT_EQ(l2.file.config.port, 31000);
}

TEST(ConfigFile, WorkerUrlsBecomeTheDefaultRule) {
  auto l = load(R"(
worker-urls: [http://127.0.0.1:1, http://127.0.0.1:2]
policy: round_robin
rules:
  - {name: chat, models: [m], mode: 4, endpoints: [http://127.0.0.1:3]}
)");
  ASSERT_TRUE(l.ok) << l.text();
  ASSERT_EQ(l.file.rules.size(), 2u);
  EXPECT_EQ(l.file.rules[1].name, "default");
  EXPECT_EQ(l.file.rules[1].sel, "round_robin");
  EXPECT_EQ(l.file.rules[1].endpoints.size(), 2u);

  // From the command line too.
  auto l2 = load("rules: [{name: chat, models: [m], mode: 4, endpoints: [http://127.0.0.1:3]}]",
                 {"--worker-urls", "http://127.0.0.1:9"});
  ASSERT_TRUE(l2.ok) << l2.text();
  EXPECT_EQ(l2.file.rules.back().endpoints[0].url, "http://127.0.0.1:9");

  // Only flags: one rule.
  auto l3 = load("", {"--worker-urls", "http://127.0.0.1:9"});
  ASSERT_TRUE(l3.ok) << l3.text();
  ASSERT_EQ(l3.file.rules.size(), 1u);
  EXPECT_EQ(l3.file.rules[0].name, "default");
}

TEST(ConfigFile, TheDefaultRuleCollides) {
  auto named = load(R"(worker-urls: [http://127.0.0.1:1]
rules:
  - name: default
    models: [m]
    mode: 4
    endpoints: [http://127.0.0.1:3]
)");
  EXPECT_FALSE(named.ok);
  EXPECT_NE(named.text().find("gw.yaml:3: rules[0].name: \"default\": the worker URLs "
                              "(worker-urls) make the rule named \"default\", and this one "
                              "differs from it"),
            std::string::npos)
      << named.text();

  auto catch_all = load(R"(worker-urls: [http://127.0.0.1:1]
rules:
  - name: any
    endpoints: [http://127.0.0.1:3]
)");
  EXPECT_FALSE(catch_all.ok);
  EXPECT_NE(catch_all.text().find("gw.yaml:1: worker-urls: []: rules \"any\" and \"default\" "
                                  "both take every model"),
            std::string::npos)
      << catch_all.text();
}

TEST(ConfigFile, ErrorsCarryTheirLine) {
  auto l = load(R"(port: 70000
polcy: random
rules:
  - name: a
    mode: 4
    sel: cache_aware
    kvExactMode: 3
    endpoints:
      - url: http://127.0.0.1:1
        role: leader
  - name: b
    mode: 4
    kvBlockSize: "16"
    endpoints: [http://127.0.0.1:2]
  - name: c
    models: [x]
    mode: 4
    endpoints: [http://127.0.0.1:3]
  - name: d
    models: [x]
    mode: 4
    endpoints: [http://127.0.0.1:4]
)");
  EXPECT_FALSE(l.ok);
  std::string t = l.text();
  for (const char* expect : {
           "gw.yaml:1: port: 70000: out of range: it must be between 0 and 65535",
           "gw.yaml:2: polcy: unknown key; did you mean 'policy'?",
           "gw.yaml:10: rules[0].endpoints[0].role: \"leader\": a role is none, prefill or decode",
           "gw.yaml:13: rules[1].kvBlockSize: \"16\": expected an integer, got a string",
           "gw.yaml:20: rules[3].models[0]: \"x\": also claimed by rule \"c\"",
       }) {
    EXPECT_NE(t.find(expect), std::string::npos) << expect << "\n" << t;
  }
  // A field left out is reported at its rule's line.
  auto missing = load(R"(rules:
  - name: a
    mode: 4
    kvExactMode: 3
    endpoints: [http://127.0.0.1:1]
)");
  EXPECT_NE(missing.text().find("gw.yaml:2: rules[0].tokenizerPath: \"\": KV-exact routing"),
            std::string::npos)
      << missing.text();
}

TEST(ConfigFile, KnobCrossChecksPointAtTheKnob) {
  auto l = load(R"(worker-urls: [http://127.0.0.1:1]
retry-initial-backoff-ms: 500
retry-max-backoff-ms: 100
)");
  EXPECT_FALSE(l.ok);
  EXPECT_NE(l.text().find("gw.yaml:3: --retry-max-backoff-ms (100) is below"), std::string::npos)
      << l.text();
}

TEST(ConfigFile, ShapesOfTheFile) {
  struct Case {
    std::string yaml;
    std::string expect;
  };
  std::string deep = "a: " + std::string(100, '[') + std::string(100, ']') + "\n";
  std::vector<Case> cases = {
      {"", "no workers: give worker-urls"},
      {"port: 1\n", "no workers"},
      {"- a\n- b\n", "gw.yaml:1: [...]: a config file is a mapping"},
      {"port: [1\n", "gw.yaml:2: not valid YAML"},
      {"port: 1\nport: 2\n",
       "gw.yaml:2: port: written twice in the same mapping (first at line 1)"},
      {"port: 1\n---\nport: 2\n", "more than one YAML document"},
      {deep, "nested more than 32 levels deep"},
      {"rules: {name: a}\n", "gw.yaml:1: rules: {...}: expected a list of rules"},
      {"rules: [5]\n", "rules[0]: 5: a rule is a mapping"},
      {"kvBlockSize: 16\n", "gw.yaml:1: kvBlockSize: a rule field, not a knob"},
      {"worker-urls: http://127.0.0.1:1\nselector: [a]\n",
       "gw.yaml:2: selector: not supported by kvgate: Kubernetes discovery is not built"},
      {"worker-urls: [http://127.0.0.1:1]\npolicy: kv_exact\n",
       "gw.yaml:2: --policy kv_exact matches the engines' pages of token ids"},
      {"worker-urls: [http://127.0.0.1:1]\nlog-level: loud\n",
       "gw.yaml:2: log-level: \"loud\": not a valid value; choose one of: debug, info, warn, "
       "error"},
      {"worker-urls: [http://127.0.0.1:1]\ndebug-headers: maybe\n",
       "gw.yaml:2: debug-headers: \"maybe\": expected a boolean"},
      {"worker-urls: [http://127.0.0.1:1]\napi-key: \"<redacted>\"\n",
       "the placeholder print-config writes"},
      {"worker-urls: [http://127.0.0.1:1]\nprometheus-duration-buckets: [0.1, -1]\n",
       "bucket bound -1 must be > 0"},
  };
  for (const auto& c : cases) {
    auto l = load(c.yaml);
    EXPECT_FALSE(l.ok) << c.yaml;
    EXPECT_NE(l.text().find(c.expect), std::string::npos) << c.yaml << "\n" << l.text();
  }
}

TEST(ConfigFile, YamlConveniences) {
  auto l = load(R"(
worker-urls: http://127.0.0.1:1     # one URL for a list of one
debug-headers: yes                   # YAML 1.1 booleans, as the command line takes them
host: 127.0.0.1                      # unquoted text
prometheus-duration-buckets: [0.5, 1, 2]
defaults: &defaults                  # anchors and merge keys
  mode: 4
  sel: cache_aware
  kvEngineType: sglang
rules:
  - <<: *defaults
    name: a
    models: [m1, 3.5]                # an unquoted number in a list of strings is its text
    endpoints: [http://127.0.0.1:2]
  - <<: *defaults
    name: b
    sel: random                      # written here: wins over the merged value
    models: [m2]
    endpoints: [http://127.0.0.1:3]
)");
  // `defaults` is not a knob: the anchor's home must be a key kvgate knows.
  EXPECT_FALSE(l.ok);
  EXPECT_NE(l.text().find("defaults: unknown key"), std::string::npos) << l.text();

  auto ok = load(R"(
worker-urls: http://127.0.0.1:1
debug-headers: yes
host: 127.0.0.1
prometheus-duration-buckets: [0.5, 1, 2]
rules:
  - &a
    name: a
    mode: 4
    sel: cache_aware
    kvEngineType: sglang
    models: [m1, 3.5]
    endpoints: [http://127.0.0.1:2]
  - <<: *a
    name: b
    sel: random
    models: [m2]
    endpoints: [http://127.0.0.1:3]
)");
  ASSERT_TRUE(ok.ok) << ok.text();
  EXPECT_EQ(ok.file.config.worker_urls.size(), 1u);
  EXPECT_TRUE(ok.file.config.debug_headers);
  EXPECT_EQ(ok.file.config.host, "127.0.0.1");
  EXPECT_EQ(ok.file.config.prometheus_duration_buckets.size(), 3u);
  ASSERT_EQ(ok.file.rules.size(), 3u);
  EXPECT_EQ(ok.file.rules[0].models[1], "3.5");
  EXPECT_EQ(ok.file.rules[1].sel, "random");
  EXPECT_EQ(ok.file.rules[1].kv_engine_type, EngineType::kSglang);  // merged
}

TEST(ConfigFile, JsonIsYamlToo) {
  auto l = load(R"({"port": 1234, "rules": [{"name": "a", "endpoints": ["http://127.0.0.1:1"]}]})");
  ASSERT_TRUE(l.ok) << l.text();
  EXPECT_EQ(l.file.config.port, 1234);
  EXPECT_EQ(l.file.rules.size(), 1u);
}

TEST(ConfigFile, AliasExpansionIsBounded) {
  // The "billion laughs": every level multiplies the values by 10.
  std::string yaml = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n";
  for (int i = 1; i < 9; ++i) {
    std::string prev = "*a" + std::to_string(i - 1);
    yaml += "a" + std::to_string(i) + ": &a" + std::to_string(i) + " [";
    for (int k = 0; k < 10; ++k) yaml += (k ? ", " : "") + prev;
    yaml += "]\n";
  }
  auto l = load(yaml);
  EXPECT_FALSE(l.ok);
  EXPECT_NE(l.text().find("aliases expanded"), std::string::npos) << l.text();
}

TEST(ConfigFile, PrintConfigReadsBack) {
  std::string two_models = kTwoPools;
  two_models.replace(two_models.find("  - name: b\n"), 12, "  - name: b\n    models: [m2]\n");
  auto l = load(two_models, {"--worker-urls", "http://127.0.0.1:9", "--api-key", "s3cret",
                             "--prometheus-duration-buckets", "0.1", "1"});
  ASSERT_TRUE(l.ok) << l.text();
  std::string yaml = print_config(l.file, false);
  EXPECT_EQ(yaml.find("s3cret"), std::string::npos);
  EXPECT_NE(yaml.find("api-key: \"<redacted>\""), std::string::npos);
  // Read back (with the key given again: the file holds only its placeholder).
  std::string without_key = yaml;
  without_key.replace(without_key.find("api-key: \"<redacted>\""), 21, "api-key: \"s3cret\"");
  auto back = load(without_key);
  ASSERT_TRUE(back.ok) << back.text() << "\n" << without_key;
  EXPECT_EQ(print_config(back.file, false), yaml);
  // a, b, and default: written out and the same as what worker-urls make, so it stands.
  EXPECT_EQ(back.file.rules.size(), 3u);
  EXPECT_TRUE(diff_knobs(l.file.config, back.file.config).empty());

  // A default configuration's print reads back as well (empty key, empty lists).
  auto plain = load("worker-urls: [http://127.0.0.1:1]\n");
  ASSERT_TRUE(plain.ok);
  std::string p = print_config(plain.file, false);
  auto plain_back = load(p);
  ASSERT_TRUE(plain_back.ok) << plain_back.text() << "\n" << p;
  EXPECT_EQ(print_config(plain_back.file, false), p);

  auto json = nlohmann::ordered_json::parse(print_config(l.file, true));
  EXPECT_EQ(json["port"], 31000);
  EXPECT_EQ(json["api-key"], "<redacted>");
  EXPECT_EQ(json["rules"].size(), 3u);
  EXPECT_EQ(json["rules"][0]["name"], "a");
  EXPECT_EQ(json["rules"][0]["kvHashAlgo"], "sha256");
}

TEST(ConfigFile, DiffKnobsSaysWhatNeedsARestart) {
  GatewayConfig a, b;
  b.port = 1;
  b.cache_threshold = 0.9;
  b.worker_urls = {"http://x:1"};
  b.api_key = "k";
  auto changes = diff_knobs(a, b);
  ASSERT_EQ(changes.size(), 4u);
  EXPECT_EQ(changes[0].name, "port");
  EXPECT_FALSE(changes[0].live);
  EXPECT_EQ(changes[0].before, "30000");
  EXPECT_EQ(changes[0].after, "1");
  EXPECT_EQ(changes[1].name, "worker-urls");
  EXPECT_TRUE(changes[1].live);
  EXPECT_EQ(changes[2].name, "cache-threshold");
  EXPECT_TRUE(changes[2].live);
  EXPECT_EQ(changes[3].name, "api-key");
  EXPECT_EQ(changes[3].after, "\"<redacted>\"");
  EXPECT_FALSE(changes[3].live);
}

TEST(ConfigFile, FromTheCommandLine) {
  namespace fs = std::filesystem;
  fs::path file =
      fs::temp_directory_path() / ("kvgate-config-test-" + std::to_string(::getpid()) + ".yaml");
  std::ofstream(file) << kTwoPools;
  ConfigFile out;
  std::string path;
  std::vector<FieldError> errors;
  std::vector<std::string> args = {"--port", "1", "--config", file.string()};
  ASSERT_TRUE(load_command_line(args, out, path, errors)) << format_errors(errors, path);
  EXPECT_EQ(path, file.string());
  EXPECT_EQ(out.config.port, 1);
  EXPECT_EQ(out.rules.size(), 2u);

  errors.clear();
  args = {"--config=" + file.string(), "--config", file.string()};
  EXPECT_FALSE(load_command_line(args, out, path, errors));
  EXPECT_NE(format_errors(errors).find("--config is given twice"), std::string::npos);

  errors.clear();
  args = {"--config", "/nonexistent/gw.yaml"};
  EXPECT_FALSE(load_command_line(args, out, path, errors));
  EXPECT_NE(format_errors(errors, path).find("/nonexistent/gw.yaml: cannot read it (No such file"),
            std::string::npos)
      << format_errors(errors, path);

  errors.clear();
  args = {"--polcy", "random"};
  EXPECT_FALSE(load_command_line(args, out, path, errors));
  EXPECT_NE(format_errors(errors).find("command line: unknown flag '--polcy'; did you mean"),
            std::string::npos)
      << format_errors(errors);
  fs::remove(file);
}

TEST(RuleDoc, LinesAndScalars) {
  RuleDoc doc;
  std::vector<FieldError> errors;
  ASSERT_TRUE(parse_yaml_doc(R"(a: 1
b: "2"
c: 2.5
d: true
e: ~
f: [x, {g: 0x10}]
)",
                             doc, errors));
  EXPECT_EQ(doc.find("a")->kind, RuleDoc::Kind::kInt);
  EXPECT_EQ(doc.find("b")->kind, RuleDoc::Kind::kString);
  EXPECT_EQ(doc.find("c")->kind, RuleDoc::Kind::kDouble);
  EXPECT_EQ(doc.find("d")->kind, RuleDoc::Kind::kBool);
  EXPECT_EQ(doc.find("e")->kind, RuleDoc::Kind::kNull);
  EXPECT_EQ(doc.find("f")->items[1].find("g")->integer, 16);
  EXPECT_EQ(line_of(doc, "f[1].g"), 6);
  EXPECT_EQ(line_of(doc, "d"), 4);
  EXPECT_EQ(line_of(doc, "f[7].zz"), 6);  // the nearest ancestor written
}

}  // namespace
}  // namespace kvgate::rules
