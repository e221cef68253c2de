// tokenizer/chat_template: see chat_template.h.
#include "tokenizer/chat_template.h"

#include <filesystem>
#include <regex>

#include "tokenizer/tokenizer.h"

namespace kvgate::tokenizer {
namespace {

// Special tokens of a tokenizer_config.json, as transformers' special_tokens_map passes them.
std::vector<std::pair<std::string, jinja::Value>> special_tokens(const jinja::Value& config) {
  std::vector<std::pair<std::string, jinja::Value>> out;
  if (!config.is_dict()) return out;
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                          "cls_token", "mask_token"}) {
    const jinja::Value* v = config.obj().find(key);
    if (!v) continue;
    if (v->is_string()) {
      out.emplace_back(key, *v);
    } else if (v->is_dict()) {
      if (const jinja::Value* c = v->obj().find("content"); c && c->is_string()) {
        out.emplace_back(key, *c);
      }
    }
  }
  if (const jinja::Value* v = config.obj().find("additional_special_tokens"); v && v->is_array()) {
    std::vector<jinja::Value> items;
    for (const auto& x : v->arr().items) {
      if (x.is_string()) {
        items.push_back(x);
      } else if (x.is_dict()) {
        if (const jinja::Value* c = x.obj().find("content"); c && c->is_string()) {
          items.push_back(*c);
        }
      }
    }
    out.emplace_back("additional_special_tokens", jinja::Value::array(std::move(items)));
  }
  return out;
}

// SGLang's content-format detection: a template that loops over a message's content takes
// content as a list of parts ("openai"); any other takes it as a string.
bool iterates_content(std::string_view source) {
  static const std::regex kLoop(
      R"(for\s+\w+\s+in\s+(message|msg|m)\s*(\[\s*['"]content['"]\s*\]|\.content))");
  return std::regex_search(source.begin(), source.end(), kLoop);
}

// A copy sharing no cell with `v` (so it can be made immortal and freed on its own).
jinja::Value deep_copy(const jinja::Value& v) {
  if (v.is_string()) return jinja::Value(v.str());
  if (v.is_array()) {
    std::vector<jinja::Value> items;
    items.reserve(v.arr().items.size());
    for (const auto& x : v.arr().items) items.push_back(deep_copy(x));
    return jinja::Value::array(std::move(items), v.is_tuple());
  }
  if (v.is_object()) {
    jinja::Value o = v.is_namespace() ? jinja::Value::make_namespace() : jinja::Value::object();
    for (const auto& [k, x] : v.obj().items) o.obj_mut().items.emplace_back(k, deep_copy(x));
    return o;
  }
  return v;  // scalars hold no cell
}

}  // namespace

// Every thread renders with the same special-token values. Values count references without
// atomics (a render belongs to one thread), so shared ones are immortal: copying them into a
// render's variables touches no counter. The template frees them when it goes away.
void ChatTemplate::own_specials() {
  for (auto& [name, v] : specials_) {
    v = deep_copy(v);
    v.make_immortal();
  }
}

ChatTemplate::~ChatTemplate() {
  for (auto& [name, v] : specials_) v.free_immortal();
}

std::unique_ptr<ChatTemplate> ChatTemplate::from_source(
    std::string_view source, std::vector<std::pair<std::string, jinja::Value>> specials,
    std::string& error) {
  auto t = jinja::Template::parse(source, error);
  if (!t) return nullptr;
  std::unique_ptr<ChatTemplate> ct(new ChatTemplate());
  ct->variants_.push_back({"default", std::move(t), iterates_content(source)});
  ct->specials_ = std::move(specials);
  ct->own_specials();
  return ct;
}

