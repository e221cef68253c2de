// Every policy decides with the pool's availability index (RouteContext::candidates: lookups by
// id and in-flight figures without a scan) as it decides by scanning the list: two instances of
// a policy, one given the index and one a plain copy of the list, see the same requests, loads
// and health changes; each decision must take the same branch, and where the workers differ it
// must be a tie the policy breaks at random (the same load, the same predicted prefix) or a
// branch that is a random choice by definition. Both instances then hear the same dispatch.
#include <gtest/gtest.h>

#include <deque>
#include <iostream>
#include <random>
#include <set>

#include "gateway/knobs.h"
#include "policy/registry.h"

namespace kvgate {
namespace {

struct Request {
  RequestInfo info;
  std::string key;
  static std::string_view header(const void* self, std::string_view name) {
    const auto* r = static_cast<const Request*>(self);
    return name == "x-smg-routing-key" ? std::string_view(r->key) : std::string_view();
  }
  RouteContext ctx() const {
    RouteContext c;
    c.request = &info;
    c.header_fn = &Request::header;
    c.header_self = this;
    return c;
  }
};

std::unique_ptr<Policy> make(const std::string& name, const WorkerSet& set) {
  PolicyConfig c = policy_config(GatewayConfig{});
  c.seed = 3;
  c.name = name;
  if (name.starts_with("dp_aware:")) {
    c.name = name.substr(9);
    c.dp_aware = true;
    c.dp_default_ranks = 2;
  }
  if (name.starts_with("kv_exact:")) {
    c.name = name.substr(9);
    c.kv.enabled = true;
    c.kv.page_size = 4;
    c.kv.dp_ranks = 1;
    c.kv.zmq_port = 1;
    c.kv.warmup = std::chrono::seconds(3600);
    c.kv.parity_probe = false;
  }
  if (name == "manual_min_load") {
    c.name = "manual";
    c.manual_assignment_mode = "min_load";
  }
  c.balance_abs_threshold = 2;  // imbalance within reach of a few dozen requests
  c.balance_rel_threshold = 1.5;
  std::string err;
  auto p = make_policy(c, err);
  EXPECT_TRUE(p) << name << ": " << err;
  if (p) p->on_workers_changed(set);
  return p;
}

// Branches whose choice is a random one by definition (no load or prefix decides it).
bool random_branch(std::string_view b) {
  return b == "random" || b == "no_routing_key" || b == "vacant";
}

// Branches that choose the least loaded available worker (random among equals).
bool by_inflight(const std::string& policy, std::string_view b) {
  if (policy.starts_with("dp_aware:")) return false;  // the ranks' loads
  if (policy == "manual_min_load") return b == "vacant" || b == "occupied_miss";
  if (policy == "bucket") return b == "band_unavailable";
  return b == "cache_miss_min_load" || b == "no_text" || b == "no_owner" || b == "no_ring" ||
         b == "all_full" || (policy.ends_with("cache_aware") && b == "imbalanced");
}

class IndexedSelect : public ::testing::TestWithParam<std::string> {};

TEST_P(IndexedSelect, DecidesAsTheScanDoes) {
  auto set = std::make_shared<WorkerSet>();
  for (int i = 0; i < 12; ++i) {
    http::Target t;
    http::parse_url("http://127.0.0.1:" + std::to_string(43000 + i), t);
    auto w = std::make_shared<Worker>(i + 1, t, breaker_config(GatewayConfig{}));
    w->set_healthy(true);
    set->workers.push_back(std::move(w));
  }
  AvailabilityIndex index(set);
  auto indexed = make(GetParam(), *set);
  auto scanning = make(GetParam(), *set);
  ASSERT_TRUE(indexed && scanning);

  std::vector<std::unique_ptr<Request>> requests;
  for (int i = 0; i < 40; ++i) {
    auto r = std::make_unique<Request>();
    r->info.model = "m";
    r->info.first_user_message = "conversation " + std::to_string(i % 10);
    r->info.text = "system prompt. " + r->info.first_user_message;
    for (int k = 0; k < i % 4; ++k) r->info.text += " and turn " + std::to_string(k);
    for (int k = 0; k < 12; ++k) r->info.tokens.push_back(i % 10 * 100 + k);
    r->key = i % 3 == 0 ? "" : "user-" + std::to_string(i % 7);
    requests.push_back(std::move(r));
  }

  struct Open {
    Decision d;
    Request* r;
  };
  std::deque<Open> open;
  std::mt19937 rng(9);
  CandidateList candidates;
  std::map<std::string, int> branches;
  bool diverged = false;
  for (int step = 0; step < 2000; ++step) {
    if (rng() % 50 == 0) {
      set->workers[rng() % set->workers.size()]->set_healthy(rng() % 4 != 0);
    }
    candidates.list(index, {}, Clock::now());
    if (candidates.empty()) continue;
    std::vector<Worker*> copy(candidates.workers().begin(), candidates.workers().end());
    Request& r = *requests[rng() % requests.size()];
    RouteContext a = r.ctx();
    a.candidates = candidates.view();
    ASSERT_TRUE(a.candidates.describes(candidates.workers()));
    RouteContext b = r.ctx();
    Decision da = indexed->select(candidates.workers(), a);
    Decision db = scanning->select(copy, b);
    ASSERT_TRUE(da.worker && db.worker) << "step " << step;
    ASSERT_NE(std::find(copy.begin(), copy.end(), da.worker), copy.end())
        << "an unavailable worker, step " << step;
    ++branches[std::string(da.branch)];
    int64_t least = INT64_MAX;
    for (Worker* w : copy) least = std::min(least, w->inflight());
    if (by_inflight(GetParam(), da.branch)) {
      EXPECT_EQ(da.worker->inflight(), least) << da.branch << ", step " << step;
    }
    if (diverged) continue;  // manual placed a key elsewhere: its table differs from here on
    ASSERT_EQ(da.branch, db.branch) << "step " << step;
    // bucket's imbalance picks among the fewest characters in the window, not the least load;
    // dp_aware's inner policy compares the ranks' loads, not the workers'.
    const bool by_chars = GetParam() == "bucket" && da.branch == "imbalanced";
    const bool by_rank = GetParam().starts_with("dp_aware:");
    if (da.worker != db.worker && !random_branch(da.branch) && !by_chars && !by_rank) {
      EXPECT_EQ(da.worker->inflight(), db.worker->inflight())
          << "not a tie: " << da.branch << ", step " << step;
    }
    if (da.worker != db.worker && da.branch == "cache_hit") {
      // Every worker tied for the longest match holds as much of it.
      EXPECT_EQ(da.predicted_chars, db.predicted_chars) << da.branch << ", step " << step;
    } else if (da.worker == db.worker && !by_rank) {
      EXPECT_EQ(da.predicted_chars, db.predicted_chars) << da.branch << ", step " << step;
      EXPECT_EQ(da.dp_rank, db.dp_rank) << da.branch << ", step " << step;
    }
    // manual records a placement in select(): a tie placed apart makes the tables differ.
    diverged = GetParam().starts_with("manual") && da.worker != db.worker &&
               (da.branch == "vacant" || da.branch == "occupied_miss");
    // Both hear the indexed decision, and it stays in flight a while.
    RouteContext ctx = r.ctx();
    indexed->on_dispatched(da, ctx);
    scanning->on_dispatched(da, ctx);
    da.worker->begin_request();
    open.push_back({da, &r});
    while (open.size() > rng() % 24) {
      Open o = open.front();
      open.pop_front();
      RouteContext c = o.r->ctx();
      Outcome out{.status = 200, .ok = true};
      indexed->on_completed(o.d, c, out);
      scanning->on_completed(o.d, c, out);
      o.d.worker->end_request();
    }
  }
  for (const Open& o : open) {
    RouteContext c = o.r->ctx();
    indexed->on_completed(o.d, c, Outcome{.status = 200, .ok = true});
    scanning->on_completed(o.d, c, Outcome{.status = 200, .ok = true});
    o.d.worker->end_request();
  }
  std::string seen;
  for (const auto& [b, n] : branches) seen += b + "=" + std::to_string(n) + " ";
  std::cout << GetParam() << ": " << seen << "\n";
  indexed->stop();
  scanning->stop();
}

INSTANTIATE_TEST_SUITE_P(EveryPolicy, IndexedSelect,
                         ::testing::Values("round_robin", "random", "power_of_two", "cache_aware",
                                           "prefix_hash", "consistent_hashing", "chwbl", "bucket",
                                           "manual", "manual_min_load", "kv_exact:round_robin",
                                           "kv_exact:cache_aware", "dp_aware:cache_aware",
                                           "dp_aware:round_robin", "dp_aware:chwbl"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), ':', '_');
                           return n;
                         });

}  // namespace
}  // namespace kvgate
