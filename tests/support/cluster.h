// tests/support/cluster: N kvgate-sim servers and one kvgate in front of them, on loopback ports,
// started for a test and stopped when it ends. Waits for conditions instead of sleeping.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "support/http_client.h"
#include "support/process.h"

namespace kvgate::testing {

struct Sim {
  int port = 0;
  std::vector<std::string> args;
  std::unique_ptr<Process> process;
  Sim() = default;
  Sim(Sim&&) = default;
  Sim& operator=(Sim&&) = default;
  // Stops the process. Like kvgate's, its exit is checked: an exit status other than 0 (a
  // sanitizer report, a crash in teardown) fails the test; a SIGKILL (kill(), or a hang past the
  // stop grace) does not.
  ~Sim();
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port); }
  // A sim on a free port with `args`, started (as start()).
  static Sim launch(std::vector<std::string> args);
  // (Re)starts the process on the same port; waits until /health answers 200.
  void start();
  void try_start();
  void kill() { process->kill_now(); }
};

class Cluster {
 public:
  // Starts `n` sims (each with `sim_args`) and kvgate with `gateway_args` plus
  // --worker-urls, --host/--port and --prometheus-port. Waits until all sims are healthy in kvgate.
  Cluster(int n, std::vector<std::string> sim_args, std::vector<std::string> gateway_args,
          bool wait_healthy = true);
  ~Cluster();

  int port() const { return gateway_port_; }
  int metrics_port() const { return metrics_port_; }
  Sim& sim(size_t i) { return sims_[i]; }
  size_t size() const { return sims_.size(); }
  Process& gateway() { return *gateway_; }
  // For a test that stops kvgate itself and checks its exit: the destructor then does not.
  void gateway_exit_checked() { gateway_exit_checked_ = true; }
  // Number of workers kvgate reports healthy on /readiness.
  int healthy_workers();
  bool wait_healthy(int n, std::chrono::milliseconds timeout = std::chrono::seconds(15));
  std::string metrics();
  // Value of one sample line of kvgate's /metrics ("name{labels}"), or -1 when absent.
  double metric(const std::string& series);

 private:
  std::vector<Sim> sims_;
  std::unique_ptr<Process> gateway_;
  int gateway_port_ = 0;
  int metrics_port_ = 0;
  bool gateway_exit_checked_ = false;
};

// A minimal JSON string-field lookup for tests: the value of the first "key":"..." in text.
std::string json_string_field(const std::string& text, const std::string& key);
// The first "key": <number> in text, or -1.
double json_number_field(const std::string& text, const std::string& key);

}  // namespace kvgate::testing
