// gateway/knobs: see knobs.h.
#include "gateway/knobs.h"

namespace kvgate {

PolicyConfig policy_config(const GatewayConfig& k, std::string_view sel) {
  PolicyConfig pc;
  pc.name = sel.empty() ? k.policy : std::string(sel);
  pc.seed = static_cast<uint64_t>(k.policy_seed);
  pc.cache_threshold = k.cache_threshold;
  pc.balance_abs_threshold = k.balance_abs_threshold;
  pc.balance_rel_threshold = k.balance_rel_threshold;
  pc.eviction_interval_secs = k.eviction_interval;
  pc.max_tree_size = k.max_tree_size;
  pc.max_prefix_trees = k.max_prefix_trees;
  pc.prefix_token_count = k.prefix_token_count;
  pc.prefix_hash_load_factor = k.prefix_hash_load_factor;
  pc.max_idle_secs = k.max_idle_secs;
  pc.manual_assignment_mode = k.manual_assignment_mode;
  pc.max_routing_keys = k.max_routing_keys;
  pc.chwbl_key_chars = k.chwbl_key_chars;
  pc.chwbl_load_factor = k.chwbl_load_factor;
  pc.bucket_refit_secs = k.bucket_refit_secs;
  pc.dp_aware = k.dp_aware;
  pc.dp_default_ranks = k.kv_dp_rank_count;  // Pool::build: the rule's kvDpRankCount
  // kv_exact's cost weights and bounds (Pool::build adds the rule's kv fields and enables it).
  pc.kv.load_tokens = k.kv_load_tokens;
  pc.kv.other_tier_weight = k.kv_other_tier_weight;
  pc.kv.max_blocks = static_cast<size_t>(k.kv_max_blocks);
  pc.kv.predict_ttl = std::chrono::milliseconds(k.kv_predict_ttl_ms);
  pc.kv.parity_probe = k.kv_parity_probe;
  return pc;
}

BreakerConfig breaker_config(const GatewayConfig& c) {
  BreakerConfig b;
  b.enabled = !c.disable_circuit_breaker;
  b.failure_threshold = static_cast<uint32_t>(c.cb_failure_threshold);
  b.success_threshold = static_cast<uint32_t>(c.cb_success_threshold);
  b.open_timeout = std::chrono::seconds(c.cb_timeout_duration_secs);
  return b;
}

HealthConfig health_config(const GatewayConfig& c) {
  HealthConfig h;
  h.interval = std::chrono::seconds(c.health_check_interval_secs);
  h.timeout = std::chrono::seconds(c.health_check_timeout_secs);
  h.endpoint = c.health_check_endpoint;
  h.failure_threshold = static_cast<uint32_t>(c.health_failure_threshold);
  h.success_threshold = static_cast<uint32_t>(c.health_success_threshold);
  h.load_interval = std::chrono::milliseconds(c.load_check_interval_ms);
  return h;
}

RetryConfig retry_config(const GatewayConfig& c) {
  RetryConfig r;
  r.max_attempts = c.disable_retries ? 1 : static_cast<int>(c.retry_max_retries);
  r.initial_backoff = std::chrono::milliseconds(c.retry_initial_backoff_ms);
  r.max_backoff = std::chrono::milliseconds(c.retry_max_backoff_ms);
  r.multiplier = c.retry_backoff_multiplier;
  r.jitter = c.retry_jitter_factor;
  r.budget_percent = c.retry_budget_percent;
  r.budget_min_concurrency = c.retry_budget_min_concurrency;
  return r;
}

http::ServerConfig server_config(const GatewayConfig& c, size_t max_connections) {
  http::ServerConfig sc;
  sc.host = c.host;
  sc.port = static_cast<uint16_t>(c.port);
  sc.body_limit = static_cast<uint64_t>(c.max_payload_size);
  sc.idle_timeout = std::chrono::seconds(c.client_keepalive_timeout_secs);
  sc.header_timeout = std::chrono::seconds(c.client_header_timeout_secs);
  sc.body_timeout = std::chrono::seconds(c.client_body_timeout_secs);
  sc.write_timeout = std::chrono::seconds(c.client_write_timeout_secs);
  sc.max_connections = max_connections;
  sc.tls_cert_path = c.tls_cert_path;
  sc.tls_key_path = c.tls_key_path;
  return sc;
}

http::ConnectionPool::Options upstream_pool_options(const GatewayConfig& c) {
  http::ConnectionPool::Options o;
  o.max_idle_per_target = static_cast<size_t>(c.max_idle_connections_per_worker);
  o.idle_timeout = std::chrono::milliseconds(c.worker_idle_connection_timeout_ms);
  o.connect_timeout = std::chrono::seconds(c.connect_timeout_secs);
  return o;
}

replica::SyncConfig sync_config(const GatewayConfig& c) {
  replica::SyncConfig s;
  s.url = c.replica_sync;
  s.subject = c.replica_sync_subject;
  s.name = c.replica_name;
  s.batch = std::chrono::milliseconds(c.replica_sync_batch_ms);
  s.load_interval = std::chrono::milliseconds(c.replica_load_interval_ms);
  s.peer_timeout = std::chrono::milliseconds(c.replica_peer_timeout_ms);
  s.chunk_bytes = static_cast<size_t>(c.replica_sync_chunk_bytes);
  s.max_chunks = static_cast<size_t>(c.replica_sync_max_chunks);
  // The history a new replica replays is what cache_aware still remembers: its TTL.
  s.history = std::chrono::seconds(c.eviction_interval);
  s.history_bytes = c.replica_sync_history_bytes;
  return s;
}

replica::RegistryConfig registry_config(const GatewayConfig& c) {
  replica::RegistryConfig r;
  r.uri = c.replica_registry;
  if (!c.replica_registry.empty()) replica::parse_registry_url(c.replica_registry, r.etcd_url);
  r.subject = c.replica_sync_subject;
  r.ttl_secs = c.replica_registry_ttl_secs;
  return r;
}

discovery::Source::Options discovery_options(const GatewayConfig& c) {
  discovery::Source::Options o;
  o.dns_max_interval = std::chrono::seconds(c.discovery_interval_secs);
  o.dns_min_interval = std::min(o.dns_max_interval, std::chrono::milliseconds(1000));
  return o;
}

}  // namespace kvgate
