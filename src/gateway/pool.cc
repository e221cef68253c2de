// gateway/pool: see pool.h.
#include "gateway/pool.h"

#include "gateway/knobs.h"
#include "http/io.h"
#include "pd/pd.h"
#include "policy/registry.h"
#include "replica/sync.h"
#include "request/body_rewrite.h"
#include "util/json.h"
#include "util/log.h"
#include "util/random.h"

namespace kvgate {

std::string_view role_label(rules::Role role) {
  switch (role) {
    case rules::Role::kPrefill:
      return "prefill";
    case rules::Role::kDecode:
      return "decode";
    case rules::Role::kNone:
      break;
  }
  return "regular";  // sgl-model-gateway's worker_type for a server without a role
}

void attach_worker_metrics(Worker& w, GatewayMetrics& m, rules::Role role) {
  WorkerMetrics wm;
  wm.inflight = &m.worker_active.with({w.url()});
  wm.health = &m.worker_health.with({w.url()});
  wm.cb_state = &m.worker_cb_state.with({w.url()});
  wm.reported_load = &m.worker_load.with({w.url()});
  wm.requests = &m.worker_requests.with({w.url()});
  wm.failures = &m.worker_failures.with({w.url()});
  wm.load_poll_failures = &m.worker_load_poll_failures.with({w.url()});
  w.attach_metrics(wm);
  set_worker_role(w, m, role);
}

void set_worker_role(Worker& w, GatewayMetrics& m, rules::Role role) {
  const std::string_view r = role_label(role);
  if (w.role() == r) return;
  if (!w.role().empty()) m.worker_role.remove({w.url(), w.role()});
  w.set_role(r);
  m.worker_role.with({w.url(), r}).set(1);
}

void remove_worker_metrics(std::string_view url, metrics::Registry& registry) {
  registry.remove_series("worker", url);
  registry.remove_series("endpoint", url);  // kv_exact's per (endpoint, rank) series
  // The inner policy's series of --dp-aware's rank targets ("url@rank").
  for (int64_t r = 0; r < Worker::kMaxDpRanks; ++r) {
    registry.remove_series("worker", std::string(url) + "@" + std::to_string(r));
  }
}

struct Pool::Upkeep {
  explicit Upkeep(asio::io_context& ctx) : timer(ctx) {}
  Timer timer;
  std::atomic<bool> stopped{false};
};

Pool::Pool(const rules::Rule& rule, const PoolEnv& env) : rule_(rule), env_(env) {}

Pool::~Pool() {
  stop();
}

std::shared_ptr<Pool> Pool::build(const rules::Rule& rule, const PoolEnv& env,
                                  const WorkerLookup& existing, std::string& error,
                                  std::shared_ptr<Policy> policy, bool policy_in_use,
                                  std::shared_ptr<Policy> decode_policy,
                                  const rules::Rule* configured) {
  // Workers this build made (no pool had their URL): their series go if the build fails.
  std::vector<std::string> fresh;
  auto fail = [&](const std::string& what) {
    error = what;
    for (const auto& url : fresh) remove_worker_metrics(url, *env.registry);
    return nullptr;
  };
  if (env.config) {
    if (std::string e = rules::listener_mismatch(rule, env.config->port); !e.empty())
      return fail(e);
  }
  std::shared_ptr<Pool> pool(new Pool(rule, env));
  if (configured) pool->configured_ = *configured;

  // Policies, and what they need read from bodies. A prefill/decode pool has one per side: the
  // prefill side's is kv_exact with kvExactMode 1 (its misses go to the prefill policy).
  const bool pd = rule.pd();
  auto build_policy = [&](const std::string& name, const std::string& label, bool kv_exact,
                          std::string& err) {
    PolicyConfig pc = policy_config(rule.policy_knobs, name);
    pc.registry = env.policy_metrics ? env.registry : nullptr;
    pc.rule = label;
    pc.replica = env.replica;
    pc.dp_default_ranks = rule.kv_dp_rank_count;
    if (kv_exact) {
      pc.kv.enabled = true;
      pc.kv.page_size = rule.kv_block_size;
      pc.kv.dp_ranks = rule.kv_dp_rank_count;
      pc.kv.zmq_port = rule.kv_zmq_port;
      pc.kv.warmup = std::chrono::seconds(rule.kv_warmup_sec);
      pc.kv.hash_algo = rule.kv_hash_algo;
      for (const auto& ep : rule.endpoints) {
        if (!ep.kv_zmq_port || (pd && ep.role != rules::Role::kPrefill)) continue;
        http::Target t;
        if (http::parse_url(ep.url, t).empty()) pc.kv.endpoint_ports[t.url] = *ep.kv_zmq_port;
      }
    }
    return make_policy(pc, err);
  };
  if (!policy) {
    const std::string& prefill_name = pd && !rule.policy_knobs.prefill_policy.empty()
                                          ? rule.policy_knobs.prefill_policy
                                          : rule.sel;
    const bool kv = rule.kv_exact_mode == 3 || (pd && rule.kv_exact_mode == 1);
    policy = build_policy(prefill_name, rule.name, kv, error);
    if (!policy) return fail((pd ? "prefillPolicy: " : "sel: ") + error);
  }
  pool->policy_ = std::move(policy);
  pool->parse_options_ = pool->policy_->parse_options();
  pool->wants_usage_ = pool->policy_->wants_usage();
  if (pd) {
    const std::string& decode_name =
        rule.policy_knobs.decode_policy.empty() ? rule.sel : rule.policy_knobs.decode_policy;
    pool->decode_policy_ = decode_policy
                               ? std::move(decode_policy)
                               : build_policy(decode_name, rule.name + "/decode", false, error);
    if (!pool->decode_policy_) return fail("decodePolicy: " + error);
    ParseOptions d = pool->decode_policy_->parse_options();
    ParseOptions& o = pool->parse_options_;
    o.want_text = o.want_text || d.want_text;
    if (d.want_tokens) {  // max_tokens 0: every token
      size_t mine = o.want_tokens ? o.max_tokens : d.max_tokens;
      o.max_tokens = mine == 0 || d.max_tokens == 0 ? 0 : std::max(mine, d.max_tokens);
      o.want_tokens = true;
    }
    pool->wants_usage_ = pool->wants_usage_ || pool->decode_policy_->wants_usage();
  }
  pool->parse_options_.model_names_adapter = rule.kv_engine_type == rules::EngineType::kSglang;
  if (!rule.tokenizer_path.empty() && rule.mode == 4) {
    std::string err;
    pool->tokenizer_ = env.tokenizer ? env.tokenizer(rule.tokenizer_path, err) : nullptr;
    if (!pool->tokenizer_) {
      return fail("tokenizerPath " + rule.tokenizer_path + ": " + err +
                  " (point it at a directory holding the model's tokenizer.json)");
    }
    pool->parse_options_.tokenizer = pool->tokenizer_->tokenizer.get();
    pool->parse_options_.chat_template = pool->tokenizer_->chat_template.get();
  }

  // Workers: the same server in another pool (or retired a moment ago) is the same Worker.
  auto set = std::make_shared<WorkerSet>();
  for (const auto& ep : rule.endpoints) {
    http::Target t;
    if (std::string e = http::parse_url(ep.url, t); !e.empty()) return fail("endpoints: " + e);
    WorkerPtr w = existing ? existing(t.url) : nullptr;
    if (!w) {
      if (std::string e = http::resolve(t); !e.empty()) return fail("endpoints: " + e);
      if (t.https) {
        std::shared_ptr<const http::TlsClientContext> tls;
        if (std::string e = env.worker_tls ? env.worker_tls(tls) : "no TLS for https workers";
            !e.empty()) {
          return fail(e);
        }
        t.tls = std::move(tls);
      }
      w = std::make_shared<Worker>(env.next_worker_id->fetch_add(1), std::move(t), env.breaker);
      attach_worker_metrics(*w, *env.metrics, ep.role);
      fresh.push_back(w->url());
    }
    const bool decode_side = pd && ep.role == rules::Role::kDecode;
    const Policy& chooser = decode_side ? *pool->decode_policy_ : *pool->policy_;
    pool->selected_[w->id()] = &env.metrics->selections.with({chooser.name(), w->url()});
    auto& signals = pool->signals_[w->id()];
    if (!signals) {
      signals = std::make_unique<WorkerSignals>();
      signals->url = w->url();
    }
    pool->sides_[w->id()] = Side{
        .role = ep.role,
        .bootstrap_port = ep.bootstrap_port.value_or(
            rule.pd_bootstrap_port != 0 ? rule.pd_bootstrap_port : rules::kDefaultBootstrapPort),
        .worker = w};
    set->workers.push_back(std::move(w));
  }
  if (pd) {
    auto prefill = std::make_shared<WorkerSet>();
    auto decode = std::make_shared<WorkerSet>();
    for (const auto& w : set->workers) {
      (pool->role(*w) == rules::Role::kDecode ? decode : prefill)->workers.push_back(w);
    }
    pool->prefill_set_ = std::move(prefill);
    pool->decode_set_ = std::move(decode);
    pool->available_ = std::make_unique<AvailabilityIndex>(pool->prefill_set_);
    pool->decode_available_ = std::make_unique<AvailabilityIndex>(pool->decode_set_);
  } else {
    pool->available_ = std::make_unique<AvailabilityIndex>(set);
  }
  pool->registry_.publish(std::move(set));
  // A policy still serving the pool this one replaces hears of the new workers only once this
  // pool is in force (PoolManager::apply): a refused change must leave it untouched.
  if (!policy_in_use) pool->notify_workers();
  return pool;
}

void Pool::notify_workers() {
  if (decode_policy_) {
    policy_->on_workers_changed(*prefill_set_);
    decode_policy_->on_workers_changed(*decode_set_);
    return;
  }
  policy_->on_workers_changed(*registry_.snapshot());
}

PolicyRuntime Pool::pd_runtime(PolicyRuntime rt) const {
  // Copies: the policy may outlive this pool (its probes run on the control loop).
  struct Pairing {
    std::shared_ptr<const WorkerSet> decode;
    std::unordered_map<uint64_t, int64_t> bootstrap_ports;
    int64_t default_dp = 1;
    std::atomic<uint64_t> next{0};
  };
  auto pairing = std::make_shared<Pairing>();
  pairing->decode = decode_set_;
  for (const auto& [id, side] : sides_) pairing->bootstrap_ports[id] = side.bootstrap_port;
  pairing->default_dp = rule_.kv_dp_rank_count;
  rt.pd_pair = [pairing](const Worker& prefill, int rank, std::string& body, http::Target& decode) {
    const auto& workers = pairing->decode->workers;
    const Worker* chosen = nullptr;
    for (size_t i = 0; i < workers.size() && !chosen; ++i) {
      const auto& w = workers[pairing->next.fetch_add(1) % workers.size()];
      if (w->healthy()) chosen = w.get();
    }
    if (!chosen) return false;
    auto port = pairing->bootstrap_ports.find(prefill.id());
    const auto fields = pd::bootstrap_fields(
        prefill.target(),
        port == pairing->bootstrap_ports.end() ? rules::kDefaultBootstrapPort : port->second,
        pd::choose_room(thread_rng().next(), rank,
                        prefill.dp_size().value_or(pairing->default_dp)));
    std::string out = add_fields(body, fields);
    if (out.empty()) return false;
    body = std::move(out);
    decode = chosen->target();
    return true;
  };
  return rt;
}

WorkerPtr Pool::worker_ptr(const Worker& w) const {
  auto it = sides_.find(w.id());
  return it == sides_.end() ? nullptr : it->second.worker;
}

rules::Role Pool::role(const Worker& w) const {
  auto it = sides_.find(w.id());
  return it == sides_.end() ? rules::Role::kNone : it->second.role;
}

int64_t Pool::bootstrap_port(const Worker& w) const {
  auto it = sides_.find(w.id());
  return it == sides_.end() ? rules::kDefaultBootstrapPort : it->second.bootstrap_port;
}

Pool::WorkerSignals::~WorkerSignals() {
  for (auto& slot : by_rank) delete slot.load(std::memory_order_acquire);
}

const SignalCells* Pool::signals(const Worker& w, std::optional<int> rank) const {
  auto it = signals_.find(w.id());
  if (it == signals_.end() || !env_.metrics) return nullptr;
  WorkerSignals& ws = *it->second;
  const size_t slot =
      rank && *rank >= 0 && *rank < Worker::kMaxDpRanks ? static_cast<size_t>(*rank) + 1 : 0;
  std::atomic<SignalCells*>& cell = ws.by_rank[slot];
  if (SignalCells* made = cell.load(std::memory_order_acquire)) return made;
  // First use of this (worker, rank) by this pool: the families' locks, once.
  auto fresh = std::make_unique<SignalCells>(env_.metrics->signal_cells(
      rule_.name, ws.url, slot == 0 ? std::string() : std::to_string(slot - 1)));
  SignalCells* expected = nullptr;
  if (cell.compare_exchange_strong(expected, fresh.get(), std::memory_order_acq_rel)) {
    return fresh.release();
  }
  return expected;  // another thread made them first (the same cells)
}

metrics::Histogram* Pool::connect_time(const Worker& w) const {
  auto it = signals_.find(w.id());
  if (it == signals_.end() || !env_.metrics) return nullptr;
  WorkerSignals& ws = *it->second;
  metrics::Histogram* h = ws.connect.load(std::memory_order_acquire);
  if (!h) {
    h = &env_.metrics->upstream_connect.with({rule_.name, ws.url});
    ws.connect.store(h, std::memory_order_release);  // the same cell whoever stores it
  }
  return h;
}

metrics::Histogram& Pool::queue_time() const {
  metrics::Histogram* h = queue_time_.load(std::memory_order_acquire);
  if (!h) {
    h = &env_.metrics->admission_queue.with({rule_.name});
    queue_time_.store(h, std::memory_order_release);  // the same cell whoever stores it
  }
  return *h;
}

metrics::Counter* Pool::selected(const Worker& w) const {
  auto it = selected_.find(w.id());
  return it == selected_.end() ? nullptr : it->second;
}

void Pool::start() {
  if (started_) return;
  started_ = true;
  std::vector<Policy*> policies{policy_.get()};
  if (decode_policy_) policies.push_back(decode_policy_.get());
  HealthConfig hc = env_.health;
  PolicyRuntime rt{
      .control = env_.control,
      .tokenizer = parse_options_.tokenizer,
      .chat_template = parse_options_.chat_template,
      .keep = tokenizer_,
      .dp_rank_field = env_.config ? env_.config->dp_rank_field : std::string("routed_dp_rank")};
  for (Policy* p : policies) {
    // The prefill policy's own requests (kv_exact's parity probes) go as prefill/decode pairs.
    p->attach(p == policy_.get() && decode_policy_ ? pd_runtime(rt) : rt);
    p->start();
    hc.poll_load = hc.poll_load || p->uses_reported_load();
    hc.fetch_kv_events = hc.fetch_kv_events || p->wants_kv_events();
    hc.fetch_dp_size = hc.fetch_dp_size || p->wants_dp_size();
  }
  // Prefill/decode: a prefill server's dp_size maps the chosen rank to a bootstrap_room.
  hc.fetch_dp_size = hc.fetch_dp_size || pd();
  if (env_.replica) {
    for (const auto& w : registry_.snapshot()->workers) env_.replica->track(w);
  }
  health_ = std::make_unique<HealthPlane>(*env_.control, registry_, std::move(hc));
  health_->start();
  for (Policy* p : policies) {
    auto period = p->period();
    if (period.count() <= 0) continue;
    auto upkeep = std::make_shared<Upkeep>(*env_.control);
    // The callbacks hold the upkeep state, not the pool: after stop() one may still run (to see
    // the flag) when the pool is gone.
    struct Loop {
      std::shared_ptr<Upkeep> u;
      Policy* policy;
      std::chrono::milliseconds period;
      void operator()(const boost::system::error_code& ec) const {
        if (ec || u->stopped) return;
        policy->on_period();
        u->timer.expires_after(period);
        u->timer.async_wait(*this);
      }
    };
    upkeep->timer.expires_after(period);
    upkeep->timer.async_wait(Loop{upkeep, p, period});
    upkeep_.push_back(std::move(upkeep));
  }
}

void Pool::stop() {
  if (!started_ || stopped_) return;
  stopped_ = true;
  if (env_.replica) {
    for (const auto& w : registry_.snapshot()->workers) env_.replica->untrack(*w);
  }
  policy_->stop();
  if (decode_policy_) decode_policy_->stop();
  if (health_) health_->stop();
  for (auto& u : upkeep_) {
    u->stopped = true;
    u->timer.cancel();
  }
}

}  // namespace kvgate
