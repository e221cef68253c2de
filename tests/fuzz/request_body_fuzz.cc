// Fuzz target: parse_request, which reads every proxied request body (untrusted JSON).
#include <cstddef>
#include <cstdint>
#include <string>

#include "http/message.h"
#include "request/request_info.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string body(reinterpret_cast<const char*>(data), size);
  body.reserve(size + kvgate::http::kBodyPadding);
  kvgate::RequestInfo info;
  for (auto route : {kvgate::ApiRoute::kGenerate, kvgate::ApiRoute::kChatCompletions}) {
    std::string err = kvgate::parse_request(route, body, info);
    if (err.empty() && info.route != route) __builtin_trap();
  }
  return 0;
}
