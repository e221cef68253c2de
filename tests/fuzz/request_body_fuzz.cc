// Fuzz target: parse_request, which reads every proxied request body (untrusted JSON), for every
// route, with the text a content-routing policy reads.
#include <cstddef>
#include <cstdint>
#include <string>

#include "http/message.h"
#include "request/request_info.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string body(reinterpret_cast<const char*>(data), size);
  body.reserve(size + kvgate::http::kBodyPadding);
  kvgate::RequestInfo info;
  using kvgate::ApiRoute;
  for (auto route :
       {ApiRoute::kGenerate, ApiRoute::kChatCompletions, ApiRoute::kCompletions,
        ApiRoute::kEmbeddings, ApiRoute::kRerank, ApiRoute::kResponses, ApiRoute::kEncode,
        ApiRoute::kClassify, ApiRoute::kClassifyOpenAI, ApiRoute::kScore}) {
    for (bool text : {false, true}) {
      std::string err = kvgate::parse_request(route, body, info, {.want_text = text});
      if (err.empty() && info.route != route) __builtin_trap();
      if (!text && !info.text.empty()) __builtin_trap();
    }
  }
  return 0;
}
