// Discovery against the real servers Debian ships: dnsmasq for DNS (A/AAAA, SRV, records added
// and removed with a SIGHUP) and etcd 3.4 through its JSON gateway (range, put, watch, leases,
// `kvgate register`, a restart). Every server runs on loopback ports of its own, per test; tests
// wait for conditions with deadlines, never for fixed times.
#include <gtest/gtest.h>
#include <pwd.h>
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "discovery/dns.h"
#include "discovery/etcd.h"
#include "support/cluster.h"
#include "support/http_client.h"
#include "support/nats.h"
#include "support/process.h"
#include "support/temp_dir.h"

namespace kvgate::testing {
namespace {

using namespace std::chrono_literals;
using namespace kvgate::discovery;
using Clock = std::chrono::steady_clock;

constexpr const char* kDnsmasq = "/usr/sbin/dnsmasq";
constexpr const char* kEtcd = "/usr/bin/etcd";

// What a watcher reported, in order, with when.
template <class T>
class Reports {
 public:
  void add(T v) {
    std::lock_guard lock(mu_);
    all_.push_back(std::move(v));
    at_.push_back(Clock::now());
  }
  size_t count() {
    std::lock_guard lock(mu_);
    return all_.size();
  }
  std::optional<T> last() {
    std::lock_guard lock(mu_);
    if (all_.empty()) return std::nullopt;
    return all_.back();
  }
  Clock::time_point last_at() {
    std::lock_guard lock(mu_);
    return at_.back();
  }
  std::vector<T> all() {
    std::lock_guard lock(mu_);
    return all_;
  }
  // Waits until the last report satisfies `pred`.
  bool wait_last(const std::function<bool(const T&)>& pred, std::chrono::milliseconds timeout) {
    return wait_until(
        [&] {
          auto l = last();
          return l && pred(*l);
        },
        timeout);
  }

 private:
  std::mutex mu_;
  std::vector<T> all_;
  std::vector<Clock::time_point> at_;
};

// ---------------------------------------------------------------------------------------------
// DNS

// dnsmasq on a loopback port of its own, answering only from its hosts file and its flags: names
// under kvgate.test it does not know get NXDOMAIN (--local), with a 1 s TTL for the rest.
class Dnsmasq {
 public:
  // `hosts`: the hosts file's first text (written before the start: a SIGHUP before dnsmasq set
  // its handler would kill it).
  Dnsmasq(const TempDir& dir, const std::string& hosts, std::vector<std::string> extra = {})
      : dir_(dir), port_(free_port()) {
    hosts_ = dir_.write("hosts", hosts);
    std::vector<std::string> args = {"--no-daemon",
                                     "--keep-in-foreground",
                                     "--port=" + std::to_string(port_),
                                     "--listen-address=127.0.0.1",
                                     "--bind-interfaces",
                                     "--no-resolv",
                                     "--no-hosts",
                                     "--conf-file=/dev/null",
                                     "--pid-file=" + dir_ / "dnsmasq.pid",
                                     "--addn-hosts=" + hosts_,
                                     "--local=/kvgate.test/",
                                     "--local-ttl=1",
                                     "--host-record=ready.kvgate.test,127.0.0.1"};
    // Started as root it would switch to "nobody", who cannot read the test's private directory
    // when SIGHUP makes it read the hosts file again: it stays the user it is.
    if (const passwd* pw = ::getpwuid(::geteuid()))
      args.push_back(std::string("--user=") + pw->pw_name);
    args.insert(args.end(), extra.begin(), extra.end());
    process_ = std::make_unique<Process>(kDnsmasq, args);
  }
  // Whether it answers (its ready.kvgate.test record).
  bool wait_ready() {
    DnsTarget t;
    if (!parse_dns_uri(uri("ready.kvgate.test:1"), t).empty()) return false;
    return wait_until([&] { return resolve_dns(t).status == DnsResult::kOk; }, 10s);
  }
  std::string uri(const std::string& name, const std::string& more = "") const {
    return "dns://" + name + "?server=127.0.0.1:" + std::to_string(port_) + more;
  }
  DnsTarget target(const std::string& name, const std::string& more = "") const {
    DnsTarget t;
    EXPECT_EQ(parse_dns_uri(uri(name, more), t), "");
    return t;
  }
  // Replaces the hosts file and makes dnsmasq read it again (SIGHUP; after wait_ready()).
  void set_hosts(const std::string& text) {
    dir_.write("hosts", text);
    ::kill(process_->pid(), SIGHUP);
  }
  void stop() { process_->stop(); }
  std::string log() const { return process_->log(); }

 private:
  const TempDir& dir_;
  int port_;
  std::string hosts_;
  std::unique_ptr<Process> process_;
};

class DiscoveryDns : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(kDnsmasq))
        << kDnsmasq << " is missing: run scripts/setup (it installs dnsmasq-base)";
  }
  TempDir dir_;
};

