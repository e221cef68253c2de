// rules/doc: see doc.h.
#include "rules/doc.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/exceptions.h>
#include <yaml-cpp/mark.h>
#include <yaml-cpp/parser.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

namespace kvgate::rules {
namespace {

using Json = nlohmann::ordered_json;
using Kind = RuleDoc::Kind;

// JSON text of a string; bytes that are not UTF-8 become U+FFFD instead of throwing.
std::string json_quote(std::string_view s) {
  return Json(std::string(s)).dump(-1, ' ', false, Json::error_handler_t::replace);
}

// Thrown by the builders to stop a document that cannot be finished (too deep, too large).
struct StopParse {
  std::string message;
  int line;
};

// Builds a RuleDoc from parser events, for both parsers. Keys of a map come either through key()
// (JSON) or as the scalar events in key position (YAML).
class DocBuilder {
 public:
  DocBuilder(std::vector<FieldError>& errors, bool yaml) : errors_(errors), yaml_(yaml) {}

  RuleDoc& root() { return root_; }

  bool want_key() const { return !stack_.empty() && stack_.back().want_key; }

  void key(std::string k, int line) {
    Frame& f = stack_.back();
    f.key = std::move(k);
    f.key_line = line;
    f.want_key = false;
  }

  // Adds a finished value (a scalar, or an alias's copy) where the parser is.
  void value(RuleDoc v, uint64_t anchor = 0) {
    count(1);
    RuleDoc* at = place(std::move(v));
    if (anchor != 0) anchors_[anchor] = *at;
  }

  void open(Kind kind, int line, uint64_t anchor = 0) {
    if (stack_.size() >= kMaxDocDepth) {
      throw StopParse{"nested more than " + std::to_string(kMaxDocDepth) +
                          " levels deep; a rule or a config file needs only a few",
                      line};
    }
    count(1);
    RuleDoc d;
    d.kind = kind;
    d.line = line;
    RuleDoc* at = place(std::move(d));
    stack_.push_back({at, anchor, kind == Kind::kMap, {}, 0});
  }

  void close() {
    Frame f = std::move(stack_.back());
    stack_.pop_back();
    if (yaml_ && f.doc->kind == Kind::kMap) apply_merge_keys(*f.doc);
    if (f.anchor != 0) anchors_[f.anchor] = *f.doc;
  }

  void alias(uint64_t anchor, int line) {
    auto it = anchors_.find(anchor);
    if (it == anchors_.end()) throw StopParse{"an alias (*name) to an unknown anchor", line};
    count(nodes_in(it->second));
    RuleDoc copy = it->second;
    copy.line = line;
    if (want_key()) {
      if (!copy.is_scalar()) throw StopParse{"a key must be plain text, not a list or a map", line};
      key(copy.text, line);
      return;
    }
    place(std::move(copy));
  }

 private:
  struct Frame {
    RuleDoc* doc;
    uint64_t anchor;
    bool want_key;
    std::string key;
    int key_line;
  };

  static size_t nodes_in(const RuleDoc& d) {
    size_t n = 1;
    for (const auto& i : d.items) n += nodes_in(i);
    for (const auto& m : d.members) n += nodes_in(m.value);
    return n;
  }

  void count(size_t n) {
    nodes_ += n;
    if (nodes_ > kMaxDocNodes) {
      throw StopParse{"more than " + std::to_string(kMaxDocNodes) +
                          " values (aliases expanded); a config this large is a mistake",
                      0};
    }
  }

  RuleDoc* place(RuleDoc v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    Frame& f = stack_.back();
    if (f.doc->kind == Kind::kList) {
      f.doc->items.push_back(std::move(v));
      return &f.doc->items.back();
    }
    if (f.want_key) throw StopParse{"a key must be plain text, not a list or a map", v.line};
    if (!yaml_ || f.key != "<<") {
      for (const auto& m : f.doc->members) {
        if (m.key == f.key) {
          errors_.push_back({f.key, "",
                             "written twice in the same mapping (first at line " +
                                 std::to_string(m.line) + "); keep one",
                             f.key_line});
          break;
        }
      }
    }
    f.doc->members.push_back({std::move(f.key), f.key_line, std::move(v)});
    f.key.clear();
    f.want_key = true;
    return &f.doc->members.back().value;
  }