std::unique_ptr<ChatTemplate> ChatTemplate::from_config(std::string_view config_json,
                                                        std::string& error) {
  jinja::Value config;
  if (!jinja::from_json(config_json, config, error)) {
    error = "tokenizer_config.json: " + error;
    return nullptr;
  }
  if (!config.is_dict()) {
    error = "tokenizer_config.json is not an object";
    return nullptr;
  }
  const jinja::Value* ct = config.obj().find("chat_template");
  if (!ct || ct->is_none()) {
    error = "tokenizer_config.json has no chat_template";
    return nullptr;
  }
  std::unique_ptr<ChatTemplate> out(new ChatTemplate());
  out->specials_ = special_tokens(config);
  out->own_specials();
  if (ct->is_string()) {
    auto t = jinja::Template::parse(ct->str(), error);
    if (!t) return nullptr;
    out->variants_.push_back({"default", std::move(t), iterates_content(ct->str())});
    return out;
  }
  if (!ct->is_array()) {
    error = "chat_template is neither a string nor a list of named templates";
    return nullptr;
  }
  for (const auto& item : ct->arr().items) {
    const jinja::Value* name = item.is_dict() ? item.obj().find("name") : nullptr;
    const jinja::Value* src = item.is_dict() ? item.obj().find("template") : nullptr;
    if (!name || !src || !name->is_string() || !src->is_string()) {
      error = "chat_template list entries need 'name' and 'template'";
      return nullptr;
    }
    auto t = jinja::Template::parse(src->str(), error);
    if (!t) {
      error.insert(0, "chat_template '" + name->str() + "': ");
      return nullptr;
    }
    Variant v{name->str(), std::move(t), iterates_content(src->str())};
    if (v.name == "default") {
      out->variants_.insert(out->variants_.begin(), std::move(v));
    } else {
      out->variants_.push_back(std::move(v));
    }
  }
  if (out->variants_.empty() || out->variants_[0].name != "default") {
    error = "chat_template list has no 'default' template";
    return nullptr;
  }
  return out;
}

std::unique_ptr<ChatTemplate> ChatTemplate::load(const std::string& dir, std::string& error) {
  std::string cfg, err;
  read_file(dir + "/tokenizer_config.json", cfg, err);
  // transformers reads a standalone chat_template.jinja (or chat_template.json) first.
  std::string jinja_src;
  if (std::filesystem::exists(dir + "/chat_template.jinja") &&
      read_file(dir + "/chat_template.jinja", jinja_src, err)) {
    jinja::Value config;
    std::string e2;
    if (!cfg.empty()) jinja::from_json(cfg, config, e2);
    auto t = from_source(jinja_src, special_tokens(config), error);
    if (!t) error = dir + "/chat_template.jinja: " + error;
    return t;
  }
  std::string json_src;
  if (std::filesystem::exists(dir + "/chat_template.json") &&
      read_file(dir + "/chat_template.json", json_src, err)) {
    jinja::Value doc, config;
    std::string e2;
    if (!cfg.empty()) jinja::from_json(cfg, config, e2);
    if (jinja::from_json(json_src, doc, error) && doc.is_dict()) {
      if (const jinja::Value* s = doc.obj().find("chat_template"); s && s->is_string()) {
        auto t = from_source(s->str(), special_tokens(config), error);
        if (!t) error = dir + "/chat_template.json: " + error;
        return t;
      }
    }
  }
  if (cfg.empty()) {
    error = dir + ": no tokenizer_config.json with a chat_template";
    return nullptr;
  }
  auto t = from_config(cfg, error);
  if (!t) error = dir + "/" + error;
  return t;
}

const ChatTemplate::Variant& ChatTemplate::variant_for(const jinja::Value& tools) const {
  if (tools.is_array() && !tools.arr().items.empty()) {
    for (const auto& v : variants_) {
      if (v.name == "tool_use") return v;
    }
  }
  return variants_[0];
}

bool ChatTemplate::render(const Input& in, std::string& out, std::string& error) const {
  const jinja::Template* t = variant_for(in.tools).tmpl.get();
  std::vector<std::pair<std::string, jinja::Value>> vars;
  vars.reserve(5 + specials_.size() + in.extra.size());
  vars.emplace_back("messages", in.messages);
  vars.emplace_back("tools", in.tools.is_undefined() ? jinja::Value::none() : in.tools);
  vars.emplace_back("documents", jinja::Value::none());
  vars.emplace_back("add_generation_prompt", jinja::Value(in.add_generation_prompt));
  for (const auto& s : specials_) vars.push_back(s);
  for (const auto& e : in.extra) vars.push_back(e);
  // Later entries win: drop earlier duplicates.
  std::vector<std::pair<std::string, jinja::Value>> unique;
  unique.reserve(vars.size());
  for (size_t i = 0; i < vars.size(); ++i) {
    bool later = false;
    for (size_t j = i + 1; j < vars.size() && !later; ++j) later = vars[j].first == vars[i].first;
    if (!later) unique.push_back(std::move(vars[i]));
  }
  return t->render(unique, out, error);
}

