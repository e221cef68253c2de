// bench/report: see report.h.
#include "bench/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string_view>

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

namespace {
// Several kvgates per row: how many, whether they shared state, their agreement and sync traffic.
// "" when every row ran one kvgate. `markdown`: a Markdown table, else aligned text.
std::string replicas_table(const std::vector<Summary>& rows, bool markdown) {
  if (std::none_of(rows.begin(), rows.end(), [](const Summary& s) { return s.gateways > 1; })) {
    return "";
  }
  std::string out = markdown ? "\n| policy | kvgates | shared state | agreement | live agreement | "
                               "sync bytes / request | spread max/mean |\n"
                               "|---|---|---|---|---|---|---|\n"
                             : "\n";
  char line[512];
  int w = 16;
  for (const auto& s : rows) w = std::max(w, static_cast<int>(s.label.size()));
  if (!markdown) {
    std::snprintf(line, sizeof line, "%-*s %8s %7s %10s %36s %12s %7s\n", w, "policy", "kvgates",
                  "shared", "agreement", "live", "sync B/req", "spread");
    out += line;
  }
  for (const auto& s : rows) {
    const std::string agree = s.agreement < 0 ? "-" : fmt("%.1f%%", s.agreement * 100);
    std::string live = s.live_agreement < 0 ? "-" : fmt("%.2f%%", s.live_agreement * 100);
    if (s.live_late > 0) {
      live += " (" + std::to_string(s.live_late) + " late";
      if (s.live_on_time() >= 0) live += fmt("; on time %.2f%%", s.live_on_time() * 100);
      live += ")";
    }
    const std::string bytes =
        s.sync_bytes_per_request < 0 ? "-" : fmt("%.0f", s.sync_bytes_per_request);
    if (markdown) {
      out.append("| ").append(s.label).append(" | ").append(std::to_string(s.gateways));
      out.append(" | ").append(s.synced ? "NATS" : "no").append(" | ").append(agree);
      out.append(" | ").append(live).append(" | ").append(bytes).append(" | ");
      out.append(fmt("%.2f", s.spread_requests)).append(" |\n");
    } else {
      std::snprintf(line, sizeof line, "%-*s %8d %7s %10s %36s %12s %7.2f\n", w, s.label.c_str(),
                    s.gateways, s.synced ? "NATS" : "no", agree.c_str(), live.c_str(),
                    bytes.c_str(), s.spread_requests);
      out += line;
    }
  }
  return out;
}
}  // namespace

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
  out += replicas_table(rows, false);
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
    if (!s.routing.empty()) {
      o += ",\"routing\":{";
      first = true;
      for (const auto& [k, v] : s.routing) {
        if (!first) o += ",";
        first = false;
        o += json::quote(k) + ":" + num(v);
      }
      o += "}";
    }
    if (!s.first_error.empty()) o += ",\"first_error\":" + json::quote(s.first_error);
    o += ",\"gateways\":" + std::to_string(s.gateways) +
         ",\"shared_state\":" + (s.synced ? "true" : "false") +
         ",\"agreement\":" + (s.agreement < 0 ? "null" : num(s.agreement)) +
         ",\"live_agreement\":" + (s.live_agreement < 0 ? "null" : num(s.live_agreement)) +
         ",\"live_asked\":" + std::to_string(s.live_asked) +
         ",\"live_late\":" + std::to_string(s.live_late) +
         ",\"live_on_time\":" + (s.live_on_time() < 0 ? "null" : num(s.live_on_time())) +
         ",\"sync_bytes_per_request\":" +
         (s.sync_bytes_per_request < 0 ? "null" : num(s.sync_bytes_per_request));
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
  o += replicas_table(rows, true);
  return o;
}

