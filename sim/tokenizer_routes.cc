// sim/tokenizer_routes: see tokenizer_routes.h.
#include "sim/tokenizer_routes.h"

#include <simdjson.h>

#include <charconv>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "sim/json_body.h"
#include "sim/pd.h"
#include "sim/responses.h"
#include "util/json.h"

namespace kvgate::sim {
namespace {

using simdjson::dom::array;
using simdjson::dom::element;
using simdjson::dom::element_type;
using simdjson::dom::object;

int error(std::string& out, std::string_view message, int status = 400) {
  out.clear();
  append_openai_error(out, message, status);
  return status;
}

// The value of `key` when present and not null.
bool lookup(const object& o, std::string_view key, element& out) {
  if (o.at_key(key).get(out)) return false;
  return !out.is_null();
}

// "model": optional, a string (SGLang's default "default"; not used).
std::string check_model(const object& o) {
  element e;
  if (lookup(o, "model", e) && !e.is_string()) return "'model' must be a string";
  return "";
}

std::string get_bool(const object& o, std::string_view key, bool& out) {
  element e;
  if (!lookup(o, key, e)) return "";
  if (e.get_bool().get(out)) return "'" + std::string(key) + "' must be true or false";
  return "";
}

// What Python's type() prints for the value pydantic would make of `e`.
std::string_view python_type(const element& e) {
  switch (e.type()) {
    case element_type::ARRAY:
      return "<class 'list'>";
    case element_type::OBJECT:
      return "<class 'dict'>";
    case element_type::INT64:
    case element_type::UINT64:
      return "<class 'int'>";
    case element_type::DOUBLE:
      return "<class 'float'>";
    case element_type::STRING:
      return "<class 'str'>";
    case element_type::BOOL:
      return "<class 'bool'>";
    case element_type::NULL_VALUE:
      break;
  }
  return "<class 'NoneType'>";
}

// Python's repr() of a float: the shortest digits that round-trip, positional from 1e-4 up to
// 1e16, else with an exponent ("1e+16", "1.5e-05").
void append_python_float(std::string& out, double d) {
  char buf[64];
  auto sci = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string_view s(buf, static_cast<size_t>(sci.ptr - buf));
  int exp = 0;
  const size_t e = s.find('e');
  std::from_chars(s.data() + e + (s[e + 1] == '+' ? 2 : 1), s.data() + s.size(), exp);
  if (d != 0 && (exp < -4 || exp >= 16)) {
    out.append(s);
    return;
  }
  auto fixed = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::fixed);
  s = std::string_view(buf, static_cast<size_t>(fixed.ptr - buf));
  out.append(s);
  if (s.find('.') == std::string_view::npos) out.append(".0");
}

// Python's repr() of the value `e` becomes (SGLang's messages print request values with it).
void append_python_repr(std::string& out, const element& e) {
  switch (e.type()) {
    case element_type::ARRAY: {
      out.push_back('[');
      bool first = true;
      const array a = e.get_array().value_unsafe();
      for (element item : a) {
        if (!first) out.append(", ");
        first = false;
        append_python_repr(out, item);
      }
      out.push_back(']');
      return;
    }
    case element_type::OBJECT: {
      out.push_back('{');
      bool first = true;
      const object o = e.get_object().value_unsafe();
      for (auto field : o) {
        if (!first) out.append(", ");
        first = false;
        out += python_repr(field.key);
        out.append(": ");
        append_python_repr(out, field.value);
      }
      out.push_back('}');
      return;
    }
    case element_type::INT64:
      out.append(std::to_string(e.get_int64().value_unsafe()));
      return;
    case element_type::UINT64:
      out.append(std::to_string(e.get_uint64().value_unsafe()));
      return;
    case element_type::DOUBLE:
      append_python_float(out, e.get_double().value_unsafe());
      return;
    case element_type::STRING:
      out += python_repr(e.get_string().value_unsafe());
      return;
    case element_type::BOOL:
      out.append(e.get_bool().value_unsafe() ? "True" : "False");
      return;
    case element_type::NULL_VALUE:
      break;
  }
  out.append("None");
}

// A token id as DetokenizeRequest's List[int] takes it (pydantic also takes a float without a
// fraction), or nullopt for anything else.
std::optional<int64_t> as_int(const element& e) {
  if (int64_t v = 0; !e.get_int64().get(v)) return v;
  if (e.type() == element_type::UINT64) return std::numeric_limits<int64_t>::max();
  double d = 0;
  if (e.get_double().get(d) || !std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9e15) {
    return std::nullopt;
  }
  return static_cast<int64_t>(d);
}

// The ids of a list whose items are all integers, in `ids` (those past the vocabulary left out:
// both tokenizers decode them to nothing). Returns false when an item is not an integer. An id
// HF's decode cannot take (its ids are u32, converted from a C long) sets `range_error` to the
// exception text SGLang's 500 carries; the first one counts.
bool token_list(const array& a, const Tokenizer& tok, std::vector<int32_t>& ids,
                std::string& range_error) {
  for (element item : a) {
    std::optional<int64_t> v = as_int(item);
    if (!v) return false;
    if (!range_error.empty()) continue;
    if (item.type() == element_type::UINT64) {
      range_error = "Python int too large to convert to C long";
    } else if (*v < 0 || *v > std::numeric_limits<uint32_t>::max()) {
      range_error = "out of range integral type conversion attempted";
    } else if (*v < tok.vocab_size()) {
      ids.push_back(static_cast<int32_t>(*v));
    }
  }
  return true;
}

int detokenize_internal_error(std::string& out, const std::string& what) {
  return error(out, "Internal server error during detokenization: " + what, 500);
}

void append_ids(std::string& out, const std::vector<int32_t>& ids) {
  out.push_back('[');
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out.push_back(',');
    append_int(out, ids[i]);
  }
  out.push_back(']');
}

}  // namespace

