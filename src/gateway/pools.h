// gateway/pools: the rule table (an immutable snapshot of pools that request threads resolve
// against) and the PoolManager that builds, swaps and retires pools when rules change.
//
// Changing rules (the config file at startup or on SIGHUP, the admin API) is all or nothing:
// apply() validates the whole new set, builds every pool that is new or changed, and only then
// publishes a new table. A rule whose effective JSON is unchanged keeps its pool (its tree,
// breakers and health carry on); a changed rule gets a new pool that takes over the workers the
// old one shares with it. Requests in flight finish on the pool they pinned; a replaced or
// deleted pool is stopped at once (no new requests reach it) and destroyed, on the control loop,
// when its last request is done. Then the metric series of workers no pool has any more go.
//
// Every change that is applied is recorded: per rule name, a bounded history of the rule's
// versions (what it was, when, and what changed it), from which rollback() restores an earlier
// version as one more change (docs/operations.md, the change procedure).
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "gateway/pool.h"
#include "util/shared_snapshot.h"

namespace kvgate {

struct RuleTable {
  std::vector<std::shared_ptr<Pool>> pools;  // in rule order
  bool names_models = false;                 // some rule lists models (set when built)

  // Whether resolving a request on (port, path) depends on its model (rules that could take it
  // name models); when not, the body need not be read to resolve.
  bool needs_model(uint16_t port, std::string_view path) const;
  // The pool that takes a request: among rules matching the listener port (0 = any) and the path
  // prefix, the most specific (a port, then the longest prefix) whose models list `model`, else
  // the most specific catch-all. Null when none does.
  std::shared_ptr<Pool> resolve(uint16_t port, std::string_view path, std::string_view model) const;
  const Pool* find(std::string_view name) const;
  // Whether a request on listener `port` for `path` may reach `pool` (its rule's port and path
  // prefix match), whichever model it names.
  static bool serves(const Pool& pool, uint16_t port, std::string_view path);
  // Healthy workers / all workers, over every pool (a worker in two pools counts once per pool).
  size_t healthy_workers() const;
  size_t total_workers() const;
};

// What changed a rule (a version's source in its history).
enum class RuleSource {
  kStartup,    // the rules kvgate started with (flags, --config)
  kApi,        // the admin API's /v1/rules
  kReload,     // the config file read again (SIGHUP, POST /v1/config/reload)
  kWorkers,    // sgl-model-gateway's worker API (POST /workers, DELETE /workers/{id})
  kRollback,   // rollback()
  kDiscovery,  // endpoints a rule's discovery found (the rule as written did not change)
};
// "startup", "api", "reload", "workers", "rollback", "discovery".
std::string_view to_string(RuleSource s);

// One version of a rule: what the rule was from `time` until the next version.
struct RuleVersion {
  uint64_t version = 0;  // 1, 2, ... per rule name
  std::chrono::system_clock::time_point time;
  RuleSource source = RuleSource::kApi;
  // The complete effective rule (every field, as GET /v1/rules/{name} shows it); null: the rule
  // was deleted, or (a rule's first version when it was created after startup) did not exist.
  std::shared_ptr<const rules::Rule> rule;
  // A rollback's version: the version it restored.
  std::optional<uint64_t> restored;
};

// A rule name's versions, oldest first; the last is the one in force (null rule: none is).
struct RuleHistory {
  std::string name;
  std::vector<RuleVersion> versions;
  uint64_t current() const { return versions.empty() ? 0 : versions.back().version; }
};

// What rollback() did, or why it did nothing.
struct RollbackResult {
  enum class Status {
    kDone,
    kUnknownRule,     // the name has no history (never seen, or evicted)
    kUnknownVersion,  // `to` is not a version kept
    kNothingToDo,     // one version only, or the version asked for is the rule in force
    kInvalid,         // the restored rule does not pass against the rules in force now
  };
  enum class Action {
    kReplaced,  // the rule in force was replaced by the version restored
    kCreated,   // the rule had been deleted: it exists again
    kDeleted,   // the version restored is "absent": the rule was deleted
  };
  Status status = Status::kDone;
  uint64_t restored = 0;  // the version restored
  uint64_t version = 0;   // the new version the rollback made
  Action action = Action::kReplaced;
  std::shared_ptr<const rules::Rule> rule;  // the rule in force now (null: deleted)
};
std::string_view to_string(RollbackResult::Action a);  // "replaced", "created", "deleted"

class PoolManager {
 public:
  // History bounds: versions kept per rule name (the oldest dropped first), and rule names kept
  // (beyond it, the names of deleted rules are forgotten, the longest deleted first; the rules in
  // force, at most rules::kMaxRules, are always kept).
  static constexpr size_t kMaxVersionsPerRule = 16;
  static constexpr size_t kMaxHistoryNames = 1024;

