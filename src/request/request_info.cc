// request/request_info: see request_info.h.
#include "request/request_info.h"

#include <simdjson.h>

#include <cctype>
#include <charconv>

#include "http/message.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "util/json.h"
#include "util/json_parser.h"

namespace kvgate {

using simdjson::dom::element;

std::string_view to_string(ApiRoute r) {
  switch (r) {
    case ApiRoute::kGenerate:
      return "/generate";
    case ApiRoute::kChatCompletions:
      return "/v1/chat/completions";
    case ApiRoute::kCompletions:
      return "/v1/completions";
    case ApiRoute::kEmbeddings:
      return "/v1/embeddings";
    case ApiRoute::kRerank:
      return "/v1/rerank";
    case ApiRoute::kResponses:
      return "/v1/responses";
    case ApiRoute::kResponse:
      return "/v1/responses/{id}";
    case ApiRoute::kEncode:
      return "/encode";
    case ApiRoute::kClassify:
      return "/classify";
    case ApiRoute::kClassifyOpenAI:
      return "/v1/classify";
    case ApiRoute::kScore:
      return "/v1/score";
    case ApiRoute::kTokenize:
      return "/tokenize";
    case ApiRoute::kDetokenize:
      return "/detokenize";
  }
  return "?";
}

namespace {
// The OpenAI-compatible routes (SGLang's OpenAIServingBase reads their model).
bool openai_route(ApiRoute r) {
  switch (r) {
    case ApiRoute::kChatCompletions:
    case ApiRoute::kCompletions:
    case ApiRoute::kEmbeddings:
    case ApiRoute::kRerank:
    case ApiRoute::kResponses:
    case ApiRoute::kClassifyOpenAI:
    case ApiRoute::kScore:
      return true;
    default:
      return false;
  }
}
}  // namespace

bool generates(ApiRoute r) {
  return r == ApiRoute::kGenerate || r == ApiRoute::kChatCompletions ||
         r == ApiRoute::kCompletions || r == ApiRoute::kResponses;
}

namespace {

// The thread's body parser, reused across requests (released after an outsized body).
simdjson::dom::parser& body_parser() {
  thread_local simdjson::dom::parser parser;
  return parser;
}

void append_ids(std::string& out, simdjson::dom::array ids) {
  char buf[24];
  bool first = true;
  for (element v : ids) {
    int64_t id = 0;
    if (v.get_int64().get(id)) continue;
    if (!first) out.push_back(',');
    first = false;
    out.append(buf, std::to_chars(buf, buf + sizeof buf, id).ptr);
  }
}

// A prompt-like value: a string, a list of strings, token ids, or a list of token id lists.
void append_prompt(std::string& out, element v, bool& token_ids) {
  std::string_view s;
  if (!v.get_string().get(s)) {
    out.append(s);
    return;
  }
  simdjson::dom::array a;
  if (v.get_array().get(a) || a.size() == 0) return;
  element first = a.at(0).value_unsafe();
  if (first.is_int64() || first.is_uint64()) {
    token_ids = true;
    append_ids(out, a);
    return;
  }
  bool sep = false;
  for (element item : a) {
    if (sep) out.push_back('\n');
    sep = true;
    if (!item.get_string().get(s)) {
      out.append(s);
    } else if (item.is_array()) {
      token_ids = true;
      append_ids(out, item.get_array().value_unsafe());
    }
  }
}

// The text of a message's content: a string, or the text parts of a list (a chat message's
// "text" parts; with `responses`, a Responses API item's input_text, output_text and text).
void append_content(std::string& out, element content, bool responses = false) {
  std::string_view s;
  if (!content.get_string().get(s)) {
    out.append(s);
    return;
  }
  simdjson::dom::array parts;
  if (content.get_array().get(parts)) return;
  for (element part : parts) {
    std::string_view type, text;
    if (part["type"].get_string().get(type) || part["text"].get_string().get(text)) continue;
    if (type == "text" || (responses && (type == "input_text" || type == "output_text"))) {
      out.append(text);
    }
  }
}

void extract_first_user(simdjson::dom::array messages, RequestInfo& out) {
  for (element m : messages) {
    std::string_view role;
    element content;
    if (!m["role"].get_string().get(role) && role == "user" && !m["content"].get(content)) {
      append_content(out.first_user_message, content);
      return;
    }
  }
}

void extract_chat(simdjson::dom::array messages, RequestInfo& out) {
  bool have_user = false;
  for (element m : messages) {
    std::string_view role;
    if (m["role"].get_string().get(role)) role = "";
    out.text.append(role).push_back('\n');
    element content;
    if (!m["content"].get(content)) {
      size_t before = out.text.size();
      append_content(out.text, content);
      if (!have_user && role == "user") {
        out.first_user_at = {before, out.text.size() - before};
        have_user = true;
      }
    }
    element calls;
    if (!m["tool_calls"].get(calls) && !calls.is_null()) out.text.append(simdjson::minify(calls));
    out.text.push_back('\n');
  }
}

// The chat prompt as the model's template renders it (SGLang's OpenAI chat route: generation
// prompt on unless the last message is continued). False when the template rejects it.
bool render_chat(const tokenizer::ChatTemplate& tmpl, simdjson::dom::object obj,
                 simdjson::dom::array messages, RequestInfo& out) {
  element tools, kwargs;
  std::string tools_json, kwargs_json;
  if (!obj["tools"].get(tools) && tools.is_array()) tools_json = simdjson::minify(tools);
  if (!obj["chat_template_kwargs"].get(kwargs) && kwargs.is_object()) {
    kwargs_json = simdjson::minify(kwargs);
  }
  bool cont = false;
  if (obj["continue_final_message"].get_bool().get(cont)) cont = false;
  std::string err;
  return tmpl.render_request_json(simdjson::minify(messages), tools_json, !cont, kwargs_json,
                                  out.text, err);
}

// /v1/responses as SGLang's serving_responses builds its chat messages (_construct_input_messages,
// without a previous response: the gateway sends those to the engine that holds it): the
// instructions as a system message, then the input (a string: one user message; a list: its
// message items, their text parts joined). Calls add(role, content) for each.
template <class Add>
void for_each_response_message(simdjson::dom::object obj, Add&& add) {
  std::string_view s;
  if (!obj["instructions"].get_string().get(s) && !s.empty()) add("system", s);
  element input;
  if (obj["input"].get(input)) return;
  simdjson::dom::array items;
  if (!input.get_string().get(s)) {
    add("user", s);
  } else if (!input.get_array().get(items)) {
    std::string text;
    for (element item : items) {
      std::string_view role;
      element content;
      if (item["role"].get_string().get(role) || item["content"].get(content)) continue;
      text.clear();
      append_content(text, content, true);
      add(role, std::string_view(text));
    }
  }
}

void extract_responses(simdjson::dom::object obj, RequestInfo& out, const ParseOptions& options) {
  if (options.chat_template) {
    std::string messages = "[";
    for_each_response_message(obj, [&](std::string_view role, std::string_view content) {
      if (messages.size() > 1) messages.push_back(',');
      messages.append(R"({"role":)");
      json::append_string(messages, role);
      messages.append(R"(,"content":)");
      json::append_string(messages, content);
      messages.push_back('}');
      if (out.first_user_message.empty() && role == "user") out.first_user_message = content;
    });
    messages.push_back(']');
    auto t0 = std::chrono::steady_clock::now();
    std::string err;
    bool ok = options.chat_template->render_request_json(messages, "", true, "", out.text, err);
    if (options.want_tokens) out.render_time = std::chrono::steady_clock::now() - t0;
    if (ok) {
      out.rendered = true;
      return;
    }
    out.render_failed = true;
    out.text.clear();
  }
  // The stand-in, as a chat's: "role\ncontent\n" per message.
  bool have_user = false;
  for_each_response_message(obj, [&](std::string_view role, std::string_view content) {
    out.text.append(role).push_back('\n');
    if (!have_user && role == "user") {
      out.first_user_at = {out.text.size(), content.size()};
      have_user = true;
    }
    out.text.append(content).push_back('\n');
  });
}

void extract_text(ApiRoute route, simdjson::dom::object obj, RequestInfo& out,
                  const ParseOptions& options) {
  element v;
  switch (route) {
    case ApiRoute::kResponses:
      extract_responses(obj, out, options);
      break;
    case ApiRoute::kResponse:
    case ApiRoute::kTokenize:
    case ApiRoute::kDetokenize:
      break;  // nothing to route on: the owner, or any worker
    case ApiRoute::kScore:
      if (!obj["query"].get(v)) append_prompt(out.text, v, out.token_ids);
      break;
    case ApiRoute::kClassifyOpenAI:
      if (!obj["input"].get(v)) append_prompt(out.text, v, out.token_ids);
      break;
    case ApiRoute::kChatCompletions: {
      simdjson::dom::array messages;
      if (obj["messages"].get_array().get(messages)) break;
      if (options.chat_template) {
        auto t0 = std::chrono::steady_clock::now();
        bool ok = render_chat(*options.chat_template, obj, messages, out);
        if (options.want_tokens) out.render_time = std::chrono::steady_clock::now() - t0;
        if (ok) {
          out.rendered = true;
          extract_first_user(messages, out);  // still the routing key of chwbl
          break;
        }
        out.render_failed = true;
        out.text.clear();
      }
      extract_chat(messages, out);
      break;
    }
    case ApiRoute::kCompletions:
      if (!obj["prompt"].get(v)) append_prompt(out.text, v, out.token_ids);
      break;
    case ApiRoute::kGenerate:
    case ApiRoute::kEncode:
    case ApiRoute::kClassify:
      if (!obj["text"].get(v) && !v.is_null()) {
        append_prompt(out.text, v, out.token_ids);
      } else if (!obj["input_ids"].get(v)) {
        append_prompt(out.text, v, out.token_ids);
        out.token_ids = true;
      }
      break;
    case ApiRoute::kEmbeddings:
      if (!obj["input"].get(v)) append_prompt(out.text, v, out.token_ids);
      break;
    case ApiRoute::kRerank:
      if (!obj["query"].get(v)) append_prompt(out.text, v, out.token_ids);
      break;
  }
}

// Fills out.tokens: input_ids as given ("1,2,3"), else the tokenizer's ids of the text (batches
// included, joined as `text` joins them); the first `max_tokens` of them (0: all).
void tokenize_text(RequestInfo& out, const tokenizer::Tokenizer* tok, size_t max_tokens) {
  if (out.token_ids) {
    std::string_view s = out.text;
    while (!s.empty() && (max_tokens == 0 || out.tokens.size() < max_tokens)) {
      int64_t id = 0;
      auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), id);
      if (ec != std::errc()) break;
      out.tokens.push_back(static_cast<int32_t>(id));
      s.remove_prefix(static_cast<size_t>(p - s.data()));
      if (!s.empty()) s.remove_prefix(1);  // ',' or '\n'
    }
    return;
  }
  if (!tok || out.text.empty()) return;
  bool ok = max_tokens == 0 ? tok->encode(out.text, false, out.tokens)
                            : tok->encode_prefix(out.text, false, max_tokens, out.tokens);
  if (!ok) out.tokens.clear();
}

}  // namespace

