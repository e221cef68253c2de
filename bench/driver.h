// bench/driver: runs a workload against one endpoint (kvgate or a server) with streaming on, so
// time to first token and inter-token latency are measured at the client, and records per request
// what the worker reported (prompt, completion and cached tokens; x-kvgate-worker when present).
// Multi-turn sessions append the assistant's actual reply to their history.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "bench/oracle.h"
#include "bench/workload.h"

namespace kvgate::bench {

enum class Api { kChat, kCompletions, kGenerate };
Api parse_api(std::string_view name);
std::string_view to_string(Api api);
// The route a request of `api` is sent to (/v1/chat/completions, /v1/completions, /generate).
std::string_view api_path(Api api);

struct RequestRecord {
  int session = 0;
  int turn = 0;
  double start_s = 0;  // from the beginning of the run
  double ttft_ms = 0;  // first generated text
  double e2e_ms = 0;
  std::vector<float> itl_ms;   // gaps between streamed tokens
  int64_t prompt_tokens = -1;  // as reported; -1 when not
  int64_t completion_tokens = -1;
  int64_t cached_tokens = -1;
  int64_t streamed_tokens = 0;  // text events received
  size_t oracle_prompt_tokens = 0;
  size_t oracle_reusable_tokens = 0;
  std::string worker;  // x-kvgate-worker
  std::string route;   // x-kvgate-route (the policy's branch)
  int status = 0;      // 0: transport error
  std::string error;
  bool ok() const { return status == 200 && error.empty(); }
};

// One request as a JSON line (with its newline): what `run --records` and compare's
// records-POLICY.jsonl keep. `t`: unix seconds of its start, given the run's start `epoch0`.
std::string record_json(const RequestRecord& r, double epoch0);

struct DriverConfig {
  std::string url;
  // More than one: requests are spread over them, turn t of session s to urls[(s + t) % n] (a
  // front balancer without affinity: a conversation's turns alternate). `url` is then ignored.
  std::vector<std::string> urls;
  Api api = Api::kChat;
  std::string model = "default";
  std::chrono::seconds timeout{120};
  PrefixOracle* oracle = nullptr;  // counts the upper bound when set
  std::function<void(const RequestRecord&)> on_done;
  // Each request's body before it is sent (session, turn): what compare asks the gateways'
  // route-only endpoint. What it returns holds that request (not the others) for so long before
  // it is sent; its TTFT counts from the send.
  std::function<std::chrono::microseconds(int session, size_t turn, const std::string& body)>
      on_body;
};

struct RunResult {
  std::vector<RequestRecord> records;  // in completion order
  double wall_s = 0;
  std::string fatal;  // the run could not start (bad URL)
};

RunResult run_workload(const Workload& w, const DriverConfig& c);

// Parses one SSE event payload (the text after "data: ") of `api` into the record; returns the new
// text it carries (chat/completions deltas; /generate's cumulative text is turned into a delta
// against `so_far`).
std::string apply_event(Api api, std::string_view payload, const std::string& so_far,
                        RequestRecord& r);

}  // namespace kvgate::bench
