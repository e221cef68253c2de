// gateway/gateway: the request path of kvgate. Routes a request, reads what routing needs from the
// body (RequestInfo), applies admission, asks the policy for a worker, sends the request with
// retries (only before the first response byte reaches the client) and relays the response as it
// arrives. Also answers the gateway's own endpoints (/health, /liveness, /readiness, /v1/models).
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "gateway/admission.h"
#include "gateway/config.h"
#include "gateway/errors.h"
#include "gateway/gateway_metrics.h"
#include "gateway/retry.h"
#include "http/server.h"
#include "policy/policy.h"
#include "workers/worker.h"

namespace kvgate {

class Gateway {
 public:
  Gateway(const GatewayConfig& config, WorkerRegistry& registry, std::unique_ptr<Policy> policy,
          GatewayMetrics& metrics);
  ~Gateway();

  awaitable<void> handle(http::Exchange& ex);

  Policy& policy() { return *policy_; }
  // The tokenizer and chat template content-aware policies route with (--tokenizer-path); both
  // outlive the gateway. Call before serving.
  void set_tokenizer(const tokenizer::Tokenizer* tok, const tokenizer::ChatTemplate* tmpl) {
    parse_options_.tokenizer = tok;
    parse_options_.chat_template = tmpl;
  }
  Admission& admission() { return admission_; }
  // Requests being handled now (for graceful shutdown).
  int64_t in_flight() const { return in_flight_.load(); }

 private:
  awaitable<void> proxy(http::Exchange& ex, ApiRoute route, std::string_view rid);
  awaitable<void> list_models(http::Exchange& ex, std::string_view rid);
  awaitable<void> answer(http::Exchange& ex, int status, std::string_view body,
                         std::string_view rid);
  awaitable<void> fail(http::Exchange& ex, const GatewayError& e, std::string_view rid);
  void record(std::string_view route, int status, std::string_view model, bool streaming,
              Clock::time_point start);

  const GatewayConfig& config_;
  WorkerRegistry& registry_;
  std::unique_ptr<Policy> policy_;
  GatewayMetrics& metrics_;
  Admission admission_;
  RetryConfig retry_;
  std::vector<std::string> rid_headers_;
  std::chrono::seconds timeout_;
  ParseOptions parse_options_;
  bool wants_usage_;
  std::atomic<int64_t> in_flight_{0};
};

}  // namespace kvgate
