// The knob table is the one place kvgate's defaults are written: every knob a module reads
// reaches that module's config through gateway/knobs (and changes it), and a default-constructed
// module config is not a working configuration (so nothing can run on defaults of its own).
#include "gateway/knobs.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <variant>

namespace kvgate {
namespace {

struct Derived {
  PolicyConfig policy;
  BreakerConfig breaker;
  HealthConfig health;
  RetryConfig retry;
  http::ServerConfig server;
  http::ConnectionPool::Options upstream;
  replica::SyncConfig sync;
  replica::RegistryConfig registry;
  discovery::Source::Options discovery;
  bool operator==(const Derived&) const = default;
};

Derived derive(const GatewayConfig& c) {
  return {policy_config(c), breaker_config(c),   health_config(c),
          retry_config(c),  server_config(c, 0), upstream_pool_options(c),
          sync_config(c),   registry_config(c),  discovery_options(c)};
}

// Sets knob `k` of `c` to another valid value; false if it has no plain field.
bool change(const flags::Knob<GatewayConfig>& k, GatewayConfig& c) {
  return std::visit(
      [&](auto member) -> bool {
        using M = decltype(member);
        if constexpr (std::is_same_v<M, std::monostate>) {
          return false;
        } else {
          auto& v = c.*member;
          using V = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<V, bool>) {
            v = !v;
          } else if constexpr (std::is_same_v<V, int64_t>) {
            v = static_cast<double>(v + 1) <= k.max ? v + 1 : v - 1;
          } else if constexpr (std::is_same_v<V, double>) {
            double up = v + 0.125;
            v = up <= k.max ? up : v - 0.125;
          } else if constexpr (std::is_same_v<V, std::string>) {
            if (!k.choices.empty()) {
              for (auto choice : k.choices) {
                if (choice != v) {
                  v = std::string(choice);
                  break;
                }
              }
            } else {
              v = v + "/x";
            }
          } else {
            v.push_back("x");
          }
          return true;
        }
      },
      k.field);
}

// Knobs read straight from GatewayConfig by the binary (listeners, admission, files, logs...) or
// by a rule, not by a module config built in gateway/knobs.
const std::set<std::string, std::less<>> kReadDirectly = {
    "worker-urls", "log-dir", "log-level", "config", "admin-host", "admin-port", "admin-api-key",
    "admin-api-key-file", "expose-server-info", "prometheus-port", "prometheus-host",
    "prometheus-duration-buckets", "prometheus-short-duration-buckets", "metrics-compat",
    "request-id-headers", "request-timeout-secs", "shutdown-grace-period-secs", "api-key",
    "api-key-file", "allow-target-worker-header", "max-connections", "worker-ca-cert-path",
    "worker-client-cert-path", "worker-client-key-path", "tokenizer-path", "model-path",
    "tokenizer-cache-bytes", "debug-headers", "threads", "max-concurrent-requests", "queue-size",
    "queue-timeout-secs", "backend", "dp-rank-field",
    // the command line's rule (rules::rule_from_flags): its discovery URI
    "discovery",
    // the gateway's response-owner table (gateway/response_owners.h)
    "max-response-owners", "response-owner-ttl-secs",
    // the command line's rule (rules::rule_from_flags): kvExactMode 3 and its kv* fields
    // (kv-dp-rank-count reaches PolicyConfig too: --dp-aware's default ranks per worker)
    "kv-fallback-policy", "kv-block-size", "kv-zmq-port", "kv-warmup-secs",
    // prefill/decode: the command line's rule (its roles and per-side policies), and the request
    // path's choice of how a prefill rank reaches the engine
    "pd-disaggregation", "decode", "prefill-policy", "decode-policy", "pd-prefill-rank"};
// sgl-model-gateway's knobs kvgate accepts and does not use: their help must say so.
const std::set<std::string, std::less<>> kAcceptedUnused = {
    "worker-startup-timeout-secs", "worker-startup-check-interval", "cb-window-duration-secs"};
// Knobs of features not built yet: setting one must be a startup error.
const std::set<std::string, std::less<>> kRefused = {};

TEST(Knobs, EveryKnobAModuleReadsChangesItsConfig) {
  const Derived defaults = derive(GatewayConfig{});
  std::vector<std::string> unplumbed, listed_but_plumbed;
  size_t checked = 0, plumbed = 0;
  for (const auto& k : gateway_knobs()) {
    if (!k.unsupported_reason.empty()) continue;
    GatewayConfig c;
    if (!change(k, c)) continue;
    ++checked;
    bool reaches = !(derive(c) == defaults);
    plumbed += reaches ? 1 : 0;
    bool direct = kReadDirectly.contains(k.name) || kAcceptedUnused.contains(k.name) ||
                  kRefused.contains(k.name);
    if (!reaches && !direct) unplumbed.emplace_back(k.name);
    if (reaches && direct) listed_but_plumbed.emplace_back(k.name);
  }
  // Not vacuous: the table has its knobs, and most of them reach a module.
  EXPECT_GE(checked, 70u);
  EXPECT_GE(plumbed, 35u);
  std::string a, b;
  for (const auto& n : unplumbed) a += " --" + n;
  for (const auto& n : listed_but_plumbed) b += " --" + n;
  EXPECT_TRUE(unplumbed.empty()) << "knobs that reach no module config (add them to "
                                    "gateway/knobs.cc, or to a list above if the binary reads "
                                    "them itself):"
                                 << a;
  EXPECT_TRUE(listed_but_plumbed.empty())
      << "listed as read directly but they reach a module:" << b;
}

TEST(Knobs, NoKnobIsSilentlyIgnored) {
  GatewayConfig base;
  base.worker_urls = {"http://127.0.0.1:1"};
  ASSERT_EQ(validate(base), "");
  size_t seen_unused = 0, seen_refused = 0;
  for (const auto& k : gateway_knobs()) {
    if (kAcceptedUnused.contains(k.name)) {
      ++seen_unused;
      EXPECT_NE(k.help.find("Accepted for compatibility"), std::string_view::npos) << k.name;
    }
    if (kRefused.contains(k.name)) {
      ++seen_refused;
      GatewayConfig c = base;
      if (k.name == "decode") {
        c.decode = {"http://127.0.0.1:2"};
      } else {
        ASSERT_TRUE(change(k, c)) << k.name;
      }
      EXPECT_NE(validate(c), "") << "--" << k.name << " is accepted but nothing reads it";
    }
  }
  EXPECT_EQ(seen_unused, kAcceptedUnused.size());
  EXPECT_EQ(seen_refused, kRefused.size());
}

TEST(Knobs, DefaultConstructedModuleConfigsCarryNoDefaultsOfTheirOwn) {
  // Built from the table they differ from a plain {}: nothing silently runs on a struct's own
  // numbers (PolicyConfig, BreakerConfig, HealthConfig and RetryConfig have none).
  const GatewayConfig d;
  EXPECT_NE(policy_config(d), PolicyConfig{});
  EXPECT_NE(breaker_config(d), BreakerConfig{});
  EXPECT_NE(health_config(d), HealthConfig{});
  EXPECT_NE(retry_config(d), RetryConfig{});
  EXPECT_EQ(PolicyConfig{}.cache_threshold, 0);
  EXPECT_FALSE(BreakerConfig{}.enabled);
  EXPECT_EQ(HealthConfig{}.interval.count(), 0);
  EXPECT_EQ(RetryConfig{}.max_attempts, 1);
  // The rule's sel names the policy; the command line's --policy otherwise.
  EXPECT_EQ(policy_config(d, "chwbl").name, "chwbl");
  EXPECT_EQ(policy_config(d).name, d.policy);
}

}  // namespace
}  // namespace kvgate
