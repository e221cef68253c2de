// bench/compare: see compare.h.
#include "bench/compare.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <simdjson.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/as_tuple.hpp>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "http/client.h"
#include "http/io.h"
#include "util/json.h"

namespace kvgate::bench {
namespace {

int free_port() {
  // The kernel may hand the same ephemeral port to two binds in a row (each closed at once): a
  // port given out before is asked again, so one run never gives two listeners the same port.
  static std::mutex mu;
  static std::set<int> given;
  std::lock_guard lock(mu);
  for (int attempt = 0; attempt < 64; ++attempt) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(fd);
      return 0;
    }
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    ::close(fd);
    int port = ntohs(a.sin_port);
    if (given.insert(port).second) return port;
  }
  return 0;
}

// A run of `n` consecutive free ports (a sim's DP ranks publish at base + rank), below the
// kernel's ephemeral range so that free_port() and outgoing connections do not take them first.
int free_port_run(int n) {
  static unsigned seq = static_cast<unsigned>(::getpid()) * 7919u;
  for (int attempt = 0; attempt < 200; ++attempt) {
    seq += 97;
    int base = 20000 + static_cast<int>((seq * 131u) % 12000u);
    bool all = true;
    for (int i = 0; i < n && all; ++i) {
      int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(static_cast<uint16_t>(base + i));
      all = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
      ::close(fd);
    }
    if (all) return base;
  }
  return 0;
}

std::string last_lines(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "r");
  if (!f) return "";
  std::string all;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) all.append(buf, n);
  std::fclose(f);
  if (all.size() > 1500) all = all.substr(all.size() - 1500);
  return all;
}

// A child process with its output in a log file; stopped (SIGTERM, then SIGKILL) on destruction.
class Child {
 public:
  Child(const std::string& path, std::vector<std::string> args, const std::string& log)
      : log_(log) {
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(path.c_str()));
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd >= 0) {
        ::dup2(fd, STDOUT_FILENO);
        ::dup2(fd, STDERR_FILENO);
      }
      int null = ::open("/dev/null", O_RDONLY);
      ::dup2(null, STDIN_FILENO);
      ::execv(path.c_str(), argv.data());
      std::fprintf(stderr, "cannot run %s: %s\n", path.c_str(), std::strerror(errno));
      ::_exit(127);
    }
  }
  ~Child() { stop(); }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  bool running() {
    if (pid_ <= 0) return false;
    int st = 0;
    if (::waitpid(pid_, &st, WNOHANG) == pid_) {
      pid_ = -1;
      status_ = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
      return false;
    }
    return true;
  }
  // SIGTERM, then SIGKILL after 2 s. Returns the exit status (-signal when a signal ended it).
  int stop() {
    if (!running()) return status_;
    ::kill(pid_, SIGTERM);
    for (int i = 0; i < 200 && running(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (running()) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
      status_ = -SIGKILL;
    }
    return status_;
  }
  // Stops the child; a non-zero exit (a crash or a sanitizer report in its teardown) is an error,
  // a SIGKILL after a slow exit is not.
  std::string stop_checked(const std::string& what) {
    int st = stop();
    if (st == 0 || st == -SIGKILL) return "";
    return what + " exited with status " + std::to_string(st) + " (log " + log_ + "):\n" +
           last_lines(log_);
  }
  const std::string& log() const { return log_; }

 private:
  pid_t pid_ = -1;
  int status_ = 0;
  std::string log_;
};

http::FetchResult fetch_sync(const std::string& url, std::string_view method, std::string_view path,
                             std::chrono::milliseconds timeout = std::chrono::milliseconds(2000),
                             std::string_view body = {}) {
  http::Target t;
  http::FetchResult out;
  if (!http::parse_url(url, t).empty() || !http::resolve(t).empty()) {
    out.error = http::CallError::kConnect;
    return out;
  }
  asio::io_context ctx(1);
  static constexpr http::Header kJson[] = {{"content-type", "application/json"}};
  std::span<const http::Header> headers;
  if (!body.empty()) headers = kJson;
  asio::co_spawn(
      ctx,
      [&]() -> awaitable<void> {
        out = co_await http::fetch(ctx.get_executor(), t, method, path, timeout, body, headers);
      },
      asio::detached);
  ctx.run();
  return out;
}