namespace {

bool input_from_json(std::string_view messages_json, std::string_view tools_json,
                     bool add_generation_prompt, std::string_view extra_json,
                     ChatTemplate::Input& in, std::string& error) {
  in.add_generation_prompt = add_generation_prompt;
  if (!jinja::from_json(messages_json, in.messages, error)) {
    error = "messages: " + error;
    return false;
  }
  if (!tools_json.empty() && !jinja::from_json(tools_json, in.tools, error)) {
    error = "tools: " + error;
    return false;
  }
  if (!extra_json.empty()) {
    jinja::Value extra;
    if (!jinja::from_json(extra_json, extra, error) || !extra.is_dict()) {
      error = "chat_template_kwargs: " + (error.empty() ? std::string("not an object") : error);
      return false;
    }
    for (const auto& kv : extra.obj().items) in.extra.push_back(kv);
  }
  return true;
}

const jinja::Value* find_string(const jinja::Value& dict, std::string_view key) {
  const jinja::Value* v = dict.is_dict() ? dict.obj().find(key) : nullptr;
  return v && v->is_string() ? v : nullptr;
}

// One message as SGLang's OpenAI route hands it to the template (see render_request_json).
jinja::Value sglang_message(const jinja::Value& m, bool openai_content) {
  if (!m.is_dict()) return m;
  jinja::Value msg = jinja::Value::object();
  for (const auto& [k, v] : m.obj().items) {
    if (v.is_none()) continue;  // SGLang drops null fields (content: null, tool_calls: null)
    if (k != "content" || !v.is_array()) {
      msg.obj_mut().set(k, v);
      continue;
    }
    if (openai_content) {  // parts kept; image_url parts become {"type": "image"}
      std::vector<jinja::Value> parts;
      parts.reserve(v.arr().items.size());
      for (const auto& part : v.arr().items) {
        const jinja::Value* type = find_string(part, "type");
        if (type && type->str() == "image_url") {
          jinja::Value img = jinja::Value::object();
          img.obj_mut().set("type", jinja::Value("image"));
          parts.push_back(std::move(img));
        } else {
          parts.push_back(part);
        }
      }
      msg.obj_mut().set(k, jinja::Value::array(std::move(parts)));
      continue;
    }
    std::string text;  // the text parts joined with spaces (Python's " ".join)
    bool first = true;
    for (const auto& part : v.arr().items) {
      const jinja::Value* type = find_string(part, "type");
      const jinja::Value* t = find_string(part, "text");
      if (!type || type->str() != "text" || !t) continue;
      if (!first) text.push_back(' ');
      first = false;
      text += t->str();
    }
    msg.obj_mut().set(k, jinja::Value(std::move(text)));
  }
  return msg;
}

}  // namespace

bool ChatTemplate::render_request_json(std::string_view messages_json, std::string_view tools_json,
                                       bool add_generation_prompt, std::string_view extra_json,
                                       std::string& out, std::string& error) const {
  Input in;
  if (!input_from_json(messages_json, tools_json, add_generation_prompt, extra_json, in, error)) {
    return false;
  }
  if (!in.messages.is_array()) {
    error = "messages: not a list";
    return false;
  }
  // The variant render() picks decides the content format.
  bool openai_content = variant_for(in.tools).openai_content;
  std::vector<jinja::Value> normalized;
  normalized.reserve(in.messages.arr().items.size());
  for (const auto& m : in.messages.arr().items)
    normalized.push_back(sglang_message(m, openai_content));
  in.messages = jinja::Value::array(std::move(normalized));
  return render(in, out, error);
}

bool ChatTemplate::render_json(std::string_view messages_json, std::string_view tools_json,
                               bool add_generation_prompt, std::string_view extra_json,
                               std::string& out, std::string& error) const {
  Input in;
  return input_from_json(messages_json, tools_json, add_generation_prompt, extra_json, in, error) &&
         render(in, out, error);
}

}  // namespace kvgate::tokenizer
