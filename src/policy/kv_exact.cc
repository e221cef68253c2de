// policy/kv_exact: see kv_exact.h.
#include "policy/kv_exact.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <unordered_map>
#include <unordered_set>

#include "http/client.h"
#include "http/io.h"
#include "policy/registry.h"
#include "replica/sync.h"
#include "tokenizer/tokenizer.h"
#include "util/json.h"
#include "util/log.h"
#include "util/versioned.h"

namespace kvgate {
namespace {

// FNV-1a: the tie-break hash of a source, the same in every kvgate (from its URL and rank).
uint64_t fnv1a(std::string_view s, uint64_t h = 1469598103934665603ULL) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

std::string zmq_endpoint(const std::string& host, int64_t port) {
  bool v6 = host.find(':') != std::string::npos;
  return "tcp://" + (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

}  // namespace

struct KvExactPolicy::Source {
  kv::SourceId id = 0;
  WorkerPtr worker;
  int rank = 0;
  std::string url;
  uint64_t tiebreak = 0;
  uint64_t key = 0;                         // replica::worker_key of the url
  std::atomic<int64_t> active{0};           // requests dispatched here, not completed
  std::atomic<int64_t> pending_prefill{0};  // their prompt tokens not cached here
  // The same two as the other kvgate replicas reported them, summed (--replica-sync; else 0),
  // and this replica's own as NATS echoed its report: each with the moment it counts from (the
  // report's sending + settle), and the figures before it, so that a decision asked for a moment
  // (route-only ?at=) weighs the figures of that moment, not those of when it ran.
  using Versioned = VersionedFigures<2>;  // {active, pending}
  Versioned peers;
  // With replicas, the cost uses `reported` (own) rather than the live counts while NATS is
  // there, so every replica weighs the same figures at the same moment (a live count differs
  // from what peers know for up to a load interval, and decisions near a tie would differ);
  // without NATS (and until its first report after a reconnection came back), the live ones.
  Versioned reported;
  // The fleet's figures {active, pending} as of `when` (unix us; 0: now), this replica's own as
  // echoed when `shared` (Sync::own_view(), read once per decision so that every rank of it is
  // weighed alike), else live.
  Versioned::Values fleet(int64_t when, bool shared) const {
    Versioned::Values f = peers.at(when);
    if (shared) {
      const Versioned::Values own = reported.at(when);
      f[0] += own[0];
      f[1] += own[1];
    } else {
      f[0] += active.load(std::memory_order_relaxed);
      f[1] += pending_prefill.load(std::memory_order_relaxed);
    }
    return f;
  }
  std::atomic<bool> ready{false};  // trusted (kvWarmupSec, or holding blocks)
  // Its events' block size is not the rule's kvBlockSize: excluded (its pages never match ours),
  // with a warning and a metric, instead of silently missing.
  std::atomic<bool> page_size_mismatch{false};
  std::atomic<int64_t> engine_block_size{0};  // what its events carried, when mismatched
  // What the doctor reads: its batches' shape, and the hash parity of its root events.
  std::atomic<uint64_t> map_batches{0};
  std::atomic<uint64_t> hash_checked{0};
  std::atomic<uint64_t> hash_mismatched{0};
  // Ground truth cells (null without metrics), and the same counts for the inventory view.
  metrics::Counter* predicted_tokens = nullptr;
  metrics::Counter* cached_tokens = nullptr;
  std::atomic<uint64_t> hits{0};
  std::atomic<uint64_t> predicted_sum{0};
  std::atomic<uint64_t> cached_sum{0};
  // Tokenizer parity: the probe's state, and the stores captured while it runs (the subscriber's
  // thread appends while `capturing`).
  std::atomic<bool> capturing{false};
  mutable std::mutex probe_mu;
  std::string parity_state = "untested";
  uint64_t probes_done = 0;  // results stored (the doctor waits for one newer than it asked)
  std::string parity_detail;
  bool probe_wanted = true;
  bool probe_running = false;
  std::vector<kv_parity::Stored> captured;
  size_t captured_tokens = 0;
  // What tells the probe's stores from other traffic's: its nonce in their decoded tokens, or
  // a parent among the probe's blocks already captured.
  std::string capture_nonce;
  const tokenizer::Tokenizer* capture_tok = nullptr;  // kept alive by the runtime
  std::unordered_set<uint64_t> capture_blocks;
  // Its events named an adapter (lora_name): its adapters' pages are in their namespaces.
  std::atomic<bool> lora_names{false};
  std::atomic<uint8_t> bootstrap{0};  // kv::Bootstrap as of the last upkeep
  // The last batch applied to the inventory (valid while applied_valid): what a peer seeding
  // from this replica continues after. Stored after the batch is applied.
  std::atomic<uint64_t> applied_seq{0};
  std::atomic<bool> applied_valid{false};
};

struct KvExactPolicy::Sources {
  std::vector<std::shared_ptr<Source>> all;
  std::unordered_map<uint64_t, std::vector<Source*>> by_worker;  // worker id -> by rank
  std::unordered_map<kv::SourceId, Source*> by_id;               // ids are never reused
  Source* by_source(uint64_t id) const {
    auto it = by_id.find(static_cast<kv::SourceId>(id));
    return it == by_id.end() ? nullptr : it->second;
  }
  // By (worker key, rank): what other replicas name a source by.
  Source* by_key(uint64_t key, int rank) const {
    for (const auto& s : all) {
      if (s->key == key && s->rank == rank) return s.get();
    }
    return nullptr;
  }
};

namespace {

// Consecutive zero-hit lookups (against a non-empty inventory) that fire the watchdog.
constexpr int64_t kZeroHitWatchdog = 50;
log::RateLimit kLogWatchdog(1, std::chrono::seconds(60));

kv::InventoryOptions inventory_options(const PolicyConfig& c) {
  kv::InventoryOptions o;
  o.page_size = static_cast<size_t>(std::max<int64_t>(1, c.kv.page_size));
  if (c.kv.max_blocks > 0) o.max_blocks = c.kv.max_blocks;
  o.other_tier_weight = c.kv.other_tier_weight;
  return o;
}

}  // namespace

KvExactPolicy::KvExactPolicy(const PolicyConfig& config, std::unique_ptr<Policy> fallback)
    : rule_(config.rule),
      page_size_(std::max<int64_t>(1, config.kv.page_size)),
      dp_ranks_(std::max<int64_t>(1, config.kv.dp_ranks)),
      zmq_port_(config.kv.zmq_port),
      endpoint_ports_(config.kv.endpoint_ports),
      warmup_(config.kv.warmup),
      load_tokens_(config.kv.load_tokens),
      fallback_(std::move(fallback)),
      predict_ttl_(config.kv.predict_ttl),
      parity_probe_(config.kv.parity_probe),
      inventory_(inventory_options(config)),
      subscriber_(kv::SubscriberOptions{.seed = config.replica != nullptr}, *this),
      sources_(std::make_shared<const Sources>()) {
  replica_ = config.replica;
  if (replica_) {
    settle_us_ = std::chrono::duration_cast<std::chrono::microseconds>(replica_->settle()).count();
  }
  if (replica_ && config.registry) {
    // A miss goes to the fallback: with a local cursor or random draw there, replicas decide
    // misses each their own way (new conversations land anywhere, bursts split).
    const std::string_view f = fallback_->name();
    if (f == "round_robin" || f == "random" || f == "power_of_two" || f == "bucket") {
      log::warn(
          "kv_exact with --replica-sync: the fallback decides misses on this replica's own state, "
          "so replicas will route new prompts differently; set the rule's sel (or "
          "--kv-fallback-policy) to cache_aware (shared by replicas), consistent_hashing, "
          "prefix_hash or chwbl")
          .kv("rule", rule_)
          .kv("fallback", f);
    }
  }
  if (config.kv.hash_algo == "sha256_sglang") {
    hasher_ = std::make_unique<kv::BlockHasher>(kv::HashScheme::kSglang);
  } else if (config.kv.hash_algo == "sha256_cbor") {
    hasher_ =
        std::make_unique<kv::BlockHasher>(kv::HashScheme::kVllmSha256Cbor, kv::vllm_default_seed());
  }
  if (config.registry) {
    auto& r = *config.registry;
    hits_ = &r.counter("kvgate_kv_exact_hits_total",
                       "kv_exact: requests routed by the inventory (kv_exact_hit: to a holder of "
                       "their prefix; kv_exact_balance: by cost among trusted ranks)",
                       {"rule"})
                 .with({rule_});
    auto& misses = r.counter("kvgate_kv_exact_misses_total",
                             "kv_exact: requests the fallback policy routed, by why: miss (no "
                             "page held anywhere), not_ready (no subscriber trusted yet), "
                             "no_tokens, lora (several adapters named), unrendered (the chat "
                             "template rejected the conversation)",
                             {"rule", "reason"});
    // One cell per reason, looked up here once rather than per request.
    for (const auto& [reason, cell] :
         {std::pair{"miss", &miss_}, std::pair{"not_ready", &miss_not_ready_},
          std::pair{"no_tokens", &miss_no_tokens_}, std::pair{"lora", &miss_lora_},
          std::pair{"unrendered", &miss_unrendered_}}) {
      *cell = &misses.with({rule_, reason});
    }
    auto& stages = r.histogram(
        "kvgate_kv_exact_routing_seconds",
        "kv_exact: routing work per request by stage: render (chat template), tokenize, keys "
        "(hash the pages), match (walk the inventory), select (cost of every rank, choice)",
        {"rule", "stage"},
        {1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 1e-2});
    for (const auto& [stage, cell] :
         {std::pair{"render", &t_render_}, std::pair{"tokenize", &t_tokenize_},
          std::pair{"keys", &t_keys_}, std::pair{"match", &t_match_},
          std::pair{"select", &t_select_}}) {
      *cell = &stages.with({rule_, stage});
    }
    events_ = &r.counter("kvgate_kv_events_total", "KV events applied, by type",
                         {"rule", "endpoint", "rank", "type"});
    connected_ = &r.gauge("kvgate_kv_subscriber_connected",
                          "1 while the event subscriber of the (endpoint, rank) is connected",
                          {"rule", "endpoint", "rank"});
    blocks_ = &r.gauge("kvgate_kv_blocks", "Blocks the inventory holds per (endpoint, rank, tier)",
                       {"rule", "endpoint", "rank", "medium"});
    resets_ = &r.counter("kvgate_kv_resyncs_total",
                         "Sources forgotten and rebuilt from new events, by why: gap_no_replay, "
                         "replay_failed, restart, removed, disconnected",
                         {"rule", "reason"});
    orphans_ = &r.counter("kvgate_kv_orphan_blocks_total",
                          "Stored blocks skipped because their parent was never seen (events "
                          "missed)",
                          {"rule"})
                    .with({rule_});
    page_size_mismatches_ =
        &r.counter("kvgate_kv_page_size_mismatches_total",
                   "Stored events skipped because their block size is not the rule's "
                   "kvBlockSize: set kvBlockSize to the engine's --page-size",
                   {"rule"})
             .with({rule_});
    predicted_tokens_ =
        &r.counter("kvgate_kv_exact_predicted_tokens_total",
                   "kv_exact: prompt tokens it expected cached on the (endpoint, "
                   "rank) it routed to (counted when the worker reports "
                   "cached_tokens; compare with kvgate_kv_exact_cached_tokens_total)",
                   {"rule", "endpoint", "rank"});
    watchdog_ = &r.counter("kvgate_kv_exact_zero_hit_watchdog_total",
                           "kv_exact: times 50 lookups in a row matched nothing while the "
                           "inventory held blocks (a wrong kvBlockSize, tokenizer or chat "
                           "template, or requests sharing no prefix)",
                           {"rule"})
                     .with({rule_});
    hash_checked_ = &r.counter("kvgate_kv_hash_checked_total",
                               "kv_exact: stored blocks whose engine id was recomputed from their "
                               "tokens (blocks of chains that start in the event)",
                               {"rule"})
                         .with({rule_});
    hash_mismatches_ = &r.counter("kvgate_kv_hash_mismatches_total",
                                  "kv_exact: recomputed ids that differ from the engine's: another "
                                  "engine build, hash (kvHashAlgo) or page size",
                                  {"rule"})
                            .with({rule_});
    excluded_ = &r.gauge("kvgate_kv_source_excluded",
                         "kv_exact: 1 when the (endpoint, rank) is left out of kv_exact routing: "
                         "page_size (its events' block size is not kvBlockSize)",
                         {"rule", "endpoint", "rank", "reason"});
    parity_ = &r.gauge("kvgate_kv_tokenizer_parity",
                       "kv_exact: the tokenizer parity probe of the (endpoint, rank): 1 the "
                       "engine's token ids are kvgate's, 0 they differ (see the log or the "
                       "inventory view for the first differing token), -1 no answer",
                       {"rule", "endpoint", "rank"});
    parity_mismatches_ = &r.counter("kvgate_kv_tokenizer_mismatches_total",
                                    "kv_exact: parity probes whose engine token ids differed "
                                    "from kvgate's (chat template, BOS, tokenizer)",
                                    {"rule"})
                              .with({rule_});
    bootstrap_ = &r.gauge("kvgate_kv_source_bootstrap",
                          "kv_exact: how the (endpoint, rank)'s view began, 1 for the current "
                          "state: live (followed from sequence 0), engine_replay (the engine's "
                          "replay gave its history), peer (another replica's inventory), cold "
                          "(began mid-stream: trusted only after kvWarmupSec), pending",
                          {"rule", "endpoint", "rank", "how"});
    cached_tokens_ = &r.counter("kvgate_kv_exact_cached_tokens_total",
                                "kv_exact: prompt tokens the (endpoint, rank) reported cached for "
                                "the requests kv_exact routed there",
                                {"rule", "endpoint", "rank"});
  }
}

KvExactPolicy::~KvExactPolicy() {
  {
    // A parity probe's next step (on the control loop) finds the policy gone.
    std::lock_guard lock(life_->mu);
    life_->alive = false;
  }
  subscriber_.stop();
}

ParseOptions KvExactPolicy::parse_options() const {
  ParseOptions o = fallback_->parse_options();
  o.want_text = true;
  o.want_tokens = true;
  o.max_tokens = 0;  // every page counts
  return o;
}

bool KvExactPolicy::ready(kv::SourceId s) const {
  auto src = sources_.load();
  for (const auto& p : src->all) {
    if (p->id == s) return p->ready.load(std::memory_order_relaxed);
  }
  return false;
}

Decision KvExactPolicy::fall_back(std::span<Worker* const> available, RouteContext& ctx,
                                  std::string_view why, metrics::Counter* counted,
                                  const Sources& sources) {
  Decision inner = fallback_->select(available, ctx);
  Decision d = inner;
  if (!inner.worker) return d;
  d.inner_branch = inner.branch;
  d.branch = why;
  d.predicted_tokens = 0;
  // (What names this dispatch's prediction: its retraction must name the same origin.)
  d.origin_us = next_origin();
  if (counted && !ctx.route_only) counted->inc();
  auto it = sources.by_worker.find(inner.worker->id());
  if (it != sources.by_worker.end() && it->second.size() > 1) {
    // The fallback chose the worker; the rank with the least prefill queued there takes it.
    int best = 0;
    int64_t best_load = std::numeric_limits<int64_t>::max();
    const bool shared = replica_ != nullptr && replica_->own_view();
    for (const Source* s : it->second) {
      const auto f = s->fleet(ctx.at_us, shared);
      int64_t load = f[0] + f[1];
      if (load < best_load) {
        best_load = load;
        best = s->rank;
        d.target_id = s->id;
      }
    }
    d.dp_rank = best;
  } else if (it != sources.by_worker.end() && !it->second.empty()) {
    d.target_id = it->second.front()->id;
  }
  return d;
}

const std::vector<kv::BlockKey>& KvExactPolicy::request_keys(RouteContext& ctx) const {
  if (!ctx.page_keys_set) {
    const RequestInfo& req = *ctx.request;
    ctx.page_keys.clear();
    std::optional<std::string_view> salt, lora;
    if (req.cache_salt) salt = *req.cache_salt;
    if (req.lora) lora = *req.lora;
    kv::chain_keys(req.tokens, static_cast<size_t>(page_size_),
                   kv::chain_seed(salt, std::nullopt, lora), ctx.page_keys);
    ctx.page_keys_set = true;
  }
  return ctx.page_keys;
}

void KvExactPolicy::count_zero_hit() {
  if (inventory_.nodes() > 0 &&
      zero_hits_.fetch_add(1, std::memory_order_relaxed) + 1 == kZeroHitWatchdog) {
    zero_hits_.store(0, std::memory_order_relaxed);
    if (watchdog_) watchdog_->inc();
    log::warn(kLogWatchdog,
              "kv_exact: 50 lookups in a row matched no cached page although the inventory "
              "holds blocks; check that kvBlockSize is the engines' --page-size, that "
              "tokenizerPath is the served model's (same chat template), or whether requests "
              "share prefixes at all")
        .kv("rule", rule_)
        .kv("blocks", inventory_.nodes());
  }
}

Decision KvExactPolicy::select(std::span<Worker* const> available, RouteContext& ctx) {
  auto sources = sources_.load();
  const RequestInfo& req = *ctx.request;
  // An adapter's pages are keyed in its namespace only once the engines' events name adapters
  // (SGLang builds whose recorder sends lora_name); before that, or for a request naming a list
  // of adapters, there is no namespace to look in.
  if (req.names_lora && (!req.lora || !lora_names_seen_.load(std::memory_order_relaxed))) {
    return fall_back(available, ctx, "kv_exact_lora", miss_lora_, *sources);
  }
  if (req.render_failed) {
    return fall_back(available, ctx, "kv_exact_unrendered", miss_unrendered_, *sources);
  }
  if (req.tokens.empty())
    return fall_back(available, ctx, "kv_exact_no_tokens", miss_no_tokens_, *sources);

  using Clock = std::chrono::steady_clock;
  // (a retry's work is not counted, nor a route-only question's)
  const bool timed = t_keys_ != nullptr && !ctx.page_keys_set && !ctx.route_only;
  Clock::time_point t0;
  if (timed) {
    t_render_->observe(std::chrono::duration<double>(req.render_time).count());
    t_tokenize_->observe(std::chrono::duration<double>(req.tokenize_time).count());
    t0 = Clock::now();
  }
  thread_local std::vector<kv::SourceMatch> matches;
  const std::vector<kv::BlockKey>& keys = request_keys(ctx);
  Clock::time_point t1;
  if (timed) t1 = Clock::now();
  inventory_.match(keys, matches);
  Clock::time_point t2;
  if (timed) t2 = Clock::now();
  // The select stage (predictions, cost of every rank, choice) is observed when this returns.
  struct SelectTimer {
    metrics::Histogram* h;
    Clock::time_point from;
    ~SelectTimer() {
      if (h) h->observe(std::chrono::duration<double>(Clock::now() - from).count());
    }
  } select_timer{timed ? t_select_ : nullptr, t2};
  if (timed) {
    t_keys_->observe(std::chrono::duration<double>(t1 - t0).count());
    t_match_->observe(std::chrono::duration<double>(t2 - t1).count());
  }
  // Pages predicted where earlier requests were just sent: the leading run of one source.
  kv::SourceId predicted_source = 0;
  int64_t predicted_pages = 0;
  // The moment decided for: now, or the one route-only was asked about (?at=).
  const int64_t when = ctx.at_us;
  // Own figures as echoed (with NATS) or live, for every rank of this decision alike.
  const bool shared = replica_ != nullptr && replica_->own_view();
  if (predict_ttl_.count() > 0 && !keys.empty()) {
    const int64_t now = when != 0 ? when : replica::Sync::now_us();
    std::lock_guard lock(predict_mu_);
    for (kv::BlockKey k : keys) {
      auto it = predicted_.find(k);
      if (it == predicted_.end() || it->second.expires_us < now) break;
      // With replicas a prediction counts from its origin + settle_us_ on every one alike (it has
      // reached them all by then), not from whenever each heard it.
      if (it->second.origin_us + settle_us_ > now) break;
      if (predicted_pages == 0) predicted_source = it->second.source;
      if (it->second.source != predicted_source) break;
      ++predicted_pages;
    }
  }

  const bool maybe_ready = any_ready_.load(std::memory_order_relaxed);
  if (!maybe_ready || (matches.empty() && predicted_pages == 0)) {
    // No rank trusted yet (not ready), or nothing cached or predicted anywhere (a miss, or not
    // ready): which one needs only a trusted rank of an available worker, not a cost per rank.
    bool any_ready = false;
    if (maybe_ready) {
      for (Worker* w : available) {
        auto it = sources->by_worker.find(w->id());
        if (it == sources->by_worker.end()) continue;
        for (const Source* s : it->second) {
          any_ready = any_ready || (s->ready.load(std::memory_order_relaxed) &&
                                    (!req.lora || s->lora_names.load(std::memory_order_relaxed)));
        }
        if (any_ready) break;
      }
    }
    if (!any_ready && req.lora) {
      return fall_back(available, ctx, "kv_exact_lora", miss_lora_, *sources);
    }
    if (!any_ready) {
      return fall_back(available, ctx, "kv_exact_not_ready", miss_not_ready_, *sources);
    }
    if (!replica_) {
      if (!ctx.route_only) count_zero_hit();
      return fall_back(available, ctx, "kv_exact_miss", miss_, *sources);
    }
    // With replicas a miss is placed by the cost below (see there).
  }
  const auto tokens = static_cast<int64_t>(req.tokens.size());
  const uint64_t request_hash = keys.empty() ? 0 : keys.front();
  Source* best = nullptr;
  double best_cost = 0;
  int64_t best_active = 0;
  uint64_t best_tie = 0;
  int64_t best_cached = 0;
  int64_t longest = 0;
  bool any_ready = false;
  // With replicas, every rank's cost (for a miss: see below).
  struct Costed {
    Source* source;
    double cost;
    uint64_t tie;
  };
  thread_local std::vector<Costed> costed;
  costed.clear();
  for (Worker* w : available) {
    auto it = sources->by_worker.find(w->id());
    if (it == sources->by_worker.end()) continue;
    for (Source* s : it->second) {
      if (!s->ready.load(std::memory_order_relaxed)) continue;
      // An adapter's pages are in its namespace only on ranks whose events name adapters (a
      // rolling upgrade may mix builds): others are not judged on them.
      if (req.lora && !s->lora_names.load(std::memory_order_relaxed)) continue;
      any_ready = true;
      int64_t cached = 0;
      for (const auto& m : matches) {
        if (m.source == s->id) {
          cached = static_cast<int64_t>(m.pages * static_cast<double>(page_size_));
          break;
        }
      }
      const auto fleet = s->fleet(when, shared);
      int64_t pending = fleet[1];
      if (s->id == predicted_source) {
        // The prefix is being prefilled there for the requests just sent: this one waits for
        // that work instead of doing it again, so the part the engine has not confirmed yet is
        // counted once (as cached), not as queued prefill too.
        int64_t predicted = predicted_pages * page_size_;
        int64_t unconfirmed = std::max<int64_t>(0, predicted - cached);
        cached = std::max(cached, predicted);
        pending = std::max<int64_t>(0, pending - unconfirmed);
      }
      longest = std::max(longest, cached);
      int64_t active = fleet[0];
      double cost = static_cast<double>(std::max<int64_t>(0, tokens - cached)) +
                    static_cast<double>(pending) + load_tokens_ * static_cast<double>(active);
      uint64_t tie = mix(request_hash ^ s->tiebreak);
      if (replica_) costed.push_back({s, cost, tie});
      bool better = best == nullptr || cost < best_cost ||
                    (cost == best_cost &&
                     (active < best_active || (active == best_active && tie < best_tie)));
      if (better) {
        best = s;
        best_cost = cost;
        best_active = active;
        best_tie = tie;
        best_cached = cached;
      }
    }
  }
  if (!any_ready && req.lora) {
    return fall_back(available, ctx, "kv_exact_lora", miss_lora_, *sources);
  }
  if (!any_ready) return fall_back(available, ctx, "kv_exact_not_ready", miss_not_ready_, *sources);
  const bool miss = longest == 0 || best == nullptr;
  if (miss) {
    if (!ctx.route_only) count_zero_hit();
    // Alone, the fallback places a miss. With replicas kv_exact's own cost does (uncached tokens,
    // queued prefill and active requests per rank, the figures every replica weighs alike; ties
    // by the request's first page): the fallback decides on its own replica's state (its live
    // loads, its records before the peers have them), and replicas would place one new
    // conversation each their own way. Still counted as a miss.
    if (!replica_ || best == nullptr) {
      return fall_back(available, ctx, "kv_exact_miss", miss_, *sources);
    }
    if (!ctx.route_only && miss_) miss_->inc();
    // The figures every replica weighs move once per load report, not at each dispatch: new
    // prompts decided between two reports would all take the one cheapest rank. So a miss takes,
    // among the ranks whose queued work is within this request's of the cheapest, the one its
    // hash picks: a burst of new prompts spreads, alike on every replica.
    const double within = best_cost + static_cast<double>(tokens);
    uint64_t pick = std::numeric_limits<uint64_t>::max();
    for (const Costed& c : costed) {
      if (c.cost <= within && c.tie < pick) {
        pick = c.tie;
        best = c.source;
      }
    }
  } else if (!ctx.route_only) {
    zero_hits_.store(0, std::memory_order_relaxed);
    if (hits_) hits_->inc();
    best->hits.fetch_add(1, std::memory_order_relaxed);
  }
  Decision d;
  d.worker = best->worker.get();
  if (auto it = sources->by_worker.find(d.worker->id());
      it != sources->by_worker.end() && it->second.size() > 1) {
    d.dp_rank = best->rank;
  }
  d.branch = miss ? "kv_exact_miss" : best_cached > 0 ? "kv_exact_hit" : "kv_exact_balance";
  d.origin_us = next_origin();
  d.predicted_tokens = static_cast<size_t>(std::min(best_cached, tokens));
  d.target_id = best->id;
  return d;
}

void KvExactPolicy::on_dispatched(const Decision& d, RouteContext& ctx) {
  auto sources = sources_.load();
  const RequestInfo& req = *ctx.request;
  auto tokens = static_cast<int64_t>(req.tokens.size());
  if (Source* s = sources->by_source(d.target_id)) {
    s->active.fetch_add(1, std::memory_order_relaxed);
    s->pending_prefill.fetch_add(tokens - static_cast<int64_t>(d.predicted_tokens),
                                 std::memory_order_relaxed);
    if (predict_ttl_.count() > 0 && !req.tokens.empty() && (!req.names_lora || req.lora)) {
      const std::vector<kv::BlockKey>& all = request_keys(ctx);
      std::span<const kv::BlockKey> keys(all.data(), std::min(all.size(), kMaxPredictedPerRequest));
      const int64_t origin = d.origin_us != 0 ? d.origin_us : replica::Sync::now_us();
      // Applied here at once and by the peers as NATS delivers it (siblings of a burst co-locate
      // whichever replica they reach); with replicas it counts from origin + settle on every one
      // alike, this one included, so none decides on what the others do not know yet.
      predict(keys, *s, origin, false);
      if (replica_) {
        replica_->publish(replica::ChainRecord{.rule = rule_,
                                               .worker = s->key,
                                               .rank = s->rank,
                                               .origin_us = origin,
                                               .predict = true,
                                               .hashes = {keys.begin(), keys.end()}});
      }
    }
  }
  if (!d.inner_branch.empty()) {
    Decision inner = d;
    inner.branch = d.inner_branch;
    inner.inner_branch = {};
    fallback_->on_dispatched(inner, ctx);
  }
}

// The prompt's prefill is done: its tokens no longer queue on the rank (the request stays active
// there until it completes).
void KvExactPolicy::on_first_token(const Decision& d, RouteContext& ctx) {
  auto sources = sources_.load();
  auto tokens = static_cast<int64_t>(ctx.request->tokens.size());
  if (Source* s = sources->by_source(d.target_id)) {
    s->pending_prefill.fetch_sub(tokens - static_cast<int64_t>(d.predicted_tokens),
                                 std::memory_order_relaxed);
  }
  if (!d.inner_branch.empty()) {
    Decision inner = d;
    inner.branch = d.inner_branch;
    inner.inner_branch = {};
    fallback_->on_first_token(inner, ctx);
  }
}

void KvExactPolicy::on_completed(const Decision& d, RouteContext& ctx, const Outcome& o) {
  auto sources = sources_.load();
  const RequestInfo& req = *ctx.request;
  auto tokens = static_cast<int64_t>(req.tokens.size());
  if (Source* s = sources->by_source(d.target_id)) {
    s->active.fetch_sub(1, std::memory_order_relaxed);
    if (!o.first_token) {
      s->pending_prefill.fetch_sub(tokens - static_cast<int64_t>(d.predicted_tokens),
                                   std::memory_order_relaxed);
    }
    if (!o.started && predict_ttl_.count() > 0 && !req.tokens.empty() &&
        (!req.names_lora || req.lora)) {
      // The worker never ran it: what it predicted there is withdrawn (on every replica).
      const std::vector<kv::BlockKey>& all = request_keys(ctx);
      std::span<const kv::BlockKey> keys(all.data(), std::min(all.size(), kMaxPredictedPerRequest));
      const int64_t origin = d.origin_us != 0 ? d.origin_us : replica::Sync::now_us();
      predict(keys, *s, origin, true);
      if (replica_) {
        replica_->publish(replica::ChainRecord{.rule = rule_,
                                               .worker = s->key,
                                               .rank = s->rank,
                                               .origin_us = origin,
                                               .retract = true,
                                               .predict = true,
                                               .hashes = {keys.begin(), keys.end()}});
      }
    }
  }
  if (o.cached_tokens && d.inner_branch.empty()) {
    if (Source* s = sources->by_source(d.target_id)) {
      auto cached = static_cast<uint64_t>(std::max<int64_t>(0, *o.cached_tokens));
      s->predicted_sum.fetch_add(d.predicted_tokens, std::memory_order_relaxed);
      s->cached_sum.fetch_add(cached, std::memory_order_relaxed);
      if (s->predicted_tokens) {
        s->predicted_tokens->inc(d.predicted_tokens);
        s->cached_tokens->inc(cached);
      }
    }
  }
  if (!d.inner_branch.empty()) {
    Decision inner = d;
    inner.branch = d.inner_branch;
    inner.inner_branch = {};
    fallback_->on_completed(inner, ctx, o);
  }
}

void KvExactPolicy::on_workers_changed(const WorkerSet& set) {
  fallback_->on_workers_changed(set);
  std::lock_guard lock(change_mu_);
  workers_ = set.workers;
  rebuild_sources();
}

void KvExactPolicy::rebuild_sources() {
  auto old = sources_.load();
  std::map<kv::SourceId, std::shared_ptr<Source>> kept;
  for (const auto& s : old->all) kept[s->id] = s;
  auto next = std::make_shared<Sources>();
  std::vector<kv::SourceSpec> specs;
  std::map<std::pair<uint64_t, int>, kv::SourceId> ids;
  std::map<uint64_t, std::optional<KvEventsInfo>> built_from;
  auto warn_once = [&](const WorkerPtr& w, std::string_view kind) -> bool {
    return warned_.insert(w->url() + "#" + std::string(kind)).second;
  };
  for (const auto& w : workers_) {
    // Where the worker's ranks publish: its own /server_info (kv_events) when it told us, else the
    // rule (kvZmqPort, an endpoint's own kvZmqPort, kvDpRankCount).
    std::optional<KvEventsInfo> info = w->kv_events();
    built_from[w->id()] = info;
    int64_t base = zmq_port_;
    if (auto it = endpoint_ports_.find(w->url()); it != endpoint_ports_.end()) base = it->second;
    int64_t ranks = dp_ranks_;
    std::string host = w->target().host;
    std::string topic;
    std::optional<int64_t> replay;
    bool wrong_page_size = false;
    int64_t engine_page_size = 0;
    if (info) {
      base = info->port_base;
      ranks = info->dp_size;
      topic = info->topic;
      replay = info->replay_port_base;
      if (!info->host.empty() && info->host != "*" && info->host != "0.0.0.0" &&
          info->host != "::") {
        host = info->host;
      }
      if (info->dp_size != dp_ranks_ && warn_once(w, "dp_size")) {
        log::warn(
            "kv_exact: the engine runs another number of DP ranks than kvDpRankCount; "
            "kvgate follows every rank the engine reports (fix kvDpRankCount to silence "
            "this)")
            .kv("rule", rule_)
            .kv("endpoint", w->url())
            .kv("engine_dp_size", info->dp_size)
            .kv("kvDpRankCount", dp_ranks_);
      }
      if (info->block_size > 0 && info->block_size != page_size_) {
        wrong_page_size = true;
        engine_page_size = info->block_size;
        if (warn_once(w, "page_size")) {
          log::warn(
              "kv_exact: the engine's page size (from its /server_info) is not the rule's "
              "kvBlockSize; its ranks are left out of kv_exact routing until it matches "
              "(set kvBlockSize to the engine's --page-size)")
              .kv("rule", rule_)
              .kv("endpoint", w->url())
              .kv("engine_block_size", info->block_size)
              .kv("kvBlockSize", page_size_);
        }
      }
    }
    auto& list = next->by_worker[w->id()];
    for (int r = 0; r < ranks; ++r) {
      auto key = std::make_pair(w->id(), r);
      kv::SourceId id = 0;
      if (auto it = ids_.find(key); it != ids_.end()) {
        id = it->second;
      } else {
        id = next_id_++;
      }
      ids[key] = id;
      std::shared_ptr<Source> s;
      if (auto it = kept.find(id); it != kept.end()) {
        s = it->second;
      } else {
        s = std::make_shared<Source>();
        s->id = id;
        s->worker = w;
        s->rank = r;
        s->url = w->url();
        s->tiebreak = fnv1a(std::to_string(r), fnv1a(w->url()));
        s->key = w->url_key();
        if (predicted_tokens_) {
          std::string rank = std::to_string(r);
          s->predicted_tokens = &predicted_tokens_->with({rule_, s->url, rank});
          s->cached_tokens = &cached_tokens_->with({rule_, s->url, rank});
        }
      }
      if (wrong_page_size) {
        s->page_size_mismatch.store(true, std::memory_order_relaxed);
        s->engine_block_size.store(engine_page_size, std::memory_order_relaxed);
      }
      list.push_back(s.get());
      next->by_id[s->id] = s.get();
      next->all.push_back(s);
      kv::SourceSpec spec;
      spec.id = id;
      spec.endpoint = w->url();
      spec.rank = r;
      spec.pub = zmq_endpoint(host, base + r);
      if (replay) spec.replay = zmq_endpoint(host, *replay + r);
      spec.topic = topic;
      specs.push_back(std::move(spec));
    }
  }
  // The series of sources that left (another rule may keep the endpoint, or fewer ranks now).
  if (connected_) {
    for (const auto& s : old->all) {
      if (next->by_id.contains(s->id)) continue;
      std::string rank = std::to_string(s->rank);
      connected_->remove({rule_, s->url, rank});
      blocks_->remove({rule_, s->url, rank, "gpu"});
      blocks_->remove({rule_, s->url, rank, "other"});
      excluded_->remove({rule_, s->url, rank, "page_size"});
      parity_->remove({rule_, s->url, rank});
      // A request thread may still count into the ground-truth cells of a source it found in
      // the snapshot just before this one: those go after a grace period (on_period).
      retired_series_.push_back({s->url, s->rank, std::chrono::steady_clock::now() + kSeriesGrace});
    }
  }
  ids_ = std::move(ids);
  built_from_ = std::move(built_from);
  sources_.store(next);
  // The shared figures, told again now that the snapshot is the one load reports update (each
  // is told only when it changes: a new source would miss those that did not). Sync tells them
  // under its load lock, in order with the reports it applies. (Not started yet: start() does.)
  if (replica_ && rank_token_ != 0) replica_->retell(rank_token_);
  subscriber_.set_sources(std::move(specs));  // removed or changed sources are reset
}

void KvExactPolicy::on_batch(kv::SourceId source, uint64_t seq, const kv::EventBatch& batch) {
  kv::ApplyStats st = inventory_.apply(source, batch);
  if (replica_) {
    if (Source* s = sources_.load()->by_source(source)) {
      s->applied_seq.store(seq, std::memory_order_release);
      s->applied_valid.store(true, std::memory_order_release);
    }
  }
  std::pair<uint64_t, uint64_t> hashes{0, 0};
  if (hasher_) hashes = check_hashes(source, batch);
  if (orphans_ && st.orphans) orphans_->inc(st.orphans);
  if (page_size_mismatches_ && st.page_size_mismatches) {
    page_size_mismatches_->inc(st.page_size_mismatches);
  }
  // The source as the current snapshot has it (once per batch; none: it left meanwhile).
  auto sources = sources_.load();
  Source* s = sources->by_source(source);
  if (!s) return;
  if (batch.map_shaped) s->map_batches.fetch_add(1, std::memory_order_relaxed);
  if (hashes.first) s->hash_checked.fetch_add(hashes.first, std::memory_order_relaxed);
  if (hashes.second) s->hash_mismatched.fetch_add(hashes.second, std::memory_order_relaxed);
  if (!s->lora_names.load(std::memory_order_relaxed)) {
    for (const auto& e : batch.events) {
      const auto* stored = std::get_if<kv::BlockStored>(&e);
      if (stored && stored->lora_name) {
        s->lora_names.store(true, std::memory_order_relaxed);
        lora_names_seen_.store(true, std::memory_order_relaxed);
      }
    }
  }
  if (s->capturing.load(std::memory_order_relaxed)) capture_probe_stores(*s, batch);
  if (st.page_size_mismatches && !s->page_size_mismatch.exchange(true)) {
    int64_t theirs = 0;
    for (const auto& e : batch.events) {
      const auto* stored = std::get_if<kv::BlockStored>(&e);
      if (stored && stored->block_size != page_size_) {
        theirs = stored->block_size;
        break;
      }
    }
    s->engine_block_size.store(theirs, std::memory_order_relaxed);
    s->ready.store(false, std::memory_order_relaxed);
    log::warn(
        "kv_exact: an engine publishes pages of another size than the rule's kvBlockSize; "
        "this rank is left out of kv_exact routing until it matches (set kvBlockSize to "
        "the engine's --page-size)")
        .kv("rule", rule_)
        .kv("endpoint", s->url)
        .kv("rank", s->rank)
        .kv("engine_block_size", theirs)
        .kv("kvBlockSize", page_size_);
  }
  if (!events_) return;
  std::string rank = std::to_string(s->rank);
  if (st.stored) events_->with({rule_, s->url, rank, "stored"}).inc(st.stored);
  if (st.removed) events_->with({rule_, s->url, rank, "removed"}).inc(st.removed);
  if (st.cleared) events_->with({rule_, s->url, rank, "cleared"}).inc(st.cleared);
}

// A parity probe runs on this rank: keep its stores (bounded) to compare: those whose tokens hold
// its nonce (decoded only while it runs, only for stores that continue no captured one) and those
// continuing them; other traffic's are not kept. Stores skipped for their page size count too:
// parity is about the tokens.
void KvExactPolicy::capture_probe_stores(Source& s, const kv::EventBatch& batch) {
  constexpr size_t kMaxEvents = 512, kMaxTokens = size_t{1} << 18;
  std::lock_guard lock(s.probe_mu);
  for (const auto& e : batch.events) {
    const auto* stored = std::get_if<kv::BlockStored>(&e);
    if (!stored || s.captured.size() >= kMaxEvents ||
        s.captured_tokens + stored->token_ids.size() > kMaxTokens) {
      continue;
    }
    bool ours = stored->parent_block_hash && s.capture_blocks.contains(*stored->parent_block_hash);
    if (!ours && s.capture_tok && !s.capture_nonce.empty()) {
      ours = s.capture_tok->decode(stored->token_ids).find(s.capture_nonce) != std::string::npos;
    }
    if (!ours) continue;
    s.capture_blocks.insert(stored->block_hashes.begin(), stored->block_hashes.end());
    s.captured_tokens += stored->token_ids.size();
    s.captured.push_back(kv_parity::Stored{.root = !stored->parent_block_hash,
                                           .parent = stored->parent_block_hash,
                                           .hashes = stored->block_hashes,
                                           .tokens = stored->token_ids});
  }
}

// Hash parity: for a stored chain that starts in the event (no parent, no LoRA), the engine's ids
// follow from its tokens; any difference means kvgate and the engine do not agree on the hash,
// the page size or the engine build, and says so at once.
std::pair<uint64_t, uint64_t> KvExactPolicy::check_hashes(kv::SourceId source,
                                                          const kv::EventBatch& batch) {
  uint64_t checked = 0, mismatched = 0;
  std::vector<uint64_t> ids;
  for (const auto& e : batch.events) {
    const auto* s = std::get_if<kv::BlockStored>(&e);
    if (!s || s->parent_block_hash || s->lora_id || s->block_hashes.empty() ||
        (s->lora_name && hasher_->scheme() != kv::HashScheme::kSglang) ||
        s->block_size != page_size_ ||
        s->token_ids.size() != s->block_hashes.size() * static_cast<size_t>(page_size_)) {
      continue;
    }
    std::optional<kv::Digest> seed;
    if (s->cache_salt) {
      if (hasher_->scheme() != kv::HashScheme::kSglang) continue;
      seed = kv::sglang_salt_seed(*s->cache_salt);
    }
    ids.assign(s->block_hashes.size(), 0);
    hasher_->chain_ids(s->token_ids, static_cast<size_t>(page_size_), ids, seed ? &*seed : nullptr);
    if (s->lora_name) {
      // SGLang mixes every published id of an adapter's chain with the adapter's seed.
      kv::Digest lora = kv::sglang_lora_seed(*s->lora_name);
      for (uint64_t& id : ids) id = kv::sglang_lora_block_id(lora, id);
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      ++checked;
      if (ids[i] != s->block_hashes[i]) ++mismatched;
    }
  }
  if (hash_checked_ && checked) hash_checked_->inc(checked);
  if (!mismatched) return {checked, 0};
  if (hash_mismatches_) hash_mismatches_->inc(mismatched);
  if (!hash_warned_.exchange(true)) {
    std::string url;
    for (const auto& s : sources_.load()->all) {
      if (s->id == source) url = s->url;
    }
    log::warn(
        "kv_exact: the engine's block ids are not the ones its tokens hash to with "
        "kvHashAlgo; kvgate keys pages itself, so routing still works, but the engine may "
        "run another build, hash or page size than the rule says: check kvEngineType, "
        "kvHashAlgo and kvBlockSize")
        .kv("rule", rule_)
        .kv("endpoint", url)
        .kv("kvHashAlgo",
            hasher_->scheme() == kv::HashScheme::kSglang ? "sha256_sglang" : "sha256_cbor");
  }
  return {checked, mismatched};
}

void KvExactPolicy::on_reset(kv::SourceId source, kv::ResetReason why) {
  if (Source* s = sources_.load()->by_source(source)) {
    s->applied_valid.store(false, std::memory_order_release);
  }
  if (why == kv::ResetReason::kRemoved) {
    inventory_.remove_source(source);
  } else {
    inventory_.clear(source);
  }
  if (why == kv::ResetReason::kRestart) {
    // A restarted engine may run with the right page size now: it is judged by its new events.
    auto sources = sources_.load();
    for (const auto& s : sources->all) {
      if (s->id != source) continue;
      s->page_size_mismatch.store(false, std::memory_order_relaxed);
      std::lock_guard lock(s->probe_mu);
      s->probe_wanted = true;  // it may run another build now
    }
  }
  if (resets_) resets_->with({rule_, kv::to_string(why)}).inc();
}

void KvExactPolicy::on_period() {
  // The fallback's own upkeep at its own period (to the second).
  auto fallback_period = fallback_->period();
  if (fallback_period.count() > 0) {
    auto t = std::chrono::steady_clock::now();
    if (t >= next_fallback_period_) {
      next_fallback_period_ = t + fallback_period;
      fallback_->on_period();
    }
  }
  {
    // Discovery: a worker's /server_info told (or changed) where its ranks publish.
    std::lock_guard lock(change_mu_);
    bool changed = false;
    for (const auto& w : workers_) {
      auto it = built_from_.find(w->id());
      if (it == built_from_.end() || it->second != w->kv_events()) changed = true;
    }
    if (changed) rebuild_sources();
    // Ground-truth series of sources gone for the grace period (unless they came back).
    auto t = std::chrono::steady_clock::now();
    auto current = sources_.load();
    std::erase_if(retired_series_, [&](const RetiredSeries& r) {
      if (r.due > t) return false;
      bool back = std::any_of(current->all.begin(), current->all.end(),
                              [&](const auto& s) { return s->url == r.url && s->rank == r.rank; });
      if (!back && predicted_tokens_) {
        std::string rank = std::to_string(r.rank);
        predicted_tokens_->remove({rule_, r.url, rank});
        cached_tokens_->remove({rule_, r.url, rank});
        for (kv::Bootstrap b :
             {kv::Bootstrap::kPending, kv::Bootstrap::kLive, kv::Bootstrap::kEngineReplay,
              kv::Bootstrap::kPeer, kv::Bootstrap::kCold}) {
          bootstrap_->remove({rule_, r.url, rank, std::string(kv::to_string(b))});
        }
      }
      return true;
    });
  }
  if (predict_ttl_.count() > 0) {
    const int64_t now = replica::Sync::now_us();
    std::lock_guard lock(predict_mu_);
    std::erase_if(predicted_, [&](const auto& e) { return e.second.expires_us < now; });
  }
  auto sources = sources_.load();
  std::unordered_map<kv::SourceId, kv::SourceStatus> status;
  for (auto& [spec, st] : subscriber_.status()) status[spec.id] = st;
  auto now = std::chrono::system_clock::now();
  for (const auto& s : sources->all) {
    auto it = status.find(s->id);
    bool connected = it != status.end() && it->second.connected;
    const kv::Bootstrap how = it != status.end() ? it->second.bootstrap : kv::Bootstrap::kPending;
    size_t gpu = inventory_.blocks(s->id, true), other = inventory_.blocks(s->id, false);
    bool excluded = s->page_size_mismatch.load(std::memory_order_relaxed);
    // Trusted: connected (a disconnected rank's inventory may be stale: its engine may have
    // restarted), not excluded, and either knowing all the engine stored (followed from
    // sequence 0, or bootstrapped from the engine's replay or a peer) or warm: kvWarmupSec since
    // it began mid-stream (cold), or connected that long with no event at all (an idle engine).
    bool warm = false;
    if (connected && how == kv::Bootstrap::kCold) {
      warm = now - std::max(it->second.connected_since, it->second.bootstrap_at) >= warmup_;
    } else if (connected && how == kv::Bootstrap::kPending) {
      warm = now - it->second.connected_since >= warmup_;
    }
    const bool ready = !excluded && connected && (kv::complete(how) || warm);
    s->bootstrap.store(static_cast<uint8_t>(how), std::memory_order_relaxed);
    if (bootstrap_) {
      std::string rank = std::to_string(s->rank);
      for (kv::Bootstrap b :
           {kv::Bootstrap::kPending, kv::Bootstrap::kLive, kv::Bootstrap::kEngineReplay,
            kv::Bootstrap::kPeer, kv::Bootstrap::kCold}) {
        bootstrap_->with({rule_, s->url, rank, std::string(kv::to_string(b))})
            .set(b == how ? 1 : 0);
      }
    }
    if (ready) any_ready_.store(true, std::memory_order_relaxed);  // before the source says so
    s->ready.store(ready, std::memory_order_relaxed);
    if (connected_) {
      std::string rank = std::to_string(s->rank);
      excluded_->with({rule_, s->url, rank, "page_size"}).set(excluded ? 1 : 0);
      connected_->with({rule_, s->url, rank}).set(connected ? 1 : 0);
      blocks_->with({rule_, s->url, rank, "gpu"}).set(static_cast<double>(gpu));
      blocks_->with({rule_, s->url, rank, "other"}).set(static_cast<double>(other));
    }
  }
  launch_probes(status);
}

std::optional<uint64_t> KvExactPolicy::seed(kv::SourceId id) {
  if (!replica_) return std::nullopt;
  auto sources = sources_.load();
  Source* s = sources->by_source(id);
  if (!s) return std::nullopt;
  // (On the subscriber's thread, the inventory's one writer: the import is a write like a batch.)
  auto snap = replica_->request_inventory(
      replica::InventoryRequest{.rule = rule_, .worker = s->key, .rank = s->rank},
      std::chrono::milliseconds(500));
  if (!snap) return std::nullopt;
  inventory_.import_source(id, snap->data);
  s->applied_seq.store(snap->seq, std::memory_order_release);
  s->applied_valid.store(true, std::memory_order_release);
  log::info("kv_exact: rank bootstrapped from a peer's inventory")
      .kv("rule", rule_)
      .kv("endpoint", s->url)
      .kv("rank", s->rank)
      .kv("seq", snap->seq)
      .kv("blocks", snap->data.holdings.size());
  return snap->seq;
}

std::optional<replica::Sync::Snapshot> KvExactPolicy::snapshot_for_peer(
    const replica::InventoryRequest& req) const {
  auto sources = sources_.load();
  Source* s = sources->by_key(req.worker, req.rank);
  if (!s) return std::nullopt;
  // Only a complete view is given away: one that began mid-stream would pass its gap on.
  bool complete = false;
  for (const auto& [spec, st] : subscriber_.status()) {
    if (spec.id == s->id) complete = st.connected && kv::complete(st.bootstrap);
  }
  if (!complete || !s->applied_valid.load(std::memory_order_acquire)) return std::nullopt;
  // The sequence first: everything up to it is in the export (a later batch too, maybe, which
  // the peer applies again: stores and removals are idempotent).
  replica::Sync::Snapshot snap;
  snap.seq = s->applied_seq.load(std::memory_order_acquire);
  snap.data = inventory_.export_source(s->id);
  if (!s->applied_valid.load(std::memory_order_acquire)) return std::nullopt;  // reset meanwhile
  return snap;
}

std::string KvExactPolicy::readiness_details() const {
  auto sources = sources_.load();
  size_t ready = 0, cold = 0, pending = 0;
  std::string untrusted;
  for (const auto& s : sources->all) {
    const bool r = s->ready.load(std::memory_order_relaxed);
    const auto how = static_cast<kv::Bootstrap>(s->bootstrap.load(std::memory_order_relaxed));
    ready += r;
    cold += how == kv::Bootstrap::kCold;
    pending += how == kv::Bootstrap::kPending;
    if (!r && untrusted.size() < 4096) {
      untrusted += std::string(untrusted.empty() ? "" : ",") +
                   "{\"endpoint\":" + json::quote(s->url) + ",\"rank\":" + std::to_string(s->rank) +
                   ",\"bootstrap\":" + json::quote(kv::to_string(how)) + "}";
    }
  }
  return "{\"ranks\":" + std::to_string(sources->all.size()) +
         ",\"trusted\":" + std::to_string(ready) + ",\"cold\":" + std::to_string(cold) +
         ",\"pending\":" + std::to_string(pending) + ",\"untrusted\":[" + untrusted + "]}";
}

void KvExactPolicy::start() {
  {
    std::lock_guard lock(change_mu_);
    if (starts_++ == 0) {
      subscriber_.start();
      if (replica_) {
        // The fleet's load per rank: this replica's own in each report, the peers' summed here.
        rank_token_ = replica_->add_rank_load(
            [this](std::vector<replica::LoadEntry>& out) {
              auto sources = sources_.load();
              for (const auto& s : sources->all) {
                out.push_back({.worker = s->key,
                               .rank = s->rank,
                               .inflight = s->active.load(std::memory_order_relaxed),
                               .prefill_tokens = std::max<int64_t>(
                                   0, s->pending_prefill.load(std::memory_order_relaxed))});
              }
            },
            [this](uint64_t key, int32_t rank, replica::Sync::RankLoad peers, int64_t from_us) {
              auto sources = sources_.load();
              if (Source* s = sources->by_key(key, rank)) {
                s->peers.set({peers.active, peers.prefill_tokens}, from_us);
              }
            },
            [this](uint64_t key, int32_t rank, replica::Sync::RankLoad own, int64_t from_us) {
              auto sources = sources_.load();
              if (Source* s = sources->by_key(key, rank)) {
                s->reported.set({own.active, own.prefill_tokens}, from_us);
              }
            });
        replica_->retell(rank_token_);  // what the fleet's figures are now
        responder_token_ = replica_->add_responder(
            rule_, [this](const replica::InventoryRequest& req) { return snapshot_for_peer(req); });
        chain_token_ =
            replica_->add_sink(rule_, [this](const replica::ChainRecord& r) { apply_peer(r); });
      }
    }
  }
  fallback_->start();  // (counted by the fallback itself)
}

void KvExactPolicy::stop() {
  fallback_->stop();
  std::lock_guard lock(change_mu_);
  if (starts_ > 0 && --starts_ == 0) {
    subscriber_.stop();
    if (replica_) {
      replica_->remove_rank_load(rank_token_);
      replica_->remove_sink(chain_token_);
      replica_->remove_responder(responder_token_);
      rank_token_ = chain_token_ = responder_token_ = 0;
    }
  }
}

int64_t KvExactPolicy::next_origin() {
  // Unique per dispatch of this replica (it names the dispatch's prediction, which its
  // retraction withdraws): the clock's microsecond, or one past the last one given.
  const int64_t now = replica::Sync::now_us();
  int64_t last = last_origin_.load(std::memory_order_relaxed);
  int64_t next = 0;
  do {
    next = std::max(now, last + 1);
  } while (!last_origin_.compare_exchange_weak(last, next, std::memory_order_relaxed));
  return next;
}

void KvExactPolicy::apply_peer(const replica::ChainRecord& r) {
  if (!r.predict || predict_ttl_.count() <= 0) return;
  auto sources = sources_.load();
  if (Source* s = sources->by_key(r.worker, r.rank)) {
    predict(std::span<const kv::BlockKey>(r.hashes.data(),
                                          std::min(r.hashes.size(), kMaxPredictedPerRequest)),
            *s, r.origin_us, r.retract);
  }
}

void KvExactPolicy::predict(std::span<const kv::BlockKey> keys, const Source& s, int64_t origin_us,
                            bool retract) {
  const int64_t now = replica::Sync::now_us();
  const int64_t expires =
      origin_us + std::chrono::duration_cast<std::chrono::microseconds>(predict_ttl_).count();
  if (expires < now) return;  // heard too late to matter
  std::lock_guard lock(predict_mu_);
  for (kv::BlockKey k : keys) {
    auto it = predicted_.find(k);
    const bool live = it != predicted_.end() && it->second.expires_us >= now;
    if (retract) {
      // Only the dispatches relying on this source's prediction withdraw their share.
      if (live && it->second.source == s.id && it->second.release(origin_us)) predicted_.erase(it);
      continue;
    }
    if (live) {
      // The earliest dispatch wins a page, whichever replica heard which first; later ones to the
      // same source rely on it (and do not renew it: the engine's events are the truth after).
      if (it->second.source == s.id) {
        it->second.hold(origin_us);
        it->second.origin_us = std::min(it->second.origin_us, origin_us);
      } else if (origin_us < it->second.origin_us) {
        it->second = make_prediction(s.id, origin_us, expires);
      }
      continue;
    }
    if (it != predicted_.end()) {
      it->second = make_prediction(s.id, origin_us, expires);
    } else if (predicted_.size() < kMaxPredicted) {
      // At the bound, nothing new is predicted until the periodic sweep drops expired entries
      // (no scan on a request thread).
      predicted_.emplace(k, make_prediction(s.id, origin_us, expires));
    }
  }
}

// ------------------------------------------------------------------ tokenizer parity probes

namespace {

constexpr int kMaxProbesAtOnce = 2;
constexpr auto kProbeTimeout = std::chrono::seconds(30);
constexpr auto kProbePoll = std::chrono::milliseconds(100);
constexpr int kProbePolls = 50;  // events get 5 s after the answer
log::RateLimit kLogParity(8, std::chrono::seconds(60));

// Sends the probe and hands the answer to `done` (on the control loop).
awaitable<void> send_probe(Executor ex, http::Target target, std::string body,
                           std::function<void(const http::FetchResult&)> done) {
  const http::Header headers[] = {{"content-type", "application/json"}};
  http::FetchResult r;
  try {
    r = co_await http::fetch(ex, target, "POST", "/v1/chat/completions",
                             std::chrono::duration_cast<std::chrono::milliseconds>(kProbeTimeout),
                             body, headers);
  } catch (const std::exception& e) {
    // Whatever failed, the probe ends (and its rank may be probed again): never stuck pending.
    r = http::FetchResult{};
    r.error = http::CallError::kConnect;
    r.detail = e.what();
  } catch (...) {
    r = http::FetchResult{};
    r.error = http::CallError::kConnect;
    r.detail = "unknown error";
  }
  done(r);
}

}  // namespace

struct KvExactPolicy::ProbePoll {
  std::shared_ptr<Life> life;
  KvExactPolicy* self;
  std::shared_ptr<Source> source;
  std::shared_ptr<const kv_parity::Probe> probe;
  std::shared_ptr<Timer> timer;
  int left = kProbePolls;

  void operator()(const boost::system::error_code& ec) {
    std::lock_guard lock(life->mu);
    if (!life->alive) return;
    try {
      size_t matched = self->probe_matched_pages(*source, *probe);
      size_t full = probe->ids.size() / static_cast<size_t>(self->page_size_);
      if (ec || matched >= full || --left <= 0) {
        self->finish_probe(*source, *probe, matched, "");
        return;
      }
      timer->expires_after(kProbePoll);
      timer->async_wait(std::move(*this));
    } catch (...) {
      // Never out of the control loop's handler: the probe ends instead.
      self->finish_probe(*source, *probe, 0, "the probe failed inside kvgate");
    }
  }
};

void KvExactPolicy::attach(const PolicyRuntime& runtime) {
  std::lock_guard lock(change_mu_);
  runtime_ = runtime;
  probes_possible_.store(parity_probe_ && runtime.control && runtime.tokenizer &&
                         runtime.chat_template);
}

void KvExactPolicy::request_parity_probes() const {
  auto sources = sources_.load();
  for (const auto& s : sources->all) {
    std::lock_guard lock(s->probe_mu);
    s->probe_wanted = true;
  }
}

KvExactPolicy::Parity KvExactPolicy::parity(kv::SourceId id) const {
  auto sources = sources_.load();
  if (!probes_possible_.load()) {
    return Parity{"off", parity_probe_ ? "the rule has no tokenizerPath with a chat template"
                                       : "kvParityProbe is false"};
  }
  if (const Source* s = sources->by_source(id)) {
    std::lock_guard lock(s->probe_mu);
    return Parity{s->parity_state, s->parity_detail, s->probes_done};
  }
  return Parity{"untested", ""};
}

KvExactPolicy::SourceCounts KvExactPolicy::counts(kv::SourceId id) const {
  auto sources = sources_.load();
  SourceCounts c;
  if (const Source* s = sources->by_source(id)) {
    c.hits = s->hits.load(std::memory_order_relaxed);
    c.predicted_tokens = s->predicted_sum.load(std::memory_order_relaxed);
    c.cached_tokens = s->cached_sum.load(std::memory_order_relaxed);
    c.page_size_mismatch = s->page_size_mismatch.load(std::memory_order_relaxed);
    c.engine_block_size = s->engine_block_size.load(std::memory_order_relaxed);
    c.map_batches = s->map_batches.load(std::memory_order_relaxed);
    c.hash_checked = s->hash_checked.load(std::memory_order_relaxed);
    c.hash_mismatched = s->hash_mismatched.load(std::memory_order_relaxed);
    c.active = s->active.load(std::memory_order_relaxed);
    c.pending_prefill = s->pending_prefill.load(std::memory_order_relaxed);
    const auto peers = s->peers.at(0);
    c.peer_active = peers[0];
    c.peer_pending = peers[1];
  }
  return c;
}

std::vector<std::pair<kv::SourceId, size_t>> KvExactPolicy::held_pages(
    std::span<const int32_t> ids) const {
  std::vector<kv::BlockKey> keys;
  kv::chain_keys(ids, static_cast<size_t>(page_size_), 0, keys);
  std::vector<kv::SourceMatch> matches;
  inventory_.match(keys, matches);
  std::vector<std::pair<kv::SourceId, size_t>> out;
  out.reserve(matches.size());
  for (const auto& m : matches) out.emplace_back(m.source, m.gpu_pages);
  return out;
}

size_t KvExactPolicy::probe_matched_pages(const Source& s, const kv_parity::Probe& probe) const {
  std::vector<kv::BlockKey> keys;
  kv::chain_keys(probe.ids, static_cast<size_t>(page_size_), 0, keys);
  std::vector<kv::SourceMatch> matches;
  inventory_.match(keys, matches);
  for (const auto& m : matches) {
    if (m.source == s.id) return m.gpu_pages;
  }
  return 0;
}

void KvExactPolicy::launch_probes(
    const std::unordered_map<kv::SourceId, kv::SourceStatus>& status) {
  PolicyRuntime rt;
  {
    std::lock_guard lock(change_mu_);
    if (starts_ == 0) return;
    rt = runtime_;
  }
  if (!parity_probe_ || !rt.control || !rt.tokenizer || !rt.chat_template) return;
  auto sources = sources_.load();
  for (const auto& sp : sources->all) {
    if (probes_running_ >= kMaxProbesAtOnce) break;
    Source& s = *sp;
    auto it = status.find(s.id);
    if (it == status.end() || !it->second.connected) continue;
    // A rank left out for its page size cannot match any page: that check names it already.
    if (s.page_size_mismatch.load(std::memory_order_relaxed)) {
      std::lock_guard lock(s.probe_mu);
      if (!s.probe_running) {
        s.parity_state = "skipped";
        s.parity_detail = "left out of kv_exact for its page size (kvBlockSize)";
        if (s.probe_wanted) {
          s.probe_wanted = false;
          ++s.probes_done;  // the probe asked for is answered: skipped
        }
      }
      continue;
    }
    {
      std::lock_guard lock(s.probe_mu);
      if (!s.probe_wanted || s.probe_running) continue;
      s.probe_wanted = false;
      s.probe_running = true;
      s.parity_state = "pending";
      s.parity_detail.clear();
      s.captured.clear();
      s.captured_tokens = 0;
    }
    auto probe = std::make_shared<kv_parity::Probe>();
    std::string err;
    auto ranks = sources->by_worker.find(s.worker->id());
    int rank = ranks != sources->by_worker.end() && ranks->second.size() > 1 ? s.rank : -1;
    uint64_t nonce =
        mix(++probe_nonce_ ^ s.tiebreak ^
            static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count()));
    ++probes_running_;
    // Prefill/decode: the rank goes in the bootstrap_room (a pin would conflict with it), and
    // the probe goes to a decode server too (a prefill server sends its KV to one).
    if (!kv_parity::make_probe(*rt.tokenizer, *rt.chat_template, static_cast<size_t>(page_size_),
                               nonce, rt.pd_pair ? -1 : rank, *probe, err, rt.dp_rank_field)) {
      finish_probe(s, *probe, 0, err);
      continue;
    }
    http::Target decode;
    if (rt.pd_pair && !rt.pd_pair(*s.worker, s.rank, probe->body, decode)) {
      finish_probe(s, *probe, 0, "no decode server is available to pair the probe with");
      continue;
    }
    {
      std::lock_guard lock(s.probe_mu);
      s.capture_nonce = probe->nonce;
      s.capture_tok = rt.tokenizer;
      s.capture_blocks.clear();
    }
    s.capturing.store(true, std::memory_order_relaxed);
    auto life = life_;
    asio::io_context* control = rt.control;
    auto done = [life, self = this, source = sp, probe, control](const http::FetchResult& r) {
      std::lock_guard lock(life->mu);
      if (!life->alive) return;
      try {
        self->probe_answered(source, probe, r, life, *control);
      } catch (...) {
        self->finish_probe(*source, *probe, 0, "the probe failed inside kvgate");
      }
    };
    asio::co_spawn(
        *control,
        send_probe(control->get_executor(), s.worker->target(), probe->body, std::move(done)),
        asio::detached);
    if (rt.pd_pair) {
      asio::co_spawn(*control,
                     send_probe(control->get_executor(), std::move(decode), probe->body,
                                [](const http::FetchResult&) {}),
                     asio::detached);
    }
  }
}

void KvExactPolicy::probe_answered(const std::shared_ptr<Source>& source,
                                   const std::shared_ptr<const kv_parity::Probe>& probe,
                                   const http::FetchResult& r, const std::shared_ptr<Life>& life,
                                   asio::io_context& control) {
  if (r.error != http::CallError::kNone || r.status < 200 || r.status >= 300) {
    std::string why = r.error != http::CallError::kNone
                          ? std::string(http::to_string(r.error)) + ": " + r.detail
                          : "status " + std::to_string(r.status) + ": " + r.body.substr(0, 200);
    finish_probe(*source, *probe, 0, "the probe request failed (" + why + ")");
    return;
  }
  // The engine ran it; its stores come as events: look for them a few seconds.
  ProbePoll poll{life, this, source, probe, std::make_shared<Timer>(control)};
  poll.timer->expires_after(kProbePoll);
  auto timer = poll.timer;
  timer->async_wait(std::move(poll));
}

void KvExactPolicy::finish_probe(Source& s, const kv_parity::Probe& probe, size_t matched_pages,
                                 const std::string& error) {
  --probes_running_;
  s.capturing.store(false, std::memory_order_relaxed);
  std::vector<kv_parity::Stored> captured;
  {
    std::lock_guard lock(s.probe_mu);
    captured.swap(s.captured);
    s.captured_tokens = 0;
  }
  std::string state, detail;
  double gauge = -1;
  if (!error.empty()) {
    state = "error";
    detail = error;
  } else {
    PolicyRuntime rt;
    {
      std::lock_guard lock(change_mu_);
      rt = runtime_;
    }
    kv_parity::Verdict v = kv_parity::judge(probe, static_cast<size_t>(page_size_), matched_pages,
                                            captured, *rt.tokenizer);
    detail = v.detail;
    switch (v.kind) {
      case kv_parity::Verdict::kMatch:
        state = "match";
        gauge = 1;
        break;
      case kv_parity::Verdict::kMismatch:
        state = "mismatch";
        gauge = 0;
        if (parity_mismatches_) parity_mismatches_->inc();
        break;
      case kv_parity::Verdict::kNotFound:
        state = "not_found";
        break;
    }
  }
  if (state == "match") {
    log::info("kv_exact: tokenizer parity holds")
        .kv("rule", rule_)
        .kv("endpoint", s.url)
        .kv("rank", s.rank);
  } else {
    log::warn(kLogParity,
              state == "mismatch"
                  ? "kv_exact: the engine tokenizes differently from kvgate; its cached pages "
                    "will not match the requests' (set tokenizerPath to the served model)"
                  : "kv_exact: the tokenizer parity probe found no answer")
        .kv("rule", rule_)
        .kv("endpoint", s.url)
        .kv("rank", s.rank)
        .kv("detail", detail);
  }
  // (A source that left meanwhile keeps no series.)
  auto current = sources_.load();
  if (parity_ && current->by_source(s.id) == &s) {
    parity_->with({rule_, s.url, std::to_string(s.rank)}).set(gauge);
  }
  std::lock_guard lock(s.probe_mu);
  s.probe_running = false;
  s.parity_state = std::move(state);
  s.parity_detail = std::move(detail);
  ++s.probes_done;
}

}  // namespace kvgate
