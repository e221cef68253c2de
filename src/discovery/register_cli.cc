// discovery/register_cli: `kvgate register`. See register_cli.h.
#include "discovery/register_cli.h"

#include <poll.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <vector>

#include "discovery/registrar.h"
#include "util/flags.h"
#include "util/log.h"

namespace kvgate::discovery {
namespace {

struct RegisterConfig {
  std::string etcd;
  std::string model = "default";
  std::string id;
  std::string url;
  std::string role = "regular";
  int64_t dp_size = 0;
  int64_t page_size = 0;
  int64_t bootstrap_port = 0;
  std::string kv_events_endpoint;
  int64_t ttl = 10;
};

std::vector<flags::Knob<RegisterConfig>> register_knobs() {
  using C = RegisterConfig;
  return {
      {.name = "etcd",
       .group = "Where",
       .value_name = "URL",
       .help = "etcd's client URL, e.g. http://127.0.0.1:2379 (required; https is not supported "
               "yet).",
       .field = &C::etcd},
      {.name = "url",
       .group = "Worker",
       .value_name = "URL",
       .help = "The worker's URL as the gateways reach it: http(s)://host:port (required).",
       .field = &C::url},
      {.name = "model",
       .group = "Worker",
       .value_name = "NAME",
       .help = "The model the worker serves: its key is /kvgate/v1/workers/NAME/ID.",
       .field = &C::model},
      {.name = "id",
       .group = "Worker",
       .value_name = "ID",
       .help = "The worker's id within the model (no '/').",
       .field = &C::id,
       .default_text = "host:port of --url"},
      {.name = "role",
       .group = "Worker",
       .value_name = "ROLE",
       .help = "regular, or a half of prefill/decode disaggregation.",
       .field = &C::role,
       .choices = {"regular", "prefill", "decode"}},
      {.name = "dp-size",
       .group = "Worker",
       .value_name = "N",
       .help = "Data-parallel ranks the worker runs (as its /server_info dp_size).",
       .field = &C::dp_size,
       .min = 1,
       .max = 1024,
       .default_text = "not given"},
      {.name = "page-size",
       .group = "Worker",
       .value_name = "N",
       .help = "The engine's KV page size in tokens.",
       .field = &C::page_size,
       .min = 1,
       .max = 1 << 20,
       .default_text = "not given"},
      {.name = "bootstrap-port",
       .group = "Worker",
       .value_name = "PORT",
       .help = "A prefill worker's disaggregation bootstrap port.",
       .field = &C::bootstrap_port,
       .min = 1,
       .max = 65535,
       .default_text = "not given"},
      {.name = "kv-events-endpoint",
       .group = "Worker",
       .value_name = "ENDPOINT",
       .help = "Where the worker publishes KV events, as gateways connect to it: "
               "tcp://host:port.",
       .field = &C::kv_events_endpoint},
      {.name = "ttl",
       .group = "Lease",
       .value_name = "SECS",
       .help = "The lease's TTL: a sidecar that dies without revoking it leaves the key this long "
               "at most. Kept alive every TTL/3.",
       .field = &C::ttl,
       .min = 2,
       .max = 3600},
  };
}

constexpr std::string_view kUsage =
    "kvgate register --etcd URL --url URL [--model NAME] [--id ID] [options]";
constexpr std::string_view kIntro =
    "Registers one worker in etcd for as long as it runs (a sidecar beside the engine): grants a\n"
    "lease, puts the worker's record at /kvgate/v1/workers/<model>/<id> under it, and keeps the\n"
    "lease alive. SIGTERM or SIGINT revokes the lease, so the key goes at once, and exits 0. If\n"
    "the lease is lost (etcd restarted, unreachable for longer than the TTL) it registers again.";
constexpr std::string_view kOutro =
    "Example:\n"
    "  kvgate register --etcd http://etcd:2379 --model llama --url http://10.0.0.5:30000 \\\n"
    "    --dp-size 2 --page-size 16 --kv-events-endpoint tcp://10.0.0.5:5557";

// Waits up to `d` for SIGTERM/SIGINT on `sfd`; true when one arrived.
bool wait_signal(int sfd, std::chrono::milliseconds d) {
  auto until = std::chrono::steady_clock::now() + d;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
    pollfd p{sfd, POLLIN, 0};
    int n = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 0)));
    if (n < 0 && errno == EINTR) continue;
    if (n > 0) {
      signalfd_siginfo info{};
      [[maybe_unused]] ssize_t r = ::read(sfd, &info, sizeof info);
      log::info("register: signal received, deregistering").kv("signal", info.ssi_signo);
      return true;
    }
    if (left.count() <= 0 || n < 0) return false;
  }
}

}  // namespace