  // YAML merge keys: `<<: *defaults` (or a list of them) adds the members not written here.
  void apply_merge_keys(RuleDoc& map) {
    bool any = std::any_of(map.members.begin(), map.members.end(),
                           [](const RuleDoc::Member& m) { return m.key == "<<"; });
    if (!any) return;
    std::vector<RuleDoc::Member> own, merged;
    std::vector<const RuleDoc*> sources;
    for (auto& m : map.members) {
      if (m.key != "<<") {
        own.push_back(std::move(m));
        continue;
      }
      if (m.value.kind == Kind::kMap) {
        sources.push_back(&m.value);
      } else if (m.value.kind == Kind::kList &&
                 std::all_of(m.value.items.begin(), m.value.items.end(),
                             [](const RuleDoc& i) { return i.kind == Kind::kMap; })) {
        for (const auto& i : m.value.items) sources.push_back(&i);
      } else {
        errors_.push_back({"<<", m.value.brief(),
                           "a merge key takes a mapping (<<: *name) or a list of them", m.line});
      }
    }
    auto present = [&](const std::string& k) {
      auto has = [&](const RuleDoc::Member& m) { return m.key == k; };
      return std::any_of(own.begin(), own.end(), has) ||
             std::any_of(merged.begin(), merged.end(), has);
    };
    for (const RuleDoc* s : sources) {
      for (const auto& m : s->members) {
        if (!present(m.key)) merged.push_back(m);
      }
    }
    own.insert(own.end(), std::make_move_iterator(merged.begin()),
               std::make_move_iterator(merged.end()));
    map.members = std::move(own);
  }

  std::vector<FieldError>& errors_;
  bool yaml_;
  RuleDoc root_;
  std::vector<Frame> stack_;
  std::map<uint64_t, RuleDoc> anchors_;
  size_t nodes_ = 0;
};

// nlohmann's SAX interface onto the builder (JSON has no anchors; lines are not reported).
class JsonSax : public nlohmann::json_sax<nlohmann::json> {
 public:
  explicit JsonSax(DocBuilder& b) : b_(b) {}
  bool null() override { return scalar(RuleDoc{}); }
  bool boolean(bool v) override {
    RuleDoc d;
    d.kind = Kind::kBool;
    d.boolean = v;
    d.text = v ? "true" : "false";
    return scalar(std::move(d));
  }
  bool number_integer(number_integer_t v) override {
    RuleDoc d;
    d.kind = Kind::kInt;
    d.integer = v;
    d.number = static_cast<double>(v);
    d.text = std::to_string(v);
    return scalar(std::move(d));
  }
  bool number_unsigned(number_unsigned_t v) override {
    RuleDoc d;
    d.text = std::to_string(v);
    d.number = static_cast<double>(v);
    if (v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      d.kind = Kind::kInt;
      d.integer = static_cast<int64_t>(v);
    } else {
      d.kind = Kind::kDouble;
    }
    return scalar(std::move(d));
  }
  bool number_float(number_float_t v, const string_t& text) override {
    RuleDoc d;
    d.kind = Kind::kDouble;
    d.number = v;
    d.text = text;
    return scalar(std::move(d));
  }
  bool string(string_t& v) override {
    RuleDoc d;
    d.kind = Kind::kString;
    d.text = std::move(v);
    return scalar(std::move(d));
  }
  bool binary(binary_t&) override { return false; }
  bool start_object(std::size_t) override { return open(Kind::kMap); }
  bool key(string_t& k) override {
    b_.key(std::move(k), 0);
    return true;
  }
  bool end_object() override {
    b_.close();
    return true;
  }
  bool start_array(std::size_t) override { return open(Kind::kList); }
  bool end_array() override {
    b_.close();
    return true;
  }
  bool parse_error(std::size_t, const std::string&,
                   const nlohmann::detail::exception& ex) override {
    error = ex.what();
    // "[json.exception.parse_error.101] parse error at line 1, column 5: ..." -> "line 1, ...".
    if (auto at = error.find(" at line "); at != std::string::npos) error = error.substr(at + 4);
    return false;
  }

