// gateway/discovery: see discovery.h.
#include "gateway/discovery.h"

#include <boost/asio/post.hpp>
#include <set>
#include <thread>

#include "gateway/pools.h"
#include "http/client.h"
#include "util/log.h"

namespace kvgate {

DiscoveryManager::DiscoveryManager(asio::io_context& control, PoolManager& pools,
                                   metrics::Registry* registry, discovery::Source::Options options)
    : control_(control), pools_(pools), options_(options) {
  if (!registry) return;
  endpoints_ = &registry->gauge("kvgate_discovery_endpoints",
                                "Endpoints each discovery URI (a rule's discovery, --discovery) "
                                "finds now",
                                {"uri"});
  changes_ = &registry->counter("kvgate_discovery_changes_total",
                                "Times what a discovery URI finds changed (workers added or "
                                "removed)",
                                {"uri"});
  auto* lookups = &registry->counter("kvgate_discovery_lookups_total",
                                     "DNS resolutions, or etcd reads and watch events, of each "
                                     "discovery URI",
                                     {"uri"});
  auto* errors = &registry->counter("kvgate_discovery_errors_total",
                                    "Failed DNS resolutions or etcd calls of each discovery URI "
                                    "(the endpoints found last are kept)",
                                    {"uri"});
  registry->add_collector([shared = shared_, lookups, errors] {
    std::lock_guard lock(shared->mu);
    for (const auto& [uri, source] : shared->sources) {
      const auto s = source->stats();
      lookups->with({uri}).mirror(s.lookups);
      errors->with({uri}).mirror(s.errors);
    }
  });
}

DiscoveryManager::~DiscoveryManager() {
  stop();
}

void DiscoveryManager::reconcile(const std::vector<rules::Rule>& rules) {
  std::set<std::string> wanted;
  for (const auto& r : rules) {
    if (!r.discovery.empty()) wanted.insert(r.discovery);
  }
  for (auto it = watches_.begin(); it != watches_.end();) {
    if (wanted.contains(it->first)) {
      ++it;
      continue;
    }
    log::info("discovery stopped: no rule uses it").kv("uri", it->first);
    *it->second.alive = false;
    {
      std::lock_guard lock(shared_->mu);
      shared_->sources.erase(it->first);
    }
    // Its thread may be inside a DNS query (seconds): it is joined on a thread of its own, not on
    // the control loop (what it finds meanwhile goes nowhere: `alive` is false).
    std::thread([source = std::move(it->second.source)]() mutable { source.reset(); }).detach();
    if (endpoints_) endpoints_->remove({it->first});
    if (changes_) changes_->remove({it->first});
    pools_.forget_discovered(it->first);  // a rule using it again starts from its first answer
    it = watches_.erase(it);
  }
  for (const auto& uri : wanted) {
    if (watches_.contains(uri)) continue;
    discovery::Spec spec;
    if (std::string e = discovery::parse_spec(uri, spec); !e.empty()) {
      log::error("discovery: bad URI").kv("uri", uri).kv("error", e);  // (validated before)
      continue;
    }
    auto alive = std::make_shared<bool>(true);
    std::string error;
    auto source = discovery::Source::start(
        spec, options_,
        [this, alive, uri, &control = control_](std::vector<discovery::FoundEndpoint> found) {
          // From the watcher's thread: the rules change on the control loop.
          boost::asio::post(control, [this, alive, uri, found = std::move(found)] {
            if (*alive) this->found(uri, found);
          });
        },
        error);
    if (!source) {
      log::error("discovery cannot start").kv("uri", uri).kv("error", error);
      continue;
    }
    log::info("discovery started").kv("uri", uri);
    {
      std::lock_guard lock(shared_->mu);
      shared_->sources[uri] = source.get();
    }
    watches_.emplace(uri, Watch{std::move(source), std::move(alive)});
  }
}

void DiscoveryManager::stop() {
  {
    std::lock_guard lock(shared_->mu);
    shared_->sources.clear();
  }
  for (auto& [uri, w] : watches_) {
    *w.alive = false;
    w.source->stop();
  }
  watches_.clear();
}

void DiscoveryManager::found(const std::string& uri,
                             const std::vector<discovery::FoundEndpoint>& endpoints) {
  std::vector<rules::Endpoint> eps;
  eps.reserve(endpoints.size());
  for (const auto& f : endpoints) {
    rules::Endpoint e;
    http::Target t;
    if (std::string why = http::parse_url(f.url, t); !why.empty()) {
      log::warn("discovery: an endpoint found is not a URL; skipped")
          .kv("uri", uri)
          .kv("url", f.url)
          .kv("error", why);
      continue;
    }
    e.url = t.url;
    e.role = f.role == discovery::FoundEndpoint::Role::kPrefill  ? rules::Role::kPrefill
             : f.role == discovery::FoundEndpoint::Role::kDecode ? rules::Role::kDecode
                                                                 : rules::Role::kNone;
    e.bootstrap_port = f.bootstrap_port;
    eps.push_back(std::move(e));
  }
  std::sort(eps.begin(), eps.end(),
            [](const rules::Endpoint& a, const rules::Endpoint& b) { return a.url < b.url; });
  const auto before = pools_.discovered(uri);
  if (before == eps) return;
  log::info("discovery found a change")
      .kv("uri", uri)
      .kv("endpoints", eps.size())
      .kv("before", before.size());
  if (endpoints_) endpoints_->with({uri}).set(static_cast<double>(eps.size()));
  if (changes_) changes_->with({uri}).inc();
  auto errors = pools_.set_discovered(uri, std::move(eps));
  for (const auto& e : errors) {
    log::error("discovery: the rules with what it found were refused; the pools in force stay")
        .kv("uri", uri)
        .kv("field", e.field)
        .kv("error", e.message);
  }
}

}  // namespace kvgate
