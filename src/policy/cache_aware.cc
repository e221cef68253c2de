// policy/cache_aware: see cache_aware.h.
#include "policy/cache_aware.h"

#include <algorithm>
#include <mutex>

#include "util/log.h"

namespace kvgate {

CacheAwarePolicy::CacheAwarePolicy(const PolicyConfig& config)
    : config_(config),
      rng_(config.seed),
      max_trees_(static_cast<size_t>(std::max<int64_t>(1, config.max_prefix_trees))),
      overflow_(std::make_shared<prefix::ApproxTree>()) {
  if (config.registry) {
    // Every series carries the rule (pool) whose policy this is: two pools never overwrite each
    // other's, and a deleted rule's series go with it (PoolManager). Nothing is set here: a
    // policy built for a dry run or a refused change must not touch the series in force.
    auto& r = *config.registry;
    const std::string& rule = config_.rule;
    predicted_ = &r.counter("kvgate_prefix_predicted_tokens_total",
                            "Prompt tokens the approximate tree expected each worker to have "
                            "cached (counted when the worker reports cached_tokens)",
                            {"rule", "worker"});
    cached_ = &r.counter("kvgate_prefix_cached_tokens_total",
                         "Prompt tokens each worker reported as cached (cached_tokens)",
                         {"rule", "worker"});
    corrections_ = &r.counter("kvgate_prefix_tree_corrections_total",
                              "Times a worker's report showed the tree overestimated its cache and "
                              "the tree was corrected",
                              {"rule", "worker"});
    tree_chars_ = &r.gauge("kvgate_prefix_tree_chars",
                           "Characters the approximate tree attributes to each worker (all models)",
                           {"rule", "worker"});
    tree_nodes_ = &r.gauge("kvgate_prefix_tree_nodes", "Nodes of the approximate trees", {"rule"})
                       .with({rule});
    withdrawn_ = &r.counter("kvgate_prefix_tree_withdrawn_total",
                            "Dispatches whose text was taken back from the tree because the worker "
                            "did not run the request (connect failure, 429/503/408, client gone "
                            "before it was sent)",
                            {"rule", "worker"});
    overflow_total_ = &r.counter("kvgate_prefix_tree_overflow_total",
                                 "Requests recorded on the shared overflow tree because "
                                 "--max-prefix-trees model trees already existed",
                                 {"rule"})
                           .with({rule});
    trees_gauge_ = &r.gauge("kvgate_prefix_trees",
                            "Model trees of the approximate prefix tree (at most "
                            "--max-prefix-trees; the shared overflow tree not counted)",
                            {"rule"})
                        .with({rule});
  }
}

template <class F>
void CacheAwarePolicy::with_tree(std::string_view model, bool create, F&& f) {
  {
    std::shared_lock lock(trees_mu_);
    auto it = trees_.find(model);
    if (it != trees_.end()) {
      f(it->second.get(), false);
      return;
    }
    if (trees_.size() >= max_trees_ || !create) {
      bool full = trees_.size() >= max_trees_;
      f(full ? overflow_.get() : nullptr, full);
      return;
    }
  }
  // A new model (rare): create its tree and use it under the writer lock.
  std::unique_lock lock(trees_mu_);
  auto it = trees_.find(model);
  if (it == trees_.end()) {
    if (trees_.size() >= max_trees_) {
      f(overflow_.get(), true);
      return;
    }
    it = trees_.emplace(std::string(model), std::make_shared<prefix::ApproxTree>()).first;
    if (trees_gauge_) trees_gauge_->set(static_cast<double>(trees_.size()));
  }
  f(it->second.get(), false);
}

std::shared_ptr<prefix::ApproxTree> CacheAwarePolicy::tree(std::string_view model) {
  std::shared_ptr<prefix::ApproxTree> out;
  with_tree(model, true, [&](prefix::ApproxTree*, bool overflowed) {
    out = overflowed ? overflow_ : trees_.find(model)->second;
  });
  return out;
}

size_t CacheAwarePolicy::tree_count() {
  std::shared_lock lock(trees_mu_);
  return trees_.size();
}

namespace {
// (A conditional with a temporary std::string() would make the other side a copy of the text.)
const std::string kNoText;
}  // namespace

Decision CacheAwarePolicy::select(std::span<Worker* const> available, RouteContext& ctx) {
  ctx.approx_path.tree = 0;  // a hint is only ever this select's
  if (ctx.candidates.describes(available)) return select_indexed(available, ctx);
  LoadSpread spread = load_spread(available, inflight_load);
  const std::string& text = ctx.request ? ctx.request->text : kNoText;
  std::string_view model = ctx.request ? std::string_view(ctx.request->model) : "";
  if (imbalanced(spread, config_.balance_abs_threshold, config_.balance_rel_threshold)) {
    Worker* pick = least_loaded(available, rng_, inflight_load);
    return {pick, std::nullopt, "imbalanced", held_by(model, text, pick)};
  }
  constexpr size_t kInline = 64;
  prefix::Slot slots_buf[kInline];
  size_t matched_buf[kInline];
  std::vector<prefix::Slot> slots_vec;
  std::vector<size_t> matched_vec;
  std::span<prefix::Slot> slots(slots_buf, std::min(available.size(), kInline));
  std::span<size_t> matched(matched_buf, slots.size());
  if (available.size() > kInline) {
    slots_vec.resize(available.size());
    matched_vec.resize(available.size());
    slots = slots_vec;
    matched = matched_vec;
  }
  for (size_t i = 0; i < available.size(); ++i)
    slots[i] = static_cast<prefix::Slot>(available[i]->id());
  size_t total = 0;
  with_tree(model, false, [&](const prefix::ApproxTree* t, bool) {
    if (t) {
      total = t->match(text, slots, matched);
    } else {  // a model nothing was recorded for yet
      std::fill(matched.begin(), matched.end(), 0);
      total = prefix::count_chars(text);
    }
  });
  size_t best = *std::max_element(matched.begin(), matched.end());
  double rate = total == 0 ? 0.0 : static_cast<double>(best) / static_cast<double>(total);
  if (rate > config_.cache_threshold) {
    // The longest match; among workers holding as much, the least loaded (random among ties).
    Worker* pick = nullptr;
    int64_t best_load = 0;
    uint64_t ties = 0;
    for (size_t i = 0; i < available.size(); ++i) {
      if (matched[i] != best) continue;
      int64_t l = available[i]->inflight();
      if (pick == nullptr || l < best_load) {
        pick = available[i];
        best_load = l;
        ties = 1;
      } else if (l == best_load && rng_.below(++ties) == 0) {
        pick = available[i];
      }
    }
    return {pick, std::nullopt, "cache_hit", best};
  }
  Worker* pick = least_loaded(available, rng_, inflight_load);
  size_t predicted = 0;
  for (size_t i = 0; i < available.size(); ++i) {
    if (available[i] == pick) predicted = matched[i];
  }
  return {pick, std::nullopt, "cache_miss_min_load", predicted};
}

// select() with the pool's availability index: the same decisions without a look at every
// worker (the loads are the index's; the tree says which of its slots match longest).
Decision CacheAwarePolicy::select_indexed(std::span<Worker* const> available, RouteContext& ctx) {
  const AvailableSet& set = *ctx.candidates.set;
  const std::string& text = ctx.request ? ctx.request->text : kNoText;
  std::string_view model = ctx.request ? std::string_view(ctx.request->model) : "";
  if (imbalanced(inflight_spread(available, ctx).spread, config_.balance_abs_threshold,
                 config_.balance_rel_threshold)) {
    Worker* pick = least_inflight(available, ctx, rng_);
    return {pick, std::nullopt, "imbalanced", held_by(model, text, pick)};
  }
  thread_local std::vector<prefix::Slot> longest;
  longest.clear();
  size_t total = 0, best = 0;
  const prefix::ApproxTree::SlotFilter accept{
      [](const void* self, prefix::Slot slot) {
        return static_cast<const AvailableSet*>(self)->find(slot) != nullptr;
      },
      &set};
  with_tree(model, false, [&](const prefix::ApproxTree* t, bool) {
    if (t) {
      best = t->match_best(text, accept, longest, total, &ctx.approx_path);
    } else {  // a model nothing was recorded for yet
      total = prefix::count_chars(text);
    }
  });
  double rate = total == 0 ? 0.0 : static_cast<double>(best) / static_cast<double>(total);
  if (rate > config_.cache_threshold) {
    // The longest match; among workers holding as much, the least loaded (random among ties).
    Worker* pick = nullptr;
    int64_t best_load = 0;
    uint64_t ties = 0;
    for (prefix::Slot slot : longest) {
      Worker* w = set.find(slot);
      int64_t l = w->inflight();
      if (pick == nullptr || l < best_load) {
        pick = w;
        best_load = l;
        ties = 1;
      } else if (l == best_load && rng_.below(++ties) == 0) {
        pick = w;
      }
    }
    return {pick, std::nullopt, "cache_hit", best};
  }
  Worker* pick = least_inflight(available, ctx, rng_);
  size_t predicted = best == 0 ? 0 : held_by(model, text, pick);
  return {pick, std::nullopt, "cache_miss_min_load", predicted};
}

size_t CacheAwarePolicy::held_by(std::string_view model, std::string_view text, const Worker* w) {
  if (text.empty()) return 0;
  size_t held = 0;
  with_tree(model, false, [&](const prefix::ApproxTree* t, bool) {
    if (!t) return;
    held = t->match_one(text, static_cast<prefix::Slot>(w->id()));
  });
  return held;
}

void CacheAwarePolicy::on_dispatched(const Decision& d, RouteContext& ctx) {
  if (!ctx.request || ctx.request->text.empty()) return;
  bool overflowed = false;
  with_tree(ctx.request->model, true, [&](prefix::ApproxTree* t, bool over) {
    t->insert(ctx.request->text, static_cast<prefix::Slot>(d.worker->id()), &ctx.approx_path);
    overflowed = over;
  });
  if (!overflowed) return;
  if (overflow_total_) overflow_total_->inc();
  if (!overflow_logged_.exchange(true, std::memory_order_relaxed)) {
    log::warn("prefix tree limit reached: models beyond it share one overflow tree")
        .kv("max_prefix_trees", max_trees_)
        .kv("model", ctx.request->model);
  }
}

void CacheAwarePolicy::on_completed(const Decision& d, RouteContext& ctx, const Outcome& outcome) {
  if (!ctx.request || ctx.request->text.empty()) return;
  const std::string& text = ctx.request->text;
  if (!outcome.started) {
    // The worker never ran it: withdraw what on_dispatched recorded, back to what the tree
    // believed the worker held before (a dispatch of the same text meanwhile loses its record too;
    // the tree is approximate and the next report corrects it).
    with_tree(ctx.request->model, false, [&](prefix::ApproxTree* t, bool) {
      if (t) t->truncate(text, static_cast<prefix::Slot>(d.worker->id()), d.predicted_chars);
    });
    if (withdrawn_) withdrawn_->with({config_.rule, d.worker->url()}).inc();
    return;
  }
  if (!outcome.cached_tokens || !outcome.prompt_tokens || *outcome.prompt_tokens <= 0) return;
  // select counted the text's characters
  size_t total =
      ctx.approx_path.for_text(text) ? ctx.approx_path.total_chars : prefix::count_chars(text);
  double chars_per_token = static_cast<double>(total) / static_cast<double>(*outcome.prompt_tokens);
  auto predicted_tokens =
      static_cast<uint64_t>(static_cast<double>(d.predicted_chars) / chars_per_token);
  int64_t cached = std::max<int64_t>(0, *outcome.cached_tokens);
  const std::string& url = d.worker->url();
  if (predicted_) predicted_->with({config_.rule, url}).inc(predicted_tokens);
  if (cached_) cached_->with({config_.rule, url}).inc(static_cast<uint64_t>(cached));
  // The worker held less than the tree believed (its cache evicted it): the tree's claims past the
  // point the worker really held are stale. The worker holds this prompt again now (it just
  // computed it), so the path is re-recorded; the worker's other text below the cut goes.
  auto held_chars = static_cast<size_t>(static_cast<double>(cached) * chars_per_token);
  size_t slack = static_cast<size_t>(chars_per_token * 64) + d.predicted_chars / 10;
  if (d.predicted_chars > held_chars + slack) {
    auto slot = static_cast<prefix::Slot>(d.worker->id());
    with_tree(ctx.request->model, false, [&](prefix::ApproxTree* t, bool) {
      if (!t) return;
      t->truncate(text, slot, held_chars);
      t->insert(text, slot);
    });
    if (corrections_) corrections_->with({config_.rule, url}).inc();
    log::debug("approximate tree corrected")
        .kv("worker", url)
        .kv("predicted_chars", d.predicted_chars)
        .kv("held_chars", held_chars);
  }
}

void CacheAwarePolicy::on_workers_changed(const WorkerSet& set) {
  std::set<uint64_t> now;
  for (const auto& w : set.workers) {
    now.insert(w->id());
    worker_urls_[w->id()] = w->url();
  }
  std::vector<uint64_t> gone;
  std::set_difference(known_workers_.begin(), known_workers_.end(), now.begin(), now.end(),
                      std::back_inserter(gone));
  if (!gone.empty()) {
    std::shared_lock lock(trees_mu_);
    for (uint64_t id : gone) {
      for (auto& [model, t] : trees_) t->remove_slot(static_cast<prefix::Slot>(id));
      overflow_->remove_slot(static_cast<prefix::Slot>(id));
    }
  }
  for (uint64_t id : gone) {
    if (tree_chars_) tree_chars_->remove({config_.rule, worker_urls_[id]});
    worker_urls_.erase(id);
  }
  known_workers_ = std::move(now);
}

std::chrono::milliseconds CacheAwarePolicy::period() const {
  return std::chrono::seconds(config_.eviction_interval_secs);
}

void CacheAwarePolicy::on_period() {
  size_t nodes = 0;
  std::map<uint64_t, size_t> chars;
  std::vector<std::string> emptied;
  auto upkeep = [&](std::string_view model, prefix::ApproxTree& t) {
    size_t removed = t.evict(static_cast<size_t>(config_.max_tree_size));
    if (removed > 0) log::debug("approximate tree evicted").kv("model", model).kv("chars", removed);
    nodes += t.node_count();
    for (const auto& [id, url] : worker_urls_)
      chars[id] += t.chars_of(static_cast<prefix::Slot>(id));
  };
  {
    std::shared_lock lock(trees_mu_);
    for (auto& [model, t] : trees_) {
      upkeep(model, *t);
      if (t->empty()) emptied.push_back(model);
    }
    upkeep("(overflow)", *overflow_);
  }
  if (!emptied.empty()) {
    // Nothing is recorded while the writer lock is held, so a tree still empty now is unused.
    std::unique_lock lock(trees_mu_);
    for (const auto& model : emptied) {
      auto it = trees_.find(model);
      if (it != trees_.end() && it->second->empty()) trees_.erase(it);
    }
    if (trees_gauge_) trees_gauge_->set(static_cast<double>(trees_.size()));
  }
  if (tree_nodes_) tree_nodes_->set(static_cast<double>(nodes));
  if (tree_chars_) {
    for (const auto& [id, n] : chars)
      tree_chars_->with({config_.rule, worker_urls_[id]}).set(static_cast<double>(n));
  }
}

}  // namespace kvgate