TEST_F(DiscoveryDns, AddressRecordsBecomeUrls) {
  Dnsmasq dns(dir_, "127.0.0.12 w.kvgate.test\n127.0.0.11 w.kvgate.test\n::1 w.kvgate.test\n");
  ASSERT_TRUE(dns.wait_ready()) << dns.log();
  DnsTarget t = dns.target("w.kvgate.test:8000");
  DnsResult r;
  ASSERT_TRUE(wait_until([&] {
    r = resolve_dns(t);
    return r.urls.size() == 3;
  })) << r.error;
  EXPECT_EQ(r.status, DnsResult::kOk);
  EXPECT_EQ(r.urls, (std::vector<std::string>{"http://127.0.0.11:8000", "http://127.0.0.12:8000",
                                              "http://[::1]:8000"}));
  EXPECT_EQ(r.ttl_secs, 1u);
  // https workers, and a name nobody registered.
  r = resolve_dns(dns.target("w.kvgate.test:443", "&scheme=https"));
  ASSERT_EQ(r.status, DnsResult::kOk) << r.error;
  EXPECT_EQ(r.urls.front(), "https://127.0.0.11:443");
  r = resolve_dns(dns.target("nobody.kvgate.test:8000"));
  EXPECT_EQ(r.status, DnsResult::kEmpty) << r.error;
}

TEST_F(DiscoveryDns, SrvRecordsGiveTargetsWithTheirPorts) {
  Dnsmasq dns(
      dir_, "127.0.0.23 t3.kvgate.test\n",
      {"--host-record=t1.kvgate.test,127.0.0.21", "--host-record=t2.kvgate.test,127.0.0.22,::2",
       "--srv-host=_sgl._tcp.kvgate.test,t1.kvgate.test,8001",
       "--srv-host=_sgl._tcp.kvgate.test,t2.kvgate.test,8002",
       "--srv-host=_sgl._tcp.kvgate.test,t3.kvgate.test,8003"});
  ASSERT_TRUE(dns.wait_ready()) << dns.log();
  DnsResult r;
  ASSERT_TRUE(wait_until([&] {
    r = resolve_dns(dns.target("_sgl._tcp.kvgate.test"));
    return r.urls.size() == 4;
  })) << r.error;
  EXPECT_EQ(r.urls, (std::vector<std::string>{"http://127.0.0.21:8001", "http://127.0.0.22:8002",
                                              "http://127.0.0.23:8003", "http://[::2]:8002"}));
  EXPECT_EQ(resolve_dns(dns.target("_none._tcp.kvgate.test")).status, DnsResult::kEmpty);
}

TEST_F(DiscoveryDns, WatcherSeesAnAddedRecordAndDrainsARemovedNameAfterThreeEmptyAnswers) {
  Dnsmasq dns(dir_, "127.0.0.31 pool.kvgate.test\n");
  ASSERT_TRUE(dns.wait_ready()) << dns.log();
  Reports<std::vector<std::string>> seen;
  std::atomic<uint64_t> empties_when_drained{0};
  std::unique_ptr<DnsWatcher> w;
  w = std::make_unique<DnsWatcher>(
      dns.target("pool.kvgate.test:9000"),
      DnsWatcher::Options{.min_interval = 100ms, .max_interval = 200ms, .empty_drain_after = 3},
      [&](std::vector<std::string> urls) {
        if (urls.empty()) empties_when_drained = w->stats().empty_answers.load();
        seen.add(std::move(urls));
      });
  w->start();
  ASSERT_TRUE(seen.wait_last([](auto& u) { return u.size() == 1; }, 5s));
  EXPECT_EQ(seen.last()->front(), "http://127.0.0.31:9000");

  // Added: the next re-resolve after dnsmasq reloaded (interval 0.1-0.2 s) reports it.
  dns.set_hosts("127.0.0.31 pool.kvgate.test\n127.0.0.32 pool.kvgate.test\n");
  ASSERT_TRUE(seen.wait_last([](auto& u) { return u.size() == 2; }, 3s));
  EXPECT_EQ(*seen.last(),
            (std::vector<std::string>{"http://127.0.0.31:9000", "http://127.0.0.32:9000"}));

  // Removed: NXDOMAIN from then on, and the set is emptied at the third one in a row.
  size_t before = seen.count();
  dns.set_hosts("");
  ASSERT_TRUE(seen.wait_last([](auto& u) { return u.empty(); }, 5s));
  EXPECT_EQ(empties_when_drained.load(), 3u);
  EXPECT_EQ(seen.count(), before + 1) << "nothing between the full set and the empty one";
  w->stop();
  EXPECT_EQ(w->stats().errors.load(), 0u);
}

