// sim/json_body: a request body parsed as a JSON object, with the 400 message SGLang's OpenAI
// routes answer when it is not one (shared by the generation and tokenizer routes).
#pragma once

#include <simdjson.h>

#include <string>

namespace kvgate::sim {

// Parses `body` (in place when it has simdjson's padding room) into `out`, which points into a
// parser of this thread's until the next call. Returns "" or the message for a 400.
std::string parse_json_object(std::string& body, simdjson::dom::object& out);

}  // namespace kvgate::sim
