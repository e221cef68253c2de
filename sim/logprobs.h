// sim/logprobs: /generate's return_logprob. The request's logprob parameters, a deterministic
// stand-in for the model's log-probabilities, and the meta_info keys SGLang writes with them
// (tokenizer_manager.add_logprob_to_meta_info): input_token_logprobs, output_token_logprobs,
// output_token_logprobs_length, input/output_top_logprobs, input/output_token_ids_logprobs, each a
// list of [logprob, token_id, text-or-null] rows.
//
// Values are made up but reproducible: a function of the token id, its position in prompt +
// output and --seed only, so the prompt rows a PD prefill server returns are exactly those a plain
// server returns for the same prompt, and a PD decode's output rows those of a plain server too.
// The model ranks the actual token first at every position: a top-k row starts with it, the
// others follow with lower logprobs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "sim/tokenizer.h"

namespace kvgate::sim {

// GenerateReqInput's logprob fields for one prompt, as normalized there.
struct LogprobParams {
  bool return_logprob = false;
  // First prompt position with a row; -1 (the default) is SGLang's "output only": the scheduler
  // sets it to prompt_len - 1, so the prompt's last token has the one (null-valued) input row.
  int64_t start_len = -1;
  int64_t top_logprobs_num = 0;          // > 0: input/output_top_logprobs
  std::vector<int32_t> token_ids;        // non-empty: input/output_token_ids_logprobs
  bool return_text_in_logprobs = false;  // the row's third element: the token's text, else null

  // The first prompt position with a row, for a prompt of `prompt_len` tokens.
  int64_t first_input_row(int64_t prompt_len) const {
    return start_len < 0 ? prompt_len - 1 : start_len;
  }
};

// The simulated model's log-probabilities.
class LogprobModel {
 public:
  LogprobModel(const Tokenizer& tokenizer, uint64_t seed) : tokenizer_(tokenizer), seed_(seed) {}

  // The logprob of `token` at position `pos` (prompt positions first, then output positions).
  // Negative, float32-representable (as a float32 tensor's tolist() gives them).
  double logprob(int32_t token, int64_t pos) const;
  // The top-k at a position whose actual token is `token`: it first, then k - 1 other ids in
  // descending logprob order. Appends {logprob, id} pairs.
  void top(int32_t token, int64_t pos, size_t k,
           std::vector<std::pair<double, int32_t>>& out) const;
  // The logprob of `candidate` at a position whose actual token is `token` (token_ids_logprob).
  double logprob_of(int32_t token, int64_t pos, int32_t candidate) const;

  const Tokenizer& tokenizer() const { return tokenizer_; }

 private:
  const Tokenizer& tokenizer_;
  uint64_t seed_;
};

// What one /generate answer (or stream chunk) carries of a prompt's logprobs.
struct LogprobRows {
  const LogprobModel* model = nullptr;  // null: return_logprob is off, no keys are written
  const LogprobParams* params = nullptr;
  std::span<const int32_t> prompt;
  std::span<const int32_t> output;  // every output token so far
  // False on a PD decode server: it computes no prompt rows (the prefill server returns them), so
  // its input lists are empty; and its first output token came with the KV, whose
  // token_ids_logprob row the transfer does not carry.
  bool prompt_rows = true;
  // --incremental-streaming-output: the output lists start at this output token (what earlier
  // chunks carried is cut; the input lists are whole in every chunk).
  size_t output_from = 0;
};

// Appends ,"input_token_logprobs":[...],"output_token_logprobs":[...],
// "output_token_logprobs_length":N, then with top_logprobs_num > 0 "input_top_logprobs" and
// "output_top_logprobs", then with token_ids "input_token_ids_logprobs" and
// "output_token_ids_logprobs". Nothing when `r.model` is null.
void append_logprob_keys(std::string& out, const LogprobRows& r);

}  // namespace kvgate::sim