TEST_F(DiscoveryDns, AnUnreachableNameserverKeepsTheLastSet) {
  Dnsmasq dns(dir_, "127.0.0.41 keep.kvgate.test\n");
  ASSERT_TRUE(dns.wait_ready()) << dns.log();
  Reports<std::vector<std::string>> seen;
  DnsWatcher w(dns.target("keep.kvgate.test:9000"),
               {.min_interval = 50ms, .max_interval = 100ms, .empty_drain_after = 3},
               [&](std::vector<std::string> urls) { seen.add(std::move(urls)); });
  w.start();
  ASSERT_TRUE(seen.wait_last([](auto& u) { return u.size() == 1; }, 5s));
  dns.stop();
  ASSERT_TRUE(wait_until([&] { return w.stats().errors.load() >= 3; }, 30s));
  w.stop();
  EXPECT_EQ(seen.count(), 1u);
  EXPECT_EQ(seen.last()->size(), 1u);
}

// ---------------------------------------------------------------------------------------------
// etcd

// One etcd member on loopback ports of its own, with its data in `dir`; restartable.
class Etcd {
 public:
  explicit Etcd(const TempDir& dir)
      : data_(dir / "etcd"), client_port_(free_port()), peer_port_(free_port()) {}
  ~Etcd() { stop(); }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(client_port_); }
  int port() const { return client_port_; }
  // Starts it and waits until it answers a range.
  bool start() {
    std::string peer = "http://127.0.0.1:" + std::to_string(peer_port_);
    process_ = std::make_unique<Process>(
        kEtcd,
        std::vector<std::string>{"--name", "kvgate-test", "--data-dir", data_,
                                 "--listen-client-urls", url(), "--advertise-client-urls", url(),
                                 "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                                 "--initial-cluster", "kvgate-test=" + peer});
    EtcdClient c(url(), EtcdClient::Options{.timeout = 500ms});
    return wait_until(
        [&] {
          EtcdRange r;
          return c.range("/", r).empty();
        },
        20s);
  }
  void stop() {
    if (process_) process_->stop();
    process_.reset();
  }
  std::string log() const { return process_ ? process_->log() : ""; }

 private:
  std::string data_;
  int client_port_;
  int peer_port_;
  std::unique_ptr<Process> process_;
};

class DiscoveryEtcd : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(kEtcd))
        << kEtcd << " is missing: run scripts/setup (it installs etcd-server)";
    etcd_ = std::make_unique<Etcd>(dir_);
    ASSERT_TRUE(etcd_->start()) << etcd_->log();
  }
  std::string record(const std::string& url) {
    WorkerRecord r;
    r.url = url;
    return serialize_worker_record(r);
  }
  // The worker keys under the prefix now.
  std::vector<EtcdKeyValue> keys(const std::string& prefix = std::string(kWorkersPrefix)) {
    EtcdClient c(etcd_->url());
    EtcdRange r;
    EXPECT_EQ(c.range(prefix, r), "");
    return r.kvs;
  }
  TempDir dir_;
  std::unique_ptr<Etcd> etcd_;
};

