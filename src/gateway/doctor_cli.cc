// gateway/doctor_cli: `kvgate doctor`, the command-line face of the doctor (doctor.h). Against a
// running kvgate it asks the admin API (POST /v1/rules/{name}/doctor) for each rule; against a
// config file it first starts a private kvgate from that file on loopback ports (any free one),
// asks it the same, and stops it.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "gateway/auth.h"
#include "gateway/doctor.h"
#include "http/client.h"
#include "rules/config_file.h"

namespace kvgate::doctor {
namespace {

using Json = nlohmann::ordered_json;

constexpr std::string_view kHelp =
    "Usage: kvgate doctor (--admin-url URL | --config FILE) [options]\n"
    "\n"
    "Runs KV-exact routing's safe tuning order for each rule, in order, and stops a rule at its\n"
    "first failing step:\n"
    "  1 model readiness   every endpoint serves a 1-token completion directly\n"
    "  2 pool homogeneity  model, page size, DP size, engine version and tokenizer agree, with\n"
    "                      each other and with the rule (kvBlockSize, kvDpRankCount)\n"
    "  3 proxy path        a request through the gateway succeeds on every endpoint\n"
    "  4 event plane       every (endpoint, rank) publisher reachable, connected, advancing\n"
    "  5 kv_exact          a repeated probe is a kv_exact hit where its events were stored,\n"
    "                      confirmed by the engine's cached_tokens; else the likely cause\n"
    "  6 inventory         blocks per (endpoint, rank), and warmup\n"
    "  7 selector          the fallback selector's spread under a short concurrent probe\n"
    "Each step prints PASS, WARN (the operator must judge) or FAIL, what it measured, and the\n"
    "fix in one line. Steps 4-6 are skipped for rules with kv_exact off.\n"
    "\n"
    "Options:\n"
    "  --admin-url URL          a running kvgate's admin listener, e.g. http://127.0.0.1:29001\n"
    "  --config FILE            check FILE's rules: a private kvgate is started from it on\n"
    "                           loopback (any free ports) and stopped afterwards\n"
    "  --admin-api-key-file F   the admin key (first line of F), when the gateway has one;\n"
    "                           also read from $KVGATE_ADMIN_API_KEY\n"
    "  --rule NAME              only this rule (default: every rule, in order)\n"
    "  --steps A-B              the steps to run, e.g. 4-6 or 5 (default 1-7)\n"
    "  --timeout SECS           one request's time limit (default 30)\n"
    "  --settle SECS            how long to wait for events and connections (default 10)\n"
    "  --concurrency N          step 7's concurrent requests (default 4 per endpoint, max 64)\n"
    "  --json                   print the reports as JSON\n"
    "  -h, --help               show this help\n"
    "\n"
    "Exit status: 0 when no step failed (warnings allowed), 1 when one did, 2 on a usage or\n"
    "connection error.\n"
    "\n"
    "Examples:\n"
    "  kvgate doctor --admin-url http://127.0.0.1:29001 --admin-api-key-file "
    "/etc/kvgate/admin.key\n"
    "  kvgate doctor --config kvgate.yaml --rule llama --steps 1-3\n";

// The private gateway's pid, for the signal handler: a doctor interrupted (Ctrl-C, a timeout's
// SIGTERM) stops it before exiting.
volatile sig_atomic_t g_child = -1;
// The key file while it exists (the handler unlinks it: a kill before the child listens).
char g_key_file[256] = {0};

void on_signal(int sig) {
  if (g_child > 0) ::kill(static_cast<pid_t>(g_child), SIGTERM);
  if (g_key_file[0] != '\0') ::unlink(g_key_file);
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

// "" when nothing listens on TCP `port` (any IPv4 address), else why a bind failed.
std::string port_in_use(int64_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::strerror(errno);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  std::string out;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) out = std::strerror(errno);
  ::close(fd);
  return out;
}

int usage_error(const std::string& msg) {
  std::fprintf(stderr, "kvgate doctor: %s (see kvgate doctor --help)\n", msg.c_str());
  return 2;
}

// One admin call, blocking.
http::FetchResult admin_call(const http::Target& target, const std::string& key,
                             std::string_view method, std::string path,
                             std::chrono::milliseconds timeout) {
  asio::io_context io(1);
  http::FetchResult out;
  std::string auth = key.empty() ? "" : "Bearer " + key;
  asio::co_spawn(
      io.get_executor(),
      [&]() -> awaitable<void> {
        std::vector<http::Header> headers;
        if (!auth.empty()) headers.push_back({"authorization", auth});
        const std::string_view no_body;
        out = co_await http::fetch(io.get_executor(), target, method, path, timeout, no_body,
                                   headers);
      },
      asio::detached);
  io.run();
  return out;
}

// A private kvgate started from a config file; stopped (SIGTERM, then SIGKILL) when destroyed.
class PrivateGateway {
 public:
  ~PrivateGateway() { stop(); }

