// bench/main: the kvgate-bench binary. `kvgate-bench run` drives an endpoint (kvgate or a server)
// with a closed-loop load and prints latency, time to first byte and where each request went.
#include <cstdio>
#include <iostream>

#include "bench/load.h"
#include "util/flags.h"

using namespace kvgate;

namespace {

struct RunConfig {
  std::string url = "http://127.0.0.1:30000";
  std::string api = "chat";
  std::string model = "default";
  int64_t requests = 16;
  int64_t concurrency = 4;
  int64_t max_tokens = 16;
  bool stream = false;
  bool print_each = false;
  int64_t timeout_secs = 60;
  std::string prompt = "Tell me about request";
};

using K = flags::Knob<RunConfig>;
const std::vector<K>& run_knobs() {
  static const std::vector<K> k = {
      {.name = "url",
       .group = "Target",
       .value_name = "URL",
       .help = "Endpoint to drive (kvgate or a server)",
       .field = &RunConfig::url},
      {.name = "api",
       .group = "Target",
       .value_name = "API",
       .help = "Request shape",
       .field = &RunConfig::api,
       .choices = {"chat", "completions", "generate"}},
      {.name = "model",
       .group = "Target",
       .value_name = "NAME",
       .help = "Model name sent in the body",
       .field = &RunConfig::model},
      {.name = "requests",
       .group = "Load",
       .value_name = "N",
       .help = "Requests in all",
       .field = &RunConfig::requests,
       .min = 1},
      {.name = "concurrency",
       .group = "Load",
       .value_name = "N",
       .help = "Clients sending at once (closed loop)",
       .field = &RunConfig::concurrency,
       .min = 1,
       .max = 100000},
      {.name = "max-tokens",
       .group = "Load",
       .value_name = "N",
       .help = "Output tokens per request",
       .field = &RunConfig::max_tokens,
       .min = 1},
      {.name = "stream",
       .group = "Load",
       .help = "Ask for streamed (SSE) responses",
       .field = &RunConfig::stream},
      {.name = "prompt",
       .group = "Load",
       .value_name = "TEXT",
       .help = "Prompt prefix (the request number is appended)",
       .field = &RunConfig::prompt},
      {.name = "timeout-secs",
       .group = "Load",
       .value_name = "SECS",
       .help = "Per-request timeout",
       .field = &RunConfig::timeout_secs,
       .min = 1},
      {.name = "print-each",
       .group = "Output",
       .help = "Print one line per request: status, worker, latency",
       .field = &RunConfig::print_each},
  };
  return k;
}

constexpr std::string_view kUsage = "kvgate-bench run --url URL [options]";
constexpr std::string_view kIntro =
    "kvgate-bench: load generator and benchmark driver for kvgate.\n"
    "  run   closed-loop load against one endpoint; prints latency, time to first byte and the\n"
    "        spread over workers (from kvgate's x-kvgate-worker header, with --debug-headers).";

int cmd_run(const std::vector<std::string>& args) {
  RunConfig cfg;
  auto parsed = flags::parse(std::span<const K>(run_knobs()), args, cfg, "");
  if (!parsed.ok) {
    std::fprintf(stderr, "kvgate-bench run: %s\n", parsed.error.c_str());
    return 2;
  }
  if (parsed.help) {
    std::cout << flags::help(std::span<const K>(run_knobs()), kUsage, kIntro);
    return 0;
  }
  bench::LoadConfig lc;
  lc.url = cfg.url;
  lc.api = cfg.api == "chat"          ? bench::Api::kChat
           : cfg.api == "completions" ? bench::Api::kCompletions
                                      : bench::Api::kGenerate;
  lc.model = cfg.model;
  lc.requests = static_cast<int>(cfg.requests);
  lc.concurrency = static_cast<int>(cfg.concurrency);
  lc.max_tokens = static_cast<int>(cfg.max_tokens);
  lc.stream = cfg.stream;
  lc.timeout = std::chrono::seconds(cfg.timeout_secs);
  lc.prompt = [&](int i) { return cfg.prompt + " " + std::to_string(i); };
  auto report = bench::run_load(lc, [&](const bench::RequestResult& r) {
    if (!cfg.print_each) return;
    std::printf("request %3d -> %-28s status %3d  %7.1f ms%s%s\n", r.index,
                r.worker.empty() ? "(no x-kvgate-worker)" : r.worker.c_str(), r.status,
                r.latency_ms, r.error.empty() ? "" : "  ", r.error.c_str());
  });
  std::printf("\n%d requests in %.2f s (%.1f req/s), %d errors\n",
              static_cast<int>(report.results.size()), report.wall_seconds,
              static_cast<double>(report.results.size()) / std::max(report.wall_seconds, 1e-9),
              report.errors());
  std::printf("latency ms: p50 %.1f  p90 %.1f  p99 %.1f   first byte ms: p50 %.1f  p99 %.1f\n",
              report.percentile_latency(50), report.percentile_latency(90),
              report.percentile_latency(99), report.percentile_ttfb(50),
              report.percentile_ttfb(99));
  auto spread = report.per_worker();
  if (!spread.empty()) {
    std::printf("requests per worker:\n");
    for (const auto& [w, n] : spread) std::printf("  %-30s %d\n", w.c_str(), n);
  }
  for (const auto& r : report.results) {
    if (!r.error.empty()) {
      std::printf("first error: request %d: %s\n", r.index, r.error.c_str());
      break;
    }
  }
  return report.errors() == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    std::cout << flags::help(std::span<const K>(run_knobs()), kUsage, kIntro);
    return args.empty() ? 2 : 0;
  }
  std::string cmd = args[0];
  args.erase(args.begin());
  if (cmd == "run") return cmd_run(args);
  std::fprintf(stderr, "kvgate-bench: unknown command '%s' (commands: run; see --help)\n",
               cmd.c_str());
  return 2;
}
