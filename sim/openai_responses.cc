// sim/openai_responses: see openai_responses.h.
#include "sim/openai_responses.h"

#include <ctime>
#include <nlohmann/json.hpp>

#include "sim/responses.h"
#include "util/json.h"
#include "util/random.h"

namespace kvgate::sim {
namespace {

using Json = nlohmann::ordered_json;

constexpr std::string_view kStoreDisabled =
    "Response store is disabled. Stateful Responses require --enable-response-store on a "
    "standalone server; response storage is unavailable in PD mode.";

ResponsesError error(int status, std::string_view message,
                     std::optional<std::string_view> param = std::nullopt,
                     std::string_view type = "invalid_request_error") {
  return ResponsesError{.status = status,
                        .body = responses_error_body(message, type, param, status)};
}

// A JSON value as the answer echoes it: numbers as Python floats print them.
std::string float_or_null(const Json& v) {
  if (!v.is_number()) return "null";
  std::string out;
  append_double(out, v.get<double>());
  return out;
}

std::string string_or_null(const Json& v) {
  if (!v.is_string()) return "null";
  std::string out;
  json::append_string(out, v.get<std::string>());
  return out;
}

// ResponsesRequest.effective_tool_choice(): a string as given; of the object forms only a named
// function survives.
std::string effective_tool_choice(const Json& tc) {
  if (tc.is_string()) return tc.dump();
  if (!tc.is_object()) return R"("auto")";
  std::string name;
  if (tc.contains("name") && tc["name"].is_string()) {
    name = tc["name"].get<std::string>();
  } else if (tc.contains("function") && tc["function"].is_object() &&
             tc["function"].contains("name") && tc["function"]["name"].is_string()) {
    name = tc["function"]["name"].get<std::string>();
  }
  if (tc.value("type", "") == "function" && !name.empty()) {
    return Json{{"type", "function"}, {"name", name}}.dump();
  }
  return R"("auto")";
}

// The tools as ResponseTool.model_dump() lists them.
std::string dump_tools(const Json& tools) {
  Json out = Json::array();
  for (const auto& t : tools) {
    Json d;
    d["type"] = t.value("type", Json());
    d["name"] = t.contains("name") ? t["name"] : Json();
    d["description"] = t.contains("description") ? t["description"] : Json();
    d["parameters"] = t.contains("parameters") ? t["parameters"] : Json();
    d["strict"] = t.contains("strict") ? t["strict"] : Json(false);
    d["tools"] = t.contains("tools") ? t["tools"] : Json();
    out.push_back(std::move(d));
  }
  return out.dump();
}

// responses_adapters.label_developer_content.
constexpr std::string_view kDeveloperLabel = "Developer instructions:";

Json label_developer(const Json& content) {
  const std::string label(kDeveloperLabel);
  if (content.is_string()) return label + "\n" + content.get<std::string>();
  if (!content.is_array()) return content;
  Json out = content;
  for (auto& part : out) {
    if (part.is_object() && part.contains("text") && part["text"].is_string()) {
      part["text"] = label + "\n" + part["text"].get<std::string>();
      return out;
    }
  }
  out.insert(out.begin(), Json{{"type", "input_text"}, {"text", label}});
  return out;
}

Json normalize_part(const Json& part) {
  if (!part.is_object()) return part;
  const std::string type = part.value("type", "");
  if (type == "input_text" || type == "output_text") {
    return Json{{"type", "text"}, {"text", part.value("text", "")}};
  }
  if (type == "input_image") {
    Json url = part.contains("image_url") && part["image_url"].is_object()
                   ? part["image_url"]
                   : Json{{"url", part.value("image_url", Json())}};
    if (!url.contains("detail") || url["detail"].is_null()) {
      url["detail"] =
          part.contains("detail") && !part["detail"].is_null() ? part["detail"] : Json("auto");
    }
    return Json{{"type", "image_url"}, {"image_url", url}};
  }
  return part;
}

std::string flatten_tool_output(const Json& output) {
  if (output.is_string()) return output.get<std::string>();
  std::string s;
  if (output.is_array()) {
    for (const auto& p : output) {
      if (p.is_object() && p.contains("text") && p["text"].is_string()) {
        s += p["text"].get<std::string>();
      }
    }
  }
  return s;
}

Json tool_call_message(const Json& m, const Json& name, std::string arguments) {
  Json id = m.contains("call_id") && !m["call_id"].is_null() ? m["call_id"] : m.value("id", Json());
  return Json{{"role", "assistant"},
              {"tool_calls",
               Json::array({Json{{"id", id},
                                 {"type", "function"},
                                 {"function", Json{{"name", name}, {"arguments", arguments}}}}})}};
}

// _normalize_response_message_for_chat: one input item as a chat message (null: dropped).
// Returns "" or the ValueError's message.
std::string normalize_item(Json m, Json& out) {
  out = Json();
  if (!m.is_object()) {
    out = m;
    return "";
  }
  if (m.value("role", "") == "developer") {
    m["role"] = "system";
    m["content"] = label_developer(m.value("content", Json()));
  }
  const std::string type =
      m.contains("type") && m["type"].is_string() ? m["type"].get<std::string>() : std::string();
  if (type == "function_call") {
    std::string args = "{}";
    const Json raw = m.value("arguments", Json());
    if (raw.is_string()) {
      Json parsed = Json::parse(raw.get<std::string>(), nullptr, false);
      if (!parsed.is_discarded() && parsed.is_object()) args = raw.get<std::string>();
    } else if (raw.is_object()) {
      args = raw.dump();
    }
    out = tool_call_message(m, m.value("name", Json()), args);
    return "";
  }
  if (type == "function_call_output" || type == "custom_tool_call_output") {
    out = Json{{"role", "tool"},
               {"tool_call_id", m.value("call_id", Json())},
               {"content", flatten_tool_output(m.value("output", Json("")))}};
    return "";
  }
  if (type == "reasoning") {
    std::string text;
    for (const char* key : {"summary", "content"}) {
      if (!text.empty() || !m.contains(key) || !m[key].is_array()) continue;
      for (const auto& e : m[key]) {
        if (e.is_object() && e.contains("text") && e["text"].is_string() &&
            !e["text"].get<std::string>().empty()) {
          if (!text.empty()) text += "\n";
          text += e["text"].get<std::string>();
        }
      }
    }
    if (!text.empty()) out = Json{{"role", "assistant"}, {"reasoning_content", text}};
    return "";
  }
  if (!type.empty() && type != "message") {
    return "Unsupported Responses API input item type: '" + type + "'";
  }
  out = Json::object();
  for (auto it = m.begin(); it != m.end(); ++it) {
    if (it.value().is_null() || it.key() == "id" || it.key() == "status" || it.key() == "type") {
      continue;
    }
    if (it.key() == "content" && it.value().is_array()) {
      Json parts = Json::array();
      for (const auto& p : it.value()) parts.push_back(normalize_part(p));
      out["content"] = std::move(parts);
    } else {
      out[it.key()] = it.value();
    }
  }
  return "";
}

Json as_parts(const Json& c) {
  if (c.is_array()) return c;
  if (c.is_string() && !c.get<std::string>().empty()) {
    return Json::array({Json{{"type", "text"}, {"text", c}}});
  }
  return Json::array();
}

// _merge_consecutive_assistant_messages: one assistant block per turn.
Json merge_assistants(const Json& messages) {
  Json merged = Json::array();
  for (const auto& msg : messages) {
    const bool assistant = msg.is_object() && msg.value("role", "") == "assistant";
    if (assistant && !merged.empty() && merged.back().is_object() &&
        merged.back().value("role", "") == "assistant" &&
        merged.back().value("phase", Json()) == msg.value("phase", Json())) {
      Json& prev = merged.back();
      const Json nc = msg.value("content", Json());
      if (!nc.is_null() && nc != Json("")) {
        const Json pc = prev.value("content", Json());
        if (pc.is_null() || pc == Json("")) {
          prev["content"] = nc;
        } else if (pc.is_string() && nc.is_string()) {
          prev["content"] = pc.get<std::string>() + "\n\n" + nc.get<std::string>();
        } else {
          Json parts = as_parts(pc);
          for (const auto& p : as_parts(nc)) parts.push_back(p);
          prev["content"] = std::move(parts);
        }
      }
      if (msg.contains("tool_calls") && msg["tool_calls"].is_array() &&
          !msg["tool_calls"].empty()) {
        Json calls = prev.value("tool_calls", Json::array());
        for (const auto& c : msg["tool_calls"]) calls.push_back(c);
        prev["tool_calls"] = std::move(calls);
      }
      if (msg.contains("reasoning_content") && msg["reasoning_content"].is_string() &&
          !msg["reasoning_content"].get<std::string>().empty()) {
        const Json pr = prev.value("reasoning_content", Json());
        prev["reasoning_content"] =
            pr.is_string() && !pr.get<std::string>().empty()
                ? pr.get<std::string>() + "\n" + msg["reasoning_content"].get<std::string>()
                : msg["reasoning_content"].get<std::string>();
      }
      continue;
    }
    merged.push_back(msg);
  }
  return merged;
}

// _construct_input_messages: instructions, then the history's and the input's items as chat
// messages, assistant turns merged, every system text coalesced into one leading message.
std::string build_messages(const std::optional<std::string>& instructions, const Json& history,
                           Json& out) {
  Json messages = Json::array();
  if (instructions && !instructions->empty()) {
    messages.push_back(Json{{"role", "system"}, {"content", *instructions}});
  }
  for (const auto& item : history) {
    Json m;
    if (std::string e = normalize_item(item, m); !e.empty()) return e;
    if (!m.is_null()) messages.push_back(std::move(m));
  }
  messages = merge_assistants(messages);
  std::vector<std::string> system;
  out = Json::array();
  for (auto& m : messages) {
    if (m.is_object() && m.value("role", "") == "system") {
      const Json c = m.value("content", Json());
      if (c.is_string()) {
        system.push_back(c.get<std::string>());
      } else if (c.is_array()) {
        for (const auto& p : c) {
          if (p.is_object() && p.contains("text") && p["text"].is_string()) {
            system.push_back(p["text"].get<std::string>());
          }
        }
      }
    } else {
      out.push_back(std::move(m));
    }
  }
  if (!system.empty()) {
    std::string joined;
    for (size_t i = 0; i < system.size(); ++i) {
      if (i) joined += "\n\n";
      joined += system[i];
    }
    out.insert(out.begin(), Json{{"role", "system"}, {"content", joined}});
  }
  return "";
}

// ResponsesRequest._normalize_input_item_for_validation: a replayed output item's string id is
// dropped (it would otherwise read as an item reference).
Json validated_item(Json item) {
  if (item.is_object() && item.contains("id") && item["id"].is_string() &&
      item.contains("content") && !item["content"].is_null()) {
    item.erase("id");
  }
  return item;
}

// The field's JSON when present and not null.
const Json* field(const Json& o, const char* key) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return nullptr;
  return &*it;
}

// The 400 of a body FastAPI's validation refuses (SGLang answers it in the Responses envelope).
ResponsesError invalid_body(std::string_view what) {
  return error(400, what, std::nullopt, "Bad Request");
}

std::string_view status_of(const FinishReason* f) {
  if (!f) return "completed";
  switch (f->kind) {
    case FinishReason::Kind::kLength:
      return "incomplete";
    case FinishReason::Kind::kAbort:
      return "failed";
    case FinishReason::Kind::kStop:
      break;
  }
  return "completed";
}

void append_usage(std::string& out, const ResponseResult& r) {
  out.append(R"({"input_tokens":)");
  append_int(out, r.prompt_tokens);
  out.append(R"(,"input_tokens_details":{"cached_tokens":)");
  append_int(out, r.cached_tokens);
  out.append(R"(,"cache_write_tokens":0},"output_tokens":)");
  append_int(out, r.completion_tokens);
  out.append(R"(,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":)");
  append_int(out, r.prompt_tokens + r.completion_tokens);
  out.push_back('}');
}

// The response object's fields after "output" (status, usage and the echoed request).
// `usage`: null when absent; `error`: null when absent.
void append_tail(std::string& out, const ResponsesContext& c, std::string_view status,
                 const ResponseResult* usage, std::optional<std::string_view> error_message,
                 bool text_only, bool tools_empty) {
  out.append(R"(,"status":)");
  json::append_string(out, status);
  out.append(R"(,"usage":)");
  if (usage) {
    append_usage(out, *usage);
  } else {
    out.append("null");
  }
  out.append(R"(,"parallel_tool_calls":true,"tool_choice":)");
  out.append(c.tool_choice);
  out.append(R"(,"tools":)");
  out.append(tools_empty ? "[]" : c.tools);
  out.append(R"(,"error":)");
  if (error_message) {
    out.append(R"({"code":"server_error","message":)");
    json::append_string(out, *error_message);
    out.push_back('}');
  } else {
    out.append("null");
  }
  out.append(R"(,"incomplete_details":)");
  out.append(status == "incomplete" ? R"({"reason":"max_output_tokens"})" : "null");
  // Fields echoed as the request gave them (JSON text), in SGLang's order.
  for (const auto& [key, value] :
       {std::pair<std::string_view, const std::string*>{R"(,"instructions":)", &c.instructions},
        {R"(,"max_output_tokens":)", &c.max_output_tokens},
        {R"(,"previous_response_id":)", &c.previous_response_id},
        {R"(,"reasoning":{"effort":)", &c.reasoning_effort},
        {R"(,"summary":null},"store":)", &c.store},
        {R"(,"temperature":)", &c.temperature}}) {
    out.append(key).append(*value);
  }
  out.append(R"(,"text":)");
  if (!c.text.empty()) {
    out.append(c.text);
  } else {
    out.append(text_only ? R"({"format":{"type":"text"}})" : "null");
  }
  for (const auto& [key, value] :
       {std::pair<std::string_view, const std::string*>{R"(,"top_p":)", &c.top_p},
        {R"(,"truncation":)", &c.truncation},
        {R"(,"user":)", &c.user},
        {R"(,"metadata":)", &c.metadata}}) {
    out.append(key).append(*value);
  }
  out.push_back('}');
}

void append_head(std::string& out, const ResponsesContext& c) {
  out.append(R"({"id":)");
  json::append_string(out, c.id);
  out.append(R"(,"object":"response","created_at":)");
  append_int(out, c.created_at);
  out.append(R"(,"model":)");
  if (c.model) {
    json::append_string(out, *c.model);
  } else {
    out.append("null");
  }
}

// ResponseOutputText, as its model_dump lists it.
void append_output_text(std::string& out, std::string_view text) {
  out.append(R"({"annotations":[],"text":)");
  json::append_string(out, text);
  out.append(R"(,"type":"output_text","logprobs":null})");
}

// SGLang's ResponseOutputMessage (`text` null: the item as added, before any content).
void append_message_item(std::string& out, std::string_view id, const std::string_view* text,
                         std::string_view status) {
  out.append(R"({"id":)");
  json::append_string(out, id);
  out.append(R"(,"content":[)");
  if (text) append_output_text(out, *text);
  out.append(R"(],"role":"assistant","status":)");
  json::append_string(out, status);
  out.append(R"(,"type":"message","phase":"final_answer"})");
}

}  // namespace