  explicit PoolManager(PoolEnv env);
  ~PoolManager();
  PoolManager(const PoolManager&) = delete;
  PoolManager& operator=(const PoolManager&) = delete;

  // What request threads read (any thread).
  std::shared_ptr<const RuleTable> table() const { return table_.load(); }

  // Control loop only, from here down.
  // Replaces the whole rule set. Returns every error (nothing changes when there is one).
  // With `dry_run`, everything is checked and built (names resolved, tokenizers loaded), then
  // dropped: what a create or update would answer, with nothing changed.
  // An applied change records a version, with `source`, of every rule it created, changed or
  // deleted (a rule left identical gets none); a dry run or a refused change records nothing. A
  // rule created after startup first gets a version "absent" (it did not exist), so that its
  // creation can be rolled back too.
  std::vector<rules::FieldError> apply(std::vector<rules::Rule> next, bool dry_run = false,
                                       RuleSource source = RuleSource::kApi);
  // Creates or replaces one rule / deletes one, through apply(). `created` says which it was.
  std::vector<rules::FieldError> upsert(rules::Rule rule, bool* created = nullptr,
                                        RuleSource source = RuleSource::kApi);
  // False when no rule has that name (or the change was refused: only while shutting down).
  bool remove(std::string_view name, RuleSource source = RuleSource::kApi);

  // Restores version `to` of rule `name` (default: the version before the current one) in one
  // apply() of the whole rule set, that rule replaced by it (or deleted, when the version is
  // "absent"; or created again, when the current one is): a new version, source kRollback, that
  // records which it restored. A second rollback thus goes back to what the first replaced.
  // Returns every error, empty when done; `out` (optional) says what was done or why nothing
  // was (its status; the errors then say it in words): kUnknownRule, kUnknownVersion,
  // kNothingToDo (one version only, or `to` is the rule in force), kInvalid (the restored rule
  // does not pass against the rules in force now: the errors are apply()'s, as a PUT of it
  // would get). Nothing changes unless it is done.
  // A caller undoing its own change (apply a PUT, check, roll back) should name the version it
  // replaced: history(name)->current() read before its change (for a rule it created: 1, the
  // version "absent"), so that a change someone else made meanwhile is not what gets undone.
  std::vector<rules::FieldError> rollback(std::string_view name, std::optional<uint64_t> to,
                                          RollbackResult* out = nullptr);
  // The versions of rule `name`, oldest first; nullopt when the name has none.
  std::optional<RuleHistory> history(std::string_view name) const;
  // Versions kept, over every name (kvgate_rule_history_versions).
  size_t history_versions() const { return history_versions_; }
  // The rules in force, in order.
  std::vector<rules::Rule> rules() const;
  std::optional<rules::Rule> rule(std::string_view name) const;
  // Discovery (a rule's `discovery`, --discovery): the endpoints found at `uri` now. Rules
  // watching it are rebuilt with them added to their own endpoints (their policies kept); no
  // version is recorded (the rules as written did not change). Returns the errors of that
  // rebuild (the pools in force are kept then).
  std::vector<rules::FieldError> set_discovered(const std::string& uri,
                                                std::vector<rules::Endpoint> endpoints);
  // Forgets what `uri` found (no rule uses it any more).
  void forget_discovered(const std::string& uri) { discovered_.erase(uri); }
  // The endpoints found at `uri` (empty before its first answer).
  std::vector<rules::Endpoint> discovered(const std::string& uri) const;
  // Called after every applied change with the rules in force (the discovery manager starts and
  // stops its watchers from it). Control loop.
  void on_applied(std::function<void(const std::vector<rules::Rule>&)> fn) {
    on_applied_ = std::move(fn);
  }
  // Test seam: the policy the next build of rule `name` uses instead of its sel.
  void set_policy_override(std::string name, std::function<std::unique_ptr<Policy>()> make);