  std::string error;
  std::string stop;

 private:
  bool scalar(RuleDoc d) {
    try {
      b_.value(std::move(d));
    } catch (const StopParse& s) {
      stop = s.message;
      return false;
    }
    return true;
  }
  bool open(Kind k) {
    try {
      b_.open(k, 0);
    } catch (const StopParse& s) {
      stop = s.message;
      return false;
    }
    return true;
  }
  DocBuilder& b_;
};

bool all_of_class(std::string_view s, int (*pred)(int)) {
  return !s.empty() && std::all_of(s.begin(), s.end(),
                                   [&](char c) { return pred(static_cast<unsigned char>(c)); });
}

// A YAML scalar resolved as YAML 1.2's core schema does: null, bool, int, float, else a string.
RuleDoc yaml_scalar(const std::string& tag, const std::string& value, int line) {
  RuleDoc d;
  d.line = line;
  d.text = value;
  if (tag == "!" || tag.ends_with(":str")) {
    d.kind = Kind::kString;
    return d;
  }
  d.yaml_plain = tag == "?";
  d.kind = Kind::kString;
  std::string_view v = value;
  if (v.empty() || v == "~" || v == "null" || v == "Null" || v == "NULL") {
    d.kind = Kind::kNull;
    return d;
  }
  if (v == "true" || v == "True" || v == "TRUE" || v == "false" || v == "False" || v == "FALSE") {
    d.kind = Kind::kBool;
    d.boolean = v[0] == 't' || v[0] == 'T';
    return d;
  }
  std::string_view digits = v;
  if (digits.front() == '+' || digits.front() == '-') digits.remove_prefix(1);
  if (all_of_class(digits, ::isdigit)) {
    int64_t n = 0;
    std::string_view t = v.front() == '+' ? v.substr(1) : v;
    auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), n);
    if (ec == std::errc() && p == t.data() + t.size()) {
      d.kind = Kind::kInt;
      d.integer = n;
      d.number = static_cast<double>(n);
      return d;
    }
  }
  if (v.starts_with("0x") && all_of_class(v.substr(2), ::isxdigit)) {
    uint64_t n = 0;
    auto [p, ec] = std::from_chars(v.data() + 2, v.data() + v.size(), n, 16);
    if (ec == std::errc() && p == v.data() + v.size() &&
        n <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      d.kind = Kind::kInt;
      d.integer = static_cast<int64_t>(n);
      d.number = static_cast<double>(n);
      return d;
    }
  }
  std::string_view inf = digits;
  if (inf == ".inf" || inf == ".Inf" || inf == ".INF") {
    d.kind = Kind::kDouble;
    d.number = v.front() == '-' ? -std::numeric_limits<double>::infinity()
                                : std::numeric_limits<double>::infinity();
    return d;
  }
  if (v == ".nan" || v == ".NaN" || v == ".NAN") {
    d.kind = Kind::kDouble;
    d.number = std::numeric_limits<double>::quiet_NaN();
    return d;
  }
  // [-+]? ( \. [0-9]+ | [0-9]+ ( \. [0-9]* )? ) ( [eE] [-+]? [0-9]+ )?
  bool number_chars = std::all_of(v.begin(), v.end(), [](char c) {
    return std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == 'e' || c == 'E' ||
           c == '+' || c == '-';
  });
  if (number_chars && std::any_of(digits.begin(), digits.end(), [](char c) {
        return std::isdigit(static_cast<unsigned char>(c));
      })) {
    double x = 0;
    std::string_view t = v.front() == '+' ? v.substr(1) : v;
    auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), x);
    if (ec == std::errc() && p == t.data() + t.size()) {
      d.kind = Kind::kDouble;
      d.number = x;
      return d;
    }
  }
  return d;
}

