// gateway/stream_check: reads the first event of a worker's SSE stream before the client sees
// anything. SGLang admits a request, sends HTTP 200 with the stream headers, and may then abort it
// (queue full, a failed PD transfer, an internal error) in the first event: a chunk whose
// finish_reason has type "abort", or `data: {"error": ...}`, then `data: [DONE]`. Status codes
// alone would pass that on as a success; the gateway treats it as a failed attempt instead (it may
// still retry: nothing reached the client).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace kvgate {

// End of the first complete SSE event in `buf` (the index just past its blank line), or nullopt
// when no event is complete yet.
std::optional<size_t> first_event_end(std::string_view buf);

// The concatenated "data:" payload of an SSE event (lines joined by '\n', as SSE defines); ""
// when it has none.
std::string event_data(std::string_view event);

struct StreamAbort {
  std::string message;  // the worker's words (its error message), for logs
  int status = 0;       // the status_code it names, 0 when none
  // A finish_reason of type abort (the engine stopped the request: SGLang's FINISH_ABORT), not an
  // error object (what SGLang streams for a request it rejects, e.g. a ValueError).
  bool finish_abort = false;
};

// Whether the SSE event `event` (its raw lines) aborts the request: a JSON data payload with a
// top-level "error", or a finish_reason (meta_info.finish_reason, or any choice's finish_reason)
// of type "abort". Anything else, including malformed payloads, is not an abort.
std::optional<StreamAbort> event_abort(std::string_view event);

// The status an abort stands for: the one it names; an engine abort naming none (SGLang's
// FINISH_ABORT from an abort or a drain) is the worker's doing, a 503; an error object naming none
// is 0 (SGLang streams a request's ValueError that way: the request's own error).
int abort_status(const StreamAbort& a);
// Whether an answer of `status` (an abort's, from abort_status) is the request's own error:
// relayed, never retried, not the worker's fault.
bool request_error_status(int status);
// Whether an abort's message says a prefill/decode KV transfer failed (SGLang's decode:
// "Decode transfer failed", "Decode handshake failed", KVTransferError): the prefill side's doing.
bool kv_transfer_failure(std::string_view message);

}  // namespace kvgate
