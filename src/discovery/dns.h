// discovery/dns: workers found through DNS (`--discovery dns://...`), the Kubernetes
// headless-Service pattern: every address a name resolves to is a worker.
//
//   dns://NAME:PORT                 A and AAAA records of NAME, each address with PORT
//   dns://_service._proto.NAME      SRV records: each target's addresses with the record's port
//   ?server=IP[:PORT]               ask this nameserver (IPv4) instead of /etc/resolv.conf's
//   ?scheme=https                   the workers' URL scheme (default http)
//
// Three layers, so each can be tested alone: parse_dns_uri (the URI), parse_dns_answer (the raw
// bytes a nameserver answered; pure, fuzzed: tests/fuzz/dns_answer_fuzz.cc) and resolve_dns (the
// queries, with glibc's libresolv on a private resolver state; blocking, bounded to ~4 s per
// query). DnsWatcher runs resolve_dns on a thread of its own, on an interval that honours the
// answers' TTL, and applies the drain rule: an empty answer removes the workers only when it
// repeats, an error never does (a flapping or unreachable nameserver must not empty a pool).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace kvgate::discovery {

// What a dns:// URI asks for.
struct DnsTarget {
  enum class Kind : uint8_t { kAddress, kSrv };
  Kind kind = Kind::kAddress;
  std::string name;   // NAME, or _service._proto.NAME for kSrv (no trailing dot)
  uint16_t port = 0;  // kAddress: the workers' port
  std::string scheme = "http";
  std::string server;         // "" (resolv.conf's nameservers) or an IPv4 address
  uint16_t server_port = 53;  // with `server`
};

// Parses a dns:// URI. Returns "" or what is wrong with it, followed by a valid example.
std::string parse_dns_uri(std::string_view uri, DnsTarget& out);

// Bounds on what one answer may add: a nameserver (or a spoofed answer) cannot grow a pool
// without limit.
inline constexpr size_t kMaxDnsUrls = 1024;
inline constexpr size_t kMaxSrvTargets = 64;  // SRV targets whose addresses are looked up

// What one raw DNS message holds, for the records resolution uses.
struct DnsAnswer {
  struct Address {
    std::string name;  // owner name, lower case, no trailing dot
    std::string ip;    // textual, IPv6 without brackets
    uint32_t ttl = 0;
  };
  struct Srv {
    std::string target;  // lower case, no trailing dot
    uint16_t port = 0;
    uint16_t priority = 0;
    uint16_t weight = 0;
    uint32_t ttl = 0;
  };
  int rcode = 0;                    // 0 NOERROR, 2 SERVFAIL, 3 NXDOMAIN, ...
  bool truncated = false;           // the TC bit
  std::vector<Address> addresses;   // A and AAAA records of the answer section
  std::vector<Srv> srv;             // SRV records of the answer section
  std::vector<Address> additional;  // A and AAAA records of the additional section
  // Negative caching TTL (RFC 2308: the smaller of the SOA record's TTL and its MINIMUM field)
  // from an SOA in the authority section; -1 when there is none.
  int64_t negative_ttl = -1;
};

// Parses the bytes a nameserver answered (what res_nsend returns). Returns "" or why the message
// is malformed (then `out` holds what was read before). Never reads outside `msg`; bounded work
// and output whatever the bytes (records past the bounds above are ignored).
std::string parse_dns_answer(const unsigned char* msg, size_t len, DnsAnswer& out);

struct DnsResult {
  enum Status : uint8_t {
    kOk,     // urls holds at least one worker
    kEmpty,  // NXDOMAIN, or no records of the asked types
    kError,  // timeout, SERVFAIL, REFUSED, malformed answer
  };
  // "http://10.0.0.1:8000", "http://[fd00::1]:8000": sorted, unique, at most kMaxDnsUrls.
  std::vector<std::string> urls;
  // kOk: the smallest TTL of the records used. kEmpty: the SOA's negative TTL, else 0.
  uint32_t ttl_secs = 0;
  Status status = kError;
  std::string error;  // kError: what failed
};

// The result of resolving `target` from answers already received (pure: resolve_dns's logic
// without the network). kAddress: `a` and `aaaa` answer the A and AAAA queries. kSrv: `a` answers
// the SRV query; `lookup(target_name, out)` answers A and AAAA for a target the additional section
// did not cover (returns "" or an error).
using DnsLookup = std::function<std::string(const std::string& name, std::vector<DnsAnswer>& out)>;
DnsResult dns_result(const DnsTarget& target, const std::vector<DnsAnswer>& answers,
                     const DnsLookup& lookup);

// Resolves `target` now, blocking (each query: 2 s timeout, 2 attempts). Thread-safe: each call
// has its own resolver state.
DnsResult resolve_dns(const DnsTarget& target);

// Re-resolves a target on its own thread and reports the set of workers when it changes.
class DnsWatcher {
 public:
  struct Options {
    std::chrono::milliseconds min_interval{1000};
    std::chrono::milliseconds max_interval{30000};
    // Consecutive empty answers (kEmpty) before the set is emptied. Errors in between neither
    // count nor break the run.
    int empty_drain_after = 3;
  };
  // Monotonic counters, readable from any thread (for metrics).
  struct Stats {
    std::atomic<uint64_t> resolutions{0};    // resolve attempts that ended, any status
    std::atomic<uint64_t> errors{0};         // kError answers
    std::atomic<uint64_t> empty_answers{0};  // kEmpty answers
    std::atomic<uint64_t> changes{0};        // on_change calls
  };
  using Resolve = std::function<DnsResult()>;
  using OnChange = std::function<void(std::vector<std::string> urls)>;

  // Resolves `target` with resolve_dns.
  DnsWatcher(DnsTarget target, Options options, OnChange on_change);
  // Resolves with `resolve` instead (tests inject answers).
  DnsWatcher(Resolve resolve, Options options, OnChange on_change);
  ~DnsWatcher();  // stop()
  DnsWatcher(const DnsWatcher&) = delete;
  DnsWatcher& operator=(const DnsWatcher&) = delete;

  // Starts the thread; the first resolution happens at once. on_change runs on that thread: at
  // the first kOk answer, then whenever the set differs from the last one reported (an empty set
  // after the drain rule). It must not call stop().
  void start();
  // Wakes the thread and joins it. A query in flight finishes first (at most its timeout).
  void stop();
  const Stats& stats() const { return stats_; }

  // The drain rule and the delay, as a state machine (pure; the thread runs it): feed each result,
  // get whether the set changed and how long to wait before the next resolution.
  class State {
   public:
    explicit State(Options options) : options_(options) {}
    struct Step {
      bool changed = false;  // report `urls()` now
      std::chrono::milliseconds next_delay{0};
    };
    Step apply(const DnsResult& result);
    const std::vector<std::string>& urls() const { return urls_; }

   private:
    Options options_;
    std::vector<std::string> urls_;
    bool reported_ = false;  // the first kOk was reported
    int empty_run_ = 0;
  };

 private:
  void run();

  Resolve resolve_;
  Options options_;
  OnChange on_change_;
  Stats stats_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;  // guarded by mu_
  std::thread thread_;
};

}  // namespace kvgate::discovery
