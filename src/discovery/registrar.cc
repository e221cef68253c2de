// discovery/registrar: see registrar.h.
#include "discovery/registrar.h"

#include <algorithm>

#include "discovery/etcd.h"
#include "util/log.h"

namespace kvgate::discovery {

void keep_registered(const RegistrarOptions& o,
                     const std::function<bool(std::chrono::milliseconds)>& wait,
                     std::atomic<bool>* registered) {
  EtcdClient etcd(o.etcd_url);
  const auto keepalive_every = std::chrono::milliseconds(o.ttl_secs * 1000 / 3);
  const auto max_retry = std::min(keepalive_every, std::chrono::milliseconds(5000));
  auto retry = std::chrono::milliseconds(250);
  int64_t lease = 0;
  bool put = false;
  auto next_keepalive = keepalive_every;
  auto set_registered = [&](bool v) {
    put = v;
    if (registered) registered->store(v, std::memory_order_relaxed);
  };
  static log::RateLimit fail_limit(10, std::chrono::seconds(60));
  const std::string what = "register: " + o.what;
  for (;;) {
    std::string err;
    if (lease == 0) err = etcd.lease_grant(o.ttl_secs, lease);
    if (err.empty() && !put) {
      err = etcd.put(o.key, o.value, lease);
      if (err.empty()) {
        set_registered(true);
        retry = std::chrono::milliseconds(250);
        log::info(what + " registered").kv("key", o.key).kv("lease", lease);
      }
    }
    if (!err.empty()) {
      // A put that failed may have met an expired lease: the next round starts with a new one
      // (an unused lease expires by itself).
      lease = 0;
      if (auto l = log::warn(fail_limit, "register: etcd call failed, retrying")) {
        l.kv("key", o.key).kv("error", err).kv("retry_ms", retry.count());
      }
      if (wait(retry)) break;
      retry = std::min(retry * 2, max_retry);
      continue;
    }
    if (wait(next_keepalive)) break;
    int64_t ttl_left = 0;
    err = etcd.lease_keepalive(lease, ttl_left);
    next_keepalive = keepalive_every;
    if (!err.empty()) {
      // etcd unreachable: the lease may survive it; tried again soon (backing off), so that a
      // short outage does not cost the lease.
      if (auto l = log::warn(fail_limit, "register: keepalive failed")) {
        l.kv("key", o.key).kv("error", err).kv("retry_ms", retry.count());
      }
      next_keepalive = retry;
      retry = std::min(retry * 2, max_retry);
    } else if (ttl_left == 0) {
      log::warn("register: the lease is gone (expired, or etcd lost it); registering again")
          .kv("key", o.key)
          .kv("lease", lease);
      lease = 0;
      set_registered(false);
    } else {
      retry = std::chrono::milliseconds(250);
    }
  }
  if (lease != 0) {
    if (std::string err = etcd.lease_revoke(lease); !err.empty()) {
      log::warn("register: could not revoke the lease; the key expires with it")
          .kv("key", o.key)
          .kv("error", err)
          .kv("ttl", o.ttl_secs);
    } else {
      log::info(what + " deregistered (lease revoked)").kv("key", o.key);
    }
  }
  set_registered(false);
}

}  // namespace kvgate::discovery
