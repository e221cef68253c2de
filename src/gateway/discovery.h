// gateway/discovery: keeps one discovery watcher (discovery/source.h) per `discovery` URI the
// rules in force use (a rule's field, or --discovery for the command line's rule), started and
// stopped as rules change, and hands what each finds to the PoolManager on the control loop
// (PoolManager::set_discovered), which rebuilds the rules watching it with the endpoints added.
//
// Metrics per URI: kvgate_discovery_endpoints (found now), kvgate_discovery_changes_total,
// kvgate_discovery_lookups_total and kvgate_discovery_errors_total (resolutions or etcd reads
// and watch events, and those that failed).
//
// Threads: every method on the control loop; watchers call back from their own threads, and
// what they found is posted to the control loop.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "discovery/source.h"
#include "http/io.h"
#include "metrics/metrics.h"
#include "rules/rule.h"

namespace kvgate {

class PoolManager;

class DiscoveryManager {
 public:
  DiscoveryManager(asio::io_context& control, PoolManager& pools, metrics::Registry* registry,
                   discovery::Source::Options options);
  ~DiscoveryManager();
  DiscoveryManager(const DiscoveryManager&) = delete;
  DiscoveryManager& operator=(const DiscoveryManager&) = delete;

  // Watches every discovery URI of `rules` (new ones started), and no other (stopped).
  void reconcile(const std::vector<rules::Rule>& rules);
  // Stops every watcher; what they found meanwhile is dropped.
  void stop();
  size_t watching() const { return watches_.size(); }

 private:
  struct Watch {
    std::unique_ptr<discovery::Source> source;
    std::shared_ptr<bool> alive;  // read on the control loop only
  };
  void found(const std::string& uri, const std::vector<discovery::FoundEndpoint>& endpoints);

  asio::io_context& control_;
  PoolManager& pools_;
  discovery::Source::Options options_;
  std::map<std::string, Watch> watches_;
  // The collector's view of the sources' counters (it may run after stop()).
  struct Shared {
    std::mutex mu;
    std::map<std::string, discovery::Source*> sources;
  };
  std::shared_ptr<Shared> shared_ = std::make_shared<Shared>();
  metrics::GaugeFamily* endpoints_ = nullptr;
  metrics::CounterFamily* changes_ = nullptr;
};

}  // namespace kvgate
