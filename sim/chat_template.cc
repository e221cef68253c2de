// sim/chat_template: see chat_template.h.
#include "sim/chat_template.h"

#include "tokenizer/chat_template.h"

namespace kvgate::sim {

void ChatMLTemplate::render(std::span<const ChatMessage> messages, bool add_generation_prompt,
                            std::string& out) const {
  for (const auto& m : messages) {
    out.append("<|im_start|>").append(m.role).push_back('\n');
    out.append(m.content).append("<|im_end|>\n");
  }
  if (add_generation_prompt) out.append("<|im_start|>assistant\n");
}

namespace {

class ModelChatTemplate final : public ChatTemplate {
 public:
  explicit ModelChatTemplate(std::unique_ptr<tokenizer::ChatTemplate> t) : t_(std::move(t)) {}
  std::string_view name() const override { return "model chat template"; }
  void render(std::span<const ChatMessage> messages, bool add_generation_prompt,
              std::string& out) const override {
    tokenizer::ChatTemplate::Input in;
    std::vector<tokenizer::jinja::Value> list;
    list.reserve(messages.size());
    for (const auto& m : messages) {
      tokenizer::jinja::Value msg = tokenizer::jinja::Value::object();
      msg.obj_mut().set("role", tokenizer::jinja::Value(m.role));
      msg.obj_mut().set("content", tokenizer::jinja::Value(m.content));
      list.push_back(std::move(msg));
    }
    in.messages = tokenizer::jinja::Value::array(std::move(list));
    in.add_generation_prompt = add_generation_prompt;
    std::string rendered, error;
    if (t_->render(in, rendered, error)) {
      out.append(rendered);
    } else {
      fallback_.render(messages, add_generation_prompt, out);
    }
  }
  bool render_request(std::span<const ChatMessage> messages, std::string_view messages_json,
                      std::string_view tools_json, std::string_view kwargs_json,
                      bool add_generation_prompt, std::string& out,
                      std::string& error) const override {
    if (messages_json.empty()) {
      render(messages, add_generation_prompt, out);
      return true;
    }
    return t_->render_request_json(messages_json, tools_json, add_generation_prompt, kwargs_json,
                                   out, error);
  }

 private:
  std::unique_ptr<tokenizer::ChatTemplate> t_;
  ChatMLTemplate fallback_;
};

}  // namespace

std::unique_ptr<ChatTemplate> make_chat_template(std::string_view tokenizer_path) {
  if (!tokenizer_path.empty()) {
    std::string error;
    if (auto t = tokenizer::ChatTemplate::load(std::string(tokenizer_path), error)) {
      return std::make_unique<ModelChatTemplate>(std::move(t));
    }
  }
  return std::make_unique<ChatMLTemplate>();
}

}  // namespace kvgate::sim
