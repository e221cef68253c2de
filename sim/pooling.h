// sim/pooling: the non-generation model routes a gateway also proxies, answered at once in
// SGLang's shapes: /v1/embeddings (a deterministic unit vector per input, from its token ids) and
// /v1/rerank (documents scored by token overlap with the query, best first).
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "sim/tokenizer.h"

namespace kvgate::sim {

inline constexpr size_t kEmbeddingDim = 32;

// Appends the embedding of `ids`: kEmbeddingDim floats of a unit vector, a function of the ids.
void append_embedding(std::string& out, std::span<const int32_t> ids);

// Both return the HTTP status and fill `out` with the answer (or the OpenAI error body).
int embeddings_response(std::string& body, const Tokenizer& tok, std::string& out);
int rerank_response(std::string& body, const Tokenizer& tok, std::string& out);

}  // namespace kvgate::sim