TEST_F(DiscoveryEtcd, ClientRangePutDeleteLeasesAndWatch) {
  EtcdClient c(etcd_->url());
  ASSERT_EQ(c.put("/kvgate/v1/workers/m/a", "va"), "");
  ASSERT_EQ(c.put("/kvgate/v1/workers/m/b", std::string("v\0b\xff", 4)), "");
  ASSERT_EQ(c.put("/kvgate/v1/workersX", "outside the prefix"), "");
  EtcdRange r;
  ASSERT_EQ(c.range("/kvgate/v1/workers/", r), "");
  ASSERT_EQ(r.kvs.size(), 2u);
  EXPECT_EQ(r.kvs[0].key, "/kvgate/v1/workers/m/a");
  EXPECT_EQ(r.kvs[0].value, "va");
  EXPECT_EQ(r.kvs[1].value, std::string("v\0b\xff", 4));
  EXPECT_GT(r.revision, 0);
  EXPECT_EQ(r.kvs[1].mod_revision, r.revision - 1);

  int64_t lease = 0, ttl = 0;
  ASSERT_EQ(c.lease_grant(30, lease), "");
  EXPECT_NE(lease, 0);
  ASSERT_EQ(c.put("/kvgate/v1/workers/m/c", "vc", lease), "");
  ASSERT_EQ(c.lease_keepalive(lease, ttl), "");
  EXPECT_EQ(ttl, 30);
  ASSERT_EQ(c.range("/kvgate/v1/workers/m/c", r), "");
  ASSERT_EQ(r.kvs.size(), 1u);
  EXPECT_EQ(r.kvs[0].lease, lease);
  ASSERT_EQ(c.lease_revoke(lease), "");
  ASSERT_EQ(c.lease_keepalive(lease, ttl), "");
  EXPECT_EQ(ttl, 0) << "a revoked lease is gone";
  ASSERT_EQ(c.range("/kvgate/v1/workers/m/c", r), "");
  EXPECT_TRUE(r.kvs.empty()) << "its key went with it";
  EXPECT_NE(c.lease_revoke(lease).find("lease not found"), std::string::npos);

  // A watch from the current revision sees a put and a delete, in order.
  ASSERT_EQ(c.range("/kvgate/v1/workers/", r), "");
  std::mutex mu;
  std::vector<EtcdWatchEvent> events;  // guarded by mu
  std::atomic<bool> created{false}, ended{false};
  std::string watch_error;  // written by the thread before `ended`
  EtcdClient watcher(etcd_->url());
  std::thread t([&] {
    watch_error = watcher.watch("/kvgate/v1/workers/", r.revision + 1, [&](const auto& m) {
      if (m.created) created = true;
      std::lock_guard lock(mu);
      events.insert(events.end(), m.events.begin(), m.events.end());
      return events.size() < 2;
    });
    ended = true;
  });
  ASSERT_TRUE(wait_until([&] { return created.load(); }));
  ASSERT_EQ(c.put("/kvgate/v1/workers/m/d", "vd"), "");
  ASSERT_EQ(c.delete_key("/kvgate/v1/workers/m/a"), "");
  if (!wait_until([&] { return ended.load(); }, 5s)) watcher.interrupt();
  t.join();
  EXPECT_EQ(watch_error, "");
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].type, EtcdWatchEvent::Type::kPut);
  EXPECT_EQ(events[0].kv.key, "/kvgate/v1/workers/m/d");
  EXPECT_EQ(events[0].kv.value, "vd");
  EXPECT_EQ(events[1].type, EtcdWatchEvent::Type::kDelete);
  EXPECT_EQ(events[1].kv.key, "/kvgate/v1/workers/m/a");

  // A watch from a compacted revision is canceled with the compaction's revision.
  ASSERT_EQ(c.range("/", r), "");
  HttpClient http(etcd_->port());
  Response compacted =
      http.post("/v3/kv/compaction", R"({"revision":")" + std::to_string(r.revision) + R"("})");
  ASSERT_EQ(compacted.status, 200) << compacted.body;
  EtcdWatchMessage cancel;
  watch_error = c.watch("/kvgate/v1/workers/", 2, [&](const auto& m) {
    cancel = m;
    return !m.canceled;
  });
  EXPECT_EQ(watch_error, "");
  EXPECT_TRUE(cancel.canceled);
  EXPECT_EQ(cancel.compact_revision, r.revision);

  // An interrupt ends a watch waiting for events.
  EtcdClient idle(etcd_->url());
  created = false;
  std::thread waiter([&] {
    watch_error = idle.watch("/nothing/", 0, [&](const auto& m) {
      if (m.created) created = true;
      return true;
    });
  });
  EXPECT_TRUE(wait_until([&] { return created.load(); }));
  auto t0 = Clock::now();
  idle.interrupt();
  waiter.join();
  EXPECT_LT(Clock::now() - t0, 1s);
  EXPECT_EQ(watch_error, "interrupted");
}

TEST_F(DiscoveryEtcd, WatcherReportsPutsAndDeletesWithinHalfASecond) {
  EtcdClient c(etcd_->url());
  ASSERT_EQ(c.put(worker_key("llama", "w1"), record("http://127.0.0.1:30001")), "");
  ASSERT_EQ(c.put(worker_key("qwen", "w9"), record("http://127.0.0.1:30009")), "");
  Reports<std::vector<WorkerRecord>> seen;
  EtcdWatcher w(etcd_->url(), std::string(kWorkersPrefix) + "llama/", {},
                [&](std::vector<WorkerRecord> ws) { seen.add(std::move(ws)); });
  ASSERT_EQ(w.start(), "");
  ASSERT_TRUE(seen.wait_last([](auto& ws) { return ws.size() == 1; }, 5s));
  EXPECT_EQ(seen.last()->at(0).model, "llama");
  EXPECT_EQ(seen.last()->at(0).id, "w1");
  EXPECT_EQ(seen.last()->at(0).url, "http://127.0.0.1:30001");

  // A put is reported within 0.5 s of etcd's answer.
  WorkerRecord full;
  full.url = "http://127.0.0.1:30002";
  full.role = "prefill";
  full.dp_size = 2;
  full.bootstrap_port = 8998;
  full.kv_events_endpoint = "tcp://127.0.0.1:5557";
  ASSERT_EQ(c.put(worker_key("llama", "w2"), serialize_worker_record(full)), "");
  auto put_at = Clock::now();
  ASSERT_TRUE(seen.wait_last([](auto& ws) { return ws.size() == 2; }, 5s));
  EXPECT_LT(seen.last_at() - put_at, 500ms);
  const WorkerRecord w2 = seen.last()->at(1);
  EXPECT_EQ(w2.id, "w2");
  EXPECT_EQ(w2.role, "prefill");
  EXPECT_EQ(w2.dp_size, 2);
  EXPECT_EQ(w2.bootstrap_port, 8998);
  EXPECT_EQ(w2.kv_events_endpoint, "tcp://127.0.0.1:5557");

  // A malformed record is skipped and counted; the same value again is no change.
  size_t reports = seen.count();
  ASSERT_EQ(c.put(worker_key("llama", "bad"), R"({"url":"10.0.0.1"})"), "");
  ASSERT_EQ(c.put(worker_key("llama", "w1"), record("http://127.0.0.1:30001")), "");
  ASSERT_TRUE(wait_until([&] { return w.stats().invalid_records.load() >= 1; }));
  ASSERT_TRUE(wait_until([&] { return w.stats().events.load() >= 3; }));
  EXPECT_EQ(seen.count(), reports);

  // A delete, also within 0.5 s.
  ASSERT_EQ(c.delete_key(worker_key("llama", "w1")), "");
  auto delete_at = Clock::now();
  ASSERT_TRUE(seen.wait_last([](auto& ws) { return ws.size() == 1; }, 5s));
  EXPECT_LT(seen.last_at() - delete_at, 500ms);
  EXPECT_EQ(seen.last()->at(0).id, "w2");
  w.stop();
  EXPECT_EQ(w.stats().errors.load(), 0u);
  for (const auto& ws : seen.all()) {
    for (const auto& r : ws) EXPECT_EQ(r.model, "llama") << "another model's worker leaked in";
  }
}

