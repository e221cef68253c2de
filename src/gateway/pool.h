// gateway/pool: what a rule builds, the unit of routing: its endpoints (workers), its policy, its
// health loops and policy upkeep on the control loop, and the metric cells
// of its workers. A Pool is immutable once built (its rule never changes: a changed rule builds a
// new pool, which takes over the workers the old one shares with it, so health, breakers and
// in-flight counts carry on). Requests pin the pool they resolved (a shared_ptr) until they
// complete, so the completion reaches the policy that decided even after the rule changed.
//
// Threads: build(), start() and stop() run on the control loop; everything else is read by
// request threads concurrently (the policy is thread-safe, as it always was).
#pragma once

#include <array>
#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "gateway/admission.h"
#include "gateway/config.h"
#include "gateway/gateway_metrics.h"
#include "gateway/knobs.h"
#include "http/client.h"
#include "http/io.h"
#include "policy/policy.h"
#include "request/request_info.h"
#include "rules/rule.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "workers/availability.h"
#include "workers/health.h"
#include "workers/worker.h"

namespace kvgate {
namespace replica {
class Sync;
}  // namespace replica

// A tokenizer and chat template loaded from one directory, shared by the pools that name it.
struct TokenizerFiles {
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  std::unique_ptr<tokenizer::ChatTemplate> chat_template;  // null: none usable
};

// What every pool uses and the process has once. Lives longer than every pool.
struct PoolEnv {
  const GatewayConfig* config = nullptr;  // the process-wide knobs (admission)
  // Replica sync (--replica-sync; null: off): policies share state through it, and each started
  // pool's workers have their load published and their peers' loads added (replica/sync.h).
  replica::Sync* replica = nullptr;
  // Every worker's breaker and every pool's probes (main builds them from its knobs).
  BreakerConfig breaker = breaker_config(GatewayConfig{});
  HealthConfig health = health_config(GatewayConfig{});
  GatewayMetrics* metrics = nullptr;
  metrics::Registry* registry = nullptr;
  // False for a dry run: its policies register no series (they would share the live rule's).
  bool policy_metrics = true;
  asio::io_context* control = nullptr;  // where health loops and policy upkeep run
  // Worker ids are unique in the process (per-thread connection pools key on them).
  std::atomic<uint64_t>* next_worker_id = nullptr;
  // TLS for https:// workers (made on first use from the --worker-* flags); "" or an error.
  std::function<std::string(std::shared_ptr<const http::TlsClientContext>&)> worker_tls;
  // A directory's tokenizer files, loaded once and shared; null with `error` set.
  std::function<std::shared_ptr<const TokenizerFiles>(const std::string& dir, std::string& error)>
      tokenizer;
};

class Pool {
 public:
  // Builds the pool of `rule` (valid: rules::validate passed). A worker whose URL `existing`
  // knows (another pool's, or one retired a moment ago) is taken over, so its health, breaker
  // and in-flight count carry on: it is the same server. `policy`, when given, is used instead
  // of a new one of `rule.sel`: the previous pool's, when only the endpoints changed (its tree,
  // ring or key table carry on; it hears on_workers_changed), or a test's (prefill/decode: the
  // prefill side's, with `decode_policy` the decode side's). Returns null with
  // `error` saying what failed (a worker's address that does not resolve, a tokenizer that does not
  // load, a feature not built).
  using WorkerLookup = std::function<WorkerPtr(std::string_view url)>;
  // `configured`: the rule as the user wrote it, when `rule` is it plus the endpoints its
  // discovery found (rule() is then the effective rule, configured() the written one).
  static std::shared_ptr<Pool> build(const rules::Rule& rule, const PoolEnv& env,
                                     const WorkerLookup& existing, std::string& error,
                                     std::shared_ptr<Policy> policy = nullptr,
                                     bool policy_in_use = false,
                                     std::shared_ptr<Policy> decode_policy = nullptr,
                                     const rules::Rule* configured = nullptr);
  // Tells the policy the pool's workers (for a policy taken over from the pool this one
  // replaces: only once this pool is published, so a refused change leaves it untouched).
  void notify_workers();
  ~Pool();
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  // The rule in force: as written, plus the endpoints its discovery found.
  const rules::Rule& rule() const { return rule_; }
  // The rule as written (the admin API's, the history's): rule() without discovered endpoints.
  const rules::Rule& configured() const { return configured_ ? *configured_ : rule_; }
  const std::string& name() const { return rule_.name; }
  std::shared_ptr<const WorkerSet> workers() const { return registry_.snapshot(); }
  // The first healthy worker (owned: it stays valid across a co_await), or null.
  WorkerPtr first_healthy() const {
    const auto snapshot = workers();
    for (const auto& w : snapshot->workers) {
      if (w->healthy()) return w;
    }
    return nullptr;
  }
  WorkerRegistry& registry() { return registry_; }
  Policy& policy() { return *policy_; }
  const Policy& policy() const { return *policy_; }
  std::shared_ptr<Policy> shared_policy() const { return policy_; }
  // Prefill/decode (the rule's endpoints have roles): policy() chooses prefill servers (kv_exact
  // over them with kvExactMode 1), decode_policy() decode servers. Each hears only its side's
  // workers and dispatches.
  bool pd() const { return decode_policy_ != nullptr; }
  Policy& decode_policy() { return *decode_policy_; }
  std::shared_ptr<Policy> shared_decode_policy() const { return decode_policy_; }
  // Prefill/decode: each side's workers (the pool's whole set is workers()).
  const WorkerSet& prefill_workers() const { return *prefill_set_; }
  const WorkerSet& decode_workers() const { return *decode_set_; }
  // Which workers could take a request now (workers/availability.h): the pool's, or with
  // prefill/decode each side's.
  AvailabilityIndex& available() const { return *available_; }
  AvailabilityIndex& prefill_available() const { return *available_; }
  AvailabilityIndex& decode_available() const { return *decode_available_; }
  // A worker's role in this pool (kNone for a worker it does not have).
  rules::Role role(const Worker& w) const;
  // A prefill worker's SGLang bootstrap port: its endpoint's, else the rule's pdBootstrapPort
  // (0: 8998).
  int64_t bootstrap_port(const Worker& w) const;
  // The pool's own reference to one of its workers (null for one it does not have).
  WorkerPtr worker_ptr(const Worker& w) const;
  // What the request path must read of bodies for this pool (mode 4), with its tokenizer.
  const ParseOptions& parse_options() const { return parse_options_; }
  bool reads_body() const { return rule_.mode == 4; }
  bool wants_usage() const { return wants_usage_; }
  // The pool's selection counter of a worker (kvgate_worker_selected_total{policy, worker}).
  metrics::Counter* selected(const Worker& w) const;
  // The request signals' cells of one of its workers and the rank the decision named (nullopt:
  // none), labelled with this rule (docs/metrics.md). Made on the first request that needs them
  // (a pool built for a dry run or a refused change makes no series), then found without a lock;
  // null for a worker the pool does not have. They live as long as the pool: a worker's and a
  // rule's series are removed only once no pool holds them (PoolManager).
  const SignalCells* signals(const Worker& w, std::optional<int> rank) const;
  // kvgate_upstream_connect_seconds{rule, worker} of one of its workers (made on first use; null
  // for a worker the pool does not have).
  metrics::Histogram* connect_time(const Worker& w) const;
  // kvgate_admission_queue_seconds{rule} of this pool (made on first use).
  metrics::Histogram& queue_time() const;

