// tokenizer/jinja_value: Value construction, JSON in and out, and Python's str()/repr() of values.
#include <simdjson.h>
#include <unicode/uchar.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <new>
#include <utility>
#include <vector>

#include "tokenizer/jinja.h"
#include "tokenizer/jinja_internal.h"
#include "tokenizer/unicode.h"
#include "util/json.h"
#include "util/json_parser.h"

namespace kvgate::tokenizer::jinja {

Value Value::undefined_named(std::string_view message) {
  auto* c = new UndefinedCell();
  c->name = std::string(message);
  return Value(Type::kUndefined, c);
}

Value Value::undefined_attribute(const char* type, std::string_view name) {
  auto* c = new UndefinedCell();
  c->name = std::string(name);
  c->owner_type = type;
  return Value(Type::kUndefined, c);
}

Value::Value(std::string s) : type_(Type::kString) {
  auto* c = new StringCell();
  c->s = std::move(s);
  u_.p = c;
}

Value Value::array(std::vector<Value> items, bool tuple) {
  auto* a = new Array();
  a->items = std::move(items);
  a->tuple = tuple;
  return Value(Type::kArray, a);
}

Value Value::object() {
  return Value(Type::kObject, new Object());
}

Value Value::make_namespace() {
  auto* o = new Object();
  o->is_namespace = true;
  return Value(Type::kObject, o);
}

namespace {

// While a cell is being freed, the cells its values release to zero wait here instead of being
// freed from inside its destructor, which would recurse once per level of nesting.
thread_local std::vector<HeapCell*>* cells_to_free = nullptr;

}  // namespace

void Value::free_cell(Type type, HeapCell* cell) noexcept {
  if (type == Type::kString || type == Type::kUndefined) {  // these hold no values
    delete cell;
    return;
  }
  if (cells_to_free != nullptr) {
    try {
      cells_to_free->push_back(cell);
      return;
    } catch (const std::bad_alloc&) {
      // No memory to list it: free it here instead, recursing (only as deep as memory allowed).
      auto* list = std::exchange(cells_to_free, nullptr);
      delete cell;
      cells_to_free = list;
      return;
    }
  }
  std::vector<HeapCell*> pending;
  cells_to_free = &pending;
  delete cell;
  while (!pending.empty()) {
    HeapCell* next = pending.back();
    pending.pop_back();
    delete next;
  }
  cells_to_free = nullptr;
}

bool Value::is_tuple() const {
  return is_array() && arr().tuple;
}
bool Value::is_namespace() const {
  return is_object() && obj().is_namespace;
}
const std::string& Value::str() const {
  return static_cast<const StringCell*>(u_.p)->s;
}
const Array& Value::arr() const {
  return *static_cast<const Array*>(u_.p);
}
Array& Value::arr_mut() {
  return *static_cast<Array*>(u_.p);
}
const Object& Value::obj() const {
  return *static_cast<const Object*>(u_.p);
}
Object& Value::obj_mut() {
  return *static_cast<Object*>(u_.p);
}

std::string Value::undefined_message() const {
  if (type_ != Type::kUndefined || u_.p == nullptr) return "value is undefined";
  const auto* c = static_cast<const UndefinedCell*>(u_.p);
  if (c->owner_type)
    return "'" + std::string(c->owner_type) + " object' has no attribute '" + c->name + "'";
  return c->name;
}

void Value::make_immortal() {
  if (!heap() || u_.p == nullptr) return;
  u_.p->immortal = true;
  if (type_ == Type::kArray) {
    for (auto& v : arr_mut().items) v.make_immortal();
  } else if (type_ == Type::kObject) {
    for (auto& kv : obj_mut().items) kv.second.make_immortal();
  }
}

void Value::free_immortal() {
  if (!heap() || u_.p == nullptr || !u_.p->immortal) return;
  if (type_ == Type::kArray) {
    for (auto& v : arr_mut().items) v.free_immortal();
  } else if (type_ == Type::kObject) {
    for (auto& kv : obj_mut().items) kv.second.free_immortal();
  }
  delete u_.p;
  u_.p = nullptr;
  type_ = Type::kUndefined;
}

bool Value::truthy() const {
  switch (type_) {
    case Type::kUndefined:
    case Type::kNone:
      return false;
    case Type::kBool:
      return u_.b;
    case Type::kInt:
      return u_.i != 0;
    case Type::kFloat:
      return u_.f != 0.0;
    case Type::kString:
      return !str().empty();
    case Type::kArray:
      return !arr().items.empty();
    case Type::kObject:
      return is_namespace() || !obj().items.empty();
    case Type::kCallable:
    case Type::kLoop:
      return true;
  }
  return false;
}

// ---- JSON in ----

// Whatever simdjson parses, printing and tojson can walk.
static_assert(kMaxValueDepth >= static_cast<int>(simdjson::DEFAULT_MAX_DEPTH));

namespace {

Value convert(simdjson::dom::element e) {
  switch (e.type()) {
    case simdjson::dom::element_type::ARRAY: {
      std::vector<Value> items;
      simdjson::dom::array a = e.get_array().value_unsafe();
      items.reserve(a.size());
      for (auto x : a) items.push_back(convert(x));
      return Value::array(std::move(items));
    }
    case simdjson::dom::element_type::OBJECT: {
      Value v = Value::object();
      auto& items = v.obj_mut().items;
      simdjson::dom::object o = e.get_object().value_unsafe();
      for (auto [k, x] : o) {
        std::string key(k);
        // A repeated key keeps its first position and its last value (as Python's json.loads).
        bool found = false;
        for (auto& kv : items) {
          if (kv.first == key) {
            kv.second = convert(x);
            found = true;
            break;
          }
        }
        if (!found) items.emplace_back(std::move(key), convert(x));
      }
      return v;
    }
    case simdjson::dom::element_type::INT64:
      return Value(e.get_int64().value_unsafe());
    case simdjson::dom::element_type::UINT64:
      return Value(static_cast<double>(e.get_uint64().value_unsafe()));
    case simdjson::dom::element_type::DOUBLE:
      return Value(e.get_double().value_unsafe());
    case simdjson::dom::element_type::STRING:
      return Value(std::string(e.get_string().value_unsafe()));
    case simdjson::dom::element_type::BOOL:
      return Value(e.get_bool().value_unsafe());
    case simdjson::dom::element_type::NULL_VALUE:
      return Value::none();
  }
  return Value::none();
}

}  // namespace

std::string widen_big_integers(std::string_view json) {
  std::string out;
  out.reserve(json.size() + 16);
  bool in_string = false;
  for (size_t i = 0; i < json.size(); ++i) {
    char c = json[i];
    if (in_string) {
      out.push_back(c);
      if (c == '\\' && i + 1 < json.size()) {
        out.push_back(json[++i]);
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
      out.push_back(c);
      continue;
    }
    if ((c >= '0' && c <= '9') || c == '-') {
      size_t j = i + (c == '-' ? 1 : 0);
      size_t digits_start = j;
      while (j < json.size() && json[j] >= '0' && json[j] <= '9') ++j;
      bool integer = j >= json.size() || (json[j] != '.' && json[j] != 'e' && json[j] != 'E');
      if (integer && j - digits_start >= 19) {
        // Correctly rounded (as Python's float()), written back in shortest form.
        double d = std::strtod(std::string(json.substr(i, j - i)).c_str(), nullptr);
        char buf[32];
        auto r = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
        out.append(buf, static_cast<size_t>(r.ptr - buf));
      } else {
        out.append(json.substr(i, j - i));
      }
      i = j - 1;
      continue;
    }
    out.push_back(c);
  }
  return out;
}

namespace {

// The thread's from_json parser (chat requests' messages pass through it: released after an
// outsized one).
simdjson::dom::parser& from_json_parser() {
  thread_local simdjson::dom::parser parser;
  return parser;
}

}  // namespace

size_t from_json_parser_capacity() {
  return from_json_parser().capacity();
}

bool from_json(std::string_view json, Value& out, std::string& error) {
  simdjson::dom::parser& parser = from_json_parser();
  kvgate::json::ParserRelease release(parser);  // after convert(): the Value owns copies
  simdjson::padded_string padded(json);
  simdjson::dom::element root;
  auto e = parser.parse(padded).get(root);
  std::string widened;
  if (e == simdjson::NUMBER_ERROR) {
    widened = widen_big_integers(json);
    padded = simdjson::padded_string(widened);
    e = parser.parse(padded).get(root);
  }
  if (e) {
    error = std::string("invalid JSON: ") + simdjson::error_message(e);
    return false;
  }
  out = convert(root);
  return true;
}

// ---- numbers ----

void append_float(double d, std::string& out) {
  if (std::isnan(d)) {
    out.append("nan");
    return;
  }
  if (std::isinf(d)) {
    out.append(d < 0 ? "-inf" : "inf");
    return;
  }
  if (d == 0.0) {
    out.append(std::signbit(d) ? "-0.0" : "0.0");
    return;
  }
  // Shortest round-trip digits, then Python's repr layout: fixed for 1e-4 <= |d| < 1e16.
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string_view sci(buf, static_cast<size_t>(r.ptr - buf));
  bool neg = sci[0] == '-';
  if (neg) sci.remove_prefix(1);
  size_t e_pos = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e_pos)) {
    if (c != '.') digits.push_back(c);
  }
  int exp = std::atoi(std::string(sci.substr(e_pos + 1)).c_str());
  if (neg) out.push_back('-');
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out.append("0.");
      out.append(static_cast<size_t>(-exp - 1), '0');
      out.append(digits);
    } else {
      auto int_len = static_cast<size_t>(exp) + 1;
      if (digits.size() <= int_len) {
        out.append(digits);
        out.append(int_len - digits.size(), '0');
        out.append(".0");
      } else {
        out.append(digits, 0, int_len);
        out.push_back('.');
        out.append(digits, int_len, std::string::npos);
      }
    }
    return;
  }
  out.push_back(digits[0]);
  if (digits.size() > 1) {
    out.push_back('.');
    out.append(digits, 1, std::string::npos);
  }
  out.push_back('e');
  out.push_back(exp < 0 ? '-' : '+');
  int a = std::abs(exp);
  if (a < 10) out.push_back('0');
  out.append(std::to_string(a));
}