std::optional<ResponseStore::Entry> ResponseStore::get(const std::string& id) const {
  std::lock_guard lock(mu_);
  auto it = map_.find(id);
  if (it == map_.end()) return std::nullopt;
  return it->second.entry;
}

void ResponseStore::put(const std::string& id, Entry e) {
  std::lock_guard lock(mu_);
  if (auto it = map_.find(id); it != map_.end()) {
    it->second.entry = std::move(e);
    return;
  }
  order_.push_back(id);
  map_.emplace(id, Slot{std::move(e), std::prev(order_.end())});
  while (map_.size() > capacity_) {
    map_.erase(order_.front());
    order_.pop_front();
  }
}

size_t ResponseStore::size() const {
  std::lock_guard lock(mu_);
  return map_.size();
}

std::string responses_error_body(std::string_view message, std::string_view type,
                                 std::optional<std::string_view> param, int code) {
  std::string out = R"({"error":{"message":)";
  json::append_string(out, message);
  out.append(R"(,"type":)");
  json::append_string(out, type);
  out.append(R"(,"param":)");
  if (param) {
    json::append_string(out, *param);
  } else {
    out.append("null");
  }
  out.append(R"(,"code":)");
  append_int(out, code);
  out.append("}}");
  return out;
}

std::string new_message_id() {
  return "msg_" + random_hex();
}

