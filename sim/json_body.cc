// sim/json_body: see json_body.h.
#include "sim/json_body.h"

namespace kvgate::sim {

std::string parse_json_object(std::string& body, simdjson::dom::object& out) {
  if (body.empty()) return "the request body is empty; send a JSON object";
  thread_local simdjson::dom::parser parser;
  simdjson::dom::element doc;
  simdjson::error_code err;
  if (body.capacity() >= body.size() + simdjson::SIMDJSON_PADDING) {
    err = parser.parse(body.data(), body.size(), false).get(doc);
  } else {
    err = parser.parse(body).get(doc);
  }
  if (err) return std::string("malformed JSON body: ") + simdjson::error_message(err);
  if (doc.get_object().get(out)) return "the request body must be a JSON object";
  return "";
}

}  // namespace kvgate::sim
