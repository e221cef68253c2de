// tokenizer/chat_template: a model's chat template (tokenizer_config.json "chat_template", or
// chat_template.jinja / chat_template.json beside it) rendered as transformers'
// apply_chat_template renders it: variables messages, tools (None when absent), documents (None),
// add_generation_prompt, the special tokens of the config (bos_token, eos_token, unk_token,
// pad_token, ..., additional_special_tokens), then the caller's extra variables (e.g.
// enable_thinking from chat_template_kwargs), which win over the rest.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/jinja.h"

namespace kvgate::tokenizer {

class ChatTemplate {
 public:
  // From a model directory. nullptr with `error` set when there is no template or it does not
  // parse (the message names the unsupported construct).
  static std::unique_ptr<ChatTemplate> load(const std::string& dir, std::string& error);
  // From tokenizer_config.json text (its "chat_template" and special tokens). `name` picks one
  // of several named templates ("default" / "tool_use"); empty: default, or tool_use with tools.
  static std::unique_ptr<ChatTemplate> from_config(std::string_view config_json,
                                                   std::string& error);
  // From template source plus special-token variables.
  static std::unique_ptr<ChatTemplate> from_source(
      std::string_view source, std::vector<std::pair<std::string, jinja::Value>> specials,
      std::string& error);
  ~ChatTemplate();
  ChatTemplate(const ChatTemplate&) = delete;
  ChatTemplate& operator=(const ChatTemplate&) = delete;

  struct Input {
    jinja::Value messages;  // list of {role, content, ...}
    jinja::Value tools;     // list, or None / undefined for none
    bool add_generation_prompt = false;
    // Extra top-level variables (chat_template_kwargs); they override everything else.
    std::vector<std::pair<std::string, jinja::Value>> extra;
  };
  // Appends the prompt to `out`. False with `error` set on a template error (including the
  // template's own raise_exception message).
  bool render(const Input& in, std::string& out, std::string& error) const;

  // A chat request as SGLang's OpenAI route prepares it for the template: null fields dropped;
  // list contents flattened to their text parts joined with spaces, unless the template loops
  // over a message's content (then parts are kept, image_url parts become {"type": "image"}).
  // What the gateway and the sim render, so both see the engine's prompt.
  bool render_request_json(std::string_view messages_json, std::string_view tools_json,
                           bool add_generation_prompt, std::string_view extra_json,
                           std::string& out, std::string& error) const;

  // Same from JSON texts (messages: array; tools: array or empty; extra: object or empty), as
  // transformers' apply_chat_template (no normalization).
  bool render_json(std::string_view messages_json, std::string_view tools_json,
                   bool add_generation_prompt, std::string_view extra_json, std::string& out,
                   std::string& error) const;

 private:
  ChatTemplate() = default;
  void own_specials();
  struct Variant {
    std::string name;
    std::unique_ptr<jinja::Template> tmpl;
    bool openai_content = false;  // loops over message content: list contents stay lists
  };
  // The template render() uses: tool_use when there are tools and the model has one.
  const Variant& variant_for(const jinja::Value& tools) const;
  std::vector<Variant> variants_;  // [0] is the default
  std::vector<std::pair<std::string, jinja::Value>> specials_;
};

}  // namespace kvgate::tokenizer
