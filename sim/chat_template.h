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
};

// "<|im_start|>{role}\n{content}<|im_end|>\n" per message, then "<|im_start|>assistant\n".
class ChatMLTemplate final : public ChatTemplate {
 public:
  std::string_view name() const override { return "chatml stand-in"; }
  void render(std::span<const ChatMessage> messages, bool add_generation_prompt,
              std::string& out) const override;
};

// The template for --tokenizer-path: the model's chat template when the directory has one, else
// the ChatML stand-in. A conversation the model's template rejects (its raise_exception, e.g.
// roles that do not alternate) renders with the ChatML stand-in instead: this interface has no
// error path.
std::unique_ptr<ChatTemplate> make_chat_template(std::string_view tokenizer_path);

}  // namespace kvgate::sim
