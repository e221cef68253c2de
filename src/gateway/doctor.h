// gateway/doctor: the safe tuning order of KV-exact routing, run by kvgate itself against one
// rule, in order, stopping at the first step that fails:
//   1 model readiness    every endpoint serves a 1-token completion directly (timed);
//   2 pool homogeneity   served model, page size, DP size, engine version and tokenizer (a probe
//                        text's ids from the engine's /tokenize) agree across the endpoints and
//                        with the rule (kvBlockSize, kvDpRankCount, tokenizerPath);
//   3 proxy path         a request through the gateway's own listener succeeds on every endpoint
//                        (pinned to it, the policy and kv_exact bypassed);
//   4 event plane        every (endpoint, rank) publisher reachable, its subscriber connected,
//                        its sequence advancing after a request sent to that rank, its events in
//                        the rule's engine shape and hash, the rule's kvZmqPort the engine's;
//   5 kv_exact           a unique probe of several pages sent twice through the gateway: the
//                        second is a kv_exact hit on the (endpoint, rank) whose events stored it,
//                        confirmed by the engine's cached_tokens; else the likely cause, from
//                        kv_exact's own self-checks (page size, tokenizer parity probe, hash);
//   6 inventory          blocks held per (endpoint, rank), and whether each is trusted (warmup);
//   7 selector           the fallback selector and its bounded-load setting, with the spread of
//                        a short concurrent probe through the gateway.
// Steps 4-6 apply to rules with kv_exact on (SKIP otherwise). Each step says PASS, WARN (runs on;
// the operator must judge) or FAIL, what it measured, and the fix in one line.
//
// The doctor runs in the gateway, on the control loop (the admin API's POST
// /v1/rules/{name}/doctor, and PUT /v1/rules/{name}?verify=true, which runs steps 4-6 on the new
// rule): it reads kv_exact's state directly and reaches its own listener with the process's
// DoctorKey (gateway.h). `kvgate doctor` (run_doctor_command) is its command-line face.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "gateway/config.h"
#include "gateway/gateway.h"
#include "gateway/pools.h"
#include "http/client.h"
#include "http/io.h"

namespace kvgate::doctor {

enum class Status { kPass, kWarn, kFail, kSkip };
std::string_view to_string(Status s);  // "PASS", "WARN", "FAIL", "SKIP"

struct Step {
  int number = 0;
  std::string name;  // "model readiness", ...
  Status status = Status::kSkip;
  std::string measured;            // what it found, one or a few lines
  std::string fix;                 // one line; empty when nothing to fix
  std::vector<std::string> lines;  // per endpoint / rank detail
};

struct Report {
  std::string rule;
  std::vector<Step> steps;
  bool ok() const;          // no step failed
  int failed_step() const;  // 0: none
};

struct Options {
  int first = 1, last = 7;  // the steps to run
  // One request's limit (a completion, a probe), and how long to wait for events to arrive or a
  // subscriber to connect.
  std::chrono::milliseconds request_timeout{std::chrono::seconds(30)};
  std::chrono::milliseconds settle{std::chrono::seconds(10)};
  int concurrency = 0;  // step 7's requests in flight at once (0: 4 per endpoint, at most 64)
  // The whole run: no step starts after this long (0: no limit), nor once `cancelled` says so
  // (the admin API's client went away).
  std::chrono::milliseconds limit{0};
  std::function<bool()> cancelled;
};

// What the doctor needs of the gateway it runs in.
struct Env {
  const GatewayConfig* config = nullptr;
  PoolManager* pools = nullptr;
  DoctorKey* key = nullptr;
  http::Target self;  // the gateway's own listener, resolved (steps 3, 5, 7)
};

// The target the doctor reaches its own listener at: host (a wildcard address becomes loopback)
// and the port the listener bound. "" or what failed.
std::string self_target(const GatewayConfig& config, uint16_t bound_port, http::Target& out);

// Parses "1-7", "4-6", "5": false when it is not a range within 1..7.
bool parse_steps(std::string_view text, int& first, int& last);

// Runs the steps on rule `rule` (control loop). The key is armed while it runs.
awaitable<Report> run(Env env, std::string rule, Options options);

nlohmann::ordered_json to_json(const Report& r);
// The text the command line prints, from to_json's shape (what the admin API answers).
std::string format_text(const nlohmann::ordered_json& report);

// `kvgate doctor ...` (argv after "doctor"): exit 0 when every step passed (or warned), 1 when a
// step failed, 2 on a usage or connection error.
int run_doctor_command(int argc, char** argv, const char* self_exe);

}  // namespace kvgate::doctor