namespace {

// --- SVG layout ---
// Every position below is computed from text widths estimated as kCharWidth x font size per
// character (code point), with gaps that absorb the error of that estimate for DejaVu Sans, the
// usual sans-serif. tests/unit/bench/report_test.cc checks the result: no two text boxes overlap,
// no text overlaps a bar, everything is inside the canvas, and rsvg-convert renders it.
constexpr double kCharWidth = 0.6;
constexpr double kBoldCharWidth = 0.7;  // the title is bold: wider glyphs
constexpr size_t kMaxLabel = 48;        // longer policy labels are cut with an ellipsis

size_t code_points(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

double text_width(std::string_view s, double font_size, double factor = kCharWidth) {
  return static_cast<double>(code_points(s)) * font_size * factor;
}

// The first `n` code points of `s`, with an ellipsis when it was longer.
std::string cut(std::string_view s, size_t n) {
  if (code_points(s) <= n) return std::string(s);
  size_t i = 0, seen = 0;
  while (i < s.size() && seen < n - 1) {
    ++i;
    while (i < s.size() && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) ++i;
    ++seen;
  }
  return std::string(s.substr(0, i)) + "\xE2\x80\xA6";
}

std::string xml_escape(std::string_view s) {
  std::string o;
  o.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        o += "&amp;";
        break;
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '"':
        o += "&quot;";
        break;
      default:
        o += c;
    }
  }
  return o;
}

// Greedy word wrap to lines of at most `width` pixels (a word longer than a line is cut).
std::vector<std::string> wrap(std::string_view text, double width, double font_size,
                              double factor) {
  auto max_chars = static_cast<size_t>(std::max(1.0, width / (font_size * factor)));
  std::vector<std::string> lines;
  std::string line;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t sp = text.find(' ', pos);
    std::string word(text.substr(pos, sp == std::string_view::npos ? sp : sp - pos));
    pos = sp == std::string_view::npos ? text.size() : sp + 1;
    if (word.empty()) continue;
    std::string joined = line;
    if (!joined.empty()) joined += ' ';
    joined += word;
    if (code_points(joined) <= max_chars) {
      line = std::move(joined);
      continue;
    }
    if (!line.empty()) lines.push_back(std::move(line));
    line = cut(word, max_chars);
  }
  if (!line.empty() || lines.empty()) lines.push_back(line);
  return lines;
}

// "0.1 ms", "10 ms", "1 s", "100 s": a decade tick label.
std::string decade_label(int d) {
  if (d >= 3) return fmt("%.0f s", std::pow(10.0, d - 3));
  if (d >= 0) return fmt("%.0f ms", std::pow(10.0, d));
  return fmt("%g ms", std::pow(10.0, d));
}

class Svg {
 public:
  void text(double x, double y, double size, std::string_view anchor, std::string_view content,
            std::string_view extra = "") {
    body_ += fmt("<text x=\"%.1f\" ", x) + fmt("y=\"%.1f\" ", y) + fmt("font-size=\"%.0f\"", size);
    if (anchor != "start") body_ += " text-anchor=\"" + std::string(anchor) + "\"";
    if (!extra.empty()) body_ += " " + std::string(extra);
    body_ += ">" + xml_escape(content) + "</text>\n";
  }
  void rect(std::string_view cls, double x, double y, double w, double h, std::string_view fill,
            std::string_view extra = "") {
    body_ += "<rect class=\"" + std::string(cls) + "\" " + fmt("x=\"%.1f\" ", x) +
             fmt("y=\"%.1f\" ", y) + fmt("width=\"%.1f\" ", w) + fmt("height=\"%.1f\" ", h) +
             "fill=\"" + std::string(fill) + "\"";
    if (!extra.empty()) body_ += " " + std::string(extra);
    body_ += "/>\n";
  }
  void line(double x1, double y1, double x2, double y2, std::string_view style) {
    body_ += fmt("<line x1=\"%.1f\" ", x1) + fmt("y1=\"%.1f\" ", y1) + fmt("x2=\"%.1f\" ", x2) +
             fmt("y2=\"%.1f\" ", y2) + std::string(style) + "/>\n";
  }
  void raw(std::string_view s) { body_ += s; }
  std::string finish(double w, double h) const {
    return fmt("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" ", w) +
           fmt("height=\"%.0f\" ", h) + fmt("viewBox=\"0 0 %.0f ", w) + fmt("%.0f\" ", h) +
           "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n" +
           fmt("<rect class=\"background\" width=\"%.0f\" ", w) +
           fmt("height=\"%.0f\" fill=\"white\"/>\n", h) + body_ + "</svg>\n";
  }

 private:
  std::string body_;
};

}  // namespace