ResponsesError parse_responses_request(std::string& body, const ResponsesOptions& opt,
                                       ResponseStore& store, const Tokenizer& tok,
                                       const ChatTemplate& tmpl, const RequestLimits& limits,
                                       ParsedRequest& out) {
  out.clear();
  const Json o = Json::parse(body, nullptr, false);
  if (o.is_discarded() || !o.is_object()) {
    return invalid_body("the request body must be a JSON object");
  }
  const Json* input = field(o, "input");
  if (!input) return invalid_body("'input' is required (a string or a list of input items)");
  if (!input->is_string() && !input->is_array()) {
    return invalid_body("'input' must be a string or a list of input items");
  }
  if (input->is_array()) {
    for (const auto& item : *input) {
      if (!item.is_object()) return invalid_body("each item of 'input' must be an object");
    }
  }
  const Json* prev = field(o, "previous_response_id");
  const Json* instructions = field(o, "instructions");
  const Json* model = field(o, "model");
  const Json* max_output = field(o, "max_output_tokens");
  if (prev && !prev->is_string()) return invalid_body("'previous_response_id' must be a string");
  if (instructions && !instructions->is_string()) {
    return invalid_body("'instructions' must be a string");
  }
  if (model && !model->is_string()) return invalid_body("'model' must be a string");
  if (max_output && !max_output->is_number_integer()) {
    return invalid_body("'max_output_tokens' must be an integer");
  }
  bool stream = false, background = false;
  if (const Json* s = field(o, "stream")) {
    if (!s->is_boolean()) return invalid_body("'stream' must be true or false");
    stream = s->get<bool>();
  }
  if (const Json* b = field(o, "background")) {
    if (!b->is_boolean()) return invalid_body("'background' must be true or false");
    background = b->get<bool>();
  }
  // store: true by default; an explicit null is falsy (and echoed as null).
  std::string store_json = "true";
  bool store_flag = true;
  if (auto it = o.find("store"); it != o.end()) {
    if (it->is_null()) {
      store_json = "null";
      store_flag = false;
    } else if (!it->is_boolean()) {
      return invalid_body("'store' must be true or false");
    } else {
      store_flag = it->get<bool>();
      store_json = store_flag ? "true" : "false";
    }
  }

  // create_responses' checks, in its order.
  if (!opt.enable_store && prev) return error(400, kStoreDisabled, "previous_response_id");
  if (!opt.enable_store && background) return error(400, kStoreDisabled, "background");
  if (background && !store_flag) {
    return error(400, "background=true requires store=true.", "store");
  }
  if (model) {
    const std::string name = model->get<std::string>();
    const std::string base = name.substr(0, name.find(':'));
    bool known = false;
    for (std::string_view n : {name, base}) {
      known = known || n == opt.served_model_name;
      for (const auto& a : opt.lora_adapters) known = known || n == a;
    }
    if (!known) return error(404, "The model '" + name + "' does not exist", "model");
  }
  const Json tools = o.contains("tools") && o["tools"].is_array() ? o["tools"] : Json::array();
  const Json tool_choice = o.value("tool_choice", Json("auto"));
  if (tool_choice == Json("required")) {
    bool forcible = false;
    for (const auto& t : tools) {
      forcible = forcible || t.value("type", "") == "function" || t.value("type", "") == "custom";
    }
    if (!forcible) {
      return error(400,
                   "tool_choice=\"required\" requires at least one tool with type=\"function\" or "
                   "type=\"custom\"; other built-in tool types cannot be forced.");
    }
  }
  const std::string effective_choice = effective_tool_choice(tool_choice);
  if (effective_choice.front() == '{') {
    const std::string name = Json::parse(effective_choice)["name"].get<std::string>();
    bool declared = false;
    for (const auto& t : tools) {
      const std::string type = t.value("type", "");
      declared = declared || ((type == "function" || type == "custom") &&
                              t.value("name", Json()) == Json(name));
    }
    if (!declared) return error(400, "Tool '" + name + "' is not declared in tools", "tool_choice");
  }
  if (stream && o.contains("include") && o["include"].is_array()) {
    for (const auto& inc : o["include"]) {
      if (inc == Json("message.output_text.logprobs")) {
        return error(400, "logprobs are not supported in streaming mode", "logprobs");
      }
    }
  }
  std::string prev_history;
  if (prev) {
    const std::string id = prev->get<std::string>();
    if (!id.starts_with("resp_")) {
      return error(400,
                   "Invalid 'response_id': '" + id + "'. Expected an ID that begins with 'resp'.",
                   "response_id");
    }
    auto entry = store.get(id);
    if (!entry) return error(404, "Response with id '" + id + "' not found.", "response_id");
    prev_history = std::move(entry->history);
  }
  if (background) {
    return error(400, "background=true is not simulated by kvgate-sim", "background");
  }

  // The conversation: the previous response's items, then this input's.
  auto ctx = std::make_shared<ResponsesContext>();
  std::string& history = ctx->history;
  history = prev_history;
  auto add = [&history](const Json& item) {
    if (!history.empty()) history.push_back(',');
    history.append(item.dump());
  };
  if (input->is_string()) {
    add(Json{{"role", "user"}, {"content", *input}});
  } else {
    for (const auto& item : *input) add(validated_item(item));
  }
  const Json items = Json::parse("[" + history + "]", nullptr, false);
  std::optional<std::string> instr;
  if (instructions) instr = instructions->get<std::string>();
  Json messages;
  if (std::string e = build_messages(instr, items, messages); !e.empty()) {
    return error(400, e + " None");  // f"{e} {e.__cause__}"
  }

  // The request id is the response id and the engine's rid.
  ctx->id = o.contains("request_id") && o["request_id"].is_string()
                ? o["request_id"].get<std::string>()
                : "resp_" + random_hex();

  // A chat request for the engine, with the routing fields GenerateReqInput gets.
  Json chat;
  chat["messages"] = messages;
  chat["stream"] = stream;
  chat["rid"] = ctx->id;
  for (const char* key :
       {"stop", "cache_salt", "routed_dp_rank", "disagg_prefill_dp_rank", "bootstrap_host",
        "bootstrap_port", "bootstrap_room", "chat_template_kwargs"}) {
    if (const Json* v = field(o, key)) chat[key] = *v;
  }
  std::string chat_body = chat.dump();
  RequestLimits first = limits;
  first.default_max_new_tokens = 0;  // the output budget is set below, from the prompt's length
  if (std::string e = parse_request(Route::kResponses, chat_body, tok, tmpl, first, out);
      !e.empty()) {
    return error(400, e);
  }
  out.include_usage = false;
  // create_responses: max(context - prompt, 512) as the default budget, max_output_tokens below
  // it, minus the 2 tokens of headroom ResponsesRequest.to_sampling_params keeps. Without
  // max_output_tokens the sim's --default-max-new-tokens stands for "until the model stops".
  const auto prompt_len = static_cast<int64_t>(out.prompts[0].size());
  const int64_t default_max = std::max<int64_t>(opt.context_length - prompt_len, 512);
  int64_t max_new = max_output ? std::min(max_output->get<int64_t>(), default_max) - 2
                               : std::min(opt.default_max_new_tokens, default_max - 2);
  if (max_new < 0) {
    return error(400, "max_new_tokens must be at least 0, got " + std::to_string(max_new) + ".");
  }
  out.sampling.max_new_tokens = max_new;
  if (std::string e = check_request_lengths(out, limits); !e.empty()) return error(400, e);

  ctx->created_at = static_cast<int64_t>(std::time(nullptr));
  if (model) ctx->model = model->get<std::string>();
  ctx->tool_choice = effective_choice;
  ctx->tools = dump_tools(tools);
  ctx->instructions = instructions ? string_or_null(*instructions) : "null";
  ctx->max_output_tokens = max_output ? max_output->dump() : "null";
  ctx->previous_response_id = prev ? string_or_null(*prev) : "null";
  if (const Json* r = field(o, "reasoning"); r && r->is_object()) {
    ctx->reasoning_effort = string_or_null(r->value("effort", Json()));
  }
  ctx->store = store_json;
  if (const Json* t = field(o, "temperature")) ctx->temperature = float_or_null(*t);
  if (const Json* t = field(o, "top_p")) ctx->top_p = float_or_null(*t);
  if (const Json* t = field(o, "text")) ctx->text = t->dump();
  if (const Json* t = field(o, "truncation")) ctx->truncation = string_or_null(*t);
  if (const Json* u = field(o, "user")) ctx->user = string_or_null(*u);
  if (const Json* m = field(o, "metadata"); m && m->is_object()) ctx->metadata = m->dump();
  if (opt.enable_store && store_flag) ctx->persist = &store;
  out.model = ctx->model.value_or("");
  out.responses = std::move(ctx);
  return {};
}