int tokenize_response(std::string& body, const Tokenizer& tok, int64_t max_model_len,
                      std::string& out) {
  object o;
  if (auto err = parse_json_object(body, o); !err.empty()) return error(out, err);
  if (auto err = check_model(o); !err.empty()) return error(out, err);
  bool add_special_tokens = true;
  if (auto err = get_bool(o, "add_special_tokens", add_special_tokens); !err.empty()) {
    return error(out, err);
  }
  // TokenizeRequest takes either a prompt or chat messages; the sim tokenizes prompts only.
  element prompt, messages;
  const bool has_prompt = lookup(o, "prompt", prompt);
  const bool has_messages = lookup(o, "messages", messages);
  if (has_prompt == has_messages) {
    return error(out, "Exactly one of 'prompt' or 'messages' must be provided.");
  }
  if (!has_prompt) {
    return error(out, "kvgate-sim's /tokenize takes 'prompt' only ('messages' is not simulated)");
  }
  const std::string invalid =
      "Invalid prompt type: " + std::string(python_type(prompt)) + ". Expected str or List[str].";
  std::vector<std::vector<int32_t>> ids;
  std::string_view s;
  array list;
  const bool single = !prompt.get_string().get(s);
  if (single) {
    tok.tokenize(s, add_special_tokens, ids.emplace_back());
  } else if (!prompt.get_array().get(list)) {
    for (element item : list) {
      if (item.get_string().get(s)) return error(out, invalid);
      tok.tokenize(s, add_special_tokens, ids.emplace_back());
    }
  } else {
    return error(out, invalid);
  }
  // TokenizeResponse: tokens, count, max_model_len, in that order.
  out.assign(R"({"tokens":)");
  if (single) {
    append_ids(out, ids[0]);
    out.append(R"(,"count":)");
    append_int(out, static_cast<int64_t>(ids[0].size()));
  } else {
    out.push_back('[');
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i) out.push_back(',');
      append_ids(out, ids[i]);
    }
    out.append(R"(],"count":[)");
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i) out.push_back(',');
      append_int(out, static_cast<int64_t>(ids[i].size()));
    }
    out.push_back(']');
  }
  out.append(R"(,"max_model_len":)");
  append_int(out, max_model_len);
  out.push_back('}');
  return 200;
}

int detokenize_response(std::string& body, const Tokenizer& tok, std::string& out) {
  object o;
  if (auto err = parse_json_object(body, o); !err.empty()) return error(out, err);
  if (auto err = check_model(o); !err.empty()) return error(out, err);
  bool skip_special_tokens = true;
  if (auto err = get_bool(o, "skip_special_tokens", skip_special_tokens); !err.empty()) {
    return error(out, err);
  }
  element tokens;
  if (!lookup(o, "tokens", tokens)) return error(out, "'tokens' is required");
  array list;
  if (tokens.get_array().get(list)) {
    return error(out, "Invalid tokens type: " + std::string(python_type(tokens)) +
                          ". Expected List[int] or List[List[int]].");
  }
  if (list.size() == 0) {
    out.assign(R"({"text":""})");
    return 200;
  }
  // SGLang's serving_tokenize: the first item decides between one list of ids and a list of them.
  const element first = list.at(0).value_unsafe();
  std::vector<int32_t> ids;
  std::string range_error;
  if (as_int(first)) {
    if (!token_list(list, tok, ids, range_error)) {
      return error(out, "Invalid input: 'tokens' must be a list of integers.");
    }
    if (!range_error.empty()) return detokenize_internal_error(out, range_error);
    out.assign(R"({"text":)");
    json::append_string(out, tok.detokenize(ids, skip_special_tokens));
    out.push_back('}');
    return 200;
  }
  if (!first.is_array()) {
    return error(out,
                 "Invalid tokens type: <class 'list'>. Expected List[int] or List[List[int]].");
  }
  std::string texts;
  for (element item : list) {
    // Each sublist is checked, then decoded, before the next one is looked at.
    ids.clear();
    array sub;
    if (item.get_array().get(sub) || !token_list(sub, tok, ids, range_error)) {
      std::string message =
          "Invalid input: Sublist in 'tokens' must contain only integers. Found: ";
      append_python_repr(message, item);
      return error(out, message);
    }
    if (!range_error.empty()) return detokenize_internal_error(out, range_error);
    texts.push_back(texts.empty() ? '[' : ',');
    json::append_string(texts, tok.detokenize(ids, skip_special_tokens));
  }
  out.assign(R"({"text":)");
  out.append(texts);
  out.append("]}");
  return 200;
}

}  // namespace kvgate::sim