std::string parse_request(ApiRoute route, const std::string& body, RequestInfo& out,
                          ParseOptions options) {
  out.route = route;
  out.model.clear();
  out.stream = false;
  out.rid.clear();
  out.previous_response_id.clear();
  out.store = true;
  out.include_usage = false;
  out.text.clear();
  out.first_user_message.clear();
  out.first_user_at = {0, 0};
  out.token_ids = false;
  out.rendered = false;
  out.render_failed = false;
  out.tokens.clear();
  out.cache_salt.reset();
  out.names_lora = false;
  out.lora.reset();
  out.render_time = out.tokenize_time = {};
  if (body.empty()) return "request body is empty; send a JSON object";
  simdjson::dom::parser& parser = body_parser();
  json::ParserRelease release(parser);  // `out` holds copies: nothing refers to the parser after
  element doc;
  simdjson::error_code err;
  if (body.capacity() >= body.size() + simdjson::SIMDJSON_PADDING) {
    err = parser.parse(body.data(), body.size(), false).get(doc);
  } else {
    err = parser.parse(body).get(doc);
  }
  if (err) {
    return std::string("request body is not valid JSON: ") + simdjson::error_message(err);
  }
  simdjson::dom::object obj;
  if (doc.get_object().get(obj)) return "request body must be a JSON object";
  for (auto field : obj) {
    std::string_view key = field.key;
    auto value = field.value;
    if (key == "model") {
      std::string_view m;
      if (value.get_string().get(m)) {
        if (!value.is_null()) return "\"model\" must be a string";
      } else {
        out.model = m;
      }
    } else if (key == "stream") {
      bool s = false;
      if (value.get_bool().get(s)) {
        if (!value.is_null()) return "\"stream\" must be true or false";
      } else {
        out.stream = s;
      }
    } else if (key == "rid") {
      std::string_view r;
      if (!value.get_string().get(r)) out.rid = r;
    } else if (((route == ApiRoute::kGenerate || route == ApiRoute::kEncode ||
                 route == ApiRoute::kClassify) &&
                (key == "text" || key == "input_ids")) ||
               (route == ApiRoute::kCompletions && key == "prompt")) {
      // A list of strings, or a list of token id lists (a plain list of ids is one prompt).
      simdjson::dom::array a;
      if (!value.get_array().get(a) && a.size() > 0) {
        element first = a.at(0).value_unsafe();
        out.batch = first.is_string() || first.is_array();
      }
    } else if (key == "previous_response_id" && route == ApiRoute::kResponses) {
      std::string_view id;
      if (value.get_string().get(id)) {
        if (!value.is_null()) return "\"previous_response_id\" must be a string";
      } else {
        out.previous_response_id = id;
      }
    } else if (key == "store" && route == ApiRoute::kResponses) {
      bool st = true;
      if (!value.get_bool().get(st)) out.store = st;
    } else if (key == "cache_salt") {
      // SGLang keeps a salted request's prefixes in their own namespace (kv_exact keys by it).
      std::string_view salt;
      if (!value.get_string().get(salt)) out.cache_salt = salt;
    } else if (key == "lora_path") {
      out.names_lora = !value.is_null();
      std::string_view name;
      if (!value.get_string().get(name)) out.lora = name;
    } else if (key == "return_logprob" && route == ApiRoute::kGenerate) {
      bool lp = false;
      if (!value.get_bool().get(lp)) out.return_logprob = lp;
    } else if (key == "stream_options") {
      bool u = false;
      if (!value["include_usage"].get_bool().get(u)) out.include_usage = u;
    } else if (key == "messages" && route == ApiRoute::kChatCompletions && !value.is_array()) {
      return "\"messages\" must be a list of message objects";
    }
  }
  if (options.model_names_adapter && openai_route(route)) {
    // SGLang's OpenAI routes: "base-model:adapter" names an adapter, which wins over lora_path.
    if (size_t colon = out.model.find(':'); colon != std::string::npos) {
      std::string_view adapter = std::string_view(out.model).substr(colon + 1);
      while (!adapter.empty() && std::isspace(static_cast<unsigned char>(adapter.front())))
        adapter.remove_prefix(1);
      while (!adapter.empty() && std::isspace(static_cast<unsigned char>(adapter.back())))
        adapter.remove_suffix(1);
      if (!adapter.empty()) {
        out.names_lora = true;
        out.lora = adapter;
      }
    }
  }
  if (options.want_text) {
    // A chat's or prompt's text is about the body's size at most (JSON escapes only lengthen what
    // it carries): one allocation, instead of the copy a growth would make of a long prompt. When
    // the text is a small part of the body (a rerank's query beside its documents) the rest is
    // given back: the request keeps its text while it runs.
    out.text.reserve(body.size());
    extract_text(route, obj, out, options);
    if (out.text.capacity() > 2 * out.text.size() + 4096) out.text.shrink_to_fit();
    if (options.want_tokens) {
      auto t0 = std::chrono::steady_clock::now();
      tokenize_text(out, options.tokenizer, options.max_tokens);
      out.tokenize_time = std::chrono::steady_clock::now() - t0;
    }
  }
  return "";
}

size_t request_parser_capacity() {
  return body_parser().capacity();
}

}  // namespace kvgate
