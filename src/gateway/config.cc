// gateway/config: see config.h.
#include "gateway/config.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>

#include "discovery/source.h"
#include "gateway/knobs.h"
#include "http/client.h"
#include "policy/registry.h"
#include "replica/registry.h"

namespace kvgate {
namespace {

using K = flags::Knob<GatewayConfig>;
using C = GatewayConfig;

constexpr std::string_view kWorkers = "Workers and listener";
constexpr std::string_view kRouting = "Routing policy";
constexpr std::string_view kKvExact = "KV-exact routing (kv_exact)";
constexpr std::string_view kPd = "Prefill/decode disaggregation";
constexpr std::string_view kRequests = "Request handling";
constexpr std::string_view kClients = "Client connections";
constexpr std::string_view kWorkerConn = "Worker connections";
constexpr std::string_view kSecurity = "Security";
constexpr std::string_view kAdmission = "Admission (concurrency limit and queue)";
constexpr std::string_view kRetry = "Retries";
constexpr std::string_view kBreaker = "Circuit breaker";
constexpr std::string_view kHealth = "Health checks and load";
constexpr std::string_view kAdmin = "Admin API and configuration file";
constexpr std::string_view kMetrics = "Prometheus metrics";
constexpr std::string_view kLogging = "Logging";
constexpr std::string_view kReplicas = "Replicas (several kvgates that agree)";
constexpr std::string_view kUnsupported = "Unsupported";

std::string parse_prefill(C& c, std::span<const std::string> v) {
  PrefillSpec spec;
  spec.url = v[0];
  if (v.size() > 1) {
    std::string low = v[1];
    std::transform(low.begin(), low.end(), low.begin(), ::tolower);
    if (low != "none") {
      int port = 0;
      auto [p, ec] = std::from_chars(v[1].data(), v[1].data() + v[1].size(), port);
      if (ec != std::errc() || p != v[1].data() + v[1].size() || port <= 0 || port > 65535) {
        return "bootstrap port '" + v[1] + "' must be a port number (1-65535) or 'none'";
      }
      spec.bootstrap_port = port;
    }
  }
  c.prefill.push_back(std::move(spec));
  return "";
}

// Bucket bounds (seconds, > 0) into `field`.
template <std::vector<std::string> C::*field>
std::string parse_buckets(C& c, std::span<const std::string> v) {
  (c.*field).clear();
  for (const auto& s : v) {
    double d = 0;
    if (std::string e = flags::parse_double(s, d); !e.empty()) return e;
    if (d <= 0) return "bucket bound " + s + " must be > 0";
    (c.*field).push_back(s);
  }
  return "";
}

std::vector<std::string_view> policy_names() {
  std::vector<std::string_view> names;
  for (const auto& p : all_policies()) names.push_back(p.name);
  return names;
}

std::vector<std::string_view> fallback_policy_names() {
  std::vector<std::string_view> names;
  for (auto n : policy_names()) {
    if (n != "kv_exact") names.push_back(n);
  }
  return names;
}

const std::vector<K>& table() {
  static const std::vector<K> kTable = [] {
    std::vector<K> t = {
        {.name = "host",
         .group = kWorkers,
         .value_name = "ADDR",
         .help = "Address to listen on for inference traffic",
         .field = &C::host},
        {.name = "port",
         .group = kWorkers,
         .value_name = "PORT",
         .help = "Port to listen on (0 = any free port)",
         .field = &C::port,
         .min = 0,
         .max = 65535},
        {.name = "worker-urls",
         .group = kWorkers,
         .value_name = "URL...",
         .help = "Upstream inference servers (http://host:port), space separated",
         .field = &C::worker_urls},
        {.name = "discovery",
         .group = kWorkers,
         .value_name = "URI",
         .help = "Find workers (besides --worker-urls): dns://NAME:PORT (every A/AAAA address "
                 "of NAME, as a Kubernetes headless Service gives), dns://_service._tcp.NAME "
                 "(SRV records), with ?server=IP:PORT to ask that nameserver; "
                 "etcd://HOST:PORT[/MODEL] (workers registered in etcd by kvgate register). "
                 "Changes apply live",
         .field = &C::discovery},
        {.name = "discovery-interval-secs",
         .group = kWorkers,
         .value_name = "SECS",
         .help = "DNS discovery: longest time between two resolutions (sooner when the answer's "
                 "TTL is shorter, never under a second); an empty answer removes the workers "
                 "only after 3 in a row",
         .field = &C::discovery_interval_secs,
         .min = 1,
         .max = 3600},
        {.name = "threads",
         .group = kWorkers,
         .value_name = "N",
         .help = "Request threads, each with its own event loop (0 = one per CPU core)",
         .field = &C::threads,
         .min = 0,
         .max = 256},
        {.name = "backend",
         .group = kWorkers,
         .value_name = "NAME",
         .help = "Kind of upstream server",
         .field = &C::backend,
         .choices = {"sglang", "vllm"}},

        {.name = "policy",
         .group = kRouting,
         .value_name = "NAME",
         .help = "Routing policy",
         .field = &C::policy,
         .choices = policy_names()},
        {.name = "cache-threshold",
         .group = kRouting,
         .value_name = "R",
         .help = "cache_aware: prefix match rate above which the matching worker wins",
         .field = &C::cache_threshold,
         .min = 0,
         .max = 1},
        {.name = "balance-abs-threshold",
         .group = kRouting,
         .value_name = "N",
         .help = "cache_aware: load gap (max - min) that, with the relative test, marks imbalance",
         .field = &C::balance_abs_threshold,
         .min = 0},
        {.name = "balance-rel-threshold",
         .group = kRouting,
         .value_name = "R",
         .help = "cache_aware: load ratio (max > min * R) that, with the absolute test, marks "
                 "imbalance",
         .field = &C::balance_rel_threshold,
         .min = 1},
        {.name = "eviction-interval",
         .group = kRouting,
         .value_name = "SECS",
         .help = "cache_aware: seconds between prefix tree cleanups",
         .field = &C::eviction_interval,
         .min = 1},
        {.name = "max-tree-size",
         .group = kRouting,
         .value_name = "N",
         .help = "cache_aware: characters kept per worker in each prefix tree",
         .field = &C::max_tree_size,
         .min = 1},
        {.name = "max-prefix-trees",
         .group = kRouting,
         .value_name = "N",
         .help = "cache_aware: prefix trees kept, one per request model; requests naming further "
                 "models share one overflow tree",
         .field = &C::max_prefix_trees,
         .min = 1},
        {.name = "tokenizer-path",
         .group = kRouting,
         .value_name = "DIR",
         .help = "Model directory with tokenizer.json (+ tokenizer_config.json): cache_aware, "
                 "prefix_hash and chwbl route on the prompt as the engine renders and tokenizes "
                 "it",
         .field = &C::tokenizer_path},
        {.name = "model-path",
         .group = kRouting,
         .value_name = "DIR",
         .help = "Same as --tokenizer-path when it is a local directory holding tokenizer.json "
                 "(--tokenizer-path wins)",
         .field = &C::model_path},
        {.name = "prefix-token-count",
         .group = kRouting,
         .value_name = "N",
         .help = "prefix_hash: leading tokens hashed",
         .field = &C::prefix_token_count,
         .min = 1},
        {.name = "prefix-hash-load-factor",
         .group = kRouting,
         .value_name = "R",
         .help = "prefix_hash: bounded-load factor",
         .field = &C::prefix_hash_load_factor,
         .min = 1},
        {.name = "max-idle-secs",
         .group = kRouting,
         .value_name = "SECS",
         .help = "manual: routing keys idle longer than this are forgotten",
         .field = &C::max_idle_secs,
         .min = 1},
        {.name = "manual-assignment-mode",
         .group = kRouting,
         .value_name = "MODE",
         .help = "manual: how a new routing key is placed",
         .field = &C::manual_assignment_mode,
         .choices = {"random", "min_load", "min_group"}},
        {.name = "max-routing-keys",
         .group = kRouting,
         .value_name = "N",
         .help = "manual: routing keys remembered; when full, a new key makes it forget the least "
                 "recently used one",
         .field = &C::max_routing_keys,
         .min = 1},
        {.name = "max-response-owners",
         .group = kRouting,
         .value_name = "N",
         .help = "/v1/responses: response ids whose creating worker is remembered (SGLang keeps "
                 "a response's conversation in that server); when full the oldest is forgotten, "
                 "and a forgotten id is looked for by asking the workers",
         .field = &C::max_response_owners,
         .min = 1},
        {.name = "response-owner-ttl-secs",
         .group = kRouting,
         .value_name = "SECS",
         .help = "/v1/responses: how long a response id's worker is remembered",
         .field = &C::response_owner_ttl_secs,
         .min = 1,
         .max = 30 * 86400},
        {.name = "chwbl-key-chars",
         .group = kRouting,
         .value_name = "N",
         .help = "chwbl: characters of the first user message in the hash key",
         .field = &C::chwbl_key_chars,
         .min = 1},
        {.name = "chwbl-load-factor",
         .group = kRouting,
         .value_name = "R",
         .help = "chwbl: a worker takes requests while its load is below R x the average",
         .field = &C::chwbl_load_factor,
         .min = 1},
        {.name = "bucket-refit-secs",
         .group = kRouting,
         .value_name = "SECS",
         .help = "bucket: length bands are refitted from this window of requests",
         .field = &C::bucket_refit_secs,
         .min = 1},
        {.name = "kv-fallback-policy",
         .group = kKvExact,
         .value_name = "NAME",
         .help = "kv_exact: the policy that routes misses (no page cached anywhere (with "
                 "--replica-sync kv_exact places those itself, alike on every replica), no "
                 "subscriber trusted yet, a request without tokens); a rule's sel",
         .field = &C::kv_fallback_policy,
         .choices = fallback_policy_names()},
        {.name = "kv-block-size",
         .group = kKvExact,
         .value_name = "N",
         .help = "kv_exact: the engines' KV page size in tokens (SGLang --page-size); a rule's "
                 "kvBlockSize",
         .field = &C::kv_block_size,
         .min = 1,
         .max = 4096},
        {.name = "kv-zmq-port",
         .group = kKvExact,
         .value_name = "PORT",
         .help = "kv_exact: the KV event publisher port of DP rank 0 (rank r: PORT + r); a "
                 "rule's kvZmqPort",
         .field = &C::kv_zmq_port,
         .min = 1,
         .max = 65535},
        {.name = "kv-dp-rank-count",
         .group = kKvExact,
         .value_name = "N",
         .help = "kv_exact: data-parallel ranks per engine, each publishing its own events; "
                 "--dp-aware: the ranks of a worker whose /server_info does not say its dp_size; "
                 "a rule's kvDpRankCount",
         .field = &C::kv_dp_rank_count,
         .min = 1,
         .max = 8},
        {.name = "kv-warmup-secs",
         .group = kKvExact,
         .value_name = "SECS",
         .help = "kv_exact: a rank is trusted once its subscriber has been connected this long, "
                 "or holds blocks; until then misses go to the fallback; a rule's kvWarmupSec",
         .field = &C::kv_warmup_secs,
         .min = 0,
         .max = 3600},
        {.name = "kv-load-tokens",
         .group = kRouting,
         .value_name = "N",
         .help = "kv_exact: what one request active on a rank costs, in prompt tokens to prefill "
                 "(weighs load against cached prefix)",
         .field = &C::kv_load_tokens,
         .min = 0,
         .max = 1e7},
        {.name = "kv-other-tier-weight",
         .group = kRouting,
         .value_name = "W",
         .help = "kv_exact: a page held only in another tier (CPU, disk) counts this much of a GPU "
                 "page (0: not a hit)",
         .field = &C::kv_other_tier_weight,
         .min = 0,
         .max = 1},
        {.name = "kv-max-blocks",
         .group = kRouting,
         .value_name = "N",
         .help = "kv_exact: blocks the inventory of a rule holds at most (past it the coldest "
                 "are forgotten: a miss, never a wrong hit)",
         .field = &C::kv_max_blocks,
         .min = 1024,
         .max = 1e9},
        {.name = "kv-predict-ttl-ms",
         .group = kRouting,
         .value_name = "MS",
         .help = "kv_exact: a request's pages count as held where it was sent for this long, "
                 "until the engine's events say so (a burst sharing a new prefix lands together); "
                 "0: off",
         .field = &C::kv_predict_ttl_ms,
         .min = 0,
         .max = 60000},
        {.name = "dp-rank-field",
         .group = kWorkers,
         .value_name = "FIELD",
         .help = "The body field that names the DP rank kvgate chose (kv_exact, --dp-aware): "
                 "routed_dp_rank (SGLang), or data_parallel_rank for older SGLang builds that "
                 "know only that (deprecated) name",
         .field = &C::dp_rank_field,
         .choices = {"routed_dp_rank", "data_parallel_rank"}},
        {.name = "kv-parity-probe",
         .group = kRouting,
         .help = "kv_exact: send each (endpoint, rank) one probe chat (max_tokens 1) once its "
                 "events flow, and again after its engine restarts, to check that the engine's "
                 "token ids are kvgate's (kvgate_kv_tokenizer_parity); false: no such traffic",
         .field = &C::kv_parity_probe},
        {.name = "dp-aware",
         .group = kRouting,
         .help = "Treat each data-parallel rank of a worker as its own target: the policy "
                 "chooses a (worker, rank) and the rank goes to the engine as routed_dp_rank. "
                 "Ranks per worker: its /server_info dp_size, else --kv-dp-rank-count. kv_exact "
                 "is per rank already (unchanged by it)",
         .field = &C::dp_aware},
        {.name = "policy-seed",
         .group = kRouting,
         .value_name = "N",
         .help = "Seed for random choices (0 = from the OS; set it for reproducible runs)",
         .field = &C::policy_seed,
         .min = 0},

        {.name = "prefill-policy",
         .group = kRouting,
         .value_name = "NAME",
         .help = "Prefill/decode: the policy choosing prefill servers (default: --policy; "
                 "kv_exact = KV-exact over the prefill servers, a rule's kvExactMode 1, with "
                 "--kv-fallback-policy for its misses)",
         .field = &C::prefill_policy,
         .choices = policy_names()},
        {.name = "decode-policy",
         .group = kRouting,
         .value_name = "NAME",
         .help = "Prefill/decode: the policy choosing decode servers (default: --policy, or "
                 "--kv-fallback-policy when that is kv_exact)",
         .field = &C::decode_policy,
         .choices = fallback_policy_names()},

        {.name = "pd-disaggregation",
         .group = kPd,
         .help = "Prefill/decode disaggregation (SGLang): each request goes to a --prefill and a "
                 "--decode server at once, with bootstrap_host, bootstrap_port and "
                 "bootstrap_room added to its body; the client gets the decode server's answer",
         .field = &C::pd_disaggregation},
        {.name = "prefill",
         .group = kPd,
         .value_name = "URL [PORT|none]",
         .help = "A prefill server and its SGLang bootstrap port (default and 'none': 8998, "
                 "SGLang's --disaggregation-bootstrap-port default; repeat the flag per server)",
         .custom = parse_prefill,
         .custom_min_values = 1,
         .custom_max_values = 2},
        {.name = "decode",
         .group = kPd,
         .value_name = "URL",
         .help = "A decode server (repeat the flag per server)",
         .field = &C::decode,
         .arity = flags::Arity::kAppend},
        {.name = "pd-prefill-rank",
         .group = kPd,
         .value_name = "HOW",
         .help = "Prefill/decode with DP ranks on prefill servers: how the prefill rank a policy "
                 "chose reaches SGLang. room: a bootstrap_room with room % dp_size = rank (every "
                 "SGLang build); field: a random room, the prefill pinned with --dp-rank-field "
                 "and disagg_prefill_dp_rank sent to both servers (builds that read it)",
         .field = &C::pd_prefill_rank,
         .choices = {"room", "field"}},
        {.name = "worker-startup-timeout-secs",
         .group = kPd,
         .value_name = "SECS",
         .help = "Accepted for compatibility: kvgate starts at once and routes to workers as they "
                 "turn healthy",
         .field = &C::worker_startup_timeout_secs,
         .min = 0},
        {.name = "worker-startup-check-interval",
         .group = kPd,
         .value_name = "SECS",
         .help = "Accepted for compatibility: workers not yet healthy are probed every second",
         .field = &C::worker_startup_check_interval,
         .min = 0},

        {.name = "request-timeout-secs",
         .group = kRequests,
         .value_name = "SECS",
         .help = "Longest a request may take, streams included (then 504)",
         .field = &C::request_timeout_secs,
         .min = 1},
        {.name = "max-payload-size",
         .group = kRequests,
         .value_name = "BYTES",
         .help = "Largest request body (more -> 413)",
         .field = &C::max_payload_size,
         .min = 1},
        {.name = "tokenizer-cache-bytes",
         .group = kRequests,
         .value_name = "BYTES",
         .help = "Bound of the cache of tokenized pieces (the text between special tokens, so "
                 "mostly a chat's earlier messages), shared by every tokenizer (--tokenizer-path, "
                 "rules' tokenizerPath) and request thread: a new turn of a chat tokenizes only "
                 "its new messages. Least recently used pieces go first; 0: no cache",
         .field = &C::tokenizer_cache_bytes,
         .min = 0,
         .max = 68719476736.0},
        {.name = "request-id-headers",
         .group = kRequests,
         .value_name = "NAME...",
         .help = "Headers that carry a request id (default: x-request-id x-correlation-id "
                 "x-trace-id request-id)",
         .field = &C::request_id_headers},
        {.name = "shutdown-grace-period-secs",
         .group = kRequests,
         .value_name = "SECS",
         .help = "On SIGTERM/SIGINT, wait this long for requests in flight",
         .field = &C::shutdown_grace_period_secs,
         .min = 0},
        {.name = "connect-timeout-secs",
         .group = kRequests,
         .value_name = "SECS",
         .help = "Connecting to a worker takes at most this long",
         .field = &C::connect_timeout_secs,
         .min = 1},
        {.name = "debug-headers",
         .group = kRequests,
         .help = "Add x-kvgate-worker (the worker's URL), x-kvgate-route, x-kvgate-attempts and "
                 "(when a rank was chosen) x-kvgate-dp-rank to responses; with prefill/decode also "
                 "x-kvgate-prefill-worker, x-kvgate-prefill-route and "
                 "x-kvgate-prefill-dp-rank (x-kvgate-worker is then the decode server)",
         .field = &C::debug_headers},

        {.name = "api-key",
         .group = kSecurity,
         .value_name = "KEY",
         .help = "Clients must send 'Authorization: Bearer KEY' (health endpoints excepted); "
                 "prefer --api-key-file: ps shows the command line",
         .field = &C::api_key},
        {.name = "api-key-file",
         .group = kSecurity,
         .value_name = "PATH",
         .help = "Read the API key from this file (its first line)",
         .field = &C::api_key_file},
        {.name = "allow-target-worker-header",
         .group = kSecurity,
         .help = "Let clients pin a worker with X-SMG-Target-Worker (consistent_hashing); off, the "
                 "header is ignored and not forwarded",
         .field = &C::allow_target_worker_header},
        {.name = "tls-cert-path",
         .group = kSecurity,
         .value_name = "PATH",
         .help = "Serve the inference listener over TLS with this PEM certificate chain (with "
                 "--tls-key-path)",
         .field = &C::tls_cert_path},
        {.name = "tls-key-path",
         .group = kSecurity,
         .value_name = "PATH",
         .help = "PEM private key of --tls-cert-path (unencrypted)",
         .field = &C::tls_key_path},
        {.name = "worker-ca-cert-path",
         .group = kSecurity,
         .value_name = "PATH",
         .help = "CA certificates (PEM) that verify https:// workers (default: the system's)",
         .field = &C::worker_ca_cert_path},
        {.name = "worker-client-cert-path",
         .group = kSecurity,
         .value_name = "PATH",
         .help = "Client certificate (PEM) presented to https:// workers (mutual TLS)",
         .field = &C::worker_client_cert_path},
        {.name = "worker-client-key-path",
         .group = kSecurity,
         .value_name = "PATH",
         .help = "Private key (PEM) of --worker-client-cert-path",
         .field = &C::worker_client_key_path},

        {.name = "max-connections",
         .group = kClients,
         .value_name = "N",
         .help = "Client connections open at once; more are closed at once (counted in "
                 "kvgate_connections_refused_total). 0 = from the open-file limit: (limit - 1024) "
                 "/ 2, room for a worker connection per client",
         .field = &C::max_connections,
         .min = 0,
         .max = 10000000},
        {.name = "client-keepalive-timeout-secs",
         .group = kClients,
         .value_name = "SECS",
         .help = "An idle keep-alive connection is closed after this long without a request",
         .field = &C::client_keepalive_timeout_secs,
         .min = 1},
        {.name = "client-header-timeout-secs",
         .group = kClients,
         .value_name = "SECS",
         .help = "A request's headers must arrive within this long of its first byte (else 408)",
         .field = &C::client_header_timeout_secs,
         .min = 1},
        {.name = "client-body-timeout-secs",
         .group = kClients,
         .value_name = "SECS",
         .help = "A request's whole body must arrive within this long of its headers (else 408)",
         .field = &C::client_body_timeout_secs,
         .min = 1},
        {.name = "client-write-timeout-secs",
         .group = kClients,
         .value_name = "SECS",
         .help = "A client that takes no response bytes for this long is disconnected (a quiet "
                 "stream is not: only --request-timeout-secs bounds a response)",
         .field = &C::client_write_timeout_secs,
         .min = 1},

        {.name = "worker-idle-connection-timeout-ms",
         .group = kWorkerConn,
         .value_name = "MS",
         .help = "Idle keep-alive connections to workers are reused only this long; keep it below "
                 "the workers' keep-alive timeout (uvicorn: 5 s), or a reused connection may be "
                 "closed under a request (0 = no reuse)",
         .field = &C::worker_idle_connection_timeout_ms,
         .min = 0},
        {.name = "max-idle-connections-per-worker",
         .group = kWorkerConn,
         .value_name = "N",
         .help = "Idle keep-alive connections kept per worker and request thread",
         .field = &C::max_idle_connections_per_worker,
         .min = 0},

        {.name = "max-concurrent-requests",
         .group = kAdmission,
         .value_name = "N",
         .help = "Requests proxied at once (-1 = no limit); more wait in the queue",
         .field = &C::max_concurrent_requests,
         .min = -1},
        {.name = "queue-size",
         .group = kAdmission,
         .value_name = "N",
         .help = "Requests waiting for a slot; when full -> 429",
         .field = &C::queue_size,
         .min = 0},
        {.name = "queue-timeout-secs",
         .group = kAdmission,
         .value_name = "SECS",
         .help = "Longest wait in the queue (then 408)",
         .field = &C::queue_timeout_secs,
         .min = 1},

        {.name = "retry-max-retries",
         .group = kRetry,
         .value_name = "N",
         .help = "Attempts per request, the first included",
         .field = &C::retry_max_retries,
         .min = 1,
         .max = 100},
        {.name = "retry-initial-backoff-ms",
         .group = kRetry,
         .value_name = "MS",
         .help = "Backoff before the first retry",
         .field = &C::retry_initial_backoff_ms,
         .min = 0},
        {.name = "retry-max-backoff-ms",
         .group = kRetry,
         .value_name = "MS",
         .help = "Longest backoff",
         .field = &C::retry_max_backoff_ms,
         .min = 0},
        {.name = "retry-backoff-multiplier",
         .group = kRetry,
         .value_name = "R",
         .help = "Backoff growth per retry",
         .field = &C::retry_backoff_multiplier,
         .min = 1},
        {.name = "retry-jitter-factor",
         .group = kRetry,
         .value_name = "R",
         .help = "Random spread of each backoff (+-R)",
         .field = &C::retry_jitter_factor,
         .min = 0,
         .max = 1},
        {.name = "disable-retries",
         .group = kRetry,
         .help = "One attempt per request",
         .field = &C::disable_retries},
        {.name = "retry-budget-percent",
         .group = kRetry,
         .value_name = "PCT",
         .help = "Retries in progress may be at most this percentage of requests in progress "
                 "(with --retry-budget-min-concurrency as the floor)",
         .field = &C::retry_budget_percent,
         .min = 0,
         .max = 100},
        {.name = "retry-budget-min-concurrency",
         .group = kRetry,
         .value_name = "N",
         .help = "Retries always allowed in progress at once, whatever the percentage",
         .field = &C::retry_budget_min_concurrency,
         .min = 0},

        {.name = "cb-failure-threshold",
         .group = kBreaker,
         .value_name = "N",
         .help = "Consecutive failures that open a worker's breaker",
         .field = &C::cb_failure_threshold,
         .min = 1},
        {.name = "cb-success-threshold",
         .group = kBreaker,
         .value_name = "N",
         .help = "Successes in half-open that close it again",
         .field = &C::cb_success_threshold,
         .min = 1},
        {.name = "cb-timeout-duration-secs",
         .group = kBreaker,
         .value_name = "SECS",
         .help = "Time open before a half-open trial",
         .field = &C::cb_timeout_duration_secs,
         .min = 0},
        {.name = "cb-window-duration-secs",
         .group = kBreaker,
         .value_name = "SECS",
         .help = "Accepted for compatibility: kvgate counts consecutive failures",
         .field = &C::cb_window_duration_secs,
         .min = 1},
        {.name = "disable-circuit-breaker",
         .group = kBreaker,
         .help = "Never stop sending to a failing worker",
         .field = &C::disable_circuit_breaker},

        {.name = "health-check-interval-secs",
         .group = kHealth,
         .value_name = "SECS",
         .help = "Seconds between health probes of a worker",
         .field = &C::health_check_interval_secs,
         .min = 1},
        {.name = "health-check-timeout-secs",
         .group = kHealth,
         .value_name = "SECS",
         .help = "A probe slower than this fails",
         .field = &C::health_check_timeout_secs,
         .min = 1},
        {.name = "health-check-endpoint",
         .group = kHealth,
         .value_name = "PATH",
         .help = "Path probed on each worker",
         .field = &C::health_check_endpoint},
        {.name = "health-failure-threshold",
         .group = kHealth,
         .value_name = "N",
         .help = "Failed probes in a row that mark a worker unhealthy",
         .field = &C::health_failure_threshold,
         .min = 1},
        {.name = "health-success-threshold",
         .group = kHealth,
         .value_name = "N",
         .help = "Good probes in a row that mark it healthy again",
         .field = &C::health_success_threshold,
         .min = 1},
        {.name = "load-check-interval-ms",
         .group = kHealth,
         .value_name = "MS",
         .help = "How often /get_load is polled when the policy uses reported load",
         .field = &C::load_check_interval_ms,
         .min = 50},

        {.name = "config",
         .group = kAdmin,
         .value_name = "FILE",
         .help = "Read knobs and rules from this YAML (or JSON) file; flags given on the command "
                 "line win. SIGHUP (or POST /v1/config/reload) reads it again and applies the "
                 "difference live",
         .field = &C::config},
        {.name = "admin-host",
         .group = kAdmin,
         .value_name = "ADDR",
         .help = "Address of the admin API listener (rules, workers, config); without an admin "
                 "key it may only be a loopback address",
         .field = &C::admin_host},
        {.name = "admin-port",
         .group = kAdmin,
         .value_name = "PORT",
         .help = "Port of the admin API listener (0 = any free port)",
         .field = &C::admin_port,
         .min = 0,
         .max = 65535},
        {.name = "admin-api-key",
         .group = kAdmin,
         .value_name = "KEY",
         .help = "Admin API clients must send 'Authorization: Bearer KEY'; prefer "
                 "--admin-api-key-file: ps shows the command line",
         .field = &C::admin_api_key},
        {.name = "admin-api-key-file",
         .group = kAdmin,
         .value_name = "PATH",
         .help = "Read the admin API key from this file (its first line)",
         .field = &C::admin_api_key_file},
        {.name = "expose-server-info",
         .group = kAdmin,
         .help = "Also answer GET /get_server_info and /get_model_info on the inference listener "
                 "(sgl-model-gateway does; they reveal the engines' configuration, so by default "
                 "only the admin listener answers them)",
         .field = &C::expose_server_info},

        {.name = "prometheus-host",
         .group = kMetrics,
         .value_name = "ADDR",
         .help = "Address of the metrics listener",
         .field = &C::prometheus_host},
        {.name = "prometheus-port",
         .group = kMetrics,
         .value_name = "PORT",
         .help = "Port of the metrics listener (GET /metrics; 0 = any free port)",
         .field = &C::prometheus_port,
         .min = 0,
         .max = 65535},
        {.name = "prometheus-duration-buckets",
         .group = kMetrics,
         .value_name = "SECS...",
         .help = "Bucket bounds of duration histograms: request duration, time to first "
                 "token (headers, first byte, first token), end to end, admission queue",
         .custom = parse_buckets<&C::prometheus_duration_buckets>,
         .custom_min_values = 1,
         .custom_max_values = 64,
         .default_text = "0.001 .. 1800"},
        {.name = "prometheus-short-duration-buckets",
         .group = kMetrics,
         .value_name = "SECS...",
         .help = "Bucket bounds of the short duration histograms: inter-token latency and "
                 "upstream connect time",
         .custom = parse_buckets<&C::prometheus_short_duration_buckets>,
         .custom_min_values = 1,
         .custom_max_values = 64,
         .default_text = "0.0001 .. 10"},
        {.name = "metrics-compat",
         .group = kMetrics,
         .value_name = "NAME",
         .help = "Also export another gateway's metric names: smg = sgl-model-gateway's "
                 "(smg_http_requests_total, smg_router_requests_total, smg_worker_*, "
                 "smg_cache_aware_policy_branch_total), so existing dashboards keep working",
         .field = &C::metrics_compat,
         .choices = {"none", "smg"}},

        {.name = "replica-sync",
         .group = kReplicas,
         .value_name = "URL",
         .help = "Share routing state with the other kvgate replicas through NATS "
                 "(nats://host:4222, comma separated for a cluster): cache_aware's records and "
                 "every replica's in-flight load, so each decides as one gateway would. Empty: "
                 "this replica alone",
         .field = &C::replica_sync},
        {.name = "replica-sync-subject",
         .group = kReplicas,
         .value_name = "PREFIX",
         .help = "NATS subject prefix of one fleet of replicas (<prefix>.chains, <prefix>.load); "
                 "fleets sharing a NATS server need different prefixes",
         .field = &C::replica_sync_subject},
        {.name = "replica-name",
         .group = kReplicas,
         .value_name = "NAME",
         .help = "This replica's name in NATS and logs (empty: host name and port)",
         .field = &C::replica_name},
        {.name = "replica-sync-batch-ms",
         .group = kReplicas,
         .value_name = "MS",
         .help = "Longest a routing record waits to be sent with others (a batch also leaves at "
                 "256 records)",
         .field = &C::replica_sync_batch_ms,
         .min = 1,
         .max = 1000},
        {.name = "replica-load-interval-ms",
         .group = kReplicas,
         .value_name = "MS",
         .help = "Shortest interval between two load reports of this replica (sent when its "
                 "in-flight counts changed, and at least every second)",
         .field = &C::replica_load_interval_ms,
         .min = 1,
         .max = 1000},
        {.name = "replica-peer-timeout-ms",
         .group = kReplicas,
         .value_name = "MS",
         .help = "A replica not heard from for this long is forgotten (its load no longer "
                 "counts)",
         .field = &C::replica_peer_timeout_ms,
         .min = 1500,
         .max = 600000},
        {.name = "replica-sync-chunk-bytes",
         .group = kReplicas,
         .value_name = "BYTES",
         .help = "cache_aware with --replica-sync matches prompts in chunks of this many bytes "
                 "(each sent as an 8-byte hash); every replica must use the same",
         .field = &C::replica_sync_chunk_bytes,
         .min = 16,
         .max = 4096},
        {.name = "replica-sync-max-chunks",
         .group = kReplicas,
         .value_name = "N",
         .help = "Chunk hashes cache_aware's shared index keeps per rule (~64 bytes each); "
                 "past it new ones are dropped (counted) until expiry makes room",
         .field = &C::replica_sync_max_chunks,
         .min = 1024,
         .max = 268435456},
        {.name = "replica-sync-history-bytes",
         .group = kReplicas,
         .value_name = "BYTES",
         .help = "With a JetStream-enabled NATS (nats-server -js): the fleet's recent records "
                 "(<prefix>.chains, the last --eviction-interval seconds) are kept in a memory "
                 "stream of at most this many bytes, which a new or reconnected replica replays. "
                 "0: no history (core NATS only)",
         .field = &C::replica_sync_history_bytes,
         .min = 0,
         .max = 17179869184},
        {.name = "replica-registry",
         .group = kReplicas,
         .value_name = "URL",
         .help = "etcd://HOST:PORT: this replica registers itself in etcd (etcd's v3 JSON gateway) "
                 "at /kvgate/v1/gateways/<--replica-sync-subject>/<replica id> under a lease it "
                 "keeps alive (revoked when it stops), and watches the fleet's keys: a peer whose "
                 "key goes is forgotten at once, so a replica stopped leaves its peers' loads "
                 "at once and one killed after the shorter of its lease and "
                 "--replica-peer-timeout-ms. Needs --replica-sync",
         .field = &C::replica_registry},
        {.name = "replica-registry-ttl-secs",
         .group = kReplicas,
         .value_name = "SECS",
         .help = "The lease of this replica's etcd key (--replica-registry): a replica that dies "
                 "is forgotten this long after (keepalives every third of it)",
         .field = &C::replica_registry_ttl_secs,
         .min = 2,
         .max = 300},

        {.name = "log-level",
         .group = kLogging,
         .value_name = "LEVEL",
         .help = "Least severe level logged",
         .field = &C::log_level,
         .choices = {"debug", "info", "warn", "error"}},
        {.name = "log-dir",
         .group = kLogging,
         .value_name = "DIR",
         .help = "Append logs to DIR/kvgate.log instead of stderr",
         .field = &C::log_dir},
    };
    auto unsupported = [&](std::string_view name, std::string_view why, int max_values = 1) {
      K k{.name = name, .group = kUnsupported, .help = why};
      k.unsupported_reason = why;
      k.custom = [](C&, std::span<const std::string>) { return std::string(); };
      k.custom_min_values = 0;
      k.custom_max_values = max_values;
      t.push_back(std::move(k));
    };
    unsupported("service-discovery",
                "Kubernetes discovery is not built; list workers with --worker-urls", 0);
    unsupported("selector", "Kubernetes discovery is not built; list workers with --worker-urls",
                64);
    unsupported("service-discovery-port", "Kubernetes discovery is not built");
    unsupported("service-discovery-namespace", "Kubernetes discovery is not built");
    unsupported("prefill-selector", "Kubernetes discovery is not built", 64);
    unsupported("decode-selector", "Kubernetes discovery is not built", 64);
    unsupported("enable-igw", "multi-model IGW mode is not built", 0);
    unsupported("cors-allowed-origins", "CORS is not built; put kvgate behind your web edge", 64);
    unsupported("rate-limit-tokens-per-second",
                "token-bucket rate limiting is not built; use --max-concurrent-requests");
    unsupported("chat-template",
                "a template file is not read; --tokenizer-path uses the model's "
                "tokenizer_config.json / chat_template.jinja");
    unsupported("reasoning-parser",
                "kvgate forwards responses untouched; parse reasoning in the engine");
    unsupported("tool-call-parser",
                "kvgate forwards responses untouched; parse tool calls in the engine");
    unsupported("history-backend", "kvgate keeps no conversation history");
    unsupported("enable-wasm", "WebAssembly plugins are not built", 0);
    unsupported("mcp-config-path", "MCP is not built");
    return t;
  }();
  return kTable;
}

}  // namespace

std::span<const flags::Knob<GatewayConfig>> gateway_knobs() {
  return table();
}

std::string validate(const GatewayConfig& c) {
  const bool pd_servers = !c.prefill.empty() || !c.decode.empty();
  if (c.pd_disaggregation) {
    if (c.prefill.empty() || c.decode.empty()) {
      return "--pd-disaggregation needs at least one --prefill URL [BOOTSTRAP_PORT] and one "
             "--decode URL";
    }
    if (!c.worker_urls.empty()) {
      return "--worker-urls with --pd-disaggregation: list the servers by role with --prefill "
             "and --decode (or put a plain pool in its own rule of a --config file)";
    }
    std::vector<std::string> seen;
    auto dup = [&](const std::string& url) {
      http::Target t;
      if (std::string e = http::parse_url(url, t); !e.empty()) return e;
      if (std::find(seen.begin(), seen.end(), t.url) != seen.end()) {
        return "'" + url + "' is listed twice (a server has one role)";
      }
      seen.push_back(t.url);
      return std::string();
    };
    for (const auto& p : c.prefill) {
      if (std::string e = dup(p.url); !e.empty()) return "--prefill: " + e;
    }
    for (const auto& d : c.decode) {
      if (std::string e = dup(d); !e.empty()) return "--decode: " + e;
    }
  } else if (pd_servers || !c.prefill_policy.empty() || !c.decode_policy.empty()) {
    return "--prefill/--decode/--prefill-policy/--decode-policy apply to prefill/decode "
           "disaggregation: add --pd-disaggregation (or list plain servers with --worker-urls)";
  } else if (c.worker_urls.empty() && c.discovery.empty()) {
    return "no workers: give --worker-urls http://host:port [http://host:port ...] or "
           "--discovery dns://NAME:PORT";
  }
  if (!c.replica_registry.empty()) {
    if (c.replica_sync.empty()) {
      return "--replica-registry names the replicas that share state: it needs --replica-sync "
             "nats://HOST:PORT too";
    }
    std::string etcd_url;
    if (std::string e = replica::parse_registry_url(c.replica_registry, etcd_url); !e.empty()) {
      return e;
    }
  }
  if (!c.discovery.empty()) {
    discovery::Spec spec;
    if (std::string e = discovery::parse_spec(c.discovery, spec); !e.empty()) {
      return "--discovery: " + e;
    }
  }
  for (size_t i = 0; i < c.worker_urls.size(); ++i) {
    http::Target t;
    if (std::string e = http::parse_url(c.worker_urls[i], t); !e.empty())
      return "--worker-urls: " + e;
    for (size_t j = 0; j < i; ++j) {
      http::Target u;
      http::parse_url(c.worker_urls[j], u);
      if (u.url == t.url) return "--worker-urls: '" + c.worker_urls[i] + "' is listed twice";
    }
  }
  std::string err;
  if (c.pd_disaggregation && c.prefill_policy == "kv_exact" && c.tokenizer_path.empty() &&
      c.model_path.empty()) {
    return "--prefill-policy kv_exact matches the prefill servers' pages of token ids, so kvgate "
           "must tokenize prompts as they do: give --tokenizer-path (the model's directory, with "
           "tokenizer.json)";
  }
  if (c.policy == "kv_exact") {
    if (!make_policy(policy_config(c, c.kv_fallback_policy), err)) {
      return "--kv-fallback-policy: " + err;
    }
    if (c.tokenizer_path.empty() && c.model_path.empty()) {
      return "--policy kv_exact matches the engines' pages of token ids, so kvgate must tokenize "
             "prompts as they do: give --tokenizer-path (the model's directory, with "
             "tokenizer.json)";
    }
  } else if (!make_policy(policy_config(c), err)) {
    return "--policy: " + err;
  }
  if (c.retry_max_backoff_ms < c.retry_initial_backoff_ms) {
    return "--retry-max-backoff-ms (" + std::to_string(c.retry_max_backoff_ms) +
           ") is below --retry-initial-backoff-ms (" + std::to_string(c.retry_initial_backoff_ms) +
           ")";
  }
  if (c.health_check_endpoint.empty() || c.health_check_endpoint.front() != '/') {
    return "--health-check-endpoint must be a path starting with '/' (e.g. /health)";
  }
  if (c.port != 0 && c.port == c.prometheus_port && c.host == c.prometheus_host) {
    return "--port and --prometheus-port are both " + std::to_string(c.port) + "; pick two ports";
  }
  if (c.admin_port != 0 && (c.admin_port == c.port || c.admin_port == c.prometheus_port)) {
    return "--admin-port " + std::to_string(c.admin_port) +
           " is also the inference or metrics port; pick another (default 29001)";
  }
  return "";
}

namespace {

// A key from --NAME or --NAME-file (its first line); see load_api_key in config.h.
std::string load_key(std::string& key, const std::string& file, bool key_given,
                     std::string_view name) {
  std::string flag = "--" + std::string(name);
  if (file.empty()) {
    if (key_given && key.empty()) {
      return flag + " is empty: give a key, or leave the flag out to accept every client";
    }
    return "";
  }
  if (key_given || !key.empty()) return "give " + flag + " or " + flag + "-file, not both";
  std::FILE* f = std::fopen(file.c_str(), "rb");
  if (!f) {
    return flag + "-file " + file + ": cannot read it (" + std::strerror(errno) +
           "); give a file kvgate can read, with the key on its first line";
  }
  std::string text;
  char buf[4096];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0 && text.size() < 65536) text.append(buf, n);
  std::fclose(f);
  text = text.substr(0, text.find('\n'));
  // Trailing whitespace (a CR, a stray space or tab) is never part of a key a client can send.
  while (!text.empty() && (text.back() == '\r' || text.back() == ' ' || text.back() == '\t')) {
    text.pop_back();
  }
  if (text.empty()) {
    return flag + "-file " + file +
           " is empty: write the key on its first line (an empty key would let no client in)";
  }
  key = std::move(text);
  return "";
}

}  // namespace

