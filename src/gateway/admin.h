// gateway/admin: the admin API, on its own listener (--admin-host 127.0.0.1, --admin-port 29001)
// and run on the control loop, where rules change. Every route needs 'Authorization: Bearer KEY'
// when an admin key is set (--admin-api-key-file) (the dashboard's read-only routes also take
// its session cookie); without one the listener may only bind to a loopback address
// (kvgate_main checks). Clients that fail authentication repeatedly are refused
// for a while (429), per address.
//
// Routes (JSON in and out; errors as {"error": {"type", "code", "message", "details"?}}):
//   GET    /v1/rules                  every rule, effective (defaults filled in)
//   POST   /v1/rules                  create (201; 409 if the name exists; 400 with details)
//   POST   /v1/rules/validate         dry run of a create or update: 200 or 400 with details
//   GET    /v1/rules/{name}           one rule
//   PUT    /v1/rules/{name}           create or replace, live (200, or 201 when created);
//                                     ?verify=true[&timeout=SECS]: then doctor steps 4-6 on the
//                                     new rule, rolled back by itself when one fails (409)
//   DELETE /v1/rules/{name}           204
//   GET    /v1/rules/{name}/inventory what kv_exact knows the rule's workers cache
//   POST   /v1/rules/{name}/doctor    the safe tuning order run on the rule (gateway/doctor.h):
//                                     ?steps=1-7&timeout=SECS&settle=SECS&concurrency=N
//   POST   /v1/rules/{name}/parity    probe a kv_exact rule's ranks for tokenizer parity (202)
//   GET    /v1/rules/{name}/history   the rule's versions, newest first: {"rule", "current",
//                                     "versions": [{"version", "time", "source", "rule",
//                                     "restored"?}]} (404 when the name never had one)
//   POST   /v1/rules/{name}/rollback  restore the version before the current one (?to=N: version
//                                     N), as a new version: 200 {"rule", "restored", "version",
//                                     "action", "in_force"}; 409 nothing to roll back to; 404
//                                     unknown name or version; 400 with details when the restored
//                                     rule does not pass against the rules in force
//   GET    /workers, POST /workers, GET/DELETE /workers/{id}   sgl-model-gateway's worker API
//   POST   /flush_cache               every worker's cache flushed (200, or 206 with each result)
//   GET    /get_loads                 every worker's /get_load
//   GET    /get_server_info, /get_model_info (and /server_info, /model_info): a worker's own
//   GET    /v1/config                 the effective configuration (secrets redacted)
//   POST   /v1/config/reload          read --config again and apply it (as SIGHUP does)
//   GET    /v1/stats                  the dashboard's JSON (gateway/stats.h)
//   GET    /ui                        the dashboard, a page polling /v1/stats; a browser opens
//                                     it once as /ui?token=KEY (a session cookie, HttpOnly and
//                                     SameSite=Strict, then a redirect dropping the token);
//                                     /ui and /v1/stats accept that cookie, nothing else does
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gateway/auth.h"
#include "gateway/config.h"
#include "gateway/doctor.h"
#include "gateway/pools.h"
#include "http/server.h"

namespace kvgate {

class AdminApi {
 public:
  struct Hooks {
    // The effective configuration as JSON (GET /v1/config).
    std::function<std::string()> effective_config;
    // Re-reads the config file and applies it; "" or what was wrong (nothing applied then).
    // Empty: kvgate runs without --config.
    std::function<std::string()> reload;
    // What the doctor needs (POST /v1/rules/{name}/doctor, PUT ?verify=true); empty: no doctor.
    std::function<doctor::Env()> doctor_env;
    // GET /v1/stats: the dashboard's JSON (gateway/stats.h) with the `recent` newest decisions;
    // empty: "{}".
    std::function<std::string(size_t recent)> stats;
    // POST /v1/route?path=P[&at=US]: the request path's decision for the body, as of unix
    // microsecond `at_us` (0: now), nothing sent (status, JSON); empty: 404.
    std::function<std::pair<int, std::string>(
        std::string_view path, std::string body,
        const std::function<std::string_view(std::string_view)>& header, int64_t at_us)>
        route_only;
  };
  // `config` is the configuration in force, read when rules are created (a reload replaces it on
  // the control loop, where the admin API runs too); it outlives this.
  AdminApi(const GatewayConfig& config, PoolManager& pools, Hooks hooks);

