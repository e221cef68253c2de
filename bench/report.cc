// bench/report: see report.h.
#include "bench/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "util/json.h"

namespace kvgate::bench {

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  double rank = p / 100.0 * static_cast<double>(v.size() - 1);
  size_t lo = static_cast<size_t>(std::floor(rank));
  size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (rank - static_cast<double>(lo));
}

namespace {

double spread(const std::map<std::string, double>& per) {
  if (per.empty()) return 0;
  double max = 0, sum = 0;
  for (const auto& [k, v] : per) {
    max = std::max(max, v);
    sum += v;
  }
  double mean = sum / static_cast<double>(per.size());
  return mean > 0 ? max / mean : 0;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string pct(double v) {
  return v < 0 ? "-" : fmt("%.1f%%", v * 100);
}

}  // namespace

Summary summarize(const std::string& label, const RunResult& run, double upper_bound,
                  double server_hit_rate) {
  Summary s;
  s.label = label;
  s.wall_s = run.wall_s;
  s.upper_bound = upper_bound;
  s.server_hit_rate = server_hit_rate;
  std::vector<double> itl, e2e;
  double out_tokens = 0, prompt = 0, cached = 0;
  std::map<std::string, double> worker_req, worker_tok;
  for (const auto& r : run.records) {
    ++s.requests;
    if (!r.ok()) {
      ++s.errors;
      if (s.first_error.empty()) s.first_error = r.error;
      continue;
    }
    s.ttft_ms.push_back(r.ttft_ms);
    e2e.push_back(r.e2e_ms);
    for (float g : r.itl_ms) itl.push_back(g);
    out_tokens +=
        static_cast<double>(r.completion_tokens >= 0 ? r.completion_tokens : r.streamed_tokens);
    if (r.prompt_tokens > 0 && r.cached_tokens >= 0) {
      prompt += static_cast<double>(r.prompt_tokens);
      cached += static_cast<double>(r.cached_tokens);
    }
    if (!r.worker.empty()) {
      worker_req[r.worker] += 1;
      worker_tok[r.worker] += static_cast<double>(std::max<int64_t>(r.prompt_tokens, 0));
      s.worker_requests[r.worker]++;
    }
  }
  std::sort(s.ttft_ms.begin(), s.ttft_ms.end());
  s.ttft_p50 = percentile(s.ttft_ms, 50);
  s.ttft_p90 = percentile(s.ttft_ms, 90);
  s.ttft_p99 = percentile(s.ttft_ms, 99);
  s.itl_p50 = percentile(itl, 50);
  s.itl_p99 = percentile(itl, 99);
  s.e2e_p50 = percentile(e2e, 50);
  s.e2e_p99 = percentile(e2e, 99);
  s.output_tokens_per_s = run.wall_s > 0 ? out_tokens / run.wall_s : 0;
  if (prompt > 0) s.hit_rate = cached / prompt;
  s.spread_requests = spread(worker_req);
  s.spread_tokens = spread(worker_tok);
  return s;
}

std::string table(const std::vector<Summary>& rows, bool with_bound) {
  std::string out;
  char line[512];
  int w = 16;  // the policy column fits the longest label
  for (const auto& s : rows) w = std::max(w, static_cast<int>(s.label.size()));
  std::snprintf(line, sizeof line, "%-*s %9s %8s %9s %9s %9s %9s %10s %7s %7s\n", w, "policy",
                "hit rate", with_bound ? "of bound" : "", "server", "TTFT p50", "TTFT p99",
                "ITL p50", "out tok/s", "spread", "errors");
  out += line;
  for (const auto& s : rows) {
    std::string of =
        with_bound && s.upper_bound > 0 && s.hit_rate >= 0 ? pct(s.hit_rate / s.upper_bound) : "";
    std::snprintf(line, sizeof line, "%-*s %9s %8s %9s %7.0fms %7.0fms %7.1fms %10.0f %7.2f %7zu\n",
                  w, s.label.c_str(), pct(s.hit_rate).c_str(), of.c_str(),
                  pct(s.server_hit_rate).c_str(), s.ttft_p50, s.ttft_p99, s.itl_p50,
                  s.output_tokens_per_s, s.spread_requests, s.errors);
    out += line;
  }
  return out;
}

std::string to_json(const std::vector<Summary>& rows, const std::string& workload,
                    const std::string& description) {
  std::string o = "{\"workload\":" + json::quote(workload) +
                  ",\"description\":" + json::quote(description) + ",\"results\":[";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Summary& s = rows[i];
    if (i) o += ",";
    auto num = [](double v) { return std::isfinite(v) ? fmt("%.6g", v) : std::string("null"); };
    o += "{\"policy\":" + json::quote(s.label) + ",\"requests\":" + std::to_string(s.requests) +
         ",\"errors\":" + std::to_string(s.errors) + ",\"wall_s\":" + num(s.wall_s) +
         ",\"output_tokens_per_s\":" + num(s.output_tokens_per_s) +
         ",\"ttft_ms\":{\"p50\":" + num(s.ttft_p50) + ",\"p90\":" + num(s.ttft_p90) +
         ",\"p99\":" + num(s.ttft_p99) + "},\"itl_ms\":{\"p50\":" + num(s.itl_p50) +
         ",\"p99\":" + num(s.itl_p99) + "},\"e2e_ms\":{\"p50\":" + num(s.e2e_p50) +
         ",\"p99\":" + num(s.e2e_p99) +
         "},\"hit_rate\":" + (s.hit_rate < 0 ? "null" : num(s.hit_rate)) +
         ",\"server_hit_rate\":" + (s.server_hit_rate < 0 ? "null" : num(s.server_hit_rate)) +
         ",\"upper_bound\":" + (s.upper_bound < 0 ? "null" : num(s.upper_bound)) +
         ",\"spread_requests\":" + num(s.spread_requests) +
         ",\"spread_tokens\":" + num(s.spread_tokens) + ",\"workers\":{";
    bool first = true;
    for (const auto& [w, n] : s.worker_requests) {
      if (!first) o += ",";
      first = false;
      o += json::quote(w) + ":" + std::to_string(n);
    }
    o += "}";
    if (!s.first_error.empty()) o += ",\"first_error\":" + json::quote(s.first_error);
    o += "}";
  }
  o += "]}\n";
  return o;
}

