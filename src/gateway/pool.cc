// gateway/pool: see pool.h.
#include "gateway/pool.h"

#include <boost/asio/steady_timer.hpp>

#include "gateway/knobs.h"
#include "policy/registry.h"
#include "util/log.h"

namespace kvgate {

void attach_worker_metrics(Worker& w, GatewayMetrics& m) {
  WorkerMetrics wm;
  wm.inflight = &m.worker_active.with({w.url()});
  wm.health = &m.worker_health.with({w.url()});
  wm.cb_state = &m.worker_cb_state.with({w.url()});
  wm.reported_load = &m.worker_load.with({w.url()});
  wm.requests = &m.worker_requests.with({w.url()});
  wm.failures = &m.worker_failures.with({w.url()});
  wm.load_poll_failures = &m.worker_load_poll_failures.with({w.url()});
  w.attach_metrics(wm);
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
  asio::steady_timer timer;
  std::atomic<bool> stopped{false};
};

Pool::Pool(const rules::Rule& rule, const PoolEnv& env) : rule_(rule), env_(env) {}

Pool::~Pool() {
  stop();
}

std::shared_ptr<Pool> Pool::build(const rules::Rule& rule, const PoolEnv& env,
                                  const WorkerLookup& existing, std::string& error,
                                  std::shared_ptr<Policy> policy, bool policy_in_use) {
  // Workers this build made (no pool had their URL): their series go if the build fails.
  std::vector<std::string> fresh;
  auto fail = [&](const std::string& what) {
    error = what;
    for (const auto& url : fresh) remove_worker_metrics(url, *env.registry);
    return nullptr;
  };
  if (std::string missing = rules::not_built(rule); !missing.empty()) return fail(missing);
  if (env.config) {
    if (std::string e = rules::listener_mismatch(rule, env.config->port); !e.empty())
      return fail(e);
  }
  std::shared_ptr<Pool> pool(new Pool(rule, env));

  // Policy, and what it needs read from bodies.
  if (!policy) {
    PolicyConfig pc = policy_config(rule.policy_knobs, rule.sel);
    pc.registry = env.policy_metrics ? env.registry : nullptr;
    pc.rule = rule.name;
    pc.dp_default_ranks = rule.kv_dp_rank_count;
    if (rule.kv_exact_mode == 3) {
      pc.kv.enabled = true;
      pc.kv.page_size = rule.kv_block_size;
      pc.kv.dp_ranks = rule.kv_dp_rank_count;
      pc.kv.zmq_port = rule.kv_zmq_port;
      pc.kv.warmup = std::chrono::seconds(rule.kv_warmup_sec);
      pc.kv.hash_algo = rule.kv_hash_algo;
      for (const auto& ep : rule.endpoints) {
        if (!ep.kv_zmq_port) continue;
        http::Target t;
        if (http::parse_url(ep.url, t).empty()) pc.kv.endpoint_ports[t.url] = *ep.kv_zmq_port;
      }
    }
    policy = make_policy(pc, error);
    if (!policy) return fail("sel: " + error);
  }
  pool->policy_ = std::move(policy);
  pool->parse_options_ = pool->policy_->parse_options();
  pool->parse_options_.model_names_adapter = rule.kv_engine_type == rules::EngineType::kSglang;
  pool->wants_usage_ = pool->policy_->wants_usage();
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
      attach_worker_metrics(*w, *env.metrics);
      fresh.push_back(w->url());
    }
    pool->selected_[w->id()] = &env.metrics->selections.with({pool->policy_->name(), w->url()});
    set->workers.push_back(std::move(w));
  }
  // A policy still serving the pool this one replaces hears of the new workers only once this
  // pool is in force (PoolManager::apply): a refused change must leave it untouched.
  if (!policy_in_use) pool->policy_->on_workers_changed(*set);
  pool->registry_.publish(std::move(set));
  return pool;
}

void Pool::notify_workers() {
  policy_->on_workers_changed(*registry_.snapshot());
}

metrics::Counter* Pool::selected(const Worker& w) const {
  auto it = selected_.find(w.id());
  return it == selected_.end() ? nullptr : it->second;
}

void Pool::start() {
  if (started_) return;
  started_ = true;
  policy_->attach(PolicyRuntime{
      .control = env_.control,
      .tokenizer = parse_options_.tokenizer,
      .chat_template = parse_options_.chat_template,
      .keep = tokenizer_,
      .dp_rank_field = env_.config ? env_.config->dp_rank_field : std::string("routed_dp_rank")});
  policy_->start();
  HealthConfig hc = env_.health;
  hc.poll_load = policy_->uses_reported_load();
  hc.fetch_kv_events = policy_->wants_kv_events();
  hc.fetch_dp_size = policy_->wants_dp_size();
  health_ = std::make_unique<HealthPlane>(*env_.control, registry_, std::move(hc));
  health_->start();
  auto period = policy_->period();
  if (period.count() <= 0) return;
  upkeep_ = std::make_shared<Upkeep>(*env_.control);
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
  upkeep_->timer.expires_after(period);
  upkeep_->timer.async_wait(Loop{upkeep_, policy_.get(), period});
}

void Pool::stop() {
  if (!started_ || stopped_) return;
  stopped_ = true;
  policy_->stop();
  if (health_) health_->stop();
  if (upkeep_) {
    upkeep_->stopped = true;
    upkeep_->timer.cancel();
  }
}

}  // namespace kvgate
