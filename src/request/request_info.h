// request/request_info: what the gateway reads from a request body, parsed once per request with
// simdjson: the model, the stream flag, the request id, and (for the routing policies) the text
// the engine will see. The body itself is forwarded untouched.
#pragma once

#include <string>
#include <string_view>

namespace kvgate {

enum class ApiRoute {
  kGenerate,         // POST /generate (SGLang native)
  kChatCompletions,  // POST /v1/chat/completions
  kCompletions,      // POST /v1/completions
  kEmbeddings,       // POST /v1/embeddings
  kRerank,           // POST /v1/rerank
};
std::string_view to_string(ApiRoute r);

struct RequestInfo {
  ApiRoute route = ApiRoute::kGenerate;
  std::string model;  // "" when the body names none
  bool stream = false;
  std::string rid;             // SGLang "rid" when given as a string
  bool include_usage = false;  // stream_options.include_usage
};

// Parses `body` (which must have kBodyPadding spare capacity) into `out`.
// Returns "" or a message naming the problem (for a 400 answer).
std::string parse_request(ApiRoute route, const std::string& body, RequestInfo& out);

}  // namespace kvgate
