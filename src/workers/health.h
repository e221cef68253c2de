// workers/health: the health plane. One probe loop per worker on the control io_context: GET the
// health endpoint every interval; a worker turns unhealthy after F consecutive failed probes and
// healthy again after S consecutive good ones (the first good probe after startup is enough). A
// worker that is down at startup is probed every second until it answers, then at the normal
// interval. The same plane polls /get_load (when a policy uses reported load) and refreshes
// /v1/models.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "http/io.h"
#include "workers/worker.h"

namespace kvgate {

// Built by health_config() (gateway/knobs.h) from the knob table, which holds the defaults of
// what a knob sets; the rest are the health plane's own.
struct HealthConfig {
  std::chrono::milliseconds interval{0};
  std::chrono::milliseconds timeout{0};
  std::string endpoint;
  uint32_t failure_threshold = 0;
  uint32_t success_threshold = 0;
  std::chrono::milliseconds startup_interval{1000};  // probing a worker that never answered
  bool poll_load = false;                            // set by the pool when its policy wants it
  bool fetch_kv_events = false;  // fetch /server_info's kv_events (kv_exact's discovery)
  bool fetch_dp_size = false;    // fetch /server_info's dp_size (--dp-aware's discovery)
  std::chrono::milliseconds load_interval{0};
  bool operator==(const HealthConfig&) const = default;
};

// Load a server reports on /get_load (SGLang's array per DP rank, or /v1/loads' {"loads": [...]},
// or {"load": N}): the sum over ranks of running + waiting requests. nullopt if unparseable.
// With `per_rank`, also each rank's own load, indexed by its dp_rank (by position when an entry
// does not say its rank; ranks past Worker::kMaxDpRanks are left out; a rank not reported is 0);
// empty for a report without ranks ({"load": N}).
std::optional<int64_t> parse_load_report(std::string_view json,
                                         std::vector<int64_t>* per_rank = nullptr);

// The data-parallel size of a /server_info answer: its top-level dp_size, else its kv_events'
// dp_size; nullopt when it says neither or says a number outside 1..Worker::kMaxDpRanks.
std::optional<int64_t> parse_dp_size(std::string_view server_info_json);

// The kv_events object of a /server_info answer; nullopt when absent, null ("publisher" not
// "zmq") or malformed.
std::optional<KvEventsInfo> parse_kv_events_info(std::string_view server_info_json);

// The "data" entries of a /v1/models answer, each as compact JSON. nullopt if unparseable.
std::optional<std::vector<std::string>> parse_model_list(std::string_view json);

class HealthPlane {
 public:
  HealthPlane(asio::io_context& ctx, WorkerRegistry& registry, HealthConfig config);
  ~HealthPlane();
  // Starts the loops for every worker of the current snapshot.
  void start();
  // The loops end at their next wake-up. Safe from any thread.
  void stop();

 private:
  awaitable<void> probe_loop(WorkerPtr w);
  awaitable<void> load_loop(WorkerPtr w);
  awaitable<void> refresh_models(WorkerPtr w);
  awaitable<void> refresh_server_info(WorkerPtr w);

  asio::io_context& ctx_;
  WorkerRegistry& registry_;
  HealthConfig config_;
  // The stop flag (set by stop() from any thread, read by the loops on the control loop) and
  // the loops' wait timers, which stop() cancels (on the control loop) so a stopped plane's
  // loops end at once instead of sleeping out their interval.
  struct Stop;
  std::shared_ptr<Stop> stop_;
};

}  // namespace kvgate
