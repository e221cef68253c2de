// tokenizer/jinja_eval: the interpreter. Python/jinja2 semantics: truthiness, str(), ==, <, +,
// attribute-then-item lookup (item-then-attribute for subscripts), undefined values that render
// empty and fail on use, per-iteration loop scopes, namespaces, macros, and the filters, tests,
// globals and methods below (transformers' tojson, raise_exception and strftime_now included).
#include <unicode/uchar.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ctime>
#include <functional>

#include "tokenizer/jinja.h"
#include "tokenizer/jinja_internal.h"
#include "tokenizer/unicode.h"

namespace kvgate::tokenizer::jinja {

// ---- name tables (ids are indices) ----

namespace {

enum Filter : int {
  fAbs,
  fAttr,
  fCapitalize,
  fCenter,
  fCount,
  fD,
  fDefault,
  fDictsort,
  fE,
  fEscape,
  fFirst,
  fFloat,
  fForceescape,
  fFormat,
  fIndent,
  fInt,
  fItems,
  fJoin,
  fLast,
  fLength,
  fList,
  fLower,
  fMap,
  fMax,
  fMin,
  fReject,
  fRejectattr,
  fReplace,
  fReverse,
  fRound,
  fSafe,
  fSelect,
  fSelectattr,
  fSort,
  fString,
  fSum,
  fTitle,
  fTojson,
  fTrim,
  fUnique,
  fUpper,
  fWordcount,
};
const std::vector<std::string_view> kFilterNames = {
    "abs",      "attr",  "capitalize", "center", "count",      "d",           "default",
    "dictsort", "e",     "escape",     "first",  "float",      "forceescape", "format",
    "indent",   "int",   "items",      "join",   "last",       "length",      "list",
    "lower",    "map",   "max",        "min",    "reject",     "rejectattr",  "replace",
    "reverse",  "round", "safe",       "select", "selectattr", "sort",        "string",
    "sum",      "title", "tojson",     "trim",   "unique",     "upper",       "wordcount"};

enum Test : int {
  tBoolean,
  tCallable,
  tDefined,
  tDivisibleby,
  tEq,
  tEqualto,
  tEscaped,
  tEven,
  tFalse,
  tFloat,
  tGe,
  tGt,
  tIn,
  tInteger,
  tIterable,
  tLe,
  tLower,
  tLt,
  tMapping,
  tNe,
  tNone,
  tNumber,
  tOdd,
  tSameas,
  tSequence,
  tString,
  tTrue,
  tUndefined,
  tUpper,
  tGreaterthan,
  tLessthan,
};
const std::vector<std::string_view> kTestNames = {
    "boolean",  "callable", "defined", "divisibleby", "eq",    "equalto",     "escaped",  "even",
    "false",    "float",    "ge",      "gt",          "in",    "integer",     "iterable", "le",
    "lower",    "lt",       "mapping", "ne",          "none",  "number",      "odd",      "sameas",
    "sequence", "string",   "true",    "undefined",   "upper", "greaterthan", "lessthan"};

const std::vector<std::string_view> kStrMethods = {
    "strip",     "lstrip",     "rstrip",  "split",   "rsplit",  "splitlines",   "startswith",
    "endswith",  "replace",    "upper",   "lower",   "title",   "capitalize",   "swapcase",
    "find",      "rfind",      "index",   "rindex",  "count",   "join",         "format",
    "isdigit",   "isalpha",    "isalnum", "isspace", "isupper", "islower",      "isnumeric",
    "isdecimal", "zfill",      "center",  "ljust",   "rjust",   "removeprefix", "removesuffix",
    "partition", "rpartition", "casefold"};
const std::vector<std::string_view> kDictMethods = {"items", "keys", "values", "get", "copy"};
const std::vector<std::string_view> kListMethods = {"index", "count", "copy"};
// Mutating methods: present in Python, refused by the immutable sandbox at call time.
const std::vector<std::string_view> kUnsafeMethods = {
    "append",  "extend", "insert",     "pop",     "remove", "clear",  "sort",
    "reverse", "update", "setdefault", "popitem", "add",    "discard"};
const std::vector<std::string_view> kLoopMethods = {"cycle", "changed"};

bool in_list(const std::vector<std::string_view>& l, std::string_view n) {
  return find_name(l, n) >= 0;
}

}  // namespace

const std::vector<std::string_view>& filter_names() {
  return kFilterNames;
}
const std::vector<std::string_view>& test_names() {
  return kTestNames;
}
int method_mask(std::string_view name) {
  return (in_list(kDictMethods, name) ? kMethodDict : 0) |
         (in_list(kStrMethods, name) ? kMethodStr : 0) |
         (in_list(kListMethods, name) ? kMethodList : 0) |
         (in_list(kUnsafeMethods, name) ? kMethodUnsafe : 0) |
         (in_list(kLoopMethods, name) ? kMethodLoop : 0);
}
bool is_known_method(std::string_view name) {
  return method_mask(name) != 0;
}

namespace {

[[noreturn]] void raise(std::string msg) {
  throw RenderError{std::move(msg)};
}

// ---- runtime cells ----

struct Scope {
  Scope* parent = nullptr;
  std::vector<std::pair<uint32_t, Value>> vars;
  const Value* find(uint32_t sym) const {
    for (const auto& [s, v] : vars) {
      if (s == sym) return &v;
    }
    return nullptr;
  }
  void set(uint32_t sym, Value v) {
    for (auto& [s, x] : vars) {
      if (s == sym) {
        x = std::move(v);
        return;
      }
    }
    vars.emplace_back(sym, std::move(v));
  }
};

struct LoopCell : HeapCell {
  int64_t index0 = 0;
  int64_t length = 0;
  Value items;  // the iterated array (for previtem / nextitem)
};

enum class Builtin : uint8_t { kRange, kNamespace, kDict, kRaise, kStrftime };
struct CallableCell : HeapCell {
  enum class Kind : uint8_t { kBuiltin, kMacro, kMethod } kind = Kind::kBuiltin;
  Builtin builtin = Builtin::kRange;
  const Node* macro = nullptr;
  Scope* closure = nullptr;
  Value self;
  std::string method;
};

Value make_callable(CallableCell* c) {
  return Value(Value::Type::kCallable, c);
}

const char* type_name(const Value& v) {
  switch (v.type()) {
    case Value::Type::kUndefined:
      return "Undefined";
    case Value::Type::kNone:
      return "NoneType";
    case Value::Type::kBool:
      return "bool";
    case Value::Type::kInt:
      return "int";
    case Value::Type::kFloat:
      return "float";
    case Value::Type::kString:
      return "str";
    case Value::Type::kArray:
      return v.is_tuple() ? "tuple" : "list";
    case Value::Type::kObject:
      return v.is_namespace() ? "Namespace" : "dict";
    case Value::Type::kCallable:
      return "function";
    case Value::Type::kLoop:
      return "LoopContext";
  }
  return "object";
}

[[noreturn]] void raise_undefined(const Value& v) {
  raise(v.undefined_message());
}

Value undefined_attr(const Value& obj, std::string_view name) {
  return Value::undefined_attribute(type_name(obj), name);
}

// ---- Python helpers ----

bool is_int_like(const Value& v) {
  return v.is_int() || v.is_bool();
}
int64_t int_of(const Value& v) {
  return v.is_bool() ? (v.as_bool() ? 1 : 0) : v.as_int();
}
bool is_num_like(const Value& v) {
  return v.is_number() || v.is_bool();
}
double num_of(const Value& v) {
  return v.is_float() ? v.as_float() : static_cast<double>(int_of(v));
}

[[noreturn]] void too_deep_to_compare() {
  raise("value nested too deeply to compare (more than " + std::to_string(kMaxValueDepth) +
        " levels)");
}

// `depth` (here and in py_cmp): how many containers hold a and b.
bool py_eq(const Value& a, const Value& b, int depth = 0);

bool obj_eq(const Object& a, const Object& b, int depth) {
  if (a.items.size() != b.items.size()) return false;
  for (const auto& [k, v] : a.items) {
    const Value* o = b.find(k);
    if (!o || !py_eq(v, *o, depth + 1)) return false;
  }
  return true;
}

bool py_eq(const Value& a, const Value& b, int depth) {
  if (is_num_like(a) && is_num_like(b)) {
    if (is_int_like(a) && is_int_like(b)) return int_of(a) == int_of(b);
    return num_of(a) == num_of(b);
  }
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case Value::Type::kUndefined:
    case Value::Type::kNone:
      return true;
    case Value::Type::kString:
      return a.str() == b.str();
    case Value::Type::kArray: {
      if (a.is_tuple() != b.is_tuple()) return false;
      if (a.cell() == b.cell()) return true;  // Python compares an object with itself so too
      if (depth >= kMaxValueDepth) too_deep_to_compare();
      const auto& x = a.arr().items;
      const auto& y = b.arr().items;
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!py_eq(x[i], y[i], depth + 1)) return false;
      }
      return true;
    }
    case Value::Type::kObject:
      if (a.is_namespace() || b.is_namespace() || a.cell() == b.cell()) return a.cell() == b.cell();
      if (depth >= kMaxValueDepth) too_deep_to_compare();
      return obj_eq(a.obj(), b.obj(), depth);
    default:
      return a.cell() == b.cell();
  }
}

// <0, 0, >0; raises for unorderable types (as Python's TypeError).
int py_cmp(const Value& a, const Value& b, const char* op, int depth = 0) {
  if (is_num_like(a) && is_num_like(b)) {
    if (is_int_like(a) && is_int_like(b)) {
      int64_t x = int_of(a), y = int_of(b);
      return x < y ? -1 : x > y ? 1 : 0;
    }
    double x = num_of(a), y = num_of(b);
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    int c = a.str().compare(b.str());  // UTF-8 byte order == code point order
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_array() && b.is_array() && a.is_tuple() == b.is_tuple()) {
    const auto& x = a.arr().items;
    const auto& y = b.arr().items;
    if (depth >= kMaxValueDepth) too_deep_to_compare();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!py_eq(x[i], y[i], depth + 1)) return py_cmp(x[i], y[i], op, depth + 1);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  if (a.is_undefined()) raise_undefined(a);
  if (b.is_undefined()) raise_undefined(b);
  raise(std::string("'") + op + "' not supported between instances of '" + type_name(a) +
        "' and '" + type_name(b) + "'");
}

// Code points of a string (ASCII strings index bytes directly).
bool is_ascii(std::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}
std::vector<std::string_view> code_points(std::string_view s) {
  std::vector<std::string_view> out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    size_t a = i;
    unicode::next_code_point(s, i);
    out.push_back(s.substr(a, i - a));
  }
  return out;
}
int64_t py_len(const Value& v) {
  switch (v.type()) {
    case Value::Type::kString:
      return static_cast<int64_t>(unicode::count_code_points(v.str()));
    case Value::Type::kArray:
      return static_cast<int64_t>(v.arr().items.size());
    case Value::Type::kObject:
      if (v.is_namespace()) break;
      return static_cast<int64_t>(v.obj().items.size());
    case Value::Type::kUndefined:
      return 0;
    default:
      break;
  }
  raise(std::string("object of type '") + type_name(v) + "' has no len()");
}