// ---- str() / repr() ----

namespace {

bool is_printable(char32_t c) {
  if (c == ' ') return true;
  if (c < 0x20 || c == 0x7F) return false;
  if (c < 0x7F) return true;
  int8_t t = u_charType(static_cast<UChar32>(c));
  return !(t == U_CONTROL_CHAR || t == U_FORMAT_CHAR || t == U_SURROGATE ||
           t == U_PRIVATE_USE_CHAR || t == U_UNASSIGNED || t == U_LINE_SEPARATOR ||
           t == U_PARAGRAPH_SEPARATOR || t == U_SPACE_SEPARATOR);
}

void append_hex(uint32_t v, int digits, std::string& out) {
  static const char* kHex = "0123456789abcdef";
  for (int i = digits - 1; i >= 0; --i) out.push_back(kHex[(v >> (4 * i)) & 0xF]);
}

void append_str_repr(const std::string& s, std::string& out) {
  char quote = '\'';
  if (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) quote = '"';
  out.push_back(quote);
  size_t i = 0;
  while (i < s.size()) {
    size_t start = i;
    char32_t c = unicode::next_code_point(s, i);
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\n') {
      out.append("\\n");
    } else if (c == '\r') {
      out.append("\\r");
    } else if (c == '\t') {
      out.append("\\t");
    } else if (is_printable(c)) {
      out.append(s, start, i - start);
    } else if (c < 0x100) {
      out.append("\\x");
      append_hex(c, 2, out);
    } else if (c < 0x10000) {
      out.append("\\u");
      append_hex(c, 4, out);
    } else {
      out.append("\\U");
      append_hex(c, 8, out);
    }
  }
  out.push_back(quote);
}

