// gateway/gateway: the request path of kvgate. A proxied request goes through named phases, in
// this order (proxy.cc defines one function per phase; Gateway::proxy runs them):
//   resolve  find the pool (rule) that takes it, by listener port, path prefix and model; the
//            request pins it until it completes (a rule changed meanwhile does not move it);
//   admit    wait for a concurrency slot (or 429/408), before any costly work on the body;
//   parse    read what routing needs from the body (RequestInfo), or 400;
//   select   ask the policy for a worker among the available ones, take a breaker pass;
//   send     write the request to the worker and read its answer's head (and, for a stream, its
//            first event, which may be an abort);
//   retry    when the attempt failed in a way that is safe to retry, within the budget: select
//            again; else the worker's own answer goes to the client;
//   relay    stream the answer to the client as it arrives;
//   complete every dispatch gets exactly one completion (policy hook, breaker outcome, loads).
// Body rewrites (fields added to the JSON without re-serializing it: routed_dp_rank) happen in
// send. Also answers the gateway's own endpoints (/health, /liveness, /readiness, /v1/models).
#pragma once

#include <array>
#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gateway/admission.h"
#include "gateway/auth.h"
#include "gateway/config.h"
#include "gateway/decision_log.h"
#include "gateway/errors.h"
#include "gateway/gateway_metrics.h"
#include "gateway/pools.h"
#include "gateway/response_owners.h"
#include "gateway/retry.h"
#include "http/server.h"
#include "policy/policy.h"
#include "workers/worker.h"

namespace kvgate {

// What each request thread keeps between requests: its upstream keep-alive pool, the sweep that
// starts disconnect watches. Owned by whoever runs the thread; it must
// outlive every request coroutine of that thread and be closed before the thread's io_context is
// destroyed (its pooled sockets and timer belong to that context). Shutdown order:
//   stop the io_context -> close() -> destroy the io_context (unfinished requests are destroyed
//   and still find this alive) -> destroy this.
class RequestThread {
 public:
  explicit RequestThread(const GatewayConfig& config);
  ~RequestThread();
  RequestThread(const RequestThread&) = delete;
  RequestThread& operator=(const RequestThread&) = delete;
  // Makes this the state of the calling thread (call first thing on the thread).
  void bind();
  // Drops pooled connections and the sweep timer; nothing is pooled afterwards.
  void close();

  struct State;
  State& state() { return *state_; }

 private:
  std::unique_ptr<State> state_;
};

// The doctor's key to the request path (gateway/doctor.h). A request carrying
//   x-kvgate-doctor: KEY [rule=NAME] [pin=URL]
// with this process's key gets the debug headers (x-kvgate-worker, -route, -dp-rank) whatever
// --debug-headers says, is resolved to rule NAME when given, and with `pin` goes to that worker
// without asking the policy (it must be available: healthy, breaker closed). The key is random,
// made at start, and never leaves the process: only the doctor, which runs in it, sends it (to
// its own listener). The header is looked at only while a doctor run holds the key armed, and is
// never forwarded to a worker (http::HeaderKind::kDoctor).
class DoctorKey {
 public:
  DoctorKey();
  const std::string& value() const { return key_; }
  void arm() { armed_.fetch_add(1, std::memory_order_relaxed); }
  void disarm() { armed_.fetch_sub(1, std::memory_order_relaxed); }
  bool armed() const { return armed_.load(std::memory_order_relaxed) > 0; }
  struct Pass {
    std::string rule;  // "" : resolved as any request
    std::string pin;   // a worker URL, or ""
  };
  // The pass a header value grants: none when the key is wrong (compared in constant time).
  std::optional<Pass> check(std::string_view header) const;

