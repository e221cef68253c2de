// sim/chat_template: turns chat messages into the prompt text the model sees. The interface is what
// the chat route uses; the ChatML stand-in below serves until the tokenizer issue brings the
// model's real Jinja template (tokenizer_config.json) behind the same interface.
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

// The template for --tokenizer-path (the ChatML stand-in until real templates land).
std::unique_ptr<ChatTemplate> make_chat_template(std::string_view tokenizer_path);

}  // namespace kvgate::sim
