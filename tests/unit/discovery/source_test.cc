// Tests for discovery/source: which URIs a rule's `discovery` (or --discovery) may name, and what
// an etcd URI watches.
#include "discovery/source.h"

#include <gtest/gtest.h>

namespace kvgate::discovery {
namespace {

TEST(DiscoverySpec, DnsAndEtcdUris) {
  Spec s;
  ASSERT_EQ(parse_spec("dns://workers.svc:8000", s), "");
  EXPECT_EQ(s.kind, Spec::Kind::kDns);
  ASSERT_EQ(parse_spec("dns://_http._tcp.workers.svc?server=127.0.0.1:5353", s), "");
  ASSERT_EQ(parse_spec("etcd://127.0.0.1:2379", s), "");
  EXPECT_EQ(s.kind, Spec::Kind::kEtcd);
  EXPECT_EQ(s.etcd_url, "http://127.0.0.1:2379");
  EXPECT_EQ(s.etcd_prefix, "/kvgate/v1/workers/");
  ASSERT_EQ(parse_spec("etcd://etcd.local:2379/Qwen/Qwen3-8B/", s), "");
  EXPECT_EQ(s.etcd_prefix, "/kvgate/v1/workers/Qwen/Qwen3-8B/");
  for (const char* bad : {"etcd://host", "etcd://:2379", "etcd://h:0", "etcd://h:99999",
                          "etcd://h:x", "consul://h:1", "dns://", "workers:80"}) {
    Spec t;
    std::string e = parse_spec(bad, t);
    EXPECT_NE(e, "") << bad;
    EXPECT_NE(e.find("e.g."), std::string::npos) << bad << ": " << e;
  }
}

}  // namespace
}  // namespace kvgate::discovery