TEST_F(DiscoveryEtcd, ALeaseExpiryRemovesTheWorkerSoonAfterItsTtl) {
  EtcdClient c(etcd_->url());
  Reports<std::vector<WorkerRecord>> seen;
  EtcdWatcher w(etcd_->url(), std::string(kWorkersPrefix), {},
                [&](std::vector<WorkerRecord> ws) { seen.add(std::move(ws)); });
  ASSERT_EQ(w.start(), "");
  ASSERT_TRUE(seen.wait_last([](auto& ws) { return ws.empty(); }, 5s));
  constexpr int64_t kTtl = 2;  // etcd's minimum with its default election timeout
  int64_t lease = 0;
  auto granted_at = Clock::now();
  ASSERT_EQ(c.lease_grant(kTtl, lease), "");
  ASSERT_EQ(c.put(worker_key("m", "w"), record("http://127.0.0.1:30001"), lease), "");
  ASSERT_TRUE(seen.wait_last([](auto& ws) { return ws.size() == 1; }, 5s));
  // Nobody keeps it alive. etcd's lessor looks for expired leases every 0.5 s, so the key is
  // deleted between ttl and ttl + 0.5 s after the grant (2.09-2.48 s measured for a 2 s TTL); the
  // watcher is allowed 0.5 s on top to report it (it takes a few ms).
  ASSERT_TRUE(seen.wait_last([](auto& ws) { return ws.empty(); }, 10s));
  auto took = seen.last_at() - granted_at;
  EXPECT_GE(took, std::chrono::seconds(kTtl) - 100ms);
  EXPECT_LE(took, std::chrono::seconds(kTtl) + 500ms + 500ms)
      << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms";
}

TEST_F(DiscoveryEtcd, WatcherKeepsTheSetWhileEtcdIsDownAndRecoversAfterARestart) {
  EtcdClient c(etcd_->url());
  ASSERT_EQ(c.put(worker_key("m", "a"), record("http://127.0.0.1:30001")), "");
  Reports<std::vector<WorkerRecord>> seen;
  EtcdWatcher w(etcd_->url(), std::string(kWorkersPrefix),
                {.min_backoff = 50ms, .max_backoff = 300ms},
                [&](std::vector<WorkerRecord> ws) { seen.add(std::move(ws)); });
  ASSERT_EQ(w.start(), "");
  ASSERT_TRUE(seen.wait_last([](auto& ws) { return ws.size() == 1; }, 5s));
  etcd_->stop();
  ASSERT_TRUE(wait_until([&] { return w.stats().errors.load() >= 3; }, 10s));
  EXPECT_EQ(seen.count(), 1u) << "the set stays while etcd is unreachable";
  ASSERT_TRUE(etcd_->start()) << etcd_->log();
  ASSERT_EQ(c.put(worker_key("m", "b"), record("http://127.0.0.1:30002")), "");
  ASSERT_TRUE(seen.wait_last([](auto& ws) { return ws.size() == 2; }, 10s));
  EXPECT_EQ(seen.count(), 2u);
  EXPECT_GE(w.stats().ranges.load(), 2u);
  EXPECT_GE(w.stats().watch_restarts.load(), 1u);
  // And it watches again: a delete arrives as before.
  ASSERT_EQ(c.delete_key(worker_key("m", "a")), "");
  ASSERT_TRUE(seen.wait_last([](auto& ws) { return ws.size() == 1; }, 5s));
}