class YamlEvents : public YAML::EventHandler {
 public:
  explicit YamlEvents(DocBuilder& b) : b_(b) {}
  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    if (b_.want_key()) {
      b_.key("", mark.line + 1);
      return;
    }
    RuleDoc d;
    d.line = mark.line + 1;
    d.yaml_plain = true;
    b_.value(std::move(d), anchor);
  }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    b_.alias(anchor, mark.line + 1);
  }
  void OnScalar(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t anchor,
                const std::string& value) override {
    if (b_.want_key()) {
      b_.key(value, mark.line + 1);
      return;
    }
    b_.value(yaml_scalar(tag, value, mark.line + 1), anchor);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                       YAML::EmitterStyle::value) override {
    b_.open(Kind::kList, mark.line + 1, anchor);
  }
  void OnSequenceEnd() override { b_.close(); }
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                  YAML::EmitterStyle::value) override {
    b_.open(Kind::kMap, mark.line + 1, anchor);
  }
  void OnMapEnd() override { b_.close(); }

 private:
  DocBuilder& b_;
};

std::string_view kind_text(Kind k) {
  switch (k) {
    case Kind::kNull:
      return "null";
    case Kind::kBool:
      return "a boolean";
    case Kind::kInt:
      return "an integer";
    case Kind::kDouble:
      return "a number";
    case Kind::kString:
      return "a string";
    case Kind::kList:
      return "a list";
    case Kind::kMap:
      return "a mapping";
  }
  return "a value";
}

void type_error(const RuleDoc& v, const std::string& field, std::string_view expected,
                std::string_view hint, std::vector<FieldError>& errors) {
  std::string msg = "expected " + std::string(expected) + ", got " + std::string(v.kind_name());
  if (!hint.empty()) msg.append("; ").append(hint);
  errors.push_back({field, v.brief(), msg, v.line});
}

}  // namespace

const RuleDoc* RuleDoc::find(std::string_view key) const {
  for (const auto& m : members) {
    if (m.key == key) return &m.value;
  }
  return nullptr;
}

std::string_view RuleDoc::kind_name() const {
  return kind_text(kind);
}

std::string RuleDoc::brief() const {
  switch (kind) {
    case Kind::kNull:
      return "null";
    case Kind::kList:
      return "[...]";
    case Kind::kMap:
      return "{...}";
    case Kind::kString: {
      constexpr size_t kMax = 80;
      return text.size() > kMax ? json_quote(text.substr(0, kMax)) + "..." : json_quote(text);
    }
    default:
      return text.size() > 40 ? text.substr(0, 40) + "..." : text;
  }
}

bool parse_json_doc(std::string_view text, RuleDoc& out, std::vector<FieldError>& errors) {
  DocBuilder b(errors, false);
  JsonSax sax(b);
  bool ok = nlohmann::json::sax_parse(text.begin(), text.end(), &sax);
  if (!ok) {
    if (!sax.stop.empty()) {
      errors.push_back({"", "", sax.stop, 0});
    } else {
      errors.push_back({"", "", "not valid JSON: " + sax.error, 0});
    }
    return false;
  }
  out = std::move(b.root());
  return true;
}

bool parse_yaml_doc(std::string_view text, RuleDoc& out, std::vector<FieldError>& errors) {
  std::istringstream in{std::string(text)};
  DocBuilder b(errors, true);
  YamlEvents events(b);
  try {
    YAML::Parser parser(in);
    if (parser.HandleNextDocument(events)) {
      if (parser.HandleNextDocument(events)) {
        errors.push_back({"", "", "more than one YAML document (---); keep one per file", 0});
        return false;
      }
    }
  } catch (const StopParse& s) {
    errors.push_back({"", "", s.message, s.line});
    return false;
  } catch (const YAML::Exception& e) {
    errors.push_back({"", "", "not valid YAML: " + e.msg, e.mark.is_null() ? 0 : e.mark.line + 1});
    return false;
  }
  out = std::move(b.root());
  return true;
}