// Items of an iterable, as Python's iter(): list/tuple items, dict keys, string characters.
std::vector<Value> iterate(const Value& v) {
  switch (v.type()) {
    case Value::Type::kArray:
      return v.arr().items;
    case Value::Type::kObject: {
      if (v.is_namespace()) break;
      std::vector<Value> keys;
      keys.reserve(v.obj().items.size());
      for (const auto& kv : v.obj().items) keys.emplace_back(kv.first);
      return keys;
    }
    case Value::Type::kString: {
      std::vector<Value> chars;
      for (auto c : code_points(v.str())) chars.emplace_back(c);
      return chars;
    }
    case Value::Type::kUndefined:
      return {};
    default:
      break;
  }
  raise(std::string("'") + type_name(v) + "' object is not iterable");
}

bool is_py_space_cp(char32_t c) {
  return unicode::is_python_space(c);
}

// Python str.strip family. chars == nullptr: whitespace.
std::string py_strip(std::string_view s, const std::string* chars, bool left, bool right) {
  auto strip_this = [&](char32_t c) {
    if (!chars) return is_py_space_cp(c);
    size_t i = 0;
    while (i < chars->size()) {
      if (unicode::next_code_point(*chars, i) == c) return true;
    }
    return false;
  };
  size_t a = 0, b = s.size();
  if (left) {
    while (a < b) {
      size_t k = a;
      if (!strip_this(unicode::next_code_point(s, k))) break;
      a = k;
    }
  }
  if (right) {
    while (b > a) {
      size_t p = b - 1;
      while (p > a && (static_cast<unsigned char>(s[p]) & 0xC0) == 0x80) --p;
      size_t k = p;
      if (!strip_this(unicode::next_code_point(s, k))) break;
      b = p;
    }
  }
  return std::string(s.substr(a, b - a));
}

std::vector<std::string> py_split(std::string_view s, const Value& sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep.is_none() || sep.is_undefined()) {
    size_t i = 0;
    auto skip = [&] {
      while (i < s.size()) {
        size_t k = i;
        if (!is_py_space_cp(unicode::next_code_point(s, k))) break;
        i = k;
      }
    };
    skip();
    while (i < s.size()) {
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) {
        // Rest of the string, trailing whitespace removed.
        out.push_back(py_strip(s.substr(i), nullptr, false, true));
        return out;
      }
      size_t start = i;
      while (i < s.size()) {
        size_t k = i;
        if (is_py_space_cp(unicode::next_code_point(s, k))) break;
        i = k;
      }
      out.emplace_back(s.substr(start, i - start));
      skip();
    }
    return out;
  }
  if (!sep.is_string()) raise("must be str or None, not " + std::string(type_name(sep)));
  const std::string& d = sep.str();
  if (d.empty()) raise("empty separator");
  size_t pos = 0;
  while (true) {
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) break;
    size_t f = s.find(d, pos);
    if (f == std::string_view::npos) break;
    out.emplace_back(s.substr(pos, f - pos));
    pos = f + d.size();
  }
  out.emplace_back(s.substr(pos));
  return out;
}

std::vector<std::string> py_splitlines(std::string_view s, bool keepends) {
  std::vector<std::string> out;
  size_t i = 0, start = 0;
  while (i < s.size()) {
    size_t a = i;
    char32_t c = unicode::next_code_point(s, i);
    bool brk = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D ||
               c == 0x1E || c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!brk) continue;
    size_t end = i;
    if (c == '\r' && i < s.size() && s[i] == '\n') end = ++i;
    out.emplace_back(s.substr(start, (keepends ? end : a) - start));
    start = i;
  }
  if (start < s.size()) out.emplace_back(s.substr(start));
  return out;
}

std::string py_replace(std::string_view s, std::string_view old, std::string_view repl,
                       int64_t count) {
  std::string out;
  if (old.empty()) {
    // Python inserts the replacement between every character (and at both ends).
    auto cps = code_points(s);
    int64_t done = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || done < count) {
        out.append(repl);
        ++done;
      }
      if (i < cps.size()) out.append(cps[i]);
    }
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t f = s.find(old, pos);
    if (f == std::string_view::npos) break;
    out.append(s.substr(pos, f - pos)).append(repl);
    pos = f + old.size();
    ++done;
  }
  out.append(s.substr(pos));
  return out;
}

std::string html_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out.append("&amp;");
        break;
      case '<':
        out.append("&lt;");
        break;
      case '>':
        out.append("&gt;");
        break;
      case '"':
        out.append("&#34;");
        break;
      case '\'':
        out.append("&#39;");
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

// Python's slice semantics over n items.
std::vector<int64_t> slice_indices(int64_t n, const Value* start, const Value* stop,
                                   const Value* step) {
  int64_t st = 1;
  if (step && !step->is_none() && !step->is_undefined()) {
    if (!is_int_like(*step)) raise("slice indices must be integers or None");
    st = int_of(*step);
    if (st == 0) raise("slice step cannot be zero");
  }
  auto norm = [&](const Value* v, int64_t dflt, bool is_start) -> int64_t {
    if (!v || v->is_none() || v->is_undefined()) return dflt;
    if (!is_int_like(*v)) raise("slice indices must be integers or None");
    int64_t x = int_of(*v);
    (void)is_start;
    if (x < 0) {
      x += n;
      if (x < 0) x = st < 0 ? -1 : 0;
    } else if (x >= n) {
      x = st < 0 ? n - 1 : n;
    }
    return x;
  };
  int64_t a = norm(start, st < 0 ? n - 1 : 0, true);
  int64_t b = norm(stop, st < 0 ? -1 : n, false);
  std::vector<int64_t> idx;
  if (st > 0) {
    for (int64_t i = a; i < b; i += st) idx.push_back(i);
  } else {
    for (int64_t i = a; i > b; i += st) idx.push_back(i);
  }
  return idx;
}

// Python int(str): optional sign, digits, underscores between digits, surrounding whitespace.
bool parse_py_int(std::string_view s, int64_t& out) {
  std::string t = py_strip(s, nullptr, true, true);
  if (t.empty()) return false;
  size_t i = 0;
  bool neg = false;
  if (t[0] == '+' || t[0] == '-') {
    neg = t[0] == '-';
    ++i;
  }
  if (i >= t.size()) return false;
  int64_t v = 0;
  bool prev_digit = false;
  for (; i < t.size(); ++i) {
    char c = t[i];
    if (c == '_' && prev_digit && i + 1 < t.size() && t[i + 1] >= '0' && t[i + 1] <= '9') {
      prev_digit = false;
      continue;
    }
    if (c < '0' || c > '9') return false;
    if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, c - '0', &v)) return false;
    prev_digit = true;
  }
  out = neg ? -v : v;
  return true;
}

bool parse_py_float(std::string_view s, double& out) {
  std::string t = py_strip(s, nullptr, true, true);
  if (t.empty()) return false;
  std::string lower = unicode::to_lower(t);
  if (lower == "nan" || lower == "+nan" || lower == "-nan") {
    out = std::nan("");
    return true;
  }
  if (lower == "inf" || lower == "+inf" || lower == "infinity" || lower == "+infinity") {
    out = INFINITY;
    return true;
  }
  if (lower == "-inf" || lower == "-infinity") {
    out = -INFINITY;
    return true;
  }
  for (char c : t) {
    if (!((c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-' ||
          c == '_')) {
      return false;
    }
  }
  std::string clean;
  for (char c : t) {
    if (c != '_') clean.push_back(c);
  }
  char* end = nullptr;
  out = std::strtod(clean.c_str(), &end);
  return end != nullptr && *end == '\0' && end != clean.c_str();
}

// Arguments of a call: positional values and keyword values.
struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  const Value* get(size_t i, std::string_view name) const {
    if (i < pos.size()) return &pos[i];
    for (const auto& [k, v] : kw) {
      if (k == name) return &v;
    }
    return nullptr;
  }
};

enum class Control { kNone, kBreak, kContinue };

// Deepest a render's evaluation may go: statements in statements and operands of operands, across
// macro calls (each of which starts over on its body, so macro recursion multiplies the syntax
// tree's depth). Each level is a few C++ frames; past this the render fails, as Python's
// RecursionError fails one, instead of running out of stack.
constexpr int kMaxEvalDepth = 1024;

thread_local uint64_t render_step_limit = 0;  // set_render_step_limit

class Interp {
 public:
  explicit Interp(const Template::Impl& t) : t_(t) {
    auto sym = [&](const char* name) -> uint32_t {
      auto it = t.symbols.find(name);
      return it == t.symbols.end() ? UINT32_MAX : it->second;
    };
    sym_range_ = sym("range");
    sym_namespace_ = sym("namespace");
    sym_dict_ = sym("dict");
    sym_raise_ = sym("raise_exception");
    sym_strftime_ = sym("strftime_now");
  }
  // Namespaces are the only values a template can mutate, so the only way to a reference cycle
  // (`{% set ns.me = ns %}`), which counting never frees: the render empties every namespace it
  // made when it ends, breaking any cycle.
  ~Interp() {
    for (Value& ns : namespaces_) ns.obj_mut().items.clear();
  }

  Control exec(const NodeList& stmts, Scope& scope, std::string& out);
  Value eval(const Node& n, Scope& scope);

 private:
  [[gnu::noinline]] void emit(const Node& n, Scope& scope, std::string& out);
  Value lookup(const Node& n, Scope& scope);
  Value get_attr(const Value& obj, std::string_view name) {
    return get_attr(obj, name, method_mask(name));
  }
  Value get_attr(const Value& obj, std::string_view name, int mask);
  // Whether obj.name exists (without building an undefined value when it does not).
  bool has_attr(const Value& obj, std::string_view name, int mask);
  Value get_item(const Value& obj, const Value& key);
  Value binop(BinOp op, const Value& a, const Value& b);
  bool compare(CmpOp op, const Value& a, const Value& b);
  bool contains(const Value& container, const Value& item);
  // Stack: eval and exec recurse once per level of the syntax tree, so they keep their frames
  // small (ASan's build pads every local); the cases that need locals are functions of their own
  // (noinline), on the stack only at their own level. Filters, tests and methods get their
  // arguments evaluated, so their frames, the largest, are never there while nested expressions
  // evaluate.
  [[gnu::noinline]] Value eval_item(const Node& n, Scope& scope);
  [[gnu::noinline]] Value eval_slice(const Node& n, Scope& scope);
  [[gnu::noinline]] Value eval_filter(const Node& n, Scope& scope);
  [[gnu::noinline]] Value eval_test(const Node& n, Scope& scope);
  [[gnu::noinline]] Value eval_unary(const Node& n, Scope& scope);
  [[gnu::noinline]] Value eval_binary(const Node& n, Scope& scope);
  [[gnu::noinline]] Value eval_compare(const Node& n, Scope& scope);
  [[gnu::noinline]] Value eval_list(const Node& n, Scope& scope);
  [[gnu::noinline]] Value eval_dict(const Node& n, Scope& scope);
  [[gnu::noinline]] Value call(const Node& n, Scope& scope);
  [[gnu::noinline]] Value call_value(const Value& fn, Args& args);
  [[gnu::noinline]] Value call_builtin(const CallableCell& c, Args& args);
  [[gnu::noinline]] Value call_method(const Value& self, std::string_view name, Args& args);
  [[gnu::noinline]] Value call_macro(const CallableCell& c, Args& args);
  [[gnu::noinline]] Value run_filter(const Node& n, Value v, const Args& args);
  [[gnu::noinline]] bool run_test(int id, const Value& v, const std::vector<Value>& args);
  Args eval_args(const Node& n, Scope& scope);
  void assign(const Node& target, Value v, Scope& scope);
  [[gnu::noinline]] Control exec_for(const Node& n, Scope& scope, std::string& out);
  [[gnu::noinline]] Control exec_block(const Node& n, Scope& scope, std::string& out);
  Value map_item(const Value& item, const std::string& filter_name, const Args& rest);
  bool run_test_by_name(std::string_view name, const Value& v, const std::vector<Value>& args);

