// sim/encode: SGLang's routes that prefill without generating, through the engine like a
// generation (the scheduler's queue, prefill time and radix cache), answered when every prompt's
// prefill is done:
//   POST/PUT /encode and /classify (EmbeddingReqInput, http_server.encode_request and
//     classify_request): text or input_ids, one or a batch (then a list), rid, routed_dp_rank,
//     cache_salt, lora_path; each answer {"embedding":[...],"meta_info":{id, finish_reason
//     {"type":"length","length":0}, prompt_tokens, weight_version, total_retractions, dp_rank,
//     e2e_latency}}. /classify is the reward-model form: a one-value "embedding".
//   POST /v1/score (ScoringRequest, serving_score and the tokenizer manager's score_request):
//     query + each item (text concatenated, or token ids), the next-token probabilities of
//     label_token_ids (softmax over them with apply_softmax) ->
//     {"scores":[[...]],"pooled_hidden_states":null,"model":...,"usage":null,"object":"scoring"}.
// Errors: /encode and /classify /generate's 400 {"error":{"message"}}, /v1/score the OpenAI one.
#pragma once

#include "http/server.h"
#include "sim/chat_template.h"
#include "sim/config.h"
#include "sim/engine.h"

namespace kvgate::sim {

class EncodeHandler {
 public:
  EncodeHandler(const SimConfig& config, Engine& engine, const ChatTemplate& chat_template);
  // /encode (classify = false) and /classify.
  awaitable<void> encode(http::Exchange& ex, bool classify);
  awaitable<void> score(http::Exchange& ex);

 private:
  const SimConfig& config_;
  Engine& engine_;
  const ChatTemplate& chat_template_;
  std::vector<std::string> lora_adapters_;
};

// The scores of one prompt's next token for `labels`: exp(logprob), or softmax over the labels.
std::vector<double> label_scores(const Engine& engine, std::span<const int32_t> prompt,
                                 std::span<const int32_t> labels, bool apply_softmax);

}  // namespace kvgate::sim
