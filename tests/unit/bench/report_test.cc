// Tests for bench/report's outputs people read: the Markdown table (every row has one cell per
// header column) and the SVG chart (laid out without overlaps, checked geometrically from the text
// and bar positions it writes; rendered by rsvg-convert to a PNG of the size it declares).
#include "bench/report.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
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

TEST(BenchReport, LiveAgreementSaysHowQuestionsAnsweredOnTimeAgreed) {
  Summary s = row("kv_exact:gateways=4:sync", 0.5, 0.6, 0, 10);
  s.gateways = 4;
  s.synced = true;
  s.live_asked = 100;
  s.live_agreed = 90;
  s.live_agreement = 0.9;
  s.live_late = 20;
  s.live_late_agreed = 12;  // 8 of the 10 disagreements were late
  EXPECT_DOUBLE_EQ(s.live_on_time(), 78.0 / 80.0);
  EXPECT_NE(to_markdown({s}, "multiturn", "desc", "setup").find("90.00% (20 late; on time 97.50%)"),
            std::string::npos);
  EXPECT_NE(to_json({s}, "multiturn", "desc").find("\"live_on_time\":0.975"), std::string::npos)
      << to_json({s}, "multiturn", "desc");
  s.live_late = 100;  // none on time
  s.live_late_agreed = 90;
  EXPECT_LT(s.live_on_time(), 0);
}

// --- SVG geometry ---

struct Box {
  double x0, y0, x1, y1;
  std::string what;
};

bool overlap(const Box& a, const Box& b) {
  return a.x0 < b.x1 && b.x0 < a.x1 && a.y0 < b.y1 && b.y0 < a.y1;
}

