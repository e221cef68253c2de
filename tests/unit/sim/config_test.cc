// Tests for sim/config: kvgate-sim's flags (SGLang names and defaults), validation, --help.
#include "sim/config.h"

#include <gtest/gtest.h>

namespace kvgate::sim {
namespace {

std::string parse(SimConfig& cfg, std::vector<std::string> args) {
  std::string error, help;
  return parse_sim_args(args, cfg, error, help) ? "" : error;
}

TEST(SimConfig, DefaultsFollowSglang) {
  SimConfig c;
  EXPECT_EQ(parse(c, {}), "");
  EXPECT_EQ(c.host, "127.0.0.1");
  EXPECT_EQ(c.port, 30000);
  EXPECT_EQ(c.served_model_name, "kvgate-sim");
  EXPECT_EQ(c.page_size, 1);
  EXPECT_EQ(c.dp_size, 1);
  EXPECT_EQ(c.default_max_new_tokens, 128);
  EXPECT_EQ(c.threads, 1);
  EXPECT_FALSE(c.instant);
  EXPECT_FALSE(c.enable_metrics);
  EXPECT_DOUBLE_EQ(c.fail_rate, 0);
  EXPECT_EQ(c.fail_status, 500);
  EXPECT_DOUBLE_EQ(c.abort_first_event_rate, 0);
  EXPECT_EQ(c.timeout_keep_alive, 5);  // SGLANG_TIMEOUT_KEEP_ALIVE's default
}

TEST(SimConfig, ParsesEveryKindOfFlag) {
  SimConfig c;
  ASSERT_EQ(parse(c, {"--port",
                      "0",
                      "--served-model-name",
                      "qwen",
                      "--page-size",
                      "16",
                      "--dp-size",
                      "4",
                      "--enable-cache-report",
                      "--enable-metrics",
                      "--incremental-streaming-output",
                      "--stream-response-default-include-usage",
                      "--ttft-ms",
                      "2.5",
                      "--tpot-ms=0",
                      "--instant",
                      "--threads",
                      "2",
                      "--fail-rate",
                      "0.25",
                      "--fail-status",
                      "503",
                      "--hang-rate",
                      "0.25",
                      "--drop-mid-stream-rate",
                      "0.5",
                      "--drop-after-chunks",
                      "3",
                      "--abort-first-event-rate",
                      "0",
                      "--timeout-keep-alive",
                      "30",
                      "--start-unhealthy-secs",
                      "1.5",
                      "--tokenizer-path",
                      "models/qwen3",
                      "--context-length",
                      "4096",
                      "--max-total-tokens",
                      "8192"}),
            "");
  EXPECT_EQ(c.port, 0);
  EXPECT_EQ(c.served_model_name, "qwen");
  EXPECT_EQ(c.page_size, 16);
  EXPECT_EQ(c.dp_size, 4);
  EXPECT_TRUE(c.enable_cache_report && c.enable_metrics && c.incremental_streaming_output &&
              c.stream_response_default_include_usage && c.instant);
  EXPECT_DOUBLE_EQ(c.ttft_ms, 2.5);
  EXPECT_DOUBLE_EQ(c.tpot_ms, 0);
  EXPECT_EQ(c.threads, 2);
  EXPECT_DOUBLE_EQ(c.fail_rate, 0.25);
  EXPECT_EQ(c.fail_status, 503);
  EXPECT_DOUBLE_EQ(c.drop_mid_stream_rate, 0.5);
  EXPECT_EQ(c.drop_after_chunks, 3);
  EXPECT_EQ(c.timeout_keep_alive, 30);
  EXPECT_DOUBLE_EQ(c.start_unhealthy_secs, 1.5);
  EXPECT_EQ(c.tokenizer_path, "models/qwen3");
  EXPECT_EQ(c.context_length, 4096);
  EXPECT_EQ(c.max_total_tokens, 8192);
  EXPECT_EQ(max_req_input_len(c), 4090) << "min(4096 - 1, 8192 - 1) - 5, as SGLang";
}

TEST(SimConfig, SglangSpellingsWork) {
  SimConfig c;
  ASSERT_EQ(parse(c, {"--random-seed", "7", "--served_model_name", "m"}), "");
  EXPECT_EQ(c.seed, 7);
  EXPECT_EQ(c.served_model_name, "m");
}

TEST(SimConfig, LoraPathsImplyEnableLoraAndNameTheAdapters) {
  SimConfig c;
  ASSERT_EQ(parse(c, {"--lora-paths", "sql=/a/sql", "/a/chat", "--kv-events-per-page"}), "");
  EXPECT_TRUE(c.enable_lora) << "SGLang turns LoRA on when adapters are given";
  EXPECT_EQ(lora_names(c), (std::vector<std::string>{"sql", "/a/chat"}));
  EXPECT_TRUE(c.kv_events_per_page);
  SimConfig d;
  EXPECT_NE(parse(d, {"--lora-paths", "a=/x", "a=/y"}).find("twice"), std::string::npos);
  SimConfig e;
  EXPECT_NE(parse(e, {"--lora-paths", "=/x"}).find("needs a name"), std::string::npos);
}

TEST(SimConfig, InvalidValuesNameTheFlagAndTheFix) {
  struct Case {
    std::vector<std::string> args;
    std::string expect;
  };
  std::vector<Case> cases = {
      {{"--page-size", "0"}, "--page-size: 0 is out of range; it must be between 1 and 4096"},
      {{"--fail-rate", "1.5"}, "--fail-rate: 1.5 is out of range"},
      {{"--fail-status", "200"}, "--fail-status: 200 is out of range"},
      {{"--port", "70000"}, "--port"},
      {{"--ttft-ms", "fast"}, "--ttft-ms: 'fast' is not a number"},
      {{"--dp-size", "two"}, "--dp-size: 'two' is not an integer"},
      {{"--log-level", "loud"}, "choose one of: debug, info, warning, error"},
      {{"--prot", "1"}, "did you mean '--port'?"},
      {{"--fail-rate", "0.6", "--hang-rate", "0.6"}, "keep the sum <= 1"},
      {{"--drop-mid-stream-rate", "0.5", "--abort-first-event-rate", "0.6"},
       "--abort-first-event-rate add up to 1.1"},
      {{"--timeout-keep-alive", "0"}, "--timeout-keep-alive: 0 is out of range"},
      {{"--page-size", "64", "--max-total-tokens", "32"}, "--max-total-tokens (32) must hold"},
      {{"extra"}, "unexpected argument 'extra'"},
      {{"--port"}, "--port needs a value"},
      {{"--port", "0", "--port-count", "2"}, "--port-count 2 needs a --port to count from"},
      {{"--port", "65000", "--port-count", "600"}, "goes past port 65535"},
      {{"--port-count", "0"}, "--port-count: 0 is out of range"},
      {{"--port", "31000", "--port-count", "4", "--disaggregation-mode", "prefill",
        "--disaggregation-bootstrap-port", "31002"},
       "the bootstrap rendezvous needs a port of its own"},
  };
  for (const auto& k : cases) {
    SimConfig c;
    std::string err = parse(c, k.args);
    EXPECT_NE(err.find(k.expect), std::string::npos) << "got: " << err;
  }
}

TEST(SimConfig, HelpListsGroupsAndDefaults) {
  SimConfig c;
  std::string error, help;
  std::vector<std::string> args = {"--help"};
  ASSERT_TRUE(parse_sim_args(args, c, error, help));
  for (const char* s :
       {"Usage: kvgate-sim", "Server (SGLang server arguments):", "Simulation:", "Fault injection",
        "--ttft-ms MS", "[default: 20]", "--instant", "POST /sim/faults"}) {
    EXPECT_NE(help.find(s), std::string::npos) << s;
  }
}

TEST(SimConfig, SchedulerAutoFollowsTheTimingFlags) {
  SimConfig a, b, c, d;
  EXPECT_EQ(parse(a, {}), "");
  EXPECT_EQ(a.scheduler, "batch") << "continuous batching by default";
  EXPECT_EQ(parse(b, {"--ttft-ms", "5"}), "");
  EXPECT_EQ(b.scheduler, "fixed") << "--ttft-ms keeps the fixed delays tests rely on";
  EXPECT_EQ(parse(c, {"--tpot-ms", "5", "--scheduler", "batch"}), "");
  EXPECT_EQ(c.scheduler, "batch") << "an explicit choice wins";
  EXPECT_EQ(parse(d, {"--scheduler", "fixed"}), "");
  EXPECT_EQ(d.scheduler, "fixed");
}

TEST(SimConfig, BatchAndPdDefaults) {
  SimConfig c;
  EXPECT_EQ(parse(c, {}), "");
  EXPECT_DOUBLE_EQ(c.time_scale, 1);
  EXPECT_EQ(c.chunked_prefill_size, 8192);
  EXPECT_EQ(c.max_running_requests, 256);
  EXPECT_EQ(c.disaggregation_mode, "null");
  EXPECT_EQ(c.disaggregation_bootstrap_port, 8998);
  EXPECT_EQ(c.kv_events_format, "sglang");
  // About an 8B model on one H100: 18k prefill tokens/s, ~23 ms per decode step at batch 100.
  EXPECT_NEAR(1e6 / c.step_prefill_token_us, 18000, 500);
  EXPECT_NEAR(c.step_fixed_ms + 100 * c.step_running_request_us / 1000, 23, 3);
}

TEST(SimConfig, KvEventsConfigErrorsNameTheProblem) {
  struct Case {
    std::vector<std::string> args;
    std::string expect;
  };
  std::vector<Case> cases = {
      {{"--kv-events-config", "nope"}, "--kv-events-config: not valid JSON"},
      {{"--kv-events-config", "[1]"}, "--kv-events-config: must be a JSON object"},
      {{"--kv-events-config", R"({"topic":5})"}, "\"topic\" must be a string"},
      {{"--kv-events-config", R"({"endpoint":"tcp://*"})"}, "must be a tcp://HOST:PORT endpoint"},
      {{"--kv-events-config", R"({"endpoint":"tcp://*:0"})"}, "has port 0"},
      {{"--kv-events-config", R"({"hwm":"x"})"}, "\"hwm\" must be an integer"},
      {{"--kv-events-config", R"({"replay":1})"}, "unknown key \"replay\" (known: publisher"},
      {{"--kv-events-config", R"({"publisher":"zmq","endpoint":"tcp://*:65534"})", "--dp-size",
        "3"},
       "past 65535"},
      {{"--disaggregation-mode", "prefill", "--port", "9000", "--disaggregation-bootstrap-port",
        "9000"},
       "needs a port of its own"},
  };
  for (const auto& k : cases) {
    SimConfig c;
    std::string err = parse(c, k.args);
    EXPECT_NE(err.find(k.expect), std::string::npos) << "got: " << err;
  }
  SimConfig ok;
  EXPECT_EQ(parse(ok, {"--kv-events-config",
                       R"({"publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":null,)"
                       R"("topic":"","buffer_steps":10000,"hwm":100000,"max_queue_size":100000,)"
                       R"("enable_kv_cache_events":true})"}),
            "")
      << "SGLang's and vLLM's full configs are accepted";
}

}  // namespace
}  // namespace kvgate::sim
