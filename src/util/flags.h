// util/flags: one table of knobs (name, group, default, range, help) drives the command line
// parser, validation, `--help` and the generated configuration reference. A binary declares
// `std::vector<Knob<Config>>` once; parse() fills a Config from argv with errors that name the
// flag, the value and the fix.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace kvgate::flags {

// How many values a flag takes after its name.
enum class Arity {
  kDefault,  // bool: none (or =true/=false); list: 1..n up to the next --flag; others: exactly one
  kAppend,   // list: exactly one per occurrence, the flag may repeat (--decode URL --decode URL)
};

template <class C>
struct Knob {
  using Field = std::variant<std::monostate, bool C::*, int64_t C::*, double C::*, std::string C::*,
                             std::vector<std::string> C::*>;
  // Custom handler for one occurrence: gets the raw values, returns an error message or "".
  using Custom = std::function<std::string(C&, std::span<const std::string>)>;

  std::string_view name;        // without dashes: "cache-threshold"
  std::string_view group;       // help heading
  std::string_view value_name;  // "N", "URL", "SECS"; empty for booleans
  std::string_view help;
  Field field;
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
  std::vector<std::string_view> choices;
  Arity arity = Arity::kDefault;
  Custom custom;
  int custom_min_values = 1;  // for custom: how many values it may take
  int custom_max_values = 1;
  std::string_view default_text{};  // shown in help when the field's default is not enough
  // A flag of sgl-model-gateway that kvgate does not implement: using it is an error naming why.
  std::string_view unsupported_reason{};
};

struct ParseOutcome {
  bool ok = true;
  bool help = false;
  bool help_markdown = false;
  std::string error;             // when !ok
  std::vector<std::string> set;  // knob names given on the command line
  std::vector<std::string> positional;
};

// Raw parse (non-template part): splits argv into occurrences of known flags.
struct Occurrence {
  size_t knob;
  std::string flag_as_written;
  std::vector<std::string> values;
};
struct KnobShape {
  std::string_view name;
  bool is_bool = false;
  bool is_list = false;
  bool append = false;
  int min_values = 1;
  int max_values = 1;
};
// Returns "" or an error. `prefix` is an optional alias prefix ("router-"): --router-policy ==
// --policy.
std::string split_args(std::span<const KnobShape> shapes, std::span<const std::string> args,
                       std::string_view prefix, std::vector<Occurrence>& out,
                       std::vector<std::string>& positional, bool& help, bool& help_markdown);

std::string parse_int(std::string_view text, int64_t& out);
std::string parse_double(std::string_view text, double& out);
std::string parse_bool(std::string_view text, bool& out);
std::string format_number(double v);
std::string closest_name(std::string_view name, std::span<const std::string_view> names);

template <class C>
std::vector<KnobShape> shapes_of(std::span<const Knob<C>> knobs) {
  std::vector<KnobShape> shapes;
  shapes.reserve(knobs.size());
  for (const auto& k : knobs) {
    KnobShape s;
    s.name = k.name;
    if (k.custom) {
      s.min_values = k.custom_min_values;
      s.max_values = k.custom_max_values;
    } else if (std::holds_alternative<bool C::*>(k.field)) {
      s.is_bool = true;
      s.min_values = 0;
    } else if (std::holds_alternative<std::vector<std::string> C::*>(k.field)) {
      s.is_list = true;
      s.append = k.arity == Arity::kAppend;
      s.max_values = s.append ? 1 : std::numeric_limits<int>::max();
      s.min_values = s.append ? 1 : 0;
    }
    shapes.push_back(s);
  }
  return shapes;
}

// Text of the default value of knob `k` in a default-constructed config.
template <class C>
std::string default_text(const Knob<C>& k, const C& defaults) {
  if (!k.default_text.empty()) return std::string(k.default_text);
  return std::visit(
      [&](auto member) -> std::string {
        using M = decltype(member);
        if constexpr (std::is_same_v<M, std::monostate>) {
          return "";
        } else {
          const auto& v = defaults.*member;
          using V = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<V, bool>)
            return v ? "on" : "off";
          else if constexpr (std::is_same_v<V, int64_t>)
            return std::to_string(v);
          else if constexpr (std::is_same_v<V, double>)
            return format_number(v);
          else if constexpr (std::is_same_v<V, std::string>)
            return v.empty() ? "" : v;
          else
            return "";
        }
      },
      k.field);
}

template <class C>
std::string check_range(const Knob<C>& k, const std::string& flag, double v) {
  if (v < k.min || v > k.max) {
    std::string range;
    if (k.max == std::numeric_limits<double>::infinity()) {
      range = ">= " + format_number(k.min);
    } else if (k.min == -std::numeric_limits<double>::infinity()) {
      range = "<= " + format_number(k.max);
    } else {
      range = "between " + format_number(k.min) + " and " + format_number(k.max);
    }
    return flag + ": " + format_number(v) + " is out of range; it must be " + range;
  }
  return "";
}

