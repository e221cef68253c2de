// bench/main: the kvgate-bench binary.
//   kvgate-bench run --url URL [workload flags]      drive one endpoint, print the summary
//   kvgate-bench compare --policies a,b [flags]      start sims, run every policy, print a table
//   kvgate-bench bound --workload trace --trace F    the upper bound of a trace, from its hash ids
//   kvgate-bench rate --url URL --rate R --body F    latency at a fixed request rate (open loop)
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "bench/compare.h"
#include "bench/rate.h"
#include "bench/report.h"
#include "util/flags.h"
#include "util/json.h"

using namespace kvgate;
using namespace kvgate::bench;

namespace {

struct Config {
  // Target
  std::string url = "http://127.0.0.1:30000";
  std::string api = "chat";
  std::string model = "kvgate-sim";
  int64_t timeout_secs = 120;
  // Workload
  std::string workload = "multiturn";
  int64_t seed = 1;
  int64_t users = 8;
  int64_t turns = 4;
  int64_t system_words = 0;
  int64_t user_words = 64;
  int64_t output_tokens = 32;
  double think_ms = 0;
  double rate = 0;
  int64_t concurrency = 0;
  int64_t groups = 64;
  int64_t prompts_per_group = 16;
  int64_t system_tokens = 2048;
  int64_t question_tokens = 128;
  int64_t prefix_output_tokens = 256;
  double scale = 8;
  std::string trace;
  double trace_time_scale = 1;
  double trace_length_scale = 1;
  int64_t max_requests = 0;
  // Upper bound
  std::string tokenizer_path;
  int64_t page_size = 1;
  // Compare
  std::string policies = "round_robin,power_of_two,cache_aware,chwbl";
  int64_t sims = 4;
  int64_t sim_cache_tokens = 0;
  double sim_time_scale = 0;
  int64_t sim_dp_size = 1;
  int64_t replicas = 1;
  int64_t pd_decode = 0;
  std::string pd_decode_policy = "round_robin";
  std::string kv_fallback = "round_robin";
  std::vector<std::string> sim_args;
  std::vector<std::string> gateway_args;
  // Rate
  double rate_rps = 1000;
  double rate_secs = 5;
  std::string body_file;
  std::string path = "/v1/chat/completions";
  // Output
  std::string json;
  std::string records;
  bool print_each = false;
  bool quiet = false;
};

using K = flags::Knob<Config>;
using C = Config;

const std::vector<K>& knobs() {
  static const std::vector<K> k = {
      {.name = "url",
       .group = "Target (run)",
       .value_name = "URL",
       .help = "Endpoint to drive: kvgate, or a server directly",
       .field = &C::url},
      {.name = "api",
       .group = "Target (run)",
       .value_name = "API",
       .help = "Request shape (streamed)",
       .field = &C::api,
       .choices = {"chat", "completions", "generate"}},
      {.name = "model",
       .group = "Target (run)",
       .value_name = "NAME",
       .help = "Model name sent in the body",
       .field = &C::model},
      {.name = "timeout-secs",
       .group = "Target (run)",
       .value_name = "SECS",
       .help = "Per-request timeout",
       .field = &C::timeout_secs,
       .min = 1},

      {.name = "workload",
       .group = "Workload",
       .value_name = "NAME",
       .help = "What to send",
       .field = &C::workload,
       .choices = {"multiturn", "shared-prefix", "trace"}},
      {.name = "seed",
       .group = "Workload",
       .value_name = "N",
       .help = "Same seed, same requests",
       .field = &C::seed,
       .min = 0},
      {.name = "users",
       .group = "Workload",
       .value_name = "N",
       .help = "multiturn: conversations",
       .field = &C::users,
       .min = 1},
      {.name = "turns",
       .group = "Workload",
       .value_name = "N",
       .help = "multiturn: turns per conversation",
       .field = &C::turns,
       .min = 1},
      {.name = "system-words",
       .group = "Workload",
       .value_name = "N",
       .help = "multiturn: words of a per-user system prompt (0 = none)",
       .field = &C::system_words,
       .min = 0},
      {.name = "user-words",
       .group = "Workload",
       .value_name = "N",
       .help = "multiturn: words of each user message",
       .field = &C::user_words,
       .min = 1},
      {.name = "output-tokens",
       .group = "Workload",
       .value_name = "N",
       .help = "multiturn: tokens of each reply",
       .field = &C::output_tokens,
       .min = 1},
      {.name = "think-ms",
       .group = "Workload",
       .value_name = "MS",
       .help = "multiturn: mean pause between a reply and the next turn (exponential)",
       .field = &C::think_ms,
       .min = 0},
      {.name = "rate",
       .group = "Workload",
       .value_name = "R",
       .help = "Open loop: sessions start at R per second (Poisson); 0 = closed loop",
       .field = &C::rate,
       .min = 0},
      {.name = "concurrency",
       .group = "Workload",
       .value_name = "N",
       .help = "Closed loop: sessions at once (0 = every user)",
       .field = &C::concurrency,
       .min = 0},
      {.name = "groups",
       .group = "Workload",
       .value_name = "N",
       .help = "shared-prefix: groups sharing a system prompt",
       .field = &C::groups,
       .min = 1},
      {.name = "prompts-per-group",
       .group = "Workload",
       .value_name = "N",
       .help = "shared-prefix: prompts per group",
       .field = &C::prompts_per_group,
       .min = 1},
      {.name = "system-tokens",
       .group = "Workload",
       .value_name = "N",
       .help = "shared-prefix: system prompt tokens (before --scale)",
       .field = &C::system_tokens,
       .min = 1},
      {.name = "question-tokens",
       .group = "Workload",
       .value_name = "N",
       .help = "shared-prefix: question tokens (before --scale)",
       .field = &C::question_tokens,
       .min = 1},
      {.name = "prefix-output-tokens",
       .group = "Workload",
       .value_name = "N",
       .help = "shared-prefix: output tokens (before --scale)",
       .field = &C::prefix_output_tokens,
       .min = 1},
      {.name = "scale",
       .group = "Workload",
       .value_name = "R",
       .help = "shared-prefix: every size is divided by R",
       .field = &C::scale,
       .min = 1},
      {.name = "trace",
       .group = "Workload",
       .value_name = "FILE",
       .help = "trace: a Mooncake-format JSONL file",
       .field = &C::trace},
      {.name = "trace-time-scale",
       .group = "Workload",
       .value_name = "R",
       .help = "trace: replay R times faster",
       .field = &C::trace_time_scale,
       .min = 1e-3},
      {.name = "trace-length-scale",
       .group = "Workload",
       .value_name = "R",
       .help = "trace: token counts divided by R",
       .field = &C::trace_length_scale,
       .min = 1},
      {.name = "max-requests",
       .group = "Workload",
       .value_name = "N",
       .help = "trace: replay only the first N requests (0 = all)",
       .field = &C::max_requests,
       .min = 0},

      {.name = "tokenizer-path",
       .group = "Upper bound",
       .value_name = "DIR",
       .help = "Model directory (tokenizer.json + chat template) the servers use; compare "
               "passes it to the sims and to kvgate (the sim's stand-in when empty)",
       .field = &C::tokenizer_path},
      {.name = "page-size",
       .group = "Upper bound",
       .value_name = "N",
       .help = "Tokens per cache page of the servers (only full pages are reused)",
       .field = &C::page_size,
       .min = 1},

      {.name = "policies",
       .group = "Compare",
       .value_name = "A,B,...",
       .help = "Routing policies to compare, in order; POLICY:FLAG=VALUE:... gives that run's "
               "kvgates more flags (kv_exact:kv-load-tokens=32 beside kv_exact); "
               ":gateways=N runs N kvgates for that entry, :sync has them share state through "
               "NATS (the bench starts nats-server): "
               "cache_aware:gateways=1,cache_aware:gateways=4,cache_aware:gateways=4:sync",
       .field = &C::policies},
      {.name = "sims",
       .group = "Compare",
       .value_name = "N",
       .help = "kvgate-sim servers to start",
       .field = &C::sims,
       .min = 1,
       .max = 64},
      {.name = "sim-cache-tokens",
       .group = "Compare",
       .value_name = "N",
       .help = "KV cache size of each sim (--max-total-tokens; 0 = the sim's default)",
       .field = &C::sim_cache_tokens,
       .min = 0},
      {.name = "sim-time-scale",
       .group = "Compare",
       .value_name = "R",
       .help = "Simulated time multiplier of each sim (--time-scale; 0 = the sim's default)",
       .field = &C::sim_time_scale,
       .min = 0},
      {.name = "sim-dp-size",
       .group = "Compare",
       .value_name = "N",
       .help = "Data-parallel ranks of each sim (--dp-size): kv_exact routes to a rank "
               "(routed_dp_rank), other policies leave the rank to the sim's round robin",
       .field = &C::sim_dp_size,
       .min = 1,
       .max = 64},
      {.name = "gateways",
       .group = "Compare",
       .value_name = "N",
       .help = "kvgates per policy in front of the same sims; turn t of conversation s goes to "
               "kvgate (s + t) % N, as behind a front balancer without affinity; with N > 1 the "
               "report adds their agreement (the share of sampled requests every kvgate routes "
               "alike after the run) and sync traffic",
       .field = &C::replicas,
       .min = 1,
       .max = 16},
      {.name = "replicas",
       .group = "Compare",
       .value_name = "N",
       .help = "Another name of --gateways",
       .field = &C::replicas,
       .min = 1,
       .max = 16},
      {.name = "pd-decode",
       .group = "Compare",
       .value_name = "N",
       .help = "Prefill/decode: the --sims servers run as prefill servers (--disaggregation-mode "
               "prefill) beside N decode servers, and kvgate runs --pd-disaggregation with each "
               "policy as its --prefill-policy (kv_exact: kvExactMode 1); 0 = one plain pool",
       .field = &C::pd_decode,
       .min = 0,
       .max = 64},
      {.name = "pd-decode-policy",
       .group = "Compare",
       .value_name = "NAME",
       .help = "Prefill/decode: kvgate's --decode-policy for every run",
       .field = &C::pd_decode_policy},
      {.name = "kv-fallback-policy",
       .group = "Compare",
       .value_name = "NAME",
       .help = "kv_exact: the policy that routes its misses (kvgate --kv-fallback-policy)",
       .field = &C::kv_fallback},
      {.name = "sim-arg",
       .group = "Compare",
       .value_name = "ARG",
       .help = "One more argument for every sim (repeat the flag)",
       .field = &C::sim_args,
       .arity = flags::Arity::kAppend},
      {.name = "gateway-arg",
       .group = "Compare",
       .value_name = "ARG",
       .help = "One more argument for every kvgate (repeat the flag)",
       .field = &C::gateway_args,
       .arity = flags::Arity::kAppend},

      {.name = "rps",
       .group = "Rate",
       .value_name = "R",
       .help = "rate: requests per second, evenly spaced",
       .field = &C::rate_rps,
       .min = 1},
      {.name = "secs",
       .group = "Rate",
       .value_name = "S",
       .help = "rate: duration",
       .field = &C::rate_secs,
       .min = 0.1},
      {.name = "body",
       .group = "Rate",
       .value_name = "FILE",
       .help = "rate: the request body to POST",
       .field = &C::body_file},
      {.name = "path",
       .group = "Rate",
       .value_name = "PATH",
       .help = "rate: the path to POST to",
       .field = &C::path},

      {.name = "json",
       .group = "Output",
       .value_name = "FILE",
       .help = "Write results as JSON (compare also writes FILE.md and FILE.svg beside it, and in "
               "FILE-logs/ each process's log, each kvgate's last /metrics and every request "
               "of each policy: records-POLICY.jsonl)",
       .field = &C::json},
      {.name = "records",
       .group = "Output",
       .value_name = "FILE",
       .help = "run: append one JSON line per finished request to FILE (start, worker, status, "
               "TTFT, error): what make soak analyses",
       .field = &C::records},
      {.name = "print-each",
       .group = "Output",
       .help = "One line per request: worker, status, TTFT",
       .field = &C::print_each},
      {.name = "quiet", .group = "Output", .help = "No progress output", .field = &C::quiet},
  };
  return k;
}

constexpr std::string_view kUsage = "kvgate-bench run|compare|bound [flags]";
constexpr std::string_view kIntro =
    "kvgate-bench: workloads, load and the policy comparison for kvgate.\n"
    "  run       drive one endpoint (--url) with a workload, streamed; print TTFT, ITL, hit rate\n"
    "  compare   start --sims kvgate-sim servers, and for each of --policies a fresh kvgate (or\n"
    "            --replicas of them) in front of them; run the same workload; print one table,\n"
    "            write JSON/Markdown/SVG. With kv_exact listed (needs --tokenizer-path) the sims\n"
    "            publish KV events and the workload starts once kv_exact follows every rank\n"
    "  bound     the upper bound of reuse of a --trace (from its hash ids)\n"
    "  rate      POST --body at a fixed --rps for --secs; print latency p50/p90/p99 in "
    "microseconds";

std::string build_workload(const Config& c, Workload& w) {
  if (c.workload == "multiturn") {
    MultiturnOptions o;
    o.users = static_cast<int>(c.users);
    o.turns = static_cast<int>(c.turns);
    o.system_words = static_cast<int>(c.system_words);
    o.user_words = static_cast<int>(c.user_words);
    o.output_tokens = static_cast<int>(c.output_tokens);
    o.think_s = c.think_ms / 1000.0;
    o.rate = c.rate;
    o.concurrency = static_cast<int>(c.concurrency);
    o.seed = static_cast<uint64_t>(c.seed);
    w = multiturn(o);
    return "";
  }
  if (c.workload == "shared-prefix") {
    SharedPrefixOptions o;
    o.groups = static_cast<int>(c.groups);
    o.prompts = static_cast<int>(c.prompts_per_group);
    o.system_tokens = static_cast<int>(c.system_tokens);
    o.question_tokens = static_cast<int>(c.question_tokens);
    o.output_tokens = static_cast<int>(c.prefix_output_tokens);
    o.scale = c.scale;
    o.rate = c.rate;
    o.concurrency = c.concurrency > 0 ? static_cast<int>(c.concurrency) : 16;
    o.seed = static_cast<uint64_t>(c.seed);
    w = shared_prefix(o);
    return "";
  }
  if (c.trace.empty())
    return "--workload trace needs --trace FILE (e.g. "
           "../shared/data/mooncake/conversation_trace.jsonl)";
  TraceOptions o;
  o.path = c.trace;
  o.time_scale = c.trace_time_scale;
  o.length_scale = c.trace_length_scale;
  o.max_requests = static_cast<size_t>(c.max_requests);
  return trace(o, w);
}

// Progress on a terminal: one line rewritten in place; otherwise a line every 10%.
class Progress {
 public:
  Progress(size_t total, bool quiet)
      : total_(total), quiet_(quiet), tty_(::isatty(STDERR_FILENO)) {}
  void set_label(std::string label) {
    label_ = std::move(label);
    last_decile_ = -1;
  }
  void update(size_t done, size_t errors) {
    if (quiet_ || total_ == 0) return;
    int decile = static_cast<int>(done * 10 / total_);
    if (tty_) {
      int width = 30, filled = static_cast<int>(done * static_cast<size_t>(width) / total_);
      std::fprintf(stderr, "\r  %-14s [%s%s] %zu/%zu%s", label_.c_str(),
                   std::string(static_cast<size_t>(filled), '#').c_str(),
                   std::string(static_cast<size_t>(width - filled), '.').c_str(), done, total_,
                   errors ? (" errors " + std::to_string(errors)).c_str() : "");
      if (done == total_) std::fprintf(stderr, "\n");
    } else if (decile != last_decile_) {
      std::fprintf(stderr, "  %s: %zu/%zu requests%s\n", label_.c_str(), done, total_,
                   errors ? (", " + std::to_string(errors) + " errors").c_str() : "");
      last_decile_ = decile;
    }
  }