// The value of the sample `series` (its name and labels as exposed) in a /metrics text; -1 when
// absent.
double metric_value(std::string_view text, std::string_view series) {
  for (size_t at = text.find(series); at != std::string_view::npos;
       at = text.find(series, at + 1)) {
    const size_t end = at + series.size();
    if ((at == 0 || text[at - 1] == '\n') && end < text.size() && text[end] == ' ') {
      return std::atof(std::string(text.substr(end + 1, text.find('\n', end) - end - 1)).c_str());
    }
  }
  return -1;
}

// Waits until something accepts connections on 127.0.0.1:port (a server without HTTP).
bool wait_tcp(int port, Child& child, std::chrono::seconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end && child.running()) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const bool ok = fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    if (fd >= 0) ::close(fd);
    if (ok) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

bool wait_status(const std::string& url, std::string_view path, int status, Child& child,
                 std::chrono::seconds limit) {
  auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (!child.running()) return false;
    auto r = fetch_sync(url, "GET", path, std::chrono::milliseconds(500));
    if (r.error == http::CallError::kNone && r.status == status) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

}  // namespace

ServerCounters parse_counters(std::string_view text) {
  ServerCounters c;
  std::istringstream in{std::string(text)};
  std::string line;
  auto value = [](const std::string& l) { return std::atof(l.c_str() + l.rfind(' ') + 1); };
  while (std::getline(in, line)) {
    if (line.rfind("sglang:prompt_tokens_total", 0) == 0) {
      c.prompt_tokens += value(line);
      c.ok = true;
    } else if (line.rfind("sglang:cached_tokens_total", 0) == 0) {
      c.cached_tokens += value(line);
    }
  }
  return c;
}

ServerCounters scrape(const std::string& url) {
  auto r = fetch_sync(url, "GET", "/metrics");
  if (r.error != http::CallError::kNone || r.status != 200) return {};
  return parse_counters(r.body);
}

namespace {

std::string label_value(std::string_view line, std::string_view label) {
  std::string key = std::string(label) + "=\"";
  size_t at = line.find(key);
  if (at == std::string_view::npos) return "";
  at += key.size();
  size_t close = line.find('"', at);
  return close == std::string_view::npos ? "" : std::string(line.substr(at, close - at));
}

// The routing counters of a kvgate's /metrics worth keeping with the results: decisions by branch
// (every policy), and kv_exact's event health (orphans, resyncs by reason).
void add_routing(std::string_view text, std::map<std::string, double>& out) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    std::string_view line = text.substr(pos, nl == std::string_view::npos ? nl : nl - pos);
    pos = nl == std::string_view::npos ? text.size() : nl + 1;
    if (line.empty() || line[0] == '#') continue;
    size_t sp = line.rfind(' ');
    if (sp == std::string_view::npos) continue;
    double v = std::atof(std::string(line.substr(sp + 1)).c_str());
    if (line.starts_with("kvgate_policy_branch_total{")) {
      out["branch_" + label_value(line, "branch")] += v;
    } else if (line.starts_with("kvgate_kv_orphan_blocks_total{")) {
      out["kv_orphan_blocks"] += v;
    } else if (line.starts_with("kvgate_kv_resyncs_total{")) {
      out["kv_resyncs_" + label_value(line, "reason")] += v;
    } else if (line.starts_with("kvgate_kv_hash_mismatches_total{")) {
      out["kv_hash_mismatches"] += v;
    } else if (line.starts_with("kvgate_kv_exact_zero_hit_watchdog_total{")) {
      out["kv_zero_hit_watchdog"] += v;
    } else if (line.starts_with("kvgate_replica_sync_bytes_total{direction=\"out\"}")) {
      out["replica_sync_bytes_out"] += v;
    } else if (line.starts_with("kvgate_replica_sync_records_total{result=\"applied\"}")) {
      out["replica_records_applied"] += v;
    }
  }
}

// One kvgate of a policy run.
struct Gateway {
  std::unique_ptr<Child> child;
  std::string url;
  std::string metrics_url;
  int admin_port = 0;
};