void append_repr(const Value& v, std::string& out, int depth);
void append_str_at(const Value& v, std::string& out, int depth);

// Namespaces being printed on this thread. They are the only values that can hold themselves
// (templates mutate nothing else); like Python's repr, one met again inside itself prints {...}.
thread_local std::vector<const Object*> printing_namespaces;

// `depth`: how many containers hold v.
void append_container(const Value& v, std::string& out, int depth) {
  if (depth >= kMaxValueDepth) {
    throw RenderError{"value nested too deeply to print (more than " +
                      std::to_string(kMaxValueDepth) + " levels)"};
  }
  if (v.is_array()) {
    const auto& items = v.arr().items;
    out.push_back(v.is_tuple() ? '(' : '[');
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out.append(", ");
      append_repr(items[i], out, depth + 1);
    }
    if (v.is_tuple() && items.size() == 1) out.push_back(',');
    out.push_back(v.is_tuple() ? ')' : ']');
    return;
  }
  const auto& items = v.obj().items;
  struct Printing {
    ~Printing() {
      if (on) printing_namespaces.pop_back();
    }
    bool on = false;
  } printing;
  if (v.is_namespace()) {
    out.append("<Namespace ");
    auto& p = printing_namespaces;
    if (std::find(p.begin(), p.end(), &v.obj()) != p.end()) {
      out.append("{...}>");
      return;
    }
    p.push_back(&v.obj());
    printing.on = true;
  }
  out.push_back('{');
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out.append(", ");
    append_str_repr(items[i].first, out);
    out.append(": ");
    append_repr(items[i].second, out, depth + 1);
  }
  out.push_back('}');
  if (v.is_namespace()) out.push_back('>');
}

