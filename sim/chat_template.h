// sim/chat_template: turns chat messages into the prompt text the model sees. The interface is what
// the chat route uses; behind it, the model's own Jinja template (src/tokenizer/chat_template:
// tokenizer_config.json, as transformers renders it) when --tokenizer-path names one, else the
// ChatML stand-in.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace kvgate::sim {

struct ChatMessage {
  std::string_view role;
  std::string_view content;  // text parts already joined
};

class ChatTemplate {
 public:
  virtual ~ChatTemplate() = default;
  virtual std::string_view name() const = 0;
  // Appends the rendered conversation to `out`; with add_generation_prompt, ends with the header
  // of the assistant turn the model is to write.
  virtual void render(std::span<const ChatMessage> messages, bool add_generation_prompt,
                      std::string& out) const = 0;

  // What the chat route calls: the request's own JSON as well (messages as sent, with list
  // contents and tool_calls; tools; chat_template_kwargs; each "" when absent), so a model
  // template renders exactly what SGLang renders, and gets to reject it (false, `error` set: the
  // route answers 400 with it, as SGLang does). The stand-in renders `messages` and never fails.
  virtual bool render_request(std::span<const ChatMessage> messages, std::string_view messages_json,
                              std::string_view tools_json, std::string_view kwargs_json,
                              bool add_generation_prompt, std::string& out,
                              std::string& error) const {
    (void)messages_json;
    (void)tools_json;
    (void)kwargs_json;
    (void)error;
    render(messages, add_generation_prompt, out);
    return true;
  }
};

// "<|im_start|>{role}\n{content}<|im_end|>\n" per message, then "<|im_start|>assistant\n".
class ChatMLTemplate final : public ChatTemplate {
 public:
  std::string_view name() const override { return "chatml stand-in"; }
  void render(std::span<const ChatMessage> messages, bool add_generation_prompt,
              std::string& out) const override;
};

// The template for --tokenizer-path: the model's chat template when the directory has one, else
// the ChatML stand-in. Through render(), a conversation the model's template rejects (its
// raise_exception, e.g. roles that do not alternate) renders with the ChatML stand-in; through
// render_request() it is an error.
std::unique_ptr<ChatTemplate> make_chat_template(std::string_view tokenizer_path);

}  // namespace kvgate::sim
