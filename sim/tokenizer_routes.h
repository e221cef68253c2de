// sim/tokenizer_routes: SGLang's tokenizer endpoints, POST /tokenize and /detokenize (each also
// under /v1/), answered with the sim's Tokenizer in the shapes of SGLang's serving_tokenize.py:
//   {"prompt": str | [str, ...], "add_special_tokens": true}
//       -> {"tokens": [ids] | [[ids], ...], "count": N | [N, ...], "max_model_len": M}
//   {"tokens": [ids] | [[ids], ...], "skip_special_tokens": true} -> {"text": str | [str, ...]}
// "model" is optional and ignored, as SGLang ignores it. An invalid body is a 400 with the OpenAI
// error body, as on /v1/completions.
#pragma once

#include <cstdint>
#include <string>

#include "sim/tokenizer.h"

namespace kvgate::sim {

// Both return the HTTP status and fill `out` with the answer (or the OpenAI error body). `body`
// keeps simdjson's padding spare when it can. `max_model_len` is what SGLang reports as the
// tokenizer's model_max_length: the sim's --context-length.
int tokenize_response(std::string& body, const Tokenizer& tok, int64_t max_model_len,
                      std::string& out);
int detokenize_response(std::string& body, const Tokenizer& tok, std::string& out);

}  // namespace kvgate::sim
