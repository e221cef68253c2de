// discovery/dns: dns:// URIs, DNS answers, resolution with libresolv, and the watcher thread.
//
// Why res_nmkquery + res_nsend rather than res_nquery: res_nquery returns -1 for NXDOMAIN and for
// an answer without records, dropping the answer's length, so the SOA record that carries the
// negative TTL (RFC 2308) could not be read. res_nsend returns every answer; its rcode is ours to
// read, in parse_dns_answer, the same code the fuzzer runs.
#include "discovery/dns.h"

#include <arpa/inet.h>
#include <arpa/nameser.h>
#include <netinet/in.h>
#include <resolv.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstring>
#include <set>

#include "util/log.h"

namespace kvgate::discovery {
namespace {

constexpr std::string_view kExamples =
    "; e.g. dns://sglang.default.svc.cluster.local:8000 (A/AAAA records, port 8000) or "
    "dns://_http._tcp.sglang.default.svc.cluster.local (SRV records), optionally with "
    "?server=10.0.0.10:53&scheme=https";

std::string bad(const std::string& what) {
  return std::string(what) + std::string(kExamples);
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool parse_port(std::string_view s, uint16_t& out) {
  if (s.empty() || s.size() > 5) return false;
  uint32_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<uint32_t>(c - '0');
  }
  if (v == 0 || v > 65535) return false;
  out = static_cast<uint16_t>(v);
  return true;
}

// A DNS name as a URI may carry it: labels of 1-63 letters, digits, '-' or '_', 253 bytes at most.
std::string check_name(std::string_view name) {
  if (name.empty()) return "the name is empty";
  if (name.size() > 253) return "the name is longer than 253 characters";
  size_t start = 0;
  while (start <= name.size()) {
    size_t dot = name.find('.', start);
    if (dot == std::string_view::npos) dot = name.size();
    std::string_view label = name.substr(start, dot - start);
    if (label.empty()) return "the name '" + std::string(name) + "' has an empty label";
    if (label.size() > 63) return "a label of '" + std::string(name) + "' is longer than 63";
    for (char c : label) {
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') {
        return "the name '" + std::string(name) + "' holds '" + std::string(1, c) +
               "' (letters, digits, '-', '_' and dots only)";
      }
    }
    start = dot + 1;
  }
  return "";
}

uint32_t ttl_of(uint32_t raw) {
  // RFC 2181 8: a TTL with the top bit set is to be read as zero.
  return raw > 0x7fffffffu ? 0 : raw;
}

}  // namespace

