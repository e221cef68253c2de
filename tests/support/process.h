// tests/support/process: start a real binary for an integration test, capture its stderr to a file,
// wait for a condition, and stop it (SIGTERM, then SIGKILL) when the test ends.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace kvgate::testing {

// Directory holding kvgate, kvgate-sim, kvgate-bench (set at build time; KVGATE_BIN_DIR overrides).
std::string bin_dir();
// A TCP port on 127.0.0.1 that was free a moment ago.
int free_port();
// The first of `n` consecutive ports free on every address (a KV event publisher binds one per
// DP rank on tcp://*:base+rank).
int free_ports(int n);
// Waits until `cond` holds, polling every 10 ms, up to `timeout`. Returns whether it held.
bool wait_until(const std::function<bool()>& cond,
                std::chrono::milliseconds timeout = std::chrono::seconds(10));

class Process {
 public:
  Process() = default;
  // Starts bin_dir()/binary (or `binary` itself when it is an absolute path) with args;
  // stdout+stderr go to a temp log file.
  Process(const std::string& binary, std::vector<std::string> args);
  ~Process();
  Process(Process&& o) noexcept;
  Process& operator=(Process&& o) noexcept;
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  bool running();
  // SIGTERM, wait up to `grace`, then SIGKILL. Returns the exit status (or -signal).
  int stop(std::chrono::milliseconds grace = std::chrono::seconds(5));
  void kill_now();  // SIGKILL, for crash tests
  // Waits for the process to exit on its own; returns exit status, or nullopt-ish -1000 on timeout.
  int wait_exit(std::chrono::milliseconds timeout);
  std::string log() const;
  // What the running process holds now (from /proc): open descriptors, resident memory in KiB.
  int fd_count() const;
  long rss_kib() const;
  const std::string& log_path() const { return log_path_; }

 private:
  pid_t pid_ = -1;
  int status_ = 0;
  bool exited_ = false;
  std::string log_path_;
};

// Runs a binary (resolved as for Process) to completion: {exit status, stdout+stderr}.
struct RunResult {
  int status;
  std::string output;
};
RunResult run(const std::string& binary, const std::vector<std::string>& args,
              const std::string& stdin_text = "");

}  // namespace kvgate::testing
