// Micro-benchmarks of routing as the pool grows (issue 13, "Workers"): what one request pays for
// its choice of worker, per policy, with 8, 64, 512 and 4,096 workers in the pool. One iteration
// is what the request path does for a request's first attempt: the candidates listed (the
// availability step of Gateway::Request::list_candidates: the pool's availability index), the
// policy's select, the breaker's pass,
// the dispatch hooks (on_dispatched, in-flight count) and the completion (breaker outcome,
// on_completed). Requests rotate over 256 conversations and 1,024 routing keys, so the stateful
// policies see hits and misses.
#include <benchmark/benchmark.h>

#include <memory>
#include <string>
#include <vector>

#include "gateway/knobs.h"
#include "policy/registry.h"
#include "request/request_info.h"
#include "workers/availability.h"

namespace kvgate {
namespace {

constexpr int kConversations = 256;
constexpr int kKeys = 1024;

struct Pool {
  explicit Pool(int n) : set(std::make_shared<WorkerSet>()) {
    for (int i = 0; i < n; ++i) {
      http::Target t;
      http::parse_url(
          "http://10.0." + std::to_string(i / 250) + "." + std::to_string(i % 250 + 1) + ":30000",
          t);
      auto w = std::make_shared<Worker>(static_cast<uint64_t>(i + 1), t,
                                        breaker_config(GatewayConfig{}));
      w->set_healthy(true);
      set->workers.push_back(std::move(w));
    }
    index = std::make_unique<AvailabilityIndex>(set);
  }
  std::shared_ptr<WorkerSet> set;
  std::unique_ptr<AvailabilityIndex> index;
};

struct Request {
  RequestInfo info;
  std::string key;
  RouteContext ctx;
  static std::string_view header(const void* self, std::string_view name) {
    const auto* r = static_cast<const Request*>(self);
    if (name == "x-smg-routing-key") return r->key;
    return {};
  }
};

// The requests an iteration cycles through: 1 KB chats, a shared system prompt, a conversation
// of their own each; token ids for kv_exact; a routing key for manual and consistent_hashing.
std::vector<std::unique_ptr<Request>> requests() {
  std::vector<std::unique_ptr<Request>> out;
  std::string system = "You are a helpful assistant. Answer briefly and cite your sources. ";
  for (int i = 0; i < kKeys; ++i) {
    auto r = std::make_unique<Request>();
    int conv = i % kConversations;
    r->info.model = "qwen3";
    r->info.first_user_message = "conversation " + std::to_string(conv) + " asks about caches";
    r->info.text = system + r->info.first_user_message;
    while (r->info.text.size() < 1024) r->info.text += " and the router sends tokens";
    for (int t = 0; t < 256; ++t) r->info.tokens.push_back(conv * 1000 + t);
    r->key = "user-" + std::to_string(i);
    r->ctx.request = &r->info;
    r->ctx.header_fn = &Request::header;
    r->ctx.header_self = r.get();
    out.push_back(std::move(r));
  }
  return out;
}

std::unique_ptr<Policy> build(const std::string& name, const WorkerSet& set) {
  PolicyConfig c = policy_config(GatewayConfig{});
  c.seed = 7;
  if (name == "kv_exact") {
    // kv_exact over round_robin, its sources never ready (no subscriber started): every request
    // takes the fallback path after kv_exact's own look at the candidates.
    c.name = "round_robin";
    c.kv.enabled = true;
    c.kv.page_size = 16;
    c.kv.dp_ranks = 1;
    c.kv.zmq_port = 5557;
    c.kv.warmup = std::chrono::seconds(30);
    c.kv.parity_probe = false;
  } else {
    c.name = name;
  }
  std::string err;
  auto p = make_policy(c, err);
  if (p) p->on_workers_changed(set);
  return p;
}

void BM_Route(benchmark::State& state, const char* name) {
  Pool pool(static_cast<int>(state.range(0)));
  auto policy = build(name, *pool.set);
  if (!policy) {
    state.SkipWithError("policy not built");
    return;
  }
  auto reqs = requests();
  CandidateList candidates;
  const std::vector<uint64_t> failed;
  size_t i = 0;
  for (auto _ : state) {
    Request& r = *reqs[i++ % reqs.size()];
    auto now = Clock::now();
    candidates.list(*pool.index, failed, now);
    r.ctx.candidates = candidates.view();
    Decision d = policy->select(candidates.workers(), r.ctx);
    r.ctx.candidates = {};
    if (d.worker == nullptr) {
      state.SkipWithError("no worker chosen");
      break;
    }
    CircuitBreaker::Pass pass = d.worker->admit(now);
    policy->on_dispatched(d, r.ctx);
    d.worker->begin_request();
    d.worker->record_success(pass);
    policy->on_completed(d, r.ctx, Outcome{.status = 200, .ok = true});
    d.worker->end_request();
  }
  policy->stop();
}

#define KVGATE_ROUTE_BENCH(policy) \
  BENCHMARK_CAPTURE(BM_Route, policy, #policy)->Arg(8)->Arg(64)->Arg(512)->Arg(4096);
KVGATE_ROUTE_BENCH(round_robin)
KVGATE_ROUTE_BENCH(random)
KVGATE_ROUTE_BENCH(power_of_two)
KVGATE_ROUTE_BENCH(cache_aware)
KVGATE_ROUTE_BENCH(prefix_hash)
KVGATE_ROUTE_BENCH(consistent_hashing)
KVGATE_ROUTE_BENCH(chwbl)
KVGATE_ROUTE_BENCH(bucket)
KVGATE_ROUTE_BENCH(manual)
KVGATE_ROUTE_BENCH(kv_exact)

}  // namespace
}  // namespace kvgate