std::string to_svg(const std::vector<Summary>& rows, const std::string& title) {
  // Left: TTFT CDF per policy (log x axis). Right: hit rate per policy as horizontal bars (one row
  // each, labels in their own column, so long labels never collide) against the upper bound.
  // Below both: the legend (colour -> policy and its TTFT p50), where no bar or curve can be.
  static const char* kColors[] = {"#d62728", "#1f77b4", "#2ca02c", "#ff7f0e",
                                  "#9467bd", "#8c564b", "#e377c2", "#17becf"};
  constexpr double kMargin = 20, kTitleSize = 15, kSize = 12, kTickSize = 11;
  constexpr double kPlotW = 480, kPlotH = 280, kBarW = 200, kGap = 8;
  const size_t n = rows.size();
  std::vector<std::string> labels;
  labels.reserve(rows.size());
  for (const auto& r : rows) labels.push_back(cut(r.label, kMaxLabel));

  // Time axis: whole decades, thinned so that tick labels keep clear of each other.
  double max_ttft = 1, min_ttft = 1e9;
  for (const auto& r : rows) {
    if (!r.ttft_ms.empty()) {
      max_ttft = std::max(max_ttft, r.ttft_ms.back());
      min_ttft = std::min(min_ttft, std::max(0.1, r.ttft_ms.front()));
    }
  }
  if (min_ttft > max_ttft) min_ttft = 0.1;
  int lo = static_cast<int>(std::floor(std::log10(min_ttft)));
  int hi = static_cast<int>(std::ceil(std::log10(max_ttft)));
  if (hi <= lo) hi = lo + 1;
  double widest_tick = 0;
  for (int d = lo; d <= hi; ++d)
    widest_tick = std::max(widest_tick, text_width(decade_label(d), kTickSize));
  const double decade_px = kPlotW / (hi - lo);
  const int tick_step = std::max(1, static_cast<int>(std::ceil((widest_tick + 12) / decade_px)));

  // Horizontal layout, left to right.
  const double plot_x = kMargin + text_width("100%", kTickSize) + 6;
  const double plot_r = plot_x + kPlotW;
  const double last_tick_half = text_width(decade_label(hi), kTickSize) / 2;
  const double panel_x = plot_r + std::max(40.0, last_tick_half + 24);
  double label_w = 0, value_w = text_width("100.0%", kSize);
  for (size_t i = 0; i < n; ++i) {
    label_w = std::max(label_w, text_width(labels[i], kSize));
    value_w = std::max(value_w, text_width(pct(rows[i].hit_rate), kSize));
  }
  const std::string bars_title = "prompt tokens served from cache";
  const double bar_x = panel_x + label_w + kGap;
  const double value_r = bar_x + kBarW + kGap + value_w;
  const double panel_r = std::max(value_r, panel_x + text_width(bars_title, kSize));
  const double W = std::max(720.0, panel_r + kMargin);

  // Vertical layout, top to bottom: title lines, two header rows, the panels, the legend.
  auto title_lines = wrap(title, W - 2 * kMargin, kTitleSize, kBoldCharWidth);
  const double title_bottom = kMargin + static_cast<double>(title_lines.size()) * (kTitleSize + 5);
  const double header1 = title_bottom + 10 + kSize;  // baselines
  const double header2 = header1 + kSize + 8;
  const double T = header2 + 10;  // top of both panels
  const double row_h = n ? std::clamp(kPlotH / static_cast<double>(n), 24.0, 40.0) : 24.0;
  const double bars_h = row_h * static_cast<double>(n);
  const double tick_base = T + kPlotH + 8 + kTickSize;
  const double axis_base = tick_base + 8 + kSize;
  const double panels_bottom = std::max(axis_base + kSize * 0.3, T + bars_h);

  double entry_w = 0;  // legend entries: swatch, gap, text
  std::vector<std::string> entries;
  for (size_t i = 0; i < n; ++i) {
    entries.push_back(labels[i] + fmt(": TTFT p50 %.0f ms", rows[i].ttft_p50));
    entry_w = std::max(entry_w, 22 + text_width(entries.back(), kSize));
  }
  const double col_w = entry_w + 28;
  const size_t cols =
      std::max<size_t>(1, static_cast<size_t>(std::floor((W - 2 * kMargin) / col_w)));
  const size_t legend_rows = (n + cols - 1) / cols;
  const double legend_top = panels_bottom + 24;
  const double H = legend_top + static_cast<double>(legend_rows) * 20 + kMargin;

  Svg s;
  for (size_t i = 0; i < title_lines.size(); ++i) {
    s.text(kMargin, kMargin + kTitleSize + static_cast<double>(i) * (kTitleSize + 5), kTitleSize,
           "start", title_lines[i], "font-weight=\"bold\"");
  }

  // TTFT CDF.
  auto x_of = [&](double ms) {
    return plot_x + (std::log10(std::max(ms, std::pow(10.0, lo))) - lo) / (hi - lo) * kPlotW;
  };
  s.text(plot_x, header1, kSize, "start",
         "share of requests answered within a time to first token");
  s.rect("plot", plot_x, T, kPlotW, kPlotH, "none", "stroke=\"#888\"");
  for (int d = lo; d <= hi; ++d) {
    double x = x_of(std::pow(10.0, d));
    s.line(x, T, x, T + kPlotH, "stroke=\"#eee\"");
    if ((d - lo) % tick_step == 0) s.text(x, tick_base, kTickSize, "middle", decade_label(d));
  }
  for (int q = 0; q <= 4; ++q) {
    double y = T + kPlotH - kPlotH * q / 4.0;
    s.text(plot_x - 6, y + kTickSize * 0.35, kTickSize, "end", fmt("%.0f%%", q * 25.0));
  }
  s.text(plot_x + kPlotW / 2, axis_base, kSize, "middle", "time to first token (log scale)");
  for (size_t i = 0; i < n; ++i) {
    const auto& v = rows[i].ttft_ms;
    if (v.empty()) continue;
    std::string path = "M";
    size_t step = std::max<size_t>(1, v.size() / 400);
    for (size_t k = 0; k < v.size(); k += step) {
      double y = T + kPlotH - kPlotH * static_cast<double>(k + 1) / static_cast<double>(v.size());
      path += fmt("%.1f,", x_of(v[k])) + fmt("%.1f ", y);
    }
    path += fmt("%.1f,", x_of(v.back())) + fmt("%.1f", T);
    s.raw("<path d=\"" + path + "\" fill=\"none\" stroke-width=\"2\" stroke=\"" + kColors[i % 8] +
          "\"/>\n");
  }

  // Hit rate bars: label | track with the bar | value.
  s.text(panel_x, header1, kSize, "start", bars_title);
  const double bar_h = std::min(18.0, row_h * 0.6);
  for (size_t i = 0; i < n; ++i) {
    double mid = T + row_h * (static_cast<double>(i) + 0.5);
    s.text(bar_x - kGap, mid + kSize * 0.35, kSize, "end", labels[i]);
    s.rect("track", bar_x, mid - bar_h / 2, kBarW, bar_h, "#f0f0f0");
    if (rows[i].hit_rate > 0) {
      s.rect("bar", bar_x, mid - bar_h / 2, kBarW * std::min(1.0, rows[i].hit_rate), bar_h,
             kColors[i % 8]);
    }
    s.text(value_r, mid + kSize * 0.35, kSize, "end", pct(rows[i].hit_rate));
  }
  if (n && rows.front().upper_bound > 0) {
    // A dashed line through every row; its label in the header row just above the bars, kept
    // inside the panel.
    double x = bar_x + kBarW * std::min(1.0, rows.front().upper_bound);
    s.line(x, T - 2, x, T + bars_h, "stroke=\"#444\" stroke-dasharray=\"4 3\"");
    std::string ub = "upper bound " + pct(rows.front().upper_bound);
    double w = text_width(ub, kSize);
    double left = std::clamp(x - w / 2, panel_x, panel_r - w);
    s.text(left + w / 2, header2, kSize, "middle", ub);
  }

  // Legend.
  for (size_t i = 0; i < n; ++i) {
    double x = kMargin + col_w * static_cast<double>(i % cols);
    const size_t row = i / cols;  // whole rows
    double y = legend_top + 20 * static_cast<double>(row) + kSize;
    s.rect("swatch", x, y - kSize * 0.35 - 2, 16, 4, kColors[i % 8]);
    s.text(x + 22, y, kSize, "start", entries[i]);
  }
  return s.finish(W, H);
}

}  // namespace kvgate::bench
