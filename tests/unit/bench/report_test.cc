// Tests for bench/report's outputs people read: the Markdown table (every row has one cell per
// header column).
#include "bench/report.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <sstream>

namespace kvgate::bench {
namespace {

// --- Markdown ---

std::vector<std::string> cells(const std::string& line) {
  // "| a | b |" -> {"a", "b"}
  std::vector<std::string> out;
  std::string cur;
  for (size_t i = 1; i < line.size(); ++i) {
    if (line[i] == '|') {
      size_t b = cur.find_first_not_of(' '), e = cur.find_last_not_of(' ');
      out.push_back(b == std::string::npos ? "" : cur.substr(b, e - b + 1));
      cur.clear();
    } else {
      cur += line[i];
    }
  }
  return out;
}

Summary row(const std::string& label, double hit, double ub, double ttft_lo, double ttft_hi) {
  Summary s;
  s.label = label;
  s.requests = 100;
  s.hit_rate = hit;
  s.server_hit_rate = hit;
  s.upper_bound = ub;
  for (int i = 0; i < 50; ++i) {
    s.ttft_ms.push_back(ttft_lo * std::pow(ttft_hi / ttft_lo, i / 49.0));
  }
  s.ttft_p50 = s.ttft_ms[25];
  s.ttft_p90 = s.ttft_ms[45];
  s.ttft_p99 = s.ttft_ms[49];
  s.itl_p50 = 4.5;
  s.itl_p99 = 9.25;
  s.e2e_p50 = 1234;
  s.e2e_p99 = 5678;
  s.output_tokens_per_s = 4321;
  s.spread_requests = 1.25;
  return s;
}

TEST(BenchReport, MarkdownRowsHaveOneCellPerHeaderColumn) {
  std::vector<Summary> rows = {row("round_robin", 0.12, 0.6, 5, 900),
                               row("cache_aware", 0.55, 0.6, 2, 300),
                               row("prefix_hash", -1, 0.6, 1, 10)};
  std::string md = to_markdown(rows, "multiturn", "desc", "setup");
  std::istringstream in(md);
  std::vector<std::vector<std::string>> table;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("|", 0) == 0) table.push_back(cells(line));
  }
  ASSERT_EQ(table.size(), 2 + rows.size()) << md;  // header, rule, one row per policy
  const auto& header = table[0];
  for (const auto& c : table[1]) EXPECT_EQ(c, "---");
  for (size_t r = 1; r < table.size(); ++r) {
    EXPECT_EQ(table[r].size(), header.size()) << "row " << r << " of\n" << md;
  }
  // The e2e columns hold the e2e values, in that order.
  auto col = [&](const std::string& name) {
    auto it = std::find(header.begin(), header.end(), name);
    EXPECT_NE(it, header.end()) << name;
    return static_cast<size_t>(it - header.begin());
  };
  EXPECT_EQ(table[2][col("e2e p50 ms")], "1234");
  EXPECT_EQ(table[2][col("e2e p99 ms")], "5678");
  EXPECT_EQ(table[2][col("errors")], "0");
  EXPECT_EQ(table[2][col("policy")], "round_robin");
}

}  // namespace
}  // namespace kvgate::bench