int line_of(const RuleDoc& doc, std::string_view path) {
  const RuleDoc* at = &doc;
  int line = doc.line;
  while (!path.empty()) {
    if (path.front() == '.') path.remove_prefix(1);
    if (path.front() == '[') {
      auto close = path.find(']');
      if (close == std::string_view::npos) break;
      size_t index = 0;
      auto digits = path.substr(1, close - 1);
      auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
      path.remove_prefix(close + 1);
      if (ec != std::errc() || at->kind != Kind::kList || index >= at->items.size()) break;
      at = &at->items[index];
      if (at->line) line = at->line;
      continue;
    }
    size_t end = path.find_first_of(".[");
    std::string_view key = path.substr(0, end);
    path.remove_prefix(end == std::string_view::npos ? path.size() : end);
    if (at->kind != Kind::kMap) break;
    const RuleDoc::Member* found = nullptr;
    for (const auto& m : at->members) {
      if (m.key == key) found = &m;
    }
    if (!found) break;
    if (found->line) line = found->line;
    at = &found->value;
  }
  return line;
}

bool want_int(const RuleDoc& v, const std::string& field, int64_t& out,
              std::vector<FieldError>& errors) {
  if (v.kind == Kind::kInt) {
    out = v.integer;
    return true;
  }
  std::string hint;
  if (v.kind == Kind::kString) {
    int64_t n = 0;
    if (flags::parse_int(v.text, n).empty()) hint = "write it without quotes";
  } else if (v.kind == Kind::kDouble) {
    hint = std::isfinite(v.number) && std::fabs(v.number) > 9e18 ? "it is too large"
                                                                 : "write a whole number";
  }
  type_error(v, field, "an integer", hint, errors);
  return false;
}

bool want_number(const RuleDoc& v, const std::string& field, double& out,
                 std::vector<FieldError>& errors) {
  if ((v.kind == Kind::kInt || v.kind == Kind::kDouble) && std::isfinite(v.number)) {
    out = v.number;
    return true;
  }
  if (v.kind == Kind::kDouble) {
    errors.push_back({field, v.brief(), "must be a finite number", v.line});
    return false;
  }
  std::string hint;
  if (v.kind == Kind::kString) {
    double n = 0;
    if (flags::parse_double(v.text, n).empty()) hint = "write it without quotes";
  }
  type_error(v, field, "a number", hint, errors);
  return false;
}

bool want_bool(const RuleDoc& v, const std::string& field, bool& out,
               std::vector<FieldError>& errors) {
  if (v.kind == Kind::kBool) {
    out = v.boolean;
    return true;
  }
  // YAML 1.1 spellings (yes, on, ...) in an unquoted scalar, as the command line takes them.
  if (v.yaml_plain && v.is_scalar() && flags::parse_bool(v.text, out).empty()) return true;
  type_error(v, field, "a boolean", "write true or false", errors);
  return false;
}

bool want_string(const RuleDoc& v, const std::string& field, std::string& out,
                 std::vector<FieldError>& errors) {
  if (v.kind == Kind::kString || (v.yaml_plain && v.is_scalar() && v.kind != Kind::kNull)) {
    out = v.text;
    return true;
  }
  type_error(v, field, "a string", v.is_scalar() ? "put it in quotes" : "", errors);
  return false;
}

