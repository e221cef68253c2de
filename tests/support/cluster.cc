// tests/support/cluster: see cluster.h.
#include "support/cluster.h"

#include <gtest/gtest.h>

#include <csignal>
#include <cstdlib>
#include <sstream>
#include <stdexcept>

namespace kvgate::testing {

Sim Sim::launch(std::vector<std::string> args) {
  Sim s;
  s.port = free_port();
  s.args = std::move(args);
  s.start();
  return s;
}

void Sim::start() {
  // A first start whose port another process took meanwhile (free_port() cannot reserve it
  // across processes) moves to another port; a restart keeps its port.
  const bool first = process == nullptr;
  for (int attempt = 0;; ++attempt) {
    try_start();
    if (process->running() || !first || attempt == 4 ||
        process->log().find("Address already in use") == std::string::npos ||
        process->log().find("cannot listen on") == std::string::npos) {
      break;
    }
    process->stop();
    process.reset();
    port = free_port();
  }
  if (!process->running()) {
    throw std::runtime_error("kvgate-sim did not start on port " + std::to_string(port) + ":\n" +
                             process->log());
  }
}

void Sim::try_start() {
  std::vector<std::string> a = {"--host", "127.0.0.1", "--port", std::to_string(port)};
  a.insert(a.end(), args.begin(), args.end());
  process = std::make_unique<Process>("kvgate-sim", a);
  bool up = wait_until(
      [&] {
        if (!process->running()) return true;
        HttpClient c(port);
        c.set_timeout(std::chrono::milliseconds(500));
        return c.get("/health").status != 0;
      },
      std::chrono::seconds(10));
  if (!up && process->running()) {
    throw std::runtime_error("kvgate-sim did not answer /health on port " + std::to_string(port) +
                             ":\n" + process->log());
  }
}

Sim::~Sim() {
  if (!process) return;
  int status = process->stop();
  if (status != 0 && status != -SIGKILL) {
    ADD_FAILURE() << "kvgate-sim on port " << port << " exited with status " << status
                  << "; its log:\n"
                  << process->log();
  }
}

Cluster::Cluster(int n, std::vector<std::string> sim_args, std::vector<std::string> gateway_args,
                 bool wait_for_healthy) {
  for (int i = 0; i < n; ++i) {
    Sim s;
    s.port = free_port();
    s.args = sim_args;
    sims_.push_back(std::move(s));
  }
  for (auto& s : sims_) s.start();
  gateway_port_ = free_port();
  metrics_port_ = free_port();
  std::vector<std::string> a = {"--host",
                                "127.0.0.1",
                                "--port",
                                std::to_string(gateway_port_),
                                "--prometheus-host",
                                "127.0.0.1",
                                "--prometheus-port",
                                std::to_string(metrics_port_),
                                "--admin-port",
                                "0",
                                "--shutdown-grace-period-secs",
                                "2",
                                "--worker-urls"};
  for (auto& s : sims_) a.push_back(s.url());
  a.insert(a.end(), gateway_args.begin(), gateway_args.end());
  gateway_ = std::make_unique<Process>("kvgate", a);
  bool up = wait_until([&] {
    if (!gateway_->running()) return true;
    HttpClient c(gateway_port_);
    c.set_timeout(std::chrono::milliseconds(500));
    return c.get("/liveness").status == 200;
  });
  if (!up || !gateway_->running()) {
    throw std::runtime_error("kvgate did not start:\n" + gateway_->log());
  }
  if (wait_for_healthy && !wait_healthy(n)) {
    throw std::runtime_error("workers did not turn healthy:\n" + gateway_->log());
  }
}

Cluster::~Cluster() {
  if (gateway_) {
    // A clean exit is part of every test: a sanitizer report, a crash in teardown or a hang in
    // the drain shows up here.
    int status = gateway_->stop(std::chrono::seconds(20));
    if (status != 0 && !gateway_exit_checked_) {
      ADD_FAILURE() << "kvgate exited with status " << status << "; its log:\n" << gateway_->log();
    }
  }
  for (auto& s : sims_) {
    if (s.process) s.process->stop();
  }
}

int Cluster::healthy_workers() {
  HttpClient c(gateway_port_);
  auto r = c.get("/readiness");
  return static_cast<int>(json_number_field(r.body, "healthy_workers"));
}

bool Cluster::wait_healthy(int n, std::chrono::milliseconds timeout) {
  return wait_until([&] { return healthy_workers() == n; }, timeout);
}

std::string Cluster::metrics() {
  HttpClient c(metrics_port_);
  return c.get("/metrics").body;
}

double Cluster::metric(const std::string& series) {
  std::string text = metrics();
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(series + " ", 0) == 0) return std::atof(line.c_str() + series.size() + 1);
  }
  return -1;
}

std::string json_string_field(const std::string& text, const std::string& key) {
  std::string needle = "\"" + key + "\":";
  auto pos = text.find(needle);
  if (pos == std::string::npos) return "";
  pos += needle.size();
  while (pos < text.size() && text[pos] == ' ') ++pos;
  if (pos >= text.size() || text[pos] != '"') return "";
  auto end = text.find('"', pos + 1);
  return text.substr(pos + 1, end - pos - 1);
}

double json_number_field(const std::string& text, const std::string& key) {
  std::string needle = "\"" + key + "\":";
  auto pos = text.find(needle);
  if (pos == std::string::npos) return -1;
  return std::atof(text.c_str() + pos + needle.size());
}

}  // namespace kvgate::testing