  const Template::Impl& t_;
  uint32_t sym_range_, sym_namespace_, sym_dict_, sym_raise_, sym_strftime_;
  int depth_ = 0;
  int eval_depth_ = 0;  // exec and eval calls in progress
  uint64_t steps_ = 0;  // exec and eval calls made
  uint64_t step_limit_ = render_step_limit != 0 ? render_step_limit : UINT64_MAX;
  std::vector<Value> namespaces_;  // made by this render

  // Counts one level of evaluation while it lasts, and one step. Runs on every exec and eval:
  // the check stays inline, the error path does not.
  class Nested {
   public:
    explicit Nested(Interp& in) : depth_(in.eval_depth_) {
      if (++depth_ > kMaxEvalDepth || ++in.steps_ > in.step_limit_) [[unlikely]] {
        --depth_;
        too_deep_or_too_long(depth_, in.step_limit_);
      }
    }
    ~Nested() { --depth_; }
    Nested(const Nested&) = delete;
    Nested& operator=(const Nested&) = delete;

   private:
    [[noreturn, gnu::noinline, gnu::cold]] static void too_deep_or_too_long(int depth,
                                                                            uint64_t limit) {
      if (depth >= kMaxEvalDepth) {
        raise("template nested too deeply (more than " + std::to_string(kMaxEvalDepth) +
              " levels of evaluation)");
      }
      raise("template ran too long (more than " + std::to_string(limit) + " steps)");
    }
    int& depth_;
  };
};

Value builtin(Builtin b) {
  auto* c = new CallableCell();
  c->kind = CallableCell::Kind::kBuiltin;
  c->builtin = b;
  return make_callable(c);
}

Value Interp::lookup(const Node& n, Scope& scope) {
  for (Scope* s = &scope; s != nullptr; s = s->parent) {
    if (const Value* v = s->find(n.sym)) return *v;
  }
  if (n.sym == sym_range_) return builtin(Builtin::kRange);
  if (n.sym == sym_namespace_) return builtin(Builtin::kNamespace);
  if (n.sym == sym_dict_) return builtin(Builtin::kDict);
  if (n.sym == sym_raise_) return builtin(Builtin::kRaise);
  if (n.sym == sym_strftime_) return builtin(Builtin::kStrftime);
  return Value::undefined_named("'" + n.name + "' is undefined");
}

Value bound_method(const Value& self, std::string_view name) {
  auto* c = new CallableCell();
  c->kind = CallableCell::Kind::kMethod;
  c->self = self;
  c->method = std::string(name);
  return make_callable(c);
}

bool Interp::has_attr(const Value& obj, std::string_view name, int mask) {
  switch (obj.type()) {
    case Value::Type::kUndefined:
      raise_undefined(obj);
    case Value::Type::kObject:
      if (!obj.is_namespace() && (mask & (kMethodDict | kMethodUnsafe))) return true;
      return obj.obj().find(name) != nullptr;
    case Value::Type::kString:
      return (mask & kMethodStr) != 0;
    case Value::Type::kArray:
      return (mask & (kMethodList | kMethodUnsafe)) != 0;
    default:
      return !get_attr(obj, name, mask).is_undefined();
  }
}

Value Interp::get_attr(const Value& obj, std::string_view name, int mask) {
  switch (obj.type()) {
    case Value::Type::kUndefined:
      raise_undefined(obj);
    case Value::Type::kObject: {
      if (obj.is_namespace()) {
        if (const Value* v = obj.obj().find(name)) return *v;
        return undefined_attr(obj, name);
      }
      if (mask & (kMethodDict | kMethodUnsafe)) return bound_method(obj, name);
      if (const Value* v = obj.obj().find(name)) return *v;
      return undefined_attr(obj, name);
    }
    case Value::Type::kString:
      if (mask & kMethodStr) return bound_method(obj, name);
      return undefined_attr(obj, name);
    case Value::Type::kArray:
      if (mask & (kMethodList | kMethodUnsafe)) return bound_method(obj, name);
      return undefined_attr(obj, name);
    case Value::Type::kLoop: {
      const auto& l = *static_cast<const LoopCell*>(obj.cell());
      if (name == "index") return Value(l.index0 + 1);
      if (name == "index0") return Value(l.index0);
      if (name == "revindex") return Value(l.length - l.index0);
      if (name == "revindex0") return Value(l.length - l.index0 - 1);
      if (name == "first") return Value(l.index0 == 0);
      if (name == "last") return Value(l.index0 == l.length - 1);
      if (name == "length") return Value(l.length);
      if (name == "depth") return Value(int64_t{1});
      if (name == "depth0") return Value(int64_t{0});
      if (name == "previtem") {
        if (l.index0 == 0) return Value::undefined_named("there is no previous item");
        return l.items.arr().items[static_cast<size_t>(l.index0 - 1)];
      }
      if (name == "nextitem") {
        if (l.index0 + 1 >= l.length) return Value::undefined_named("there is no next item");
        return l.items.arr().items[static_cast<size_t>(l.index0 + 1)];
      }
      if (mask & kMethodLoop) return bound_method(obj, name);
      return undefined_attr(obj, name);
    }
    default:
      return undefined_attr(obj, name);
  }
}

Value Interp::get_item(const Value& obj, const Value& key) {
  switch (obj.type()) {
    case Value::Type::kUndefined:
      raise_undefined(obj);
    case Value::Type::kObject:
      if (key.is_string()) {
        if (const Value* v = obj.obj().find(key.str())) return *v;
        return get_attr(obj, key.str());
      }
      return Value::undefined_named("'" + std::string(type_name(obj)) + " object' has no item " +
                                    to_str(key));
    case Value::Type::kArray:
      if (is_int_like(key)) {
        int64_t i = int_of(key);
        auto n = static_cast<int64_t>(obj.arr().items.size());
        if (i < 0) i += n;
        if (i < 0 || i >= n) return Value::undefined_named("list index out of range");
        return obj.arr().items[static_cast<size_t>(i)];
      }
      if (key.is_string()) return get_attr(obj, key.str());
      return Value::undefined_named("list indices must be integers");
    case Value::Type::kString:
      if (is_int_like(key)) {
        const std::string& s = obj.str();
        int64_t i = int_of(key);
        if (is_ascii(s)) {
          auto n = static_cast<int64_t>(s.size());
          if (i < 0) i += n;
          if (i < 0 || i >= n) return Value::undefined_named("string index out of range");
          return Value(std::string(1, s[static_cast<size_t>(i)]));
        }
        auto cps = code_points(s);
        auto n = static_cast<int64_t>(cps.size());
        if (i < 0) i += n;
        if (i < 0 || i >= n) return Value::undefined_named("string index out of range");
        return Value(cps[static_cast<size_t>(i)]);
      }
      if (key.is_string()) return get_attr(obj, key.str());
      return Value::undefined_named("string indices must be integers");
    case Value::Type::kLoop:
      if (key.is_string()) return get_attr(obj, key.str());
      return Value::undefined_named("no such item");
    default:
      return Value::undefined_named("'" + std::string(type_name(obj)) +
                                    "' object is not subscriptable");
  }
}

// Largest string and list a render builds, and its largest output: far beyond any prompt (a
// million-token context is a few MB), and small enough that a template doubling a string in a
// loop fails fast instead of filling memory (as repetition already did).
constexpr size_t kMaxStringBytes = size_t{64} << 20;
constexpr size_t kMaxListItems = size_t{1} << 20;
constexpr size_t kMaxOutputBytes = size_t{256} << 20;

void check_string_size(size_t n) {
  if (n > kMaxStringBytes) raise("string too large (more than 64 MiB)");
}

Value concat_strings(const Value& a, const Value& b) {
  check_string_size(a.str().size() + b.str().size());
  std::string s;
  s.reserve(a.str().size() + b.str().size());
  s.append(a.str()).append(b.str());
  return Value(std::move(s));
}

Value repeat(const std::string& s, int64_t n) {
  std::string out;
  if (n > 0) {
    if (s.size() * static_cast<size_t>(n) > (64u << 20)) raise("string repetition too large");
    out.reserve(s.size() * static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) out.append(s);
  }
  return Value(std::move(out));
}