bool want_string_list(const RuleDoc& v, const std::string& field, std::vector<std::string>& out,
                      std::vector<FieldError>& errors, bool single_ok) {
  if (single_ok && v.is_scalar() && v.kind != Kind::kNull) {
    std::string s;
    if (!want_string(v, field, s, errors)) return false;
    out = {s};
    return true;
  }
  if (v.kind != Kind::kList) {
    type_error(v, field, "a list of strings",
               v.kind == Kind::kString ? "write [" + v.brief() + "]" : "", errors);
    return false;
  }
  std::vector<std::string> items;
  bool ok = true;
  for (size_t i = 0; i < v.items.size(); ++i) {
    std::string s;
    if (want_string(v.items[i], field + "[" + std::to_string(i) + "]", s, errors)) {
      items.push_back(std::move(s));
    } else {
      ok = false;
    }
  }
  if (ok) out = std::move(items);
  return ok;
}

bool set_knob(const flags::Knob<GatewayConfig>& k, GatewayConfig& c, const RuleDoc& v,
              const std::string& field, std::vector<FieldError>& errors) {
  if (!k.unsupported_reason.empty()) {
    errors.push_back(
        {field, "", "not supported by kvgate: " + std::string(k.unsupported_reason), v.line});
    return false;
  }
  if (v.kind == Kind::kNull) return true;  // null: the default
  if (k.custom) {
    auto run = [&](const std::vector<std::string>& values, const RuleDoc& at) {
      if (static_cast<int>(values.size()) < k.custom_min_values ||
          static_cast<int>(values.size()) > k.custom_max_values) {
        errors.push_back({field, at.brief(),
                          "takes " + std::to_string(k.custom_min_values) + " to " +
                              std::to_string(k.custom_max_values) + " values (" +
                              std::string(k.value_name) + ")",
                          at.line});
        return false;
      }
      if (std::string e = k.custom(c, values); !e.empty()) {
        errors.push_back({field, at.brief(), e, at.line});
        return false;
      }
      return true;
    };
    auto texts = [&](const RuleDoc& item, std::vector<std::string>& out) {
      if (item.is_scalar()) {
        out.push_back(item.kind == Kind::kNull ? "none" : item.text);
        return true;
      }
      if (item.kind != Kind::kList) return false;
      for (const auto& x : item.items) {
        if (!x.is_scalar()) return false;
        out.push_back(x.kind == Kind::kNull ? "none" : x.text);
      }
      return true;
    };
    if (v.kind == Kind::kList && v.items.empty()) return true;  // []: the default (none)
    if (k.name == "prefill") {
      // One item per server: "URL" or [URL, PORT|none].
      if (v.kind != Kind::kList) {
        type_error(v, field, "a list of servers", "write [URL, [URL, PORT], ...]", errors);
        return false;
      }
      c.prefill.clear();
      bool ok = true;
      for (const auto& item : v.items) {
        std::vector<std::string> values;
        if (!texts(item, values)) {
          type_error(item, field, "URL or [URL, PORT]", "", errors);
          ok = false;
          continue;
        }
        ok = run(values, item) && ok;
      }
      return ok;
    }
    std::vector<std::string> values;
    if (!texts(v, values)) {
      type_error(v, field, "a list of values", "", errors);
      return false;
    }
    return run(values, v);
  }
  return std::visit(
      [&](auto member) -> bool {
        using M = decltype(member);
        if constexpr (std::is_same_v<M, std::monostate>) {
          return true;
        } else {
          auto& dst = c.*member;
          using V = std::decay_t<decltype(dst)>;
          if constexpr (std::is_same_v<V, bool>) {
            return want_bool(v, field, dst, errors);
          } else if constexpr (std::is_same_v<V, int64_t>) {
            return want_int(v, field, dst, errors);
          } else if constexpr (std::is_same_v<V, double>) {
            return want_number(v, field, dst, errors);
          } else if constexpr (std::is_same_v<V, std::string>) {
            return want_string(v, field, dst, errors);
          } else {
            return want_string_list(v, field, dst, errors, true);
          }
        }
      },
      k.field);
}

