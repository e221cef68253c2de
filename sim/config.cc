// sim/config: see config.h.
#include "sim/config.h"

#include <algorithm>

#include "sim/kv_events.h"

namespace kvgate::sim {
namespace {

using K = flags::Knob<SimConfig>;
using C = SimConfig;

constexpr std::string_view kServer = "Server (SGLang server arguments)";
constexpr std::string_view kOutput = "Response shapes (SGLang server arguments)";
constexpr std::string_view kPd = "Prefill/decode disaggregation (SGLang server arguments)";
constexpr std::string_view kSim = "Simulation: timing model";
constexpr std::string_view kSimOther = "Simulation";
constexpr std::string_view kFaults =
    "Fault injection (for tests; also settable at POST /sim/faults)";

constexpr std::string_view kUsage = "kvgate-sim [--port PORT] [--served-model-name NAME] [options]";
constexpr std::string_view kIntro =
    "kvgate-sim: a simulated SGLang inference server. It answers SGLang's HTTP API (/generate,\n"
    "/v1/completions, /v1/chat/completions, /v1/responses, /encode, /v1/score, /tokenize,\n"
    "/detokenize, /health, /get_server_info, /get_load, /v1/loads, /v1/models, /metrics,\n"
    "/flush_cache) with deterministic pseudo-text and\n"
    "a configurable timing, so a gateway cannot tell it from a real engine at the HTTP level.\n"
    "Behind the API: a paged radix prefix cache per DP rank (truthful cached_tokens), continuous\n"
    "batching with a timing model of an 8B model on one H100 (shrunk by --time-scale), KV events\n"
    "over ZeroMQ in SGLang's wire format, and prefill/decode roles. Flag names follow SGLang's\n"
    "server arguments where they exist.";
constexpr std::string_view kOutro =
    "A dropped response closes its connection after --drop-after-chunks SSE events (streams) or\n"
    "half-way through the body (whole answers).\n\n"
    "--scheduler auto uses the fixed delays when --ttft-ms or --tpot-ms is given, continuous\n"
    "batching otherwise.\n\n"
    "Examples:\n"
    "  kvgate-sim --port 30001 --time-scale 0.05 --page-size 16 --enable-cache-report \\\n"
    "    --kv-events-config '{\"publisher\":\"zmq\",\"endpoint\":\"tcp://*:5557\"}'\n"
    "  kvgate-sim --port 30001 --ttft-ms 50 --tpot-ms 10 --enable-metrics\n"
    "  kvgate-sim --port 30002 --instant            # answer at once (proxy-overhead benchmarks)\n"
    "  kvgate-sim --port 31000 --port-count 1024 --instant   # one process, 1,024 workers\n"
    "  kvgate-sim --port 30003 --fail-rate 0.2 --fail-status 503\n"
    "Test control: POST /sim/faults "
    "{\"fail_rate\":0.5,\"hang_rate\":0,\"drop_mid_stream_rate\":0,\n"
    "\"abort_first_event_rate\":0,\"unhealthy\":true} changes faults at runtime; GET /sim/faults "
    "shows them.";

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

      {.name = "timeout-keep-alive",
       .group = kServer,
       .value_name = "SECS",
       .help = "Close a keep-alive connection after this long without a request (uvicorn's "
               "timeout_keep_alive; SGLang passes $SGLANG_TIMEOUT_KEEP_ALIVE, default 5)",
       .field = &C::timeout_keep_alive,
       .min = 1,
       .max = 86400},

      {.name = "chunked-prefill-size",
       .group = kServer,
       .value_name = "N",
       .help = "Most uncached prompt tokens prefilled per step (<= 0: no chunking)",
       .field = &C::chunked_prefill_size,
       .min = -1,
       .max = 1e9},
      {.name = "max-running-requests",
       .group = kServer,
       .value_name = "N",
       .help = "Largest running batch per DP rank; more requests wait in the queue",
       .field = &C::max_running_requests,
       .min = 1,
       .max = 1e6},
      {.name = "max-queued-requests",
       .group = kServer,
       .value_name = "N",
       .help =
           "Requests beyond this many waiting get 503 'The request queue is full.' (0: no limit)",
       .field = &C::max_queued_requests,
       .min = 0,
       .max = 1e9},
      {.name = "kv-events-config",
       .group = kServer,
       .value_name = "JSON",
       .help =
           "Publish KV events: {\"publisher\":\"zmq\",\"endpoint\":\"tcp://*:5557\",\"topic\":\"\","
           "\"replay_endpoint\":\"tcp://*:5600\",\"snapshot_endpoint\":\"tcp://*:5700\","
           "\"buffer_steps\":10000,\"hwm\":100000}; DP rank r uses port + r; a snapshot endpoint "
           "adds the epoch to the live topic",
       .field = &C::kv_events_config},