  // Starts the pools' planes (call once the control loop runs, or before it runs) and the
  // retirement check; stop() ends every pool's planes (shutdown).
  void start();
  void stop();
  // stop(), then drops every pool and timer: call after the request loops are gone and before the
  // control loop is destroyed (pools hold timers of it).
  void shutdown();
  // Destroys retired pools no request holds any more; returns how many are still waiting.
  size_t retire();
  static constexpr auto kRecentWorkers = std::chrono::seconds(60);
  static constexpr size_t kMaxRecentWorkers = 4096;
  // Test seam: how long workers of destroyed pools are kept (kRecentWorkers).
  void set_recent_workers_ttl(std::chrono::milliseconds ttl) { recent_ttl_ = ttl; }
  // When the worker of `url` was last retired, while it is kept (for tests).
  std::optional<Clock::time_point> recent_since(std::string_view url) const {
    auto it = recent_.find(url);
    if (it == recent_.end()) return std::nullopt;
    return it->second.since;
  }
  size_t retiring() const { return retiring_.size(); }
  // Rule set changes applied and refused since start (control loop).
  uint64_t applied() const { return applied_; }
  uint64_t refused() const { return refused_; }

 private:
  void schedule_retire();
  // A rollback's mark on the version it makes.
  struct Restored {
    std::string_view name;
    uint64_t version = 0;
  };
  std::vector<rules::FieldError> apply_rules(std::vector<rules::Rule> next, bool dry_run,
                                             RuleSource source, const Restored* restored);
  // Records the versions of what differs between two tables (`after` just published).
  void record(const RuleTable& before, const RuleTable& after, RuleSource source,
              const Restored* restored);
  // URLs some pool lists (in force or retiring) or a recent worker holds.
  std::set<std::string, std::less<>> live_urls() const;
  // Whether a pool in force or retiring has this rule name (its policy series are in use).
  bool named_anywhere(std::string_view name) const;

  PoolEnv env_;
  SharedSnapshot<const RuleTable> table_;
  bool started_ = false;
  bool stopped_ = false;
  uint64_t applied_ = 0;
  uint64_t refused_ = 0;
  std::vector<std::shared_ptr<Pool>> retiring_;
  // Workers of destroyed pools, kept kRecentWorkers long (at most kMaxRecentWorkers) so a rule
  // deleted and created again takes its workers back with their health instead of waiting for a
  // first probe; their series go when they expire and no pool lists their URL.
  struct Recent {
    WorkerPtr worker;
    Clock::time_point since;
  };
  std::map<std::string, Recent, std::less<>> recent_;
  std::chrono::milliseconds recent_ttl_ = kRecentWorkers;
  std::map<std::string, std::function<std::unique_ptr<Policy>()>, std::less<>> overrides_;
  std::unique_ptr<Timer> retire_timer_;
  struct History {
    std::vector<RuleVersion> versions;  // oldest first, at most kMaxVersionsPerRule
    uint64_t last_change = 0;           // change_seq_ when the last version was recorded
  };
  std::map<std::string, History, std::less<>> history_;
  std::map<std::string, std::vector<rules::Endpoint>, std::less<>> discovered_;  // by URI
  std::function<void(const std::vector<rules::Rule>&)> on_applied_;
  uint64_t change_seq_ = 0;
  size_t history_versions_ = 0;
};

}  // namespace kvgate