template <class C>
std::string assign(const Knob<C>& k, C& cfg, const Occurrence& occ) {
  const std::string& flag = occ.flag_as_written;
  if (!k.unsupported_reason.empty()) {
    return flag + " is not supported by kvgate: " + std::string(k.unsupported_reason);
  }
  if (k.custom) {
    std::string err = k.custom(cfg, occ.values);
    return err.empty() ? err : flag + ": " + err;
  }
  auto check_choice = [&](const std::string& v) -> std::string {
    if (k.choices.empty()) return "";
    std::string list;
    for (auto c : k.choices) {
      if (c == v) return "";
      if (!list.empty()) list += ", ";
      list += c;
    }
    return flag + ": '" + v + "' is not a valid value; choose one of: " + list;
  };
  return std::visit(
      [&](auto member) -> std::string {
        using M = decltype(member);
        if constexpr (std::is_same_v<M, std::monostate>) {
          return "";
        } else {
          auto& field = cfg.*member;
          using V = std::decay_t<decltype(field)>;
          if constexpr (std::is_same_v<V, bool>) {
            if (occ.values.empty()) {
              field = true;
              return "";
            }
            std::string e = parse_bool(occ.values[0], field);
            return e.empty() ? e : flag + ": " + e;
          } else if constexpr (std::is_same_v<V, int64_t>) {
            int64_t v = 0;
            if (std::string e = parse_int(occ.values[0], v); !e.empty()) return flag + ": " + e;
            if (std::string e = check_range(k, flag, static_cast<double>(v)); !e.empty()) return e;
            field = v;
            return "";
          } else if constexpr (std::is_same_v<V, double>) {
            double v = 0;
            if (std::string e = parse_double(occ.values[0], v); !e.empty()) return flag + ": " + e;
            if (std::string e = check_range(k, flag, v); !e.empty()) return e;
            field = v;
            return "";
          } else if constexpr (std::is_same_v<V, std::string>) {
            if (std::string e = check_choice(occ.values[0]); !e.empty()) return e;
            field = occ.values[0];
            return "";
          } else {
            if (k.arity == Arity::kAppend) {
              field.push_back(occ.values[0]);
            } else {
              field = occ.values;
            }
            for (const auto& v : occ.values) {
              if (std::string e = check_choice(v); !e.empty()) return e;
            }
            return "";
          }
        }
      },
      k.field);
}

// Parses args (argv without argv[0]) into cfg. Lists given with kAppend start empty on first use.
template <class C>
ParseOutcome parse(std::span<const Knob<C>> knobs, std::span<const std::string> args, C& cfg,
                   std::string_view prefix = "router-") {
  ParseOutcome out;
  auto shapes = shapes_of(knobs);
  std::vector<Occurrence> occs;
  out.error = split_args(shapes, args, prefix, occs, out.positional, out.help, out.help_markdown);
  if (!out.error.empty()) {
    out.ok = false;
    return out;
  }
  if (out.help || out.help_markdown) return out;
  std::vector<bool> cleared(knobs.size(), false);
  for (const auto& occ : occs) {
    const auto& k = knobs[occ.knob];
    if (k.arity == Arity::kAppend && !cleared[occ.knob]) {
      if (auto* p = std::get_if<std::vector<std::string> C::*>(&k.field)) (cfg.**p).clear();
      cleared[occ.knob] = true;
    }
    if (std::string e = assign(k, cfg, occ); !e.empty()) {
      out.ok = false;
      out.error = e;
      return out;
    }
    out.set.emplace_back(k.name);
  }
  return out;
}

// `--help` text: usage, intro, then every knob grouped under its heading in table order.
template <class C>
std::string help(std::span<const Knob<C>> knobs, std::string_view usage, std::string_view intro,
                 std::string_view outro = "") {
  C defaults{};
  std::string out;
  out.append("Usage: ").append(usage).append("\n\n").append(intro).append("\n");
  std::string_view group;
  for (const auto& k : knobs) {
    if (!k.unsupported_reason.empty()) continue;
    if (k.group != group) {
      group = k.group;
      out.append("\n").append(group).append(":\n");
    }
    std::string left = "  --" + std::string(k.name);
    if (!k.value_name.empty()) left.append(" ").append(k.value_name);
    out.append(left);
    size_t col = 34;
    if (left.size() + 2 > col) {
      out.append("\n").append(col, ' ');
    } else {
      out.append(col - left.size(), ' ');
    }
    out.append(k.help);
    std::string def = default_text(k, defaults);
    if (!def.empty() && def != "off") out.append(" [default: ").append(def).append("]");
    if (!k.choices.empty()) {
      out.append(" (");
      for (size_t i = 0; i < k.choices.size(); ++i) {
        if (i) out.append(", ");
        out.append(k.choices[i]);
      }
      out.append(")");
    }
    out.append("\n");
  }
  out.append("\n  -h, --help                      Show this help and exit\n");
  if (!outro.empty()) out.append("\n").append(outro).append("\n");
  return out;
}

// The same table as Markdown, for docs/configuration.md.
template <class C>
std::string markdown(std::span<const Knob<C>> knobs) {
  C defaults{};
  std::string out;
  std::string_view group;
  for (const auto& k : knobs) {
    if (!k.unsupported_reason.empty()) continue;
    if (k.group != group) {
      group = k.group;
      out.append("\n### ").append(group).append(
          "\n\n| Flag | Default | Meaning |\n|---|---|---|\n");
    }
    out.append("| `--").append(k.name);
    if (!k.value_name.empty()) out.append(" ").append(k.value_name);
    std::string def = default_text(k, defaults);
    out.append("` | ").append(def.empty() ? "-" : def).append(" | ").append(k.help);
    if (!k.choices.empty()) {
      out.append(" (");
      for (size_t i = 0; i < k.choices.size(); ++i) {
        if (i) out.append(", ");
        out.append("`").append(k.choices[i]).append("`");
      }
      out.append(")");
    }
    out.append(" |\n");
  }
  std::string unsupported;
  for (const auto& k : knobs) {
    if (k.unsupported_reason.empty()) continue;
    unsupported.append("| `--")
        .append(k.name)
        .append("` | ")
        .append(k.unsupported_reason)
        .append(" |\n");
  }
  if (!unsupported.empty()) {
    out.append("\n### sgl-model-gateway flags kvgate refuses\n\n| Flag | Why |\n|---|---|\n");
    out.append(unsupported);
  }
  return out;
}

}  // namespace kvgate::flags
