// util/flags: the non-template half of the knob parser (argument splitting, number parsing).
#include "util/flags.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace kvgate::flags {
namespace {

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace

std::string closest_name(std::string_view name, std::span<const std::string_view> names) {
  std::string_view best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (auto n : names) {
    size_t d = edit_distance(name, n);
    if (d < best_d) {
      best_d = d;
      best = n;
    }
  }
  if (best_d <= std::max<size_t>(2, name.size() / 3)) return std::string(best);
  return "";
}

std::string parse_int(std::string_view text, int64_t& out) {
  int64_t v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || p != text.data() + text.size() || text.empty()) {
    return "'" + std::string(text) + "' is not an integer";
  }
  out = v;
  return "";
}

std::string parse_double(std::string_view text, double& out) {
  double v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || p != text.data() + text.size() || text.empty() || !std::isfinite(v)) {
    return "'" + std::string(text) + "' is not a number";
  }
  out = v;
  return "";
}

std::string parse_bool(std::string_view text, bool& out) {
  if (text == "true" || text == "1" || text == "on" || text == "yes") {
    out = true;
  } else if (text == "false" || text == "0" || text == "off" || text == "no") {
    out = false;
  } else {
    return "'" + std::string(text) + "' is not a boolean (use true or false)";
  }
  return "";
}

std::string format_number(double v) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    return std::to_string(static_cast<int64_t>(v));
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

std::string split_args(std::span<const KnobShape> shapes, std::span<const std::string> args,
                       std::string_view prefix, std::vector<Occurrence>& out,
                       std::vector<std::string>& positional, bool& help, bool& help_markdown) {
  auto find = [&](std::string_view name) -> std::optional<size_t> {
    for (size_t i = 0; i < shapes.size(); ++i) {
      if (shapes[i].name == name) return i;
    }
    if (!prefix.empty() && name.starts_with(prefix)) {
      name.remove_prefix(prefix.size());
      for (size_t i = 0; i < shapes.size(); ++i) {
        if (shapes[i].name == name) return i;
      }
    }
    return std::nullopt;
  };
  auto is_flag = [](const std::string& a) { return a.size() > 2 && a.starts_with("--"); };

  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "-h" || arg == "--help") {
      help = true;
      continue;
    }
    if (arg == "--help-markdown") {
      help_markdown = true;
      continue;
    }
    if (!is_flag(arg)) {
      if (arg.starts_with("-") && arg.size() > 1) {
        return "unknown option '" + arg + "' (options are spelled --name; see --help)";
      }
      positional.push_back(arg);
      continue;
    }
    std::string_view body(arg);
    body.remove_prefix(2);
    std::optional<std::string> inline_value;
    if (auto eq = body.find('='); eq != std::string_view::npos) {
      inline_value = std::string(body.substr(eq + 1));
      body = body.substr(0, eq);
    }
    // Accept snake_case spellings too (--worker_urls), as Python launchers often do.
    std::string name(body);
    std::replace(name.begin(), name.end(), '_', '-');
    auto idx = find(name);
    if (!idx) {
      std::vector<std::string_view> names;
      for (const auto& s : shapes) names.push_back(s.name);
      std::string hint = closest_name(name, names);
      std::string msg = "unknown flag '--" + name + "'";
      if (!hint.empty()) msg += "; did you mean '--" + hint + "'?";
      return msg + " (see --help for every flag)";
    }
    const KnobShape& s = shapes[*idx];
    Occurrence occ{*idx, "--" + std::string(s.name), {}};
    if (s.is_bool || (s.max_values == 0 && !s.is_list)) {
      if (inline_value) occ.values.push_back(*inline_value);
    } else if (inline_value) {
      occ.values.push_back(*inline_value);
    } else if (s.is_list && !s.append) {
      while (i + 1 < args.size() && !is_flag(args[i + 1])) occ.values.push_back(args[++i]);
    } else if (s.max_values > 1) {
      while (i + 1 < args.size() && !is_flag(args[i + 1]) &&
             static_cast<int>(occ.values.size()) < s.max_values) {
        occ.values.push_back(args[++i]);
      }
    } else {
      if (i + 1 >= args.size()) return occ.flag_as_written + " needs a value (see --help)";
      occ.values.push_back(args[++i]);
    }
    if (static_cast<int>(occ.values.size()) < s.min_values) {
      return occ.flag_as_written + " needs a value (see --help)";
    }
    out.push_back(std::move(occ));
  }
  return "";
}

}  // namespace kvgate::flags
