// Several kvgate replicas sharing routing state through NATS (--replica-sync), end to end: Debian's
// nats-server, kvgate-sim servers, and three kvgates in front of them, with a client that sends
// each conversation's turns to a different replica (as a front balancer without affinity does).
// A follow-up turn goes where its conversation is, whichever replica takes it; every replica
// decides every request alike (the route-only endpoint); in-flight load is shared and forgotten
// with a silent peer; a NATS outage leaves the replicas serving (degraded) and they agree again
// once it is back. With JetStream (nats-server -js) a replica started late, or restarted, replays
// the fleet's recent records and routes old conversations where they are; records made during an
// outage reach the peers once NATS is back.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "replica/sync.h"
#include "support/chats.h"
#include "support/cluster.h"
#include "support/http_client.h"
#include "support/nats.h"
#include "support/process.h"
#include "support/temp_dir.h"

namespace kvgate::testing {
namespace {

using namespace std::chrono_literals;

// A NATS server on a loopback port (the test fails, not skips, without it: scripts/setup); with
// JetStream when asked (its store in a directory of the test's own).
struct Replica {
  int port = 0, admin = 0, metrics = 0;
  std::vector<std::string> args;
  std::unique_ptr<Process> process;
  double metric(const std::string& series) {
    Response r = HttpClient(metrics).get("/metrics");
    double total = -1;
    size_t at = 0;
    // The sum of every sample whose name and labels start with `series`.
    while ((at = r.body.find("\n" + series, at)) != std::string::npos) {
      size_t sp = r.body.find(' ', at + 1);
      size_t nl = r.body.find('\n', sp);
      total = (total < 0 ? 0 : total) + std::stod(r.body.substr(sp + 1, nl - sp - 1));
      at = nl;
    }
    return total;
  }
  std::string readiness() { return HttpClient(port).get("/readiness").body; }
  // What this replica would decide for `body`, without sending it.
  std::string route(const std::string& body) {
    Response r = HttpClient(admin).post("/v1/route?path=/v1/chat/completions", body,
                                        {{"content-type", "application/json"}});
    EXPECT_EQ(r.status, 200) << r.body;
    return json_string_field(r.body, "worker") + " " + json_string_field(r.body, "branch");
  }
};

struct Fleet {
  Fleet(int sims_n, int replicas_n, const std::vector<std::string>& extra = {},
        bool jetstream = false)
      : nats(jetstream) {
    for (int i = 0; i < sims_n; ++i) {
      sims.push_back(Sim::launch({"--time-scale", "0", "--enable-cache-report"}));
    }
    for (int i = 0; i < replicas_n; ++i) start_replica(extra);
    for (auto& r : replicas) wait_ready(r);
  }
  // Serving every server, hearing every other replica; with JetStream, the history replayed.
  void wait_ready(Replica& r) {
    const double peers = static_cast<double>(replicas.size()) - 1;
    EXPECT_TRUE(wait_until(
        [&] {
          return json_number_field(r.readiness(), "healthy_workers") ==
                     static_cast<double>(sims.size()) &&
                 r.metric("kvgate_replica_peers") == peers &&
                 (!nats.jetstream ||
                  r.metric("kvgate_replica_sync_replays_total{result=\"ok\"}") >= 1);
        },
        15s))
        << r.readiness() << r.process->log();
  }
  // Replica i dies (SIGKILL: nothing said, nothing flushed) and starts again on its ports.
  void restart(size_t i) {
    Replica& r = replicas[i];
    r.process->kill_now();
    r.process = std::make_unique<Process>("kvgate", r.args);
  }
  void start_replica(const std::vector<std::string>& extra) {
    Replica r;
    r.port = free_port();
    r.admin = free_port();
    r.metrics = free_port();
    std::vector<std::string> args{"--host",
                                  "127.0.0.1",
                                  "--port",
                                  std::to_string(r.port),
                                  "--admin-port",
                                  std::to_string(r.admin),
                                  "--prometheus-host",
                                  "127.0.0.1",
                                  "--prometheus-port",
                                  std::to_string(r.metrics),
                                  "--policy",
                                  "cache_aware",
                                  "--replica-sync",
                                  nats.url(),
                                  "--replica-peer-timeout-ms",
                                  "1500",
                                  "--debug-headers",
                                  "--threads",
                                  "1",
                                  "--health-check-interval-secs",
                                  "1"};
    args.insert(args.end(), extra.begin(), extra.end());
    args.emplace_back("--worker-urls");
    for (auto& s : sims) args.push_back(s.url());
    r.args = args;
    r.process = std::make_unique<Process>("kvgate", args);
    replicas.push_back(std::move(r));
  }
  // Every replica has applied every record its peers published (each dispatch is one record).
  bool synced(double dispatches) {
    double applied = 0;
    for (auto& r : replicas)
      applied += std::max(0.0, r.metric("kvgate_replica_sync_records_total{result=\"applied\"}"));
    return applied >= dispatches * static_cast<double>(replicas.size() - 1);
  }
  Nats nats;
  std::vector<Sim> sims;
  std::vector<Replica> replicas;
};

struct Turn {
  int status = 0;
  std::string worker, route, reply;
  double cached = -1, prompt = -1;
};

Turn send(int port, const std::vector<std::string>& turns) {
  Response r = HttpClient(port).post("/v1/chat/completions", chat_body(turns),
                                     {{"content-type", "application/json"}});
  Turn t;
  t.status = r.status;
  t.worker = r.header("x-kvgate-worker");
  t.route = r.header("x-kvgate-route");
  t.reply = json_string_field(r.body, "content");
  t.cached = json_number_field(r.body, "cached_tokens");
  t.prompt = json_number_field(r.body, "prompt_tokens");
  return t;
}

TEST(Replicas, FollowUpsLandWhereTheirConversationIsWhicheverReplicaTakesThem) {
  Fleet fleet(4, 3);
  constexpr int kConversations = 24, kTurns = 3;
  std::vector<std::vector<std::string>> convs(kConversations);
  std::vector<std::string> home(kConversations);
  double dispatched = 0;
  double follow_ups = 0, followed = 0, cached = 0, prompt = 0;
  for (int t = 0; t < kTurns; ++t) {
    for (int c = 0; c < kConversations; ++c) {
      auto& turns = convs[static_cast<size_t>(c)];
      turns.push_back(turn_message(c, t));
      // The front balancer: turn t of conversation c to replica (c + t) % 3.
      Replica& via = fleet.replicas[static_cast<size_t>((c + t) % 3)];
      Turn got = send(via.port, turns);
      ASSERT_EQ(got.status, 200) << via.process->log();
      turns.push_back(got.reply);
      ++dispatched;
      if (t == 0) {
        home[static_cast<size_t>(c)] = got.worker;
      } else {
        ++follow_ups;
        followed += got.worker == home[static_cast<size_t>(c)];
        EXPECT_EQ(got.route, "cache_aware/cache_hit") << "conversation " << c << " turn " << t;
        cached += got.cached;
        prompt += got.prompt;
      }
      // The records reach every peer before the next request (quiesced, not racing the batch).
      ASSERT_TRUE(wait_until([&] { return fleet.synced(dispatched); }, 5s));
    }
  }
  EXPECT_EQ(followed, follow_ups);
  // The engines confirm it: most of each follow-up's prompt was cached where it went.
  EXPECT_GT(cached / prompt, 0.6) << cached << " / " << prompt;
  // Conversations were spread: every server is home to some.
  std::set<std::string> homes(home.begin(), home.end());
  EXPECT_EQ(homes.size(), fleet.sims.size());

  // Quiesced, every replica decides every request alike: the next turns and new conversations.
  int agreed = 0, asked = 0;
  for (int c = 0; c < kConversations; ++c) {
    for (const auto& body :
         {chat_body(convs[static_cast<size_t>(c)]), chat_body({turn_message(100 + c, 0)})}) {
      const std::string first = fleet.replicas[0].route(body);
      bool same = true;
      for (size_t k = 1; k < fleet.replicas.size(); ++k)
        same = same && fleet.replicas[k].route(body) == first;
      agreed += same;
      ++asked;
    }
  }
  EXPECT_EQ(agreed, asked);
}

TEST(Replicas, InFlightLoadIsSharedAndASilentPeersIsForgotten) {
  Fleet fleet(2, 2);
  // Requests that never end: the workers hold them.
  for (auto& s : fleet.sims) {
    ASSERT_EQ(HttpClient(s.port).post("/sim/faults", R"({"hang_rate":1.0})").status, 200);
  }
  constexpr int kHeld = 4;
  std::vector<std::thread> clients;
  clients.reserve(kHeld);
  const int port = fleet.replicas[0].port;
  for (int i = 0; i < kHeld; ++i) {
    clients.emplace_back([port, i] {
      HttpClient c(port);
      c.set_timeout(20s);
      c.post("/v1/chat/completions", chat_body({turn_message(i, 0)}),
             {{"content-type", "application/json"}});
    });
  }
  Replica& peer = fleet.replicas[1];
  EXPECT_TRUE(wait_until([&] { return peer.metric("kvgate_replica_peer_inflight") == kHeld; }, 5s))
      << peer.metric("kvgate_replica_peer_inflight");
  // The peer dies without a word: after --replica-peer-timeout-ms its load no longer counts.
  fleet.replicas[0].process->kill_now();
  EXPECT_TRUE(wait_until([&] { return peer.metric("kvgate_replica_peer_inflight") == 0; }, 5s));
  EXPECT_TRUE(wait_until([&] { return peer.metric("kvgate_replica_peers") == 0; }, 5s));
  for (auto& c : clients) c.join();
  for (auto& s : fleet.sims) HttpClient(s.port).post("/sim/faults", R"({"hang_rate":0})");
}

TEST(Replicas, ANatsOutageLeavesThemServingAndTheyAgreeAgainWhenItReturns) {
  Fleet fleet(3, 2);
  fleet.nats.stop();
  for (auto& r : fleet.replicas) {
    EXPECT_TRUE(wait_until([&] { return r.metric("kvgate_replica_sync_connected") == 0; }, 10s));
    EXPECT_NE(r.readiness().find("replica_sync_disconnected"), std::string::npos) << r.readiness();
    // Still serving, on their own state.
    EXPECT_EQ(send(r.port, {turn_message(1, 0)}).status, 200);
  }
  fleet.nats.start();
  for (auto& r : fleet.replicas) {
    EXPECT_TRUE(wait_until([&] { return r.metric("kvgate_replica_sync_connected") == 1; }, 15s))
        << r.process->log();
    EXPECT_TRUE(wait_until([&] { return r.metric("kvgate_replica_peers") == 1; }, 10s));
    EXPECT_EQ(r.readiness().find("degraded"), std::string::npos);
  }
  EXPECT_GE(fleet.replicas[0].metric("kvgate_replica_sync_disconnects_total"), 1);
  // Records flow again: a conversation started on one replica continues on the other.
  const std::string applied = "kvgate_replica_sync_records_total{result=\"applied\"}";
  const double before = std::max(0.0, fleet.replicas[1].metric(applied));
  std::vector<std::string> turns{turn_message(7, 0)};
  Turn first = send(fleet.replicas[0].port, turns);
  ASSERT_EQ(first.status, 200);
  turns.push_back(first.reply);
  ASSERT_TRUE(wait_until([&] { return fleet.replicas[1].metric(applied) > before; }, 5s));
  turns.push_back(turn_message(7, 1));
  Turn second = send(fleet.replicas[1].port, turns);
  EXPECT_EQ(second.worker, first.worker);
  EXPECT_EQ(second.route, "cache_aware/cache_hit");
  // A server without JetStream: no history, said and counted, and nothing else changes.
  for (auto& r : fleet.replicas) {
    // (Said once the history thread has tried the stream twice, a moment after connecting.)
    EXPECT_TRUE(wait_until(
        [&] { return r.metric("kvgate_replica_sync_replays_total{result=\"unavailable\"}") >= 1; },
        10s));
    EXPECT_EQ(r.metric("kvgate_replica_sync_history"), 0);
    EXPECT_NE(r.readiness().find("\"history\":false"), std::string::npos) << r.readiness();
  }
}

// The first turns of conversations first, first + 1, ..., taken by the replicas `via` in turn.
struct Served {
  int first = 0;
  std::vector<std::vector<std::string>> turns;
  std::vector<std::string> home;  // the worker each went to
};

Served serve_first_turns(Fleet& fleet, const std::vector<size_t>& via, int first, int n) {
  Served s;
  s.first = first;
  for (int c = 0; c < n; ++c) {
    std::vector<std::string> turns{turn_message(first + c, 0)};
    Replica& r = fleet.replicas[via[static_cast<size_t>(c) % via.size()]];
    Turn got = send(r.port, turns);
    EXPECT_EQ(got.status, 200) << r.process->log();
    turns.push_back(got.reply);
    s.turns.push_back(std::move(turns));
    s.home.push_back(got.worker);
  }
  return s;
}

// Every conversation's second turn, taken by `r`, goes where its first went, as a cache hit.
void expect_follow_ups_at_home(Replica& r, Served& s) {
  for (size_t c = 0; c < s.turns.size(); ++c) {
    s.turns[c].push_back(turn_message(s.first + static_cast<int>(c), 1));
    Turn got = send(r.port, s.turns[c]);
    ASSERT_EQ(got.status, 200) << r.process->log();
    EXPECT_EQ(got.worker, s.home[c]) << "conversation " << c;
    EXPECT_EQ(got.route, "cache_aware/cache_hit") << "conversation " << c;
  }
}

// Records a replica holds from its peers: heard live, and replayed from the history.
double held(Replica& r) {
  return std::max(0.0, r.metric("kvgate_replica_sync_records_total{result=\"applied\"}")) +
         std::max(0.0, r.metric("kvgate_replica_sync_replayed_records_total"));
}

TEST(Replicas, AReplicaStartedLateReplaysTheHistoryAndFindsOldConversations) {
  Fleet fleet(4, 2, {}, /*jetstream=*/true);
  for (auto& r : fleet.replicas) EXPECT_EQ(r.metric("kvgate_replica_sync_history"), 1);
  constexpr int kConversations = 12;
  Served served = serve_first_turns(fleet, {0, 1}, 0, kConversations);
  ASSERT_TRUE(wait_until([&] { return fleet.synced(kConversations); }, 5s));
  // A third replica comes: it heard none of it live.
  fleet.start_replica({});
  Replica& late = fleet.replicas.back();
  fleet.wait_ready(late);
  EXPECT_GE(late.metric("kvgate_replica_sync_replayed_records_total"), kConversations);
  EXPECT_LE(late.metric("kvgate_replica_sync_records_total{result=\"applied\"}"), 0);
  EXPECT_NE(late.readiness().find("\"history\":true"), std::string::npos) << late.readiness();
  expect_follow_ups_at_home(late, served);
}

TEST(Replicas, AReplicaRestartedReplaysTheHistoryAndFindsOldConversations) {
  Fleet fleet(4, 2, {}, /*jetstream=*/true);
  constexpr int kConversations = 12;
  Served served = serve_first_turns(fleet, {0, 1}, 0, kConversations);
  ASSERT_TRUE(wait_until([&] { return fleet.synced(kConversations); }, 5s));
  // Replica 0 dies and comes back on its ports, knowing nothing: half of the records were its own.
  fleet.restart(0);
  fleet.wait_ready(fleet.replicas[0]);
  EXPECT_GE(fleet.replicas[0].metric("kvgate_replica_sync_replayed_records_total"), kConversations);
  expect_follow_ups_at_home(fleet.replicas[0], served);
}

TEST(Replicas, RecordsMadeDuringANatsOutageReachThePeersOnceItIsBack) {
  Fleet fleet(3, 2, {}, /*jetstream=*/true);
  Replica& a = fleet.replicas[0];
  Replica& b = fleet.replicas[1];
  fleet.nats.stop();
  for (auto& r : fleet.replicas) {
    EXPECT_TRUE(wait_until([&] { return r.metric("kvgate_replica_sync_connected") == 0; }, 10s));
  }
  // A alone serves new conversations, on its own state: B hears nothing of them yet.
  constexpr int kConversations = 6;
  const double before = held(b);
  Served served = serve_first_turns(fleet, {0}, 50, kConversations);
  // NATS comes back (a new server: its memory stream is gone); A's records reach B, live or
  // through the history, whichever replica reconnects first.
  fleet.nats.start();
  for (auto& r : fleet.replicas) {
    EXPECT_TRUE(wait_until(
        [&] {
          return r.metric("kvgate_replica_sync_connected") == 1 &&
                 r.metric("kvgate_replica_sync_history") == 1;
        },
        15s))
        << r.process->log();
  }
  ASSERT_TRUE(wait_until([&] { return held(b) >= before + kConversations; }, 10s))
      << held(b) << " " << before << "\n"
      << a.process->log() << b.process->log();
  expect_follow_ups_at_home(b, served);
}

// replica::Sync itself against a JetStream server: a history of many messages (the ordered
// consumer's flow control) is replayed in full, to the sink it is owed to alone; a replica's own
// messages are not replayed to it; a rule with no records gets none.
TEST(Replicas, AReplayOfManyMessagesCatchesUpAndReachesOnlyTheSinkItIsOwedTo) {
  Nats nats(/*jetstream=*/true);
  auto config = [&](const std::string& name) {
    replica::SyncConfig c;
    c.url = nats.url();
    c.name = name;
    c.history = std::chrono::seconds(120);
    c.batch_records = 16;  // many small messages
    c.replay_timeout = 10s;
    return c;
  };
  metrics::Registry registry;  // a's
  replica::Sync a(config("a"), &registry), live(config("live"), nullptr);
  ASSERT_EQ(a.start(), "");
  ASSERT_EQ(live.start(), "");
  std::atomic<int> heard{0};
  live.add_sink("default", [&](const replica::ChainRecord&) { ++heard; });
  ASSERT_TRUE(wait_until([&] { return a.history() && live.history(); }, 10s));
  constexpr int kRecords = 20000;  // 1,250 messages, ~6 MB
  for (int i = 0; i < kRecords; ++i) {
    replica::ChainRecord r{.rule = "default",
                           .worker = static_cast<uint64_t>(i % 7),
                           .origin_us = replica::Sync::now_us(),
                           .chunk_bytes = 64};
    for (uint64_t h = 0; h < 32; ++h) r.hashes.push_back(static_cast<uint64_t>(i) * 64 + h);
    a.publish(std::move(r));
  }
  ASSERT_TRUE(wait_until([&] { return heard.load() == kRecords; }, 20s)) << heard.load();

  replica::Sync b(config("b"), nullptr);
  ASSERT_EQ(b.start(), "");
  std::atomic<int> first{0}, second{0}, other{0}, own{0};
  b.add_sink("default", [&](const replica::ChainRecord&) { ++first; });
  b.add_sink("other", [&](const replica::ChainRecord&) { ++other; });
  ASSERT_TRUE(wait_until([&] { return first.load() == kRecords; }, 15s)) << first.load();
  // A sink added later is owed the history too; the first is not given it twice.
  b.add_sink("default", [&](const replica::ChainRecord&) { ++second; });
  ASSERT_TRUE(wait_until([&] { return second.load() == kRecords; }, 15s)) << second.load();
  EXPECT_EQ(first.load(), kRecords);
  EXPECT_EQ(other.load(), 0);
  // The sender's own records are replayed to a sink of its own added later (a rule's policy
  // built again): it has none of what this replica routed before.
  const std::string ok = "kvgate_replica_sync_replays_total{result=\"ok\"} ";
  auto replays_ok = [&] {
    const std::string text = registry.expose();
    const size_t at = text.find(ok);
    return at == std::string::npos ? 0.0 : std::stod(text.substr(at + ok.size()));
  };
  const double before = replays_ok();
  a.add_sink("default", [&](const replica::ChainRecord&) { ++own; });
  ASSERT_TRUE(wait_until([&] { return replays_ok() > before; }, 15s));
  EXPECT_EQ(own.load(), kRecords);
}

// A sink deciding on the fleet's shared state (kv_exact) hears this replica's own records and
// load as NATS echoes them, when the peers hear them; other sinks never hear their own.
TEST(Replicas, OwnRecordsAndLoadComeBackToTheSinksThatAskAsThePeersHearThem) {
  Nats nats;
  auto config = [&](const std::string& name) {
    replica::SyncConfig c;
    c.url = nats.url();
    c.name = name;
    return c;
  };
  replica::Sync a(config("a"), nullptr), b(config("b"), nullptr);
  ASSERT_EQ(a.start(), "");
  ASSERT_EQ(b.start(), "");
  std::atomic<int> own{0}, plain{0}, peer{0};
  a.add_sink(
      "default", [&](const replica::ChainRecord&) { ++own; }, /*own=*/true);
  a.add_sink("default", [&](const replica::ChainRecord&) { ++plain; });
  b.add_sink("default", [&](const replica::ChainRecord&) { ++peer; });
  std::atomic<int64_t> active{3};
  std::mutex mu;
  std::map<std::string, replica::Sync::RankLoad> heard;  // "own" / "peer" -> figures (rank 1)
  a.add_rank_load(
      [&](std::vector<replica::LoadEntry>& out) {
        out.push_back({.worker = 7, .rank = 1, .inflight = active.load(), .prefill_tokens = 40});
      },
      [](uint64_t, int32_t, replica::Sync::RankLoad) {},
      [&](uint64_t worker, int32_t rank, replica::Sync::RankLoad l) {
        std::lock_guard lock(mu);
        if (worker == 7 && rank == 1) heard["own"] = l;
      });
  b.add_rank_load([](std::vector<replica::LoadEntry>&) {},
                  [&](uint64_t worker, int32_t rank, replica::Sync::RankLoad l) {
                    std::lock_guard lock(mu);
                    if (worker == 7 && rank == 1) heard["peer"] = l;
                  });
  auto figures = [&](const std::string& who) {
    std::lock_guard lock(mu);
    return heard[who];
  };
  ASSERT_TRUE(wait_until([&] { return a.connected() && b.connected(); }, 10s));
  for (int i = 0; i < 3; ++i) {
    a.publish(replica::ChainRecord{
        .rule = "default", .worker = 7, .origin_us = replica::Sync::now_us(), .hashes = {1, 2}});
  }
  ASSERT_TRUE(wait_until([&] { return own.load() == 3 && peer.load() == 3; }, 10s))
      << own.load() << " " << peer.load();
  EXPECT_EQ(plain.load(), 0);
  const replica::Sync::RankLoad first{3, 40};
  ASSERT_TRUE(wait_until([&] { return figures("own") == first && figures("peer") == first; }, 10s));
  EXPECT_EQ(a.own_rank_load(7, 1), first);
  active = 5;  // a change is heard by both alike
  const replica::Sync::RankLoad second{5, 40};
  ASSERT_TRUE(
      wait_until([&] { return figures("own") == second && figures("peer") == second; }, 10s));
  // Its own echo does not make a replica its own peer (b is heard within its 1 s heartbeat).
  ASSERT_TRUE(wait_until([&] { return a.peers() == 1; }, 10s));
  EXPECT_EQ(a.peers(), 1U);
}

}  // namespace
}  // namespace kvgate::testing