 private:
  std::string key_;
  std::atomic<int> armed_{0};
};

// The load balancers' probes (/health, /liveness, /readiness): answered without the API key,
// and not traffic in the dashboard's figures (a /readiness 503 in an outage is no error rate).
inline bool is_probe_path(std::string_view path) {
  return path == "/health" || path == "/liveness" || path == "/readiness";
}

namespace replica {
class Sync;
}  // namespace replica

class Gateway {
 public:
  // Requests resolve their pool in `pools`' rule table (which the control plane may change at
  // any time); `pools` outlives the gateway.
  Gateway(const GatewayConfig& config, PoolManager& pools, GatewayMetrics& metrics);
  ~Gateway();

  awaitable<void> handle(http::Exchange& ex);

  const RetryBudget& retry_budget() const { return budget_; }
  // --max-concurrent-requests and its queue: one for the process, whichever rule a request takes.
  Admission& admission() { return admission_; }
  // Requests being handled now (for graceful shutdown).
  int64_t in_flight() const { return in_flight_.load(); }
  DoctorKey& doctor_key() { return doctor_; }
  // /v1/responses: which worker holds each response (gateway/response_owners.h).
  ResponseOwners& response_owners() { return owners_; }
  // The last routing decisions (every dispatch's, when it closed), for /v1/stats.
  const DecisionLog& decisions() const { return decisions_; }
  // The route-only debug endpoint (POST /v1/route on the admin listener): what the request path
  // would decide for a request on `path` with `body` (and the routing headers `header` gives):
  // resolve, parse and select exactly as a request does, then stop: no dispatch, no policy hook,
  // no breaker pass, nothing forwarded. Answers a status and a JSON body. Any thread.
  struct RouteOnly {
    int status = 200;
    std::string body;
  };
  // `at_us`: decide as of that moment (unix microseconds: RouteContext::at_us); 0: now.
  RouteOnly route_only(std::string_view path, std::string body,
                       const std::function<std::string_view(std::string_view)>& header,
                       int64_t at_us = 0) const;
  // Replica sync (--replica-sync), for /readiness's details; before the first request.
  void set_replica(const replica::Sync* r) { replica_ = r; }

 private:
  class Request;   // one proxied request's state, with a member function per phase
  struct Attempt;  // one attempt of it on one worker
  // `label`: the route's metric label (a route table entry's path; static storage).
  awaitable<void> proxy(http::Exchange& ex, ApiRoute route, std::string_view label,
                        std::string_view rid);
  awaitable<void> list_models(http::Exchange& ex, std::string_view rid);
  // /v1/tokenize, /v1/detokenize (sgl-model-gateway's shapes) from the rule's tokenizer and chat
  // template; a rule without one has its engines answer (proxied).
  awaitable<void> tokenize(http::Exchange& ex, std::string_view rid, bool detokenize,
                           Clock::time_point start);
  // /get_model_info (with --expose-server-info): the engine's answer for the model the query
  // names (?model=), or the first rule's.
  awaitable<void> model_info(http::Exchange& ex, std::string_view rid, Clock::time_point start);
  awaitable<void> readiness(http::Exchange& ex, std::string_view rid, Clock::time_point start);
  awaitable<void> answer(http::Exchange& ex, int status, std::string_view body,
                         std::string_view rid);
  // A gateway error answer; with --debug-headers it names the worker involved, if any.
  awaitable<void> fail(http::Exchange& ex, GatewayError e, std::string_view rid,
                       const Worker* worker = nullptr);
  // A request answered: kvgate_requests_total, its duration (and with --metrics-compat smg,
  // smg_http_requests_total by the request's method).
  void record(const http::Exchange& ex, std::string_view route, int status, std::string_view model,
              bool streaming, Clock::time_point start);

  const GatewayConfig& config_;
  PoolManager& pools_;
  GatewayMetrics& metrics_;
  Admission admission_;
  RetryConfig retry_;
  RetryBudget budget_;
  std::vector<std::string> rid_headers_;
  std::chrono::seconds timeout_;
  BearerKey api_key_;
  std::atomic<int64_t> in_flight_{0};
  DoctorKey doctor_;
  ResponseOwners owners_;
  DecisionLog decisions_;
  const replica::Sync* replica_ = nullptr;
};

}  // namespace kvgate
