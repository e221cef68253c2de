// tokenizer/jinja: the subset of Jinja that chat templates use, with the semantics of Python's
// jinja2 as transformers runs it (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
// loopcontrols, its own tojson, raise_exception and strftime_now). That is what the engine renders,
// so it is the behaviour to match; tests/conformance also checks every prompt against
// @huggingface/jinja where the two agree.
//
// Supported: {{ }} / {% %} / {# #} with -/+ whitespace control, raw; statements if/elif/else,
// for (else, loop filter, tuple targets, break/continue, loop.index/index0/revindex/revindex0/
// first/last/length/previtem/nextitem/cycle/depth), set (expression, block, tuple, namespace
// attribute), macro (defaults, keyword arguments), with, filter blocks, generation; expressions
// with Python precedence (and/or/not, chained comparisons, in/not in, is [not] tests, + - * / // %
// ** ~, conditional expressions, literals, tuples, lists, dicts, attribute/item access, slicing
// with steps, calls with keyword arguments); the filters, tests, globals and str/dict/list methods
// listed in jinja.cc. A template that names anything else fails to load with a message naming it.
//
// Values are reference counted without atomics: one render (and the values it is given) belongs
// to one thread at a time. A parsed Template is immutable and may render on many threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvgate::tokenizer::jinja {

class Value;
struct Array;
struct Object;

struct HeapCell {
  uint32_t refs = 1;
  bool immortal = false;  // shared read-only (template constants): never counted
  virtual ~HeapCell() = default;
};

class Value {
 public:
  enum class Type : uint8_t {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kArray,   // list or tuple
    kObject,  // dict or namespace
    kCallable,
    kLoop,
  };

  Value() : type_(Type::kUndefined) { u_.p = nullptr; }
  static Value none() { return Value(Type::kNone); }
  // An undefined value that fails with `message` when used.
  static Value undefined_named(std::string_view message);
  // An undefined attribute: "'<type> object' has no attribute '<name>'" (formatted on use).
  static Value undefined_attribute(const char* type, std::string_view name);
  explicit Value(bool b) : type_(Type::kBool) { u_.b = b; }
  explicit Value(int64_t i) : type_(Type::kInt) { u_.i = i; }
  explicit Value(int i) : type_(Type::kInt) { u_.i = i; }
  explicit Value(double f) : type_(Type::kFloat) { u_.f = f; }
  explicit Value(std::string s);
  explicit Value(std::string_view s) : Value(std::string(s)) {}
  explicit Value(const char* s) : Value(std::string(s)) {}
  static Value array(std::vector<Value> items, bool tuple = false);
  static Value object();  // empty dict
  static Value make_namespace();
  // Internal: wraps a heap cell of the given type (takes the reference).
  Value(Type t, HeapCell* cell) : type_(t) { u_.p = cell; }

  Value(const Value& o) : type_(o.type_), u_(o.u_) { retain(); }
  Value(Value&& o) noexcept : type_(o.type_), u_(o.u_) {
    o.type_ = Type::kUndefined;
    o.u_.p = nullptr;
  }
  Value& operator=(const Value& o) {
    if (this != &o) {
      o.retain();
      release();
      type_ = o.type_;
      u_ = o.u_;
    }
    return *this;
  }
  Value& operator=(Value&& o) noexcept {
    if (this != &o) {
      release();
      type_ = o.type_;
      u_ = o.u_;
      o.type_ = Type::kUndefined;
      o.u_.p = nullptr;
    }
    return *this;
  }
  ~Value() { release(); }

  Type type() const { return type_; }
  bool is_undefined() const { return type_ == Type::kUndefined; }
  bool is_none() const { return type_ == Type::kNone; }
  bool is_bool() const { return type_ == Type::kBool; }
  bool is_int() const { return type_ == Type::kInt; }
  bool is_float() const { return type_ == Type::kFloat; }
  bool is_number() const { return type_ == Type::kInt || type_ == Type::kFloat; }
  bool is_string() const { return type_ == Type::kString; }
  bool is_array() const { return type_ == Type::kArray; }
  bool is_tuple() const;
  bool is_object() const { return type_ == Type::kObject; }
  bool is_namespace() const;
  bool is_dict() const { return is_object() && !is_namespace(); }
  bool is_callable() const { return type_ == Type::kCallable; }

  bool as_bool() const { return u_.b; }
  int64_t as_int() const { return u_.i; }
  double as_float() const { return u_.f; }
  double as_number() const { return type_ == Type::kInt ? static_cast<double>(u_.i) : u_.f; }
  const std::string& str() const;  // kString only
  const Array& arr() const;        // kArray only
  Array& arr_mut();
  const Object& obj() const;  // kObject only
  Object& obj_mut();
  HeapCell* cell() const { return u_.p; }
  // Why an undefined value is undefined (the error raised when it is used).
  std::string undefined_message() const;

  // Marks this value and everything it holds as shared constants (never counted again).
  void make_immortal();
  // Frees a constant made by make_immortal (its owner, the template, is going away); leaves
  // this value undefined. No-op on counted values.
  void free_immortal();

