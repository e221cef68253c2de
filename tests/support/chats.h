// tests/support/chats: multi-turn chats for routing tests: the message of a conversation's turn
// (60 words of its own, so conversations share no prefix beyond the template) and the chat
// completion body of a conversation so far.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kvgate::testing {

// Turn `t` of conversation `conv`: "<label> <conv> turn <t>" and 60 words.
inline std::string turn_message(int conv, int t, std::string_view label = "conversation") {
  std::string msg = std::string(label) + " " + std::to_string(conv) + " turn " + std::to_string(t);
  for (int w = 0; w < 60; ++w) msg += " word" + std::to_string((conv * 131 + t * 17 + w) % 97);
  return msg;
}

// A /v1/chat/completions body (max_tokens 4) of `turns`, user and assistant in turn.
inline std::string chat_body(const std::vector<std::string>& turns,
                             std::string_view model = "kvgate-sim") {
  std::string body = R"({"model":")" + std::string(model) + R"(","max_tokens":4,"messages":[)";
  for (size_t i = 0; i < turns.size(); ++i) {
    if (i) body += ",";
    body += std::string(R"({"role":")") + (i % 2 ? "assistant" : "user") + R"(","content":")" +
            turns[i] + R"("})";
  }
  return body + "]}";
}

}  // namespace kvgate::testing
