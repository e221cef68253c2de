// bench/compare: see compare.h.
#include "bench/compare.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/as_tuple.hpp>
#include <chrono>
#include <cstring>
#include <sstream>
#include <thread>

#include "http/client.h"
#include "http/io.h"

namespace kvgate::bench {
namespace {

int free_port() {
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
  return ntohs(a.sin_port);
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
                             std::chrono::milliseconds timeout = std::chrono::milliseconds(2000)) {
  http::Target t;
  http::FetchResult out;
  if (!http::parse_url(url, t).empty() || !http::resolve(t).empty()) {
    out.error = http::CallError::kConnect;
    return out;
  }
  asio::io_context ctx(1);
  asio::co_spawn(
      ctx,
      [&]() -> awaitable<void> {
        out = co_await http::fetch(ctx.get_executor(), t, method, path, timeout);
      },
      asio::detached);
  ctx.run();
  return out;
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

std::vector<Summary> compare(const Workload& w, const CompareOptions& o, std::string& error) {
  auto status = [&](const std::string& s) {
    if (o.on_status) o.on_status(s);
  };
  std::vector<std::unique_ptr<Child>> sims;
  std::vector<std::string> sim_urls;
  for (int i = 0; i < o.sims; ++i) {
    int port = free_port();
    std::vector<std::string> args = {"--host",           "127.0.0.1",
                                     "--port",           std::to_string(port),
                                     "--enable-metrics", "--enable-cache-report"};
    args.insert(args.end(), o.sim_args.begin(), o.sim_args.end());
    std::string url = "http://127.0.0.1:" + std::to_string(port);
    sims.push_back(std::make_unique<Child>(o.bin_dir + "/kvgate-sim", args,
                                           o.log_dir + "/sim-" + std::to_string(i) + ".log"));
    if (!wait_status(url, "/health", 200, *sims.back(), std::chrono::seconds(30))) {
      error = "kvgate-sim did not start (log " + sims.back()->log() + "):\n" +
              last_lines(sims.back()->log());
      return {};
    }
    sim_urls.push_back(url);
  }
  status("started " + std::to_string(o.sims) + " kvgate-sim servers");
  std::vector<Summary> out;
  for (const auto& policy : o.policies) {
    for (const auto& url : sim_urls) {
      for (int tries = 0; tries < 100; ++tries) {  // 400 while requests still run
        auto r = fetch_sync(url, "POST", "/flush_cache");
        if (r.error == http::CallError::kNone && r.status == 200) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
    std::vector<ServerCounters> before;
    before.reserve(sim_urls.size());
    for (const auto& url : sim_urls) before.push_back(scrape(url));
    int port = free_port(), metrics_port = free_port();
    std::vector<std::string> args = {"--host",
                                     "127.0.0.1",
                                     "--port",
                                     std::to_string(port),
                                     "--prometheus-host",
                                     "127.0.0.1",
                                     "--prometheus-port",
                                     std::to_string(metrics_port),
                                     "--admin-port",
                                     "0",
                                     "--policy",
                                     policy,
                                     "--debug-headers",
                                     "--log-level",
                                     "warn",
                                     "--health-check-interval-secs",
                                     "5",
                                     "--worker-urls"};
    args.insert(args.end(), sim_urls.begin(), sim_urls.end());
    args.insert(args.end(), o.gateway_args.begin(), o.gateway_args.end());
    Child gateway(o.bin_dir + "/kvgate", args, o.log_dir + "/kvgate-" + policy + ".log");
    std::string gw = "http://127.0.0.1:" + std::to_string(port);
    if (!wait_status(gw, "/readiness", 200, gateway, std::chrono::seconds(30))) {
      error = "kvgate --policy " + policy + " did not become ready (log " + gateway.log() + "):\n" +
              last_lines(gateway.log());
      return {};
    }
    status("running the workload through kvgate --policy " + policy);
    DriverConfig dc = o.driver;
    dc.url = gw;
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
    size_t done = 0;
    dc.on_done = [&](const RequestRecord& r) {
      ++done;
      if (o.on_request) o.on_request(policy, r, done);
    };
    RunResult run = run_workload(w, dc);
    if (!run.fatal.empty()) {
      error = run.fatal;
      return {};
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
    error = gateway.stop_checked("kvgate --policy " + policy);
    if (!error.empty()) return {};
  }
  for (size_t i = 0; i < sims.size(); ++i) {
    error = sims[i]->stop_checked("kvgate-sim " + sim_urls[i]);
    if (!error.empty()) return {};
  }
  return out;
}

}  // namespace kvgate::bench
