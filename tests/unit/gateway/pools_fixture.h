// tests/unit/gateway/pools_fixture: a PoolManager with its environment (config, metrics, control
// loop), for the unit tests of what is built on rules (pools_test, stats_test), and the plain
// rule they apply.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <memory>
#include <string>
#include <vector>

#include "gateway/knobs.h"
#include "gateway/pools.h"
#include "metrics/metrics.h"

namespace kvgate::testing {

// A round_robin rule of mode 4 over `urls`, serving `models` (none: a catch-all).
inline rules::Rule make_rule(std::string name, std::vector<std::string> urls,
                             std::vector<std::string> models = {}) {
  rules::Rule r;
  r.name = std::move(name);
  r.mode = 4;
  r.sel = "round_robin";
  r.models = std::move(models);
  for (auto& u : urls) r.endpoints.push_back({.url = std::move(u)});
  return r;
}

class PoolsFixture : public ::testing::Test {
 protected:
  PoolsFixture() {
    env_.config = &cfg_;
    env_.metrics = &metrics_;
    env_.registry = &registry_;
    env_.control = &control_;
    env_.next_worker_id = &next_id_;
    env_.health = health_config(cfg_);
    pools_ = std::make_unique<PoolManager>(env_);
  }

  GatewayConfig cfg_;
  metrics::Registry registry_;
  GatewayMetrics metrics_{registry_, metrics::latency_buckets()};
  boost::asio::io_context control_;
  std::atomic<uint64_t> next_id_{1};
  PoolEnv env_;
  std::unique_ptr<PoolManager> pools_;
};

}  // namespace kvgate::testing
