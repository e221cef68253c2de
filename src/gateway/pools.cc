// gateway/pools: see pools.h.
#include "gateway/pools.h"

#include <algorithm>
#include <set>

#include "http/io.h"
#include "util/log.h"

namespace kvgate {

namespace {

bool port_matches(const rules::Rule& r, uint16_t port) {
  return r.port == 0 || r.port == port;
}

bool path_matches(const rules::Rule& r, std::string_view path) {
  return r.path_prefix.empty() || path.starts_with(r.path_prefix);
}

// Higher is more specific: a port beats any port, then the longer path prefix.
size_t specificity(const rules::Rule& r) {
  return (r.port != 0 ? size_t{1} << 20 : 0) + r.path_prefix.size();
}

// Whether two versions of a rule differ in their endpoints only.
bool same_but_endpoints(const rules::Rule& a, const rules::Rule& b) {
  // kv_exact reads an endpoint's own kvZmqPort when it builds: with any, a change makes a new
  // policy (its subscribers would keep the old ports otherwise).
  auto has_ports = [](const rules::Rule& r) {
    return std::any_of(r.endpoints.begin(), r.endpoints.end(),
                       [](const rules::Endpoint& e) { return e.kv_zmq_port.has_value(); });
  };
  if ((a.kv_exact_mode != 0 || b.kv_exact_mode != 0) && (has_ports(a) || has_ports(b))) {
    return false;
  }
  rules::Rule x = a, y = b;
  x.endpoints.clear();
  y.endpoints.clear();
  return rules::equivalent(x, y);
}

void add_urls(const Pool& p, std::set<std::string, std::less<>>& out) {
  const auto snapshot = p.workers();  // (held: the loop reads it)
  for (const auto& w : snapshot->workers) out.insert(w->url());
}

}  // namespace

std::string_view to_string(RuleSource s) {
  switch (s) {
    case RuleSource::kStartup:
      return "startup";
    case RuleSource::kApi:
      return "api";
    case RuleSource::kReload:
      return "reload";
    case RuleSource::kWorkers:
      return "workers";
    case RuleSource::kRollback:
      return "rollback";
    case RuleSource::kDiscovery:
      return "discovery";
  }
  return "api";
}

std::string_view to_string(RollbackResult::Action a) {
  switch (a) {
    case RollbackResult::Action::kReplaced:
      return "replaced";
    case RollbackResult::Action::kCreated:
      return "created";
    case RollbackResult::Action::kDeleted:
      return "deleted";
  }
  return "replaced";
}

bool RuleTable::needs_model(uint16_t port, std::string_view path) const {
  if (!names_models) return false;  // the common case (one rule, any model): no scan
  for (const auto& p : pools) {
    const auto& r = p->rule();
    if (!r.models.empty() && port_matches(r, port) && path_matches(r, path)) return true;
  }
  return false;
}

std::shared_ptr<Pool> RuleTable::resolve(uint16_t port, std::string_view path,
                                         std::string_view model) const {
  const std::shared_ptr<Pool>* named = nullptr;
  const std::shared_ptr<Pool>* any = nullptr;
  for (const auto& p : pools) {
    const auto& r = p->rule();
    if (!port_matches(r, port) || !path_matches(r, path)) continue;
    if (r.models.empty()) {
      if (!any || specificity(r) > specificity((*any)->rule())) any = &p;
    } else if (std::find(r.models.begin(), r.models.end(), model) != r.models.end()) {
      if (!named || specificity(r) > specificity((*named)->rule())) named = &p;
    }
  }
  if (named) return *named;
  return any ? *any : nullptr;
}

bool RuleTable::serves(const Pool& pool, uint16_t port, std::string_view path) {
  return port_matches(pool.rule(), port) && path_matches(pool.rule(), path);
}

const Pool* RuleTable::find(std::string_view name) const {
  for (const auto& p : pools) {
    if (p->name() == name) return p.get();
  }
  return nullptr;
}

size_t RuleTable::healthy_workers() const {
  size_t n = 0;
  for (const auto& p : pools) n += p->registry().healthy_count();
  return n;
}

size_t RuleTable::total_workers() const {
  size_t n = 0;
  for (const auto& p : pools) n += p->workers()->workers.size();
  return n;
}

PoolManager::PoolManager(PoolEnv env)
    : env_(std::move(env)), table_(std::make_shared<const RuleTable>()) {}

PoolManager::~PoolManager() {
  stop();
}

std::vector<rules::FieldError> PoolManager::apply(std::vector<rules::Rule> next, bool dry_run,
                                                  RuleSource source) {
  auto errors = apply_rules(std::move(next), dry_run, source, nullptr);
  if (!dry_run) ++(errors.empty() ? applied_ : refused_);
  return errors;
}

std::vector<rules::FieldError> PoolManager::apply_rules(std::vector<rules::Rule> next, bool dry_run,
                                                        RuleSource source,
                                                        const Restored* restored) {
  std::vector<rules::FieldError> errors;
  for (const auto& r : next) {
    std::vector<rules::FieldError> own;
    rules::validate(r, own);
    for (auto& e : own) {
      e.field = "rules[" + r.name + "]." + e.field;
      errors.push_back(std::move(e));
    }
  }
  rules::validate_table(next, errors);
  auto current = table();
  for (const auto& r : next) {
    if (const Pool* old = current->find(r.name)) {
      std::vector<rules::FieldError> own;
      rules::validate_update(old->configured(), r, own);
      for (auto& e : own) {
        e.field = "rules[" + r.name + "]." + e.field;
        errors.push_back(std::move(e));
      }
    }
  }
  if (stopped_ && !dry_run) {
    errors.push_back({.field = "rules",
                      .value = "",
                      .message = "kvgate is shutting down; rule changes are refused"});
  }
  if (!errors.empty()) return errors;

  // Build what is new or changed; nothing is published unless every build succeeds. A URL
  // another pool has (in force, retiring, or retired a moment ago) is the same worker.
  auto table = std::make_shared<RuleTable>();
  std::vector<std::shared_ptr<Pool>> built;
  std::vector<Pool*> kept_policy;
  PoolEnv dry_env = env_;
  dry_env.policy_metrics = false;  // built around the policy of the pool they replace
  auto find_in = [](const Pool& p, std::string_view url) -> WorkerPtr {
    const auto snapshot = p.workers();  // (held: the loop reads it)
    for (const auto& w : snapshot->workers) {
      if (w->url() == url) return w;
    }
    return nullptr;
  };
  Pool::WorkerLookup existing = [&](std::string_view url) -> WorkerPtr {
    for (const auto& p : built) {
      if (auto w = find_in(*p, url)) return w;
    }
    for (const auto& p : current->pools) {
      if (auto w = find_in(*p, url)) return w;
    }
    for (const auto& p : retiring_) {
      if (auto w = find_in(*p, url)) return w;
    }
    auto it = recent_.find(url);
    return it == recent_.end() ? nullptr : it->second.worker;
  };
  for (const auto& written : next) {
    // What the rule's discovery found joins its own endpoints (an endpoint it lists itself
    // wins: the same server is one worker).
    rules::Rule r = written;
    bool found_some = false;
    if (!r.discovery.empty()) {
      if (auto it = discovered_.find(r.discovery); it != discovered_.end()) {
        for (const auto& e : it->second) {
          http::Target t;
          if (!http::parse_url(e.url, t).empty()) continue;
          const bool listed =
              std::any_of(r.endpoints.begin(), r.endpoints.end(), [&](const auto& x) {
                http::Target u;
                return http::parse_url(x.url, u).empty() && u.url == t.url;
              });
          if (!listed) r.endpoints.push_back(e);
        }
        found_some = r.endpoints.size() != written.endpoints.size();
      }
      if (found_some) {
        // The found endpoints must make a valid rule too (roles not mixed, within bounds).
        std::vector<rules::FieldError> own;
        rules::validate(r, own);
        for (auto& e : own) {
          e.field =
              "rules[" + r.name + "] (with the endpoints " + r.discovery + " found)." + e.field;
          errors.push_back(std::move(e));
        }
        if (!own.empty()) continue;
      }
    }
    const Pool* old = current->find(r.name);
    if (old && rules::equivalent(old->rule(), r) && rules::equivalent(old->configured(), written)) {
      for (const auto& p : current->pools) {
        if (p.get() == old) table->pools.push_back(p);
      }
      continue;
    }
    std::string err;
    std::shared_ptr<Policy> policy, decode_policy;
    bool in_use = false;
    if (old && !dry_run && old->pd() == r.pd() && same_but_endpoints(old->rule(), r)) {
      // The scaling case: what the policies learned carries on (prefill/decode: both sides').
      policy = old->shared_policy();
      decode_policy = old->shared_decode_policy();
      in_use = true;
    } else if (auto it = overrides_.find(r.name); it != overrides_.end()) {
      policy = it->second();
    }
    auto pool = Pool::build(r, dry_run ? dry_env : env_, existing, err, std::move(policy), in_use,
                            std::move(decode_policy), r.discovery.empty() ? nullptr : &written);
    if (!pool) {
      errors.push_back({.field = "rules[" + r.name + "]", .value = "", .message = err});
      continue;
    }
    if (in_use) kept_policy.push_back(pool.get());
    built.push_back(pool);
    table->pools.push_back(std::move(pool));
  }
  if (!errors.empty() || dry_run) {
    // The pools built for nothing take the metric cells of their new workers with them.
    std::set<std::string, std::less<>> urls, names;
    for (const auto& p : built) {
      add_urls(*p, urls);
      if (!current->find(p->name())) names.insert(p->name());
    }
    table.reset();
    built.clear();
    kept_policy.clear();
    // ... and the series their policies made for rules that do not exist.
    for (const auto& n : names) {
      if (named_anywhere(n)) continue;
      env_.registry->remove_series("rule", n);
      env_.registry->remove_series("rule", n + "/decode");  // a prefill/decode pool's decode side
    }
    std::set<std::string, std::less<>> live = live_urls();
    for (const auto& u : urls) {
      if (!live.contains(u)) remove_worker_metrics(u, *env_.registry);
    }
    return errors;
  }

  for (const auto& p : table->pools) table->names_models |= !p->rule().models.empty();
  std::shared_ptr<const RuleTable> published = table;
  table_.store(published);
  record(*current, *published, source, restored);
  for (Pool* p : kept_policy) p->notify_workers();
  // A server a changed rule gives a new role: kvgate_worker_role says so once the change is in
  // force (a refused change leaves it as it was).
  for (const auto& p : built) {
    const auto snapshot = p->workers();  // (held: the loop reads it)
    for (const auto& w : snapshot->workers) set_worker_role(*w, *env_.metrics, p->role(*w));
  }
  for (const auto& p : built) {
    log::info("rule applied")
        .kv("rule", p->name())
        .kv("sel", p->rule().sel)
        .kv("endpoints", p->rule().endpoints.size())
        .kv("replaced", current->find(p->name()) != nullptr);
    if (started_) p->start();
  }
  for (const auto& p : current->pools) {
    bool kept = std::any_of(published->pools.begin(), published->pools.end(),
                            [&](const std::shared_ptr<Pool>& q) { return q == p; });
    if (kept) continue;
    if (!published->find(p->name())) log::info("rule deleted").kv("rule", p->name());
    p->stop();
    retiring_.push_back(p);
  }
  current.reset();
  retire();
  if (on_applied_) on_applied_(rules());
  return errors;
}

std::vector<rules::FieldError> PoolManager::set_discovered(const std::string& uri,
                                                           std::vector<rules::Endpoint> endpoints) {
  auto& held = discovered_[uri];
  if (held == endpoints) return {};
  std::vector<rules::Endpoint> before = std::exchange(held, std::move(endpoints));
  auto in_force = rules();
  if (std::none_of(in_force.begin(), in_force.end(),
                   [&](const rules::Rule& r) { return r.discovery == uri; })) {
    return {};
  }
  auto errors = apply(std::move(in_force), false, RuleSource::kDiscovery);
  // Refused: what is in force stays what was found before, so that the next change of the rules
  // (an admin call, a reload) does not fail on these endpoints.
  if (!errors.empty()) discovered_[uri] = std::move(before);
  return errors;
}

std::vector<rules::Endpoint> PoolManager::discovered(const std::string& uri) const {
  auto it = discovered_.find(uri);
  return it == discovered_.end() ? std::vector<rules::Endpoint>{} : it->second;
}

std::vector<rules::FieldError> PoolManager::upsert(rules::Rule rule, bool* created,
                                                   RuleSource source) {
  auto next = rules();
  auto it = std::find_if(next.begin(), next.end(),
                         [&](const rules::Rule& r) { return r.name == rule.name; });
  if (created) *created = it == next.end();
  if (it == next.end()) {
    next.push_back(std::move(rule));
  } else {
    *it = std::move(rule);
  }
  return apply(std::move(next), false, source);
}

bool PoolManager::remove(std::string_view name, RuleSource source) {
  auto next = rules();
  auto it =
      std::find_if(next.begin(), next.end(), [&](const rules::Rule& r) { return r.name == name; });
  if (it == next.end()) return false;
  next.erase(it);
  auto errors = apply(std::move(next), false, source);
  return errors.empty();
}

void PoolManager::record(const RuleTable& before, const RuleTable& after, RuleSource source,
                         const Restored* restored) {
  auto now = std::chrono::system_clock::now();
  ++change_seq_;
  auto add = [&](const std::string& name, const Pool* in_force) {
    auto [it, fresh] = history_.try_emplace(name);
    History& h = it->second;
    uint64_t next = h.versions.empty() ? 1 : h.versions.back().version + 1;
    if (fresh && in_force && source != RuleSource::kStartup) {
      // Created: before it, it did not exist (what rolling the creation back restores).
      h.versions.push_back({.version = next++, .time = now, .source = source, .rule = nullptr});
      ++history_versions_;
    }
    RuleVersion v{
        .version = next,
        .time = now,
        .source = source,
        .rule = in_force ? std::make_shared<const rules::Rule>(in_force->configured()) : nullptr};
    if (restored && restored->name == name) v.restored = restored->version;
    h.versions.push_back(std::move(v));
    ++history_versions_;
    h.last_change = change_seq_;
    while (h.versions.size() > kMaxVersionsPerRule) {
      h.versions.erase(h.versions.begin());
      --history_versions_;
    }
  };
  for (const auto& p : after.pools) {
    const Pool* old = before.find(p->name());
    if (old == p.get()) continue;  // identical: the same pool was kept
    // Rebuilt for what its discovery found: the rule as written did not change.
    if (old && rules::equivalent(old->configured(), p->configured())) continue;
    add(p->name(), p.get());
  }
  for (const auto& p : before.pools) {
    if (!after.find(p->name())) add(p->name(), nullptr);
  }
  // Too many names: the rules deleted longest ago are forgotten (the rules in force are at most
  // rules::kMaxRules, so some deleted one is always there to go).
  while (history_.size() > kMaxHistoryNames) {
    auto oldest = history_.end();
    for (auto it = history_.begin(); it != history_.end(); ++it) {
      if (it->second.versions.back().rule) continue;  // in force
      if (oldest == history_.end() || it->second.last_change < oldest->second.last_change) {
        oldest = it;
      }
    }
    if (oldest == history_.end()) break;
    history_versions_ -= oldest->second.versions.size();
    history_.erase(oldest);
  }
}

std::optional<RuleHistory> PoolManager::history(std::string_view name) const {
  auto it = history_.find(name);
  if (it == history_.end()) return std::nullopt;
  return RuleHistory{.name = it->first, .versions = it->second.versions};
}

std::vector<rules::FieldError> PoolManager::rollback(std::string_view name,
                                                     std::optional<uint64_t> to,
                                                     RollbackResult* out) {
  RollbackResult local;
  RollbackResult& res = out ? *out : local;
  res = RollbackResult{};
  auto refuse = [&](RollbackResult::Status status, std::string field, std::string value,
                    std::string message) {
    res.status = status;
    return std::vector<rules::FieldError>{
        {.field = std::move(field), .value = std::move(value), .message = std::move(message)}};
  };
  const std::string who = "rule '" + std::string(name) + "'";
  auto it = history_.find(name);
  if (it == history_.end()) {
    return refuse(RollbackResult::Status::kUnknownRule, "name", std::string(name),
                  "no rule named '" + std::string(name) + "' was ever seen (or it was deleted " +
                      "long ago and its history is forgotten)");
  }
  const auto& versions = it->second.versions;
  const RuleVersion& current = versions.back();
  const RuleVersion* target = nullptr;
  if (to) {
    for (const auto& v : versions) {
      if (v.version == *to) target = &v;
    }
    if (!target) {
      return refuse(RollbackResult::Status::kUnknownVersion, "to", std::to_string(*to),
                    who + " has no version " + std::to_string(*to) +
                        " (versions kept: " + std::to_string(versions.front().version) + " to " +
                        std::to_string(current.version) + ")");
    }
  } else if (versions.size() < 2) {
    return refuse(RollbackResult::Status::kNothingToDo, "to", "",
                  who + " has one version only (version " + std::to_string(current.version) +
                      "): there is nothing to roll back to");
  } else {
    target = &versions[versions.size() - 2];
  }
  if (target == &current) {
    return refuse(RollbackResult::Status::kNothingToDo, "to", std::to_string(target->version),
                  "version " + std::to_string(target->version) + " is the current version of " +
                      who + ": there is nothing to roll back");
  }
  bool same = target->rule ? current.rule && rules::equivalent(*target->rule, *current.rule)
                           : !current.rule;
  if (same) {
    return refuse(RollbackResult::Status::kNothingToDo, "to", std::to_string(target->version),
                  "version " + std::to_string(target->version) + " of " + who +
                      " is the same as the current version (" + std::to_string(current.version) +
                      "): there is nothing to roll back");
  }
  // Copied: recording the rollback changes the history.
  const uint64_t restored = target->version;
  std::shared_ptr<const rules::Rule> wanted = target->rule;
  auto next = rules();
  auto at =
      std::find_if(next.begin(), next.end(), [&](const rules::Rule& r) { return r.name == name; });
  if (!wanted) {
    res.action = RollbackResult::Action::kDeleted;
    if (at != next.end()) next.erase(at);
  } else if (at == next.end()) {
    res.action = RollbackResult::Action::kCreated;
    next.push_back(*wanted);
  } else {
    res.action = RollbackResult::Action::kReplaced;
    *at = *wanted;
  }
  const Restored mark{.name = name, .version = restored};
  auto errors = apply_rules(std::move(next), false, RuleSource::kRollback, &mark);
  ++(errors.empty() ? applied_ : refused_);
  if (!errors.empty()) {
    res.status = RollbackResult::Status::kInvalid;
    return errors;
  }
  res.restored = restored;
  res.rule = wanted;
  // (Always there: a rollback adds no name, so no history was forgotten.)
  if (auto h = history_.find(name); h != history_.end()) {
    res.version = h->second.versions.back().version;
    res.rule = h->second.versions.back().rule;
  }
  log::info("rule rolled back")
      .kv("rule", name)
      .kv("restored", restored)
      .kv("version", res.version)
      .kv("action", to_string(res.action));
  return errors;
}

std::vector<rules::Rule> PoolManager::rules() const {
  std::vector<rules::Rule> out;
  for (const auto& p : table()->pools) out.push_back(p->configured());
  return out;
}

std::optional<rules::Rule> PoolManager::rule(std::string_view name) const {
  auto t = table();
  if (const Pool* p = t->find(name)) return p->configured();
  return std::nullopt;
}

void PoolManager::set_policy_override(std::string name,
                                      std::function<std::unique_ptr<Policy>()> make) {
  overrides_[std::move(name)] = std::move(make);
}

void PoolManager::start() {
  if (started_) return;
  started_ = true;
  for (const auto& p : table()->pools) p->start();
}

void PoolManager::stop() {
  if (stopped_) return;
  stopped_ = true;
  if (retire_timer_) retire_timer_->cancel();
  for (const auto& p : table()->pools) p->stop();
  for (const auto& p : retiring_) p->stop();
}

void PoolManager::shutdown() {
  stop();
  retire_timer_.reset();
  table_.store(std::make_shared<const RuleTable>());
  retiring_.clear();
  recent_.clear();
}

bool PoolManager::named_anywhere(std::string_view name) const {
  if (table()->find(name)) return true;
  return std::any_of(retiring_.begin(), retiring_.end(),
                     [&](const std::shared_ptr<Pool>& p) { return p->name() == name; });
}

std::set<std::string, std::less<>> PoolManager::live_urls() const {
  std::set<std::string, std::less<>> live;
  for (const auto& p : table()->pools) add_urls(*p, live);
  for (const auto& p : retiring_) add_urls(*p, live);
  for (const auto& [url, r] : recent_) live.insert(url);
  return live;
}

size_t PoolManager::retire() {
  auto now = Clock::now();
  std::set<std::string, std::less<>> gone, retired_names;
  for (auto it = retiring_.begin(); it != retiring_.end();) {
    if (it->use_count() == 1) {  // only this list holds it: no request, no table
      retired_names.insert((*it)->name());
      const auto snapshot = (*it)->workers();  // (held: the loop reads it)
      for (const auto& w : snapshot->workers) {
        // Refreshed: a rule deleted again soon after it took the worker back keeps it a minute
        // more, like the first time.
        recent_.insert_or_assign(w->url(), Recent{w, now});
      }
      it = retiring_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = recent_.begin(); it != recent_.end();) {
    if (now - it->second.since >= recent_ttl_) {
      gone.insert(it->first);
      it = recent_.erase(it);
    } else {
      ++it;
    }
  }
  while (recent_.size() > kMaxRecentWorkers) {
    auto oldest = std::min_element(
        recent_.begin(), recent_.end(),
        [](const auto& a, const auto& b) { return a.second.since < b.second.since; });
    gone.insert(oldest->first);
    recent_.erase(oldest);
  }
  // A deleted rule's policy series go with its last pool.
  for (const auto& n : retired_names) {
    if (named_anywhere(n)) continue;
    env_.registry->remove_series("rule", n);
    env_.registry->remove_series("rule", n + "/decode");
  }
  if (!gone.empty()) {
    auto live = live_urls();
    for (const auto& u : gone) {
      if (!live.contains(u)) remove_worker_metrics(u, *env_.registry);
    }
  }
  if (!retiring_.empty() || !recent_.empty()) schedule_retire();
  return retiring_.size();
}

void PoolManager::schedule_retire() {
  if (stopped_ || !env_.control) return;
  if (!retire_timer_) retire_timer_ = std::make_unique<Timer>(*env_.control);
  if (retire_timer_->expiry() > Clock::now()) return;  // one is pending
  retire_timer_->expires_after(std::chrono::milliseconds(200));
  retire_timer_->async_wait([this](const boost::system::error_code& ec) {
    if (!ec) retire();
  });
}

}  // namespace kvgate
