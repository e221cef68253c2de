// Tests for replica/sync without a NATS server: the JetStream history stream's name (one per
// subject prefix, never shared by two prefixes, always a valid stream name), the history's
// settings derived from the knobs (cache_aware's TTL, the byte bound), and a Sync whose NATS is
// not there: start() succeeds and there is no history; --replica-registry's URL and validation.
#include "replica/sync.h"

#include <gtest/gtest.h>

#include <set>

#include "gateway/knobs.h"
#include "replica/registry.h"
#include "support/process.h"

namespace kvgate::replica {
namespace {

bool valid_stream_name(const std::string& name) {
  for (char c : name) {
    const bool ok = (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
    if (!ok) return false;
  }
  return !name.empty() && name.size() <= 64;
}

TEST(SyncStreamName, IsThePrefixUpperCasedWhenThatIsExact) {
  EXPECT_EQ(Sync::stream_name("kvgate"), "KVGATE_KVGATE");
  EXPECT_EQ(Sync::stream_name("fleet-2_eu"), "KVGATE_FLEET-2_EU");
}

TEST(SyncStreamName, ReplacesWhatAStreamNameMayNotHoldAndAddsAHash) {
  const std::string dotted = Sync::stream_name("prod.kvgate");
  EXPECT_EQ(dotted.rfind("KVGATE_PROD_KVGATE_", 0), 0u) << dotted;
  EXPECT_EQ(dotted.size(), std::string("KVGATE_PROD_KVGATE_").size() + 8) << dotted;
  // Two prefixes never share a stream (their subjects differ, so would their records).
  std::set<std::string> names;
  const std::vector<std::string> prefixes = {"prod.kvgate",
                                             "prod_kvgate",
                                             "prod*kvgate",
                                             "prod>kvgate",
                                             "Prod_kvgate",
                                             "PROD_KVGATE",
                                             "a b",
                                             "a/b",
                                             "a\\b",
                                             "a\tb",
                                             "",
                                             std::string(200, 'x'),
                                             std::string(201, 'x')};
  for (const std::string& p : prefixes) {
    const std::string name = Sync::stream_name(p);
    EXPECT_TRUE(valid_stream_name(name)) << p << " -> " << name;
    EXPECT_TRUE(names.insert(name).second) << p << " -> " << name << " is taken";
  }
  // The same prefix, the same stream (every replica of a fleet finds it).
  EXPECT_EQ(Sync::stream_name("prod.kvgate"), dotted);
}

TEST(SyncConfig, HistoryIsCacheAwaresTtlAndTheByteBound) {
  kvgate::GatewayConfig c;
  SyncConfig s = sync_config(c);
  EXPECT_EQ(s.history, std::chrono::seconds(c.eviction_interval));
  EXPECT_EQ(s.history_bytes, 64 << 20);
  c.eviction_interval = 600;
  c.replica_sync_history_bytes = 0;
  s = sync_config(c);
  EXPECT_EQ(s.history, std::chrono::seconds(600));
  EXPECT_EQ(s.history_bytes, 0);
}

TEST(Sync, WithoutNatsStartsAndHasNoHistory) {
  SyncConfig c;
  c.url = "nats://127.0.0.1:" + std::to_string(testing::free_port());  // nobody there
  c.name = "unit";
  c.history = std::chrono::seconds(120);
  Sync sync(c, nullptr);
  ASSERT_EQ(sync.start(), "");  // routing never waits for NATS
  EXPECT_FALSE(sync.connected());
  EXPECT_FALSE(sync.history());
  const uint64_t token = sync.add_sink("default", [](const ChainRecord&) {});
  EXPECT_NE(sync.status_json().find("\"history\":false"), std::string::npos);
  sync.remove_sink(token);
  sync.stop();
}

}  // namespace
TEST(RegistryUrl, TakesEtcdHostAndPortOnly) {
  std::string url;
  EXPECT_EQ(parse_registry_url("etcd://127.0.0.1:2379", url), "");
  EXPECT_EQ(url, "http://127.0.0.1:2379");
  for (const char* bad : {"http://127.0.0.1:2379", "etcd://127.0.0.1", "etcd://:2379",
                          "etcd://127.0.0.1:2379/llama", "etcd://h:0", ""}) {
    const std::string e = parse_registry_url(bad, url);
    EXPECT_NE(e, "") << bad;
    EXPECT_NE(e.find("--replica-registry"), std::string::npos) << e;
  }
}

TEST(RegistryUrl, ValidationWantsReplicaSyncBeside) {
  kvgate::GatewayConfig c;
  c.worker_urls = {"http://127.0.0.1:1"};
  c.replica_registry = "etcd://127.0.0.1:2379";
  EXPECT_NE(validate(c).find("needs --replica-sync"), std::string::npos) << validate(c);
  c.replica_sync = "nats://127.0.0.1:4222";
  EXPECT_EQ(validate(c), "");
  c.replica_registry = "etcd://127.0.0.1:2379/m";
  EXPECT_NE(validate(c).find("without a path"), std::string::npos) << validate(c);
}

}  // namespace kvgate::replica