      {.name = "enable-lora",
       .group = kServer,
       .help = "Serve LoRA adapters: requests name one with lora_path (or model "
               "\"BASE:ADAPTER\" on the OpenAI routes); each adapter's prefixes are cached apart",
       .field = &C::enable_lora},
      {.name = "lora-paths",
       .group = kServer,
       .value_name = "NAME=PATH",
       .help = "Adapters to serve (NAME=PATH, or PATH as its own name); implies --enable-lora. The "
               "sim loads nothing: the names are what requests may use",
       .field = &C::lora_paths},

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
      {.name = "enable-response-store",
       .group = kOutput,
       .help = "/v1/responses keeps responses in memory for GET /v1/responses/{id} and "
               "previous_response_id (not with --disaggregation-mode prefill or decode)",
       .field = &C::enable_response_store},
      {.name = "max-stored-responses",
       .group = kOutput,
       .value_name = "N",
       .help = "With --enable-response-store: responses kept at most; the oldest is dropped "
               "first (sim; SGLang's store is unbounded)",
       .field = &C::max_stored_responses,
       .min = 1},

      {.name = "disaggregation-mode",
       .group = kPd,
       .value_name = "MODE",
       .help = "Role in prefill/decode disaggregation",
       .field = &C::disaggregation_mode,
       .choices = {"null", "prefill", "decode"}},
      {.name = "disaggregation-bootstrap-port",
       .group = kPd,
       .value_name = "PORT",
       .help = "Prefill role: port of SGLang's bootstrap server (HTTP; decode servers ask it "
               "where the prefill ranks are, and the sim's KV transfer meets there)",
       .field = &C::disaggregation_bootstrap_port,
       .min = 0,
       .max = 65535},
      {.name = "pd-transfer-fixed-ms",
       .group = kPd,
       .value_name = "MS",
       .help = "Modelled KV transfer time per request, fixed part (sim)",
       .field = &C::pd_transfer_fixed_ms,
       .min = 0,
       .max = 3.6e6},
      {.name = "pd-transfer-token-us",
       .group = kPd,
       .value_name = "US",
       .help = "Modelled KV transfer time per prompt token (sim)",
       .field = &C::pd_transfer_token_us,
       .min = 0,
       .max = 1e6},
      {.name = "pd-room-timeout-secs",
       .group = kPd,
       .value_name = "SECS",
       .help = "Decode role: how long a request waits for its prefill's KV before it is aborted "
               "(KVPoll.WaitingForInput; wall-clock, not scaled). SGLang's is 300 s "
               "(SGLANG_DISAGGREGATION_WAITING_TIMEOUT); the short default suits tests",
       .field = &C::pd_room_timeout_secs,
       .min = 0.001,
       .max = 86400},