  // Starts it; "" or what failed. `admin_url` is set once it listens. `listen_port`: the
  // inference listener's (0: any free port; a config whose rules name a port keeps it). `key`:
  // the admin key to use; when empty, one is made and handed over in a file.
  std::string start(const char* self_exe, const std::string& config, int64_t listen_port,
                    bool plain_listener, std::string& admin_url, std::string& key) {
    std::vector<std::string> args = {self_exe,
                                     "--config",
                                     config,
                                     "--host",
                                     "127.0.0.1",
                                     "--port",
                                     std::to_string(listen_port),
                                     "--admin-host",
                                     "127.0.0.1",
                                     "--admin-port",
                                     "0",
                                     "--prometheus-host",
                                     "127.0.0.1",
                                     "--prometheus-port",
                                     "0",
                                     "--log-dir=",
                                     "--log-level",
                                     "info"};
    if (plain_listener) {
      // The doctor reaches the listener over plain HTTP (its own, on loopback).
      args.insert(args.end(), {"--tls-cert-path=", "--tls-key-path="});
    }
    if (key.empty()) {
      key = random_key_hex();
      const char* tmp = std::getenv("TMPDIR");
      std::string path = std::string(tmp && *tmp ? tmp : "/tmp") + "/kvgate-doctor-XXXXXX";
      int kfd = ::mkstemp(path.data());
      if (kfd < 0) {
        return "cannot create a key file in " + path.substr(0, path.rfind('/')) + ": " +
               std::strerror(errno) + " (set TMPDIR to a writable directory)";
      }
      key_file_ = path;
      if (path.size() < sizeof g_key_file) std::memcpy(g_key_file, path.c_str(), path.size() + 1);
      std::string line = key + "\n";
      bool written = ::write(kfd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
      ::close(kfd);
      if (!written) return "cannot write the key file " + key_file_;
      args.insert(args.end(), {"--admin-api-key-file", key_file_});
    }
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return std::string("pipe: ") + std::strerror(errno);
    std::vector<char*> argv;  // made before fork: the child only execs
    argv.reserve(args.size() + 1);
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ < 0) {
      ::close(fds[0]);
      ::close(fds[1]);
      return std::string("fork: ") + std::strerror(errno);
    }
    if (pid_ == 0) {
      // It must not outlive this command (killed, timed out): it would go on health-checking
      // and subscribing to the engines.
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != parent) ::_exit(1);
      // Its log to the pipe; nothing of it on this command's stdout (the report's, maybe JSON).
      int null_fd = ::open("/dev/null", O_RDWR | O_CLOEXEC);
      if (null_fd >= 0) {
        ::dup2(null_fd, STDIN_FILENO);
        ::dup2(null_fd, STDOUT_FILENO);
      }
      ::dup2(fds[1], STDERR_FILENO);
      ::execv(self_exe, argv.data());
      std::fprintf(stderr, "exec %s: %s\n", self_exe, std::strerror(errno));
      ::_exit(127);
    }
    ::close(fds[1]);
    g_child = pid_;
    // Its log: read to the end on a thread (so it never blocks on a full pipe), the last lines
    // kept for errors, the admin address taken from "kvgate listening".
    reader_ = std::thread([this, fd = fds[0]] {
      std::string buf;
      char chunk[4096];
      ssize_t n;
      while ((n = ::read(fd, chunk, sizeof chunk)) > 0 || (n < 0 && errno == EINTR)) {
        if (n < 0) continue;
        buf.append(chunk, static_cast<size_t>(n));
        size_t nl;
        while ((nl = buf.find('\n')) != std::string::npos) {
          std::string l = buf.substr(0, nl);
          buf.erase(0, nl + 1);
          std::lock_guard lock(mu_);
          if (l.find("msg=\"kvgate listening\"") != std::string::npos) {
            size_t at = l.find(" admin=");
            if (at != std::string::npos) {
              size_t end = l.find(' ', at + 7);
              admin_ = l.substr(at + 7, end == std::string::npos ? end : end - at - 7);
            }
          }
          tail_.push_back(std::move(l));
          if (tail_.size() > 20) tail_.pop_front();
        }
      }
      ::close(fd);
      std::lock_guard lock(mu_);
      eof_ = true;
    });
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < until) {
      {
        std::lock_guard lock(mu_);
        if (!admin_.empty()) {
          admin_url = "http://" + admin_;
          // It read the key at startup, before listening: the file has served.
          if (!key_file_.empty()) {
            g_key_file[0] = '\0';
            ::unlink(key_file_.c_str());
            key_file_.clear();
          }
          return "";
        }
        if (eof_) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::string why = "kvgate did not start from " + config + ":";
    std::lock_guard lock(mu_);
    for (const auto& l : tail_) why += "\n  " + l;
    return why;
  }

  void stop() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      g_child = -1;  // told already; once reaped its pid may be another process's
      int status = 0;
      for (int i = 0; i < 300; ++i) {  // up to 15 s for a graceful stop
        if (::waitpid(pid_, &status, WNOHANG) == pid_) {
          pid_ = -1;
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      if (pid_ > 0) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        pid_ = -1;
      }
    }
    if (reader_.joinable()) reader_.join();
    if (!key_file_.empty()) {
      g_key_file[0] = '\0';
      ::unlink(key_file_.c_str());
      key_file_.clear();
    }
  }