void append_repr(const Value& v, std::string& out, int depth) {
  if (v.is_string()) {
    append_str_repr(v.str(), out);
  } else if (v.is_undefined()) {
    out.append("Undefined");
  } else {
    append_str_at(v, out, depth);
  }
}

void append_str_at(const Value& v, std::string& out, int depth) {
  switch (v.type()) {
    case Value::Type::kUndefined:
      return;
    case Value::Type::kNone:
      out.append("None");
      return;
    case Value::Type::kBool:
      out.append(v.as_bool() ? "True" : "False");
      return;
    case Value::Type::kInt: {
      char buf[24];
      auto r = std::to_chars(buf, buf + sizeof(buf), v.as_int());
      out.append(buf, static_cast<size_t>(r.ptr - buf));
      return;
    }
    case Value::Type::kFloat:
      append_float(v.as_float(), out);
      return;
    case Value::Type::kString:
      out.append(v.str());
      return;
    case Value::Type::kArray:
    case Value::Type::kObject:
      append_container(v, out, depth);
      return;
    case Value::Type::kCallable:
      out.append("<function>");
      return;
    case Value::Type::kLoop:
      out.append("<LoopContext>");
      return;
  }
}

}  // namespace

void append_str(const Value& v, std::string& out) {
  append_str_at(v, out, 0);
}

std::string to_str(const Value& v) {
  std::string s;
  append_str(v, s);
  return s;
}

void append_repr_of(const Value& v, std::string& out) {
  append_repr(v, out, 0);
}

// ---- JSON out (Python's json.dumps) ----