std::string load_api_key(GatewayConfig& c, bool api_key_given) {
  return load_key(c.api_key, c.api_key_file, api_key_given, "api-key");
}

std::string load_admin_api_key(GatewayConfig& c, bool api_key_given) {
  std::string e = load_key(c.admin_api_key, c.admin_api_key_file, api_key_given, "admin-api-key");
  if (!e.empty()) return e;
  // The admin API changes where prompts go: its key must be long enough that guessing is
  // hopeless (the right key passes even from an address refused for failures).
  constexpr size_t kMinAdminKey = 16;
  if (!c.admin_api_key.empty() && c.admin_api_key.size() < kMinAdminKey) {
    return "the admin API key is " + std::to_string(c.admin_api_key.size()) +
           " characters long; use at least " + std::to_string(kMinAdminKey) +
           " (e.g. openssl rand -hex 32 > admin.key)";
  }
  return "";
}

std::vector<std::string> request_id_header_names(const GatewayConfig& c) {
  std::vector<std::string> names = c.request_id_headers;
  if (names.empty()) names = {"x-request-id", "x-correlation-id", "x-trace-id", "request-id"};
  for (auto& n : names) std::transform(n.begin(), n.end(), n.begin(), ::tolower);
  return names;
}

}  // namespace kvgate
