// request/request_info: see request_info.h.
#include "request/request_info.h"

#include <simdjson.h>

#include "http/message.h"

namespace kvgate {

std::string_view to_string(ApiRoute r) {
  switch (r) {
    case ApiRoute::kGenerate:
      return "/generate";
    case ApiRoute::kChatCompletions:
      return "/v1/chat/completions";
    case ApiRoute::kCompletions:
      return "/v1/completions";
    case ApiRoute::kEmbeddings:
      return "/v1/embeddings";
    case ApiRoute::kRerank:
      return "/v1/rerank";
  }
  return "?";
}

std::string parse_request(ApiRoute route, const std::string& body, RequestInfo& out) {
  out = RequestInfo{};
  out.route = route;
  if (body.empty()) return "request body is empty; send a JSON object";
  thread_local simdjson::dom::parser parser;
  simdjson::dom::element doc;
  simdjson::error_code err;
  if (body.capacity() >= body.size() + simdjson::SIMDJSON_PADDING) {
    err = parser.parse(body.data(), body.size(), false).get(doc);
  } else {
    err = parser.parse(body).get(doc);
  }
  if (err) {
    return std::string("request body is not valid JSON: ") + simdjson::error_message(err);
  }
  simdjson::dom::object obj;
  if (doc.get_object().get(obj)) return "request body must be a JSON object";
  for (auto field : obj) {
    std::string_view key = field.key;
    auto value = field.value;
    if (key == "model") {
      std::string_view m;
      if (value.get_string().get(m)) {
        if (!value.is_null()) return "\"model\" must be a string";
      } else {
        out.model = m;
      }
    } else if (key == "stream") {
      bool s = false;
      if (value.get_bool().get(s)) {
        if (!value.is_null()) return "\"stream\" must be true or false";
      } else {
        out.stream = s;
      }
    } else if (key == "rid") {
      std::string_view r;
      if (!value.get_string().get(r)) out.rid = r;
    } else if (key == "stream_options") {
      bool u = false;
      if (!value["include_usage"].get_bool().get(u)) out.include_usage = u;
    }
  }
  return "";
}

}  // namespace kvgate