ResponsesError retrieve_response(std::string_view id, bool enable_store,
                                 const ResponseStore& store) {
  if (!enable_store) return error(400, kStoreDisabled, "response_id");
  if (!id.starts_with("resp_")) {
    return error(
        400,
        "Invalid 'response_id': '" + std::string(id) + "'. Expected an ID that begins with 'resp'.",
        "response_id");
  }
  auto entry = store.get(std::string(id));
  if (!entry) {
    return error(404, "Response with id '" + std::string(id) + "' not found.", "response_id");
  }
  return ResponsesError{.status = 200, .body = std::move(entry->object)};
}

ResponsesError cancel_response(std::string_view id, bool enable_store, const ResponseStore& store) {
  // Only background responses can still be queued or in progress, and the sim runs none: every
  // stored response is terminal, and a cancel returns it as it is.
  return retrieve_response(id, enable_store, store);
}

void append_response_object(std::string& out, const ResponsesContext& c, const ResponseResult& r,
                            bool tools_empty) {
  const std::string_view status = status_of(r.finish);
  append_head(out, c);
  out.append(R"(,"output":[)");
  const bool has_text = !r.text.empty();
  if (has_text) append_message_item(out, r.message_id, &r.text, "completed");
  out.push_back(']');
  std::optional<std::string_view> err;
  if (status == "failed") {
    err = r.finish->message.empty() ? std::string_view("Generation aborted")
                                    : std::string_view(r.finish->message);
  }
  append_tail(out, c, status, &r, err, has_text, tools_empty);
}

