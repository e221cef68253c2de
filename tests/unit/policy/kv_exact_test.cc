// Unit tests of policy/kv_exact driven for real over loopback: a kv::Publisher per (worker, rank)
// publishes BlockStored events, the policy's own subscriber follows them into its inventory, and
// the tests check the choices: the cost (uncached tokens + queued prefill + load_tokens x active)
// and its tie-breaks (fewer active, then a hash of the request and the source, the same in every
// instance); predict on route (a dispatched request's pages count as held where it went until
// predict_ttl, or until it is known not to have started); readiness (a view followed from the
// start or replayed by the publisher at once, one begun mid-stream after warmup);
// the zero-hit watchdog; and the fallback's branches, the fallback hearing only its own
// decisions. No fixed sleeps: every wait is for a condition, with on_period() run in the loop.
#include "policy/kv_exact.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "gateway/knobs.h"
#include "kv/events.h"
#include "kv/publisher.h"
#include "policy/registry.h"
#include "replica/sync.h"
#include "support/process.h"

namespace kvgate::testing {
namespace {

using namespace std::chrono_literals;

constexpr int kPage = 4;

// `pages` pages of distinct tokens: page i of prefix `tag` holds tag*1000 + i*kPage + 0..3.
std::vector<int32_t> page_tokens(int tag, int pages) {
  std::vector<int32_t> t;
  t.reserve(static_cast<size_t>(pages) * kPage);
  for (int i = 0; i < pages * kPage; ++i) t.push_back(tag * 1000 + i);
  return t;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// One BlockStored per chain, each a chain start (parent nil), with engine ids from `next_id`.
std::string stored_payload(const std::vector<std::vector<int32_t>>& chains, uint64_t& next_id) {
  kv::EventBatch b;
  b.ts = 1.0;
  for (const auto& tokens : chains) {
    kv::BlockStored s;
    s.block_size = kPage;
    s.token_ids = tokens;
    for (size_t i = 0; i < tokens.size() / kPage; ++i) s.block_hashes.push_back(next_id++);
    s.medium = kv::Medium::kGpu;
    b.events.emplace_back(std::move(s));
  }
  std::string out;
  kv::encode_batch(b, kv::WireFormat::kSglang, out);
  return out;
}

std::string cleared_payload() {
  kv::EventBatch b;
  b.ts = 1.0;
  b.events.emplace_back(kv::AllBlocksCleared{});
  std::string out;
  kv::encode_batch(b, kv::WireFormat::kSglang, out);
  return out;
}

// A fallback that records the hooks it hears: always the first available worker.
class RecordingPolicy final : public Policy {
 public:
  std::string_view name() const override { return "recording"; }
  Decision select(std::span<Worker* const> available, RouteContext&) override {
    ++selected;
    Decision d;
    d.worker = available.front();
    d.branch = "recorded";
    return d;
  }
  void on_dispatched(const Decision& d, RouteContext&) override {
    ++dispatched;
    branches.emplace_back(d.branch);
  }
  void on_completed(const Decision& d, RouteContext&, const Outcome&) override {
    ++completed;
    branches.emplace_back(d.branch);
  }
  int selected = 0, dispatched = 0, completed = 0;
  std::vector<std::string> branches;  // of every hook call
};

// Workers on http://127.0.0.1:<distinct ports> with a publisher bound per rank, and the policy
// config that names their event ports.
struct Rig {
  Rig(int workers, int ranks) : ranks(ranks) {
    for (int i = 0; i < workers; ++i) {
      http::Target t;
      http::parse_url("http://127.0.0.1:" + std::to_string(free_port()), t);
      auto w = std::make_shared<Worker>(static_cast<uint64_t>(i + 1), t,
                                        breaker_config(GatewayConfig{}));
      int base = free_ports(ranks);
      ports[w->url()] = base;
      std::vector<std::unique_ptr<kv::Publisher>> per_rank;
      for (int r = 0; r < ranks; ++r) {
        kv::PublisherOptions o;
        o.endpoint = "tcp://*:" + std::to_string(base + r);
        std::string err;
        per_rank.push_back(kv::Publisher::create(o, err));
        EXPECT_TRUE(per_rank.back()) << err;
      }
      pubs.push_back(std::move(per_rank));
      owned.push_back(std::move(w));
      ptrs.push_back(owned.back().get());
    }
  }

  PolicyConfig config(const std::string& fallback = "round_robin") {
    PolicyConfig c = policy_config(GatewayConfig{});
    c.name = fallback;
    c.seed = 7;
    c.rule = "r";
    c.registry = &registry;
    c.kv.enabled = true;
    c.kv.page_size = kPage;
    c.kv.dp_ranks = ranks;
    c.kv.zmq_port = 0;
    c.kv.endpoint_ports = {ports.begin(), ports.end()};
    c.kv.warmup = 0s;
    c.kv.load_tokens = 0;
    c.kv.predict_ttl = 0ms;
    c.kv.parity_probe = false;
    c.kv.hash_algo = "";
    return c;
  }

  // Built over `fallback` by make_policy, told the workers (in `order` when given) and started.
  std::unique_ptr<KvExactPolicy> make(const PolicyConfig& c, std::vector<WorkerPtr> order = {}) {
    std::string err;
    std::unique_ptr<Policy> p = make_policy(c, err);
    EXPECT_TRUE(p) << err;
    EXPECT_TRUE(dynamic_cast<KvExactPolicy*>(p.get()));
    if (dynamic_cast<KvExactPolicy*>(p.get()) == nullptr) return nullptr;
    std::unique_ptr<KvExactPolicy> policy(static_cast<KvExactPolicy*>(p.release()));
    begin(*policy, std::move(order));
    return policy;
  }
  void begin(KvExactPolicy& p, std::vector<WorkerPtr> order = {}) {
    p.on_workers_changed(WorkerSet{order.empty() ? owned : std::move(order)});
    p.start();
  }

  kv::SourceId source(const KvExactPolicy& p, int worker, int rank) const {
    for (const auto& [spec, st] : p.sources()) {
      if (spec.endpoint == owned[worker]->url() && spec.rank == rank) return spec.id;
    }
    ADD_FAILURE() << "no source for worker " << worker << " rank " << rank;
    return 0;
  }

  // Every source of every policy connected, and past the PUB/SUB slow join: a probe batch
  // (AllBlocksCleared, harmless before any store) is republished until each has received one.
  void sync(const std::vector<KvExactPolicy*>& policies) {
    auto received = [&](KvExactPolicy* p, int w, int r) {
      for (const auto& [spec, st] : p->sources()) {
        if (spec.endpoint == owned[w]->url() && spec.rank == r) {
          return st.connected && st.messages > 0;
        }
      }
      return false;
    };
    ASSERT_TRUE(wait_until([&] {
      bool all = true;
      for (int w = 0; w < static_cast<int>(owned.size()); ++w) {
        for (int r = 0; r < ranks; ++r) {
          bool got = std::all_of(policies.begin(), policies.end(),
                                 [&](KvExactPolicy* p) { return received(p, w, r); });
          if (!got) pubs[w][r]->publish(cleared_payload());
          all = all && got;
        }
      }
      for (auto* p : policies) p->on_period();
      return all;
    })) << "the policies' subscribers never received the publishers' batches";
  }

  // Publishes `chains` as stored on (worker, rank) and waits until every policy holds
  // `expect_blocks` blocks there (all its blocks, counting earlier stores).
  void store(const std::vector<KvExactPolicy*>& policies, int worker, int rank,
             const std::vector<std::vector<int32_t>>& chains, size_t expect_blocks) {
    pubs[worker][rank]->publish(stored_payload(chains, next_id));
    ASSERT_TRUE(wait_until([&] {
      return std::all_of(policies.begin(), policies.end(), [&](KvExactPolicy* p) {
        p->on_period();
        return p->inventory().blocks(source(*p, worker, rank), true) == expect_blocks;
      });
    })) << "the stored blocks never reached the inventory";
  }

  // on_period until every source of `p` is trusted.
  void wait_ready(KvExactPolicy& p) {
    ASSERT_TRUE(wait_until([&] {
      p.on_period();
      for (const auto& [spec, st] : p.sources()) {
        if (!p.ready(spec.id)) return false;
      }
      return true;
    }));
  }

  std::string metric(const std::string& series) const {
    std::string text = registry.expose();
    auto at = text.find(series + " ");
    if (at == std::string::npos) return "absent";
    auto end = text.find('\n', at);
    return text.substr(at + series.size() + 1, end - at - series.size() - 1);
  }

  int ranks;
  metrics::Registry registry;
  std::map<std::string, int64_t> ports;  // url -> rank 0's event port
  std::vector<std::vector<std::unique_ptr<kv::Publisher>>> pubs;
  std::vector<WorkerPtr> owned;
  std::vector<Worker*> ptrs;
  uint64_t next_id = 1;
};

// A request of `tokens`, routed with its own context (which caches the request's page keys).
struct TokReq {
  explicit TokReq(std::vector<int32_t> tokens) {
    info.tokens = std::move(tokens);
    info.model = "m";
    ctx.request = &info;
  }
  TokReq(const TokReq&) = delete;
  TokReq& operator=(const TokReq&) = delete;
  RequestInfo info;
  RouteContext ctx;
};

Decision route(Policy& p, std::span<Worker* const> available, TokReq& r) {
  return p.select(available, r.ctx);
}

// The prefill a dispatch queues on its rank ends at the stream's first event (on_first_token),
// the request itself at its completion; a request with no first event (not streamed, failed)
// settles both at completion. Every path returns the rank's counts to zero.
TEST(KvExactPolicyCost, QueuedPrefillEndsAtTheFirstEvent) {
  Rig rig(1, 1);
  PolicyConfig c = rig.config();
  c.kv.predict_ttl = 0ms;
  auto p = rig.make(c);
  ASSERT_TRUE(p);
  ASSERT_NO_FATAL_FAILURE(rig.sync({p.get()}));
  ASSERT_NO_FATAL_FAILURE(rig.wait_ready(*p));
  auto* kv = dynamic_cast<KvExactPolicy*>(p.get());
  ASSERT_NE(kv, nullptr);
  TokReq a(page_tokens(20, 3));
  Decision d = route(*p, rig.ptrs, a);
  ASSERT_NE(d.target_id, 0u);
  const auto id = static_cast<kv::SourceId>(d.target_id);
  p->on_dispatched(d, a.ctx);
  EXPECT_EQ(kv->counts(id).active, 1);
  EXPECT_EQ(kv->counts(id).pending_prefill, static_cast<int64_t>(a.info.tokens.size()));
  p->on_first_token(d, a.ctx);
  EXPECT_EQ(kv->counts(id).active, 1);  // decoding: still there
  EXPECT_EQ(kv->counts(id).pending_prefill, 0);
  p->on_completed(d, a.ctx, Outcome{.status = 200, .ok = true, .first_token = true});
  EXPECT_EQ(kv->counts(id).active, 0);
  EXPECT_EQ(kv->counts(id).pending_prefill, 0);
  // No first event: completion settles the prefill too.
  TokReq b(page_tokens(30, 3));
  Decision e = route(*p, rig.ptrs, b);
  p->on_dispatched(e, b.ctx);
  EXPECT_GT(kv->counts(id).pending_prefill, 0);
  p->on_completed(e, b.ctx, Outcome{.status = 503, .ok = false, .started = false});
  EXPECT_EQ(kv->counts(id).active, 0);
  EXPECT_EQ(kv->counts(id).pending_prefill, 0);
  p->stop();
}

// 1. Cost: the holder of the prefix wins (the rank named, the cached tokens predicted) until its
// active requests (load_tokens each) or its queued prefill outweigh what it saves; finishing them
// brings it back.
TEST(KvExactPolicyCost, HolderWinsUntilLoadOutweighsTheSaving) {
  Rig rig(2, 2);
  PolicyConfig c = rig.config();
  c.kv.load_tokens = 10;
  auto p = rig.make(c);
  ASSERT_TRUE(p);
  ASSERT_NO_FATAL_FAILURE(rig.sync({p.get()}));
  const kv::SourceId holder = rig.source(*p, 0, 1);
  const auto prefix = page_tokens(1, 6);  // 24 tokens, held by worker 0's rank 1
  ASSERT_NO_FATAL_FAILURE(rig.store({p.get()}, 0, 1, {prefix}, 6));
  ASSERT_NO_FATAL_FAILURE(rig.wait_ready(*p));

  // 32 tokens, 24 cached there: cost 8 there, 32 anywhere else.
  const auto request = concat(prefix, page_tokens(2, 2));
  auto expect_holder = [&](const char* when) {
    TokReq r(request);
    Decision d = route(*p, rig.ptrs, r);
    EXPECT_EQ(d.branch, "kv_exact_hit") << when;
    EXPECT_EQ(d.worker, rig.ptrs[0]) << when;
    EXPECT_EQ(d.dp_rank, std::optional<int>(1)) << when;
    EXPECT_EQ(d.target_id, holder) << when;
    EXPECT_EQ(d.predicted_tokens, 24u) << when;
    EXPECT_TRUE(d.inner_branch.empty()) << when;
  };
  auto expect_elsewhere = [&](const char* when) {
    TokReq r(request);
    Decision d = route(*p, rig.ptrs, r);
    EXPECT_EQ(d.branch, "kv_exact_balance") << when;
    EXPECT_NE(d.target_id, holder) << when;
    EXPECT_NE(d.target_id, 0u) << when;
    EXPECT_TRUE(d.dp_rank.has_value()) << when;
    EXPECT_EQ(d.predicted_tokens, 0u) << when;
  };
  expect_holder("idle");

  // Requests of exactly the held prefix: each goes to the holder and queues no prefill there
  // (all cached), so only load_tokens x active weighs: 8 + 10 x 2 = 28 < 32, 8 + 10 x 3 = 38 > 32.
  struct Active {
    std::unique_ptr<TokReq> req;
    Decision d;
  };
  std::vector<Active> active;
  for (int i = 0; i < 3; ++i) {
    auto r = std::make_unique<TokReq>(prefix);
    Decision d = route(*p, rig.ptrs, *r);
    ASSERT_EQ(d.target_id, holder);
    ASSERT_EQ(d.predicted_tokens, 24u);
    p->on_dispatched(d, r->ctx);
    active.push_back({std::move(r), d});
    if (i == 1) expect_holder("two active there");
  }
  expect_elsewhere("three active there");
  // Finishing one brings it back, finishing all keeps it there.
  p->on_completed(active.back().d, active.back().req->ctx, Outcome{.status = 200, .ok = true});
  active.pop_back();
  expect_holder("two active again");
  for (auto& a : active) p->on_completed(a.d, a.req->ctx, Outcome{.status = 200, .ok = true});
  active.clear();
  expect_holder("none active");

  // Queued prefill weighs too: one active request (10) with 32 uncached tokens queued there makes
  // it 8 + 32 + 10 = 50 > 32, though the active count alone (18) would not.
  TokReq big(concat(prefix, page_tokens(3, 8)));
  Decision bd = route(*p, rig.ptrs, big);
  ASSERT_EQ(bd.target_id, holder);  // 56 - 24 = 32 there, 56 elsewhere
  ASSERT_EQ(bd.predicted_tokens, 24u);
  p->on_dispatched(bd, big.ctx);
  expect_elsewhere("32 prefill tokens queued there");
  p->on_completed(bd, big.ctx, Outcome{.status = 200, .ok = true});
  expect_holder("the prefill done");
  p->stop();
}

// 2. Ties: two instances with the same inventory (told the workers in opposite orders, so their
// source ids and scan orders differ) choose the same source for every request; requests of equal
// cost spread over the sources by their hash; among equal costs the less active source wins.
TEST(KvExactPolicyTieBreak, SameChoiceInEveryInstanceAndSpread) {
  Rig rig(3, 1);
  PolicyConfig c = rig.config();
  auto a = rig.make(c);
  std::vector<WorkerPtr> reversed(rig.owned.rbegin(), rig.owned.rend());
  auto b = rig.make(c, reversed);
  ASSERT_TRUE(a && b);
  ASSERT_NO_FATAL_FAILURE(rig.sync({a.get(), b.get()}));
  // 40 one-page prefixes, each held by every source: equal cost everywhere for each request.
  constexpr int kPrefixes = 40;
  std::vector<std::vector<int32_t>> chains;
  chains.reserve(kPrefixes);
  for (int i = 0; i < kPrefixes; ++i) chains.push_back(page_tokens(10 + i, 1));
  for (int w = 0; w < 3; ++w)
    ASSERT_NO_FATAL_FAILURE(rig.store({a.get(), b.get()}, w, 0, chains, kPrefixes));
  ASSERT_NO_FATAL_FAILURE(rig.wait_ready(*a));
  ASSERT_NO_FATAL_FAILURE(rig.wait_ready(*b));
  ASSERT_NE(rig.source(*a, 0, 0), rig.source(*b, 0, 0));  // the ids differ between instances

  std::vector<Worker*> reversed_ptrs(rig.ptrs.rbegin(), rig.ptrs.rend());
  std::map<Worker*, int> chosen;
  std::vector<Worker*> first_choice;
  for (int i = 0; i < kPrefixes; ++i) {
    auto tokens = concat(chains[i], page_tokens(100 + i, 1));
    TokReq ra(tokens), rb(tokens), again(tokens);
    Decision da = route(*a, rig.ptrs, ra);
    Decision db = route(*b, reversed_ptrs, rb);
    EXPECT_EQ(da.branch, "kv_exact_hit");
    EXPECT_EQ(db.branch, "kv_exact_hit");
    EXPECT_EQ(da.predicted_tokens, static_cast<size_t>(kPage));
    EXPECT_FALSE(da.dp_rank.has_value());  // one rank: none named
    EXPECT_EQ(da.worker, db.worker) << "request " << i;
    EXPECT_EQ(route(*a, rig.ptrs, again).worker, da.worker) << "request " << i;
    ++chosen[da.worker];
    first_choice.push_back(da.worker);
  }
  EXPECT_GE(chosen.size(), 2u) << "equal costs all went to one source";

  // Equal cost (load_tokens 0, nothing queued): the source with fewer active requests wins.
  TokReq filler(chains[0]);  // the same first page: its tie-break picks the same source
  Decision fd = route(*a, rig.ptrs, filler);
  ASSERT_EQ(fd.worker, first_choice[0]);
  a->on_dispatched(fd, filler.ctx);
  {
    TokReq r(concat(chains[0], page_tokens(100, 1)));
    Decision d = route(*a, rig.ptrs, r);
    EXPECT_EQ(d.branch, "kv_exact_hit");
    EXPECT_NE(d.worker, first_choice[0]) << "the busier of equal costs won";
  }
  a->on_completed(fd, filler.ctx, Outcome{.status = 200, .ok = true});
  {
    TokReq r(concat(chains[0], page_tokens(100, 1)));
    EXPECT_EQ(route(*a, rig.ptrs, r).worker, first_choice[0]);
  }
  a->stop();
  b->stop();
}

// 3. Predict on route: a dispatched request's pages count as held where it went, for
// predict_ttl, or until it is known not to have started.
TEST(KvExactPolicyPredict, DispatchPredictsUntilTtlOrWithdrawal) {
  Rig rig(2, 1);
  PolicyConfig c = rig.config();
  c.kv.predict_ttl = 1000ms;  // long enough for a few calls, short enough to wait out
  c.kv.load_tokens = 1;
  auto p = rig.make(c);
  ASSERT_TRUE(p);
  ASSERT_NO_FATAL_FAILURE(rig.sync({p.get()}));
  // warmup 0: trusted once connected, holding nothing.
  ASSERT_NO_FATAL_FAILURE(rig.wait_ready(*p));

  // No events for this prefix: the fallback chooses; dispatching records a prediction there.
  const auto prefix = page_tokens(1, 3);
  TokReq first(concat(prefix, page_tokens(2, 1)));
  Decision d1 = route(*p, rig.ptrs, first);
  ASSERT_EQ(d1.branch, "kv_exact_miss");
  ASSERT_NE(d1.target_id, 0u);
  p->on_dispatched(d1, first.ctx);
  // A request sharing the prefix goes to the same source as a hit (round robin alone would send
  // it to the other worker).
  TokReq second(concat(prefix, page_tokens(3, 1)));
  Decision d2 = route(*p, rig.ptrs, second);
  EXPECT_EQ(d2.branch, "kv_exact_hit");
  EXPECT_EQ(d2.worker, d1.worker);
  EXPECT_EQ(d2.target_id, d1.target_id);
  EXPECT_EQ(d2.predicted_tokens, prefix.size());
  p->on_completed(d1, first.ctx, Outcome{.status = 200, .ok = true});
  // Started: the prediction stays until its TTL, which the periodic sweep then drops.
  {
    TokReq r(concat(prefix, page_tokens(4, 1)));
    EXPECT_EQ(route(*p, rig.ptrs, r).branch, "kv_exact_hit");
  }
  EXPECT_TRUE(wait_until([&] {
    p->on_period();
    TokReq r(concat(prefix, page_tokens(5, 1)));
    return route(*p, rig.ptrs, r).branch == "kv_exact_miss";
  })) << "the prediction never expired";

  // A request that never started withdraws its prediction at once.
  const auto other = page_tokens(6, 3);
  TokReq third(concat(other, page_tokens(7, 1)));
  Decision d3 = route(*p, rig.ptrs, third);
  ASSERT_EQ(d3.branch, "kv_exact_miss");
  p->on_dispatched(d3, third.ctx);
  {
    TokReq r(concat(other, page_tokens(8, 1)));
    Decision d = route(*p, rig.ptrs, r);
    EXPECT_EQ(d.branch, "kv_exact_hit");
    EXPECT_EQ(d.target_id, d3.target_id);
  }
  p->on_completed(d3, third.ctx, Outcome{.status = 503, .ok = false, .started = false});
  {
    TokReq r(concat(other, page_tokens(9, 1)));
    EXPECT_EQ(route(*p, rig.ptrs, r).branch, "kv_exact_miss");
  }

  // A sibling sent on the prediction keeps it when the request that made it never ran: the
  // sibling is prefilling those pages now.
  const auto shared = page_tokens(10, 3);
  TokReq maker(concat(shared, page_tokens(11, 1)));
  Decision dm = route(*p, rig.ptrs, maker);
  ASSERT_EQ(dm.branch, "kv_exact_miss");
  p->on_dispatched(dm, maker.ctx);
  TokReq sibling(concat(shared, page_tokens(12, 1)));
  Decision ds = route(*p, rig.ptrs, sibling);
  ASSERT_EQ(ds.branch, "kv_exact_hit");
  p->on_dispatched(ds, sibling.ctx);
  p->on_completed(dm, maker.ctx, Outcome{.status = 503, .ok = false, .started = false});
  {
    TokReq r(concat(shared, page_tokens(13, 1)));
    Decision d = route(*p, rig.ptrs, r);
    EXPECT_EQ(d.branch, "kv_exact_hit");
    EXPECT_EQ(d.target_id, ds.target_id);
  }
  // Once the sibling too never ran, nothing is left predicted there.
  p->on_completed(ds, sibling.ctx, Outcome{.status = 503, .ok = false, .started = false});
  {
    TokReq r(concat(shared, page_tokens(14, 1)));
    EXPECT_EQ(route(*p, rig.ptrs, r).branch, "kv_exact_miss");
  }
  p->stop();
}

// 4. Trust: a source that began mid-stream (cold: its publisher has no replay, and the policy
// subscribed after its first batches) is not trusted before kv.warmup, even holding blocks (what
// its engine stored before is unknown), and /readiness says so; one whose whole history came
// from its publisher's replay is trusted at once.
TEST(KvExactPolicyWarmup, AColdSourceWaitsForWarmupEvenHoldingBlocks) {
  Rig rig(2, 1);
  PolicyConfig c = rig.config();
  c.kv.warmup = 3600s;
  auto p = rig.make(c);
  ASSERT_TRUE(p);
  // Connected (and a batch received, which holds nothing; PUB/SUB's slow join loses the first
  // ones, so the view begins mid-stream).
  ASSERT_NO_FATAL_FAILURE(rig.sync({p.get()}));
  p->on_period();
  const kv::SourceId s0 = rig.source(*p, 0, 0), s1 = rig.source(*p, 1, 0);
  EXPECT_FALSE(p->ready(s0));
  EXPECT_FALSE(p->ready(s1));
  const auto prefix = page_tokens(1, 2);
  {
    TokReq r(concat(prefix, page_tokens(2, 1)));
    Decision d = route(*p, rig.ptrs, r);
    EXPECT_EQ(d.branch, "kv_exact_not_ready");
    EXPECT_EQ(d.inner_branch, "next");  // round robin's
    ASSERT_TRUE(d.worker);
    p->on_dispatched(d, r.ctx);
    p->on_completed(d, r.ctx, Outcome{.status = 200, .ok = true});
  }
  EXPECT_EQ(rig.metric(R"(kvgate_kv_exact_misses_total{rule="r",reason="not_ready"})"), "1");
  ASSERT_NO_FATAL_FAILURE(rig.store({p.get()}, 1, 0, {prefix}, 2));
  p->on_period();
  EXPECT_FALSE(p->ready(s1));  // holding blocks, but cold
  {
    TokReq r(concat(prefix, page_tokens(3, 1)));
    EXPECT_EQ(route(*p, rig.ptrs, r).branch, "kv_exact_not_ready");
  }
  const std::string details = p->readiness_details();
  EXPECT_NE(details.find(R"("trusted":0,"cold":2)"), std::string::npos) << details;
  EXPECT_NE(details.find(R"("bootstrap":"cold")"), std::string::npos) << details;
  EXPECT_NE(rig.metric(R"(kvgate_kv_source_bootstrap{rule="r",endpoint=")" + rig.owned[1]->url() +
                       R"(",rank="0",how="cold"})"),
            "absent");
  p->stop();