std::string parse_dns_uri(std::string_view uri, DnsTarget& out) {
  out = DnsTarget{};
  constexpr std::string_view kScheme = "dns://";
  if (uri.substr(0, kScheme.size()) != kScheme) {
    return bad("a DNS discovery URI starts with dns://, got '" + std::string(uri) + "'");
  }
  std::string_view rest = uri.substr(kScheme.size());
  std::string_view query;
  if (size_t q = rest.find('?'); q != std::string_view::npos) {
    query = rest.substr(q + 1);
    rest = rest.substr(0, q);
  }
  if (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  if (rest.find('/') != std::string_view::npos) {
    return bad("a dns:// URI has no path, got '" + std::string(uri) + "'");
  }
  std::string_view host = rest;
  std::string_view port;
  if (size_t colon = rest.rfind(':'); colon != std::string_view::npos) {
    host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
    if (port.empty()) return bad("the port after ':' is missing in '" + std::string(uri) + "'");
  }
  if (!host.empty() && host.back() == '.') host.remove_suffix(1);  // an absolute name
  if (std::string e = check_name(host); !e.empty()) {
    return bad(e + " in '" + std::string(uri) + "'");
  }
  out.name = lower(host);
  bool srv = host.front() == '_';
  if (srv) {
    size_t dot = host.find('.');
    if (dot == std::string_view::npos || dot + 1 >= host.size() || host[dot + 1] != '_' ||
        host.find('.', dot + 1) == std::string_view::npos) {
      return bad("an SRV name is _service._proto.NAME, got '" + std::string(host) + "'");
    }
    if (!port.empty()) {
      return bad("an SRV name takes its ports from the records: drop ':" + std::string(port) +
                 "' from '" + std::string(uri) + "'");
    }
    out.kind = DnsTarget::Kind::kSrv;
  } else {
    if (port.empty()) {
      return bad(
          "'" + std::string(uri) +
          "' needs the workers' port (dns://NAME:PORT), or an SRV name (_service._proto.NAME)");
    }
    if (!parse_port(port, out.port)) {
      return bad("the port '" + std::string(port) + "' is not a number from 1 to 65535");
    }
    out.kind = DnsTarget::Kind::kAddress;
  }
  while (!query.empty()) {
    size_t amp = query.find('&');
    std::string_view param = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (param.empty()) continue;
    size_t eq = param.find('=');
    std::string_view key = param.substr(0, eq);
    std::string_view value =
        eq == std::string_view::npos ? std::string_view() : param.substr(eq + 1);
    if (key == "scheme") {
      if (value != "http" && value != "https") {
        return bad("?scheme is http or https, got '" + std::string(value) + "'");
      }
      out.scheme = std::string(value);
    } else if (key == "server") {
      std::string_view ip = value;
      if (size_t colon = value.rfind(':'); colon != std::string_view::npos) {
        ip = value.substr(0, colon);
        if (!parse_port(value.substr(colon + 1), out.server_port)) {
          return bad("the port of ?server='" + std::string(value) +
                     "' is not a number from 1 to 65535");
        }
      }
      in_addr addr{};
      std::string ip_text(ip);
      if (::inet_pton(AF_INET, ip_text.c_str(), &addr) != 1) {
        return bad("?server is an IPv4 address with an optional port (127.0.0.1:5353), got '" +
                   std::string(value) + "'");
      }
      out.server = ip_text;
    } else {
      return bad("unknown parameter '" + std::string(key) + "' (known: server, scheme)");
    }
  }
  return "";
}

std::string parse_dns_answer(const unsigned char* msg, size_t len, DnsAnswer& out) {
  out = DnsAnswer{};
  if (msg == nullptr || len < NS_HFIXEDSZ) return "shorter than a DNS header";
  if (len > 65535) return "longer than a DNS message can be";
  ns_msg handle{};
  if (::ns_initparse(msg, static_cast<int>(len), &handle) < 0) {
    return "malformed DNS message (its sections do not fit its length)";
  }
  out.rcode = ::ns_msg_getflag(handle, ns_f_rcode);
  out.truncated = ::ns_msg_getflag(handle, ns_f_tc) != 0;
  const unsigned char* eom = msg + len;
  for (ns_sect section : {ns_s_an, ns_s_ns, ns_s_ar}) {
    int count = ns_msg_count(handle, section);
    for (int i = 0; i < count; ++i) {
      ns_rr rr{};
      if (::ns_parserr(&handle, section, i, &rr) < 0) return "malformed resource record";
      if (ns_rr_class(rr) != ns_c_in) continue;
      const unsigned char* rdata = ns_rr_rdata(rr);
      size_t rdlen = ns_rr_rdlen(rr);
      uint32_t ttl = ttl_of(ns_rr_ttl(rr));
      int type = ns_rr_type(rr);
      if ((type == ns_t_a && rdlen == 4) || (type == ns_t_aaaa && rdlen == 16)) {
        if (section == ns_s_ns) continue;
        auto& list = section == ns_s_an ? out.addresses : out.additional;
        if (list.size() >= kMaxDnsUrls) continue;
        char text[INET6_ADDRSTRLEN] = {};
        if (::inet_ntop(type == ns_t_a ? AF_INET : AF_INET6, rdata, text, sizeof text) == nullptr) {
          continue;
        }
        list.push_back({lower(ns_rr_name(rr)), text, ttl});
      } else if (type == ns_t_a || type == ns_t_aaaa) {
        return "an address record of the wrong length";
      } else if (type == ns_t_srv && section == ns_s_an) {
        if (rdlen < 7) return "an SRV record shorter than its fixed fields";
        char target[NS_MAXDNAME] = {};
        int n = ::dn_expand(msg, eom, rdata + 6, target, sizeof target);
        if (n < 0 || static_cast<size_t>(n) + 6 > rdlen)
          return "an SRV record's target is malformed";
        if (out.srv.size() >= kMaxDnsUrls) continue;
        DnsAnswer::Srv s;
        s.priority = static_cast<uint16_t>(::ns_get16(rdata));
        s.weight = static_cast<uint16_t>(::ns_get16(rdata + 2));
        s.port = static_cast<uint16_t>(::ns_get16(rdata + 4));
        s.target = lower(target);
        if (!s.target.empty() && s.target.back() == '.') s.target.pop_back();
        s.ttl = ttl;
        out.srv.push_back(std::move(s));
      } else if (type == ns_t_soa && section == ns_s_ns) {
        // MNAME and RNAME (compressed names), then five 32-bit fields; MINIMUM is the last.
        char name[NS_MAXDNAME] = {};
        int m = ::dn_expand(msg, eom, rdata, name, sizeof name);
        if (m < 0 || static_cast<size_t>(m) > rdlen) return "an SOA record is malformed";
        int r = ::dn_expand(msg, eom, rdata + m, name, sizeof name);
        if (r < 0 || static_cast<size_t>(m) + static_cast<size_t>(r) + 20 > rdlen) {
          return "an SOA record is malformed";
        }
        uint32_t minimum = ttl_of(::ns_get32(rdata + m + r + 16));
        int64_t negative = std::min(ttl, minimum);
        out.negative_ttl = out.negative_ttl < 0 ? negative : std::min(out.negative_ttl, negative);
      }
    }
  }
  return "";
}

namespace {

// How one answer counts: its records, no records, or a failure.
enum class Kind : uint8_t { kRecords, kNone, kFailed };
Kind classify(const DnsAnswer& a, bool has_records, std::string& error) {
  if (a.rcode == ns_r_nxdomain) return Kind::kNone;
  if (a.rcode != ns_r_noerror) {
    error = "the nameserver answered rcode " + std::to_string(a.rcode) +
            (a.rcode == ns_r_servfail  ? " (SERVFAIL)"
             : a.rcode == ns_r_refused ? " (REFUSED)"
                                       : "");
    return Kind::kFailed;
  }
  return has_records ? Kind::kRecords : Kind::kNone;
}

std::string url_of(const std::string& scheme, const std::string& ip, uint16_t port) {
  bool v6 = ip.find(':') != std::string::npos;
  return scheme + "://" + (v6 ? "[" + ip + "]" : ip) + ":" + std::to_string(port);
}

DnsResult finish(std::set<std::string>& urls, int64_t ttl) {
  DnsResult r;
  r.status = DnsResult::kOk;
  for (auto it = urls.begin(); it != urls.end() && r.urls.size() < kMaxDnsUrls; ++it) {
    r.urls.push_back(*it);
  }
  r.ttl_secs = ttl < 0 ? 0 : static_cast<uint32_t>(ttl);
  return r;
}

DnsResult failed(std::string error) {
  DnsResult r;
  r.status = DnsResult::kError;
  r.error = std::move(error);
  return r;
}

DnsResult empty(int64_t negative_ttl) {
  DnsResult r;
  r.status = DnsResult::kEmpty;
  r.ttl_secs = negative_ttl < 0 ? 0 : static_cast<uint32_t>(negative_ttl);
  return r;
}

void take_min(int64_t& acc, int64_t v) {
  acc = acc < 0 ? v : std::min(acc, v);
}

}  // namespace

DnsResult dns_result(const DnsTarget& target, const std::vector<DnsAnswer>& answers,
                     const DnsLookup& lookup) {
  std::set<std::string> urls;
  int64_t ttl = -1, negative = -1;
  std::string error;
  if (target.kind == DnsTarget::Kind::kAddress) {
    if (answers.size() != 2)
      return failed("internal: an address lookup needs the A and AAAA answers");
    for (const DnsAnswer& a : answers) {
      Kind k = classify(a, !a.addresses.empty(), error);
      if (k == Kind::kFailed) return failed(error);
      if (k == Kind::kNone) {
        if (a.negative_ttl >= 0) take_min(negative, a.negative_ttl);
        continue;
      }
      for (const auto& addr : a.addresses) {
        if (urls.size() >= kMaxDnsUrls) break;
        urls.insert(url_of(target.scheme, addr.ip, target.port));
        take_min(ttl, addr.ttl);
      }
    }
    if (urls.empty()) return empty(negative);
    return finish(urls, ttl);
  }
  if (answers.size() != 1) return failed("internal: an SRV lookup needs one answer");
  const DnsAnswer& a = answers[0];
  Kind k = classify(a, !a.srv.empty(), error);
  if (k == Kind::kFailed) return failed(error);
  if (k == Kind::kNone) return empty(a.negative_ttl);
  // Every target is a worker, whatever its priority and weight: the gateway balances by itself.
  std::set<std::string> looked_up;
  for (const auto& s : a.srv) {
    if (s.target.empty() || s.target == ".") continue;  // "." : no service (RFC 2782)
    if (urls.size() >= kMaxDnsUrls) break;
    bool found = false;
    for (const auto& addr : a.additional) {
      if (addr.name != s.target) continue;
      found = true;
      urls.insert(url_of(target.scheme, addr.ip, s.port));
      take_min(ttl, std::min(s.ttl, addr.ttl));
    }
    if (found) continue;
    if (looked_up.size() >= kMaxSrvTargets && !looked_up.contains(s.target)) continue;
    looked_up.insert(s.target);
    std::vector<DnsAnswer> own;
    if (!lookup) return failed("no addresses for SRV target " + s.target);
    if (std::string e = lookup(s.target, own); !e.empty()) return failed(e);
    for (const DnsAnswer& t : own) {
      Kind tk = classify(t, !t.addresses.empty(), error);
      if (tk == Kind::kFailed) return failed(error + " for SRV target " + s.target);
      if (tk == Kind::kNone) continue;  // a target without addresses is skipped
      for (const auto& addr : t.addresses) {
        if (urls.size() >= kMaxDnsUrls) break;
        urls.insert(url_of(target.scheme, addr.ip, s.port));
        take_min(ttl, std::min(s.ttl, addr.ttl));
      }
    }
  }
  if (urls.empty()) return empty(a.negative_ttl);
  return finish(urls, ttl);
}

namespace {

// A private resolver state (res_ninit reads /etc/resolv.conf), optionally pointed at one server.
class Resolver {
 public:
  explicit Resolver(const DnsTarget& target) {
    std::memset(&state_, 0, sizeof state_);
    if (::res_ninit(&state_) != 0) {
      error_ = "cannot initialize the resolver (res_ninit: is /etc/resolv.conf readable?)";
      return;
    }
    ready_ = true;
    // Bounded: 2 s per try, 2 tries per server.
    state_.retrans = 2;
    state_.retry = 2;
    if (!target.server.empty()) {
      sockaddr_in sa{};
      sa.sin_family = AF_INET;
      sa.sin_port = htons(target.server_port);
      ::inet_pton(AF_INET, target.server.c_str(), &sa.sin_addr);
      state_.nsaddr_list[0] = sa;  // res_send copies it over its cached list (IPv6 ones too)
      state_.nscount = 1;
    }
    if (state_.nscount <= 0) error_ = "no nameserver configured (/etc/resolv.conf, or ?server=)";
  }
  ~Resolver() {
    if (ready_) ::res_nclose(&state_);
  }
  Resolver(const Resolver&) = delete;
  Resolver& operator=(const Resolver&) = delete;
  const std::string& error() const { return error_; }

  // One query; "" or why no usable answer arrived.
  std::string query(const std::string& name, int type, DnsAnswer& out) {
    unsigned char q[NS_PACKETSZ];
    int qlen = ::res_nmkquery(&state_, ns_o_query, name.c_str(), ns_c_in, type, nullptr, 0, nullptr,
                              q, sizeof q);
    if (qlen < 0) return "cannot build a query for '" + name + "'";
    answer_.resize(NS_MAXMSG);
    errno = 0;
    int n = ::res_nsend(&state_, q, qlen, answer_.data(), static_cast<int>(answer_.size()));
    if (n < 0) {
      std::string why = errno == ETIMEDOUT || errno == 0 ? "timed out" : std::strerror(errno);
      return "no answer from the nameserver for '" + name + "' (" + why + ")";
    }
    size_t len = std::min(static_cast<size_t>(n), answer_.size());
    if (std::string e = parse_dns_answer(answer_.data(), len, out); !e.empty()) {
      return "the answer for '" + name + "' is " + e;
    }
    return "";
  }

 private:
  struct __res_state state_;
  bool ready_ = false;
  std::string error_;
  std::vector<unsigned char> answer_;
};

}  // namespace

DnsResult resolve_dns(const DnsTarget& target) {
  Resolver resolver(target);
  if (!resolver.error().empty()) return failed(resolver.error());
  auto addresses = [&](const std::string& name, std::vector<DnsAnswer>& out) -> std::string {
    out.assign(2, DnsAnswer{});
    if (std::string e = resolver.query(name, ns_t_a, out[0]); !e.empty()) return e;
    return resolver.query(name, ns_t_aaaa, out[1]);
  };
  std::vector<DnsAnswer> answers;
  if (target.kind == DnsTarget::Kind::kAddress) {
    if (std::string e = addresses(target.name, answers); !e.empty()) return failed(e);
    return dns_result(target, answers, nullptr);
  }
  answers.resize(1);
  if (std::string e = resolver.query(target.name, ns_t_srv, answers[0]); !e.empty()) {
    return failed(e);
  }
  return dns_result(target, answers, addresses);
}

DnsWatcher::State::Step DnsWatcher::State::apply(const DnsResult& result) {
  Step step;
  auto clamp = [&](uint32_t ttl_secs) {
    auto lo = options_.min_interval;
    auto hi = std::max(options_.max_interval, lo);
    auto ttl = std::chrono::milliseconds(int64_t{ttl_secs} * 1000);
    return std::clamp(ttl, lo, hi);
  };
  switch (result.status) {
    case DnsResult::kOk:
      empty_run_ = 0;
      step.changed = !reported_ || result.urls != urls_;
      urls_ = result.urls;
      reported_ = true;
      step.next_delay = clamp(result.ttl_secs);
      break;
    case DnsResult::kEmpty:
      ++empty_run_;
      if (empty_run_ >= std::max(options_.empty_drain_after, 1) && !urls_.empty()) {
        urls_.clear();
        step.changed = true;
      }
      step.next_delay = clamp(result.ttl_secs);
      break;
    case DnsResult::kError:
      step.next_delay = options_.min_interval;  // the set stays: retry soon
      break;
  }
  return step;
}

DnsWatcher::DnsWatcher(DnsTarget target, Options options, OnChange on_change)
    : DnsWatcher([target = std::move(target)] { return resolve_dns(target); }, options,
                 std::move(on_change)) {}

DnsWatcher::DnsWatcher(Resolve resolve, Options options, OnChange on_change)
    : resolve_(std::move(resolve)), options_(options), on_change_(std::move(on_change)) {}

DnsWatcher::~DnsWatcher() {
  stop();
}

void DnsWatcher::start() {
  std::lock_guard lock(mu_);
  if (thread_.joinable() || stopping_) return;
  thread_ = std::thread([this] { run(); });
}

void DnsWatcher::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

void DnsWatcher::run() {
  State state(options_);
  static log::RateLimit error_limit(5, std::chrono::seconds(60));
  while (true) {
    DnsResult result;
    try {
      result = resolve_();
    } catch (const std::exception& e) {
      result = failed(std::string("resolution threw: ") + e.what());
    } catch (...) {
      result = failed("resolution threw");
    }
    stats_.resolutions.fetch_add(1, std::memory_order_relaxed);
    if (result.status == DnsResult::kError) {
      stats_.errors.fetch_add(1, std::memory_order_relaxed);
      if (auto l = log::warn(error_limit, "dns discovery failed, keeping the last workers")) {
        l.kv("error", result.error);
      }
    } else if (result.status == DnsResult::kEmpty) {
      stats_.empty_answers.fetch_add(1, std::memory_order_relaxed);
    }
    State::Step step = state.apply(result);
    {
      // Stopped during the query: its answer goes nowhere (the owner may be gone).
      std::lock_guard lock(mu_);
      if (stopping_) return;
    }
    if (step.changed) {
      stats_.changes.fetch_add(1, std::memory_order_relaxed);
      log::info("dns discovery: workers changed").kv("count", state.urls().size());
      try {
        on_change_(state.urls());
      } catch (...) {
        log::error("dns discovery: on_change threw");
      }
    }
    std::unique_lock lock(mu_);
    if (cv_.wait_for(lock, step.next_delay, [this] { return stopping_; })) return;
  }
}

}  // namespace kvgate::discovery