std::map<std::string, std::string> attrs(const std::string& s) {
  std::map<std::string, std::string> out;
  static const std::regex kAttr(R"re(([a-z-]+)="([^"]*)")re");
  for (std::sregex_iterator it(s.begin(), s.end(), kAttr), end; it != end; ++it) {
    out[(*it)[1]] = (*it)[2];
  }
  return out;
}

std::string unescape(std::string s) {
  for (auto [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"&lt;", "<"}, {"&gt;", ">"}, {"&quot;", "\""}, {"&amp;", "&"}}) {
    for (size_t p; (p = s.find(from)) != std::string::npos;) s.replace(p, from.size(), to);
  }
  return s;
}

size_t code_points(const std::string& s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

struct Chart {
  double width = 0, height = 0;
  std::vector<Box> texts, bars, plot;
  std::vector<std::string> strings;
};

// Text boxes from each <text>'s x, y, font-size and anchor: 0.6 x font size per character wide,
// from one font size above the baseline to a quarter below it (descenders).
Chart parse_chart(const std::string& svg) {
  Chart c;
  auto root = attrs(svg.substr(0, svg.find('>')));
  c.width = std::stod(root.at("width"));
  c.height = std::stod(root.at("height"));
  static const std::regex kText(R"re(<text ([^>]*)>([^<]*)</text>)re");
  for (std::sregex_iterator it(svg.begin(), svg.end(), kText), end; it != end; ++it) {
    auto a = attrs((*it)[1]);
    std::string content = unescape((*it)[2]);
    double x = std::stod(a.at("x")), y = std::stod(a.at("y")), fs = std::stod(a.at("font-size"));
    double w = 0.6 * fs * static_cast<double>(code_points(content));
    std::string anchor = a.count("text-anchor") ? a["text-anchor"] : "start";
    double x0 = anchor == "middle" ? x - w / 2 : anchor == "end" ? x - w : x;
    c.texts.push_back({x0, y - fs, x0 + w, y + 0.25 * fs, "text '" + content + "'"});
    c.strings.push_back(content);
  }
  static const std::regex kRect(R"re(<rect ([^>]*)/>)re");
  for (std::sregex_iterator it(svg.begin(), svg.end(), kRect), end; it != end; ++it) {
    auto a = attrs((*it)[1]);
    std::string cls = a.count("class") ? a["class"] : "";
    if (cls == "background") continue;
    Box b{std::stod(a.at("x")), std::stod(a.at("y")), 0, 0, cls};
    b.x1 = b.x0 + std::stod(a.at("width"));
    b.y1 = b.y0 + std::stod(a.at("height"));
    (cls == "plot" ? c.plot : c.bars).push_back(b);
  }
  return c;
}

void expect_no_overlaps(const std::string& svg) {
  Chart c = parse_chart(svg);
  ASSERT_FALSE(c.texts.empty());
  for (const auto& t : c.texts) {
    EXPECT_TRUE(t.x0 >= 0 && t.y0 >= 0 && t.x1 <= c.width && t.y1 <= c.height)
        << t.what << " leaves the " << c.width << "x" << c.height << " canvas";
    for (const auto& b : c.bars) {
      EXPECT_FALSE(overlap(t, b)) << t.what << " overlaps a " << b.what << " rect";
    }
    for (const auto& p : c.plot) EXPECT_FALSE(overlap(t, p)) << t.what << " is inside the plot";
  }
  for (size_t i = 0; i < c.texts.size(); ++i) {
    for (size_t j = i + 1; j < c.texts.size(); ++j) {
      EXPECT_FALSE(overlap(c.texts[i], c.texts[j]))
          << c.texts[i].what << " overlaps " << c.texts[j].what;
    }
  }
}

// Several policies, long labels, hit rates at and around the upper bound, one unknown, TTFTs
// over five decades.
std::vector<Summary> busy_rows() {
  return {
      row("round_robin", 0.12, 0.6, 0.3, 900),
      row("cache_aware", 0.59, 0.6, 2, 300),
      row("consistent_hashing_with_bounded_loads", 0.6, 0.6, 1, 20000),
      row("prefix_hash", 0, 0.6, 1, 10),
      row("power_of_two", -1, 0.6, 4, 40),
      row("a_policy_label_that_is_far_too_long_for_any_reasonable_chart_column", 1.0, 0.6, 10, 100),
      row("bucket", 0.3, 0.6, 3, 4000)};
}

const std::string kLongTitle =
    "kvgate-bench compare: multiturn (16 users x 4 turns, 512-word system prompt & <shared> "
    "prefix, 8 kvgate-sim servers with 8000-token caches, time-scale 0.05)";

TEST(BenchReport, SvgTextNeverOverlapsTextOrBars) {
  {
    SCOPED_TRACE("seven policies, long labels and title");
    expect_no_overlaps(to_svg(busy_rows(), kLongTitle));
  }
  {
    SCOPED_TRACE("one policy");
    expect_no_overlaps(to_svg({row("cache_aware", 0.4, 0.5, 1, 50)}, "t"));
  }
  {
    SCOPED_TRACE("upper bound at 100% and at the left edge");
    expect_no_overlaps(to_svg({row("a", 1, 1, 1, 50), row("b", 0.01, 1, 1, 50)}, "t"));
    expect_no_overlaps(to_svg({row("a", 0.01, 0.001, 1, 50)}, "t"));
  }
  {
    SCOPED_TRACE("twenty policies");
    std::vector<Summary> many;
    for (int i = 0; i < 20; ++i) {
      many.push_back(row("policy_" + std::to_string(i), i / 20.0, 0.9, 1 + i, 100 + i));
    }
    expect_no_overlaps(to_svg(many, kLongTitle + " " + kLongTitle));
  }
  {
    SCOPED_TRACE("no rows");
    std::string svg = to_svg({}, "empty");
    EXPECT_NE(svg.find("</svg>"), std::string::npos);
  }
}

TEST(BenchReport, SvgEscapesTextAndShowsEveryPolicy) {
  auto rows = busy_rows();
  std::string svg = to_svg(rows, kLongTitle);
  EXPECT_EQ(svg.find("<shared>"), std::string::npos) << "unescaped markup in the title";
  EXPECT_NE(svg.find("&lt;shared&gt;"), std::string::npos);
  Chart c = parse_chart(svg);
  for (const auto& r : rows) {
    std::string shown = r.label.size() > 48 ? r.label.substr(0, 20) : r.label;
    bool found = std::any_of(c.strings.begin(), c.strings.end(),
                             [&](const std::string& s) { return s.find(shown) == 0; });
    EXPECT_TRUE(found) << r.label;
  }
  EXPECT_TRUE(std::count(c.strings.begin(), c.strings.end(), "upper bound 60.0%") == 1);
}

// --- Rendering ---

std::string run(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return "popen failed";
  char buf[512];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  int rc = ::pclose(p);
  return rc == 0 ? out : "exit " + std::to_string(rc) + ": " + out;
}

TEST(BenchReport, SvgRendersWithRsvgConvertAtItsDeclaredSize) {
  // Needs librsvg2-bin (scripts/setup installs it). Missing, this fails: a chart nobody checked
  // renders is not a tested chart.
  ASSERT_EQ(std::system("command -v rsvg-convert >/dev/null 2>&1"), 0)
      << "rsvg-convert not found: install librsvg2-bin (scripts/setup)";
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("kvgate-report-test-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::string svg = to_svg(busy_rows(), kLongTitle);
  { std::ofstream(dir / "chart.svg") << svg; }
  std::string out = run("rsvg-convert -o '" + (dir / "chart.png").string() + "' '" +
                        (dir / "chart.svg").string() + "'");
  ASSERT_TRUE(out.rfind("exit ", 0) != 0) << out;
  std::ifstream png(dir / "chart.png", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(png)), std::istreambuf_iterator<char>());
  ASSERT_GE(bytes.size(), 24u);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  EXPECT_EQ(bytes.substr(12, 4), "IHDR");
  auto be32 = [&](size_t at) {
    uint32_t v = 0;
    for (size_t i = 0; i < 4; ++i) v = (v << 8) | static_cast<uint8_t>(bytes[at + i]);
    return v;
  };
  Chart c = parse_chart(svg);
  EXPECT_EQ(be32(16), static_cast<uint32_t>(c.width));
  EXPECT_EQ(be32(20), static_cast<uint32_t>(c.height));
  EXPECT_GT(bytes.size(), 10000u) << "a chart this busy compresses to more than a blank page";
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kvgate::bench
