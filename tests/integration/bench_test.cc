// Integration: kvgate-bench end to end, in a short configuration: `compare` starts its own sims and
// kvgates and prints a table that parses; `run` drives a cluster.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "support/cluster.h"

namespace kvgate::testing {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(Bench, CompareRunsEveryPolicyAndItsTableParses) {
  std::string dir = "/tmp/kvgate-bench-test-" + std::to_string(free_port());
  auto r = run("kvgate-bench", {"compare", "--policies", "round_robin,cache_aware", "--sims", "2",
                                "--users", "4", "--turns", "2", "--user-words", "16",
                                "--output-tokens", "4", "--json", dir + "/c.json", "--quiet"});
  ASSERT_EQ(r.status, 0) << r.output;
  // The table: a header, then one row per policy with a hit rate, TTFT and 0 errors.
  std::istringstream lines(r.output);
  std::string line;
  int rows = 0;
  bool header = false;
  while (std::getline(lines, line)) {
    if (line.rfind("policy", 0) == 0) header = true;
    for (std::string p : {"round_robin", "cache_aware"}) {
      if (line.rfind(p + " ", 0) == 0) {
        ++rows;
        std::istringstream cols(line);
        std::vector<std::string> c;
        for (std::string w; cols >> w;) c.push_back(w);
        ASSERT_GE(c.size(), 9u) << line;
        EXPECT_EQ(c.back(), "0") << "errors: " << line;
        EXPECT_NE(c[1].find('%'), std::string::npos) << line;
      }
    }
  }
  EXPECT_TRUE(header) << r.output;
  EXPECT_EQ(rows, 2) << r.output;
  EXPECT_NE(r.output.find("upper bound of the workload"), std::string::npos);
  std::string json = read_file(dir + "/c.json");
  EXPECT_NE(json.find("\"policy\":\"round_robin\""), std::string::npos) << json;
  EXPECT_NE(read_file(dir + "/c.md").find("| cache_aware |"), std::string::npos);
  EXPECT_NE(read_file(dir + "/c.svg").find("</svg>"), std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(Bench, RunDrivesAnEndpoint) {
  Cluster c(2, {}, {"--policy", "round_robin", "--debug-headers"});
  auto r = run("kvgate-bench",
               {"run", "--url", "http://127.0.0.1:" + std::to_string(c.port()), "--users", "3",
                "--turns", "2", "--user-words", "8", "--output-tokens", "3", "--quiet"});
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("6 requests"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("requests per worker"), std::string::npos) << r.output;
}

TEST(Bench, BadArgumentsAreClearErrors) {
  auto r = run("kvgate-bench", {"compare", "--workload", "trace"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("needs --trace FILE"), std::string::npos) << r.output;
  r = run("kvgate-bench", {"frobnicate"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("unknown command"), std::string::npos);
}

}  // namespace
}  // namespace kvgate::testing
