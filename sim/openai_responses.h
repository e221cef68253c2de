// sim/openai_responses: SGLang's /v1/responses (entrypoints/openai/serving_responses.py with
// protocol.py's ResponsesRequest/ResponsesResponse) for a plain chat model: the request becomes
// chat messages (instructions as the system message, the stored conversation of
// previous_response_id, then the new input items), rendered with the chat template as the chat
// route renders them; the answer is a Response object, or its SSE events (response.created,
// response.in_progress, output_item/content_part added, output_text.delta..., the done events,
// then response.completed / incomplete / failed, each framed as "event: T\ndata: {...}\n\n",
// without [DONE]). With --enable-response-store the server keeps each response with store=true
// (its object for GET /v1/responses/{id}, its conversation for previous_response_id), at most
// --max-stored-responses of them, the oldest dropped first. The store is off by default, as in
// SGLang since v0.5.20; then the stateful requests are SGLang's 400.
#pragma once

#include <cstdint>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "sim/chat_template.h"
#include "sim/request.h"
#include "sim/sequence.h"
#include "sim/tokenizer.h"

namespace kvgate::sim {

// The responses a server keeps: the object GET returns and the conversation a continuation
// prepends (its input items and output items, as JSON array elements without the brackets).
// Thread-safe; at most `capacity`, the oldest stored first out.
class ResponseStore {
 public:
  struct Entry {
    std::string object;
    std::string history;
  };
  explicit ResponseStore(size_t capacity) : capacity_(capacity) {}
  std::optional<Entry> get(const std::string& id) const;
  // Stores (or replaces) `id`; drops the oldest entries beyond the capacity.
  void put(const std::string& id, Entry e);
  size_t size() const;

 private:
  size_t capacity_;
  mutable std::mutex mu_;
  std::list<std::string> order_;  // oldest first
  struct Slot {
    Entry entry;
    std::list<std::string>::iterator pos;
  };
  std::unordered_map<std::string, Slot> map_;
};

// What a /v1/responses answer echoes of its request, and where it goes when done.
struct ResponsesContext {
  std::string id;  // request_id: "resp_" + 32 hex digits unless the body names one
  int64_t created_at = 0;
  std::optional<std::string> model;  // null when the body has none
  // The echoed request fields, as JSON values.
  std::string tool_choice = R"("auto")";
  std::string tools = "[]";
  std::string instructions = "null";
  std::string max_output_tokens = "null";
  std::string previous_response_id = "null";
  std::string reasoning_effort = "null";
  std::string store = "true";
  std::string temperature = "null";
  std::string text;  // the request's "text" (empty: {"format":{"type":"text"}} for text output)
  std::string top_p = "null";
  std::string truncation = R"("disabled")";
  std::string user = "null";
  std::string metadata = "{}";
  // The conversation so far (the previous response's, then this request's input items): stored
  // with the output when `store` is set.
  std::string history;
  ResponseStore* persist = nullptr;
};

struct ResponsesOptions {
  bool enable_store = false;
  std::string_view served_model_name;
  std::span<const std::string> lora_adapters;
  int64_t context_length = 32768;
  int64_t default_max_new_tokens = 128;
};

// An error answer: status and body.
struct ResponsesError {
  int status = 0;  // 0: none
  std::string body;
};

// The error body of serving_responses' create_error_response:
// {"error":{"message","type","param","code"}}.
std::string responses_error_body(std::string_view message, std::string_view type,
                                 std::optional<std::string_view> param, int code);

// Parses a POST /v1/responses body into `out` (route kResponses, the rendered prompt, sampling,
// routing fields, out.responses). Returns the error answer when the request is refused.
ResponsesError parse_responses_request(std::string& body, const ResponsesOptions& opt,
                                       ResponseStore& store, const Tokenizer& tok,
                                       const ChatTemplate& tmpl, const RequestLimits& limits,
                                       ParsedRequest& out);

// GET /v1/responses/{id} and POST /v1/responses/{id}/cancel: status and body.
ResponsesError retrieve_response(std::string_view id, bool enable_store,
                                 const ResponseStore& store);
ResponsesError cancel_response(std::string_view id, bool enable_store, const ResponseStore& store);

// The generation's result as a Response object.
struct ResponseResult {
  std::string_view message_id;  // "msg_..." (output item id; unused without text)
  std::string_view text;
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;
  const FinishReason* finish = nullptr;
};

// The Response object (`tools_empty`: the streamed events' copy, whose tools SGLang empties).
// Status from the finish reason: length -> "incomplete", abort -> "failed" (with its error),
// else "completed".
void append_response_object(std::string& out, const ResponsesContext& c, const ResponseResult& r,
                            bool tools_empty);
// The answer to a finished generation: the Response object, stored when the request asked.
void finish_response(std::string& out, const ResponsesContext& c, const ResponseResult& r);

// "msg_" + 32 hex digits (SGLang's f"msg_{random_uuid()}").
std::string new_message_id();

// The events of a stream before the first output: response.created, response.in_progress
// (sequence numbers 0 and 1).
void append_stream_start(std::string& out, const ResponsesContext& c);
// One event: "event: TYPE\ndata: {FIELDS,"sequence_number":N[,AFTER],"type":TYPE}\n\n", the
// event's other fields (JSON object members without braces) in the OpenAI SDK's order, which is
// alphabetical: `fields` sort before sequence_number, `after` between it and type.
void append_event(std::string& out, std::string_view type, std::string_view fields, int64_t seq,
                  std::string_view after = {});
// The message item's events, in SGLang's order (item "msg_..." at output_index 0, content_index
// 0), numbered from `seq` (advanced): output_item.added + content_part.added when it opens, one
// output_text.delta per piece, and output_text.done + content_part.done + output_item.done.
void append_message_opened(std::string& out, std::string_view item_id, int64_t& seq);
void append_text_delta(std::string& out, std::string_view item_id, std::string_view delta,
                       int64_t& seq);
void append_message_closed(std::string& out, std::string_view item_id, std::string_view text,
                           int64_t& seq);
// The terminal event: response.completed / response.incomplete / response.failed, the Response
// object with its tools emptied (SGLang sanitizes the streamed copy).
void append_stream_end(std::string& out, const ResponsesContext& c, const ResponseResult& r,
                       int64_t seq);

// A request SGLang fails with an exception (an abort carrying a status: a full queue, an injected
// abort, a 400 from the scheduler). Whole answers: 400 {"error":...} with str(e) ("503: message"
// for an HTTPException); streams: response.created, response.in_progress, then response.failed
// with error {"code":"server_error","message":str(e)}.
void append_exception_failure(std::string& out, const ResponsesContext& c, int abort_status,
                              std::string_view message, bool stream, int& http_status);

}  // namespace kvgate::sim
