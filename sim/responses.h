// sim/responses: the exact JSON and SSE shapes SGLang sends (REFERENCE.md section 7), written by
// hand into a std::string: /generate objects and chunks, OpenAI chat and completion responses and
// stream chunks, usage, and the error bodies of each route. Pure functions, no I/O.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "sim/logprobs.h"
#include "sim/sequence.h"

namespace kvgate::sim {

// One generation's output, as far as it got (or the part a chunk carries).
struct OutputView {
  std::string_view id;           // meta_info.id (the rid)
  std::span<const int32_t> ids;  // output ids (a matched stop token included)
  std::string_view text;         // visible text
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;
  int dp_rank =
      0;  // meta_info.dp_rank; < 0: null (SGLang's scheduler has no DP rank with dp_size 1)
  const FinishReason* finish = nullptr;  // null while running
  double e2e_latency = -1;               // written when >= 0 (the last chunk, whole answers)
  LogprobRows logprobs;                  // /generate with return_logprob (model null: none)
};

struct OpenAIContext {
  std::string_view id;        // 32 hex digits, shared by every chunk of a response
  std::string_view model;     // echo of the request's "model"
  int64_t created = 0;        // unix seconds
  bool cache_report = false;  // --enable-cache-report
};

inline constexpr std::string_view kWeightVersion = "default";
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

void append_int(std::string& out, int64_t v);
void append_double(std::string& out, double v);

// --- /generate ---
// {"text","output_ids","meta_info":{...}} (+ "index" when index >= 0, for batch streams); with
// return_logprob, meta_info carries the logprob keys between total_retractions and
// completion_tokens, where SGLang's tokenizer manager adds them.
void append_generate_object(std::string& out, const OutputView& o, int index = -1);
// /generate's 400 body: {"error":{"message"}}.
void append_generate_error(std::string& out, std::string_view message);

// --- OpenAI routes ---
// Whole responses: one choice per output.
void append_chat_completion(std::string& out, const OpenAIContext& c,
                            std::span<const OutputView> outputs);
void append_completion(std::string& out, const OpenAIContext& c,
                       std::span<const OutputView> outputs);
// Chat stream chunks: the role chunk, a content delta, the finish chunk (empty delta).
void append_chat_role_chunk(std::string& out, const OpenAIContext& c, int index);
void append_chat_content_chunk(std::string& out, const OpenAIContext& c, int index,
                               std::string_view delta);
void append_chat_finish_chunk(std::string& out, const OpenAIContext& c, int index,
                              const FinishReason& finish);
// Completion stream chunk: a text delta; the last one carries the finish reason.
void append_completion_chunk(std::string& out, const OpenAIContext& c, int index,
                             std::string_view delta, const FinishReason* finish);
// The usage chunk ("choices": []) that ends a stream when usage was asked for.
void append_usage_chunk(std::string& out, const OpenAIContext& c, bool chat,
                        std::span<const OutputView> outputs);
// The flat OpenAI error body {"object":"error","message","type","param":null,"code"}.
void append_openai_error(std::string& out, std::string_view message, int status);
// An error after an OpenAI stream started: {"error": <the flat body>} (sent as an SSE event).
void append_openai_stream_error(std::string& out, std::string_view message, int status);
// OpenAI "type" for a status: BadRequestError, NotFoundError, InternalServerError...
std::string_view openai_error_type(int status);

// --- Aborts (SGLang's scheduler ends a request with finish_reason {"type":"abort",...}) ---
// Python's HTTPStatus(status).name: BAD_REQUEST, INTERNAL_SERVER_ERROR, SERVICE_UNAVAILABLE...
std::string_view http_status_name(int status);
// The event an OpenAI stream sends for an abort that carries a status, as SGLang's
// create_streaming_error_response writes it (json.dumps, so spaces after ':' and ','):
// {"error": {"object": "error", "message": M, "type": "SERVICE_UNAVAILABLE", "param": null,
// "code": 503}}. Messages are ASCII here (json.dumps would escape anything else as \uXXXX).
void append_openai_abort_event(std::string& out, std::string_view message, int status);
// The body of a FastAPI HTTPException on any route (a whole answer aborted with a 5xx):
// {"object":"error","message":M,"type":"503","param":null,"code":503}.
void append_http_exception_error(std::string& out, std::string_view message, int status);

// --- SSE ---
// "data: " + json + "\n\n" around what `fn` appends.
template <class Fn>
void append_sse(std::string& out, Fn&& fn) {
  out.append("data: ");
  fn(out);
  out.append("\n\n");
}

}  // namespace kvgate::sim