Value Interp::binop(BinOp op, const Value& a, const Value& b) {
  if (op == BinOp::kConcat) {
    std::string s = to_str(a);
    append_str(b, s);
    check_string_size(s.size());
    return Value(std::move(s));
  }
  if (a.is_undefined()) raise_undefined(a);
  if (b.is_undefined()) raise_undefined(b);
  const char* sym = "+";
  switch (op) {
    case BinOp::kAdd:
      if (a.is_string() && b.is_string()) return concat_strings(a, b);
      if (a.is_array() && b.is_array() && a.is_tuple() == b.is_tuple()) {
        if (a.arr().items.size() + b.arr().items.size() > kMaxListItems) {
          raise("list too large (more than 1048576 items)");
        }
        std::vector<Value> items = a.arr().items;
        items.insert(items.end(), b.arr().items.begin(), b.arr().items.end());
        return Value::array(std::move(items), a.is_tuple());
      }
      break;
    case BinOp::kSub:
      sym = "-";
      break;
    case BinOp::kMul:
      sym = "*";
      if (a.is_string() && is_int_like(b)) return repeat(a.str(), int_of(b));
      if (b.is_string() && is_int_like(a)) return repeat(b.str(), int_of(a));
      if (a.is_array() && is_int_like(b)) {
        std::vector<Value> items;
        if (int_of(b) > 0 && a.arr().items.size() * static_cast<size_t>(int_of(b)) > (1u << 20)) {
          raise("list repetition too large");
        }
        for (int64_t i = 0; i < int_of(b); ++i) {
          items.insert(items.end(), a.arr().items.begin(), a.arr().items.end());
        }
        return Value::array(std::move(items), a.is_tuple());
      }
      break;
    case BinOp::kDiv:
      sym = "/";
      break;
    case BinOp::kFloorDiv:
      sym = "//";
      break;
    case BinOp::kMod:
      sym = "%";
      break;
    case BinOp::kPow:
      sym = "**";
      break;
    case BinOp::kConcat:
      break;
  }
  if (!is_num_like(a) || !is_num_like(b)) {
    raise(std::string("unsupported operand type(s) for ") + sym + ": '" + type_name(a) + "' and '" +
          type_name(b) + "'");
  }
  bool ints = is_int_like(a) && is_int_like(b);
  if (ints) {
    int64_t x = int_of(a), y = int_of(b), r = 0;
    switch (op) {
      case BinOp::kAdd:
        if (__builtin_add_overflow(x, y, &r)) raise("integer overflow");
        return Value(r);
      case BinOp::kSub:
        if (__builtin_sub_overflow(x, y, &r)) raise("integer overflow");
        return Value(r);
      case BinOp::kMul:
        if (__builtin_mul_overflow(x, y, &r)) raise("integer overflow");
        return Value(r);
      case BinOp::kDiv:
        if (y == 0) raise("division by zero");
        return Value(static_cast<double>(x) / static_cast<double>(y));
      case BinOp::kFloorDiv: {
        if (y == 0) raise("integer division or modulo by zero");
        int64_t q = x / y;
        if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
        return Value(q);
      }
      case BinOp::kMod: {
        if (y == 0) raise("integer division or modulo by zero");
        int64_t m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) m += y;
        return Value(m);
      }
      case BinOp::kPow: {
        if (y < 0) return Value(std::pow(static_cast<double>(x), static_cast<double>(y)));
        int64_t result = 1, base = x;
        for (int64_t e = y; e > 0; e >>= 1) {
          if ((e & 1) && __builtin_mul_overflow(result, base, &result)) raise("integer overflow");
          if (e > 1 && __builtin_mul_overflow(base, base, &base)) raise("integer overflow");
        }
        return Value(result);
      }
      default:
        break;
    }
  }
  double x = num_of(a), y = num_of(b);
  switch (op) {
    case BinOp::kAdd:
      return Value(x + y);
    case BinOp::kSub:
      return Value(x - y);
    case BinOp::kMul:
      return Value(x * y);
    case BinOp::kDiv:
      if (y == 0) raise("float division by zero");
      return Value(x / y);
    case BinOp::kFloorDiv:
      if (y == 0) raise("float floor division by zero");
      return Value(std::floor(x / y));
    case BinOp::kMod: {
      if (y == 0) raise("float modulo");
      double m = std::fmod(x, y);
      if (m != 0 && ((m < 0) != (y < 0))) m += y;
      return Value(m);
    }
    case BinOp::kPow:
      return Value(std::pow(x, y));
    default:
      break;
  }
  raise("bad operator");
}

bool Interp::contains(const Value& c, const Value& item) {
  switch (c.type()) {
    case Value::Type::kString:
      if (!item.is_string()) {
        raise(std::string("'in <string>' requires string as left operand, not ") + type_name(item));
      }
      return c.str().find(item.str()) != std::string::npos;
    case Value::Type::kArray:
      for (const auto& x : c.arr().items) {
        if (py_eq(x, item)) return true;
      }
      return false;
    case Value::Type::kObject:
      if (c.is_namespace()) break;
      return item.is_string() && c.obj().find(item.str()) != nullptr;
    case Value::Type::kUndefined:
      return false;
    default:
      break;
  }
  raise(std::string("argument of type '") + type_name(c) + "' is not iterable");
}

bool Interp::compare(CmpOp op, const Value& a, const Value& b) {
  switch (op) {
    case CmpOp::kEq:
      return py_eq(a, b);
    case CmpOp::kNe:
      return !py_eq(a, b);
    case CmpOp::kLt:
      return py_cmp(a, b, "<") < 0;
    case CmpOp::kLe:
      return py_cmp(a, b, "<=") <= 0;
    case CmpOp::kGt:
      return py_cmp(a, b, ">") > 0;
    case CmpOp::kGe:
      return py_cmp(a, b, ">=") >= 0;
    case CmpOp::kIn:
      return contains(b, a);
    case CmpOp::kNotIn:
      return !contains(b, a);
  }
  return false;
}

Args Interp::eval_args(const Node& n, Scope& scope) {
  Args args;
  args.pos.reserve(n.a.size());
  for (const auto& a : n.a) args.pos.push_back(eval(*a, scope));
  for (const auto& [k, v] : n.kwargs) args.kw.emplace_back(k, eval(*v, scope));
  return args;
}

Value Interp::call(const Node& n, Scope& scope) {
  const Node& callee = *n.x;
  if (callee.kind == NodeKind::kAttr) {
    // obj.method(...): dispatch without a bound-method object when obj has that method.
    Value self = eval(*callee.x, scope);
    int mask = callee.id;
    bool direct = (self.is_string() && (mask & kMethodStr)) ||
                  (self.is_dict() && (mask & (kMethodDict | kMethodUnsafe))) ||
                  (self.is_array() && (mask & (kMethodList | kMethodUnsafe))) ||
                  (self.type() == Value::Type::kLoop && (mask & kMethodLoop));
    if (direct) {
      Args args = eval_args(n, scope);
      return call_method(self, callee.name, args);
    }
    Value fn = get_attr(self, callee.name, mask);
    Args args = eval_args(n, scope);
    return call_value(fn, args);
  }
  Value fn = eval(callee, scope);
  Args args = eval_args(n, scope);
  return call_value(fn, args);
}

Value Interp::call_value(const Value& fn, Args& args) {
  if (fn.is_undefined()) raise_undefined(fn);
  if (!fn.is_callable()) raise(std::string("'") + type_name(fn) + "' object is not callable");
  const auto& c = *static_cast<const CallableCell*>(fn.cell());
  switch (c.kind) {
    case CallableCell::Kind::kMethod:
      return call_method(c.self, c.method, args);
    case CallableCell::Kind::kMacro:
      return call_macro(c, args);
    case CallableCell::Kind::kBuiltin:
      break;
  }
  return call_builtin(c, args);
}

Value Interp::call_builtin(const CallableCell& c, Args& args) {
  switch (c.builtin) {
    case Builtin::kRange: {
      if (args.pos.empty() || args.pos.size() > 3) raise("range expected 1 to 3 arguments");
      for (const auto& v : args.pos) {
        if (!is_int_like(v)) raise("range() arguments must be integers");
      }
      int64_t start = 0, stop, step = 1;
      if (args.pos.size() == 1) {
        stop = int_of(args.pos[0]);
      } else {
        start = int_of(args.pos[0]);
        stop = int_of(args.pos[1]);
        if (args.pos.size() == 3) step = int_of(args.pos[2]);
      }
      if (step == 0) raise("range() arg 3 must not be zero");
      std::vector<Value> items;
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        if (items.size() >= 100000) raise("range too big, maximum size for range is 100000");
        items.emplace_back(i);
      }
      return Value::array(std::move(items));
    }
    case Builtin::kNamespace: {
      Value ns = Value::make_namespace();
      namespaces_.push_back(ns);
      if (!args.pos.empty()) {
        if (args.pos.size() > 1 || !args.pos[0].is_dict()) {
          raise("namespace() takes a single mapping argument");
        }
        for (const auto& [k, v] : args.pos[0].obj().items) ns.obj_mut().set(k, v);
      }
      for (auto& [k, v] : args.kw) ns.obj_mut().set(k, v);
      return ns;
    }
    case Builtin::kDict: {
      Value d = Value::object();
      if (!args.pos.empty()) {
        if (args.pos[0].is_dict()) {
          for (const auto& [k, v] : args.pos[0].obj().items) d.obj_mut().set(k, v);
        } else {
          raise("dict() with a non-mapping argument is not supported");
        }
      }
      for (auto& [k, v] : args.kw) d.obj_mut().set(k, v);
      return d;
    }
    case Builtin::kRaise: {
      const Value* m = args.get(0, "message");
      raise(m ? to_str(*m) : std::string("raise_exception() called"));
    }
    case Builtin::kStrftime: {
      const Value* f = args.get(0, "format");
      if (!f || !f->is_string()) raise("strftime_now() needs a format string");
      std::time_t now = std::time(nullptr);
      std::tm tm{};
      localtime_r(&now, &tm);
      char buf[256];
      size_t n = std::strftime(buf, sizeof(buf), f->str().c_str(), &tm);
      return Value(std::string(buf, n));
    }
  }
  raise("unknown builtin");
}

Value Interp::call_macro(const CallableCell& c, Args& args) {
  const Node& m = *c.macro;
  if (++depth_ > 64) raise("macro recursion too deep");
  if (args.pos.size() > m.params.size()) {
    raise("macro '" + m.name + "' takes not more than " + std::to_string(m.params.size()) +
          " argument(s)");
  }
  Scope scope;
  scope.parent = c.closure;
  for (size_t i = 0; i < m.params.size(); ++i) {
    const Param& p = m.params[i];
    if (i < args.pos.size()) {
      scope.set(p.sym, args.pos[i]);
      continue;
    }
    bool found = false;
    for (auto& [k, v] : args.kw) {
      if (k == p.name) {
        scope.set(p.sym, v);
        found = true;
        break;
      }
    }
    if (found) continue;
    if (p.dflt) {
      scope.set(p.sym, eval(*p.dflt, scope));
    } else {
      scope.set(p.sym, Value::undefined_named("'" + p.name + "' is undefined"));
    }
  }
  for (const auto& [k, v] : args.kw) {
    bool known = false;
    for (const auto& p : m.params) known = known || p.name == k;
    if (!known) raise("macro '" + m.name + "' takes no keyword argument '" + k + "'");
  }
  std::string out;
  exec(m.a, scope, out);
  --depth_;
  return Value(std::move(out));
}

Value str_list(std::vector<std::string> parts) {
  std::vector<Value> items;
  items.reserve(parts.size());
  for (auto& p : parts) items.emplace_back(std::move(p));
  return Value::array(std::move(items));
}

int64_t int_arg(const Value* v, int64_t dflt, const char* what) {
  if (!v || v->is_none()) return dflt;
  if (!is_int_like(*v)) raise(std::string(what) + " must be an integer");
  return int_of(*v);
}

const std::string& str_arg(const Value* v, const char* what) {
  if (!v || !v->is_string()) raise(std::string(what) + " must be a string");
  return v->str();
}

// Python str.format with {} / {0} / {name} fields (no format specs beyond none).
std::string py_format(const std::string& fmt, const Args& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    char c = fmt[i];
    if (c == '{') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
        out.push_back('{');
        ++i;
        continue;
      }
      size_t end = fmt.find('}', i);
      if (end == std::string::npos) raise("Single '{' encountered in format string");
      std::string field = fmt.substr(i + 1, end - i - 1);
      if (field.find(':') != std::string::npos || field.find('!') != std::string::npos) {
        raise("format specifications are not supported in str.format");
      }
      const Value* v = nullptr;
      if (field.empty()) {
        v = auto_index < args.pos.size() ? &args.pos[auto_index] : nullptr;
        ++auto_index;
      } else if (field[0] >= '0' && field[0] <= '9') {
        size_t k = std::strtoul(field.c_str(), nullptr, 10);
        v = k < args.pos.size() ? &args.pos[k] : nullptr;
      } else {
        for (const auto& [k, x] : args.kw) {
          if (k == field) v = &x;
        }
      }
      if (!v) raise("Replacement index out of range for positional args tuple");
      append_str(*v, out);
      i = end;
    } else if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') ++i;
      out.push_back('}');
    } else {
      out.push_back(c);
    }
  }
  return out;
}

