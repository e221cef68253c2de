// sim/sim_metrics: see sim_metrics.h.
#include "sim/sim_metrics.h"

namespace kvgate::sim {
namespace {

std::vector<double> ttft_buckets() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1,
          2.5,   5,     7.5,  10,   15,   20,   30,   40,  50,   60,  120,  300};
}

std::vector<double> e2e_buckets() {
  return {0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 6, 8, 10, 20, 40, 60, 120, 300, 600, 1200, 2400};
}

}  // namespace

SimMetrics::SimMetrics(const std::string& model_name, int dp_size) {
  const std::vector<std::string> labels = {"model_name", "dp_rank"};
  auto& prompt = registry_.counter("sglang:prompt_tokens_total",
                                   "Number of prefill tokens processed.", labels);
  auto& gen = registry_.counter("sglang:generation_tokens_total",
                                "Number of generation tokens processed.", labels);
  auto& cached =
      registry_.counter("sglang:cached_tokens_total", "Number of cached prompt tokens.", labels);
  auto& reqs =
      registry_.counter("sglang:num_requests_total", "Number of requests processed.", labels);
  auto& running =
      registry_.gauge("sglang:num_running_reqs", "The number of running requests.", labels);
  auto& queued = registry_.gauge("sglang:num_queue_reqs",
                                 "The number of requests in the waiting queue.", labels);
  auto& used = registry_.gauge("sglang:num_used_tokens", "The number of used tokens.", labels);
  auto& usage = registry_.gauge("sglang:token_usage", "The token usage.", labels);
  auto& hit = registry_.gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", labels);
  auto& ttft =
      registry_.histogram("sglang:time_to_first_token_seconds",
                          "Histogram of time to first token in seconds.", labels, ttft_buckets());
  auto& e2e = registry_.histogram("sglang:e2e_request_latency_seconds",
                                  "Histogram of End-to-end request latency in seconds", labels,
                                  e2e_buckets());
  for (int r = 0; r < dp_size; ++r) {
    std::string rank = std::to_string(r);
    ranks_.push_back(RankMetrics{
        .prompt_tokens = &prompt.with({model_name, rank}),
        .generation_tokens = &gen.with({model_name, rank}),
        .cached_tokens = &cached.with({model_name, rank}),
        .requests = &reqs.with({model_name, rank}),
        .running = &running.with({model_name, rank}),
        .queued = &queued.with({model_name, rank}),
        .used_tokens = &used.with({model_name, rank}),
        .token_usage = &usage.with({model_name, rank}),
        .cache_hit_rate = &hit.with({model_name, rank}),
        .ttft = &ttft.with({model_name, rank}),
        .e2e = &e2e.with({model_name, rank}),
    });
  }
}

}  // namespace kvgate::sim