std::string to_markdown(const std::vector<Summary>& rows, const std::string& workload,
                        const std::string& description, const std::string& setup) {
  std::string o =
      "# kvgate-bench compare: " + workload + "\n\n" + description + "\n\n" + setup + "\n\n";
  // One header cell per value each row below emits (tests/unit/bench/report_test.cc checks it).
  static const char* kColumns[] = {
      "policy",      "hit rate",     "of upper bound",  "server hit rate", "TTFT p50 ms",
      "TTFT p90 ms", "TTFT p99 ms",  "ITL p50 ms",      "ITL p99 ms",      "e2e p50 ms",
      "e2e p99 ms",  "output tok/s", "spread max/mean", "errors"};
  std::string rule = "|";
  o += "|";
  for (const char* c : kColumns) {
    o += std::string(" ") + c + " |";
    rule += "---|";
  }
  o += "\n" + rule + "\n";
  for (const auto& s : rows) {
    o += "| " + s.label + " | " + pct(s.hit_rate) + " | " +
         (s.upper_bound > 0 && s.hit_rate >= 0 ? pct(s.hit_rate / s.upper_bound) : "-") + " | " +
         pct(s.server_hit_rate) + " | " + fmt("%.0f", s.ttft_p50) + " | " +
         fmt("%.0f", s.ttft_p90) + " | " + fmt("%.0f", s.ttft_p99) + " | " +
         fmt("%.1f", s.itl_p50) + " | " + fmt("%.1f", s.itl_p99) + " | " + fmt("%.0f", s.e2e_p50) +
         " | " + fmt("%.0f", s.e2e_p99) + " | " + fmt("%.0f", s.output_tokens_per_s) + " | " +
         fmt("%.2f", s.spread_requests) + " | " + std::to_string(s.errors) + " |\n";
  }
  if (!rows.empty() && rows.front().upper_bound >= 0) {
    o +=
        "\nUpper bound (an infinite cache with perfect routing): " + pct(rows.front().upper_bound) +
        " of prompt tokens.\n";
  }
  return o;
}

