// Fuzz target: DNS answers (the bytes a nameserver, or anyone who can spoof one on the path,
// sends to discovery/dns). parse_dns_answer never reads outside the message and keeps its lists
// within kMaxDnsUrls; dns_result over those answers (both URI forms; an SRV target's lookup
// answered from the same bytes) gives sorted, unique URLs within the bound, a kOk with at least
// one URL, and an error text exactly when it fails.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "discovery/dns.h"

namespace {

void check(const kvgate::discovery::DnsResult& r) {
  using kvgate::discovery::DnsResult;
  if (r.urls.size() > kvgate::discovery::kMaxDnsUrls) __builtin_trap();
  if (!std::is_sorted(r.urls.begin(), r.urls.end())) __builtin_trap();
  if (std::adjacent_find(r.urls.begin(), r.urls.end()) != r.urls.end()) __builtin_trap();
  if ((r.status == DnsResult::kOk) != !r.urls.empty()) __builtin_trap();
  if ((r.status == DnsResult::kError) == r.error.empty()) __builtin_trap();
  for (const auto& u : r.urls) {
    if (u.rfind("http://", 0) != 0) __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvgate::discovery;
  DnsAnswer a;
  std::string err = parse_dns_answer(data, size, a);
  if (a.addresses.size() > kMaxDnsUrls || a.additional.size() > kMaxDnsUrls ||
      a.srv.size() > kMaxDnsUrls) {
    __builtin_trap();
  }
  for (const auto& addr : a.addresses) {
    if (addr.ip.empty() || addr.ttl > 0x7fffffffu) __builtin_trap();
  }
  if (a.negative_ttl > 0x7fffffff) __builtin_trap();
  if (!err.empty()) return 0;
  DnsTarget address;
  address.name = "w.test";
  address.port = 8000;
  check(dns_result(address, {a, a}, nullptr));
  DnsTarget srv;
  srv.kind = DnsTarget::Kind::kSrv;
  srv.name = "_http._tcp.w.test";
  size_t lookups = 0;
  auto lookup = [&](const std::string&, std::vector<DnsAnswer>& out) -> std::string {
    if (++lookups > kMaxSrvTargets) __builtin_trap();
    out = {a, a};
    return "";
  };
  check(dns_result(srv, {a}, lookup));
  return 0;
}
