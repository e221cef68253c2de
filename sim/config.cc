// sim/config: see config.h.
#include "sim/config.h"

#include <algorithm>

namespace kvgate::sim {
namespace {

using K = flags::Knob<SimConfig>;
using C = SimConfig;

constexpr std::string_view kServer = "Server (SGLang server arguments)";
constexpr std::string_view kOutput = "Response shapes (SGLang server arguments)";
constexpr std::string_view kSim = "Simulation";
constexpr std::string_view kFaults =
    "Fault injection (for tests; also settable at POST /sim/faults)";

constexpr std::string_view kUsage = "kvgate-sim [--port PORT] [--served-model-name NAME] [options]";
constexpr std::string_view kIntro =
    "kvgate-sim: a simulated SGLang inference server. It answers SGLang's HTTP API (/generate,\n"
    "/v1/completions, /v1/chat/completions, /health, /get_server_info, /get_load, /v1/loads,\n"
    "/v1/models, /metrics, /flush_cache) with deterministic pseudo-text and a configurable "
    "timing,\n"
    "so a gateway cannot tell it from a real engine at the HTTP level. Flag names follow SGLang's\n"
    "server arguments where they exist.";
constexpr std::string_view kOutro =
    "A dropped response closes its connection after --drop-after-chunks SSE events (streams) or\n"
    "half-way through the body (whole answers).\n\n"
    "Examples:\n"
    "  kvgate-sim --port 30001 --ttft-ms 50 --tpot-ms 10 --enable-metrics\n"
    "  kvgate-sim --port 30002 --instant            # answer at once (proxy-overhead benchmarks)\n"
    "  kvgate-sim --port 30003 --fail-rate 0.2 --fail-status 503\n"
    "Test control: POST /sim/faults "
    "{\"fail_rate\":0.5,\"hang_rate\":0,\"drop_mid_stream_rate\":0,\n"
    "\"unhealthy\":true} changes faults at runtime; GET /sim/faults shows them.";

std::vector<K> build_table() {
  return {
      {.name = "host",
       .group = kServer,
       .value_name = "ADDR",
       .help = "Address to listen on",
       .field = &C::host},
      {.name = "port",
       .group = kServer,
       .value_name = "PORT",
       .help = "Port to listen on (0 = any free port)",
       .field = &C::port,
       .min = 0,
       .max = 65535},
      {.name = "served-model-name",
       .group = kServer,
       .value_name = "NAME",
       .help = "Model name the server reports",
       .field = &C::served_model_name},
      {.name = "model-path",
       .group = kServer,
       .value_name = "PATH",
       .help = "Model path echoed in /get_server_info",
       .field = &C::model_path},
      {.name = "tokenizer-path",
       .group = kServer,
       .value_name = "PATH",
       .help = "Tokenizer (accepted; a byte-level stand-in serves for now)",
       .field = &C::tokenizer_path},
      {.name = "page-size",
       .group = kServer,
       .value_name = "N",
       .help = "Tokens per KV cache page",
       .field = &C::page_size,
       .min = 1,
       .max = 4096},
      {.name = "dp-size",
       .group = kServer,
       .value_name = "N",
       .help = "Data-parallel ranks (each with its own scheduler)",
       .field = &C::dp_size,
       .min = 1,
       .max = 64},
      {.name = "max-total-tokens",
       .group = kServer,
       .value_name = "N",
       .help = "KV cache capacity in tokens per DP rank",
       .field = &C::max_total_tokens,
       .min = 1,
       .max = 1e12},
      {.name = "context-length",
       .group = kServer,
       .value_name = "N",
       .help = "Longest prompt + completion in tokens",
       .field = &C::context_length,
       .min = 2,
       .max = 1e9},
      {.name = "log-level",
       .group = kServer,
       .value_name = "LEVEL",
       .help = "Log level",
       .field = &C::log_level,
       .choices = {"debug", "info", "warning", "error"}},

      {.name = "enable-cache-report",
       .group = kOutput,
       .help = "Report prompt_tokens_details.cached_tokens on OpenAI routes",
       .field = &C::enable_cache_report},
      {.name = "enable-metrics",
       .group = kOutput,
       .help = "Serve Prometheus metrics (sglang:*) at /metrics",
       .field = &C::enable_metrics},
      {.name = "incremental-streaming-output",
       .group = kOutput,
       .help = "/generate streams deltas instead of the whole text so far",
       .field = &C::incremental_streaming_output},
      {.name = "stream-response-default-include-usage",
       .group = kOutput,
       .help = "OpenAI streams end with a usage chunk by default",
       .field = &C::stream_response_default_include_usage},

      {.name = "ttft-ms",
       .group = kSim,
       .value_name = "MS",
       .help = "Time to first token",
       .field = &C::ttft_ms,
       .min = 0,
       .max = 3.6e6},
      {.name = "tpot-ms",
       .group = kSim,
       .value_name = "MS",
       .help = "Time per output token after the first",
       .field = &C::tpot_ms,
       .min = 0,
       .max = 3.6e6},
      {.name = "default-max-new-tokens",
       .group = kSim,
       .value_name = "N",
       .help = "max_new_tokens when a request sets none (completions: 16)",
       .field = &C::default_max_new_tokens,
       .min = 0,
       .max = 1e9},
      {.name = "seed",
       .group = kSim,
       .value_name = "N",
       .help = "Seed of the pseudo-text and of fault decisions",
       .field = &C::seed,
       .min = 0},
      {.name = "random-seed",
       .group = kSim,
       .value_name = "N",
       .help = "SGLang's name for --seed",
       .field = &C::seed,
       .min = 0},
      {.name = "instant",
       .group = kSim,
       .help = "Answer at once with a short fixed completion (benchmarks)",
       .field = &C::instant},
      {.name = "threads",
       .group = kSim,
       .value_name = "N",
       .help = "Event loops (threads) serving HTTP",
       .field = &C::threads,
       .min = 1,
       .max = 256},

      {.name = "fail-rate",
       .group = kFaults,
       .value_name = "P",
       .help = "Share of generation requests failing with --fail-status",
       .field = &C::fail_rate,
       .min = 0,
       .max = 1},
      {.name = "fail-status",
       .group = kFaults,
       .value_name = "STATUS",
       .help = "HTTP status of injected failures",
       .field = &C::fail_status,
       .min = 400,
       .max = 599},
      {.name = "hang-rate",
       .group = kFaults,
       .value_name = "P",
       .help = "Share of generation requests never answered",
       .field = &C::hang_rate,
       .min = 0,
       .max = 1},
      {.name = "drop-mid-stream-rate",
       .group = kFaults,
       .value_name = "P",
       .help = "Share of responses whose connection closes mid-way",
       .field = &C::drop_mid_stream_rate,
       .min = 0,
       .max = 1},
      {.name = "drop-after-chunks",
       .group = kFaults,
       .value_name = "K",
       .help = "SSE events sent before a dropped stream closes",
       .field = &C::drop_after_chunks,
       .min = 0,
       .max = 1e9},
      {.name = "start-unhealthy-secs",
       .group = kFaults,
       .value_name = "SECS",
       .help = "/health answers 503 for this long after startup",
       .field = &C::start_unhealthy_secs,
       .min = 0,
       .max = 1e7},
  };
}

}  // namespace

std::span<const flags::Knob<SimConfig>> sim_knobs() {
  static const std::vector<K> kTable = build_table();
  return kTable;
}

std::string validate(const SimConfig& c) {
  if (c.page_size > c.max_total_tokens) {
    return "--max-total-tokens (" + std::to_string(c.max_total_tokens) +
           ") must hold at least one page of --page-size (" + std::to_string(c.page_size) +
           ") tokens";
  }
  double total = c.fail_rate + c.hang_rate + c.drop_mid_stream_rate;
  if (total > 1 + 1e-9) {
    return "--fail-rate + --hang-rate + --drop-mid-stream-rate add up to " +
           flags::format_number(total) + "; they are exclusive outcomes, keep the sum <= 1";
  }
  if (c.served_model_name.empty()) return "--served-model-name must not be empty";
  return "";
}

bool parse_sim_args(std::span<const std::string> args, SimConfig& out, std::string& error,
                    std::string& help_text) {
  auto parsed = flags::parse(sim_knobs(), args, out, "");
  if (!parsed.ok) {
    error = parsed.error;
    return false;
  }
  if (parsed.help) {
    help_text = flags::help(sim_knobs(), kUsage, kIntro, kOutro);
    return true;
  }
  if (parsed.help_markdown) {
    help_text = flags::markdown(sim_knobs());
    return true;
  }
  if (!parsed.positional.empty()) {
    error = "unexpected argument '" + parsed.positional[0] +
            "' (options are spelled --name; see --help)";
    return false;
  }
  error = validate(out);
  return error.empty();
}

int64_t max_req_input_len(const SimConfig& c) {
  return std::max<int64_t>(1, std::min(c.context_length - 1, c.max_total_tokens - 1));
}

}  // namespace kvgate::sim
