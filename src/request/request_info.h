// request/request_info: what the gateway reads from a request body, parsed once per request with
// simdjson: the model, the stream flag, the request id, and (for the routing policies that ask for
// it) the text the engine will see. The body itself is forwarded untouched.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvgate {
namespace tokenizer {
class Tokenizer;
class ChatTemplate;
}  // namespace tokenizer

enum class ApiRoute {
  kGenerate,         // POST /generate (SGLang native)
  kChatCompletions,  // POST /v1/chat/completions
  kCompletions,      // POST /v1/completions
  kEmbeddings,       // POST /v1/embeddings
  kRerank,           // POST /v1/rerank
  kResponses,        // POST /v1/responses (OpenAI Responses API; the engine keeps its state)
  kResponse,         // GET / DELETE /v1/responses/{id}, POST /v1/responses/{id}/cancel
  kEncode,           // POST /encode (SGLang native embedding)
  kClassify,         // POST /classify (SGLang native: text or input_ids)
  kClassifyOpenAI,   // POST /v1/classify (input)
  kScore,            // POST /v1/score
  kTokenize,         // POST /tokenize (SGLang's own, proxied)
  kDetokenize,       // POST /detokenize (SGLang's own, proxied)
};
// Whether a route generates (a prefill/decode pool serves it; its answers carry usage).
bool generates(ApiRoute r);
std::string_view to_string(ApiRoute r);

struct RequestInfo {
  ApiRoute route = ApiRoute::kGenerate;
  std::string model;  // "" when the body names none
  bool stream = false;
  std::string rid;  // SGLang "rid" when given as a string
  // /v1/responses: the response this one continues (its engine holds the conversation), and
  // whether the engine keeps this one (`store`, default true).
  std::string previous_response_id;
  bool store = true;
  // A batch: /generate's text or input_ids, or /v1/completions' prompt, is a list of prompts
  // (SGLang then takes per-prompt lists for its per-request fields, bootstrap_room included).
  bool batch = false;
  bool include_usage = false;   // stream_options.include_usage
  bool return_logprob = false;  // /generate's return_logprob (prefill/decode merges the prompt's)
  // SGLang's cache_salt: the request's prefixes live in their own namespace.
  std::optional<std::string> cache_salt;
  // A LoRA adapter named (lora_path, or with ParseOptions::model_names_adapter an OpenAI route's
  // model "base:adapter", which wins as SGLang's _parse_model_parameter has it): the engine
  // caches under the adapter's namespace.
  bool names_lora = false;
  std::optional<std::string> lora;  // the adapter's name, when one string names it
  // Filled only when parse options ask for it (a policy routes on content):
  // chat: every message in order as "role\ncontent\n" (text parts of list contents, tool calls as
  // JSON); completions: the prompt; /generate, /encode, /classify: text, or input_ids written as
  // "1,2,3"; embeddings, /v1/classify: the input; rerank, score: the query; responses: the
  // messages SGLang builds (instructions as a system message, then the input) as chat's. Batches
  // are joined with "\n".
  std::string text;
  // chat: the text of the first user message, a copy when `text` does not hold it as sent (the
  // rendered prompt); otherwise first_user() finds it in `text` (first_user_at), not copied.
  std::string first_user_message;
  std::pair<size_t, size_t> first_user_at{0, 0};  // offset and size in `text`
  std::string_view first_user() const {
    if (!first_user_message.empty() || first_user_at.second == 0) return first_user_message;
    return std::string_view(text).substr(first_user_at.first, first_user_at.second);
  }
  bool token_ids = false;  // text holds token ids, not characters
  // chat: `text` is the prompt the model's chat template renders (--tokenizer-path), as the
  // engine will see it, instead of the role/content stand-in above.
  bool rendered = false;
  // The token ids of `text` (want_tokens with a tokenizer; input_ids as given); at most
  // ParseOptions::max_tokens of them.
  std::vector<int32_t> tokens;
  // chat with a chat template: the template rejected the conversation, so `text` is the stand-in
  // (a content-routing policy cannot match what the engine will cache; kv_exact says so).
  bool render_failed = false;
  // With want_tokens: what rendering the chat template and tokenizing took (kv_exact's routing
  // overhead metrics).
  std::chrono::nanoseconds render_time{0};
  std::chrono::nanoseconds tokenize_time{0};
};

struct ParseOptions {
  // The engines read an OpenAI route's model "base:adapter" as a LoRA adapter (SGLang's
  // _parse_model_parameter); vLLM and older builds take the whole string as a served name.
  bool model_names_adapter = false;
  bool want_text = false;
  bool want_tokens = false;  // also tokenize `text` (needs `tokenizer`)
  // With want_tokens: keep only the first max_tokens ids (0 = all), and stop tokenizing there
  // (prefix_hash needs --prefix-token-count of them, not a huge prompt's every id).
  size_t max_tokens = 0;
  // From --tokenizer-path (owned by the gateway; null without one). The chat template renders
  // chat requests as the engine does (add_generation_prompt, tools, chat_template_kwargs); a
  // conversation the template rejects falls back to the stand-in text (the engine will answer
  // the error).
  const tokenizer::Tokenizer* tokenizer = nullptr;
  const tokenizer::ChatTemplate* chat_template = nullptr;
};

// Parses `body` (which must have kBodyPadding spare capacity) into `out`.
// Returns "" or a message naming the problem (for a 400 answer).
std::string parse_request(ApiRoute route, const std::string& body, RequestInfo& out,
                          ParseOptions options = {});

// Capacity of the calling thread's body parser: at most json::kParserRetainedBytes between
// requests, whatever the largest body was (for tests).
size_t request_parser_capacity();

}  // namespace kvgate