  // Python truthiness.
  bool truthy() const;

 private:
  explicit Value(Type t) : type_(t) { u_.p = nullptr; }
  bool heap() const { return type_ >= Type::kString || (type_ == Type::kUndefined && u_.p); }
  void retain() const {
    if (heap() && u_.p && !u_.p->immortal) ++u_.p->refs;
  }
  void release() {
    if (heap() && u_.p && !u_.p->immortal && --u_.p->refs == 0) free_cell(type_, u_.p);
  }
  // Frees a cell whose count reached zero, and what it alone held, without recursing: a list
  // nested 100,000 deep (a template can build one in a loop) is freed one level at a time.
  static void free_cell(Type type, HeapCell* cell) noexcept;
  Type type_;
  union U {
    bool b;
    int64_t i;
    double f;
    HeapCell* p;
  } u_;
};

struct StringCell : HeapCell {
  std::string s;
};
struct UndefinedCell : HeapCell {
  std::string name;
  const char* owner_type = nullptr;  // set: `name` is an attribute of an object of that type
};
struct Array : HeapCell {
  std::vector<Value> items;
  bool tuple = false;
};
struct Object : HeapCell {
  std::vector<std::pair<std::string, Value>> items;  // insertion order
  bool is_namespace = false;
  const Value* find(std::string_view key) const {
    for (const auto& [k, v] : items) {
      if (k == key) return &v;
    }
    return nullptr;
  }
  Value* find(std::string_view key) {
    for (auto& [k, v] : items) {
      if (k == key) return &v;
    }
    return nullptr;
  }
  void set(std::string_view key, Value v) {
    if (Value* p = find(key)) {
      *p = std::move(v);
    } else {
      items.emplace_back(std::string(key), std::move(v));
    }
  }
};

// A runtime error of a render, with its message: what the interpreter throws (and Template::render
// reports), and what append_str / to_str throw for a value nested too deeply.
struct RenderError {
  std::string message;
};

// Deepest nesting of lists, tuples, dicts and namespaces that printing, comparing and tojson walk
// (they recurse, one level per level); deeper fails the render, as Python's RecursionError does.
// It is simdjson's depth limit, so any value that came from JSON (request messages, tools,
// chat_template_kwargs, the tokenizer config) is within it; only template source, building
// values in a loop, can go deeper.
inline constexpr int kMaxValueDepth = 1024;

// JSON text -> Value (objects keep their key order; integers stay integers, 1.0 stays a float).
// Returns false with `error` set on malformed JSON.
bool from_json(std::string_view json, Value& out, std::string& error);
// Capacity of the calling thread's from_json parser: at most json::kParserRetainedBytes between
// calls, whatever the largest document was (for tests).
size_t from_json_parser_capacity();

// `json` with every integer literal too large for 64 bits written as a float (1e30 -> "1...0.0"),
// for JSON parsers that reject what Python's json module accepts.
std::string widen_big_integers(std::string_view json);

// Python's str() of a value (what {{ }} prints): None, True, 1.5, [1, 'a'], {'k': 'v'}. Throws
// RenderError for a value nested more than kMaxValueDepth deep.
void append_str(const Value& v, std::string& out);
std::string to_str(const Value& v);
// json.dumps(v, ensure_ascii=..., indent=..., separators=..., sort_keys=...) as transformers'
// tojson filter. indent < 0: none. Returns false (error set) for values JSON cannot hold and for
// values nested more than kMaxValueDepth deep.
struct JsonOptions {
  int indent = -1;
  std::string indent_text;  // when set, used instead of `indent` spaces
  bool ensure_ascii = false;
  bool sort_keys = false;
  std::string item_separator;  // default ", " (or "," with indent)
  std::string key_separator;   // default ": "
  bool custom_separators = false;
};
bool to_json(const Value& v, const JsonOptions& options, std::string& out, std::string& error);

// For fuzz targets: renders on the calling thread fail ("template ran too long") after `steps`
// steps of evaluation (statements and expressions evaluated); 0, the default, is no limit.
// kvgate sets none: templates are the operator's, as in Python. A fuzzer needs one, or the loops
// it nests in each other run for minutes and build values that fill its memory: failures, to it,
// that are no bug.
void set_render_step_limit(uint64_t steps);

// A parsed template.
class Template {
 public:
  // Parses `source`. nullptr with `error` (line and construct) when the template is malformed or
  // uses something this engine does not implement.
  static std::unique_ptr<Template> parse(std::string_view source, std::string& error);
  ~Template();
  Template(const Template&) = delete;
  Template& operator=(const Template&) = delete;

  // Renders with the given top-level variables. False with `error` set on a runtime error
  // (raise_exception's message, a type error, an undefined attribute access...).
  bool render(const std::vector<std::pair<std::string, Value>>& variables, std::string& out,
              std::string& error) const;

  struct Impl;

 private:
  explicit Template(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvgate::tokenizer::jinja
