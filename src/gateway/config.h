// gateway/config: every knob of the kvgate binary in one table (name, group, default, range, help).
// The table drives the command line (sgl-model-gateway's flag names, with an optional --router-
// prefix), --help, validation and docs/configuration.md (kvgate --help-markdown).
#pragma once

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "util/flags.h"

namespace kvgate {

struct PrefillSpec {
  std::string url;
  std::optional<int> bootstrap_port;  // nullopt: "none" or not given
};

struct GatewayConfig {
  // Worker configuration
  std::string host = "0.0.0.0";
  int64_t port = 30000;
  std::vector<std::string> worker_urls;
  std::string discovery;
  int64_t discovery_interval_secs = 10;
  // Routing policy
  std::string policy = "cache_aware";
  double cache_threshold = 0.3;
  int64_t balance_abs_threshold = 64;
  double balance_rel_threshold = 1.5;
  int64_t eviction_interval = 120;
  int64_t max_tree_size = 67108864;
  int64_t max_prefix_trees = 64;
  int64_t prefix_token_count = 256;
  double prefix_hash_load_factor = 1.25;
  int64_t max_idle_secs = 14400;
  std::string manual_assignment_mode = "random";
  int64_t max_routing_keys = 1000000;
  int64_t chwbl_key_chars = 100;
  double chwbl_load_factor = 1.25;
  int64_t bucket_refit_secs = 5;
  // OpenAI Responses API: response id -> the worker that created it (gateway/response_owners.h)
  int64_t max_response_owners = 100000;
  int64_t response_owner_ttl_secs = 86400;
  // kv_exact (--policy kv_exact; a rule's kvExactMode 3 and kv* fields)
  std::string kv_fallback_policy = "round_robin";
  int64_t kv_block_size = 16;
  int64_t kv_zmq_port = 5557;
  int64_t kv_dp_rank_count = 1;
  int64_t kv_warmup_secs = 30;
  double kv_load_tokens = 32;
  double kv_other_tier_weight = 0;
  int64_t kv_max_blocks = 4194304;
  int64_t kv_predict_ttl_ms = 2000;
  bool kv_parity_probe = true;
  std::string dp_rank_field = "routed_dp_rank";
  bool dp_aware = false;
  int64_t policy_seed = 0;
  // PD disaggregation
  bool pd_disaggregation = false;
  std::vector<PrefillSpec> prefill;
  std::vector<std::string> decode;
  std::string prefill_policy;
  std::string decode_policy;
  std::string pd_prefill_rank = "room";
  int64_t worker_startup_timeout_secs = 1800;
  int64_t worker_startup_check_interval = 30;
  // Replicas and discovery (src/replica/)
  std::string replica_sync;
  std::string replica_sync_subject = "kvgate";
  std::string replica_name;
  int64_t replica_sync_batch_ms = 5;
  int64_t replica_load_interval_ms = 10;
  int64_t replica_peer_timeout_ms = 3000;
  int64_t replica_sync_chunk_bytes = 64;
  int64_t replica_sync_max_chunks = 1048576;
  int64_t replica_sync_history_bytes = 67108864;
  std::string replica_registry;
  int64_t replica_registry_ttl_secs = 10;
  // Logging
  std::string log_dir;
  std::string log_level = "info";
  // Admin API and configuration file
  std::string config;  // --config FILE
  std::string admin_host = "127.0.0.1";
  int64_t admin_port = 29001;
  std::string admin_api_key;
  std::string admin_api_key_file;
  bool expose_server_info = false;
  // Prometheus metrics
  int64_t prometheus_port = 29000;
  std::string prometheus_host = "0.0.0.0";
  std::vector<std::string> prometheus_duration_buckets;
  std::vector<std::string> prometheus_short_duration_buckets;
  std::string metrics_compat = "none";
  // Request handling
  std::vector<std::string> request_id_headers;
  int64_t request_timeout_secs = 1800;
  int64_t shutdown_grace_period_secs = 180;
  int64_t max_payload_size = 536870912;
  std::string api_key;
  std::string api_key_file;
  bool allow_target_worker_header = false;
  // Client connections
  int64_t max_connections = 0;  // 0: from the open-file limit
  int64_t client_keepalive_timeout_secs = 75;
  int64_t client_header_timeout_secs = 60;
  int64_t client_body_timeout_secs = 60;
  int64_t client_write_timeout_secs = 60;
  std::string tls_cert_path;
  std::string tls_key_path;
  // Worker connections
  int64_t worker_idle_connection_timeout_ms = 4000;
  int64_t max_idle_connections_per_worker = 512;
  std::string worker_ca_cert_path;
  std::string worker_client_cert_path;
  std::string worker_client_key_path;
  // A model directory with tokenizer.json (+ tokenizer_config.json and its chat template):
  // content-aware policies then route on the prompt the engine will see (--tokenizer-path, or
  // --model-path when it is a local directory).
  std::string tokenizer_path;
  std::string model_path;
  // Bound of the cache of tokenized pieces (the text between special tokens: a chat's earlier
  // messages), shared by every tokenizer and request thread; 0: no cache.
  int64_t tokenizer_cache_bytes = 67108864;
  bool debug_headers = false;
  int64_t threads = 0;
  int64_t connect_timeout_secs = 10;
  // Rate limiting
  int64_t max_concurrent_requests = -1;
  int64_t queue_size = 100;
  int64_t queue_timeout_secs = 60;
  // Retries
  int64_t retry_max_retries = 5;
  int64_t retry_initial_backoff_ms = 50;
  int64_t retry_max_backoff_ms = 30000;
  double retry_backoff_multiplier = 1.5;
  double retry_jitter_factor = 0.2;
  bool disable_retries = false;
  double retry_budget_percent = 20;
  int64_t retry_budget_min_concurrency = 3;
  // Circuit breaker
  int64_t cb_failure_threshold = 10;
  int64_t cb_success_threshold = 3;
  int64_t cb_timeout_duration_secs = 60;
  int64_t cb_window_duration_secs = 120;
  bool disable_circuit_breaker = false;
  // Health checks
  int64_t health_failure_threshold = 3;
  int64_t health_success_threshold = 2;
  int64_t health_check_timeout_secs = 5;
  int64_t health_check_interval_secs = 60;
  std::string health_check_endpoint = "/health";
  int64_t load_check_interval_ms = 1000;
  // Backend
  std::string backend = "sglang";
};

std::span<const flags::Knob<GatewayConfig>> gateway_knobs();

// Cross-field checks after parsing. Returns "" or an error naming the flag and the fix.
std::string validate(const GatewayConfig& config);

// Reads --api-key-file into config.api_key (the key off argv, where `ps` would show it). The
// file's content up to its first newline is the key. An empty key (flag given empty, or an empty
// file) is an error: it would lock every client out, or look like protection that is not there.
// Returns "" or an error naming the fix.
std::string load_api_key(GatewayConfig& config, bool api_key_given);
// The same for --admin-api-key / --admin-api-key-file.
std::string load_admin_api_key(GatewayConfig& config, bool api_key_given);

// Request id headers to look at, lower-case, in order (the configured ones or the defaults).
std::vector<std::string> request_id_header_names(const GatewayConfig& config);

}  // namespace kvgate