// kv_exact's subscribers in one kvgate: every (sim, rank) connected to the publisher its sim
// announced in /server_info (kvgate discovers it from there), trusted, and the inventory empty
// (the sims were flushed, the kvgate is new). "" when so; else what was still missing at the end.
std::string wait_kv_ready(const Gateway& g,
                          const std::map<std::pair<std::string, int>, std::string>& expected,
                          Child& child, std::chrono::seconds limit, bool need_empty) {
  std::string admin = "http://127.0.0.1:" + std::to_string(g.admin_port);
  auto end = std::chrono::steady_clock::now() + limit;
  std::string missing = "no answer from the admin inventory view";
  simdjson::dom::parser parser;
  while (std::chrono::steady_clock::now() < end) {
    if (!child.running()) return "kvgate exited";
    auto r =
        fetch_sync(admin, "GET", "/v1/rules/default/inventory", std::chrono::milliseconds(500));
    simdjson::dom::element doc;
    simdjson::dom::array sources;
    if (r.error == http::CallError::kNone && r.status == 200 && !parser.parse(r.body).get(doc) &&
        !doc["inventory"]["sources"].get_array().get(sources)) {
      int64_t nodes = -1;
      if (doc["inventory"]["nodes"].get_int64().get(nodes)) nodes = -1;
      size_t good = 0;
      missing.clear();
      for (auto src : sources) {
        std::string_view endpoint, publisher;
        int64_t rank = -1;
        bool connected = false, trusted = false;
        bool parsed =
            !src["endpoint"].get_string().get(endpoint) &&
            !src["publisher"].get_string().get(publisher) && !src["rank"].get_int64().get(rank) &&
            !src["connected"].get_bool().get(connected) && !src["trusted"].get_bool().get(trusted);
        if (!parsed) continue;
        // The tokenizer parity probe (one chat per rank) done: its pages are in the sims' caches
        // until the flush that follows.
        std::string_view parity = "untested";
        if (src["tokenizer_parity"]["state"].get_string().get(parity)) parity = "untested";
        bool probed = parity != "untested" && parity != "pending";
        auto it = expected.find({std::string(endpoint), static_cast<int>(rank)});
        if (it != expected.end() && it->second == publisher && connected && trusted && probed) {
          ++good;
        } else {
          missing += " " + std::string(endpoint) + "#" + std::to_string(rank) + " (" +
                     std::string(publisher) + (connected ? ", connected" : ", not connected") +
                     (trusted ? ", trusted" : ", not trusted") + ", parity " + std::string(parity) +
                     ")";
        }
      }
      if (good == expected.size() && sources.size() == expected.size()) {
        if (nodes == 0 || !need_empty) return "";
        missing = " the inventory is not empty (" + std::to_string(nodes) + " nodes)";
      } else if (missing.empty()) {
        missing = " " + std::to_string(expected.size() - good) + " sources not listed yet";
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return "kv_exact's subscribers not ready:" + missing;
}

// "kv_exact:kv-load-tokens=32" -> the policy "kv_exact" and the flags --kv-load-tokens 32 for its
// kvgates only: one policy under several settings, side by side in one run.
// What an entry of --policies says besides kvgate's own flags: `gateways=N` (kvgates for this
// run, instead of --gateways) and `sync` (they share state through NATS: --replica-sync).
struct EntryOptions {
  int gateways = 0;  // 0: --gateways
  bool sync = false;
};

std::string policy_name(const std::string& entry, std::vector<std::string>* flags = nullptr,
                        EntryOptions* opts = nullptr) {
  size_t colon = entry.find(':');
  if (flags) {
    for (size_t at = colon; at != std::string::npos;) {
      size_t next = entry.find(':', at + 1);
      std::string kv = entry.substr(at + 1, next == std::string::npos ? next : next - at - 1);
      size_t eq = kv.find('=');
      at = next;
      const std::string key = kv.substr(0, eq);
      if (opts && key == "sync" && eq == std::string::npos) {
        opts->sync = true;
        continue;
      }
      if (opts && key == "gateways" && eq != std::string::npos) {
        opts->gateways = std::max(1, std::min(16, std::atoi(kv.substr(eq + 1).c_str())));
        continue;
      }
      flags->push_back("--" + key);
      if (eq != std::string::npos) flags->push_back(kv.substr(eq + 1));
    }
  }
  return entry.substr(0, colon);
}

// A sampled request asked of one kvgate's route-only endpoint: `key` is "worker rank" (what
// agreement compares), `body` the whole answer (branch, prediction: what a disagreement log shows).
struct RouteAnswer {
  std::string key;
  std::string body;
  int64_t late_us = 0;  // how long after the moment asked the kvgate decided
};
RouteAnswer route_of(int admin_port, std::string_view path, const std::string& body,
                     int64_t at_us) {
  auto r = fetch_sync("http://127.0.0.1:" + std::to_string(admin_port), "POST",
                      "/v1/route?path=" + std::string(path) + "&at=" + std::to_string(at_us),
                      std::chrono::milliseconds(5000), body);
  if (r.error != http::CallError::kNone || r.status != 200) return {"error", r.body};
  auto field = [&](std::string_view key) {
    size_t at = r.body.find("\"" + std::string(key) + "\":");
    if (at == std::string::npos) return std::string();
    at += key.size() + 3;
    size_t end = r.body.find_first_of(",}", at);
    return r.body.substr(at, end - at);
  };
  const std::string late = field("late_us");
  return {field("worker") + " " + field("dp_rank"), std::move(r.body),
          late.empty() ? 0 : std::atoll(late.c_str())};
}

}  // namespace

std::vector<Summary> compare(const Workload& w, const CompareOptions& o, std::string& error) {
  auto status = [&](const std::string& s) {
    if (o.on_status) o.on_status(s);
  };
  const bool kv = std::any_of(o.policies.begin(), o.policies.end(),
                              [](const std::string& p) { return policy_name(p) == "kv_exact"; });
  if (kv && o.tokenizer_path.empty()) {
    error =
        "kv_exact needs --tokenizer-path (kvgate tokenizes requests as the sims do, with the "
        "model's tokenizer; the sims' stand-in tokenizer is not one kvgate loads)";
    return {};
  }
  const int dp = std::max(1, o.sim_dp_size);
  const bool pd = o.pd_decode > 0;
  std::vector<std::unique_ptr<Child>> sims;
  std::vector<std::string> sim_urls;
  std::vector<std::string> bootstrap_ports, decode_urls;  // prefill/decode
  // kv_exact: (sim URL, rank) -> the ZeroMQ endpoint that rank publishes on.
  std::map<std::pair<std::string, int>, std::string> publishers;
  for (int i = 0; i < o.sims; ++i) {
    int port = free_port();
    std::string url = "http://127.0.0.1:" + std::to_string(port);
    std::vector<std::string> args = {"--host",           "127.0.0.1",
                                     "--port",           std::to_string(port),
                                     "--enable-metrics", "--enable-cache-report"};
    if (dp > 1) args.insert(args.end(), {"--dp-size", std::to_string(dp)});
    if (pd) {
      bootstrap_ports.push_back(std::to_string(free_port()));
      args.insert(args.end(), {"--disaggregation-mode", "prefill",
                               "--disaggregation-bootstrap-port", bootstrap_ports.back()});
    }
    if (kv) {
      int events = free_port_run(dp);
      if (events == 0) {
        error = "no run of " + std::to_string(dp) + " free ports for the sims' KV events";
        return {};
      }
      // "*": the publisher binds (an explicit host means connect to it, as vLLM's does); kvgate
      // reaches it on the sim's own host.
      args.insert(args.end(),
                  {"--kv-events-config", R"({"publisher":"zmq","endpoint":"tcp://*:)" +
                                             std::to_string(events) + R"(","topic":""})"});
      for (int r = 0; r < dp; ++r)
        publishers[{url, r}] = "tcp://127.0.0.1:" + std::to_string(events + r);
    }
    args.insert(args.end(), o.sim_args.begin(), o.sim_args.end());
    sims.push_back(std::make_unique<Child>(o.bin_dir + "/kvgate-sim", args,
                                           o.log_dir + "/sim-" + std::to_string(i) + ".log"));
    if (!wait_status(url, "/health", 200, *sims.back(), std::chrono::seconds(30))) {
      error = "kvgate-sim did not start (log " + sims.back()->log() + "):\n" +
              last_lines(sims.back()->log());
      return {};
    }
    sim_urls.push_back(url);
  }
  for (int i = 0; i < o.pd_decode; ++i) {
    int port = free_port();
    std::string url = "http://127.0.0.1:" + std::to_string(port);
    std::vector<std::string> args = {"--host",
                                     "127.0.0.1",
                                     "--port",
                                     std::to_string(port),
                                     "--enable-metrics",
                                     "--enable-cache-report",
                                     "--disaggregation-mode",
                                     "decode"};
    args.insert(args.end(), o.sim_args.begin(), o.sim_args.end());
    sims.push_back(std::make_unique<Child>(o.bin_dir + "/kvgate-sim", args,
                                           o.log_dir + "/decode-" + std::to_string(i) + ".log"));
    if (!wait_status(url, "/health", 200, *sims.back(), std::chrono::seconds(30))) {
      error = "kvgate-sim --disaggregation-mode decode did not start (log " + sims.back()->log() +
              "):\n" + last_lines(sims.back()->log());
      return {};
    }
    decode_urls.push_back(url);
  }
  status("started " + std::to_string(o.sims) + " kvgate-sim servers" +
         (pd ? " (prefill) and " + std::to_string(o.pd_decode) + " decode servers" : ""));
  // NATS for the entries whose kvgates share state (:sync).
  std::unique_ptr<Child> nats;
  std::string nats_url;
  if (std::any_of(o.policies.begin(), o.policies.end(), [](const std::string& p) {
        std::vector<std::string> f;
        EntryOptions e;
        policy_name(p, &f, &e);
        return e.sync;
      })) {
    const std::string server = "/usr/sbin/nats-server";
    if (access(server.c_str(), X_OK) != 0) {
      error = server + " is missing: run scripts/setup (Debian's nats-server), needed by :sync";
      return {};
    }
    const int port = free_port();
    nats = std::make_unique<Child>(
        server, std::vector<std::string>{"-a", "127.0.0.1", "-p", std::to_string(port)},
        o.log_dir + "/nats-server.log");
    nats_url = "nats://127.0.0.1:" + std::to_string(port);
    if (!wait_tcp(port, *nats, std::chrono::seconds(10))) {
      error = "nats-server did not start (log " + nats->log() + "):\n" + last_lines(nats->log());
      return {};
    }
    status("started nats-server at " + nats_url);
  }
  std::vector<Summary> out;
  int entry_index = 0;
  auto flush_all = [&] {
    for (const auto& url : sim_urls) {
      for (int tries = 0; tries < 100; ++tries) {  // 400 while requests still run
        auto r = fetch_sync(url, "POST", "/flush_cache");
        if (r.error == http::CallError::kNone && r.status == 200) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
  };
  for (const auto& policy : o.policies) {
    flush_all();
    std::vector<ServerCounters> before;
    before.reserve(sim_urls.size());
    for (const auto& url : sim_urls) before.push_back(scrape(url));
    std::vector<std::string> own_flags;
    EntryOptions entry;
    const std::string name = policy_name(policy, &own_flags, &entry);
    const bool is_kv = name == "kv_exact";
    const int replicas = entry.gateways > 0 ? entry.gateways : std::max(1, o.replicas);
    ++entry_index;
    std::vector<Gateway> gateways;
    for (int g = 0; g < replicas; ++g) {
      Gateway gw;
      int port = free_port(), metrics_port = free_port();
      gw.admin_port = is_kv || replicas > 1 ? free_port() : 0;
      std::vector<std::string> args = {"--host",
                                       "127.0.0.1",
                                       "--port",
                                       std::to_string(port),
                                       "--prometheus-host",
                                       "127.0.0.1",
                                       "--prometheus-port",
                                       std::to_string(metrics_port),
                                       "--admin-port",
                                       std::to_string(gw.admin_port),
                                       "--debug-headers",
                                       "--log-level",
                                       "warn",
                                       "--health-check-interval-secs",
                                       "5"};
      if (pd) {
        // The policy under test chooses the prefill server (and rank); kv_exact is kvExactMode 1.
        args.insert(args.end(), {"--pd-disaggregation", "--prefill-policy", name, "--decode-policy",
                                 o.pd_decode_policy});
        for (size_t i = 0; i < sim_urls.size(); ++i) {
          args.insert(args.end(), {"--prefill", sim_urls[i], bootstrap_ports[i]});
        }
        for (const auto& u : decode_urls) args.insert(args.end(), {"--decode", u});
      } else {
        args.insert(args.end(), {"--policy", name, "--worker-urls"});
        args.insert(args.end(), sim_urls.begin(), sim_urls.end());
      }
      if (is_kv) {
        // Ports come from each sim's /server_info (kv_events); until kvgate has read it, the
        // rule's port is one nobody listens on (never another sim's publisher). Trusted at once
        // (--kv-warmup-secs 0): the sims were just flushed, so an empty inventory is the truth.
        args.insert(args.end(), {"--kv-block-size", std::to_string(std::max(1, o.page_size)),
                                 "--kv-dp-rank-count", std::to_string(dp), "--kv-zmq-port",
                                 std::to_string(free_port()), "--kv-warmup-secs", "0",
                                 "--kv-fallback-policy", o.kv_fallback});
      }
      if (entry.sync) {
        // One subject per run: a run never hears the one before it.
        args.insert(args.end(), {"--replica-sync", nats_url, "--replica-sync-subject",
                                 "kvgate-bench-" + std::to_string(entry_index), "--replica-name",
                                 "bench-" + std::to_string(g)});
      }
      args.insert(args.end(), o.gateway_args.begin(), o.gateway_args.end());
      args.insert(args.end(), own_flags.begin(), own_flags.end());
      std::string name =
          "kvgate-" + policy + (replicas > 1 ? "-" + std::to_string(g) : std::string());
      gw.child =
          std::make_unique<Child>(o.bin_dir + "/kvgate", args, o.log_dir + "/" + name + ".log");
      gw.url = "http://127.0.0.1:" + std::to_string(port);
      gw.metrics_url = "http://127.0.0.1:" + std::to_string(metrics_port);
      if (!wait_status(gw.url, "/readiness", 200, *gw.child, std::chrono::seconds(30))) {
        error = "kvgate --policy " + policy + " did not become ready (log " + gw.child->log() +
                "):\n" + last_lines(gw.child->log());
        return {};
      }
      gateways.push_back(std::move(gw));
    }
    if (is_kv) {
      // Subscribed and probed (kvgate's tokenizer parity probe stores a page or two), then the
      // sims flushed again so that the run starts from empty caches and an empty inventory.
      for (bool need_empty : {false, true}) {
        if (need_empty) {
          flush_all();
          before.clear();
          for (const auto& url : sim_urls) before.push_back(scrape(url));
        }
        for (auto& gw : gateways) {
          std::string e =
              wait_kv_ready(gw, publishers, *gw.child, std::chrono::seconds(30), need_empty);
          if (!e.empty()) {
            error = "kvgate --policy kv_exact: " + e + " (log " + gw.child->log() + "):\n" +
                    last_lines(gw.child->log());
            return {};
          }
        }
      }
      status("kv_exact: " + std::to_string(publishers.size()) + " event subscribers connected" +
             (replicas > 1 ? " in each of " + std::to_string(replicas) + " kvgates" : ""));
    }
    if (entry.sync) {
      // Every kvgate hears every other before the first request.
      for (auto& gw : gateways) {
        const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(15);
        double peers = -1;
        while (std::chrono::steady_clock::now() < end) {
          auto m = fetch_sync(gw.metrics_url, "GET", "/metrics");
          peers = m.status == 200 ? metric_value(m.body, "kvgate_replica_peers") : -1;
          if (peers == replicas - 1) break;
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        if (peers != replicas - 1) {
          error = "kvgate --replica-sync: the replicas did not hear each other (log " +
                  gw.child->log() + "):\n" + last_lines(gw.child->log());
          return {};
        }
      }
    }
    status("running the workload through kvgate --policy " + policy +
           (replicas > 1 ? " (" + std::to_string(replicas) + " replicas)" : ""));
    DriverConfig dc = o.driver;
    dc.url = gateways.front().url;
    dc.urls.clear();
    if (replicas > 1) {
      for (const auto& gw : gateways) dc.urls.push_back(gw.url);
    }
    std::unique_ptr<PrefixOracle> oracle;
    if (out.empty()) {  // the bound is a property of the workload: count it once
      std::string note, err;
      auto tok = sim::make_tokenizer(o.tokenizer_path, note, err);
      if (!tok) {
        error = "--tokenizer-path: " + err;
        return {};
      }
      oracle = std::make_unique<PrefixOracle>(
          std::move(tok), sim::make_chat_template(o.tokenizer_path), o.page_size);
      dc.oracle = oracle.get();
    }
    // Every request (at most 2,000) is asked of every kvgate just before it is sent (live
    // agreement: the fleet's state as the deciding kvgate sees it, records and loads of other
    // requests still on their way); a sample (one in four, at most 200) again once the run is
    // over (agreement).
    std::vector<std::string> sampled;
    size_t seen_bodies = 0;
    // Every kvgate is asked for one moment (route-only's ?at=), so the answers describe one
    // instant, not each the moment the question reached it; a disagreement is written to
    // agreement-<policy>.log with every answer. Live, the moment is 10 ms ahead: the questions
    // leave on threads of their own and the request is held until then (only it: the others go
    // on), so it is sent at the instant the kvgates were asked about. An answer decided more
    // than 1 ms after that moment (the question came late, the kvgate was busy) makes the
    // question "late": counted, and reported beside the agreement.
    std::mutex agree_mu;
    std::atomic<size_t> late_asks{0}, late_agreed{0};
    std::FILE* disagreements = nullptr;
    auto unix_us = [] {
      return std::chrono::duration_cast<std::chrono::microseconds>(
                 std::chrono::system_clock::now().time_since_epoch())
          .count();
    };
    // `live`: a question asked under traffic (lateness counted); else one after the run.
    auto agree_on = [&](const std::string& body, std::string_view when, int64_t at, bool live) {
      std::vector<RouteAnswer> answers(gateways.size());
      std::vector<std::thread> askers;
      askers.reserve(gateways.size());
      for (size_t g = 0; g < gateways.size(); ++g) {
        askers.emplace_back(
            [&, g] { answers[g] = route_of(gateways[g].admin_port, api_path(dc.api), body, at); });
      }
      for (auto& t : askers) t.join();
      // (An answer that is not one, a refusal or a timeout, was not given on time either.)
      const bool late = std::any_of(answers.begin(), answers.end(), [](const RouteAnswer& a) {
        return a.late_us > 1000 || a.key == "error";
      });
      bool same = answers.front().key != "error";
      for (const auto& a : answers) same = same && a.key == answers.front().key;
      if (live && late) {
        ++late_asks;
        if (same) ++late_agreed;
      }
      if (!same) {
        std::lock_guard lock(agree_mu);
        if (!disagreements) {
          disagreements = std::fopen((o.log_dir + "/agreement-" + policy + ".log").c_str(), "w");
        }
        if (disagreements) {
          std::fprintf(disagreements, "%.*s\n", static_cast<int>(when.size()), when.data());
          for (size_t g = 0; g < answers.size(); ++g) {
            std::fprintf(disagreements, "  kvgate %zu: %s\n", g, answers[g].body.c_str());
          }
        }
      }
      return same;
    };
    // The live questions' threads (detached: the driver's loop never waits for one), counted
    // so that the run's end waits for the last.
    std::mutex asks_mu;
    std::condition_variable asks_cv;
    size_t asks_running = 0;
    std::atomic<size_t> shadow_agreed{0};
    size_t shadow_asked = 0;
    if (replicas > 1) {
      dc.on_body = [&](int session, size_t turn, const std::string& body) {
        if (seen_bodies++ % 4 == 0 && sampled.size() < 200) sampled.push_back(body);
        if (shadow_asked >= 2000) return std::chrono::microseconds(0);
        ++shadow_asked;
        constexpr auto kAhead = std::chrono::milliseconds(10);
        const int64_t at = unix_us() + kAhead.count() * 1000;
        {
          std::lock_guard lock(asks_mu);
          ++asks_running;
        }
        std::thread([&, body, at,
                     when = "live: request " + std::to_string(shadow_asked) + ", conversation " +
                            std::to_string(session) + " turn " + std::to_string(turn)] {
          if (agree_on(body, when, at, true)) ++shadow_agreed;
          std::lock_guard lock(asks_mu);
          if (--asks_running == 0) asks_cv.notify_all();
        }).detach();
        return std::chrono::microseconds(at - unix_us());
      };
    }
    size_t done = 0;
    dc.on_done = [&](const RequestRecord& r) {
      ++done;
      if (o.on_request) o.on_request(policy, r, done);
    };
    RunResult run = run_workload(w, dc);
    {
      std::unique_lock lock(asks_mu);
      asks_cv.wait(lock, [&] { return asks_running == 0; });
    }
    if (!run.fatal.empty()) {
      error = run.fatal;
      return {};
    }
    // Every request of the run, beside the logs: where it went, why, and what it found cached
    // against what perfect routing would have (to explain a policy's misses).
    if (FILE* f = std::fopen((o.log_dir + "/records-" + policy + ".jsonl").c_str(), "w")) {
      for (const auto& r : run.records) {
        std::string line = record_json(r, 0);
        std::fputs(line.c_str(), f);
      }
      std::fclose(f);
    }
    ServerCounters delta;
    bool have = true;
    for (size_t i = 0; i < sim_urls.size(); ++i) {
      ServerCounters after = scrape(sim_urls[i]);
      have = have && after.ok && before[i].ok;
      delta.prompt_tokens += after.prompt_tokens - before[i].prompt_tokens;
      delta.cached_tokens += after.cached_tokens - before[i].cached_tokens;
    }
    double server_hit =
        have && delta.prompt_tokens > 0 ? delta.cached_tokens / delta.prompt_tokens : -1;
    double bound = oracle ? oracle->upper_bound() : out.front().upper_bound;
    out.push_back(summarize(policy, run, bound, server_hit));
    // Spread over every sim, those the policy never chose included (max / mean requests).
    if (Summary& sm = out.back(); !sm.worker_requests.empty()) {
      double max = 0, sum = 0;
      for (const auto& url : sim_urls) {
        auto it = sm.worker_requests.find(url);
        double n = it == sm.worker_requests.end() ? 0 : static_cast<double>(it->second);
        max = std::max(max, n);
        sum += n;
      }
      if (sum > 0) sm.spread_requests = max / (sum / static_cast<double>(sim_urls.size()));
    }
    Summary& sm = out.back();
    sm.gateways = replicas;
    sm.synced = entry.sync;
    if (replicas > 1 && !sampled.empty()) {
      // Quiesced: every record published has been applied (the applied count stops moving).
      double last = -1;
      for (int i = 0; i < 100; ++i) {
        double applied = 0;
        for (const auto& gw : gateways) {
          auto m = fetch_sync(gw.metrics_url, "GET", "/metrics");
          applied +=
              m.status == 200
                  ? metric_value(m.body, "kvgate_replica_sync_records_total{result=\"applied\"}")
                  : 0;
        }
        if (applied == last) break;
        last = applied;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      size_t agree = 0;
      for (const auto& body : sampled) agree += agree_on(body, "quiesced", unix_us(), false);
      sm.agreement = static_cast<double>(agree) / static_cast<double>(sampled.size());
      if (disagreements) std::fclose(disagreements);
      sm.live_asked = shadow_asked;
      sm.live_late = late_asks.load();
      sm.live_late_agreed = late_agreed.load();
      sm.live_agreed = shadow_agreed.load();
      if (shadow_asked > 0) {
        sm.live_agreement =
            static_cast<double>(shadow_agreed.load()) / static_cast<double>(shadow_asked);
      }
    }
    // Each kvgate's final /metrics beside its log (kv_exact's hits and misses by reason, event
    // counts per source), and the routing counters summed into the results.
    for (const auto& gw : gateways) {
      auto m = fetch_sync(gw.metrics_url, "GET", "/metrics");
      if (m.error != http::CallError::kNone || m.status != 200) continue;
      add_routing(m.body, out.back().routing);
      std::string path = gw.child->log();
      path = path.substr(0, path.size() - 4) + ".metrics";
      if (FILE* f = std::fopen(path.c_str(), "w")) {
        std::fwrite(m.body.data(), 1, m.body.size(), f);
        std::fclose(f);
      }
    }
    if (auto it = sm.routing.find("replica_sync_bytes_out");
        it != sm.routing.end() && sm.requests > 0) {
      sm.sync_bytes_per_request = it->second / static_cast<double>(sm.requests);
    }
    for (auto& gw : gateways) {
      error = gw.child->stop_checked("kvgate --policy " + policy);
      if (!error.empty()) return {};
    }
  }
  // (nats-server exits 1 on SIGTERM: it is not what is measured, so its status is not checked.)
  nats.reset();
  for (size_t i = 0; i < sims.size(); ++i) {
    error = sims[i]->stop_checked(
        "kvgate-sim " + (i < sim_urls.size() ? sim_urls[i] : decode_urls[i - sim_urls.size()]));
    if (!error.empty()) return {};
  }
  return out;
}

}  // namespace kvgate::bench
