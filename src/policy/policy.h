// policy/policy: the routing policy interface. A policy picks one worker among those available
// (healthy, breaker closed or half-open) for a request, and says why (the branch: a metric label
// and the x-kvgate-route debug header). Hooks let stateful policies learn from dispatch and
// completion.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "prefix/approx_tree.h"
#include "request/request_info.h"
#include "workers/availability.h"
#include "workers/worker.h"

namespace boost::asio {
class io_context;
}  // namespace boost::asio

namespace kvgate {

// Everything a policy may look at for one request.
struct RouteContext {
  const RequestInfo* request = nullptr;
  // Route-only (?at=): decide as of this moment (unix microseconds); 0: now. cache_aware and
  // kv_exact weigh the replicas' shared state of that moment (loads, records, predictions).
  int64_t at_us = 0;
  // Request header lookup (case-insensitive); empty when absent.
  std::string_view (*header_fn)(const void* self, std::string_view name) = nullptr;
  const void* header_self = nullptr;
  std::string_view header(std::string_view name) const {
    return header_fn ? header_fn(header_self, name) : std::string_view{};
  }
  // kv_exact's keys of the request's pages: computed once by select() and reused by
  // on_dispatched() / on_completed() and by every retry (the request does not change).
  std::vector<uint64_t> page_keys;
  bool page_keys_set = false;
  // cache_aware shared by replicas (--replica-sync): the chain of the text's chunks
  // (prefix/chunk_index.h), computed once by select() and reused the same way.
  std::vector<uint64_t> chunk_chain;
  bool chunk_chain_set = false;
  // The route-only endpoint asks (POST /v1/route): decide, but count nothing (hit and miss
  // counters, watchdogs, timings) — no request is routed.
  bool route_only = false;
  // cache_aware's match of the request text, for its on_dispatched to record the text where the
  // match ended rather than walking the tree again (checked there against the tree's shape).
  prefix::PathHint approx_path;
  // The pool's availability index, when the span select() gets is its list as it stands (set by
  // the gateway for each select; policy/common.h's helpers use it only when it describes that
  // span): lookups by id and in-flight figures without a scan.
  Candidates candidates;
};

struct Decision {
  Worker* worker = nullptr;
  std::optional<int> dp_rank;
  std::string_view branch;      // static string: why this worker
  size_t predicted_chars = 0;   // prefix the policy expects the worker to hold (cache_aware)
  size_t predicted_tokens = 0;  // prompt tokens the policy expects cached there (kv_exact)
  // The deciding policy's own handle on its target, to find the same state again in
  // on_dispatched / on_completed (kv_exact: its (endpoint, rank) source id; 0: none).
  uint64_t target_id = 0;
  // A policy that let another decide (kv_exact's fallback) keeps that one's branch here, to
  // give the decision back to it in on_dispatched / on_completed.
  std::string_view inner_branch;
  // When the decision was made (unix microseconds; 0: not recorded). cache_aware shared by replicas
  // dates its record with it, so a withdrawal names the record it undoes.
  int64_t origin_us = 0;
};

// How one dispatched attempt ended. The gateway calls on_completed() exactly once for every
// on_dispatched(), with this.
struct Outcome {
  int status = 0;
  bool ok = false;
  // As the worker reported them (meta_info or usage), when it did.
  std::optional<int64_t> cached_tokens;
  std::optional<int64_t> prompt_tokens;
  // The worker may have computed the prompt. False when it certainly did not: the connection
  // failed, it answered without running the request (429, 503, 408), or the client went away
  // while the request was still queued or before it was sent.
  bool started = true;
  // on_first_token() was called for this dispatch (its prefill is done).
  bool first_token = false;
};

// What a policy may use of the pool that runs it (given by the pool before start()).
struct PolicyRuntime {
  boost::asio::io_context* control = nullptr;  // the control thread's loop
  const tokenizer::Tokenizer* tokenizer = nullptr;
  const tokenizer::ChatTemplate* chat_template = nullptr;
  std::shared_ptr<const void> keep;              // owns the tokenizer and template
  std::string dp_rank_field = "routed_dp_rank";  // --dp-rank-field
  // Prefill/decode (kvExactMode 1): a request of the policy's own to a prefill server (rank -1:
  // none chosen) must go as a prefill/decode pair. This adds SGLang's rendezvous fields to `body`
  // (the rank by its bootstrap_room) and gives the decode server to send it to as well; false
  // when no decode server is available.
  std::function<bool(const Worker& prefill, int rank, std::string& body, http::Target& decode)>
      pd_pair;
};

class Policy {
 public:
  virtual ~Policy() = default;
  virtual std::string_view name() const = 0;
  // `available` is never empty. A policy with no worker it may use returns worker == nullptr
  // and a branch naming why (the gateway answers 503).
  virtual Decision select(std::span<Worker* const> available, RouteContext& ctx) = 0;
  virtual void on_dispatched(const Decision&, RouteContext&) {}
  // A stream's first event arrived (the engine finished the prompt's prefill): at most once per
  // dispatch, between on_dispatched and on_completed (whose Outcome then says first_token).
  virtual void on_first_token(const Decision&, RouteContext&) {}
  virtual void on_completed(const Decision&, RouteContext&, const Outcome&) {}
  virtual void on_workers_changed(const WorkerSet&) {}
  // What the gateway must read from request bodies for this policy.
  virtual ParseOptions parse_options() const { return {}; }
  // True when the policy compares the load workers report (the health plane then polls /get_load).
  virtual bool uses_reported_load() const { return false; }
  // True when the policy reads the workers' kv_events from /server_info (kv_exact's discovery).
  virtual bool wants_kv_events() const { return false; }
  // True when the policy reads the workers' dp_size from /server_info (--dp-aware's discovery).
  virtual bool wants_dp_size() const { return false; }
  // True when the policy learns from the cached_tokens / prompt_tokens workers report.
  virtual bool wants_usage() const { return false; }
  // Background upkeep (tree eviction, refits, expiry): on_period() runs every period() on the
  // control thread, concurrently with select().
  virtual std::chrono::milliseconds period() const { return std::chrono::milliseconds(0); }
  virtual void on_period() {}
  // Background work of the policy's own (kv_exact's event subscriber), from the control thread.
  // Balanced per pool: a policy kept by a rule's new pool is started by it before the old pool
  // stops it, so it must count.
  virtual void start() {}
  virtual void stop() {}
  // The pool's control loop and tokenizer (kv_exact's tokenizer parity probe). Before start().
  virtual void attach(const PolicyRuntime&) {}
  // What /readiness says of the policy beyond the workers' health (a JSON object, "" for
  // nothing): kv_exact's ranks not trusted yet and why.
  virtual std::string readiness_details() const { return {}; }
};

}  // namespace kvgate
