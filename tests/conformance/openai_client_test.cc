// Conformance: runs the official `openai` npm client (tests/conformance/openai_client.mjs) against
// kvgate in front of two kvgate-sim servers.
#include <gtest/gtest.h>

#include <filesystem>

#include "support/cluster.h"

#ifndef KVGATE_SOURCE_DIR
#define KVGATE_SOURCE_DIR "."
#endif

namespace kvgate::testing {
namespace {

TEST(OpenAiClient, ChatAndCompletionsStreamAndNonStream) {
  std::string dir = std::string(KVGATE_SOURCE_DIR) + "/tests/conformance";
  ASSERT_TRUE(std::filesystem::exists(dir + "/node_modules/openai"))
      << "the openai npm package is missing: run scripts/setup";
  Cluster c(2, {"--ttft-ms", "2", "--tpot-ms", "1"}, {"--policy", "round_robin"});
  auto r = run("/usr/bin/node",
               {dir + "/openai_client.mjs", "http://127.0.0.1:" + std::to_string(c.port())});
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("all openai client checks passed"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace kvgate::testing