  // The same sources with no warmup: trusted once they began (cold, warm at once).
  PolicyConfig now = rig.config();
  auto q = rig.make(now);
  ASSERT_NO_FATAL_FAILURE(rig.sync({q.get()}));
  ASSERT_NO_FATAL_FAILURE(rig.wait_ready(*q));
  {
    // A trusted source now: an unknown prefix is a miss, not a cold start.
    TokReq r(page_tokens(4, 3));
    EXPECT_EQ(route(*q, rig.ptrs, r).branch, "kv_exact_miss");
  }
  q->stop();
}

TEST(KvExactPolicyWarmup, AHistoryReplayedByThePublisherIsTrustedAtOnce) {
  // A publisher with a replay endpoint that stored a prefix before the policy subscribed.
  const int pub_port = free_ports(1), replay_port = free_ports(1);
  kv::PublisherOptions o;
  o.endpoint = "tcp://*:" + std::to_string(pub_port);
  o.replay_endpoint = "tcp://*:" + std::to_string(replay_port);
  std::string err;
  auto publisher = kv::Publisher::create(o, err);
  ASSERT_TRUE(publisher) << err;
  uint64_t next_id = 1;
  const auto prefix = page_tokens(1, 3);
  publisher->publish(stored_payload({prefix}, next_id));  // sequence 0, before anyone listens
  publisher->publish(stored_payload({page_tokens(9, 2)}, next_id));
  http::Target t;
  http::parse_url("http://127.0.0.1:" + std::to_string(free_port()), t);
  auto w = std::make_shared<Worker>(1, t, breaker_config(GatewayConfig{}));
  w->set_kv_events(KvEventsInfo{.host = "127.0.0.1",
                                .port_base = pub_port,
                                .replay_port_base = replay_port,
                                .block_size = kPage});
  Rig rig(0, 1);
  PolicyConfig c = rig.config();
  c.kv.warmup = 3600s;
  std::string perr;
  std::unique_ptr<Policy> made = make_policy(c, perr);
  ASSERT_TRUE(made) << perr;
  auto* p = dynamic_cast<KvExactPolicy*>(made.get());
  ASSERT_TRUE(p);
  p->on_workers_changed(WorkerSet{{w}});
  p->start();
  // Live batches until one arrives: the first seen is past 0, so the replay brings 0 onwards.
  kv::EventBatch empty;
  empty.ts = 2.0;
  std::string nothing;
  kv::encode_batch(empty, kv::WireFormat::kSglang, nothing);
  ASSERT_TRUE(wait_until([&] {
    p->on_period();
    for (const auto& [spec, st] : p->sources()) {
      if (st.bootstrap == kv::Bootstrap::kPending) publisher->publish(nothing);
      if (st.bootstrap != kv::Bootstrap::kPending && p->ready(spec.id)) return true;
    }
    return false;
  }));
  for (const auto& [spec, st] : p->sources()) {
    EXPECT_EQ(st.bootstrap, kv::Bootstrap::kEngineReplay);
    EXPECT_EQ(p->inventory().blocks(spec.id, true), 5u);
  }
  Worker* avail[] = {w.get()};
  TokReq r(concat(prefix, page_tokens(2, 1)));
  Decision d = route(*p, avail, r);
  EXPECT_EQ(d.branch, "kv_exact_hit");
  EXPECT_EQ(d.predicted_tokens, static_cast<size_t>(3 * kPage));
  p->stop();
}

// 5. Watchdog: 50 lookups in a row matching nothing while the inventory holds blocks fire it
// once per 50; a hit restarts the count; an empty inventory never fires it.
TEST(KvExactPolicyWatchdog, FiresAfterFiftyZeroHitLookupsInARow) {
  Rig rig(1, 1);
  auto p = rig.make(rig.config());
  ASSERT_TRUE(p);
  ASSERT_NO_FATAL_FAILURE(rig.sync({p.get()}));
  ASSERT_NO_FATAL_FAILURE(rig.wait_ready(*p));
  const std::string series = R"(kvgate_kv_exact_zero_hit_watchdog_total{rule="r"})";
  int tag = 100;
  auto misses = [&](int n) {
    for (int i = 0; i < n; ++i) {
      TokReq r(page_tokens(tag++, 2));
      ASSERT_EQ(route(*p, rig.ptrs, r).branch, "kv_exact_miss");
    }
  };
  misses(60);  // nothing held anywhere: requests simply share no prefix yet
  EXPECT_EQ(rig.metric(series), "0");

  const auto prefix = page_tokens(1, 2);
  ASSERT_NO_FATAL_FAILURE(rig.store({p.get()}, 0, 0, {prefix}, 2));
  misses(49);
  {
    TokReq r(concat(prefix, page_tokens(2, 1)));
    ASSERT_EQ(route(*p, rig.ptrs, r).branch, "kv_exact_hit");  // restarts the count
  }
  misses(49);
  EXPECT_EQ(rig.metric(series), "0");
  misses(1);  // the 50th in a row
  EXPECT_EQ(rig.metric(series), "1");
  misses(49);
  EXPECT_EQ(rig.metric(series), "1");
  misses(1);
  EXPECT_EQ(rig.metric(series), "2");
  p->stop();
}

// 6. Requests kv_exact cannot key go to the fallback with a branch saying why; the fallback
// hears on_dispatched / on_completed for its own decisions (with its own branch), never for
// kv_exact's.
TEST(KvExactPolicyMisses, FallbackBranchesAndItsHooks) {
  Rig rig(1, 2);
  PolicyConfig c = rig.config();
  auto fallback = std::make_unique<RecordingPolicy>();
  RecordingPolicy& rec = *fallback;
  KvExactPolicy p(c, std::move(fallback));
  rig.begin(p);
  ASSERT_NO_FATAL_FAILURE(rig.sync({&p}));
  const kv::SourceId r0 = rig.source(p, 0, 0), r1 = rig.source(p, 0, 1);
  const auto prefix = page_tokens(1, 2);
  ASSERT_NO_FATAL_FAILURE(rig.store({&p}, 0, 0, {prefix}, 2));
  ASSERT_NO_FATAL_FAILURE(rig.wait_ready(p));

  struct Case {
    const char* branch;
    const char* reason;
    void (*shape)(RequestInfo&);
  };
  const Case cases[] = {
      {"kv_exact_no_tokens", "no_tokens", [](RequestInfo& i) { i.tokens.clear(); }},
      {"kv_exact_lora", "lora",
       [](RequestInfo& i) {
         i.names_lora = true;  // several adapters: no single name
         i.lora.reset();
       }},
      {"kv_exact_unrendered", "unrendered", [](RequestInfo& i) { i.render_failed = true; }},
  };
  int fallback_decisions = 0;
  for (const auto& k : cases) {
    TokReq r(concat(prefix, page_tokens(2, 1)));  // would be a hit if kv_exact could key it
    k.shape(r.info);
    Decision d = route(p, rig.ptrs, r);
    EXPECT_EQ(d.branch, k.branch);
    EXPECT_EQ(d.inner_branch, "recorded");
    EXPECT_EQ(d.worker, rig.ptrs[0]);
    EXPECT_EQ(d.predicted_tokens, 0u);
    ASSERT_TRUE(d.dp_rank.has_value());  // two ranks: the fallback's worker gets one named
    EXPECT_EQ(d.target_id, *d.dp_rank == 0 ? r0 : r1);
    p.on_dispatched(d, r.ctx);
    p.on_completed(d, r.ctx, Outcome{.status = 200, .ok = true});
    ++fallback_decisions;
    EXPECT_EQ(rec.dispatched, fallback_decisions);
    EXPECT_EQ(rec.completed, fallback_decisions);
    EXPECT_EQ(rig.metric(std::string(R"(kvgate_kv_exact_misses_total{rule="r",reason=")") +
                         k.reason + "\"}"),
              "1");
  }
  for (const auto& b : rec.branches) EXPECT_EQ(b, "recorded");

  // One adapter named once, while no event has named an adapter (engine builds that do not
  // publish lora_name): no namespace to look in either, a lora miss, not a silent base miss.
  {
    TokReq r(concat(prefix, page_tokens(2, 1)));
    r.info.names_lora = true;
    r.info.lora = "adapter";
    EXPECT_EQ(route(p, rig.ptrs, r).branch, "kv_exact_lora");
  }

  // kv_exact's own decision: the fallback neither chooses nor hears of it.
  int selected = rec.selected;
  TokReq hit(concat(prefix, page_tokens(3, 1)));
  Decision d = route(p, rig.ptrs, hit);
  ASSERT_EQ(d.branch, "kv_exact_hit");
  EXPECT_EQ(d.target_id, r0);
  EXPECT_EQ(d.dp_rank, std::optional<int>(0));
  EXPECT_TRUE(d.inner_branch.empty());
  p.on_dispatched(d, hit.ctx);
  // The fallback's next worker gets the rank with less queued there (rank 1, rank 0 busy now).
  {
    TokReq r(std::vector<int32_t>{});
    Decision f = route(p, rig.ptrs, r);
    EXPECT_EQ(f.branch, "kv_exact_no_tokens");
    EXPECT_EQ(f.dp_rank, std::optional<int>(1));
    EXPECT_EQ(f.target_id, r1);
  }
  p.on_completed(d, hit.ctx, Outcome{.status = 200, .ok = true, .cached_tokens = 8});
  EXPECT_EQ(rec.selected, selected + 1);  // the no_tokens one only
  EXPECT_EQ(rec.dispatched, fallback_decisions);
  EXPECT_EQ(rec.completed, fallback_decisions);
  // Ground truth counted for kv_exact's decision: 8 predicted, 8 reported.
  KvExactPolicy::SourceCounts counts = p.counts(r0);
  EXPECT_EQ(counts.hits, 1u);
  EXPECT_EQ(counts.predicted_tokens, 8u);
  EXPECT_EQ(counts.cached_tokens, 8u);
  p.stop();
}

}  // namespace
// With replicas a miss (nothing cached or predicted anywhere) is placed by kv_exact's own cost,
// not by the fallback, whose state is each replica's own: two replicas (two policies here, each
// with its own Sync, never started) place a new prompt alike, still counted as a miss; a rank
// with requests active loses the next miss.
TEST(KvExactPolicyMisses, WithReplicasAMissIsPlacedByTheCostAlikeEverywhere) {
  Rig rig(2, 2);
  replica::Sync sync_a(replica::SyncConfig{}, nullptr), sync_b(replica::SyncConfig{}, nullptr);
  PolicyConfig ca = rig.config(), cb = rig.config();
  ca.kv.load_tokens = cb.kv.load_tokens = 64;
  ca.replica = &sync_a;
  cb.replica = &sync_b;
  auto fa = std::make_unique<RecordingPolicy>(), fb = std::make_unique<RecordingPolicy>();
  RecordingPolicy &rec_a = *fa, &rec_b = *fb;
  KvExactPolicy a(ca, std::move(fa)), b(cb, std::move(fb));
  rig.begin(a);
  rig.begin(b);
  ASSERT_NO_FATAL_FAILURE(rig.sync({&a, &b}));
  ASSERT_NO_FATAL_FAILURE(rig.store({&a, &b}, 0, 0, {page_tokens(1, 2)}, 2));
  ASSERT_NO_FATAL_FAILURE(rig.wait_ready(a));
  ASSERT_NO_FATAL_FAILURE(rig.wait_ready(b));
  std::set<std::pair<Worker*, int>> placed;
  for (int i = 0; i < 16; ++i) {
    TokReq ra(page_tokens(100 + i, 2)), rb(page_tokens(100 + i, 2));
    Decision da = route(a, rig.ptrs, ra), db = route(b, rig.ptrs, rb);
    EXPECT_EQ(da.branch, "kv_exact_miss");
    EXPECT_EQ(da.inner_branch, "");
    EXPECT_EQ(da.worker, db.worker);
    EXPECT_EQ(da.dp_rank, db.dp_rank);
    ASSERT_TRUE(da.dp_rank.has_value());
    placed.insert({da.worker, *da.dp_rank});
  }
  // Ties (no load anywhere) go by the request: new prompts spread over the ranks.
  EXPECT_GE(placed.size(), 3U);
  EXPECT_EQ(rec_a.selected + rec_b.selected, 0);
  EXPECT_EQ(rig.metric(R"(kvgate_kv_exact_misses_total{rule="r",reason="miss"})"), "32");
  // A request active on the rank a miss would take sends the next one elsewhere.
  TokReq first(page_tokens(200, 2));
  Decision d = route(a, rig.ptrs, first);
  a.on_dispatched(d, first.ctx);
  TokReq again(page_tokens(200, 2));
  Decision next = route(a, rig.ptrs, again);
  EXPECT_FALSE(next.worker == d.worker && next.dp_rank == d.dp_rank);
  a.on_completed(d, first.ctx, Outcome{.status = 200, .ok = true});
}