TEST_F(DiscoveryEtcd, StopEndsAWatcherAtOnce) {
  EtcdWatcher w(etcd_->url(), std::string(kWorkersPrefix), {},
                [](const std::vector<WorkerRecord>&) {});
  ASSERT_EQ(w.start(), "");
  ASSERT_TRUE(wait_until([&] { return w.stats().changes.load() == 1; }));
  auto t0 = Clock::now();
  w.stop();
  EXPECT_LT(Clock::now() - t0, 1s);
  EtcdWatcher bad("https://127.0.0.1:1", std::string(kWorkersPrefix), {},
                  [](const std::vector<WorkerRecord>&) {});
  EXPECT_NE(bad.start().find("not supported yet"), std::string::npos);
  EtcdWatcher outside(etcd_->url(), "/elsewhere/", {}, [](const std::vector<WorkerRecord>&) {});
  EXPECT_NE(outside.start().find("must be under /kvgate/v1/workers/"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// kvgate register

using DiscoveryRegister = DiscoveryEtcd;

TEST_F(DiscoveryRegister, PutsTheRecordAndSigtermRemovesIt) {
  Process reg("kvgate", {"register", "--etcd", etcd_->url(), "--model", "Qwen/Qwen3-8B", "--url",
                         "http://127.0.0.1:30555", "--dp-size", "2", "--kv-events-endpoint",
                         "tcp://127.0.0.1:5557", "--ttl", "3"});
  const std::string key = worker_key("Qwen/Qwen3-8B", "127.0.0.1:30555");
  std::vector<EtcdKeyValue> found;
  ASSERT_TRUE(wait_until([&] {
    found = keys();
    return found.size() == 1;
  })) << reg.log();
  EXPECT_EQ(found[0].key, key);
  EXPECT_NE(found[0].lease, 0);
  WorkerRecord r;
  ASSERT_EQ(parse_worker_record(found[0].value, r), "");
  EXPECT_EQ(r.url, "http://127.0.0.1:30555");
  EXPECT_EQ(r.dp_size, 2);
  EXPECT_EQ(r.kv_events_endpoint, "tcp://127.0.0.1:5557");
  // It stays past the TTL: the keepalives hold the lease.
  int64_t lease = found[0].lease;
  ASSERT_FALSE(wait_until([&] { return keys().empty(); }, 4s)) << reg.log();
  EXPECT_EQ(keys().at(0).lease, lease);
  // SIGTERM: the lease is revoked before it exits, so the key is gone at once.
  EXPECT_EQ(reg.stop(), 0) << reg.log();
  EXPECT_TRUE(keys().empty());
  EXPECT_NE(reg.log().find("worker registered"), std::string::npos) << reg.log();
  EXPECT_NE(reg.log().find("lease revoked"), std::string::npos) << reg.log();
}

TEST_F(DiscoveryRegister, RegistersAgainWhenTheLeaseIsLost) {
  Process reg("kvgate", {"register", "--etcd", etcd_->url(), "--model", "m", "--id", "w1", "--url",
                         "http://127.0.0.1:30556", "--ttl", "3"});
  std::vector<EtcdKeyValue> found;
  ASSERT_TRUE(wait_until([&] {
    found = keys();
    return found.size() == 1;
  })) << reg.log();
  int64_t first = found[0].lease;
  EtcdClient c(etcd_->url());
  ASSERT_EQ(c.lease_revoke(first), "");  // as if it had expired
  ASSERT_TRUE(keys().empty());
  // The next keepalive (every second) finds the lease gone: a new one, the record again.
  ASSERT_TRUE(wait_until(
      [&] {
        found = keys();
        return found.size() == 1;
      },
      5s))
      << reg.log();
  EXPECT_NE(found[0].lease, first);
  EXPECT_EQ(found[0].key, worker_key("m", "w1"));
  EXPECT_EQ(reg.stop(), 0) << reg.log();
  EXPECT_TRUE(keys().empty());
}

TEST(DiscoveryRegisterCli, HelpAndUsageErrors) {
  RunResult help = run("kvgate", {"register", "--help"});
  EXPECT_EQ(help.status, 0);
  EXPECT_NE(help.output.find("Usage: kvgate register --etcd URL --url URL"), std::string::npos)
      << help.output;
  RunResult missing = run("kvgate", {"register", "--url", "http://127.0.0.1:1"});
  EXPECT_EQ(missing.status, 2);
  EXPECT_NE(missing.output.find("kvgate register: --etcd URL is required"), std::string::npos)
      << missing.output;
  RunResult bad = run("kvgate", {"register", "--etcd", "http://127.0.0.1:1", "--url",
                                 "http://127.0.0.1:1", "--role", "leader"});
  EXPECT_EQ(bad.status, 2);
  EXPECT_NE(bad.output.find("--role: 'leader' is not a valid value"), std::string::npos)
      << bad.output;
}

// ---------------------------------------------------------------------------------------------
// The gateway: a rule's workers found through DNS and etcd, changed live.

// A kvgate whose default rule's workers come from --discovery (and whose rule table can be read).
struct DiscoveringGateway {
  explicit DiscoveringGateway(const std::string& uri, std::vector<std::string> extra = {})
      : port(free_port()), admin(free_port()), metrics(free_port()) {
    std::vector<std::string> args{"--host",
                                  "127.0.0.1",
                                  "--port",
                                  std::to_string(port),
                                  "--admin-port",
                                  std::to_string(admin),
                                  "--prometheus-host",
                                  "127.0.0.1",
                                  "--prometheus-port",
                                  std::to_string(metrics),
                                  "--discovery",
                                  uri,
                                  "--discovery-interval-secs",
                                  "1",
                                  "--health-check-interval-secs",
                                  "1"};
    args.insert(args.end(), extra.begin(), extra.end());
    process = std::make_unique<Process>("kvgate", args);
  }
  double total() {
    return json_number_field(HttpClient(port).get("/readiness").body, "total_workers");
  }
  double healthy() {
    return json_number_field(HttpClient(port).get("/readiness").body, "healthy_workers");
  }
  int port, admin, metrics;
  std::unique_ptr<Process> process;
};

// Sims on 127.0.0.2, .3, ... at one port: what one DNS name with several addresses finds.
std::vector<Sim> sims_on_addresses(int n, int port) {
  std::vector<Sim> sims;
  for (int i = 0; i < n; ++i) {
    Sim s;
    s.port = port;
    s.args = {"--host", "127.0.0." + std::to_string(i + 2), "--time-scale", "0"};
    s.process = std::make_unique<Process>("kvgate-sim", [&] {
      auto a = s.args;
      a.insert(a.end(), {"--port", std::to_string(port)});
      return a;
    }());
    EXPECT_TRUE(wait_until([&] {
      return HttpClient(port, "127.0.0." + std::to_string(i + 2)).get("/health").status == 200;
    }));
    sims.push_back(std::move(s));
  }
  return sims;
}

TEST_F(DiscoveryDns, AGatewayAddsAndRemovesWorkersAsTheNameChanges) {
  const int port = free_port();
  auto sims = sims_on_addresses(3, port);
  Dnsmasq dns(dir_, "127.0.0.2 workers.kvgate.test\n127.0.0.3 workers.kvgate.test\n");
  ASSERT_TRUE(dns.wait_ready()) << dns.log();
  DiscoveringGateway gw(dns.uri("workers.kvgate.test:" + std::to_string(port)));
  ASSERT_TRUE(wait_until([&] { return gw.healthy() == 2; }, 15s)) << gw.process->log();
  EXPECT_EQ(HttpClient(gw.port)
                .post("/v1/chat/completions",
                      R"({"model":"m","messages":[{"role":"user","content":"hi"}]})",
                      {{"content-type", "application/json"}})
                .status,
            200);
  // A third address: within one re-resolve (1 s, TTL 1 s) and a health check.
  const auto added = std::chrono::steady_clock::now();
  dns.set_hosts(
      "127.0.0.2 workers.kvgate.test\n127.0.0.3 workers.kvgate.test\n127.0.0.4 "
      "workers.kvgate.test\n");
  ASSERT_TRUE(wait_until([&] { return gw.total() == 3; }, 5s)) << gw.process->log();
  EXPECT_LT(std::chrono::steady_clock::now() - added, 2500ms);
  EXPECT_TRUE(wait_until([&] { return gw.healthy() == 3; }, 5s));
  // One address removed: gone at the next answer.
  dns.set_hosts("127.0.0.2 workers.kvgate.test\n127.0.0.4 workers.kvgate.test\n");
  ASSERT_TRUE(wait_until([&] { return gw.total() == 2; }, 5s)) << gw.process->log();
  // The rule as written has no endpoints; the history does not grow with discovery.
  Response rule = HttpClient(gw.admin).get("/v1/rules/default");
  EXPECT_NE(rule.body.find(R"("endpoints":[])"), std::string::npos) << rule.body;
  EXPECT_NE(rule.body.find(R"("discovery":"dns://workers.kvgate.test)"), std::string::npos);
  Response history = HttpClient(gw.admin).get("/v1/rules/default/history");
  EXPECT_NE(history.body.find(R"("current":1)"), std::string::npos) << history.body;
  Response metrics = HttpClient(gw.metrics).get("/metrics");
  EXPECT_NE(metrics.body.find("kvgate_discovery_endpoints{uri=\"dns://workers.kvgate.test"),
            std::string::npos);
  // The name gone entirely: the workers stay through two empty answers, go at the third.
  dns.set_hosts("");
  ASSERT_TRUE(wait_until([&] { return gw.total() == 0; }, 10s)) << gw.process->log();
  EXPECT_NE(gw.process->log().find("discovery found a change"), std::string::npos);
}

TEST_F(DiscoveryEtcd, AGatewayFollowsRegisteredWorkersAndALeaseExpiryRemovesOne) {
  std::vector<Sim> sims;
  for (int i = 0; i < 2; ++i) sims.push_back(Sim::launch({"--time-scale", "0"}));
  std::vector<std::unique_ptr<Process>> regs;
  for (auto& s : sims) {
    regs.push_back(std::make_unique<Process>(
        "kvgate", std::vector<std::string>{"register", "--etcd", etcd_->url(), "--model", "m",
                                           "--url", s.url(), "--ttl", "2"}));
  }
  DiscoveringGateway gw("etcd://127.0.0.1:" + std::to_string(etcd_->port()) + "/m");
  ASSERT_TRUE(wait_until([&] { return gw.healthy() == 2; }, 15s)) << gw.process->log();
  // A sidecar stopped cleanly revokes its lease: the worker goes at once (the watch).
  auto t0 = std::chrono::steady_clock::now();
  regs[0]->stop();
  ASSERT_TRUE(wait_until([&] { return gw.total() == 1; }, 5s)) << gw.process->log();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1500ms);
  // A sidecar killed: its lease expires (TTL 2 s; etcd checks leases every 0.5 s).
  regs.push_back(std::make_unique<Process>(
      "kvgate", std::vector<std::string>{"register", "--etcd", etcd_->url(), "--model", "m",
                                         "--url", sims[0].url(), "--ttl", "2"}));
  ASSERT_TRUE(wait_until([&] { return gw.total() == 2; }, 5s));
  t0 = std::chrono::steady_clock::now();
  regs[1]->kill_now();
  ASSERT_TRUE(wait_until([&] { return gw.total() == 1; }, 10s)) << gw.process->log();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 4000ms);
  // Another model's workers are not this rule's.
  Process other("kvgate", {"register", "--etcd", etcd_->url(), "--model", "other", "--url",
                           "http://127.0.0.1:1", "--ttl", "5"});
  ASSERT_TRUE(wait_until([&] { return keys().size() == 2; }, 5s));
  EXPECT_EQ(gw.total(), 1);
}

// Gateways register themselves (--replica-registry): each one's key under
// /kvgate/v1/gateways/<subject>/, and a peer whose key goes (a replica killed: its lease expires)
// is forgotten at once, long before --replica-peer-timeout-ms of silence would.
TEST_F(DiscoveryEtcd, GatewaysRegisterThemselvesAndAPeerWhoseKeyGoesIsForgotten) {
  Nats nats;
  Sim sim = Sim::launch({"--time-scale", "0"});
  struct Gw {
    int port = free_port(), metrics = free_port();
    std::unique_ptr<Process> process;
    double metric(const std::string& series) const {
      const std::string body = HttpClient(metrics).get("/metrics").body;
      const size_t at = body.find("\n" + series + " ");
      return at == std::string::npos ? -1 : std::stod(body.substr(at + series.size() + 2));
    }
  };
  auto launch = [&] {
    Gw g;
    g.process = std::make_unique<Process>(
        "kvgate", std::vector<std::string>{"--host",
                                           "127.0.0.1",
                                           "--port",
                                           std::to_string(g.port),
                                           "--admin-port",
                                           std::to_string(free_port()),
                                           "--prometheus-host",
                                           "127.0.0.1",
                                           "--prometheus-port",
                                           std::to_string(g.metrics),
                                           "--worker-urls",
                                           sim.url(),
                                           "--replica-sync",
                                           nats.url(),
                                           "--replica-registry",
                                           "etcd://127.0.0.1:" + std::to_string(etcd_->port()),
                                           "--replica-registry-ttl-secs",
                                           "2",
                                           "--replica-peer-timeout-ms",
                                           "60000"});
    return g;
  };
  const std::string prefix = std::string(kGatewaysPrefix) + "kvgate/";
  std::vector<Gw> gws;
  for (int i = 0; i < 3; ++i) gws.push_back(launch());
  ASSERT_TRUE(wait_until(
      [&] {
        return keys(prefix).size() == 3 && std::all_of(gws.begin(), gws.end(), [](const Gw& g) {
                 return g.metric("kvgate_replica_peers") == 2 &&
                        g.metric("kvgate_replica_registry_gateways") == 3 &&
                        g.metric("kvgate_replica_registry_registered") == 1;
               });
      },
      20s))
      << gws[0].process->log();
  // Each record names its gateway's address.
  std::vector<std::string> urls;
  for (const auto& kv : keys(prefix)) {
    WorkerRecord r;
    ASSERT_EQ(parse_worker_record(kv.value, r), "") << kv.value;
    urls.push_back(r.url);
  }
  for (const auto& g : gws) {
    EXPECT_NE(std::find(urls.begin(), urls.end(), "http://127.0.0.1:" + std::to_string(g.port)),
              urls.end());
  }
  // Killed: nothing said, but its lease expires (TTL 2 s) and the others forget it then.
  gws[2].process->kill_now();
  ASSERT_TRUE(wait_until(
      [&] {
        return gws[0].metric("kvgate_replica_peers") == 1 &&
               gws[1].metric("kvgate_replica_peers") == 1;
      },
      15s))
      << gws[0].process->log();
  EXPECT_EQ(gws[0].metric("kvgate_replica_peer_expiries_total{reason=\"deregistered\"}"), 1);
  EXPECT_EQ(keys(prefix).size(), 2U);
  // Stopped: its lease is revoked, its key goes at once, and so does it from the other's peers.
  gws[1].process->stop();
  ASSERT_TRUE(wait_until([&] { return gws[0].metric("kvgate_replica_peers") == 0; }, 10s))
      << gws[0].process->log();
  EXPECT_EQ(keys(prefix).size(), 1U);
  EXPECT_EQ(gws[0].metric("kvgate_replica_peer_expiries_total{reason=\"silence\"}"), -1);
}

}  // namespace
}  // namespace kvgate::testing
