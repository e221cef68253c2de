// discovery/dns: URIs, answers built by hand, results from answers, the drain rule, and the
// watcher thread with an injected resolver (no network).
#include "discovery/dns.h"

#include <arpa/nameser.h>
#include <gtest/gtest.h>

#include <deque>
#include <mutex>

#include "support/process.h"
#include "unit/discovery/dns_packet.h"

namespace kvgate::discovery {
namespace {

using namespace std::chrono_literals;
using testing::DnsPacket;

TEST(DnsUri, AddressForm) {
  DnsTarget t;
  ASSERT_EQ(parse_dns_uri("dns://Workers.Default.svc.cluster.local:8000", t), "");
  EXPECT_EQ(t.kind, DnsTarget::Kind::kAddress);
  EXPECT_EQ(t.name, "workers.default.svc.cluster.local");
  EXPECT_EQ(t.port, 8000);
  EXPECT_EQ(t.scheme, "http");
  EXPECT_EQ(t.server, "");
  ASSERT_EQ(parse_dns_uri("dns://w.test.:9/?server=127.0.0.1:5353&scheme=https", t), "");
  EXPECT_EQ(t.name, "w.test");
  EXPECT_EQ(t.port, 9);
  EXPECT_EQ(t.scheme, "https");
  EXPECT_EQ(t.server, "127.0.0.1");
  EXPECT_EQ(t.server_port, 5353);
  ASSERT_EQ(parse_dns_uri("dns://w:1?server=10.0.0.10", t), "");
  EXPECT_EQ(t.server_port, 53);
}

TEST(DnsUri, SrvForm) {
  DnsTarget t;
  ASSERT_EQ(parse_dns_uri("dns://_http._tcp.sglang.ns.svc", t), "");
  EXPECT_EQ(t.kind, DnsTarget::Kind::kSrv);
  EXPECT_EQ(t.name, "_http._tcp.sglang.ns.svc");
  EXPECT_EQ(t.port, 0);
}

TEST(DnsUri, ErrorsSayWhatAndShowAnExample) {
  struct Case {
    const char* uri;
    const char* says;
  };
  for (const Case& c :
       {Case{"http://w:80", "starts with dns://"}, Case{"dns://w", "needs the workers' port"},
        Case{"dns://w:", "port after ':' is missing"}, Case{"dns://w:0", "from 1 to 65535"},
        Case{"dns://w:65536", "from 1 to 65535"}, Case{"dns://w:8x", "from 1 to 65535"},
        Case{"dns://:80", "the name is empty"}, Case{"dns://a..b:80", "empty label"},
        Case{"dns://a b:80", "holds ' '"}, Case{"dns://w:80/path", "no path"},
        Case{"dns://_http._tcp.w:80", "takes its ports from the records"},
        Case{"dns://_http.w", "_service._proto.NAME"},
        Case{"dns://_http._tcp", "_service._proto.NAME"},
        Case{"dns://w:80?scheme=ftp", "http or https"},
        Case{"dns://w:80?server=::1", "IPv4 address"},
        Case{"dns://w:80?server=1.2.3.4:0", "from 1 to 65535"},
        Case{"dns://w:80?ttl=5", "unknown parameter 'ttl'"}}) {
    DnsTarget t;
    std::string e = parse_dns_uri(c.uri, t);
    EXPECT_NE(e.find(c.says), std::string::npos) << c.uri << ": " << e;
    EXPECT_NE(e.find("e.g. dns://"), std::string::npos) << c.uri << ": " << e;
  }
  DnsTarget t;
  std::string long_label(64, 'a');
  EXPECT_NE(parse_dns_uri("dns://" + long_label + ".test:80", t).find("longer than 63"),
            std::string::npos);
}

TEST(DnsAnswerParse, AddressesWithCompressionAndTtl) {
  DnsPacket p;
  p.question("w.test", ns_t_a)
      .answer("@q", ns_t_a, 30, DnsPacket::a("10.0.0.2"))
      .answer("W.Test", ns_t_a, 5, DnsPacket::a("10.0.0.1"))
      .answer("w.test", ns_t_aaaa, 7, DnsPacket::aaaa("fd00::1"));
  DnsAnswer a;
  ASSERT_EQ(parse_dns_answer(p.data(), p.size(), a), "");
  EXPECT_EQ(a.rcode, 0);
  ASSERT_EQ(a.addresses.size(), 3u);
  EXPECT_EQ(a.addresses[0].name, "w.test");
  EXPECT_EQ(a.addresses[0].ip, "10.0.0.2");
  EXPECT_EQ(a.addresses[0].ttl, 30u);
  EXPECT_EQ(a.addresses[1].name, "w.test");  // lower case
  EXPECT_EQ(a.addresses[2].ip, "fd00::1");
  EXPECT_EQ(a.negative_ttl, -1);
}

TEST(DnsAnswerParse, SrvAndAdditional) {
  DnsPacket p;
  p.question("_http._tcp.s.test", ns_t_srv)
      .answer("@q", ns_t_srv, 60, DnsPacket::srv(0, 5, 8001, "t1.s.test"))
      .answer("@q", ns_t_srv, 20, DnsPacket::srv(1, 5, 8002, "t2.s.test."))
      .rr(2, "t1.s.test", ns_t_a, 10, DnsPacket::a("10.0.1.1"));
  DnsAnswer a;
  ASSERT_EQ(parse_dns_answer(p.data(), p.size(), a), "");
  ASSERT_EQ(a.srv.size(), 2u);
  EXPECT_EQ(a.srv[0].target, "t1.s.test");
  EXPECT_EQ(a.srv[0].port, 8001);
  EXPECT_EQ(a.srv[0].weight, 5);
  EXPECT_EQ(a.srv[1].target, "t2.s.test");
  EXPECT_EQ(a.srv[1].priority, 1);
  ASSERT_EQ(a.additional.size(), 1u);
  EXPECT_EQ(a.additional[0].name, "t1.s.test");
  EXPECT_TRUE(a.addresses.empty());
}

TEST(DnsAnswerParse, NxdomainWithSoaGivesTheNegativeTtl) {
  DnsPacket p(ns_r_nxdomain);
  p.question("gone.test", ns_t_a).rr(1, "test", ns_t_soa, 300, DnsPacket::soa(45));
  DnsAnswer a;
  ASSERT_EQ(parse_dns_answer(p.data(), p.size(), a), "");
  EXPECT_EQ(a.rcode, ns_r_nxdomain);
  EXPECT_EQ(a.negative_ttl, 45);  // min(SOA TTL, MINIMUM)
  DnsPacket q(ns_r_nxdomain);
  q.question("gone.test", ns_t_a).rr(1, "test", ns_t_soa, 12, DnsPacket::soa(45));
  ASSERT_EQ(parse_dns_answer(q.data(), q.size(), a), "");
  EXPECT_EQ(a.negative_ttl, 12);
}

TEST(DnsAnswerParse, TopBitTtlReadsAsZero) {
  DnsPacket p;
  p.question("w.test", ns_t_a).answer("w.test", ns_t_a, 0x80000000u, DnsPacket::a("10.0.0.1"));
  DnsAnswer a;
  ASSERT_EQ(parse_dns_answer(p.data(), p.size(), a), "");
  EXPECT_EQ(a.addresses.at(0).ttl, 0u);
}

TEST(DnsAnswerParse, MalformedNeverCrashes) {
  DnsAnswer a;
  EXPECT_NE(parse_dns_answer(nullptr, 0, a), "");
  EXPECT_NE(parse_dns_answer(reinterpret_cast<const unsigned char*>("abc"), 3, a), "");
  DnsPacket p;
  p.question("w.test", ns_t_a).answer("w.test", ns_t_a, 5, DnsPacket::a("10.0.0.1"));
  // Every truncation of a valid answer is refused or parsed, never read past.
  for (size_t n = 0; n < p.size(); ++n) {
    std::string cut = p.bytes().substr(0, n);
    EXPECT_NE(parse_dns_answer(reinterpret_cast<const unsigned char*>(cut.data()), n, a), "") << n;
  }
  DnsPacket bad_len;
  bad_len.question("w.test", ns_t_a).answer("w.test", ns_t_a, 5, "abc");
  EXPECT_NE(parse_dns_answer(bad_len.data(), bad_len.size(), a).find("wrong length"),
            std::string::npos);
  DnsPacket short_srv;
  short_srv.question("_a._b.c", ns_t_srv).answer("@q", ns_t_srv, 5, std::string("\x00\x01", 2));
  EXPECT_NE(parse_dns_answer(short_srv.data(), short_srv.size(), a), "");
  // An SRV target that runs past its record's data.
  DnsPacket long_target;
  long_target.question("_a._b.c", ns_t_srv)
      .answer("@q", ns_t_srv, 5, DnsPacket::srv(0, 0, 80, "t.test").substr(0, 8))
      .answer("@q", ns_t_a, 5, DnsPacket::a("10.0.0.1"));
  EXPECT_NE(parse_dns_answer(long_target.data(), long_target.size(), a), "");
  // An answer whose owner name is a compression pointer to itself.
  std::string loop = DnsPacket().bytes();
  loop[7] = 1;  // one answer
  loop += "\xc0\x0c";
  loop += std::string("\x00\x01\x00\x01\x00\x00\x00\x05\x00\x04\x0a\x00\x00\x01", 14);
  EXPECT_NE(parse_dns_answer(reinterpret_cast<const unsigned char*>(loop.data()), loop.size(), a),
            "");
}

DnsAnswer answer_of(const DnsPacket& p) {
  DnsAnswer a;
  EXPECT_EQ(parse_dns_answer(p.data(), p.size(), a), "");
  return a;
}

TEST(DnsResultFrom, AddressUrlsSortedUniqueBracketedWithSmallestTtl) {
  DnsTarget t;
  ASSERT_EQ(parse_dns_uri("dns://w.test:8000", t), "");
  DnsPacket a, aaaa;
  a.question("w.test", ns_t_a)
      .answer("w.test", ns_t_a, 30, DnsPacket::a("10.0.0.2"))
      .answer("w.test", ns_t_a, 9, DnsPacket::a("10.0.0.1"))
      .answer("w.test", ns_t_a, 30, DnsPacket::a("10.0.0.2"));
  aaaa.question("w.test", ns_t_aaaa).answer("w.test", ns_t_aaaa, 20, DnsPacket::aaaa("fd00::1"));
  DnsResult r = dns_result(t, {answer_of(a), answer_of(aaaa)}, nullptr);
  ASSERT_EQ(r.status, DnsResult::kOk) << r.error;
  EXPECT_EQ(r.urls, (std::vector<std::string>{"http://10.0.0.1:8000", "http://10.0.0.2:8000",
                                              "http://[fd00::1]:8000"}));
  EXPECT_EQ(r.ttl_secs, 9u);
}

TEST(DnsResultFrom, EmptyAndErrors) {
  DnsTarget t;
  ASSERT_EQ(parse_dns_uri("dns://w.test:8000?scheme=https", t), "");
  DnsPacket nx(ns_r_nxdomain), nodata, servfail(ns_r_servfail), refused(ns_r_refused);
  nx.question("w.test", ns_t_a).rr(1, "test", ns_t_soa, 60, DnsPacket::soa(30));
  nodata.question("w.test", ns_t_aaaa);
  servfail.question("w.test", ns_t_a);
  refused.question("w.test", ns_t_a);
  DnsResult r = dns_result(t, {answer_of(nx), answer_of(nodata)}, nullptr);
  EXPECT_EQ(r.status, DnsResult::kEmpty);
  EXPECT_EQ(r.ttl_secs, 30u);
  r = dns_result(t, {answer_of(nodata), answer_of(nodata)}, nullptr);
  EXPECT_EQ(r.status, DnsResult::kEmpty);
  EXPECT_EQ(r.ttl_secs, 0u);  // no SOA: no negative TTL
  r = dns_result(t, {answer_of(servfail), answer_of(nodata)}, nullptr);
  EXPECT_EQ(r.status, DnsResult::kError);
  EXPECT_NE(r.error.find("SERVFAIL"), std::string::npos);
  // One family failing fails the whole: a partial answer would drop the other family's workers.
  DnsPacket a;
  a.question("w.test", ns_t_a).answer("w.test", ns_t_a, 5, DnsPacket::a("10.0.0.1"));
  r = dns_result(t, {answer_of(a), answer_of(refused)}, nullptr);
  EXPECT_EQ(r.status, DnsResult::kError);
  EXPECT_NE(r.error.find("REFUSED"), std::string::npos);
  r = dns_result(t, {answer_of(a), answer_of(nodata)}, nullptr);
  ASSERT_EQ(r.status, DnsResult::kOk);
  EXPECT_EQ(r.urls, std::vector<std::string>{"https://10.0.0.1:8000"});
}

TEST(DnsResultFrom, SrvUsesAdditionalThenLooksUpTheRest) {
  DnsTarget t;
  ASSERT_EQ(parse_dns_uri("dns://_http._tcp.s.test", t), "");
  DnsPacket p;
  p.question("_http._tcp.s.test", ns_t_srv)
      .answer("@q", ns_t_srv, 60, DnsPacket::srv(0, 5, 8001, "t1.s.test"))
      .answer("@q", ns_t_srv, 60, DnsPacket::srv(0, 5, 8002, "t2.s.test"))
      .answer("@q", ns_t_srv, 60, DnsPacket::srv(0, 5, 8003, "gone.s.test"))
      .answer("@q", ns_t_srv, 60, DnsPacket::srv(0, 5, 8004, "."))
      .rr(2, "t1.s.test", ns_t_a, 15, DnsPacket::a("10.0.1.1"));
  std::vector<std::string> looked_up;
  auto lookup = [&](const std::string& name, std::vector<DnsAnswer>& out) -> std::string {
    looked_up.push_back(name);
    out.assign(2, DnsAnswer{});
    if (name == "t2.s.test") {
      DnsPacket a, aaaa;
      a.question(name, ns_t_a).answer(name, ns_t_a, 25, DnsPacket::a("10.0.1.2"));
      aaaa.question(name, ns_t_aaaa).answer(name, ns_t_aaaa, 8, DnsPacket::aaaa("fd00::2"));
      out = {answer_of(a), answer_of(aaaa)};
    } else {
      DnsPacket nx(ns_r_nxdomain);
      nx.question(name, ns_t_a);
      out = {answer_of(nx), answer_of(nx)};
    }
    return "";
  };
  DnsResult r = dns_result(t, {answer_of(p)}, lookup);
  ASSERT_EQ(r.status, DnsResult::kOk) << r.error;
  EXPECT_EQ(r.urls, (std::vector<std::string>{"http://10.0.1.1:8001", "http://10.0.1.2:8002",
                                              "http://[fd00::2]:8002"}));
  EXPECT_EQ(r.ttl_secs, 8u);
  EXPECT_EQ(looked_up, (std::vector<std::string>{"t2.s.test", "gone.s.test"}));

  // A target's lookup that fails fails the whole resolution (the set is kept).
  auto failing = [](const std::string&, std::vector<DnsAnswer>&) -> std::string {
    return "timed out";
  };
  r = dns_result(t, {answer_of(p)}, failing);
  EXPECT_EQ(r.status, DnsResult::kError);
  // No SRV records at all.
  DnsPacket none(ns_r_nxdomain);
  none.question("_http._tcp.s.test", ns_t_srv);
  EXPECT_EQ(dns_result(t, {answer_of(none)}, lookup).status, DnsResult::kEmpty);
}

TEST(DnsResultFrom, SrvTargetsLookedUpAreBounded) {
  DnsTarget t;
  ASSERT_EQ(parse_dns_uri("dns://_http._tcp.s.test", t), "");
  DnsPacket p;
  p.question("_http._tcp.s.test", ns_t_srv);
  for (int i = 0; i < 100; ++i) {
    p.answer("@q", ns_t_srv, 60, DnsPacket::srv(0, 0, 8000, "t" + std::to_string(i) + ".s.test"));
  }
  size_t calls = 0;
  auto lookup = [&](const std::string&, std::vector<DnsAnswer>& out) -> std::string {
    ++calls;
    out.assign(2, DnsAnswer{});
    return "";
  };
  dns_result(t, {answer_of(p)}, lookup);
  EXPECT_EQ(calls, kMaxSrvTargets);
}

DnsResult ok(std::vector<std::string> urls, uint32_t ttl = 5) {
  DnsResult r;
  r.status = DnsResult::kOk;
  r.urls = std::move(urls);
  r.ttl_secs = ttl;
  return r;
}
DnsResult empty(uint32_t ttl = 0) {
  DnsResult r;
  r.status = DnsResult::kEmpty;
  r.ttl_secs = ttl;
  return r;
}
DnsResult error() {
  DnsResult r;
  r.status = DnsResult::kError;
  r.error = "timed out";
  return r;
}

TEST(DnsDrainRule, ChangesOnlyWhenTheSetDiffersAndDrainsAfterARun) {
  DnsWatcher::Options o{.min_interval = 1000ms, .max_interval = 30000ms, .empty_drain_after = 3};
  DnsWatcher::State s(o);
  auto step = s.apply(ok({"http://a:1"}, 5));
  EXPECT_TRUE(step.changed);
  EXPECT_EQ(step.next_delay, 5000ms);
  EXPECT_FALSE(s.apply(ok({"http://a:1"}, 100)).changed);
  EXPECT_EQ(s.apply(ok({"http://a:1"}, 100)).next_delay, 30000ms);  // clamped to max
  EXPECT_EQ(s.apply(ok({"http://a:1"}, 0)).next_delay, 1000ms);     // clamped to min
  EXPECT_TRUE(s.apply(ok({"http://a:1", "http://b:1"})).changed);
  // Errors never change the set; they retry at the minimum interval.
  step = s.apply(error());
  EXPECT_FALSE(step.changed);
  EXPECT_EQ(step.next_delay, 1000ms);
  EXPECT_EQ(s.urls().size(), 2u);
  // Two empty answers keep it, an answer with records breaks the run.
  EXPECT_FALSE(s.apply(empty(7)).changed);
  EXPECT_EQ(s.apply(empty(7)).next_delay, 7000ms);
  EXPECT_FALSE(s.apply(ok({"http://a:1", "http://b:1"})).changed);
  EXPECT_FALSE(s.apply(empty()).changed);
  EXPECT_FALSE(s.apply(empty()).changed);
  // An error inside a run neither counts nor breaks it.
  EXPECT_FALSE(s.apply(error()).changed);
  step = s.apply(empty());
  EXPECT_TRUE(step.changed);
  EXPECT_TRUE(s.urls().empty());
  EXPECT_FALSE(s.apply(empty()).changed);  // already empty
  EXPECT_TRUE(s.apply(ok({"http://a:1"})).changed);
}

TEST(DnsDrainRule, FirstSuccessIsReportedAndEmptyStartsReportNothing) {
  DnsWatcher::State s(DnsWatcher::Options{});
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(s.apply(empty()).changed);
  EXPECT_FALSE(s.apply(error()).changed);
  EXPECT_TRUE(s.apply(ok({"http://a:1"})).changed);
}

TEST(DnsDrainRule, MaxBelowMinUsesMin) {
  DnsWatcher::State s(DnsWatcher::Options{.min_interval = 2000ms, .max_interval = 500ms});
  EXPECT_EQ(s.apply(ok({"x"}, 60)).next_delay, 2000ms);
}

// A resolver fed from a script of results; records when it was called.
struct Script {
  std::mutex mu;
  std::deque<DnsResult> results;
  DnsResult last = error();
  int calls = 0;
  DnsResult next() {
    std::lock_guard lock(mu);
    ++calls;
    if (!results.empty()) {
      last = results.front();
      results.pop_front();
    }
    return last;
  }
};

TEST(DnsWatcherThread, ReportsChangesAndDrains) {
  Script script;
  script.results = {ok({"http://a:1"}, 0),
                    ok({"http://a:1"}, 0),
                    error(),
                    ok({"http://a:1", "http://b:1"}, 0),
                    empty(),
                    empty(),
                    empty()};
  std::mutex mu;
  std::vector<std::vector<std::string>> seen;
  DnsWatcher w([&] { return script.next(); },
               {.min_interval = 1ms, .max_interval = 1ms, .empty_drain_after = 3},
               [&](std::vector<std::string> urls) {
                 std::lock_guard lock(mu);
                 seen.push_back(std::move(urls));
               });
  w.start();
  ASSERT_TRUE(testing::wait_until([&] {
    std::lock_guard lock(mu);
    return seen.size() >= 3;
  }));
  w.stop();
  std::lock_guard lock(mu);
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[0], std::vector<std::string>{"http://a:1"});
  EXPECT_EQ(seen[1], (std::vector<std::string>{"http://a:1", "http://b:1"}));
  EXPECT_TRUE(seen[2].empty());
  EXPECT_EQ(w.stats().changes.load(), 3u);
  EXPECT_GE(w.stats().errors.load(), 1u);
  EXPECT_GE(w.stats().empty_answers.load(), 3u);
  EXPECT_GE(w.stats().resolutions.load(), 7u);
}

TEST(DnsWatcherThread, StopWakesALongWaitAtOnce) {
  DnsWatcher w([] { return ok({"http://a:1"}, 3600); },
               {.min_interval = 3600s, .max_interval = 3600s},
               [](const std::vector<std::string>&) {});
  w.start();
  ASSERT_TRUE(testing::wait_until([&] { return w.stats().resolutions.load() == 1; }));
  auto t0 = std::chrono::steady_clock::now();
  w.stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
}

TEST(DnsWatcherThread, ExceptionsStayInTheThread) {
  int calls = 0;
  std::atomic<int> reported{0};
  DnsWatcher w(
      [&]() -> DnsResult {
        if (++calls == 1) throw std::runtime_error("boom");
        return ok({"http://a:1"});
      },
      {.min_interval = 1ms, .max_interval = 1ms},
      [&](const std::vector<std::string>&) {
        ++reported;
        throw std::runtime_error("callback boom");
      });
  w.start();
  ASSERT_TRUE(testing::wait_until([&] { return reported.load() >= 1; }));
  w.stop();
  EXPECT_GE(w.stats().errors.load(), 1u);
}

}  // namespace
}  // namespace kvgate::discovery