void check_knob(const flags::Knob<GatewayConfig>& k, const GatewayConfig& c,
                const std::string& field, std::vector<FieldError>& errors, int line) {
  auto range = [&](double x, const std::string& text) {
    if (x >= k.min && x <= k.max) return;
    std::string r;
    if (k.max == std::numeric_limits<double>::infinity()) {
      r = ">= " + flags::format_number(k.min);
    } else if (k.min == -std::numeric_limits<double>::infinity()) {
      r = "<= " + flags::format_number(k.max);
    } else {
      r = "between " + flags::format_number(k.min) + " and " + flags::format_number(k.max);
    }
    errors.push_back({field, text, "out of range: it must be " + r, line});
  };
  static const GatewayConfig kDefaults{};
  auto choice = [&](const std::string& v, const std::string& def) {
    if (k.choices.empty() || v == def) return;
    std::string list;
    for (auto ch : k.choices) {
      if (ch == v) return;
      list.append(list.empty() ? "" : ", ").append(ch);
    }
    errors.push_back({field, json_quote(v), "not a valid value; choose one of: " + list, line});
  };
  std::visit(
      [&](auto member) {
        using M = decltype(member);
        if constexpr (!std::is_same_v<M, std::monostate>) {
          const auto& v = c.*member;
          using V = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<V, int64_t>) {
            range(static_cast<double>(v), std::to_string(v));
          } else if constexpr (std::is_same_v<V, double>) {
            range(v, flags::format_number(v));
          } else if constexpr (std::is_same_v<V, std::string>) {
            choice(v, kDefaults.*member);
          } else if constexpr (std::is_same_v<V, std::vector<std::string>>) {
            for (const auto& s : v) choice(s, "");
          }
        }
      },
      k.field);
}

std::string knob_json(const flags::Knob<GatewayConfig>& k, const GatewayConfig& c) {
  if (k.name == "prefill") {
    Json list = Json::array();
    for (const auto& p : c.prefill) {
      list.push_back(
          Json::array({p.url, p.bootstrap_port ? Json(*p.bootstrap_port) : Json(nullptr)}));
    }
    return list.dump(-1, ' ', false, Json::error_handler_t::replace);
  }
  if (k.name == "prometheus-duration-buckets" || k.name == "prometheus-short-duration-buckets") {
    const auto& bounds = k.name == "prometheus-duration-buckets"
                             ? c.prometheus_duration_buckets
                             : c.prometheus_short_duration_buckets;
    std::string out = "[";
    for (size_t i = 0; i < bounds.size(); ++i) {
      double x = 0;
      flags::parse_double(bounds[i], x);
      out.append(i ? ", " : "").append(Json(x).dump());
    }
    return out + "]";
  }
  return std::visit(
      [&](auto member) -> std::string {
        using M = decltype(member);
        if constexpr (std::is_same_v<M, std::monostate>) {
          return "null";
        } else {
          return Json(c.*member).dump(-1, ' ', false, Json::error_handler_t::replace);
        }
      },
      k.field);
}

std::string camel_case(std::string_view kebab) {
  std::string out;
  bool up = false;
  for (char ch : kebab) {
    if (ch == '-' || ch == '_') {
      up = true;
      continue;
    }
    out.push_back(up ? static_cast<char>(std::toupper(static_cast<unsigned char>(ch))) : ch);
    up = false;
  }
  return out;
}

std::string loose_name(std::string_view name) {
  std::string out;
  for (char ch : name) {
    if (std::isalnum(static_cast<unsigned char>(ch))) {
      out.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(ch))));
    }
  }
  return out;
}

std::string suggestion(std::string_view name, const std::vector<std::string_view>& names) {
  std::string loose = loose_name(name);
  for (auto n : names) {
    if (loose_name(n) == loose) return " did you mean '" + std::string(n) + "'?";
  }
  std::string best = flags::closest_name(name, names);
  return best.empty() ? "" : " did you mean '" + best + "'?";
}

}  // namespace kvgate::rules