Value Interp::call_method(const Value& self, std::string_view name, Args& args) {
  if (in_list(kUnsafeMethods, name)) {
    raise("access to attribute '" + std::string(name) + "' of '" + type_name(self) +
          "' object is unsafe");
  }
  if (self.is_string()) {
    const std::string& s = self.str();
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      const Value* ch = args.get(0, "chars");
      const std::string* chars = ch && ch->is_string() ? &ch->str() : nullptr;
      if (ch && !ch->is_string() && !ch->is_none()) raise("strip arg must be None or str");
      return Value(py_strip(s, chars, name != "rstrip", name != "lstrip"));
    }
    if (name == "split" || name == "rsplit") {
      const Value* sep = args.get(0, "sep");
      int64_t maxsplit = int_arg(args.get(1, "maxsplit"), -1, "maxsplit");
      Value none = Value::none();
      if (name == "rsplit" && maxsplit >= 0) {
        // Split from the right: reverse trick on separators is wrong for multi-char seps,
        // so do it directly.
        if (!sep || sep->is_none()) {
          auto all = py_split(s, none, -1);
          if (static_cast<int64_t>(all.size()) <= maxsplit + 1) return str_list(std::move(all));
          raise("rsplit() without a separator and with maxsplit is not supported");
        }
        const std::string& d = str_arg(sep, "sep");
        if (d.empty()) raise("empty separator");
        std::vector<std::string> parts;
        size_t end = s.size();
        while (static_cast<int64_t>(parts.size()) < maxsplit) {
          size_t f = end >= d.size() ? s.rfind(d, end - d.size()) : std::string::npos;
          if (f == std::string::npos) break;
          parts.push_back(s.substr(f + d.size(), end - f - d.size()));
          end = f;
        }
        parts.push_back(s.substr(0, end));
        std::reverse(parts.begin(), parts.end());
        return str_list(std::move(parts));
      }
      return str_list(py_split(s, sep ? *sep : none, maxsplit));
    }
    if (name == "splitlines") {
      const Value* k = args.get(0, "keepends");
      return str_list(py_splitlines(s, k && k->truthy()));
    }
    if (name == "startswith" || name == "endswith") {
      const Value* p = args.get(0, "prefix");
      if (!p) raise(std::string(name) + "() takes at least 1 argument");
      auto test = [&](const std::string& x) {
        return name == "startswith" ? std::string_view(s).starts_with(x)
                                    : std::string_view(s).ends_with(x);
      };
      if (p->is_string()) return Value(test(p->str()));
      if (p->is_array()) {
        for (const auto& x : p->arr().items) {
          if (!x.is_string()) raise("tuple for startswith must only contain str");
          if (test(x.str())) return Value(true);
        }
        return Value(false);
      }
      raise(std::string(name) + " first arg must be str or a tuple of str");
    }
    if (name == "replace") {
      const std::string& a = str_arg(args.get(0, "old"), "replace() old");
      const std::string& b = str_arg(args.get(1, "new"), "replace() new");
      return Value(py_replace(s, a, b, int_arg(args.get(2, "count"), -1, "count")));
    }
    if (name == "upper") return Value(unicode::to_upper(s));
    if (name == "lower" || name == "casefold") return Value(unicode::to_lower(s));
    if (name == "title") return Value(unicode::to_title(s));
    if (name == "capitalize") return Value(unicode::capitalize(s));
    if (name == "swapcase") {
      std::string out;
      for (auto cp : code_points(s)) {
        std::string u = unicode::to_upper(cp);
        out.append(u == cp ? unicode::to_lower(cp) : u);
      }
      return Value(std::move(out));
    }
    if (name == "find" || name == "rfind" || name == "index" || name == "rindex" ||
        name == "count") {
      const std::string& sub = str_arg(args.get(0, "sub"), "substring");
      if (name == "count") {
        if (sub.empty()) return Value(static_cast<int64_t>(unicode::count_code_points(s) + 1));
        int64_t n = 0;
        for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
        return Value(n);
      }
      size_t f = name[0] == 'r' ? s.rfind(sub) : s.find(sub);
      if (f == std::string::npos) {
        if (name == "index" || name == "rindex") raise("substring not found");
        return Value(int64_t{-1});
      }
      return Value(static_cast<int64_t>(unicode::count_code_points(s.substr(0, f))));
    }
    if (name == "join") {
      const Value* it = args.get(0, "iterable");
      if (!it) raise("join() takes exactly one argument");
      std::string out;
      bool first = true;
      for (const auto& x : iterate(*it)) {
        if (!x.is_string()) {
          raise(std::string("sequence item: expected str instance, ") + type_name(x) + " found");
        }
        if (!first) out.append(s);
        first = false;
        out.append(x.str());
      }
      return Value(std::move(out));
    }
    if (name == "format") return Value(py_format(s, args));
    if (name == "isdigit" || name == "isnumeric" || name == "isdecimal" || name == "isalpha" ||
        name == "isalnum" || name == "isspace" || name == "isupper" || name == "islower") {
      if (s.empty()) return Value(false);
      bool any_cased = false;
      size_t i = 0;
      while (i < s.size()) {
        auto c = static_cast<UChar32>(unicode::next_code_point(s, i));
        int8_t t = u_charType(c);
        bool digit = t == U_DECIMAL_DIGIT_NUMBER;
        bool numeric = digit || t == U_LETTER_NUMBER || t == U_OTHER_NUMBER;
        bool alpha = u_isalpha(c);
        if (name == "isdigit" || name == "isdecimal") {
          if (!digit) return Value(false);
        } else if (name == "isnumeric") {
          if (!numeric) return Value(false);
        } else if (name == "isalpha") {
          if (!alpha) return Value(false);
        } else if (name == "isalnum") {
          if (!alpha && !numeric) return Value(false);
        } else if (name == "isspace") {
          if (!unicode::is_python_space(static_cast<char32_t>(c))) return Value(false);
        } else if (name == "isupper") {
          if (u_islower(c)) return Value(false);
          any_cased = any_cased || u_isupper(c);
        } else {
          if (u_isupper(c)) return Value(false);
          any_cased = any_cased || u_islower(c);
        }
      }
      if (name == "isupper" || name == "islower") return Value(any_cased);
      return Value(true);
    }
    if (name == "zfill" || name == "center" || name == "ljust" || name == "rjust") {
      int64_t width = int_arg(args.get(0, "width"), 0, "width");
      std::string fill = " ";
      if (const Value* f = args.get(1, "fillchar")) fill = str_arg(f, "fillchar");
      auto len = static_cast<int64_t>(unicode::count_code_points(s));
      if (width <= len) return self;
      int64_t pad = width - len;
      auto rep = [&](int64_t n, const std::string& x) {
        std::string r;
        for (int64_t i = 0; i < n; ++i) r.append(x);
        return r;
      };
      if (name == "zfill") {
        if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
          return Value(s.substr(0, 1) + rep(pad, "0") + s.substr(1));
        }
        return Value(rep(pad, "0") + s);
      }
      if (name == "ljust") return Value(s + rep(pad, fill));
      if (name == "rjust") return Value(rep(pad, fill) + s);
      int64_t left = pad / 2 + (pad & width & 1);
      return Value(rep(left, fill) + s + rep(pad - left, fill));
    }
    if (name == "removeprefix" || name == "removesuffix") {
      const std::string& a = str_arg(args.get(0, "affix"), "argument");
      if (name == "removeprefix" && std::string_view(s).starts_with(a)) {
        return Value(s.substr(a.size()));
      }
      if (name == "removesuffix" && !a.empty() && std::string_view(s).ends_with(a)) {
        return Value(s.substr(0, s.size() - a.size()));
      }
      return self;
    }
    if (name == "partition" || name == "rpartition") {
      const std::string& d = str_arg(args.get(0, "sep"), "sep");
      if (d.empty()) raise("empty separator");
      size_t f = name == "partition" ? s.find(d) : s.rfind(d);
      if (f == std::string::npos) {
        if (name == "partition") {
          return Value::array({Value(s), Value(""), Value("")}, true);
        }
        return Value::array({Value(""), Value(""), Value(s)}, true);
      }
      return Value::array({Value(s.substr(0, f)), Value(d), Value(s.substr(f + d.size()))}, true);
    }
  } else if (self.is_dict()) {
    const Object& o = self.obj();
    if (name == "items") {
      std::vector<Value> items;
      items.reserve(o.items.size());
      for (const auto& [k, v] : o.items) items.push_back(Value::array({Value(k), v}, true));
      return Value::array(std::move(items));
    }
    if (name == "keys") {
      std::vector<Value> items;
      for (const auto& kv : o.items) items.emplace_back(kv.first);
      return Value::array(std::move(items));
    }
    if (name == "values") {
      std::vector<Value> items;
      for (const auto& kv : o.items) items.push_back(kv.second);
      return Value::array(std::move(items));
    }
    if (name == "get") {
      const Value* k = args.get(0, "key");
      if (!k) raise("get expected at least 1 argument");
      if (k->is_string()) {
        if (const Value* v = o.find(k->str())) return *v;
      }
      const Value* d = args.get(1, "default");
      return d ? *d : Value::none();
    }
    if (name == "copy") {
      Value c = Value::object();
      c.obj_mut().items = o.items;
      return c;
    }
  } else if (self.is_array()) {
    const auto& items = self.arr().items;
    if (name == "index" || name == "count") {
      const Value* x = args.get(0, "value");
      if (!x) raise(std::string(name) + "() takes at least 1 argument");
      int64_t n = 0;
      for (size_t i = 0; i < items.size(); ++i) {
        if (py_eq(items[i], *x)) {
          if (name == "index") return Value(static_cast<int64_t>(i));
          ++n;
        }
      }
      if (name == "index") raise("value is not in list");
      return Value(n);
    }
    if (name == "copy") return Value::array(items, self.is_tuple());
  } else if (self.type() == Value::Type::kLoop) {
    const auto& l = *static_cast<const LoopCell*>(self.cell());
    if (name == "cycle") {
      if (args.pos.empty()) raise("no items for cycling given");
      return args.pos[static_cast<size_t>(l.index0) % args.pos.size()];
    }
  }
  raise("'" + std::string(type_name(self)) + "' object has no method '" + std::string(name) + "'");
}

// ---- expressions ----

// Left spine of a chain of the same binary operator: a + b + c -> [a, b, c].
void flatten_chain(const Node& n, BinOp op, std::vector<const Node*>& out) {
  if (n.kind == NodeKind::kBinary && static_cast<BinOp>(n.op) == op) {
    flatten_chain(*n.x, op, out);
    out.push_back(n.y.get());
  } else {
    out.push_back(&n);
  }
}