void finish_response(std::string& out, const ResponsesContext& c, const ResponseResult& r) {
  append_response_object(out, c, r, false);
  if (!c.persist) return;
  std::string history = c.history;
  if (!r.text.empty()) {
    // The output item as model_dump(exclude_none=True) stores it.
    if (!history.empty()) history.push_back(',');
    history.append(R"({"id":)");
    json::append_string(history, r.message_id);
    history.append(R"(,"content":[{"annotations":[],"text":)");
    json::append_string(history, r.text);
    history.append(
        R"(,"type":"output_text"}],"role":"assistant","status":"completed","type":"message","phase":"final_answer"})");
  }
  c.persist->put(c.id, ResponseStore::Entry{.object = out, .history = std::move(history)});
}

void append_event(std::string& out, std::string_view type, std::string_view fields, int64_t seq,
                  std::string_view after) {
  out.append("event: ");
  out.append(type);
  out.append("\ndata: {");
  out.append(fields);
  if (!fields.empty()) out.push_back(',');
  out.append(R"("sequence_number":)");
  append_int(out, seq);
  if (!after.empty()) {
    out.push_back(',');
    out.append(after);
  }
  out.append(R"(,"type":)");
  json::append_string(out, type);
  out.append("}\n\n");
}

void append_stream_start(std::string& out, const ResponsesContext& c) {
  std::string initial = R"("response":)";
  append_head(initial, c);
  initial.append(R"(,"output":[])");
  append_tail(initial, c, "in_progress", nullptr, std::nullopt, false, true);
  append_event(out, "response.created", initial, 0);
  append_event(out, "response.in_progress", initial, 1);
}

