// gateway/errors: see errors.h.
#include "gateway/errors.h"

#include "util/json.h"

namespace kvgate {

std::string error_body(const GatewayError& e) {
  std::string out;
  out.reserve(96 + e.message.size());
  out.append(R"({"error":{"type":)");
  json::append_string(out, e.type);
  out.append(R"(,"code":)");
  json::append_string(out, e.code);
  out.append(R"(,"message":)");
  json::append_string(out, e.message);
  out.append("}}");
  return out;
}

namespace errors {

GatewayError bad_json(std::string detail) {
  return {400, "invalid_request_error", "invalid_json", std::move(detail)};
}

GatewayError invalid_request(std::string detail) {
  return {400, "invalid_request_error", "invalid_request", std::move(detail)};
}

GatewayError not_found(std::string_view method, std::string_view path) {
  return {404, "invalid_request_error", "not_found",
          "no route for " + std::string(method) + " " + std::string(path.substr(0, 256)) +
              " (routes: POST /generate, /v1/chat/completions, /v1/completions, /v1/responses, "
              "/v1/embeddings, /v1/rerank, /v1/score, /v1/classify, /encode, /classify, "
              "/tokenize, /detokenize, /v1/tokenize, /v1/detokenize; GET or DELETE "
              "/v1/responses/{id}; POST /v1/responses/{id}/cancel; GET /v1/models, "
              "/get_model_info, /health, /liveness, /readiness)"};
}

GatewayError admin_route(std::string_view method, std::string_view path) {
  return {404, "invalid_request_error", "admin_route",
          std::string(method) + " " + std::string(path.substr(0, 256)) +
              " is a control route: kvgate answers it on the admin listener (--admin-port, "
              "with the admin key), never passes it through from the inference listener"};
}

GatewayError method_not_allowed(std::string_view method, std::string_view path,
                                std::string_view allowed) {
  return {405, "invalid_request_error", "method_not_allowed",
          std::string(method) + " is not allowed on " + std::string(path) + "; use " +
              std::string(allowed)};
}

GatewayError unauthorized() {
  return {401, "authentication_error", "invalid_api_key",
          "missing or wrong API key; send 'Authorization: Bearer <key>'"};
}

GatewayError queue_full(size_t queue_size) {
  return {429, "rate_limit_error", "queue_full",
          "too many requests: all slots busy and the queue of " + std::to_string(queue_size) +
              " is full; retry later"};
}

GatewayError queue_timeout(long seconds) {
  return {408, "rate_limit_error", "queue_timeout",
          "the request waited " + std::to_string(seconds) + " s in the queue without a free slot"};
}

GatewayError no_worker(size_t total) {
  return {503, "server_error", "no_available_workers",
          total == 0 ? std::string("no workers are configured")
                     : "none of the " + std::to_string(total) +
                           " workers is available (unhealthy or circuit open); see /readiness"};
}

GatewayError no_worker_of_role(std::string_view role, size_t total) {
  return {503, "server_error", "no_available_workers",
          total == 0 ? "no " + std::string(role) + " servers are configured"
                     : "none of the " + std::to_string(total) + " " + std::string(role) +
                           " servers is available (unhealthy or circuit open); prefill/decode "
                           "needs one of each; see /readiness"};
}

GatewayError prefill_failed(uint64_t worker_id, std::string_view why) {
  return {502, "server_error", "prefill_failed",
          "the prefill server (worker #" + std::to_string(worker_id) +
              ") failed: " + std::string(why) +
              "; its decode request was aborted and no retry served the request"};
}

GatewayError upstream_unreachable(int attempts) {
  return {502, "server_error", "upstream_unreachable",
          "no worker could be reached: " + std::to_string(attempts) +
              (attempts == 1 ? " attempt" : " attempts") +
              " failed before the request was delivered; see /readiness"};
}

GatewayError upstream_timeout(long seconds) {
  return {504, "server_error", "upstream_timeout",
          "the worker did not answer within --request-timeout-secs (" + std::to_string(seconds) +
              " s)"};
}

GatewayError upstream_failed(uint64_t worker_id) {
  return {
      502, "server_error", "upstream_failed",
      "worker #" + std::to_string(worker_id) + " failed mid-response; the response is incomplete"};
}

GatewayError upstream_no_answer(uint64_t worker_id) {
  return {502, "server_error", "upstream_no_answer",
          "worker #" + std::to_string(worker_id) +
              " closed the connection without answering after it received the request; not "
              "retried, since it may have started generating"};
}

GatewayError upstream_protocol(uint64_t worker_id) {
  return {502, "server_error", "upstream_protocol",
          "worker #" + std::to_string(worker_id) + " answered with a malformed HTTP response"};
}

GatewayError model_not_found(std::string_view model) {
  return {404, "invalid_request_error", "model_not_found",
          "no rule serves model '" + std::string(model.substr(0, 256)) +
              "'; GET /v1/models lists the models this gateway serves"};
}

GatewayError no_rule(std::string_view path) {
  return {404, "invalid_request_error", "no_rule",
          "no rule takes requests for " + std::string(path.substr(0, 256)) +
              " on this listener; add one (admin API or config file)"};
}

GatewayError policy_refused(std::string_view policy, std::string_view branch) {
  std::string why =
      branch == "target_invalid" ? "X-SMG-Target-Worker is not the index of a configured worker"
      : branch == "target_unavailable"
          ? "the worker X-SMG-Target-Worker names is not available (unhealthy or "
            "circuit open)"
      : branch == "pinned" ? "the worker the doctor names is not available (unhealthy or circuit "
                             "open, or not in the rule)"
                           : std::string(branch);
  return {503, "server_error", "no_available_workers",
          "policy " + std::string(policy) + " found no worker for this request: " + why};
}

}  // namespace errors
}  // namespace kvgate