 private:
  pid_t pid_ = -1;
  std::string key_file_;
  std::thread reader_;
  std::mutex mu_;
  std::string admin_;
  std::deque<std::string> tail_;
  bool eof_ = false;
};

}  // namespace

int run_doctor_command(int argc, char** argv, const char* self_exe) {
  std::string admin_url, config, key_file, rule, steps = "1-7";
  long timeout = 30, settle = 10, concurrency = 0;
  bool as_json = false;
  auto number = [](const std::string& flag, const char* v, long lo, long hi, long& out) {
    char* end = nullptr;
    errno = 0;
    long n = std::strtol(v, &end, 10);
    if (errno != 0 || end == v || *end != '\0' || n < lo || n > hi) {
      return flag + " wants a whole number from " + std::to_string(lo) + " to " +
             std::to_string(hi) + ", not '" + v + "'";
    }
    out = n;
    return std::string();
  };
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    std::string value;
    bool has_value = false;
    if (size_t eq = a.find('='); a.starts_with("--") && eq != std::string::npos) {
      value = a.substr(eq + 1);
      a = a.substr(0, eq);
      has_value = true;
    }
    auto take = [&](std::string& out) {
      if (has_value) {
        out = value;
        return true;
      }
      if (i + 1 >= argc) return false;
      out = argv[++i];
      return true;
    };
    std::string v;
    if (a == "-h" || a == "--help") {
      std::cout << kHelp;
      return 0;
    } else if (a == "--json") {
      as_json = true;
    } else if (a == "--admin-url" || a == "--config" || a == "--admin-api-key-file" ||
               a == "--rule" || a == "--steps" || a == "--timeout" || a == "--settle" ||
               a == "--concurrency") {
      if (!take(v)) return usage_error(a + " needs a value");
      if (a == "--admin-url") admin_url = v;
      if (a == "--config") config = v;
      if (a == "--admin-api-key-file") key_file = v;
      if (a == "--rule") rule = v;
      if (a == "--steps") steps = v;
      std::string e;
      if (a == "--timeout") e = number(a, v.c_str(), 1, 3600, timeout);
      if (a == "--settle") e = number(a, v.c_str(), 1, 600, settle);
      if (a == "--concurrency") e = number(a, v.c_str(), 1, 1024, concurrency);
      if (!e.empty()) return usage_error(e);
    } else {
      return usage_error("unknown argument '" + a + "'");
    }
  }
  if (admin_url.empty() == config.empty()) {
    return usage_error("give either --admin-url (a running kvgate) or --config (a file to check)");
  }
  int first = 1, last = 7;
  if (!parse_steps(steps, first, last)) {
    return usage_error("--steps wants a step or a range within 1-7 (e.g. 4-6), not '" + steps +
                       "'");
  }
  std::string key;
  if (!key_file.empty()) {
    std::ifstream f(key_file);
    if (!f || !std::getline(f, key)) {
      return usage_error("--admin-api-key-file " + key_file + ": cannot read its first line");
    }
  } else if (const char* env = std::getenv("KVGATE_ADMIN_API_KEY")) {
    key = env;
  }
  std::signal(SIGPIPE, SIG_IGN);
  PrivateGateway private_gateway;
  if (!config.empty()) {
    // The file as kvgate will read it: what the private gateway must keep or change.
    rules::ConfigFile loaded;
    std::string path;
    std::vector<rules::FieldError> errors;
    const std::string load_args[] = {"--config", config};
    if (!rules::load_command_line(load_args, loaded, path, errors)) {
      std::fprintf(stderr, "kvgate doctor: %s", rules::format_errors(errors, config).c_str());
      return 2;
    }
    // Rules that name a listener port need kvgate on that port (it must be free here).
    int64_t listen_port = 0;
    for (const auto& r : loaded.rules) {
      if (r.port != 0) listen_port = loaded.config.port;
    }
    if (listen_port != 0) {
      // kvgate's listener shares ports (SO_REUSEPORT): a gateway already there would quietly
      // split connections with the private one. Refuse unless the port is free.
      if (std::string busy = port_in_use(listen_port); !busy.empty()) {
        std::fprintf(stderr,
                     "kvgate doctor: the rules of %s name listener port %lld, which is in use "
                     "here (%s): run the doctor on another machine, or against the running "
                     "gateway with --admin-url\n",
                     config.c_str(), static_cast<long long>(listen_port), busy.c_str());
        return 2;
      }
    }
    // An admin key written in the file is used as is; else the private gateway gets one.
    if (loaded.config.admin_api_key_file.empty() && !loaded.config.admin_api_key.empty()) {
      key = loaded.config.admin_api_key;
    } else {
      key.clear();
    }
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) std::signal(sig, on_signal);
    std::string e = private_gateway.start(self_exe, config, listen_port,
                                          !loaded.config.tls_cert_path.empty(), admin_url, key);
    if (!e.empty()) {
      std::fprintf(stderr, "kvgate doctor: %s\n", e.c_str());
      return 2;
    }
  }
  http::Target admin;
  if (std::string e = http::parse_url(admin_url, admin); !e.empty()) {
    return usage_error("--admin-url " + admin_url + ": " + e);
  }
  if (std::string e = http::resolve(admin); !e.empty()) {
    return usage_error("--admin-url " + admin_url + ": " + e);
  }
  auto short_limit = std::chrono::seconds(10);
  std::vector<std::string> names;
  if (!rule.empty()) {
    names.push_back(rule);
  } else {
    auto r = admin_call(admin, key, "GET", "/v1/rules", short_limit);
    auto j = r.error == http::CallError::kNone ? Json::parse(r.body, nullptr, false) : Json();
    if (r.error != http::CallError::kNone || r.status != 200 || !j.is_object()) {
      std::fprintf(stderr,
                   "kvgate doctor: GET %s/v1/rules: %s (is a kvgate admin listener there? see "
                   "--admin-host/--admin-port, and --admin-api-key-file for its key)\n",
                   admin_url.c_str(),
                   r.error != http::CallError::kNone
                       ? (std::string(http::to_string(r.error)) + " " + r.detail).c_str()
                       : ("status " + std::to_string(r.status) + ": " + r.body).c_str());
      return 2;
    }
    for (const auto& x : j.value("rules", Json::array())) {
      if (x.contains("name") && x["name"].is_string())
        names.push_back(x["name"].get<std::string>());
    }
    if (names.empty()) {
      std::fprintf(stderr, "kvgate doctor: the gateway has no rules\n");
      return 2;
    }
  }
  Json all = Json::array();
  bool failed = false;
  // The gateway stops a run after 10 minutes (between steps): room for the last step on top.
  auto long_limit = std::chrono::minutes(10) + std::chrono::seconds(timeout * 4 + settle * 4 + 60);
  for (const auto& name : names) {
    std::string path = "/v1/rules/" + name + "/doctor?steps=" + std::to_string(first) + "-" +
                       std::to_string(last) + "&timeout=" + std::to_string(timeout) +
                       "&settle=" + std::to_string(settle);
    if (concurrency > 0) path += "&concurrency=" + std::to_string(concurrency);
    auto r = admin_call(admin, key, "POST", path, long_limit);
    Json j = r.error == http::CallError::kNone ? Json::parse(r.body, nullptr, false) : Json();
    if (r.error != http::CallError::kNone || r.status != 200 || !j.is_object()) {
      std::string why = r.error != http::CallError::kNone
                            ? std::string(http::to_string(r.error)) + " " + r.detail
                            : "status " + std::to_string(r.status) + ": " + r.body;
      std::fprintf(stderr, "kvgate doctor: rule %s: %s\n", name.c_str(), why.c_str());
      return 2;
    }
    failed = failed || !j.value("ok", false);
    if (as_json) {
      all.push_back(std::move(j));
    } else {
      std::cout << format_text(j) << std::flush;
    }
  }
  if (as_json) std::cout << Json{{"ok", !failed}, {"rules", std::move(all)}}.dump(2) << "\n";
  return failed ? 1 : 0;
}

}  // namespace kvgate::doctor