// The same into `out[0..n)` without allocating; false (out unspecified) when the chain has more
// than kMaxChain parts.
constexpr size_t kMaxChain = 16;
bool flatten_short_chain(const Node& n, BinOp op, const Node* (&out)[kMaxChain], size_t& count) {
  size_t parts = 1;
  const Node* p = &n;
  for (; p->kind == NodeKind::kBinary && static_cast<BinOp>(p->op) == op; p = p->x.get()) {
    if (++parts > kMaxChain) return false;
  }
  count = parts;
  p = &n;
  for (size_t i = parts; i-- > 1; p = p->x.get()) out[i] = p->y.get();
  out[0] = p;
  return true;
}

Value Interp::eval(const Node& n, Scope& scope) {
  Nested nested(*this);
  switch (n.kind) {
    case NodeKind::kConst:
      return n.value;
    case NodeKind::kName:
      return lookup(n, scope);
    case NodeKind::kAttr:
      return get_attr(eval(*n.x, scope), n.name, n.id);
    case NodeKind::kItem:
      return eval_item(n, scope);
    case NodeKind::kSlice:
      return eval_slice(n, scope);
    case NodeKind::kCall:
      return call(n, scope);
    case NodeKind::kFilter:
      return eval_filter(n, scope);
    case NodeKind::kTest:
      return eval_test(n, scope);
    case NodeKind::kNot:
      return Value(!eval(*n.x, scope).truthy());
    case NodeKind::kNeg:
    case NodeKind::kPos:
      return eval_unary(n, scope);
    case NodeKind::kBinary:
      return eval_binary(n, scope);
    case NodeKind::kAnd:
    case NodeKind::kOr: {
      Value a = eval(*n.x, scope);
      if (a.truthy() == (n.kind == NodeKind::kOr)) return a;
      return eval(*n.y, scope);
    }
    case NodeKind::kCompare:
      return eval_compare(n, scope);
    case NodeKind::kCondExpr: {
      if (eval(*n.x, scope).truthy()) return eval(*n.y, scope);
      if (n.z) return eval(*n.z, scope);
      return Value::undefined_named(
          "the inline if-expression evaluated to false and no else "
          "section was defined");
    }
    case NodeKind::kList:
    case NodeKind::kTuple:
      return eval_list(n, scope);
    case NodeKind::kDict:
      return eval_dict(n, scope);
    default:
      raise("statement used as an expression");
  }
}

Value Interp::eval_item(const Node& n, Scope& scope) {
  Value obj = eval(*n.x, scope);
  return get_item(obj, eval(*n.y, scope));
}

Value Interp::eval_slice(const Node& n, Scope& scope) {
  Value obj = eval(*n.x, scope);
  Value parts[3];
  for (size_t i = 0; i < 3; ++i) {
    if (n.a[i]) parts[i] = eval(*n.a[i], scope);
  }
  if (obj.is_undefined()) raise_undefined(obj);
  if (obj.is_array()) {
    const auto& items = obj.arr().items;
    auto idx = slice_indices(static_cast<int64_t>(items.size()), &parts[0], &parts[1], &parts[2]);
    std::vector<Value> out;
    out.reserve(idx.size());
    for (int64_t i : idx) out.push_back(items[static_cast<size_t>(i)]);
    return Value::array(std::move(out), obj.is_tuple());
  }
  if (obj.is_string()) {
    const std::string& s = obj.str();
    std::string out;
    if (is_ascii(s)) {
      for (int64_t i :
           slice_indices(static_cast<int64_t>(s.size()), &parts[0], &parts[1], &parts[2])) {
        out.push_back(s[static_cast<size_t>(i)]);
      }
    } else {
      auto cps = code_points(s);
      for (int64_t i :
           slice_indices(static_cast<int64_t>(cps.size()), &parts[0], &parts[1], &parts[2])) {
        out.append(cps[static_cast<size_t>(i)]);
      }
    }
    return Value(std::move(out));
  }
  raise(std::string("'") + type_name(obj) + "' object is not subscriptable");
}

Value Interp::eval_filter(const Node& n, Scope& scope) {
  Value v = n.x ? eval(*n.x, scope) : Value();
  Args args = eval_args(n, scope);
  return run_filter(n, std::move(v), args);
}

Value Interp::eval_test(const Node& n, Scope& scope) {
  if ((n.id == tDefined || n.id == tUndefined) && n.x->kind == NodeKind::kAttr) {
    bool has = has_attr(eval(*n.x->x, scope), n.x->name, n.x->id);
    return Value((n.id == tDefined ? has : !has) != n.flag);
  }
  Value v = eval(*n.x, scope);
  std::vector<Value> args;
  args.reserve(n.a.size());
  for (const auto& a : n.a) args.push_back(eval(*a, scope));
  return Value(run_test(n.id, v, args) != n.flag);
}

Value Interp::eval_unary(const Node& n, Scope& scope) {
  Value v = eval(*n.x, scope);
  if (v.is_undefined()) raise_undefined(v);
  bool neg = n.kind == NodeKind::kNeg;
  if (is_int_like(v)) return Value(neg ? -int_of(v) : int_of(v));
  if (v.is_float()) return Value(neg ? -v.as_float() : v.as_float());
  raise(std::string("bad operand type for unary ") + (neg ? "-" : "+") + ": '" + type_name(v) +
        "'");
}

Value Interp::eval_binary(const Node& n, Scope& scope) {
  auto op = static_cast<BinOp>(n.op);
  if (op == BinOp::kAdd || op == BinOp::kConcat) {
    // Chains of string concatenation build their result once.
    const Node* short_parts[kMaxChain];
    size_t count = 0;
    std::vector<const Node*> long_parts;
    const Node* const* parts = short_parts;
    if (!flatten_short_chain(n, op, short_parts, count)) {
      flatten_chain(n, op, long_parts);
      parts = long_parts.data();
      count = long_parts.size();
    }
    if (count > 2) {
      std::vector<Value> vals;
      vals.reserve(count);
      bool all_strings = true;
      for (size_t i = 0; i < count; ++i) {
        vals.push_back(eval(*parts[i], scope));
        all_strings = all_strings && vals.back().is_string();
      }
      if (all_strings || op == BinOp::kConcat) {
        std::string out;
        for (const auto& v : vals) append_str(v, out);
        check_string_size(out.size());
        return Value(std::move(out));
      }
      Value acc = vals[0];
      for (size_t i = 1; i < vals.size(); ++i) acc = binop(op, acc, vals[i]);
      return acc;
    }
  }
  Value a = eval(*n.x, scope);
  return binop(op, a, eval(*n.y, scope));
}

Value Interp::eval_compare(const Node& n, Scope& scope) {
  Value left = eval(*n.x, scope);
  for (size_t i = 0; i < n.cmp.size(); ++i) {
    Value right = eval(*n.a[i], scope);
    if (!compare(n.cmp[i], left, right)) return Value(false);
    left = std::move(right);
  }
  return Value(true);
}

Value Interp::eval_list(const Node& n, Scope& scope) {
  std::vector<Value> items;
  items.reserve(n.a.size());
  for (const auto& x : n.a) items.push_back(eval(*x, scope));
  return Value::array(std::move(items), n.kind == NodeKind::kTuple);
}

Value Interp::eval_dict(const Node& n, Scope& scope) {
  Value d = Value::object();
  for (size_t i = 0; i < n.a.size(); ++i) {
    Value k = eval(*n.a[i], scope);
    if (!k.is_string()) raise("dict literal keys must be strings here");
    d.obj_mut().set(k.str(), eval(*n.b[i], scope));
  }
  return d;
}

// {{ expr }}: strings and concatenation chains go straight to the output.
void Interp::emit(const Node& n, Scope& scope, std::string& out) {
  if (n.kind == NodeKind::kConst && n.value.is_string()) {
    out.append(n.value.str());
    return;
  }
  if (n.kind == NodeKind::kBinary &&
      (static_cast<BinOp>(n.op) == BinOp::kAdd || static_cast<BinOp>(n.op) == BinOp::kConcat)) {
    auto op = static_cast<BinOp>(n.op);
    const Node* parts[kMaxChain];
    size_t count = 0;
    if (flatten_short_chain(n, op, parts, count)) {
      Value vals[kMaxChain];
      bool all_strings = true;
      for (size_t i = 0; i < count; ++i) {
        vals[i] = eval(*parts[i], scope);
        all_strings = all_strings && vals[i].is_string();
      }
      if (all_strings || op == BinOp::kConcat) {
        for (size_t i = 0; i < count; ++i) append_str(vals[i], out);
        return;
      }
      Value acc = vals[0];
      for (size_t i = 1; i < count; ++i) acc = binop(op, acc, vals[i]);
      append_str(acc, out);
      return;
    }
  }
  Value v = eval(n, scope);
  append_str(v, out);
}

void Interp::assign(const Node& target, Value v, Scope& scope) {
  if (target.kind == NodeKind::kName) {
    scope.set(target.sym, std::move(v));
    return;
  }
  if (target.kind == NodeKind::kAttr) {
    Value ns = eval(*target.x, scope);
    if (!ns.is_namespace()) raise("cannot assign attribute on non-namespace object");
    ns.obj_mut().set(target.name, std::move(v));
    return;
  }
  if (target.kind == NodeKind::kTuple) {
    std::vector<Value> items = iterate(v);
    if (items.size() != target.a.size()) {
      raise(items.size() < target.a.size() ? "not enough values to unpack"
                                           : "too many values to unpack");
    }
    for (size_t i = 0; i < items.size(); ++i) assign(*target.a[i], std::move(items[i]), scope);
    return;
  }
  raise("cannot assign to this expression");
}

