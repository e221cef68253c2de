// sim/request: reads the body of a generation request (/generate, /v1/completions,
// /v1/chat/completions) into what the engine needs: prompt token ids (chat rendered with the chat
// template first), sampling limits, stream flags, request ids, DP routing and PD bootstrap fields.
// Validation errors come back as the message of a 400 answer, phrased as SGLang phrases them where
// it has a phrase.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sim/chat_template.h"
#include "sim/sequence.h"
#include "sim/tokenizer.h"

namespace kvgate::sim {

// kResponses: /v1/responses, parsed by sim/openai_responses into a chat prompt.
enum class Route { kGenerate, kCompletions, kChatCompletions, kResponses };

struct ResponsesContext;

struct ParsedRequest {
  Route route = Route::kGenerate;
  std::string model;  // OpenAI routes: echoed back ("default" when the body names none)
  bool stream = false;
  bool include_usage = false;  // OpenAI streams: end with a usage chunk
  bool batch = false;          // the input was a list (/generate answers an array)
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> rids;  // one per prompt; "" = the server makes one up
  SamplingParams sampling;
  // routed_dp_rank, else its deprecated alias data_parallel_rank (OpenAI routes: the
  // X-Data-Parallel-Rank header overrides both, see apply_dp_rank_header).
  std::optional<int64_t> routed_dp_rank;
  // PD: the prefill DP rank that holds the prompt's KV (SGLang reads it on the decode server; on
  // the prefill server it only lifts the follow_bootstrap_room conflict check).
  std::optional<int64_t> disagg_prefill_dp_rank;
  // cache_salt and LoRA adapter (lora_path; on the OpenAI routes the model "BASE:ADAPTER" wins
  // over lora_path): each empty (absent), one value for every prompt, or one per prompt of a batch
  // ("" where a prompt has none).
  std::vector<std::string> cache_salts;
  std::vector<std::string> loras;
  // PD fields (SGLang's bootstrap_host/port/room): each empty (absent), one value for every
  // prompt (a single room is room + i for prompt i, as GenerateReqInput normalizes it), or one per
  // prompt of a batch.
  std::vector<std::string> bootstrap_hosts;
  std::vector<int64_t> bootstrap_ports;
  std::vector<uint64_t> bootstrap_rooms;
  // /generate's return_logprob, logprob_start_len, top_logprobs_num, token_ids_logprob and
  // return_text_in_logprobs: empty when the body names none, else one per prompt.
  std::vector<LogprobParams> logprobs;
  // /v1/responses: what the answer echoes and where it is stored (null on the other routes).
  std::shared_ptr<const ResponsesContext> responses;

  // The logprob parameters of prompt `i` (return_logprob off when none were given).
  const LogprobParams& logprob(size_t i) const;

  // The bootstrap fields of prompt `i` (absent ones left empty / 0); false when none was given.
  bool bootstrap(size_t i, std::string& host, int64_t& port, uint64_t& room, bool& has_host,
                 bool& has_port, bool& has_room) const;

  // The cache namespace of prompt `i`.
  CacheNamespace cache_namespace(size_t i) const;

  // Empties the request (the strings and outer vectors keep their capacity).
  void clear();
};

struct RequestLimits {
  int64_t default_max_new_tokens = 128;  // /generate and chat; completions default to 16
  int64_t context_length = 32768;
  int64_t max_req_input_len = 32767;
  bool default_include_usage = false;  // --stream-response-default-include-usage
};

// Parses `body` (which keeps simdjson's padding spare) into `out`. Returns "" or the 400 message.
std::string parse_request(Route route, std::string& body, const Tokenizer& tokenizer,
                          const ChatTemplate& chat_template, const RequestLimits& limits,
                          ParsedRequest& out);

// The prompt-length checks of parse_request (context length, longest input, prompt + max_new):
// "" or the 400 message.
std::string check_request_lengths(const ParsedRequest& r, const RequestLimits& limits);

// SGLang's serving_base.extract_routed_dp_rank_from_header: on the OpenAI routes the value of an
// X-Data-Parallel-Rank header (`value`; absent: nullopt) overrides the body's rank. Returns "" or
// the 400 message for a value that is not an integer.
std::string apply_dp_rank_header(std::optional<std::string_view> value, ParsedRequest& out);

// SGLang's tokenizer_manager._validate_and_resolve_lora: "" when every adapter the request names is
// served (`enable_lora` and one of `adapters`), else the 400 message.
std::string check_loras(const ParsedRequest& r, bool enable_lora,
                        std::span<const std::string> adapters);

}  // namespace kvgate::sim
