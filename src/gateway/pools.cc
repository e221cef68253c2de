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
  for (const auto& w : p.workers()->workers) out.insert(w->url());
}

}  // namespace

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

std::vector<rules::FieldError> PoolManager::apply(std::vector<rules::Rule> next, bool dry_run) {
  auto errors = apply_rules(std::move(next), dry_run);
  if (!dry_run) ++(errors.empty() ? applied_ : refused_);
  return errors;
}

std::vector<rules::FieldError> PoolManager::apply_rules(std::vector<rules::Rule> next,
                                                        bool dry_run) {
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
      rules::validate_update(old->rule(), r, own);
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
    for (const auto& w : p.workers()->workers) {
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
  for (const auto& r : next) {
    const Pool* old = current->find(r.name);
    if (old && rules::equivalent(old->rule(), r)) {
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
                            std::move(decode_policy));
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
  for (Pool* p : kept_policy) p->notify_workers();
  // A server a changed rule gives a new role: kvgate_worker_role says so once the change is in
  // force (a refused change leaves it as it was).
  for (const auto& p : built) {
    for (const auto& w : p->workers()->workers) set_worker_role(*w, *env_.metrics, p->role(*w));
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
  return errors;
}

std::vector<rules::FieldError> PoolManager::upsert(rules::Rule rule, bool* created) {
  auto next = rules();
  auto it = std::find_if(next.begin(), next.end(),
                         [&](const rules::Rule& r) { return r.name == rule.name; });
  if (created) *created = it == next.end();
  if (it == next.end()) {
    next.push_back(std::move(rule));
  } else {
    *it = std::move(rule);
  }
  return apply(std::move(next));
}

bool PoolManager::remove(std::string_view name) {
  auto next = rules();
  auto it =
      std::find_if(next.begin(), next.end(), [&](const rules::Rule& r) { return r.name == name; });
  if (it == next.end()) return false;
  next.erase(it);
  auto errors = apply(std::move(next));
  return errors.empty();
}

std::vector<rules::Rule> PoolManager::rules() const {
  std::vector<rules::Rule> out;
  for (const auto& p : table()->pools) out.push_back(p->rule());
  return out;
}

std::optional<rules::Rule> PoolManager::rule(std::string_view name) const {
  auto t = table();
  if (const Pool* p = t->find(name)) return p->rule();
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
      for (const auto& w : (*it)->workers()->workers) {
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
