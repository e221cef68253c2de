// tests/support/process: see process.h.
#include "support/process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>

#ifndef KVGATE_BIN_DIR
#define KVGATE_BIN_DIR "build"
#endif

namespace kvgate::testing {

std::string bin_dir() {
  if (const char* e = std::getenv("KVGATE_BIN_DIR"); e && *e) return e;
  return KVGATE_BIN_DIR;
}

namespace {

// One port bound and released at once (the kernel's choice of a free one).
int any_free_port();

}  // namespace

int free_port() {
  // The kernel may hand the same free port to two successive binds once the first is closed: a
  // test asking for two ports (two sims) must get two. Ports handed out are remembered.
  static std::mutex mu;
  static std::set<int> given;
  std::lock_guard lock(mu);
  for (int attempt = 0; attempt < 100; ++attempt) {
    int p = any_free_port();
    if (given.insert(p).second) return p;
  }
  throw std::runtime_error("free_port: no new port");
}

namespace {

int any_free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    throw std::runtime_error("free_port: bind failed");
  }
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  int port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

}  // namespace

int free_ports(int n) {
  // Below the kernel's ephemeral range (32768-60999 by default), where free_port() and every
  // outgoing connection draw from: a run found free here is not taken by a parallel test's next
  // free_port() before the process that needs it binds it.
  static std::atomic<unsigned> seq{static_cast<unsigned>(::getpid()) * 7919u};
  for (int attempt = 0; attempt < 200; ++attempt) {
    int base = 20000 + static_cast<int>((seq.fetch_add(97) * 131u) % 12000u);
    if (base + n - 1 > 65535) continue;
    bool all = true;
    for (int i = 0; i < n && all; ++i) {
      int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_ANY);
      a.sin_port = htons(static_cast<uint16_t>(base + i));
      all = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
      ::close(fd);
    }
    if (all) return base;
  }
  throw std::runtime_error("free_ports: no run of free ports found");
}

bool wait_until(const std::function<bool()>& cond, std::chrono::milliseconds timeout) {
  auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return cond();
}

Process::Process(const std::string& binary, std::vector<std::string> args) {
  char tmpl[] = "/tmp/kvgate-test-XXXXXX";
  int fd = ::mkstemp(tmpl);
  if (fd < 0) throw std::runtime_error("mkstemp failed");
  log_path_ = tmpl;
  std::string path = binary.starts_with("/") ? binary : bin_dir() + "/" + binary;
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(path.c_str()));
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    ::dup2(fd, STDOUT_FILENO);
    ::dup2(fd, STDERR_FILENO);
    ::close(fd);
    int devnull = ::open("/dev/null", O_RDONLY);
    ::dup2(devnull, STDIN_FILENO);
    ::execv(path.c_str(), argv.data());
    std::fprintf(stderr, "exec %s failed: %s\n", path.c_str(), std::strerror(errno));
    ::_exit(127);
  }
  ::close(fd);
}

Process::~Process() {
  if (pid_ > 0 && !exited_) stop();
  if (!log_path_.empty() && !std::getenv("KVGATE_KEEP_LOGS")) ::unlink(log_path_.c_str());
}

Process::Process(Process&& o) noexcept {
  *this = std::move(o);
}

Process& Process::operator=(Process&& o) noexcept {
  if (this != &o) {
    if (pid_ > 0 && !exited_) stop();
    pid_ = o.pid_;
    status_ = o.status_;
    exited_ = o.exited_;
    log_path_ = std::move(o.log_path_);
    o.pid_ = -1;
    o.exited_ = true;
    o.log_path_.clear();
  }
  return *this;
}

bool Process::running() {
  if (pid_ <= 0 || exited_) return false;
  int st = 0;
  pid_t r = ::waitpid(pid_, &st, WNOHANG);
  if (r == pid_) {
    exited_ = true;
    status_ = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
    return false;
  }
  return true;
}

int Process::wait_exit(std::chrono::milliseconds timeout) {
  if (!wait_until([&] { return !running(); }, timeout)) return -1000;
  return status_;
}

int Process::stop(std::chrono::milliseconds grace) {
  if (pid_ <= 0) return 0;
  if (!running()) return status_;
  ::kill(pid_, SIGTERM);
  if (wait_exit(grace) != -1000) return status_;
  kill_now();
  return status_;
}

void Process::kill_now() {
  if (pid_ <= 0 || !running()) return;
  ::kill(pid_, SIGKILL);
  int st = 0;
  ::waitpid(pid_, &st, 0);
  exited_ = true;
  status_ = -SIGKILL;
}

int Process::fd_count() const {
  int n = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/" + std::to_string(pid_) + "/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++n;
  }
  return ec ? -1 : n;
}

long Process::rss_kib() const {
  std::ifstream in("/proc/" + std::to_string(pid_) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6);
  }
  return -1;
}

std::string Process::log() const {
  std::ifstream in(log_path_);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

RunResult run(const std::string& binary, const std::vector<std::string>& args,
              const std::string& stdin_text) {
  std::string cmd = binary.starts_with("/") ? binary : bin_dir() + "/" + binary;
  for (const auto& a : args) {
    cmd += " '";
    for (char c : a) {
      if (c == '\'')
        cmd += "'\\''";
      else
        cmd += c;
    }
    cmd += "'";
  }
  char in_tmpl[] = "/tmp/kvgate-stdin-XXXXXX";
  int fd = ::mkstemp(in_tmpl);
  ssize_t w = ::write(fd, stdin_text.data(), stdin_text.size());
  (void)w;
  ::close(fd);
  cmd += " < ";
  cmd += in_tmpl;
  cmd += " 2>&1";
  RunResult r{0, ""};
  FILE* p = ::popen(cmd.c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  int st = ::pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  ::unlink(in_tmpl);
  return r;
}

}  // namespace kvgate::testing
