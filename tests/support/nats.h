// tests/support/nats: Debian's nats-server on a loopback port for a test (JetStream on request,
// its store in a temporary directory). A missing server fails the test (scripts/setup installs
// it), never skips it.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "support/http_client.h"
#include "support/process.h"
#include "support/temp_dir.h"

namespace kvgate::testing {

struct Nats {
  static constexpr const char* kServer = "/usr/sbin/nats-server";
  explicit Nats(bool jetstream = false) : port(free_port()), jetstream(jetstream) { start(); }
  void start() {
    using namespace std::chrono_literals;
    EXPECT_EQ(access(kServer, X_OK), 0)
        << kServer << " is missing: run scripts/setup (Debian's nats-server)";
    std::vector<std::string> args{"-a", "127.0.0.1", "-p", std::to_string(port)};
    if (jetstream) args.insert(args.end(), {"-js", "-sd", store.path()});
    process = std::make_unique<Process>(kServer, args);
    EXPECT_TRUE(
        wait_until([&] { return HttpClient(port).raw("PING\r\n", 200ms).find("INFO") == 0; }, 10s))
        << "nats-server did not start: " << process->log();
  }
  void stop() { process->stop(); }
  std::string url() const { return "nats://127.0.0.1:" + std::to_string(port); }
  int port;
  bool jetstream;
  TempDir store;
  std::unique_ptr<Process> process;
};

}  // namespace kvgate::testing
