#include "gateway/stats.h"

#include <map>
#include <tuple>

#include "gateway/gateway.h"
#include "policy/kv_exact.h"

#ifndef KVGATE_VERSION
#define KVGATE_VERSION "unknown"
#endif

namespace kvgate {
namespace {

using Json = nlohmann::ordered_json;

double unix_secs(std::chrono::system_clock::time_point t) {
  return std::chrono::duration<double>(t.time_since_epoch()).count();
}

Json or_null(const std::optional<int64_t>& v) {
  return v ? Json(*v) : Json(nullptr);
}

// The usage and time-to-first-token figures of one (rule, worker, rank).
struct Usage {
  uint64_t prompt = 0, cached = 0, predicted = 0;
  uint64_t ttft_count = 0;
  double ttft_sum = 0;
};

// Per (rule, worker): the whole and per rank ("" = no rank named).
using UsageKey = std::pair<std::string, std::string>;
struct WorkerUsage {
  Usage total;
  std::map<std::string, Usage> by_rank;
};

std::map<UsageKey, WorkerUsage> usage_by_worker(const GatewayMetrics& m) {
  std::map<UsageKey, WorkerUsage> out;
  auto add = [&](const std::vector<std::string>& labels, auto&& update) {
    if (labels.size() != 3) return;
    WorkerUsage& w = out[{labels[0], labels[1]}];
    update(w.total);
    update(w.by_rank[labels[2]]);
  };
  m.prompt_tokens.for_each([&](const auto& labels, const metrics::Counter& c) {
    add(labels, [&](Usage& u) { u.prompt += c.value(); });
  });
  m.cached_tokens.for_each([&](const auto& labels, const metrics::Counter& c) {
    add(labels, [&](Usage& u) { u.cached += c.value(); });
  });
  m.predicted_tokens.for_each([&](const auto& labels, const metrics::Counter& c) {
    add(labels, [&](Usage& u) { u.predicted += c.value(); });
  });
  m.time_to_first_token.for_each([&](const auto& labels, const metrics::Histogram& h) {
    add(labels, [&](Usage& u) {
      u.ttft_count += h.count();
      u.ttft_sum += h.sum();
    });
  });
  return out;
}

std::map<std::string, uint64_t, std::less<>> by_worker(const metrics::CounterFamily& f) {
  std::map<std::string, uint64_t, std::less<>> out;
  f.for_each([&](const auto& labels, const metrics::Counter& c) {
    if (labels.size() == 1) out[labels[0]] += c.value();
  });
  return out;
}

Json requests_json(const GatewayMetrics& m, const StatsInput& in) {
  uint64_t total = 0, errors = 0, client_errors = 0;
  m.requests.for_each([&](const auto& labels, const metrics::Counter& c) {
    // labels: route, status, model, streaming. Probes are not traffic: a load balancer's
    // /readiness answered 503 while no worker is healthy is not an error rate.
    if (labels.size() < 2 || is_probe_path(labels[0])) return;
    uint64_t n = c.value();
    total += n;
    int status = std::atoi(labels[1].c_str());
    if (status >= 500) {
      errors += n;
    } else if (status >= 400) {
      client_errors += n;
    }
  });
  return Json{{"total", total},
              {"errors", errors},
              {"client_errors", client_errors},
              {"in_flight", in.in_flight},
              {"queue_depth", in.queue_depth}};
}

Json ttft_json(const GatewayMetrics& m) {
  std::vector<double> bounds;
  std::vector<uint64_t> buckets;
  uint64_t count = 0;
  double sum = 0;
  m.time_to_first_token.for_each([&](const auto&, const metrics::Histogram& h) {
    if (bounds.empty()) {
      bounds = h.bounds();
      buckets.assign(bounds.size() + 1, 0);
    }
    for (size_t i = 0; i < buckets.size(); ++i) buckets[i] += h.bucket(i);
    count += h.count();
    sum += h.sum();
  });
  return Json{{"bounds", bounds}, {"buckets", buckets}, {"count", count}, {"sum", sum}};
}

Json branches_json(const GatewayMetrics& m) {
  std::map<std::pair<std::string, std::string>, uint64_t> counts;  // sorted: a stable order
  m.branches.for_each([&](const auto& labels, const metrics::Counter& c) {
    if (labels.size() == 2) counts[{labels[0], labels[1]}] += c.value();
  });
  Json out = Json::array();
  for (const auto& [key, n] : counts) {
    out.push_back(Json{{"policy", key.first}, {"branch", key.second}, {"count", n}});
  }
  return out;
}

Json usage_json(const Usage& u) {
  return Json{
      {"prompt_tokens", u.prompt}, {"cached_tokens", u.cached}, {"predicted_tokens", u.predicted}};
}

Json rule_json(const Pool& pool, const std::map<UsageKey, WorkerUsage>& usage,
               const std::map<std::string, uint64_t, std::less<>>& attempts,
               const std::map<std::string, uint64_t, std::less<>>& failures) {
  const rules::Rule& rule = pool.rule();
  Json workers = Json::array();
  const auto snapshot = pool.workers();  // (held: the loop reads it)
  for (const auto& w : snapshot->workers) {
    auto count = [&](const auto& map) {
      auto it = map.find(w->url());
      return it == map.end() ? uint64_t{0} : it->second;
    };
    Json j{{"id", std::to_string(w->id())},
           {"url", w->url()},
           {"role", role_label(pool.role(*w))},
           {"healthy", w->healthy()},
           {"breaker", to_string(w->breaker_state())},
           {"in_flight", w->inflight()},
           {"reported_load", w->reported_load()},
           {"requests", count(attempts)},
           {"failures", count(failures)}};
    Usage total;
    Json ranks = Json::array();
    if (auto it = usage.find({rule.name, w->url()}); it != usage.end()) {
      total = it->second.total;
      for (const auto& [rank, u] : it->second.by_rank) {
        if (rank.empty()) continue;
        Json r = usage_json(u);
        r["rank"] = std::atoi(rank.c_str());
        ranks.push_back(std::move(r));
      }
    }
    j.update(usage_json(total));
    j["ttft"] = Json{{"count", total.ttft_count}, {"sum", total.ttft_sum}};
    j["ranks"] = std::move(ranks);
    workers.push_back(std::move(j));
  }
  const auto* kv = dynamic_cast<const KvExactPolicy*>(&pool.policy());
  Json models = Json::array();
  for (const auto& m : rule.models) models.push_back(m);
  return Json{{"name", rule.name},
              {"policy", pool.policy().name()},
              {"decode_policy", pool.pd() ? Json(pool.shared_decode_policy()->name()) : Json()},
              {"mode", rule.mode},
              {"models", std::move(models)},
              {"page_size", kv ? Json(kv->page_size()) : Json()},
              {"workers", std::move(workers)},
              {"kv", kv ? kv_sources_json(*kv) : Json()}};
}

Json decision_json(const DecisionRecord& r) {
  const bool chars = r.request_chars > 0;
  const bool kv = r.by_pages();
  return Json{{"seq", r.seq},
              {"time", unix_secs(r.time)},
              {"rid", r.rid},
              {"rule", r.rule},
              {"route", r.route},
              {"model", r.model.empty() ? Json() : Json(r.model)},
              {"policy", r.policy},
              {"branch", r.branch},
              {"fallback_branch", r.fallback_branch.empty() ? Json() : Json(r.fallback_branch)},
              {"worker", r.worker},
              {"rank", r.rank >= 0 ? Json(r.rank) : Json()},
              {"role", r.role},
              {"attempt", r.attempt},
              {"status", r.status},
              {"duration_ms", r.duration_ms},
              {"matched_pages", kv ? Json(r.pages(r.predicted_tokens)) : Json()},
              {"prompt_pages", kv ? Json(r.pages(r.request_tokens)) : Json()},
              {"matched_chars", chars ? Json(r.predicted_chars) : Json()},
              {"prompt_chars", chars ? Json(r.request_chars) : Json()},
              {"predicted_tokens", predicted_cached_tokens(r)},
              {"prompt_tokens", or_null(r.prompt_tokens)},
              {"cached_tokens", or_null(r.cached_tokens)},
              {"explain", explain(r)}};
}

}  // namespace

Json kv_sources_json(const KvExactPolicy& kv) {
  const kv::Inventory& inv = kv.inventory();
  Json sources = Json::array();
  auto now = std::chrono::system_clock::now();
  for (const auto& [spec, st] : kv.sources()) {
    Json s{{"endpoint", spec.endpoint},
           {"rank", spec.rank},
           {"publisher", spec.pub},
           {"connected", st.connected},
           {"trusted", kv.ready(spec.id)},
           {"blocks_gpu", inv.blocks(spec.id, true)},
           {"blocks_other", inv.blocks(spec.id, false)},
           {"batches", st.messages},
           {"decode_errors", st.decode_errors},
           {"gaps", st.gaps},
           {"replayed", st.replayed},
           {"resyncs", st.resets},
           {"reconnects", st.reconnects}};
    auto counts = kv.counts(spec.id);
    auto parity = kv.parity(spec.id);
    s["page_size_ok"] = !counts.page_size_mismatch;
    s["engine_block_size"] = counts.engine_block_size;
    s["hits"] = counts.hits;
    s["predicted_tokens"] = counts.predicted_tokens;
    s["cached_tokens"] = counts.cached_tokens;
    s["bootstrap"] = std::string(kv::to_string(st.bootstrap));
    // Load: this kvgate's, and what the other replicas last reported (--replica-sync).
    s["active"] = counts.active;
    s["pending_prefill_tokens"] = counts.pending_prefill;
    s["peer_active"] = counts.peer_active;
    s["peer_pending_prefill_tokens"] = counts.peer_pending;
    s["tokenizer_parity"] = Json{{"state", parity.state}, {"detail", parity.detail}};
    if (st.messages > 0) {
      s["last_seq"] = st.last_seq;
      s["last_event_age_secs"] = std::chrono::duration<double>(now - st.last_message).count();
    } else {
      s["last_seq"] = nullptr;
      s["last_event_age_secs"] = nullptr;
    }
    sources.push_back(std::move(s));
  }
  return Json{{"nodes", inv.nodes()},
              {"bytes", inv.bytes()},
              {"pruned", inv.pruned()},
              {"sources", std::move(sources)}};
}

Json stats_json(const StatsInput& in) {
  const auto now = std::chrono::system_clock::now();
  Json out{{"version", KVGATE_VERSION},
           {"time", unix_secs(now)},
           {"uptime_secs", std::chrono::duration<double>(now - in.started).count()},
           {"health_interval_secs", in.health_interval.count()}};
  const GatewayMetrics& m = *in.metrics;
  out["requests"] = requests_json(m, in);
  out["ttft"] = ttft_json(m);
  out["branches"] = branches_json(m);
  const auto usage = usage_by_worker(m);
  const auto attempts = by_worker(m.worker_requests);
  const auto failures = by_worker(m.worker_failures);
  Json rules = Json::array();
  if (in.table) {
    for (const auto& pool : in.table->pools) {
      rules.push_back(rule_json(*pool, usage, attempts, failures));
    }
  }
  out["rules"] = std::move(rules);
  Json recent = Json::array();
  if (in.decisions) {
    for (const auto& r : in.decisions->recent(in.recent_decisions)) {
      recent.push_back(decision_json(r));
    }
  }
  out["decisions"] =
      Json{{"total", in.decisions ? in.decisions->total() : 0}, {"recent", std::move(recent)}};
  return out;
}

std::string stats_text(const StatsInput& in) {
  return stats_json(in).dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
}

}  // namespace kvgate