namespace {

void json_string(std::string_view s, bool ensure_ascii, std::string& out) {
  // Without ensure_ascii, Python escapes what every JSON writer escapes (values are valid UTF-8).
  if (!ensure_ascii) {
    json::append_string(out, s);
    return;
  }
  out.push_back('"');
  size_t i = 0;
  while (i < s.size()) {
    auto b = static_cast<unsigned char>(s[i]);
    if (b < 0x80) {
      ++i;
      switch (b) {
        case '"':
          out.append("\\\"");
          break;
        case '\\':
          out.append("\\\\");
          break;
        case '\n':
          out.append("\\n");
          break;
        case '\r':
          out.append("\\r");
          break;
        case '\t':
          out.append("\\t");
          break;
        case '\b':
          out.append("\\b");
          break;
        case '\f':
          out.append("\\f");
          break;
        default:
          if (b < 0x20 || b == 0x7F) {
            out.append("\\u00");
            append_hex(b, 2, out);
          } else {
            out.push_back(static_cast<char>(b));
          }
      }
      continue;
    }
    char32_t c = unicode::next_code_point(s, i);
    if (c < 0x10000) {
      out.append("\\u");
      append_hex(c, 4, out);
    } else {
      char32_t v = c - 0x10000;
      out.append("\\u");
      append_hex(0xD800 + (v >> 10), 4, out);
      out.append("\\u");
      append_hex(0xDC00 + (v & 0x3FF), 4, out);
    }
  }
  out.push_back('"');
}

// One json.dumps call: the options' strings, worked out once.
struct JsonWriter {
  JsonWriter(const JsonOptions& o, std::string& out, std::string& error)
      : o(o),
        indent(o.indent >= 0 || !o.indent_text.empty()),
        unit(o.indent_text.empty() && o.indent >= 0
                 ? std::string(static_cast<size_t>(o.indent), ' ')
                 : o.indent_text),
        item_sep(o.custom_separators ? o.item_separator : (indent ? "," : ", ")),
        key_sep(o.custom_separators ? o.key_separator : ": "),
        out(out),
        error(error) {}

  void newline(int d) {
    out.push_back('\n');
    for (int k = 0; k < d; ++k) out.append(unit);
  }
  // `depth`: how many containers hold v.
  bool value(const Value& v, int depth);

  const JsonOptions& o;
  bool indent;
  std::string unit, item_sep, key_sep;
  std::string& out;
  std::string& error;
};

bool JsonWriter::value(const Value& v, int depth) {
  if ((v.is_array() || v.is_object()) && depth >= kMaxValueDepth) {
    error = "value nested too deeply for JSON (more than " + std::to_string(kMaxValueDepth) +
            " levels)";
    return false;
  }
  switch (v.type()) {
    case Value::Type::kNone:
      out.append("null");
      return true;
    case Value::Type::kBool:
      out.append(v.as_bool() ? "true" : "false");
      return true;
    case Value::Type::kInt:
      append_str(v, out);
      return true;
    case Value::Type::kFloat: {
      double d = v.as_float();
      if (std::isnan(d)) {
        out.append("NaN");
      } else if (std::isinf(d)) {
        out.append(d < 0 ? "-Infinity" : "Infinity");
      } else {
        append_float(d, out);
      }
      return true;
    }
    case Value::Type::kString:
      json_string(v.str(), o.ensure_ascii, out);
      return true;
    case Value::Type::kArray: {
      const auto& items = v.arr().items;
      if (items.empty()) {
        out.append("[]");
        return true;
      }
      out.push_back('[');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out.append(item_sep);
        if (indent) newline(depth + 1);
        if (!value(items[i], depth + 1)) return false;
      }
      if (indent) newline(depth);
      out.push_back(']');
      return true;
    }
    case Value::Type::kObject: {
      if (v.is_namespace()) {
        error = "Object of type Namespace is not JSON serializable";
        return false;
      }
      const auto& items = v.obj().items;
      if (items.empty()) {
        out.append("{}");
        return true;
      }
      std::vector<size_t> order(items.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
      if (o.sort_keys) {
        std::stable_sort(order.begin(), order.end(),
                         [&](size_t a, size_t b) { return items[a].first < items[b].first; });
      }
      out.push_back('{');
      for (size_t k = 0; k < order.size(); ++k) {
        if (k) out.append(item_sep);
        if (indent) newline(depth + 1);
        json_string(items[order[k]].first, o.ensure_ascii, out);
        out.append(key_sep);
        if (!value(items[order[k]].second, depth + 1)) return false;
      }
      if (indent) newline(depth);
      out.push_back('}');
      return true;
    }
    case Value::Type::kUndefined:
      error = "Object of type Undefined is not JSON serializable";
      return false;
    case Value::Type::kCallable:
    case Value::Type::kLoop:
      error = "Object of type function is not JSON serializable";
      return false;
  }
  return false;
}

}  // namespace

bool to_json(const Value& v, const JsonOptions& options, std::string& out, std::string& error) {
  JsonWriter writer(options, out, error);
  return writer.value(v, 0);
}

}  // namespace kvgate::tokenizer::jinja