void append_exception_failure(std::string& out, const ResponsesContext& c, int abort_status,
                              std::string_view message, bool stream, int& http_status) {
  // str(e): an HTTPException prints "status: detail", a ValueError its message.
  std::string text = abort_status >= 500
                         ? std::to_string(abort_status) + ": " + std::string(message)
                         : std::string(message);
  if (!stream) {
    http_status = 400;
    out = responses_error_body(text, "invalid_request_error", std::nullopt, 400);
    return;
  }
  http_status = 200;
  append_stream_start(out, c);
  std::string failed = R"("response":)";
  append_head(failed, c);
  failed.append(R"(,"output":[])");
  append_tail(failed, c, "failed", nullptr, std::string_view(text), false, true);
  append_event(out, "response.failed", failed, 2);
}

void append_message_opened(std::string& out, std::string_view item_id, int64_t& seq) {
  std::string f = R"("item":)";
  append_message_item(f, item_id, nullptr, "in_progress");
  f.append(R"(,"output_index":0)");
  append_event(out, "response.output_item.added", f, seq++);
  f = R"("content_index":0,"item_id":)";
  json::append_string(f, item_id);
  f.append(R"(,"output_index":0,"part":)");
  append_output_text(f, "");
  append_event(out, "response.content_part.added", f, seq++);
}