Control Interp::exec_for(const Node& n, Scope& scope, std::string& out) {
  Value iterable = eval(*n.y, scope);
  if (iterable.is_none()) raise("'NoneType' object is not iterable");
  Scope body;
  body.parent = &scope;
  Value list_value;
  if (iterable.is_array() && !n.z) {
    list_value = std::move(iterable);  // iterate the list itself, no copy
  } else {
    std::vector<Value> items = iterate(iterable);
    if (n.z) {  // loop filter: evaluated with the target bound, before `loop` exists
      std::vector<Value> kept;
      for (auto& item : items) {
        body.vars.clear();
        assign(*n.x, item, body);
        if (eval(*n.z, body).truthy()) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    list_value = Value::array(std::move(items));
  }
  if (list_value.arr().items.empty()) {
    body.vars.clear();
    exec(n.b, body, out);
    return Control::kNone;
  }
  auto* cell = new LoopCell();
  cell->length = static_cast<int64_t>(list_value.arr().items.size());
  cell->items = std::move(list_value);
  Value loop(Value::Type::kLoop, cell);
  const auto& list = cell->items.arr().items;
  for (size_t i = 0; i < list.size(); ++i) {
    cell->index0 = static_cast<int64_t>(i);
    body.vars.clear();  // every iteration starts from the enclosing scope (as jinja2)
    body.vars.emplace_back(t_.sym_loop, loop);
    assign(*n.x, list[i], body);
    Control c = exec(n.a, body, out);
    if (c == Control::kBreak) break;
  }
  return Control::kNone;
}

Control Interp::exec(const NodeList& stmts, Scope& scope, std::string& out) {
  Nested nested(*this);
  for (const auto& sp : stmts) {
    const Node& n = *sp;
    Control c = Control::kNone;
    switch (n.kind) {
      case NodeKind::kText:
        out.append(n.value.str());
        break;
      case NodeKind::kOutput:
        emit(*n.x, scope, out);
        break;
      case NodeKind::kIf:
        c = exec(eval(*n.x, scope).truthy() ? n.a : n.b, scope, out);
        break;
      case NodeKind::kFor:
        exec_for(n, scope, out);
        break;
      case NodeKind::kSet:
        assign(*n.x, eval(*n.y, scope), scope);
        break;
      case NodeKind::kBreak:
        return Control::kBreak;
      case NodeKind::kContinue:
        return Control::kContinue;
      default:
        c = exec_block(n, scope, out);
    }
    if (c != Control::kNone) return c;
    if (out.size() > kMaxOutputBytes) raise("template output too large (more than 256 MiB)");
  }
  return Control::kNone;
}

// The statements with bodies or locals of their own: set blocks, macros, filter blocks, with.
Control Interp::exec_block(const Node& n, Scope& scope, std::string& out) {
  // Filters of a block apply to its rendered body: the chain rebuilt on it.
  auto filter_body = [&](const Node* last, std::string body) {
    Value v(std::move(body));
    std::vector<const Node*> chain;
    for (const Node* f = last; f != nullptr; f = f->x.get()) chain.push_back(f);
    for (size_t i = chain.size(); i-- > 0;) {
      Args args = eval_args(*chain[i], scope);
      v = run_filter(*chain[i], std::move(v), args);
    }
    return v;
  };
  switch (n.kind) {
    case NodeKind::kSetBlock: {
      std::string body;
      exec(n.a, scope, body);
      assign(*n.x, filter_body(n.y.get(), std::move(body)), scope);
      return Control::kNone;
    }
    case NodeKind::kMacro: {
      auto* c = new CallableCell();
      c->kind = CallableCell::Kind::kMacro;
      c->macro = &n;
      c->closure = &scope;
      scope.set(n.sym, make_callable(c));
      return Control::kNone;
    }
    case NodeKind::kFilterBlock: {
      std::string body;
      exec(n.a, scope, body);
      append_str(filter_body(n.x.get(), std::move(body)), out);
      return Control::kNone;
    }
    case NodeKind::kWith: {
      Scope inner;
      inner.parent = &scope;
      for (const auto& s : n.b) assign(*s->x, eval(*s->y, scope), inner);
      return exec(n.a, inner, out);
    }
    default:
      raise("expression used as a statement");
  }
}

// ---- filters ----

bool Interp::run_test_by_name(std::string_view name, const Value& v,
                              const std::vector<Value>& args) {
  int id = find_name(kTestNames, name);
  if (id < 0) raise("no test named '" + std::string(name) + "'");
  return run_test(id, v, args);
}

// Dotted attribute path ("a.b.0") as jinja2's make_attrgetter.
Value attr_path(const Value& item, const std::string& path,
                const std::function<Value(const Value&, const Value&)>& getitem) {
  Value cur = item;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string part =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    int64_t idx;
    if (parse_py_int(part, idx) && !part.empty() && part[0] >= '0' && part[0] <= '9') {
      cur = getitem(cur, Value(idx));
    } else {
      cur = getitem(cur, Value(part));
    }
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return cur;
}

Value Interp::map_item(const Value& item, const std::string& filter_name, const Args& rest) {
  int id = find_name(kFilterNames, filter_name);
  if (id < 0) raise("no filter named '" + filter_name + "'");
  Node fake(NodeKind::kFilter);
  fake.id = id;
  fake.name = filter_name;
  return run_filter(fake, item, rest);
}

int sort_cmp(const Value& a, const Value& b, bool case_sensitive) {
  if (!case_sensitive && a.is_string() && b.is_string()) {
    std::string x = unicode::to_lower(a.str()), y = unicode::to_lower(b.str());
    int c = x.compare(y);
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  return py_cmp(a, b, "<");
}

Value Interp::run_filter(const Node& n, Value v, const Args& args) {
  auto getitem = [this](const Value& o, const Value& k) { return get_item(o, k); };
  auto str_or_empty = [](const Value& x) { return x.is_undefined() ? std::string() : to_str(x); };
  switch (static_cast<Filter>(n.id)) {
    case fSafe:
      return v;
    case fString:
      return Value(str_or_empty(v));
    case fE:
    case fEscape:
    case fForceescape:
      return Value(html_escape(str_or_empty(v)));
    case fTrim: {
      const Value* ch = args.get(0, "chars");
      std::string s = str_or_empty(v);
      return Value(py_strip(s, ch && ch->is_string() ? &ch->str() : nullptr, true, true));
    }
    case fUpper:
      return Value(unicode::to_upper(str_or_empty(v)));
    case fLower:
      return Value(unicode::to_lower(str_or_empty(v)));
    case fTitle:
      return Value(unicode::to_title(str_or_empty(v)));
    case fCapitalize: {
      std::string s = str_or_empty(v);
      return Value(unicode::capitalize(s));
    }
    case fLength:
    case fCount:
      return Value(py_len(v));
    case fWordcount: {
      std::string s = str_or_empty(v);
      int64_t count = 0;
      bool in_word = false;
      size_t i = 0;
      while (i < s.size()) {
        char32_t c = unicode::next_code_point(s, i);
        bool w = unicode::is_word_char(c);
        if (w && !in_word) ++count;
        in_word = w;
      }
      return Value(count);
    }
    case fCenter: {
      Args a;
      a.pos.emplace_back(int_arg(args.get(0, "width"), 80, "width"));
      return call_method(Value(str_or_empty(v)), "center", a);
    }
    case fD:
    case fDefault: {
      const Value* dflt = args.get(0, "default_value");
      const Value* boolean = args.get(1, "boolean");
      bool use = v.is_undefined() || (boolean && boolean->truthy() && !v.truthy());
      if (use) return dflt ? *dflt : Value(std::string());
      return v;
    }
    case fFirst: {
      if (v.is_undefined()) raise_undefined(v);
      auto items = iterate(v);
      if (items.empty()) return Value::undefined_named("No first item, sequence was empty.");
      return items.front();
    }
    case fLast: {
      if (v.is_undefined()) raise_undefined(v);
      auto items = iterate(v);
      if (items.empty()) return Value::undefined_named("No last item, sequence was empty.");
      return items.back();
    }
    case fList:
      if (v.is_array() && !v.is_tuple()) return v;
      return Value::array(iterate(v));
    case fReverse: {
      if (v.is_string()) {
        auto cps = code_points(v.str());
        std::string out;
        for (size_t i = cps.size(); i-- > 0;) out.append(cps[i]);
        return Value(std::move(out));
      }
      auto items = iterate(v);
      std::reverse(items.begin(), items.end());
      return Value::array(std::move(items));
    }
    case fJoin: {
      const Value* d = args.get(0, "d");
      const Value* attr = args.get(1, "attribute");
      std::string sep = d ? to_str(*d) : std::string();
      std::string out;
      bool first = true;
      for (const auto& x : iterate(v)) {
        if (!first) out.append(sep);
        first = false;
        if (attr && !attr->is_none()) {
          append_str(attr_path(x, to_str(*attr), getitem), out);
        } else {
          append_str(x, out);
        }
        check_string_size(out.size());
      }
      return Value(std::move(out));
    }
    case fInt: {
      const Value* d = args.get(0, "default");
      Value dflt = d ? *d : Value(int64_t{0});
      if (is_int_like(v)) return Value(int_of(v));
      if (v.is_float()) {
        double f = v.as_float();
        if (!std::isfinite(f)) return dflt;
        return Value(static_cast<int64_t>(std::trunc(f)));
      }
      if (v.is_string()) {
        int64_t i;
        if (parse_py_int(v.str(), i)) return Value(i);
        double f;
        if (parse_py_float(v.str(), f) && std::isfinite(f)) {
          return Value(static_cast<int64_t>(std::trunc(f)));
        }
      }
      return dflt;
    }
    case fFloat: {
      const Value* d = args.get(0, "default");
      Value dflt = d ? *d : Value(0.0);
      if (is_num_like(v)) return Value(num_of(v));
      if (v.is_string()) {
        double f;
        if (parse_py_float(v.str(), f)) return Value(f);
      }
      return dflt;
    }
    case fAbs:
      if (is_int_like(v)) return Value(static_cast<int64_t>(std::llabs(int_of(v))));
      if (v.is_float()) return Value(std::fabs(v.as_float()));
      raise(std::string("bad operand type for abs(): '") + type_name(v) + "'");
    case fRound: {
      if (!is_num_like(v)) raise("round() needs a number");
      int64_t precision = int_arg(args.get(0, "precision"), 0, "precision");
      std::string method = "common";
      if (const Value* m = args.get(1, "method")) method = str_arg(m, "method");
      double x = num_of(v), scale = std::pow(10.0, static_cast<double>(precision));
      double r;
      if (method == "ceil") {
        r = std::ceil(x * scale) / scale;
      } else if (method == "floor") {
        r = std::floor(x * scale) / scale;
      } else if (method == "common") {
        r = std::nearbyint(x * scale) / scale;  // round half to even, as Python
      } else {
        raise("method must be common, ceil or floor");
      }
      return Value(r);
    }
    case fAttr: {
      const std::string& name = str_arg(args.get(0, "name"), "attribute name");
      return get_attr(v, name);
    }
    case fItems: {
      if (v.is_undefined()) return Value::array({});
      if (!v.is_dict()) raise("items filter: can only get item pairs from a mapping");
      Args none;
      return call_method(v, "items", none);
    }
    case fDictsort: {
      if (!v.is_dict()) raise("dictsort filter: can only sort a mapping");
      bool cs = false;
      if (const Value* c = args.get(0, "case_sensitive")) cs = c->truthy();
      std::string by = "key";
      if (const Value* b = args.get(1, "by")) by = str_arg(b, "by");
      bool rev = false;
      if (const Value* r = args.get(2, "reverse")) rev = r->truthy();
      size_t pos = by == "key" ? 0 : 1;
      std::vector<Value> items;
      for (const auto& [k, x] : v.obj().items) items.push_back(Value::array({Value(k), x}, true));
      std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
        int c = sort_cmp(a.arr().items[pos], b.arr().items[pos], cs);
        return rev ? c > 0 : c < 0;
      });
      return Value::array(std::move(items));
    }
    case fSort: {
      bool rev = false, cs = false;
      if (const Value* r = args.get(0, "reverse")) rev = r->truthy();
      if (const Value* c = args.get(1, "case_sensitive")) cs = c->truthy();
      const Value* attr = args.get(2, "attribute");
      auto items = iterate(v);
      std::vector<Value> keys;
      keys.reserve(items.size());
      for (const auto& x : items) {
        keys.push_back(attr && !attr->is_none() ? attr_path(x, to_str(*attr), getitem) : x);
      }
      std::vector<size_t> order(items.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
      std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        int c = sort_cmp(keys[a], keys[b], cs);
        return rev ? c > 0 : c < 0;
      });
      std::vector<Value> out;
      out.reserve(order.size());
      for (size_t i : order) out.push_back(items[i]);
      return Value::array(std::move(out));
    }
    case fUnique: {
      bool cs = false;
      if (const Value* c = args.get(0, "case_sensitive")) cs = c->truthy();
      const Value* attr = args.get(1, "attribute");
      std::vector<Value> out, seen;
      for (const auto& x : iterate(v)) {
        Value key = attr && !attr->is_none() ? attr_path(x, to_str(*attr), getitem) : x;
        if (!cs && key.is_string()) key = Value(unicode::to_lower(key.str()));
        bool dup = false;
        for (const auto& s : seen) dup = dup || py_eq(s, key);
        if (dup) continue;
        seen.push_back(key);
        out.push_back(x);
      }
      return Value::array(std::move(out));
    }
    case fMin:
    case fMax: {
      bool cs = false;
      if (const Value* c = args.get(0, "case_sensitive")) cs = c->truthy();
      const Value* attr = args.get(1, "attribute");
      auto items = iterate(v);
      if (items.empty()) return Value::undefined_named("No aggregated item, sequence was empty.");
      size_t best = 0;
      auto key = [&](size_t i) {
        return attr && !attr->is_none() ? attr_path(items[i], to_str(*attr), getitem) : items[i];
      };
      for (size_t i = 1; i < items.size(); ++i) {
        int c = sort_cmp(key(i), key(best), cs);
        if (n.id == fMin ? c < 0 : c > 0) best = i;
      }
      return items[best];
    }
    case fSum: {
      const Value* attr = args.get(0, "attribute");
      const Value* start = args.get(1, "start");
      Value acc = start ? *start : Value(int64_t{0});
      for (const auto& x : iterate(v)) {
        acc = binop(BinOp::kAdd, acc,
                    attr && !attr->is_none() ? attr_path(x, to_str(*attr), getitem) : x);
      }
      return acc;
    }
    case fReplace: {
      std::string s = str_or_empty(v);
      const std::string& a = str_arg(args.get(0, "old"), "replace() old");
      Value b = args.get(1, "new") ? *args.get(1, "new") : Value("");
      return Value(py_replace(s, a, to_str(b), int_arg(args.get(2, "count"), -1, "count")));
    }
    case fIndent: {
      std::string s = str_or_empty(v);
      std::string unit = "    ";
      if (const Value* w = args.get(0, "width")) {
        unit = w->is_string()
                   ? w->str()
                   : std::string(static_cast<size_t>(std::max<int64_t>(0, int_arg(w, 4, "width"))),
                                 ' ');
      }
      bool first = false, blank = false;
      if (const Value* f = args.get(1, "first")) first = f->truthy();
      if (const Value* b = args.get(2, "blank")) blank = b->truthy();
      s.push_back('\n');
      auto lines = py_splitlines(s, false);
      std::string rv;
      if (blank) {
        for (size_t i = 0; i < lines.size(); ++i) {
          if (i) rv.append("\n").append(unit);
          rv.append(lines[i]);
        }
      } else {
        rv = lines.empty() ? std::string() : lines[0];
        for (size_t i = 1; i < lines.size(); ++i) {
          rv.push_back('\n');
          if (!lines[i].empty()) rv.append(unit);
          rv.append(lines[i]);
        }
      }
      if (first) rv = unit + rv;
      return Value(std::move(rv));
    }
    case fFormat: {
      // printf-style: %s %d %i %r %f %%, positional only.
      std::string f = str_or_empty(v), out;
      size_t k = 0;
      for (size_t i = 0; i < f.size(); ++i) {
        if (f[i] != '%') {
          out.push_back(f[i]);
          continue;
        }
        if (i + 1 >= f.size()) raise("incomplete format");
        char c = f[++i];
        if (c == '%') {
          out.push_back('%');
          continue;
        }
        if (k >= args.pos.size()) raise("not enough arguments for format string");
        const Value& a = args.pos[k++];
        if (c == 's') {
          append_str(a, out);
        } else if (c == 'r') {
          append_repr_of(a, out);
        } else if ((c == 'd' || c == 'i') && is_num_like(a)) {
          out.append(std::to_string(
              is_int_like(a) ? int_of(a) : static_cast<int64_t>(std::trunc(a.as_float()))));
        } else if (c == 'f' && is_num_like(a)) {
          char buf[64];
          std::snprintf(buf, sizeof(buf), "%f", num_of(a));
          out.append(buf);
        } else {
          raise(std::string("unsupported format character '") + c + "'");
        }
      }
      if (k < args.pos.size()) raise("not all arguments converted during string formatting");
      return Value(std::move(out));
    }
    case fMap: {
      auto items = iterate(v);
      std::vector<Value> out;
      out.reserve(items.size());
      const Value* attr = nullptr;
      const Value* dflt = nullptr;
      for (const auto& [k, x] : args.kw) {
        if (k == "attribute") attr = &x;
        if (k == "default") dflt = &x;
      }
      if (attr) {
        for (const auto& x : items) {
          Value r = attr_path(x, to_str(*attr), getitem);
          if (r.is_undefined() && dflt) r = *dflt;
          out.push_back(std::move(r));
        }
        return Value::array(std::move(out));
      }
      if (args.pos.empty()) raise("map requires a filter name or attribute=");
      std::string fname = str_arg(&args.pos[0], "filter name");
      Args rest;
      rest.pos.assign(args.pos.begin() + 1, args.pos.end());
      rest.kw = args.kw;
      for (const auto& x : items) out.push_back(map_item(x, fname, rest));
      return Value::array(std::move(out));
    }
    case fSelect:
    case fReject:
    case fSelectattr:
    case fRejectattr: {
      bool by_attr = n.id == fSelectattr || n.id == fRejectattr;
      bool select = n.id == fSelect || n.id == fSelectattr;
      size_t at = 0;
      std::string attr;
      if (by_attr) {
        if (args.pos.empty()) raise("selectattr/rejectattr need an attribute name");
        attr = str_arg(&args.pos[0], "attribute");
        at = 1;
      }
      std::string test;
      std::vector<Value> targs;
      if (args.pos.size() > at) {
        test = str_arg(&args.pos[at], "test name");
        targs.assign(args.pos.begin() + static_cast<long>(at) + 1, args.pos.end());
      }
      std::vector<Value> out;
      for (const auto& x : iterate(v)) {
        Value subject = by_attr ? attr_path(x, attr, getitem) : x;
        bool ok = test.empty() ? subject.truthy() : run_test_by_name(test, subject, targs);
        if (ok == select) out.push_back(x);
      }
      return Value::array(std::move(out));
    }
    case fTojson: {
      // transformers: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
      JsonOptions o;
      if (const Value* a = args.get(0, "ensure_ascii")) o.ensure_ascii = a->truthy();
      if (const Value* ind = args.get(1, "indent"); ind && !ind->is_none()) {
        if (ind->is_string()) {
          o.indent_text = ind->str();
          if (o.indent_text.empty()) o.indent = 0;
        } else {
          o.indent = static_cast<int>(std::max<int64_t>(0, int_arg(ind, 0, "indent")));
        }
      }
      if (const Value* sep = args.get(2, "separators"); sep && !sep->is_none()) {
        if (!sep->is_array() || sep->arr().items.size() != 2 || !sep->arr().items[0].is_string() ||
            !sep->arr().items[1].is_string()) {
          raise("separators must be a pair of strings");
        }
        o.custom_separators = true;
        o.item_separator = sep->arr().items[0].str();
        o.key_separator = sep->arr().items[1].str();
      }
      if (const Value* sk = args.get(3, "sort_keys")) o.sort_keys = sk->truthy();
      std::string out, err;
      if (!to_json(v, o, out, err)) raise(err);
      return Value(std::move(out));
    }
  }
  raise("unsupported filter '" + n.name + "'");
}

