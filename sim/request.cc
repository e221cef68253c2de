// sim/request: see request.h.
#include "sim/request.h"

#include <simdjson.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <deque>

#include "sim/json_body.h"

namespace kvgate::sim {
namespace {

using simdjson::dom::array;
using simdjson::dom::element;
using simdjson::dom::object;

std::string quoted(std::string_view key) {
  return "'" + std::string(key) + "'";
}

// The value of `key` when present and not null.
bool lookup(const object& o, std::string_view key, element& out) {
  if (o.at_key(key).get(out)) return false;
  return !out.is_null();
}

bool as_integer(const element& e, int64_t& out) {
  if (!e.get_int64().get(out)) return true;
  double d = 0;
  if (e.get_double().get(d) || !std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9e15) {
    return false;
  }
  out = static_cast<int64_t>(d);
  return true;
}

std::string get_int(const object& o, std::string_view key, std::optional<int64_t>& out) {
  element e;
  if (!lookup(o, key, e)) return "";
  int64_t v = 0;
  if (!as_integer(e, v)) return quoted(key) + " must be an integer";
  out = v;
  return "";
}

std::string get_bool(const object& o, std::string_view key, bool& out) {
  element e;
  if (!lookup(o, key, e)) return "";
  if (e.get_bool().get(out)) return quoted(key) + " must be true or false";
  return "";
}

std::string get_string(const object& o, std::string_view key, std::string& out) {
  element e;
  if (!lookup(o, key, e)) return "";
  std::string_view s;
  if (e.get_string().get(s)) return quoted(key) + " must be a string";
  out.assign(s);
  return "";
}

// "stop": a string or a list of strings.
std::string get_stop(const object& o, std::vector<std::string>& out) {
  element e;
  if (!lookup(o, "stop", e)) return "";
  std::string_view s;
  if (!e.get_string().get(s)) {
    out.emplace_back(s);
    return "";
  }
  array a;
  if (e.get_array().get(a)) return "'stop' must be a string or a list of strings";
  for (element item : a) {
    if (item.get_string().get(s)) return "'stop' must be a string or a list of strings";
    out.emplace_back(s);
  }
  return "";
}

// A list of token ids inside the vocabulary.
std::string get_ids(const element& e, int32_t vocab, std::string_view what,
                    std::vector<int32_t>& out) {
  array a;
  if (e.get_array().get(a)) return std::string(what) + " must be a list of token ids";
  for (element item : a) {
    int64_t id = 0;
    if (!as_integer(item, id)) return std::string(what) + " must be a list of token ids";
    if (id < 0 || id >= vocab) {
      return std::string(what) + " holds token id " + std::to_string(id) +
             ", outside the vocabulary (ids 0.." + std::to_string(vocab - 1) + ")";
    }
    out.push_back(static_cast<int32_t>(id));
  }
  return "";
}

std::string get_stop_token_ids(const object& o, int32_t vocab, std::vector<int32_t>& out) {
  element e;
  if (!lookup(o, "stop_token_ids", e)) return "";
  return get_ids(e, vocab, "'stop_token_ids'", out);
}

// Sets out.prompts (and out.batch) from a string or a list of strings (when `text`), or from a
// list of ids or a list of id lists (when `ids`). `what` names the field in errors.
std::string get_prompts(const element& e, std::string_view what, bool text, bool ids,
                        const Tokenizer& tok, ParsedRequest& out) {
  std::string shape = quoted(what) + " must be " +
                      (text && ids ? "a string, a list of strings, or token ids"
                       : text      ? "a string or a list of strings"
                                   : "a list of token ids or a list of such lists");
  auto add = [&]() -> std::vector<int32_t>& { return out.prompts.emplace_back(); };
  std::string_view s;
  if (!e.get_string().get(s)) {
    if (!text) return shape;
    tok.encode(s, add());
    return "";
  }
  array a;
  if (e.get_array().get(a)) return shape;
  if (a.size() == 0) return quoted(what) + " is an empty list";
  element first = a.at(0).value_unsafe();
  if (first.is_string()) {
    if (!text) return shape;
    out.batch = true;
    for (element item : a) {
      if (item.get_string().get(s)) return shape;
      tok.encode(s, add());
    }
    return "";
  }
  if (!ids) return shape;
  if (first.is_array()) {
    out.batch = true;
    for (element item : a) {
      if (auto err = get_ids(item, tok.vocab_size(), quoted(what), add()); !err.empty()) {
        return err;
      }
    }
    return "";
  }
  return get_ids(e, tok.vocab_size(), quoted(what), add());
}

std::string get_rids(const object& o, ParsedRequest& out) {
  element e;
  size_t n = out.prompts.size();
  out.rids.assign(n, std::string());
  if (!lookup(o, "rid", e)) return "";
  std::string_view s;
  if (!e.get_string().get(s)) {
    if (n != 1) return "'rid' must be a list of " + std::to_string(n) + " strings for a batch";
    out.rids[0].assign(s);
    return "";
  }
  array a;
  if (e.get_array().get(a) || a.size() != n) {
    return "'rid' must be a string, or a list of " + std::to_string(n) +
           " strings (one per prompt)";
  }
  size_t i = 0;
  for (element item : a) {
    if (item.get_string().get(s)) return "'rid' must hold strings";
    out.rids[i++].assign(s);
  }
  return "";
}

std::string get_routing(const object& o, ParsedRequest& out) {
  // routed_dp_rank wins; data_parallel_rank (deprecated) counts only without it.
  if (auto err = get_int(o, "data_parallel_rank", out.routed_dp_rank); !err.empty()) return err;
  if (auto err = get_int(o, "routed_dp_rank", out.routed_dp_rank); !err.empty()) return err;
  return get_int(o, "disagg_prefill_dp_rank", out.disagg_prefill_dp_rank);
}

// A string per request, or (`per_prompt`, /generate) a list with one string (or null) per prompt.
std::string get_strings(const object& o, std::string_view key, size_t n, bool per_prompt,
                        std::vector<std::string>& out) {
  element e;
  if (!lookup(o, key, e)) return "";
  std::string_view s;
  if (!e.get_string().get(s)) {
    out.emplace_back(s);
    return "";
  }
  array a;
  if (!per_prompt || e.get_array().get(a)) {
    return quoted(key) + (per_prompt ? " must be a string, or a list of strings (one per prompt)"
                                     : " must be a string");
  }
  if (a.size() != n) {
    return quoted(key) + " must be a string, or a list of " + std::to_string(n) +
           " (one per prompt)";
  }
  for (element item : a) {
    if (item.is_null()) {
      out.emplace_back();
    } else if (!item.get_string().get(s)) {
      out.emplace_back(s);
    } else {
      return quoted(key) + " must hold strings";
    }
  }
  return "";
}

// SGLang's OpenAIServingBase._parse_model_parameter: "base-model:adapter" names a LoRA adapter,
// which wins over lora_path.
void adapter_from_model(std::string_view model, std::vector<std::string>& loras) {
  size_t colon = model.find(':');
  if (colon == std::string_view::npos) return;
  std::string_view adapter = model.substr(colon + 1);
  while (!adapter.empty() && std::isspace(static_cast<unsigned char>(adapter.front()))) {
    adapter.remove_prefix(1);
  }
  while (!adapter.empty() && std::isspace(static_cast<unsigned char>(adapter.back()))) {
    adapter.remove_suffix(1);
  }
  if (adapter.empty()) return;
  loras.assign(1, std::string(adapter));
}

std::string get_namespace(const object& o, Route route, ParsedRequest& out) {
  const size_t n = out.prompts.size();
  const bool per_prompt = route == Route::kGenerate;
  if (auto err = get_strings(o, "cache_salt", n, per_prompt, out.cache_salts); !err.empty()) {
    return err;
  }
  if (auto err = get_strings(o, "lora_path", n, true, out.loras); !err.empty()) return err;
  if (route != Route::kGenerate) adapter_from_model(out.model, out.loras);
  return "";
}

// bootstrap_host / bootstrap_port / bootstrap_room: a value, or a list with one per prompt.
template <class T, class Read>
std::string get_per_prompt(const object& o, std::string_view key, size_t n, std::vector<T>& out,
                           std::string_view what, Read read) {
  element e;
  if (!lookup(o, key, e)) return "";
  array a;
  if (!e.get_array().get(a)) {
    if (a.size() != n) {
      return quoted(key) + " must be " + std::string(what) + ", or a list of " + std::to_string(n) +
             " (one per prompt)";
    }
    for (element item : a) {
      T v{};
      if (!read(item, v)) return quoted(key) + " must hold " + std::string(what) + " values";
      out.push_back(std::move(v));
    }
    return "";
  }
  T v{};
  if (!read(e, v)) return quoted(key) + " must be " + std::string(what);
  out.push_back(std::move(v));
  return "";
}

std::string get_bootstrap(const object& o, ParsedRequest& out) {
  const size_t n = out.prompts.size();
  if (auto err = get_per_prompt(o, "bootstrap_host", n, out.bootstrap_hosts, "a string",
                                [](const element& e, std::string& v) {
                                  std::string_view s;
                                  if (e.get_string().get(s)) return false;
                                  v.assign(s);
                                  return true;
                                });
      !err.empty()) {
    return err;
  }
  if (auto err = get_per_prompt(
          o, "bootstrap_port", n, out.bootstrap_ports, "a port number",
          [](const element& e, int64_t& v) { return as_integer(e, v) && v >= 0 && v <= 65535; });
      !err.empty()) {
    return err;
  }
  return get_per_prompt(o, "bootstrap_room", n, out.bootstrap_rooms, "a non-negative integer",
                        [](const element& e, uint64_t& v) {
                          if (!e.get_uint64().get(v)) return true;
                          int64_t i = 0;
                          if (!as_integer(e, i) || i < 0) return false;
                          v = static_cast<uint64_t>(i);
                          return true;
                        });
}

// SGLang's TokenizerManager._validate_token_ids_logprob, for one prompt's list.
std::string get_token_ids_logprob(const element& e, int32_t vocab, std::vector<int32_t>& out) {
  array a;
  if (e.get_array().get(a)) return "token_ids_logprob must be a flat list of integers.";
  for (element item : a) {
    int64_t id = 0;
    if (!item.is_int64() && !item.is_uint64()) {
      return "token_ids_logprob must be a flat list of integers.";
    }
    as_integer(item, id);
    if (id < 0 || id >= vocab) {
      return "token_ids_logprob contains out-of-vocabulary token id " + std::to_string(id) +
             "; valid range is [0, " + std::to_string(vocab) + ").";
    }
    out.push_back(static_cast<int32_t>(id));
  }
  return "";
}

// /generate's logprob fields. Each is a value for every prompt or (a batch) a list with one per
// prompt, as GenerateReqInput normalizes them; token_ids_logprob is a list of ids for every
// prompt or a list of such lists (null or [] for none), one per prompt.
std::string get_logprobs(const object& o, const Tokenizer& tok, ParsedRequest& out) {
  const size_t n = out.prompts.size();
  std::vector<char> ret;  // bools
  std::vector<int64_t> start, top;
  std::vector<std::vector<int32_t>> token_ids;
  auto read_int = [](const element& e, int64_t& v) { return as_integer(e, v); };
  if (auto err = get_per_prompt(o, "return_logprob", n, ret, "true or false",
                                [](const element& e, char& v) {
                                  bool b = false;
                                  if (e.get_bool().get(b)) return false;
                                  v = b ? 1 : 0;
                                  return true;
                                });
      !err.empty()) {
    return err;
  }
  if (auto err = get_per_prompt(o, "logprob_start_len", n, start, "an integer", read_int);
      !err.empty()) {
    return err;
  }
  if (auto err = get_per_prompt(o, "top_logprobs_num", n, top, "an integer", read_int);
      !err.empty()) {
    return err;
  }
  element ids;
  if (lookup(o, "token_ids_logprob", ids)) {
    array a;
    if (ids.get_array().get(a)) return "token_ids_logprob must be a flat list of integers.";
    if (a.size() > 0 && (a.at(0).value_unsafe().is_array() || a.at(0).value_unsafe().is_null())) {
      if (a.size() != n) {
        return "'token_ids_logprob' must be a list of ids, or a list of " + std::to_string(n) +
               " such lists (one per prompt)";
      }
      for (element item : a) {
        auto& list = token_ids.emplace_back();
        if (item.is_null()) continue;
        if (auto err = get_token_ids_logprob(item, tok.vocab_size(), list); !err.empty()) {
          return err;
        }
      }
    } else if (auto err = get_token_ids_logprob(ids, tok.vocab_size(), token_ids.emplace_back());
               !err.empty()) {
      return err;
    }
  }
  bool text = false;
  if (auto err = get_bool(o, "return_text_in_logprobs", text); !err.empty()) return err;
  if (ret.empty() && start.empty() && top.empty() && token_ids.empty()) return "";
  auto pick = [](const auto& v, size_t i) { return v.size() == 1 ? v[0] : v[i]; };
  out.logprobs.resize(n);
  for (size_t i = 0; i < n; ++i) {
    LogprobParams& lp = out.logprobs[i];
    lp.return_logprob = !ret.empty() && pick(ret, i) != 0;
    // None normalizes to -1 (output rows only); any negative value is read as that default.
    lp.start_len = start.empty() ? -1 : std::max<int64_t>(pick(start, i), -1);
    lp.top_logprobs_num = top.empty() ? 0 : std::max<int64_t>(pick(top, i), 0);
    if (!token_ids.empty()) lp.token_ids = pick(token_ids, i);
    lp.return_text_in_logprobs = text;
  }
  return "";
}

std::string check_n(const object& o) {
  std::optional<int64_t> n;
  if (auto err = get_int(o, "n", n); !err.empty()) return err;
  if (n && *n != 1)
    return "'n' = " + std::to_string(*n) + " is not supported by kvgate-sim (use 1)";
  return "";
}

std::string get_include_usage(const object& o, ParsedRequest& out) {
  element e;
  if (!lookup(o, "stream_options", e)) return "";
  object so;
  if (e.get_object().get(so)) return "'stream_options' must be an object";
  return get_bool(so, "include_usage", out.include_usage);
}

std::string parse_generate(const object& o, const Tokenizer& tok, ParsedRequest& out,
                           std::optional<int64_t>& max_new) {
  element text, ids;
  bool has_text = lookup(o, "text", text);
  bool has_ids = lookup(o, "input_ids", ids);
  if (has_text == has_ids) {
    return has_text ? "Either text or input_ids should be provided, not both."
                    : "Either text or input_ids should be provided.";
  }
  if (auto err = has_text ? get_prompts(text, "text", true, false, tok, out)
                          : get_prompts(ids, "input_ids", false, true, tok, out);
      !err.empty()) {
    return err;
  }
  element sp;
  if (lookup(o, "sampling_params", sp)) {
    object spo;
    if (sp.get_object().get(spo)) return "'sampling_params' must be an object";
    if (auto err = get_int(spo, "max_new_tokens", max_new); !err.empty()) return err;
    if (auto err = get_stop(spo, out.sampling.stop); !err.empty()) return err;
    if (auto err = get_stop_token_ids(spo, tok.vocab_size(), out.sampling.stop_token_ids);
        !err.empty()) {
      return err;
    }
    if (auto err = check_n(spo); !err.empty()) return err;
  }
  if (max_new && *max_new < 0) return "max_new_tokens must be at least 0";
  if (auto err = get_logprobs(o, tok, out); !err.empty()) return err;
  return get_bool(o, "stream", out.stream);
}

std::string get_openai_common(const object& o, const Tokenizer& tok, ParsedRequest& out) {
  out.model = "default";
  if (auto err = get_string(o, "model", out.model); !err.empty()) return err;
  if (auto err = get_bool(o, "stream", out.stream); !err.empty()) return err;
  if (auto err = get_include_usage(o, out); !err.empty()) return err;
  if (auto err = get_stop(o, out.sampling.stop); !err.empty()) return err;
  if (auto err = get_stop_token_ids(o, tok.vocab_size(), out.sampling.stop_token_ids);
      !err.empty()) {
    return err;
  }
  return check_n(o);
}

std::string parse_completions(const object& o, const Tokenizer& tok, ParsedRequest& out,
                              std::optional<int64_t>& max_new) {
  if (auto err = get_openai_common(o, tok, out); !err.empty()) return err;
  element prompt;
  if (!lookup(o, "prompt", prompt)) return "'prompt' is required";
  if (auto err = get_prompts(prompt, "prompt", true, true, tok, out); !err.empty()) return err;
  max_new = 16;  // OpenAI's default for completions, as SGLang keeps it
  if (auto err = get_int(o, "max_tokens", max_new); !err.empty()) return err;
  if (*max_new <= 0) return "max_tokens must be positive";
  return "";
}

// Joins the text parts of a message's content ("content": string | null | [{type, text}]).
std::string message_content(const element& e, std::deque<std::string>& storage,
                            std::string_view& out) {
  out = {};
  if (e.is_null()) return "";
  if (!e.get_string().get(out)) return "";
  array parts;
  if (e.get_array().get(parts)) return "message 'content' must be a string or a list of parts";
  std::string& joined = storage.emplace_back();
  for (element part : parts) {
    object po;
    std::string_view type, text;
    if (part.get_object().get(po) || po.at_key("type").get_string().get(type)) {
      return "each content part must be an object with a 'type'";
    }
    if (type != "text") {
      return "content part type '" + std::string(type) +
             "' is not supported by kvgate-sim (text only)";
    }
    if (po.at_key("text").get_string().get(text)) return "a text content part needs 'text'";
    if (!joined.empty()) joined.push_back(' ');
    joined.append(text);
  }
  out = joined;
  return "";
}

std::string render_messages(const object& o, const ChatTemplate& tmpl, std::string& rendered) {
  element e;
  array msgs;
  if (!lookup(o, "messages", e)) return "'messages' is required";
  if (e.get_array().get(msgs)) return "'messages' must be a list";
  if (msgs.size() == 0) return "'messages' must not be empty";
  thread_local std::vector<ChatMessage> list;
  thread_local std::deque<std::string> storage;
  list.clear();
  storage.clear();
  for (element m : msgs) {
    object mo;
    ChatMessage cm;
    if (m.get_object().get(mo)) return "each message must be an object";
    if (mo.at_key("role").get_string().get(cm.role)) return "each message needs a string 'role'";
    element content;
    if (lookup(mo, "content", content)) {
      if (auto err = message_content(content, storage, cm.content); !err.empty()) return err;
    }
    list.push_back(cm);
  }
  // The request's own JSON goes to the model's template, as SGLang hands the request's messages,
  // tools and chat_template_kwargs to apply_chat_template (generation prompt unless the last
  // message is continued).
  element tools, kwargs, cont;
  std::string tools_json, kwargs_json;
  if (lookup(o, "tools", tools) && tools.is_array()) tools_json = simdjson::minify(tools);
  if (lookup(o, "chat_template_kwargs", kwargs) && kwargs.is_object()) {
    kwargs_json = simdjson::minify(kwargs);
  }
  bool continue_final = false;
  if (lookup(o, "continue_final_message", cont) && cont.get_bool().get(continue_final)) {
    continue_final = false;
  }
  std::string error;
  if (!tmpl.render_request(list, simdjson::minify(msgs), tools_json, kwargs_json, !continue_final,
                           rendered, error)) {
    return error;
  }
  return "";
}

std::string parse_chat(const object& o, const Tokenizer& tok, const ChatTemplate& tmpl,
                       ParsedRequest& out, std::optional<int64_t>& max_new) {
  if (auto err = get_openai_common(o, tok, out); !err.empty()) return err;
  thread_local std::string rendered;
  rendered.clear();
  if (auto err = render_messages(o, tmpl, rendered); !err.empty()) return err;
  out.prompts.emplace_back();
  tok.encode(rendered, out.prompts.back());
  if (auto err = get_int(o, "max_tokens", max_new); !err.empty()) return err;
  if (auto err = get_int(o, "max_completion_tokens", max_new); !err.empty()) return err;
  if (max_new && *max_new <= 0) return "max_tokens must be positive";
  return "";
}

}  // namespace

std::string check_request_lengths(const ParsedRequest& r, const RequestLimits& limits) {
  for (const auto& p : r.prompts) {
    auto n = static_cast<int64_t>(p.size());
    int64_t max_new = r.sampling.max_new_tokens;
    if (n == 0) return "the prompt is empty (0 tokens)";
    if (n >= limits.context_length) {
      return "The input (" + std::to_string(n) +
             " tokens) is longer than the model's context length (" +
             std::to_string(limits.context_length) + " tokens).";
    }
    if (n > limits.max_req_input_len) {
      return "The input (" + std::to_string(n) +
             " tokens) is longer than the longest input this "
             "server accepts (" +
             std::to_string(limits.max_req_input_len) + " tokens).";
    }
    if (n + max_new > limits.context_length) {
      return "Requested token count exceeds the model's maximum context length of " +
             std::to_string(limits.context_length) + " tokens. You requested a total of " +
             std::to_string(n + max_new) + " tokens: " + std::to_string(n) +
             " tokens from the input messages and " + std::to_string(max_new) +
             " tokens for the completion. Please reduce the number of tokens in the input "
             "messages or the completion to fit within the limit.";
    }
  }
  return "";
}

void ParsedRequest::clear() {
  route = Route::kGenerate;
  model.clear();
  stream = include_usage = batch = false;
  prompts.clear();
  rids.clear();
  sampling.max_new_tokens = 0;
  sampling.stop.clear();
  sampling.stop_token_ids.clear();
  routed_dp_rank.reset();
  disagg_prefill_dp_rank.reset();
  cache_salts.clear();
  loras.clear();
  bootstrap_hosts.clear();
  bootstrap_ports.clear();
  bootstrap_rooms.clear();
  logprobs.clear();
  responses.reset();
}

const LogprobParams& ParsedRequest::logprob(size_t i) const {
  static const LogprobParams kNone;
  if (logprobs.empty()) return kNone;
  return logprobs.size() == 1 ? logprobs[0] : logprobs[i];
}

CacheNamespace ParsedRequest::cache_namespace(size_t i) const {
  auto pick = [i](const std::vector<std::string>& v) -> const std::string& {
    static const std::string kNone;
    if (v.empty()) return kNone;
    return v.size() == 1 ? v[0] : v[i];
  };
  return CacheNamespace{.cache_salt = pick(cache_salts), .lora = pick(loras)};
}

bool ParsedRequest::bootstrap(size_t i, std::string& host, int64_t& port, uint64_t& room,
                              bool& has_host, bool& has_port, bool& has_room) const {
  auto pick = [i](const auto& v) { return v.size() == 1 ? v[0] : v[i]; };
  has_host = !bootstrap_hosts.empty();
  has_port = !bootstrap_ports.empty();
  has_room = !bootstrap_rooms.empty();
  host = has_host ? pick(bootstrap_hosts) : std::string();
  port = has_port ? pick(bootstrap_ports) : 0;
  // GenerateReqInput: one room for a batch becomes [room + i for i in range(n)].
  room = !has_room ? 0 : bootstrap_rooms.size() == 1 ? bootstrap_rooms[0] + i : bootstrap_rooms[i];
  return has_host || has_port || has_room;
}

std::string parse_request(Route route, std::string& body, const Tokenizer& tokenizer,
                          const ChatTemplate& chat_template, const RequestLimits& limits,
                          ParsedRequest& out) {
  out.clear();
  out.route = route;
  object o;
  if (std::string err = parse_json_object(body, o); !err.empty()) return err;

  std::optional<int64_t> max_new;
  std::string e;
  switch (route) {
    case Route::kGenerate:
      e = parse_generate(o, tokenizer, out, max_new);
      break;
    case Route::kCompletions:
      e = parse_completions(o, tokenizer, out, max_new);
      break;
    case Route::kChatCompletions:
    case Route::kResponses:  // sim/openai_responses hands over a chat body
      e = parse_chat(o, tokenizer, chat_template, out, max_new);
      break;
  }
  if (e.empty() && route != Route::kGenerate && out.stream && limits.default_include_usage) {
    out.include_usage = true;
  }
  if (e.empty()) e = get_rids(o, out);
  if (e.empty()) e = get_routing(o, out);
  if (e.empty()) e = get_namespace(o, route, out);
  if (e.empty()) e = get_bootstrap(o, out);
  if (!e.empty()) return e;
  out.sampling.max_new_tokens = max_new.value_or(limits.default_max_new_tokens);
  return check_request_lengths(out, limits);
}

std::string apply_dp_rank_header(std::optional<std::string_view> value, ParsedRequest& out) {
  if (!value) return "";
  // Python's int(): surrounding whitespace, an optional sign, digits.
  std::string_view v = *value;
  while (!v.empty() && std::isspace(static_cast<unsigned char>(v.front()))) v.remove_prefix(1);
  while (!v.empty() && std::isspace(static_cast<unsigned char>(v.back()))) v.remove_suffix(1);
  std::string_view digits = v;
  if (!digits.empty() && (digits.front() == '+' || digits.front() == '-')) digits.remove_prefix(1);
  int64_t rank = 0;
  auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), rank);
  if (digits.empty() || ec != std::errc() || ptr != digits.data() + digits.size()) {
    return "Invalid X-Data-Parallel-Rank header: must be an integer, got '" + std::string(*value) +
           "'";
  }
  out.routed_dp_rank = v.front() == '-' ? -rank : rank;
  return "";
}

std::string check_loras(const ParsedRequest& r, bool enable_lora,
                        std::span<const std::string> adapters) {
  const std::string* first = nullptr;
  for (const auto& l : r.loras) {
    if (!l.empty()) {
      first = &l;
      break;
    }
  }
  if (!first) return "";
  if (!enable_lora) {
    return "LoRA adapter '" + *first +
           "' was requested, but LoRA is not enabled. Please launch the server with "
           "--enable-lora flag and preload adapters using --lora-paths or /load_lora_adapter "
           "endpoint.";
  }
  for (const auto& l : r.loras) {
    if (l.empty() || std::find(adapters.begin(), adapters.end(), l) != adapters.end()) continue;
    // The message names every served adapter as Python prints the registry's dict_keys.
    std::string message = "Got LoRA adapter that has never been loaded: " + l;
    message += "\nAll loaded adapters: dict_keys([";
    for (size_t i = 0; i < adapters.size(); ++i) {
      if (i) message += ", ";
      message += "'";
      message += adapters[i];
      message += "'";
    }
    message += "]).";
    return message;
  }
  return "";
}

}  // namespace kvgate::sim
