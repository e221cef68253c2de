// Integration: the kvgate-sim binary on its own: its metrics exposition and clean shutdown.
#include <gtest/gtest.h>

#include <sstream>

#include "support/cluster.h"

namespace kvgate::testing {
namespace {

// --port-count: one process answering on consecutive ports, one server behind them all (the
// end-to-end benchmark of many workers).
TEST(SimBinary, PortCountServesOneEngineOnEveryPort) {
  Sim s;
  s.port = free_ports(4);
  s.args = {"--port-count", "4", "--enable-metrics", "--ttft-ms", "1", "--tpot-ms", "1"};
  s.start();
  auto prompt_tokens = [](int port) {
    std::string text = HttpClient(port).get("/metrics").body;
    size_t at = text.find("sglang:prompt_tokens_total{");
    return at == std::string::npos ? std::string() : text.substr(at, text.find('\n', at) - at);
  };
  for (int i = 0; i < 4; ++i) {
    HttpClient c(s.port + i);
    EXPECT_EQ(c.get("/health").status, 200) << "port " << s.port + i;
    auto r = c.post("/generate", R"({"text":"hi there","sampling_params":{"max_new_tokens":2}})");
    EXPECT_EQ(r.status, 200) << "port " << s.port + i << ": " << r.body;
  }
  std::string first = prompt_tokens(s.port);
  EXPECT_FALSE(first.empty());
  EXPECT_EQ(prompt_tokens(s.port + 3), first) << "every port is the same engine";
}

TEST(SimBinary, MetricsAreValidPrometheusText) {
  Sim s;
  s.port = free_port();
  s.args = {"--enable-metrics", "--ttft-ms", "1", "--tpot-ms", "1"};
  s.start();
  HttpClient c(s.port);
  ASSERT_EQ(c.post("/generate", R"({"text":"hi","sampling_params":{"max_new_tokens":3}})").status,
            200);
  std::string text = c.get("/metrics").body;
  EXPECT_NE(text.find("sglang:prompt_tokens_total{"), std::string::npos) << text;
  EXPECT_NE(text.find("sglang:time_to_first_token_seconds_bucket{"), std::string::npos) << text;
  // promtool's only complaint may be SGLang's own naming: "sglang:" names contain a colon.
  auto r = run("/usr/bin/promtool", {"check", "metrics"}, text);
  std::istringstream lines(r.output);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    EXPECT_NE(line.find("metric names should not contain ':'"), std::string::npos) << line;
  }
  EXPECT_EQ(s.process->stop(), 0);  // SIGTERM: clean exit
}

}  // namespace
}  // namespace kvgate::testing