std::string parse_register_args(std::span<const std::string> args, RegisterOptions& out, bool& help,
                                std::string& help_text) {
  RegisterConfig cfg;
  auto knobs = register_knobs();
  auto parsed = flags::parse(std::span<const flags::Knob<RegisterConfig>>(knobs), args, cfg, "");
  help = parsed.help || parsed.help_markdown;
  if (!parsed.ok) return parsed.error;
  if (help) {
    help_text =
        flags::help(std::span<const flags::Knob<RegisterConfig>>(knobs), kUsage, kIntro, kOutro);
    return "";
  }
  if (!parsed.positional.empty()) {
    return "unexpected argument '" + parsed.positional[0] + "' (see kvgate register --help)";
  }
  if (cfg.etcd.empty()) return "--etcd URL is required, e.g. --etcd http://127.0.0.1:2379";
  if (cfg.url.empty()) return "--url URL is required, e.g. --url http://10.0.0.5:30000";
  EtcdClient probe(cfg.etcd);
  if (!probe.url_error().empty()) return "--etcd: " + probe.url_error();
  if (cfg.id.empty()) {
    std::string_view u = cfg.url;
    size_t scheme = u.find("://");
    cfg.id = std::string(scheme == std::string_view::npos ? u : u.substr(scheme + 3));
  }
  if (std::string e = check_worker_key_parts(cfg.model, cfg.id); !e.empty()) {
    return "--model/--id: " + e;
  }
  WorkerRecord r;
  r.model = cfg.model;
  r.id = cfg.id;
  r.url = cfg.url;
  r.role = cfg.role;
  r.dp_size = cfg.dp_size;
  r.page_size = cfg.page_size;
  r.bootstrap_port = cfg.bootstrap_port;
  r.kv_events_endpoint = cfg.kv_events_endpoint;
  // The record is checked as a gateway will read it.
  WorkerRecord check;
  if (std::string e = parse_worker_record(serialize_worker_record(r), check); !e.empty()) {
    // Name the flags, not the JSON fields.
    auto flag_error = [&](const char* flag, const char* field) {
      for (const std::string& lead : {std::string(field) + ": ", std::string(field) + " "}) {
        if (e.starts_with(lead)) return std::string(flag) + ": " + e.substr(lead.size());
      }
      return std::string(flag) + ": " + e;
    };
    if (e.find("\"url\"") != std::string::npos) return flag_error("--url", "\"url\"");
    if (e.find("kv_events") != std::string::npos) {
      return flag_error("--kv-events-endpoint", "\"kv_events.endpoint\"");
    }
    return e;
  }
  out.etcd = cfg.etcd;
  out.record = std::move(r);
  out.ttl_secs = cfg.ttl;
  return "";
}

int register_main(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + std::max(argc, 0));
  RegisterOptions opts;
  bool help = false;
  std::string help_text;
  if (std::string e = parse_register_args(args, opts, help, help_text); !e.empty()) {
    std::fprintf(stderr, "kvgate register: %s\n", e.c_str());
    return 2;
  }
  if (help) {
    std::fputs(help_text.c_str(), stdout);
    return 0;
  }
  // The signals are read from a signalfd, so waits between keepalives end at once on one. Blocked
  // before the log's writer thread starts: no thread takes them the default way.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  if (::sigprocmask(SIG_BLOCK, &set, nullptr) != 0) {
    std::perror("kvgate register: sigprocmask");
    return 1;
  }
  int sfd = ::signalfd(-1, &set, SFD_CLOEXEC);
  if (sfd < 0) {
    std::perror("kvgate register: signalfd");
    return 1;
  }

  log::info("register: starting")
      .kv("etcd", opts.etcd)
      .kv("key", worker_key(opts.record.model, opts.record.id))
      .kv("url", opts.record.url)
      .kv("ttl", opts.ttl_secs);
  keep_registered(RegistrarOptions{.etcd_url = opts.etcd,
                                   .key = worker_key(opts.record.model, opts.record.id),
                                   .value = serialize_worker_record(opts.record),
                                   .ttl_secs = opts.ttl_secs,
                                   .what = "worker"},
                  [sfd](std::chrono::milliseconds d) { return wait_signal(sfd, d); });
  ::close(sfd);
  log::flush();
  return 0;
}

}  // namespace kvgate::discovery
