// Tests for util/flags (knob table parsing) and the kvgate knob table built on it.
#include "util/flags.h"

#include <gtest/gtest.h>

#include "gateway/config.h"

namespace kvgate {
namespace {

std::string parse_into(GatewayConfig& cfg, std::vector<std::string> args) {
  auto r = flags::parse(gateway_knobs(), args, cfg);
  return r.ok ? "" : r.error;
}

TEST(Flags, DefaultsMatchSglModelGateway) {
  GatewayConfig c;
  EXPECT_EQ(c.host, "0.0.0.0");
  EXPECT_EQ(c.port, 30000);
  EXPECT_EQ(c.policy, "cache_aware");
  EXPECT_DOUBLE_EQ(c.cache_threshold, 0.3);
  EXPECT_EQ(c.balance_abs_threshold, 64);
  EXPECT_DOUBLE_EQ(c.balance_rel_threshold, 1.5);
  EXPECT_EQ(c.eviction_interval, 120);
  EXPECT_EQ(c.max_tree_size, 67108864);
  EXPECT_EQ(c.max_payload_size, 512 << 20);
  EXPECT_EQ(c.request_timeout_secs, 1800);
  EXPECT_EQ(c.retry_max_retries, 5);
  EXPECT_EQ(c.retry_initial_backoff_ms, 50);
  EXPECT_EQ(c.retry_max_backoff_ms, 30000);
  EXPECT_DOUBLE_EQ(c.retry_backoff_multiplier, 1.5);
  EXPECT_DOUBLE_EQ(c.retry_jitter_factor, 0.2);
  EXPECT_EQ(c.cb_failure_threshold, 10);
  EXPECT_EQ(c.cb_success_threshold, 3);
  EXPECT_EQ(c.cb_timeout_duration_secs, 60);
  EXPECT_EQ(c.health_check_interval_secs, 60);
  EXPECT_EQ(c.health_check_timeout_secs, 5);
  EXPECT_EQ(c.health_check_endpoint, "/health");
  EXPECT_EQ(c.health_failure_threshold, 3);
  EXPECT_EQ(c.health_success_threshold, 2);
  EXPECT_EQ(c.max_concurrent_requests, -1);
  EXPECT_EQ(c.queue_size, 100);
  EXPECT_EQ(c.queue_timeout_secs, 60);
  EXPECT_EQ(c.prometheus_port, 29000);
  EXPECT_EQ(c.max_idle_secs, 14400);
  EXPECT_EQ(c.prefix_token_count, 256);
  EXPECT_DOUBLE_EQ(c.prefix_hash_load_factor, 1.25);
}

TEST(Flags, SglLaunchLineParses) {
  GatewayConfig c;
  ASSERT_EQ(parse_into(c, {"--worker-urls", "http://127.0.0.1:30000", "http://127.0.0.1:30001",
                           "--policy", "round_robin"}),
            "");
  EXPECT_EQ(c.worker_urls.size(), 2u);
  EXPECT_EQ(c.policy, "round_robin");
}

TEST(Flags, RouterPrefixEqualsAndSnakeCase) {
  GatewayConfig c;
  ASSERT_EQ(parse_into(c, {"--router-policy=random", "--cache_threshold", "0.5",
                           "--router-balance-abs-threshold", "32"}),
            "");
  EXPECT_EQ(c.policy, "random");
  EXPECT_DOUBLE_EQ(c.cache_threshold, 0.5);
  EXPECT_EQ(c.balance_abs_threshold, 32);
}

TEST(Flags, BooleansAndNegativeNumbers) {
  GatewayConfig c;
  ASSERT_EQ(parse_into(c, {"--disable-retries", "--max-concurrent-requests", "-1",
                           "--disable-circuit-breaker=false"}),
            "");
  EXPECT_TRUE(c.disable_retries);
  EXPECT_FALSE(c.disable_circuit_breaker);
  EXPECT_EQ(c.max_concurrent_requests, -1);
}

TEST(Flags, UnknownFlagSuggestsClosest) {
  GatewayConfig c;
  std::string e = parse_into(c, {"--polcy", "random"});
  EXPECT_NE(e.find("unknown flag '--polcy'"), std::string::npos) << e;
  EXPECT_NE(e.find("--policy"), std::string::npos) << e;
}

TEST(Flags, InvalidValuesNameFlagAndFix) {
  GatewayConfig c;
  EXPECT_NE(parse_into(c, {"--port", "abc"}).find("--port: 'abc' is not an integer"),
            std::string::npos);
  EXPECT_NE(parse_into(c, {"--port", "70000"}).find("out of range"), std::string::npos);
  EXPECT_NE(parse_into(c, {"--cache-threshold", "1.5"}).find("between 0 and 1"), std::string::npos);
  EXPECT_NE(parse_into(c, {"--policy", "fastest"}).find("choose one of"), std::string::npos);
  EXPECT_NE(parse_into(c, {"--port"}).find("needs a value"), std::string::npos);
  EXPECT_NE(parse_into(c, {"-x"}).find("unknown option"), std::string::npos);
}

TEST(Flags, PrefillTakesOptionalBootstrapPort) {
  GatewayConfig c;
  ASSERT_EQ(parse_into(c, {"--prefill", "http://p1:30001", "9001", "--prefill", "http://p2:30002",
                           "none", "--prefill", "http://p3:30003", "--decode", "http://d1:30010",
                           "--decode", "http://d2:30011"}),
            "");
  ASSERT_EQ(c.prefill.size(), 3u);
  EXPECT_EQ(c.prefill[0].bootstrap_port, 9001);
  EXPECT_FALSE(c.prefill[1].bootstrap_port.has_value());
  EXPECT_FALSE(c.prefill[2].bootstrap_port.has_value());
  EXPECT_EQ(c.decode.size(), 2u);
  EXPECT_NE(parse_into(c, {"--prefill", "http://p", "port"}).find("bootstrap port"),
            std::string::npos);
}

TEST(Flags, UnsupportedSglFlagsAreClearErrors) {
  GatewayConfig c;
  std::string e = parse_into(c, {"--service-discovery"});
  EXPECT_NE(e.find("not supported"), std::string::npos) << e;
  e = parse_into(c, {"--selector", "app=x", "tier=y"});
  EXPECT_NE(e.find("not supported"), std::string::npos) << e;
}

TEST(Flags, HelpListsGroupsAndDefaults) {
  std::string h = flags::help(gateway_knobs(), "kvgate", "intro");
  EXPECT_NE(h.find("Retries:"), std::string::npos);
  EXPECT_NE(h.find("--retry-max-retries N"), std::string::npos);
  EXPECT_NE(h.find("[default: 5]"), std::string::npos);
  EXPECT_EQ(h.find("--service-discovery"), std::string::npos);  // refused flags stay out of help
}

TEST(Validate, RequiresWorkersAndBuiltPolicy) {
  GatewayConfig c;
  EXPECT_NE(validate(c).find("no workers"), std::string::npos);
  c.worker_urls = {"http://127.0.0.1:1"};
  EXPECT_EQ(validate(c), "");  // cache_aware, the default
  c.policy = "kv_exact";
  EXPECT_NE(validate(c).find("give --tokenizer-path"), std::string::npos);
  c.tokenizer_path = "/models/x";
  c.kv_fallback_policy = "fastest";
  EXPECT_NE(validate(c).find("--kv-fallback-policy: unknown policy"), std::string::npos);
  c.tokenizer_path.clear();
  c.policy = "round_robin";
  EXPECT_EQ(validate(c), "");
  c.worker_urls = {"http://127.0.0.1:1", "http://127.0.0.1:1/"};
  EXPECT_NE(validate(c).find("listed twice"), std::string::npos);
  c.worker_urls = {"ftp://x"};
  EXPECT_NE(validate(c).find("unsupported scheme"), std::string::npos);
  c.worker_urls = {"http://127.0.0.1:1"};
  c.retry_max_backoff_ms = 10;
  EXPECT_NE(validate(c).find("--retry-max-backoff-ms"), std::string::npos);
}

TEST(Validate, PrefillDecodeNeedsBothRolesAndTheFlag) {
  GatewayConfig c;
  c.decode = {"http://127.0.0.1:2"};
  EXPECT_NE(validate(c).find("add --pd-disaggregation"), std::string::npos) << validate(c);
  c.pd_disaggregation = true;
  EXPECT_NE(validate(c).find("at least one --prefill"), std::string::npos) << validate(c);
  c.prefill = {{"http://127.0.0.1:1", 8998}};
  EXPECT_EQ(validate(c), "");
  c.worker_urls = {"http://127.0.0.1:3"};
  EXPECT_NE(validate(c).find("--worker-urls with --pd-disaggregation"), std::string::npos);
  c.worker_urls.clear();
  c.decode = {"http://127.0.0.1:1/"};
  EXPECT_NE(validate(c).find("listed twice (a server has one role)"), std::string::npos)
      << validate(c);
  c.decode = {"http://127.0.0.1:2"};
  c.prefill_policy = "kv_exact";
  EXPECT_NE(validate(c).find("--prefill-policy kv_exact"), std::string::npos) << validate(c);
  c.tokenizer_path = "/models/x";
  EXPECT_EQ(validate(c), "");
  // The per-side policies belong to prefill/decode.
  GatewayConfig plain;
  plain.worker_urls = {"http://127.0.0.1:1"};
  plain.decode_policy = "round_robin";
  EXPECT_NE(validate(plain).find("add --pd-disaggregation"), std::string::npos);
}

TEST(Validate, RequestIdHeadersDefault) {
  GatewayConfig c;
  auto names = request_id_header_names(c);
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(names[0], "x-request-id");
  c.request_id_headers = {"X-Trace"};
  EXPECT_EQ(request_id_header_names(c), std::vector<std::string>{"x-trace"});
}

}  // namespace
}  // namespace kvgate
