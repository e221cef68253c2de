// Integration: the kvgate-sim binary on its own: its metrics exposition and clean shutdown.
#include <gtest/gtest.h>

#include <sstream>

#include "support/cluster.h"

namespace kvgate::testing {
namespace {

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