  // Starts health probes (and /get_load polls when the policy uses them) for its workers, and the
  // policy's upkeep. Control loop only.
  void start();
  // Ends them (loops end at their next wake-up); requests still running finish. Control loop.
  void stop();
  bool started() const { return started_; }

 private:
  Pool(const rules::Rule& rule, const PoolEnv& env);
  // `rt` with the pairing of prefill/decode requests the prefill policy makes on its own.
  PolicyRuntime pd_runtime(PolicyRuntime rt) const;

  rules::Rule rule_;
  std::optional<rules::Rule> configured_;  // when it differs from rule_ (discovery)
  const PoolEnv env_;
  WorkerRegistry registry_;
  std::shared_ptr<Policy> policy_;         // shared with the next pool of the rule when kept
  std::shared_ptr<Policy> decode_policy_;  // prefill/decode only
  struct Side {
    rules::Role role = rules::Role::kNone;
    int64_t bootstrap_port = 0;
    WorkerPtr worker;
  };
  std::unordered_map<uint64_t, Side> sides_;  // by worker id
  // Prefill/decode: each side's workers (what its policy hears in on_workers_changed).
  std::shared_ptr<const WorkerSet> prefill_set_, decode_set_;
  // The pool's (prefill/decode: the prefill side's) and the decode side's.
  std::unique_ptr<AvailabilityIndex> available_, decode_available_;
  ParseOptions parse_options_;
  bool wants_usage_ = false;
  std::shared_ptr<const TokenizerFiles> tokenizer_;
  std::unordered_map<uint64_t, metrics::Counter*> selected_;
  // Per worker id: the signal cells of each rank (slot 0: no rank; slot r + 1: rank r), made
  // lazily and published with a compare-and-swap (the map itself never changes after build).
  struct WorkerSignals {
    std::string url;
    std::array<std::atomic<SignalCells*>, Worker::kMaxDpRanks + 1> by_rank{};
    std::atomic<metrics::Histogram*> connect{nullptr};
    ~WorkerSignals();
  };
  std::unordered_map<uint64_t, std::unique_ptr<WorkerSignals>> signals_;
  mutable std::atomic<metrics::Histogram*> queue_time_{nullptr};
  std::unique_ptr<HealthPlane> health_;
  // The upkeep loop's stop flag and timer (shared with its callbacks, which may run after stop()).
  struct Upkeep;
  std::vector<std::shared_ptr<Upkeep>> upkeep_;  // one per policy with a period
  bool started_ = false;
  bool stopped_ = false;
};

// The breaker and health settings of the command line / config file.

// Attaches a worker's metric cells (kvgate_worker_* by URL). remove_worker_metrics() drops every
// series labelled with the URL (the gateway's and the policies'), once no live worker has it.
// `role` is the worker's role label ("regular" without one, "prefill", "decode").
std::string_view role_label(rules::Role role);
void attach_worker_metrics(Worker& w, GatewayMetrics& m, rules::Role role = rules::Role::kNone);
// kvgate_worker_role{worker, role} for the worker's role (control loop only).
void set_worker_role(Worker& w, GatewayMetrics& m, rules::Role role);
void remove_worker_metrics(std::string_view url, metrics::Registry& registry);

}  // namespace kvgate
