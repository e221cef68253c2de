// bench/load: see load.h.
#include "bench/load.h"

#include <algorithm>
#include <boost/asio/as_tuple.hpp>
#include <cmath>

#include "http/client.h"
#include "http/io.h"
#include "util/json.h"

namespace kvgate::bench {

int LoadReport::errors() const {
  return static_cast<int>(std::count_if(results.begin(), results.end(), [](const auto& r) {
    return r.status < 200 || r.status >= 300;
  }));
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  double rank = p / 100.0 * static_cast<double>(v.size() - 1);
  size_t lo = static_cast<size_t>(std::floor(rank));
  size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (rank - static_cast<double>(lo));
}

double LoadReport::percentile_latency(double p) const {
  std::vector<double> v;
  for (const auto& r : results) v.push_back(r.latency_ms);
  return percentile(v, p);
}

double LoadReport::percentile_ttfb(double p) const {
  std::vector<double> v;
  for (const auto& r : results) v.push_back(r.ttfb_ms);
  return percentile(v, p);
}

std::map<std::string, int> LoadReport::per_worker() const {
  std::map<std::string, int> m;
  for (const auto& r : results) {
    if (!r.worker.empty()) m[r.worker]++;
  }
  return m;
}

std::string request_body(const LoadConfig& c, int index) {
  std::string prompt = c.prompt ? c.prompt(index) : "Request " + std::to_string(index);
  std::string out;
  out.reserve(prompt.size() + 160);
  switch (c.api) {
    case Api::kChat:
      out = R"({"model":)" + json::quote(c.model) + R"(,"messages":[{"role":"user","content":)" +
            json::quote(prompt) + R"(}],"max_tokens":)" + std::to_string(c.max_tokens);
      break;
    case Api::kCompletions:
      out = R"({"model":)" + json::quote(c.model) + R"(,"prompt":)" + json::quote(prompt) +
            R"(,"max_tokens":)" + std::to_string(c.max_tokens);
      break;
    case Api::kGenerate:
      out = R"({"text":)" + json::quote(prompt) + R"(,"sampling_params":{"max_new_tokens":)" +
            std::to_string(c.max_tokens) + "}";
      break;
  }
  out += c.stream ? R"(,"stream":true})" : "}";
  return out;
}

namespace {

std::string_view path_of(Api api) {
  switch (api) {
    case Api::kChat:
      return "/v1/chat/completions";
    case Api::kCompletions:
      return "/v1/completions";
    case Api::kGenerate:
      return "/generate";
  }
  return "/";
}

awaitable<RequestResult> one_request(asio::any_io_executor ex, http::ConnectionPool& pool,
                                     const http::Target& target, const LoadConfig& c, int index) {
  RequestResult r;
  r.index = index;
  std::string body = request_body(c, index);
  static constexpr http::Header kHeaders[] = {{"content-type", "application/json"}};
  auto start = Clock::now();
  http::UpstreamCall call(ex, pool, target, 1);
  call.set_deadline(start + c.timeout);
  auto err = co_await call.start("POST", path_of(c.api), kHeaders, body);
  auto ms = [&] { return std::chrono::duration<double, std::milli>(Clock::now() - start).count(); };
  if (err != http::CallError::kNone) {
    r.error = std::string(http::to_string(err)) + ": " + call.error_detail();
    r.latency_ms = ms();
    co_return r;
  }
  r.status = call.status();
  r.worker = std::string(call.header("x-kvgate-worker"));
  r.route = std::string(call.header("x-kvgate-route"));
  char buf[16384];
  bool first = true;
  for (;;) {
    http::CallError e = http::CallError::kNone;
    size_t n = co_await call.read_some(buf, sizeof buf, e);
    if (n > 0 && first) {
      r.ttfb_ms = ms();
      first = false;
    }
    r.bytes += n;
    if (e != http::CallError::kNone) {
      r.error = std::string(http::to_string(e)) + " mid-body: " + call.error_detail();
      r.status = 0;
      break;
    }
    if (n == 0) break;
  }
  r.latency_ms = ms();
  if (first) r.ttfb_ms = r.latency_ms;
  co_return r;
}

}  // namespace

LoadReport run_load(const LoadConfig& c,
                    const std::function<void(const RequestResult&)>& on_result) {
  LoadReport report;
  asio::io_context ctx(1);
  http::Target target;
  if (std::string e = http::parse_url(c.url, target);
      !e.empty() || !http::resolve(target).empty()) {
    RequestResult r;
    r.error = "bad --url: " + (e.empty() ? http::resolve(target) : e);
    report.results.push_back(r);
    return report;
  }
  http::ConnectionPool pool;
  int next = 0;
  auto start = Clock::now();
  auto client = [&]() -> awaitable<void> {
    while (next < c.requests) {
      int index = next++;
      RequestResult r = co_await one_request(ctx.get_executor(), pool, target, c, index);
      if (on_result) on_result(r);
      report.results.push_back(std::move(r));
    }
  };
  for (int i = 0; i < std::max(1, c.concurrency); ++i)
    asio::co_spawn(ctx, client(), asio::detached);
  ctx.run();
  report.wall_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return report;
}

}  // namespace kvgate::bench
