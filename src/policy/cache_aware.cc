// policy/cache_aware: see cache_aware.h.
#include "policy/cache_aware.h"

#include <algorithm>
#include <limits>
#include <mutex>

#define XXH_INLINE_ALL  // header-only xxHash: no library to link
#include <xxhash.h>

#include "replica/sync.h"
#include "util/log.h"

namespace kvgate {

CacheAwarePolicy::CacheAwarePolicy(const PolicyConfig& config)
    : config_(config),
      rng_(config.seed),
      max_trees_(static_cast<size_t>(std::max<int64_t>(1, config.max_prefix_trees))),
      overflow_(std::make_shared<prefix::ApproxTree>()) {
  if (config.replica) {
    chunk_bytes_ = config.replica->config().chunk_bytes;
    chunks_ = std::make_unique<prefix::ChunkIndex>(config.replica->config().max_chunks);
    ttl_us_ = config.eviction_interval_secs * 1000000;
    const auto settle =
        std::chrono::duration_cast<std::chrono::microseconds>(config.replica->settle());
    chunks_->set_settle(ttl_us_, settle.count());
  }
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
    if (config.replica) {
      chunk_entries_ = &r.gauge("kvgate_prefix_chunk_index_entries",
                                "Chunk hashes in cache_aware's index shared by replicas "
                                "(--replica-sync; at most --replica-sync-max-chunks)",
                                {"rule"})
                            .with({rule});
      chunk_dropped_ =
          &r.counter("kvgate_prefix_chunk_index_dropped_total",
                     "Chunk hashes not recorded because the shared index was full", {"rule"})
               .with({rule});
    }
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
  if (chunks_) return select_shared(available, ctx);
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
      int64_t l = available[i]->fleet_inflight();
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
      int64_t l = w->fleet_inflight();
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

namespace {
// splitmix64's finalizer over a request key and a worker key: the tie-break every replica
// computes alike.
uint64_t tie_key(uint64_t request, uint64_t worker) {
  uint64_t z = request ^ (worker * 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
}  // namespace

const std::vector<uint64_t>& CacheAwarePolicy::chain_of(RouteContext& ctx) {
  if (!ctx.chunk_chain_set) {
    ctx.chunk_chain_set = true;
    if (ctx.request) {
      prefix::chunk_chain(ctx.request->model, ctx.request->text, chunk_bytes_, ctx.chunk_chain);
    } else {
      ctx.chunk_chain.clear();
    }
  }
  return ctx.chunk_chain;
}

// select() when replicas share the state: the same rules as select(), over the chunk index and
// fleet loads, ties broken by tie_key (no random draw), so every replica decides alike.
Decision CacheAwarePolicy::select_shared(std::span<Worker* const> available, RouteContext& ctx) {
  if (available.empty()) return {};
  const std::string& text = ctx.request ? ctx.request->text : kNoText;
  const std::vector<uint64_t>& chain = chain_of(ctx);
  const uint64_t request = chain.empty() ? XXH3_64bits(text.data(), text.size()) : chain.back();
  thread_local std::vector<uint64_t> keys;
  thread_local std::vector<size_t> matched;
  thread_local std::vector<int64_t> loads;
  keys.resize(available.size());
  matched.assign(available.size(), 0);
  for (size_t i = 0; i < available.size(); ++i) keys[i] = available[i]->url_key();
  const int64_t now = replica::Sync::now_us();
  // The moment decided for: now, or the one route-only was asked about (?at=). Records and
  // loads count from their origin + settle on every replica alike, and this replica's own load
  // as NATS echoed it (while NATS is there), so every replica weighs the same figures then.
  const int64_t when = ctx.at_us != 0 ? ctx.at_us : now;
  const bool echoed = config_.replica->own_view();
  loads.resize(available.size());
  for (size_t i = 0; i < available.size(); ++i) {
    loads[i] = available[i]->shared_inflight(when, echoed);
  }
  const size_t best = chain.empty() ? 0 : chunks_->match(chain, keys, matched, when);
  auto covered = [&](size_t chunks) {
    return prefix::chunk_bytes_covered(chunks, chunk_bytes_, text.size());
  };
  // Of the workers `eligible` accepts, those within one request of the least loaded, and of
  // them the lowest tie_key. (The shared figures move once per load report, so requests decided
  // between two reports see the same loads: a strict least would send them all to one worker;
  // the band lets the request's hash spread them.)
  auto pick = [&](auto eligible) {
    int64_t least = std::numeric_limits<int64_t>::max();
    for (size_t i = 0; i < available.size(); ++i) {
      if (eligible(i)) least = std::min(least, loads[i]);
    }
    size_t at = available.size();
    uint64_t tie = 0;
    for (size_t i = 0; i < available.size(); ++i) {
      if (!eligible(i) || loads[i] > least + 1) continue;
      const uint64_t t = tie_key(request, keys[i]);
      if (at == available.size() || t < tie) {
        at = i;
        tie = t;
      }
    }
    return at;
  };
  auto any = [](size_t) { return true; };
  Decision d;
  d.origin_us = now;
  const auto [low, high] = std::minmax_element(loads.begin(), loads.end());
  if (imbalanced(LoadSpread{*low, *high}, config_.balance_abs_threshold,
                 config_.balance_rel_threshold)) {
    const size_t i = pick(any);
    d.worker = available[i];
    d.branch = "imbalanced";
    d.predicted_chars = covered(matched[i]);
    return d;
  }
  const size_t best_bytes = covered(best);
  const double rate =
      text.empty() ? 0.0 : static_cast<double>(best_bytes) / static_cast<double>(text.size());
  if (rate > config_.cache_threshold) {
    const size_t i = pick([&](size_t k) { return matched[k] == best; });
    d.worker = available[i];
    d.branch = "cache_hit";
    d.predicted_chars = best_bytes;
    return d;
  }
  const size_t i = pick(any);
  d.worker = available[i];
  d.branch = "cache_miss_min_load";
  d.predicted_chars = covered(matched[i]);
  return d;
}

void CacheAwarePolicy::apply_peer(const replica::ChainRecord& r) {
  if (r.predict) return;  // kv_exact's, not this policy's
  if (r.chunk_bytes != chunk_bytes_) {
    static log::RateLimit limit(1, std::chrono::seconds(60));
    log::warn(limit, "replica sync: a peer chunks prompts differently; its records are dropped")
        .kv("rule", config_.rule)
        .kv("peer_chunk_bytes", r.chunk_bytes)
        .kv("chunk_bytes", chunk_bytes_);
    return;
  }
  const int64_t expiry = r.origin_us + ttl_us_;
  if (!r.retract && expiry <= replica::Sync::now_us()) return;  // expired already (a replay)
  if (r.retract) {
    chunks_->retract(r.hashes, r.worker, expiry);
    return;
  }
  const size_t dropped = chunks_->apply(r.hashes, r.worker, expiry);
  if (dropped > 0 && chunk_dropped_) chunk_dropped_->inc(dropped);
}

void CacheAwarePolicy::start() {
  std::lock_guard lock(start_mu_);
  if (starts_++ > 0 || !config_.replica || !chunks_) return;
  sink_ = config_.replica->add_sink(config_.rule,
                                    [this](const replica::ChainRecord& r) { apply_peer(r); });
}

void CacheAwarePolicy::stop() {
  std::lock_guard lock(start_mu_);
  if (starts_ == 0 || --starts_ > 0 || sink_ == 0) return;
  config_.replica->remove_sink(sink_);
  sink_ = 0;
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
  if (chunks_) {
    const std::vector<uint64_t>& chain = chain_of(ctx);
    if (chain.empty()) return;
    replica::ChainRecord r{.rule = config_.rule,
                           .worker = d.worker->url_key(),
                           .origin_us = d.origin_us != 0 ? d.origin_us : replica::Sync::now_us(),
                           .chunk_bytes = static_cast<uint32_t>(chunk_bytes_),
                           .hashes = chain};
    const size_t dropped = chunks_->apply(chain, r.worker, r.origin_us + ttl_us_);
    if (dropped > 0 && chunk_dropped_) chunk_dropped_->inc(dropped);
    config_.replica->publish(std::move(r));
    return;
  }
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
  if (chunks_) {
    const std::vector<uint64_t>& chain = chain_of(ctx);
    if (!outcome.started) {
      if (chain.empty() || d.origin_us == 0) return;
      replica::ChainRecord r{.rule = config_.rule,
                             .worker = d.worker->url_key(),
                             .origin_us = d.origin_us,
                             .retract = true,
                             .chunk_bytes = static_cast<uint32_t>(chunk_bytes_),
                             .hashes = chain};
      chunks_->retract(chain, r.worker, r.origin_us + ttl_us_);
      config_.replica->publish(std::move(r));
      if (withdrawn_) withdrawn_->with({config_.rule, d.worker->url()}).inc();
      return;
    }
    if (!outcome.cached_tokens || !outcome.prompt_tokens || *outcome.prompt_tokens <= 0) return;
    // predicted_chars are bytes here (the index covers bytes).
    const double bytes_per_token =
        static_cast<double>(text.size()) / static_cast<double>(*outcome.prompt_tokens);
    const auto predicted_tokens =
        static_cast<uint64_t>(static_cast<double>(d.predicted_chars) / bytes_per_token);
    if (predicted_) predicted_->with({config_.rule, d.worker->url()}).inc(predicted_tokens);
    if (cached_) {
      cached_->with({config_.rule, d.worker->url()})
          .inc(static_cast<uint64_t>(std::max<int64_t>(0, *outcome.cached_tokens)));
    }
    return;
  }
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
  // (Shared: the index keeps a worker this replica no longer lists, as its peers do; a match
  // only looks at the available workers, and its entries expire.)
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
  std::chrono::milliseconds p = std::chrono::seconds(config_.eviction_interval_secs);
  // The shared index is bounded by expiry: swept often enough that it stays under its cap.
  if (chunks_) p = std::min<std::chrono::milliseconds>(p, std::chrono::seconds(10));
  return p;
}

void CacheAwarePolicy::on_period() {
  if (chunks_) {
    const size_t removed = chunks_->expire(replica::Sync::now_us());
    if (removed > 0)
      log::debug("chunk index swept").kv("rule", config_.rule).kv("entries", removed);
    if (chunk_entries_) chunk_entries_->set(static_cast<double>(chunks_->size()));
  }
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