// With replicas a prediction is heard by the peers (their sink: apply_peer) and may be heard
// twice (this replica applied it, then a replay gives it again): applied once, it counts from
// origin + settle on both, and one retraction withdraws it everywhere.
TEST(KvExactPolicyPredict, APredictionHeardTwiceHoldsOnceAndOneRetractionWithdrawsIt) {
  Rig rig(2, 1);
  replica::Sync sync_a(replica::SyncConfig{}, nullptr), sync_b(replica::SyncConfig{}, nullptr);
  PolicyConfig ca = rig.config(), cb = rig.config();
  ca.kv.predict_ttl = cb.kv.predict_ttl = 60s;
  ca.replica = &sync_a;
  cb.replica = &sync_b;
  auto a = rig.make(ca);
  auto b = rig.make(cb);
  ASSERT_TRUE(a && b);
  ASSERT_NO_FATAL_FAILURE(rig.sync({a.get(), b.get()}));
  ASSERT_NO_FATAL_FAILURE(rig.wait_ready(*a));
  ASSERT_NO_FATAL_FAILURE(rig.wait_ready(*b));
  const auto prefix = page_tokens(1, 3);
  TokReq first(concat(prefix, page_tokens(2, 1)));
  Decision d = route(*a, rig.ptrs, first);
  ASSERT_EQ(d.branch, "kv_exact_miss");
  a->on_dispatched(d, first.ctx);
  std::vector<replica::ChainRecord> made = sync_a.take_pending();
  ASSERT_EQ(made.size(), 1U);
  b->apply_peer(made[0]);
  b->apply_peer(made[0]);  // heard twice
  a->apply_peer(made[0]);  // its own, replayed
  // Both count it from origin + settle: a sibling then goes where the first went, on either.
  auto sibling = [&](KvExactPolicy& p, int i) {
    TokReq r(concat(prefix, page_tokens(10 + i, 1)));
    return route(p, rig.ptrs, r);
  };
  ASSERT_TRUE(wait_until([&] {
    return sibling(*a, 0).branch == "kv_exact_hit" && sibling(*b, 0).branch == "kv_exact_hit";
  }));
  EXPECT_EQ(sibling(*a, 1).target_id, d.target_id);
  EXPECT_EQ(sibling(*b, 1).worker, d.worker);
  // It never ran: one retraction, heard by both (by b twice), withdraws it everywhere.
  a->on_completed(d, first.ctx, Outcome{.status = 503, .ok = false, .started = false});
  std::vector<replica::ChainRecord> back = sync_a.take_pending();
  ASSERT_EQ(back.size(), 1U);
  EXPECT_TRUE(back[0].retract);
  b->apply_peer(back[0]);
  b->apply_peer(back[0]);
  EXPECT_EQ(sibling(*a, 2).branch, "kv_exact_miss");
  EXPECT_EQ(sibling(*b, 2).branch, "kv_exact_miss");
  a->stop();
  b->stop();
}

}  // namespace kvgate::testing