 private:
  size_t total_;
  bool quiet_;
  bool tty_;
  std::string label_;
  int last_decile_ = -1;
};

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

bool write_file(const std::string& path, const std::string& text) {
  if (auto dir = std::filesystem::path(path).parent_path(); !dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
  }
  std::ofstream out(path);
  out << text;
  return static_cast<bool>(out);
}

std::string stem(const std::string& json) {
  return json.size() > 5 && json.ends_with(".json") ? json.substr(0, json.size() - 5) : json;
}

int cmd_run(const Config& c) {
  Workload w;
  if (std::string e = build_workload(c, w); !e.empty()) {
    std::fprintf(stderr, "kvgate-bench run: %s\n", e.c_str());
    return 2;
  }
  std::string note, err;
  auto tok = sim::make_tokenizer(c.tokenizer_path, note, err);
  if (!tok) {
    std::fprintf(stderr, "kvgate-bench run: --tokenizer-path: %s\n", err.c_str());
    return 2;
  }
  PrefixOracle oracle(std::move(tok), sim::make_chat_template(c.tokenizer_path),
                      static_cast<int>(c.page_size));
  DriverConfig dc;
  dc.url = c.url;
  dc.api = parse_api(c.api);
  dc.model = c.model;
  dc.timeout = std::chrono::seconds(c.timeout_secs);
  dc.oracle = &oracle;
  Progress progress(w.requests(), c.quiet || c.print_each);
  progress.set_label(w.name);
  size_t done = 0, errors = 0;
  double epoch0 = 0;  // wall clock at the start of the run, for --records
  std::FILE* records = nullptr;
  if (!c.records.empty()) {
    records = std::fopen(c.records.c_str(), "a");
    if (!records) {
      std::fprintf(stderr, "kvgate-bench: cannot write %s\n", c.records.c_str());
      return 2;
    }
  }
  struct CloseRecords {
    std::FILE*& f;
    ~CloseRecords() {
      if (f) std::fclose(f);
    }
  } close_records{records};
  dc.on_done = [&](const RequestRecord& r) {
    ++done;
    errors += r.ok() ? 0 : 1;
    progress.update(done, errors);
    if (records) {
      std::string line = record_json(r, epoch0);
      std::fputs(line.c_str(), records);
      std::fflush(records);
    }
    if (c.print_each) {
      std::printf(
          "session %3d turn %d -> %-26s status %3d  TTFT %7.1f ms  e2e %7.1f ms  cached "
          "%lld/%lld%s%s\n",
          r.session, r.turn, r.worker.empty() ? "(no x-kvgate-worker)" : r.worker.c_str(), r.status,
          r.ttft_ms, r.e2e_ms, static_cast<long long>(r.cached_tokens),
          static_cast<long long>(r.prompt_tokens), r.error.empty() ? "" : "  ", r.error.c_str());
    }
  };
  std::printf("workload: %s (%s)\n", w.name.c_str(), w.description.c_str());
  epoch0 =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  RunResult run = run_workload(w, dc);
  if (!run.fatal.empty()) {
    std::fprintf(stderr, "kvgate-bench run: %s\n", run.fatal.c_str());
    return 2;
  }
  Summary s = summarize("run", run, oracle.upper_bound(), -1);
  std::printf("\n%zu requests in %.2f s, %zu errors\n", s.requests, s.wall_s, s.errors);
  std::printf(
      "TTFT ms p50 %.1f p90 %.1f p99 %.1f | ITL ms p50 %.1f p99 %.1f | e2e ms p50 %.1f p99 %.1f\n",
      s.ttft_p50, s.ttft_p90, s.ttft_p99, s.itl_p50, s.itl_p99, s.e2e_p50, s.e2e_p99);
  std::printf(
      "output %.0f tok/s | hit rate %s (upper bound %.1f%%) | spread max/mean %.2f requests, %.2f "
      "tokens\n",
      s.output_tokens_per_s,
      s.hit_rate < 0 ? "-" : (std::to_string(s.hit_rate * 100).substr(0, 4) + "%").c_str(),
      s.upper_bound * 100, s.spread_requests, s.spread_tokens);
  if (!s.worker_requests.empty()) {
    std::printf("requests per worker:\n");
    for (const auto& [wkr, n] : s.worker_requests) std::printf("  %-30s %zu\n", wkr.c_str(), n);
  }
  if (!s.first_error.empty()) std::printf("first error: %s\n", s.first_error.c_str());
  if (!c.json.empty() && !write_file(c.json, to_json({s}, w.name, w.description))) {
    std::fprintf(stderr, "kvgate-bench: cannot write %s\n", c.json.c_str());
    return 2;
  }
  return s.errors == 0 ? 0 : 1;
}

int cmd_compare(const Config& c, const std::string& argv0) {
  Workload w;
  if (std::string e = build_workload(c, w); !e.empty()) {
    std::fprintf(stderr, "kvgate-bench compare: %s\n", e.c_str());
    return 2;
  }
  CompareOptions o;
  o.policies = split_list(c.policies);
  if (o.policies.empty()) {
    std::fprintf(stderr, "kvgate-bench compare: --policies is empty\n");
    return 2;
  }
  o.sims = static_cast<int>(c.sims);
  o.sim_dp_size = static_cast<int>(c.sim_dp_size);
  o.replicas = static_cast<int>(c.replicas);
  o.pd_decode = static_cast<int>(c.pd_decode);
  o.pd_decode_policy = c.pd_decode_policy;
  o.kv_fallback = c.kv_fallback;
  if (c.sim_cache_tokens > 0) {
    o.sim_args.insert(o.sim_args.end(), {"--max-total-tokens", std::to_string(c.sim_cache_tokens)});
  }
  if (c.sim_time_scale > 0)
    o.sim_args.insert(o.sim_args.end(), {"--time-scale", std::to_string(c.sim_time_scale)});
  if (c.page_size > 1)
    o.sim_args.insert(o.sim_args.end(), {"--page-size", std::to_string(c.page_size)});
  if (!c.tokenizer_path.empty())
    o.sim_args.insert(o.sim_args.end(), {"--tokenizer-path", c.tokenizer_path});
  o.sim_args.insert(o.sim_args.end(), c.sim_args.begin(), c.sim_args.end());
  // kvgate routes on the prompt the servers render and tokenize (cache_aware, prefix_hash, chwbl).
  if (!c.tokenizer_path.empty()) o.gateway_args = {"--tokenizer-path", c.tokenizer_path};
  o.gateway_args.insert(o.gateway_args.end(), c.gateway_args.begin(), c.gateway_args.end());
  o.bin_dir = std::filesystem::absolute(argv0).parent_path().string();
  std::string out = c.json.empty() ? "out/compare/compare.json" : c.json;
  o.log_dir = std::filesystem::path(stem(out) + "-logs").string();
  std::error_code ec;
  std::filesystem::create_directories(o.log_dir, ec);
  o.page_size = static_cast<int>(c.page_size);
  o.tokenizer_path = c.tokenizer_path;
  o.driver.api = parse_api(c.api);
  o.driver.model = c.model;
  o.driver.timeout = std::chrono::seconds(c.timeout_secs);
  Progress progress(w.requests(), c.quiet);
  size_t errors = 0;
  std::string current;
  o.on_request = [&](const std::string& policy, const RequestRecord& r, size_t done) {
    if (policy != current) {
      current = policy;
      errors = 0;
      progress.set_label(policy);
    }
    errors += r.ok() ? 0 : 1;
    progress.update(done, errors);
  };
  o.on_status = [&](const std::string& line) {
    if (!c.quiet) std::fprintf(stderr, "%s\n", line.c_str());
  };
  // What the setup changes, in the description the reports (and median.py) carry.
  if (c.sim_dp_size > 1) w.description += "; sims --dp-size " + std::to_string(c.sim_dp_size);
  if (c.sim_cache_tokens > 0)
    w.description += "; " + std::to_string(c.sim_cache_tokens) + "-token caches";
  if (c.replicas > 1) w.description += "; " + std::to_string(c.replicas) + " kvgate replicas";
  if (c.pd_decode > 0) {
    w.description += "; prefill/decode: " + std::to_string(c.sims) + " prefill + " +
                     std::to_string(c.pd_decode) + " decode servers, policies choose the prefill";
  }
  std::printf("workload: %s (%s)\n", w.name.c_str(), w.description.c_str());
  std::string error;
  std::vector<Summary> rows = compare(w, o, error);
  if (!error.empty()) {
    std::fprintf(stderr, "kvgate-bench compare: %s\n", error.c_str());
    return 2;
  }
  std::printf("\n%s", table(rows, true).c_str());
  if (!rows.empty() && rows.front().upper_bound >= 0) {
    std::printf(
        "upper bound of the workload (infinite cache, perfect routing): %.1f%% of prompt tokens\n",
        rows.front().upper_bound * 100);
  }
  std::string setup = std::to_string(o.sims) + " kvgate-sim servers";
  if (o.pd_decode > 0) {
    setup = std::to_string(o.sims) + " kvgate-sim prefill servers and " +
            std::to_string(o.pd_decode) + " decode servers (--decode-policy " + o.pd_decode_policy +
            ")";
  }
  if (o.replicas > 1) setup = std::to_string(o.replicas) + " kvgates per policy, " + setup;
  for (const auto& a : o.sim_args) setup += " " + a;
  std::string base = stem(out);
  bool ok = write_file(base + ".json", to_json(rows, w.name, w.description)) &&
            write_file(base + ".md", to_markdown(rows, w.name, w.description, setup)) &&
            write_file(base + ".svg", to_svg(rows, "kvgate-bench compare: " + w.name + " (" +
                                                       w.description + ")"));
  if (!ok) {
    std::fprintf(stderr, "kvgate-bench: cannot write %s.{json,md,svg}\n", base.c_str());
    return 2;
  }
  std::printf("report: %s.md, chart: %s.svg, data: %s.json\n", base.c_str(), base.c_str(),
              base.c_str());
  size_t total_errors = 0;
  for (const auto& r : rows) total_errors += r.errors;
  return total_errors == 0 ? 0 : 1;
}

int cmd_bound(const Config& c) {
  if (c.trace.empty()) {
    std::fprintf(stderr, "kvgate-bench bound: needs --trace FILE\n");
    return 2;
  }
  TraceOptions o;
  o.path = c.trace;
  o.max_requests = static_cast<size_t>(c.max_requests);
  std::string error;
  double b = trace_upper_bound(o, error);
  if (!error.empty()) {
    std::fprintf(stderr, "kvgate-bench bound: %s\n", error.c_str());
    return 2;
  }
  std::printf("%s: %.1f%% of input tokens lie in leading 512-token blocks seen before\n",
              c.trace.c_str(), b * 100);
  return 0;
}

int cmd_rate(const Config& c) {
  RateOptions o;
  o.url = c.url;
  o.path = c.path;
  o.rate = c.rate_rps;
  o.seconds = c.rate_secs;
  if (c.body_file.empty()) {
    std::fprintf(stderr, "kvgate-bench rate: needs --body FILE\n");
    return 2;
  }
  std::ifstream in(c.body_file);
  if (!in) {
    std::fprintf(stderr, "kvgate-bench rate: cannot read %s\n", c.body_file.c_str());
    return 2;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  o.body = ss.str();
  RateResult r = run_rate(o);
  if (!r.fatal.empty()) {
    std::fprintf(stderr, "kvgate-bench rate: %s\n", r.fatal.c_str());
    return 2;
  }
  auto p = [&](double q) {
    return r.latency_us.empty()
               ? 0.0
               : r.latency_us[std::min(
                     r.latency_us.size() - 1,
                     static_cast<size_t>(q / 100 * static_cast<double>(r.latency_us.size())))];
  };
  std::printf(
      "sent %zu at %.0f req/s, %zu errors, %zu dropped; latency us p50 %.0f p90 %.0f p99 %.0f max "
      "%.0f\n",
      r.sent, r.achieved_rate, r.errors, r.dropped, p(50), p(90), p(99),
      r.latency_us.empty() ? 0.0 : r.latency_us.back());
  return r.errors == 0 && r.dropped == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  auto k = std::span<const K>(knobs());
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    std::cout << flags::help(k, kUsage, kIntro);
    return args.empty() ? 2 : 0;
  }
  std::string cmd = args[0];
  args.erase(args.begin());
  Config c;
  auto parsed = flags::parse(k, args, c, "");
  if (!parsed.ok) {
    std::fprintf(stderr, "kvgate-bench %s: %s\n", cmd.c_str(), parsed.error.c_str());
    return 2;
  }
  if (parsed.help) {
    std::cout << flags::help(k, kUsage, kIntro);
    return 0;
  }
  if (parsed.help_markdown) {
    std::cout << flags::markdown(k);
    return 0;
  }
  if (cmd == "run") return cmd_run(c);
  if (cmd == "compare") return cmd_compare(c, argv[0]);
  if (cmd == "bound") return cmd_bound(c);
  if (cmd == "rate") return cmd_rate(c);
  std::fprintf(
      stderr,
      "kvgate-bench: unknown command '%s' (commands: run, compare, bound, rate; see --help)\n",
      cmd.c_str());
  return 2;
}
