// bench/load: a closed-loop HTTP load generator on Asio coroutines. C concurrent clients each send
// their share of N requests to one OpenAI-compatible or SGLang endpoint, measuring latency, time to
// first byte of the body (TTFT for streams) and which worker answered (x-kvgate-worker).
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace kvgate::bench {

enum class Api { kChat, kCompletions, kGenerate };

struct LoadConfig {
  std::string url;  // http://host:port
  Api api = Api::kChat;
  std::string model = "default";
  int requests = 16;
  int concurrency = 4;
  int max_tokens = 16;
  bool stream = false;
  std::chrono::seconds timeout{60};
  std::function<std::string(int)> prompt;  // request index -> prompt text
};

struct RequestResult {
  int index = 0;
  int status = 0;  // 0: transport error
  std::string error;
  std::string worker;  // x-kvgate-worker, when the gateway sends it
  std::string route;   // x-kvgate-route
  double latency_ms = 0;
  double ttfb_ms = 0;  // first body bytes
  size_t bytes = 0;
};

struct LoadReport {
  std::vector<RequestResult> results;  // in completion order
  double wall_seconds = 0;
  int errors() const;
  double percentile_latency(double p) const;
  double percentile_ttfb(double p) const;
  std::map<std::string, int> per_worker() const;
};

// Runs the load and returns when every request finished. `on_result` (optional) is called as
// each request completes.
LoadReport run_load(const LoadConfig& config,
                    const std::function<void(const RequestResult&)>& on_result = {});

// The JSON body of request `index` for the configured API.
std::string request_body(const LoadConfig& config, int index);

double percentile(std::vector<double> values, double p);

}  // namespace kvgate::bench