void append_text_delta(std::string& out, std::string_view item_id, std::string_view delta,
                       int64_t& seq) {
  std::string f = R"("content_index":0,"delta":)";
  json::append_string(f, delta);
  f.append(R"(,"item_id":)");
  json::append_string(f, item_id);
  f.append(R"(,"logprobs":[],"output_index":0)");
  append_event(out, "response.output_text.delta", f, seq++);
}

void append_message_closed(std::string& out, std::string_view item_id, std::string_view text,
                           int64_t& seq) {
  std::string f = R"("content_index":0,"item_id":)";
  json::append_string(f, item_id);
  f.append(R"(,"logprobs":[],"output_index":0)");
  std::string after = R"("text":)";
  json::append_string(after, text);
  append_event(out, "response.output_text.done", f, seq++, after);
  f = R"("content_index":0,"item_id":)";
  json::append_string(f, item_id);
  f.append(R"(,"output_index":0,"part":)");
  append_output_text(f, text);
  append_event(out, "response.content_part.done", f, seq++);
  f = R"("item":)";
  append_message_item(f, item_id, &text, "completed");
  f.append(R"(,"output_index":0)");
  append_event(out, "response.output_item.done", f, seq++);
}

void append_stream_end(std::string& out, const ResponsesContext& c, const ResponseResult& r,
                       int64_t seq) {
  std::string f = R"("response":)";
  append_response_object(f, c, r, true);
  std::string type = "response.";
  type.append(status_of(r.finish));
  append_event(out, type, f, seq);
}

}  // namespace kvgate::sim