  // The listener's handler (runs on the control loop).
  awaitable<void> handle(http::Exchange& ex);

  // Failed authentications an address may make per minute before it is refused for a minute.
  static constexpr int kMaxAuthFailures = 10;
  // Dashboard sessions (cookies handed out by /ui?token=KEY): how long one lasts, and how many
  // are kept (beyond it, the one closest to expiry goes).
  static constexpr auto kSessionTtl = std::chrono::hours(12);
  static constexpr size_t kMaxSessions = 64;

 private:
  awaitable<void> rules_route(http::Exchange& ex, std::string_view rest);
  awaitable<void> workers_route(http::Exchange& ex, std::string_view rest);
  awaitable<void> fan_out(http::Exchange& ex, std::string_view method, std::string_view path);
  awaitable<void> doctor_route(http::Exchange& ex, const std::string& name);
  awaitable<void> verified_put(http::Exchange& ex, const std::string& name, rules::Rule rule);
  // The dashboard (docs/operations.md): its page and assets; a session opened by ?token=KEY;
  // what a browser without a session is told.
  awaitable<void> ui_route(http::Exchange& ex);
  awaitable<void> ui_login(http::Exchange& ex, Clock::time_point now);
  awaitable<void> ui_unauthorized(http::Exchange& ex, bool stats, bool bounce);
  // Whether the request's Cookie header carries a live session (expired ones are dropped).
  bool session_valid(const http::Exchange& ex, Clock::time_point now);
  // The session cookie's name for this listener: http::kSessionCookiePrefix and the admin port
  // (browsers scope cookies by host, not port: two kvgates on one host keep their sessions apart).
  static std::string session_cookie(const http::Exchange& ex);

  const GatewayConfig& config_;
  PoolManager& pools_;
  Hooks hooks_;
  BearerKey key_;
  struct Failures {
    int count = 0;
    Clock::time_point window{};
    Clock::time_point blocked_until{};
  };
  std::map<std::string, Failures, std::less<>> failures_;  // by client address, bounded
  // Dashboard sessions: each kept as a key (its SHA-256, compared in constant time).
  struct Session {
    BearerKey key;
    Clock::time_point expires;
  };
  std::vector<Session> sessions_;
  // One doctor run at a time (control loop): the run in progress holds the slot.
  bool doctor_running_ = false;
  std::string doctor_rule_;         // the rule it runs on
  std::string doctor_busy() const;  // "" or why a run cannot start now
  struct DoctorSlot {
    DoctorSlot(AdminApi& api, const std::string& rule) : api_(api) {
      api_.doctor_running_ = true;
      api_.doctor_rule_ = rule;
    }
    ~DoctorSlot() { api_.doctor_running_ = false; }
    DoctorSlot(const DoctorSlot&) = delete;
    DoctorSlot& operator=(const DoctorSlot&) = delete;

   private:
    AdminApi& api_;
  };
};

// Whether `path` is one of the dashboard's (/ui, /ui/...).
bool is_ui_path(std::string_view path);

// Whether `host` is a loopback address: 127.0.0.0/8, ::1, or "localhost".
bool is_loopback_address(std::string_view host);

// Answers GET /get_server_info, /get_model_info (/server_info, /model_info) with a healthy
// worker's own answer: of rule `rule` when given, else the first rule's.
awaitable<void> answer_worker_info(http::Exchange& ex, std::shared_ptr<const RuleTable> table,
                                   std::string_view rule, std::chrono::milliseconds timeout);

}  // namespace kvgate
