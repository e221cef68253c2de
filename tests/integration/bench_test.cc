// Integration: kvgate-bench end to end, in a short configuration: `compare` starts its own sims and
// kvgates and prints a table that parses; `run` drives a cluster.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "support/cluster.h"
#include "support/models.h"

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

// The value of "key": in the JSON object of `policy` in a compare report (-1 when absent).
double policy_field(const std::string& json, const std::string& policy, const std::string& key) {
  size_t at = json.find("{\"policy\":\"" + policy + "\"");
  if (at == std::string::npos) return -1;
  size_t end = json.find("{\"policy\":", at + 1);
  size_t k = json.find("\"" + key + "\":", at);
  if (k == std::string::npos || (end != std::string::npos && k > end)) return -1;
  return std::atof(json.c_str() + k + key.size() + 3);
}

// kvgate-bench compare of round_robin and kv_exact on 2 sims, 4 users x 3 turns (12 requests per
// policy), Qwen3's tokenizer, the report in `dir`; `extra` sets the topology.
std::vector<std::string> small_kv_compare(const std::string& dir,
                                          std::initializer_list<std::string> extra) {
  std::vector<std::string> a = {"compare",
                                "--policies",
                                "round_robin,kv_exact",
                                "--sims",
                                "2",
                                "--users",
                                "4",
                                "--turns",
                                "3",
                                "--user-words",
                                "24",
                                "--output-tokens",
                                "4",
                                "--page-size",
                                "16",
                                "--tokenizer-path",
                                models_dir() + "/qwen3",
                                "--json",
                                dir + "/c.json",
                                "--quiet"};
  a.insert(a.end(), extra);
  return a;
}

// kv_exact in compare: the sims publish their KV events, each of two kvgates follows every
// (sim, rank) before the workload starts, and the turns of a conversation, alternating between
// the two kvgates, still find their earlier turns cached (kv_exact routes from events, not from
// the requests one replica saw).
TEST(Bench, CompareRunsKvExactBehindTwoReplicasWithDpRanks) {
  KVGATE_REQUIRE_MODEL("qwen3");
  std::string dir = "/tmp/kvgate-bench-test-" + std::to_string(free_port());
  auto r = run("kvgate-bench", small_kv_compare(dir, {"--sim-dp-size", "2", "--replicas", "2"}));
  ASSERT_EQ(r.status, 0) << r.output;
  std::string json = read_file(dir + "/c.json");
  for (std::string p : {"round_robin", "kv_exact"}) {
    EXPECT_EQ(policy_field(json, p, "errors"), 0) << p << ": " << json;
    EXPECT_EQ(policy_field(json, p, "requests"), 12) << p << ": " << json;
  }
  EXPECT_GT(policy_field(json, "kv_exact", "hit_rate"), 0) << json;
  EXPECT_GT(policy_field(json, "kv_exact", "branch_kv_exact_hit"), 0) << json;
  EXPECT_LE(policy_field(json, "kv_exact", "kv_orphan_blocks"), 0) << json;  // none, or absent
  // Both replicas served: each kept its own log and metrics.
  for (const char* metrics :
       {"/c-logs/kvgate-kv_exact-0.metrics", "/c-logs/kvgate-kv_exact-1.metrics"}) {
    EXPECT_TRUE(std::filesystem::exists(dir + metrics)) << metrics;
  }
  std::filesystem::remove_all(dir);
}

// The prefill/decode topology: the sims as prefill servers (2 DP ranks) beside a decode server,
// each policy choosing the prefill (kv_exact: kvExactMode 1); the hits are the prefill's, reported
// by the decode, and the records name the prefill servers.
TEST(Bench, ComparePrefillDecodeTopology) {
  KVGATE_REQUIRE_MODEL("qwen3");
  std::string dir = "/tmp/kvgate-bench-test-" + std::to_string(free_port());
  auto r = run("kvgate-bench", small_kv_compare(dir, {"--pd-decode", "1", "--sim-dp-size", "2"}));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("prefill/decode: 2 prefill + 1 decode servers"), std::string::npos)
      << r.output;
  std::string json = read_file(dir + "/c.json");
  for (std::string p : {"round_robin", "kv_exact"}) {
    EXPECT_EQ(policy_field(json, p, "errors"), 0) << p << ": " << json;
    EXPECT_EQ(policy_field(json, p, "requests"), 12) << p << ": " << json;
  }
  EXPECT_GT(policy_field(json, "kv_exact", "hit_rate"), 0) << json;
  EXPECT_GT(policy_field(json, "kv_exact", "branch_kv_exact_hit"), 0) << json;
  std::string records = read_file(dir + "/c-logs/records-kv_exact.jsonl");
  EXPECT_NE(records.find("kv_exact_hit"), std::string::npos) << records.substr(0, 2000);
  std::filesystem::remove_all(dir);
}

TEST(Bench, KvExactWithoutTokenizerIsAClearError) {
  std::string dir = "/tmp/kvgate-bench-test-" + std::to_string(free_port());
  auto r = run("kvgate-bench", {"compare", "--policies", "kv_exact", "--sims", "1", "--users", "1",
                                "--turns", "1", "--quiet", "--json", dir + "/c.json"});
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("kv_exact needs --tokenizer-path"), std::string::npos) << r.output;
  std::filesystem::remove_all(dir);
}

// POLICY:FLAG=VALUE reaches that policy's kvgate (and only it): a value kvgate refuses stops
// the run with kvgate's own error.
TEST(Bench, PolicyEntryFlagsReachItsKvgate) {
  std::string dir = "/tmp/kvgate-bench-test-" + std::to_string(free_port());
  auto r =
      run("kvgate-bench", {"compare", "--policies", "round_robin,round_robin:kv-load-tokens=-5",
                           "--sims", "1", "--users", "1", "--turns", "1", "--user-words", "4",
                           "--output-tokens", "2", "--quiet", "--json", dir + "/c.json"});
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("kvgate --policy round_robin:kv-load-tokens=-5 did not become ready"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("kv-load-tokens"), std::string::npos) << r.output;
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