// ---- tests ----

bool Interp::run_test(int id, const Value& v, const std::vector<Value>& args) {
  auto arg0 = [&]() -> const Value& {
    if (args.empty())
      raise("test '" + std::string(kTestNames[static_cast<size_t>(id)]) + "' needs an argument");
    return args[0];
  };
  switch (static_cast<Test>(id)) {
    case tDefined:
      return !v.is_undefined();
    case tUndefined:
      return v.is_undefined();
    case tNone:
      return v.is_none();
    case tBoolean:
      return v.is_bool();
    case tFalse:
      return v.is_bool() && !v.as_bool();
    case tTrue:
      return v.is_bool() && v.as_bool();
    case tInteger:
      return v.is_int();
    case tFloat:
      return v.is_float();
    case tNumber:
      return v.is_number() || v.is_bool();
    case tString:
      return v.is_string();
    case tMapping:
      return v.is_dict();
    case tIterable:
      return v.is_array() || v.is_dict() || v.is_string() || v.is_undefined();
    case tSequence:
      return v.is_array() || v.is_dict() || v.is_string();
    case tCallable:
      return v.is_callable();
    case tEscaped:
      return false;
    case tLower:
      return v.is_string() && unicode::to_lower(v.str()) == v.str();
    case tUpper:
      return v.is_string() && unicode::to_upper(v.str()) == v.str();
    case tOdd:
    case tEven: {
      if (!is_int_like(v)) raise("odd/even tests need an integer");
      bool odd = (int_of(v) % 2) != 0;
      return id == tOdd ? odd : !odd;
    }
    case tDivisibleby: {
      const Value& d = arg0();
      if (!is_int_like(v) || !is_int_like(d) || int_of(d) == 0) raise("divisibleby needs integers");
      return int_of(v) % int_of(d) == 0;
    }
    case tEq:
    case tEqualto:
      return py_eq(v, arg0());
    case tNe:
      return !py_eq(v, arg0());
    case tLt:
    case tLessthan:
      return py_cmp(v, arg0(), "<") < 0;
    case tLe:
      return py_cmp(v, arg0(), "<=") <= 0;
    case tGt:
    case tGreaterthan:
      return py_cmp(v, arg0(), ">") > 0;
    case tGe:
      return py_cmp(v, arg0(), ">=") >= 0;
    case tIn:
      return contains(arg0(), v);
    case tSameas: {
      const Value& o = arg0();
      if (v.type() != o.type()) return false;
      switch (v.type()) {
        case Value::Type::kNone:
        case Value::Type::kUndefined:
          return true;
        case Value::Type::kBool:
          return v.as_bool() == o.as_bool();
        case Value::Type::kInt:
          return v.as_int() == o.as_int();
        case Value::Type::kFloat:
          return false;
        default:
          return v.cell() == o.cell();
      }
    }
  }
  return false;
}

}  // namespace

void set_render_step_limit(uint64_t steps) {
  render_step_limit = steps;
}

bool Template::render(const std::vector<std::pair<std::string, Value>>& variables, std::string& out,
                      std::string& error) const {
  Interp interp(*impl_);
  Scope root;
  root.vars.reserve(variables.size() + 8);
  for (const auto& [name, value] : variables) {
    auto it = impl_->symbols.find(name);
    if (it == impl_->symbols.end()) continue;  // the template never names it
    root.set(it->second, value);
  }
  try {
    interp.exec(impl_->body, root, out);
  } catch (const RenderError& e) {
    error = "chat template: " + e.message;
    return false;
  }
  return true;
}

}  // namespace kvgate::tokenizer::jinja
