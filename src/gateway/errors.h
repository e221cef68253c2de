// gateway/errors: the gateway's own error answers, always JSON
// {"error":{"type","code","message"}} with the status that matches the cause.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kvgate {

struct GatewayError {
  int status;
  std::string_view
      type;  // invalid_request_error, authentication_error, rate_limit_error, server_error
  std::string_view code;  // machine-readable reason
  std::string message;    // for humans: what went wrong and, where possible, what to do
};

std::string error_body(const GatewayError& e);

namespace errors {
GatewayError bad_json(std::string detail);
// Well-formed JSON with a value kvgate refuses (code invalid_request).
GatewayError invalid_request(std::string detail);
GatewayError not_found(std::string_view method, std::string_view path);
// A SGLang control route (/flush_cache, /update_weights...) asked of the inference listener.
GatewayError admin_route(std::string_view method, std::string_view path);
GatewayError method_not_allowed(std::string_view method, std::string_view path,
                                std::string_view allowed);
GatewayError unauthorized();
GatewayError queue_full(size_t queue_size);
GatewayError queue_timeout(long seconds);
GatewayError no_worker(size_t total);
// Upstream faults name a worker by its id (its URL and the socket error go to the log and
// metrics, not to clients).
GatewayError upstream_unreachable(int attempts);
GatewayError upstream_timeout(long seconds);
GatewayError upstream_failed(uint64_t worker_id);
GatewayError upstream_no_answer(uint64_t worker_id);
GatewayError upstream_protocol(uint64_t worker_id);
// No rule takes the request: a model no rule names (and no catch-all rule), or no rule at all.
GatewayError model_not_found(std::string_view model);
GatewayError no_rule(std::string_view path);
GatewayError policy_refused(std::string_view policy, std::string_view branch);
// Prefill/decode: no available server of one role ("prefill" or "decode") of `total`.
GatewayError no_worker_of_role(std::string_view role, size_t total);
// Prefill/decode: the prefill half failed (`why`: a short reason), so the decode half was
// aborted before it answered.
GatewayError prefill_failed(uint64_t worker_id, std::string_view why);
}  // namespace errors

}  // namespace kvgate