std::string to_svg(const std::vector<Summary>& rows, const std::string& title) {
  // Left: TTFT CDF per policy (log x axis). Right: hit rate bars against the upper bound.
  static const char* kColors[] = {"#d62728", "#1f77b4", "#2ca02c", "#ff7f0e",
                                  "#9467bd", "#8c564b", "#e377c2", "#17becf"};
  const double W = 960, H = 420, L = 60, T = 50, PW = 520, PH = 300, BX = 680, BW = 240;
  std::string s = fmt("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" ", W) +
                  fmt("height=\"%.0f\" font-family=\"sans-serif\" font-size=\"12\">\n", H);
  s += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s += fmt("<text x=\"%.0f\" y=\"24\" font-size=\"16\" font-weight=\"bold\">", L) + title +
       "</text>\n";
  double max_ttft = 1, min_ttft = 1e9;
  for (const auto& r : rows) {
    if (!r.ttft_ms.empty()) {
      max_ttft = std::max(max_ttft, r.ttft_ms.back());
      min_ttft = std::min(min_ttft, std::max(0.1, r.ttft_ms.front()));
    }
  }
  if (min_ttft > max_ttft) min_ttft = 0.1;
  double lo = std::floor(std::log10(min_ttft)), hi = std::ceil(std::log10(max_ttft));
  if (hi <= lo) hi = lo + 1;
  auto x_of = [&](double ms) {
    return L + (std::log10(std::max(ms, std::pow(10.0, lo))) - lo) / (hi - lo) * PW;
  };
  s += fmt("<rect x=\"%.0f\" ", L) + fmt("y=\"%.0f\" ", T) + fmt("width=\"%.0f\" ", PW) +
       fmt("height=\"%.0f\" fill=\"none\" stroke=\"#888\"/>\n", PH);
  for (double d = lo; d <= hi; d += 1) {
    double x = x_of(std::pow(10.0, d));
    s += fmt("<line x1=\"%.1f\" ", x) + fmt("x2=\"%.1f\" ", x) + fmt("y1=\"%.0f\" ", T) +
         fmt("y2=\"%.0f\" stroke=\"#eee\"/>\n", T + PH);
    s += fmt("<text x=\"%.1f\" ", x) + fmt("y=\"%.0f\" text-anchor=\"middle\">", T + PH + 16) +
         fmt("%g ms", std::pow(10.0, d)) + "</text>\n";
  }
  for (int q = 0; q <= 4; ++q) {
    double y = T + PH - PH * q / 4.0;
    s += fmt("<text x=\"%.0f\" ", L - 6) + fmt("y=\"%.1f\" text-anchor=\"end\">", y + 4) +
         fmt("%.0f%%", q * 25.0) + "</text>\n";
  }
  s += fmt("<text x=\"%.0f\" ", L + PW / 2) +
       fmt("y=\"%.0f\" text-anchor=\"middle\">", T + PH + 34) +
       "time to first token (CDF of requests, log scale)</text>\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& v = rows[i].ttft_ms;
    if (v.empty()) continue;
    std::string path = "M";
    size_t step = std::max<size_t>(1, v.size() / 400);
    for (size_t k = 0; k < v.size(); k += step) {
      double y = T + PH - PH * static_cast<double>(k + 1) / static_cast<double>(v.size());
      path += fmt("%.1f,", x_of(v[k])) + fmt("%.1f ", y);
    }
    path += fmt("%.1f,", x_of(v.back())) + fmt("%.1f", static_cast<double>(T));
    s += "<path d=\"" + path + "\" fill=\"none\" stroke-width=\"2\" stroke=\"" + kColors[i % 8] +
         "\"/>\n";
  }
  // Bars.
  double bar_w = BW / static_cast<double>(std::max<size_t>(rows.size(), 1));
  s += fmt("<text x=\"%.0f\" ", BX) +
       fmt("y=\"%.0f\">prompt tokens served from cache</text>\n", T - 8);
  s += fmt("<line x1=\"%.0f\" ", BX) + fmt("x2=\"%.0f\" ", BX + BW) + fmt("y1=\"%.0f\" ", T + PH) +
       fmt("y2=\"%.0f\" stroke=\"#888\"/>\n", T + PH);
  if (!rows.empty() && rows.front().upper_bound > 0) {
    double y = T + PH - PH * rows.front().upper_bound;
    s += fmt("<line x1=\"%.0f\" ", BX) + fmt("x2=\"%.0f\" ", BX + BW) + fmt("y1=\"%.1f\" ", y) +
         fmt("y2=\"%.1f\" stroke=\"#444\" stroke-dasharray=\"4 3\"/>\n", y);
    s += fmt("<text x=\"%.0f\" ", BX + BW) +
         fmt("y=\"%.1f\" text-anchor=\"end\">upper bound ", y - 4) + pct(rows.front().upper_bound) +
         "</text>\n";
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    double hr = std::max(0.0, rows[i].hit_rate);
    double x = BX + bar_w * static_cast<double>(i) + bar_w * 0.15;
    double h = PH * hr;
    s += fmt("<rect x=\"%.1f\" ", x) + fmt("y=\"%.1f\" ", T + PH - h) +
         fmt("width=\"%.1f\" ", bar_w * 0.7) + fmt("height=\"%.1f\" fill=\"", h) + kColors[i % 8] +
         "\"/>\n";
    s += fmt("<text x=\"%.1f\" ", x + bar_w * 0.35) +
         fmt("y=\"%.1f\" text-anchor=\"middle\">", T + PH - h - 4) + pct(rows[i].hit_rate) +
         "</text>\n";
    s += fmt("<text x=\"%.1f\" ", x + bar_w * 0.35) +
         fmt("y=\"%.0f\" text-anchor=\"middle\" font-size=\"10\">", T + PH + 16) + rows[i].label +
         "</text>\n";
  }
  // Legend.
  for (size_t i = 0; i < rows.size(); ++i) {
    double y = H - 40 + 14 * static_cast<double>(i % 3);
    double x = L + 180.0 * std::floor(static_cast<double>(i) / 3.0);  // three rows per column
    s += fmt("<rect x=\"%.0f\" ", x) + fmt("y=\"%.0f\" width=\"12\" height=\"4\" fill=\"", y - 4) +
         kColors[i % 8] + "\"/>\n";
    s += fmt("<text x=\"%.0f\" ", x + 18) + fmt("y=\"%.0f\">", y) + rows[i].label +
         fmt(": TTFT p50 %.0f ms", rows[i].ttft_p50) + "</text>\n";
  }
  s += "</svg>\n";
  return s;
}

}  // namespace kvgate::bench
