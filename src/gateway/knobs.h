// gateway/knobs: the knob table's values (GatewayConfig, whose member initializers are the only
// place kvgate's defaults are written) as each module's own configuration. Modules do not know
// GatewayConfig, and their config structs carry no defaults of their own for what a knob sets:
// they are built here, and only here. A new knob = a GatewayConfig field, its table entry
// (config.cc) and, when a module reads it, one line below.
#pragma once

#include "discovery/source.h"
#include "gateway/config.h"
#include "gateway/retry.h"
#include "http/client.h"
#include "http/server.h"
#include "policy/registry.h"
#include "replica/registry.h"
#include "replica/sync.h"
#include "workers/circuit_breaker.h"
#include "workers/health.h"

namespace kvgate {

// A rule's policy: `sel` names it, `knobs` carries its knobs (the rule's, over the command line's).
PolicyConfig policy_config(const GatewayConfig& knobs, std::string_view sel = {});
BreakerConfig breaker_config(const GatewayConfig& c);
HealthConfig health_config(const GatewayConfig& c);
RetryConfig retry_config(const GatewayConfig& c);
// The public (inference) listener; max_connections is resolved by the caller (0 = from the
// open-file limit).
http::ServerConfig server_config(const GatewayConfig& c, size_t max_connections);
// Replica sync (--replica-sync); the name is left empty when --replica-name is (the binary
// names it after its host and port).
replica::SyncConfig sync_config(const GatewayConfig& c);
// --replica-registry: etcd_url parsed (empty when the flag is, or malformed: validate() says
// so), the subject and the lease's TTL; `url` (this gateway's address) is the binary's to set.
replica::RegistryConfig registry_config(const GatewayConfig& c);
// Discovery watchers (rules' `discovery`, --discovery).
discovery::Source::Options discovery_options(const GatewayConfig& c);
// Each request thread's keep-alive pool of upstream connections.
http::ConnectionPool::Options upstream_pool_options(const GatewayConfig& c);

}  // namespace kvgate
