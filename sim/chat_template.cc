// sim/chat_template: see chat_template.h.
#include "sim/chat_template.h"

namespace kvgate::sim {

void ChatMLTemplate::render(std::span<const ChatMessage> messages, bool add_generation_prompt,
                            std::string& out) const {
  for (const auto& m : messages) {
    out.append("<|im_start|>").append(m.role).push_back('\n');
    out.append(m.content).append("<|im_end|>\n");
  }
  if (add_generation_prompt) out.append("<|im_start|>assistant\n");
}

std::unique_ptr<ChatTemplate> make_chat_template(std::string_view /*tokenizer_path*/) {
  return std::make_unique<ChatMLTemplate>();
}

}  // namespace kvgate::sim