      {.name = "scheduler",
       .group = kSim,
       .value_name = "KIND",
       .help = "batch: continuous batching with the step-time model; fixed: --ttft-ms/--tpot-ms "
               "per request; auto: fixed when --ttft-ms or --tpot-ms is given",
       .field = &C::scheduler,
       .choices = {"auto", "batch", "fixed"}},
      {.name = "time-scale",
       .group = kSim,
       .value_name = "F",
       .help = "Multiplies every simulated time (0.05 = 20x faster; 0 = no waiting at all)",
       .field = &C::time_scale,
       .min = 0,
       .max = 1000},
      {.name = "step-fixed-ms",
       .group = kSim,
       .value_name = "MS",
       .help = "batch: fixed cost of one scheduler step (forward pass)",
       .field = &C::step_fixed_ms,
       .min = 0,
       .max = 3.6e6},
      {.name = "step-prefill-token-us",
       .group = kSim,
       .value_name = "US",
       .help = "batch: cost per uncached prompt token prefilled in a step (55 = 18k tokens/s)",
       .field = &C::step_prefill_token_us,
       .min = 0,
       .max = 1e6},
      {.name = "step-running-request-us",
       .group = kSim,
       .value_name = "US",
       .help = "batch: cost per request in the step's batch (decode at batch 100: 8 + 15 ms)",
       .field = &C::step_running_request_us,
       .min = 0,
       .max = 1e6},
      {.name = "ttft-ms",
       .group = kSim,
       .value_name = "MS",
       .help = "fixed: time to first token",
       .field = &C::ttft_ms,
       .min = 0,
       .max = 3.6e6},
      {.name = "tpot-ms",
       .group = kSim,
       .value_name = "MS",
       .help = "fixed: time per output token after the first",
       .field = &C::tpot_ms,
       .min = 0,
       .max = 3.6e6},
      {.name = "kv-events-format",
       .group = kSimOther,
       .value_name = "FMT",
       .help = "Wire shape of KV events: sglang (positional arrays, SHA-256 int64 ids) or vllm "
               "(maps with \"type\", sha256_cbor unsigned ids, one event per node)",
       .field = &C::kv_events_format,
       .choices = {"sglang", "vllm"}},
      {.name = "kv-events-per-page",
       .group = kSimOther,
       .help = "sglang format: one BlockStored / BlockRemoved per page, as SGLang builds before "
               "the merged events (newest builds merge a contiguous run of stored pages into one "
               "event and send one BlockRemoved per evicted node)",
       .field = &C::kv_events_per_page},
      {.name = "default-max-new-tokens",
       .group = kSimOther,
       .value_name = "N",
       .help = "max_new_tokens when a request sets none (completions: 16)",
       .field = &C::default_max_new_tokens,
       .min = 0,
       .max = 1e9},
      {.name = "seed",
       .group = kSimOther,
       .value_name = "N",
       .help = "Seed of the pseudo-text and of fault decisions",
       .field = &C::seed,
       .min = 0},
      {.name = "random-seed",
       .group = kSimOther,
       .value_name = "N",
       .help = "SGLang's name for --seed",
       .field = &C::seed,
       .min = 0},
      {.name = "instant",
       .group = kSimOther,
       .help = "Answer at once with a short fixed completion (benchmarks)",
       .field = &C::instant},
      {.name = "threads",
       .group = kSimOther,
       .value_name = "N",
       .help = "Event loops (threads) serving HTTP",
       .field = &C::threads,
       .min = 1,
       .max = 256},
      {.name = "port-count",
       .group = kSimOther,
       .value_name = "N",
       .help = "Listen on N consecutive ports from --port (all one server and engine; to a "
               "gateway, N workers: benchmarks of many workers with one process)",
       .field = &C::port_count,
       .min = 1,
       .max = 16384},

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
      {.name = "abort-first-event-rate",
       .group = kFaults,
       .value_name = "P",
       .help = "Share of generation requests SGLang's scheduler aborts before the first token: "
               "streams answer 200 and abort in their first event, whole answers get 503",
       .field = &C::abort_first_event_rate,
       .min = 0,
       .max = 1},
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
  double total = c.fail_rate + c.hang_rate + c.drop_mid_stream_rate + c.abort_first_event_rate;
  if (total > 1 + 1e-9) {
    return "--fail-rate + --hang-rate + --drop-mid-stream-rate + --abort-first-event-rate add up "
           "to " +
           flags::format_number(total) + "; they are exclusive outcomes, keep the sum <= 1";
  }
  if (c.served_model_name.empty()) return "--served-model-name must not be empty";
  if (c.enable_response_store && c.disaggregation_mode != "null") {
    // SGLang refuses it at startup with this message.
    return "--enable-response-store is not supported with --disaggregation-mode=prefill or "
           "decode; response storage must remain disabled in PD mode.";
  }
  if (!c.kv_events_config.empty()) {
    KvEventsSettings kv;
    if (std::string e = parse_kv_events_config(c.kv_events_config, kv); !e.empty()) return e;
    if (std::string e = check_kv_events(kv, c.dp_size); !e.empty()) return e;
  }
  {
    std::vector<std::string> names = lora_names(c);
    for (size_t i = 0; i < c.lora_paths.size(); ++i) {
      if (names[i].empty()) {
        return "--lora-paths '" + c.lora_paths[i] + "': the adapter needs a name (NAME=PATH)";
      }
      if (std::count(names.begin(), names.end(), names[i]) > 1) {
        return "--lora-paths names the adapter '" + names[i] + "' twice";
      }
    }
  }
  if (c.port_count > 1 && c.port == 0) {
    return "--port-count " + std::to_string(c.port_count) +
           " needs a --port to count from (consecutive ports, not any free one)";
  }
  if (c.port + c.port_count - 1 > 65535) {
    return "--port " + std::to_string(c.port) + " with --port-count " +
           std::to_string(c.port_count) + " goes past port 65535";
  }
  if (c.disaggregation_mode == "prefill" && c.disaggregation_bootstrap_port != 0 &&
      c.disaggregation_bootstrap_port >= c.port &&
      c.disaggregation_bootstrap_port < c.port + c.port_count) {
    return "--disaggregation-bootstrap-port " + std::to_string(c.disaggregation_bootstrap_port) +
           " is also --port; the bootstrap rendezvous needs a port of its own";
  }
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
  if (out.scheduler == "auto") {
    auto given = [&](std::string_view name) {
      return std::find(parsed.set.begin(), parsed.set.end(), name) != parsed.set.end();
    };
    out.scheduler = given("ttft-ms") || given("tpot-ms") ? "fixed" : "batch";
  }
  // SGLang's ServerArgs: adapters given at launch turn LoRA on.
  if (!out.lora_paths.empty()) out.enable_lora = true;
  error = validate(out);
  return error.empty();
}

int64_t max_req_input_len(const SimConfig& c) {
  // SGLang's scheduler: max_req_len = min(context_len - 1, max_total_num_tokens - 1),
  // max_req_input_len = max_req_len - 5 (it refuses to start when that is not positive).
  return std::max<int64_t>(1, std::min(c.context_length - 1, c.max_total_tokens - 1) - 5);
}

std::vector<std::string> lora_names(const SimConfig& c) {
  std::vector<std::string> out;
  out.reserve(c.lora_paths.size());
  for (const auto& p : c.lora_paths) {
    size_t eq = p.find('=');
    out.push_back(eq == std::string::npos ? p : p.substr(0, eq));
  }
  return out;
}

}  // namespace kvgate::sim
