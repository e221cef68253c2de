// sim/config: every knob of kvgate-sim in one table (SGLang's server-arg names where they exist,
// sim-only timing and fault knobs otherwise), its validation, and --help. Nothing else reads argv.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "util/flags.h"

namespace kvgate::sim {

struct SimConfig {
  // Server (SGLang's names and defaults)
  std::string host = "127.0.0.1";
  int64_t port = 30000;
  std::string served_model_name = "kvgate-sim";
  std::string model_path = "kvgate-sim";
  std::string tokenizer_path;
  int64_t page_size = 1;
  int64_t dp_size = 1;
  int64_t max_total_tokens = 400000;
  int64_t context_length = 32768;
  bool enable_cache_report = false;
  bool enable_metrics = false;
  bool incremental_streaming_output = false;
  bool stream_response_default_include_usage = false;
  // /v1/responses: keep responses for GET and previous_response_id (SGLang's server argument; off
  // by default since SGLang v0.5.20), at most max_stored_responses of them (the sim's bound: the
  // oldest stored response is dropped first).
  bool enable_response_store = false;
  int64_t max_stored_responses = 10000;
  std::string log_level = "info";
  // uvicorn's timeout_keep_alive, which SGLang sets from $SGLANG_TIMEOUT_KEEP_ALIVE (default 5)
  int64_t timeout_keep_alive = 5;
  // Continuous batching (SGLang's names) and KV events
  int64_t chunked_prefill_size = 8192;
  int64_t max_running_requests = 256;
  int64_t max_queued_requests = 0;
  std::string kv_events_config;
  // LoRA adapters (SGLang's names): --lora-paths NAME=PATH ... implies --enable-lora
  bool enable_lora = false;
  std::vector<std::string> lora_paths;
  // Prefill/decode disaggregation (SGLang's names)
  std::string disaggregation_mode = "null";
  int64_t disaggregation_bootstrap_port = 8998;
  // Simulation: timing model
  std::string scheduler = "auto";  // resolved to "batch" or "fixed" by parse_sim_args
  double time_scale = 1;
  double step_fixed_ms = 8;
  double step_prefill_token_us = 55;
  double step_running_request_us = 150;
  double ttft_ms = 20;
  double tpot_ms = 5;
  std::string kv_events_format = "sglang";
  bool kv_events_per_page = false;
  double pd_transfer_fixed_ms = 2;
  double pd_transfer_token_us = 5;
  double pd_room_timeout_secs = 30;
  int64_t default_max_new_tokens = 128;
  int64_t seed = 0;
  bool instant = false;
  int64_t threads = 1;
  // Ports served, from `port` on: each one the same server (one engine), a worker of its own to
  // a gateway (benchmarks of many workers with one process).
  int64_t port_count = 1;
  // Faults
  double fail_rate = 0;
  int64_t fail_status = 500;
  double hang_rate = 0;
  double drop_mid_stream_rate = 0;
  int64_t drop_after_chunks = 1;
  double abort_first_event_rate = 0;
  double start_unhealthy_secs = 0;
};

// The knob table (built once).
std::span<const flags::Knob<SimConfig>> sim_knobs();

// Cross-field checks after parsing. Returns "" or an error naming the flags and the fix.
std::string validate(const SimConfig& c);

// Parses argv (without argv[0]) and validates; resolves --scheduler auto (fixed when --ttft-ms or
// --tpot-ms is given, batch otherwise). On error `error` names the flag and the fix.
// `help_text` is filled when --help was given (then the caller prints it and exits 0).
bool parse_sim_args(std::span<const std::string> args, SimConfig& out, std::string& error,
                    std::string& help_text);

// The longest prompt the server accepts (SGLang's max_req_input_len: min(context - 1, max total
// tokens - 1) - 5).
int64_t max_req_input_len(const SimConfig& c);

// The adapter names of --lora-paths (NAME=PATH, or PATH naming itself), in order.
std::vector<std::string> lora_names(const SimConfig& c);

}  // namespace kvgate::sim
