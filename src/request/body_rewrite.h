// request/body_rewrite: fields the gateway adds to a request's JSON body on its way to the
// worker (routed_dp_rank today; SGLang's bootstrap_host / bootstrap_port / bootstrap_room for
// prefill/decode), without parsing and re-serializing the body: the fields are appended before
// its closing brace. A key the body already has is then present twice and the appended value is
// the one the worker reads: Python's json (SGLang, vLLM) keeps the last value of a repeated key.
// The body was parsed once already (RequestInfo), so it is known to be a JSON object.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <utility>

namespace kvgate {

struct BodyField {
  std::string_view name;  // written as a JSON string (escaped)
  std::string value;      // JSON text, written as is: a number, "quoted string", true, ...
};

// `body` with `fields` appended to its top-level object, or "" when `body` does not end with '}'
// (after trailing whitespace): not an object, nothing is rewritten then.
std::string add_fields(std::string_view body, std::span<const BodyField> fields);

}  // namespace kvgate
