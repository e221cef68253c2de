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
#pragma once

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
  // Healthy workers / all workers, over every pool (a worker in two pools counts once per pool).
  size_t healthy_workers() const;
  size_t total_workers() const;
};

class PoolManager {
 public:
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
  std::vector<rules::FieldError> apply(std::vector<rules::Rule> next, bool dry_run = false);
  // Creates or replaces one rule / deletes one, through apply(). `created` says which it was.
  std::vector<rules::FieldError> upsert(rules::Rule rule, bool* created = nullptr);
  // False when no rule has that name.
  bool remove(std::string_view name);
  // The rules in force, in order.
  std::vector<rules::Rule> rules() const;
  std::optional<rules::Rule> rule(std::string_view name) const;
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
  std::vector<rules::FieldError> apply_rules(std::vector<rules::Rule> next, bool dry_run);
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
};

}  // namespace kvgate
