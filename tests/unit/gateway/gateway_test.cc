// Tests for gateway/gateway in process: a Gateway served on loopback in front of scripted workers,
// with a policy that records its hooks. What a review found, each failing before its fix: hooks
// unbalanced (on_dispatched per attempt, on_completed skipped), retries of requests a worker had
// whole, 429/503 retried without budget or Retry-After and replaced by a 502, a 500 charged to
// every worker it visited, a half-open breaker letting everything through, a stream aborted in its
// first event passed on as a success, hop-by-hop and pinning headers forwarded, queued requests of
// departed clients kept, and suspended requests outliving their thread's state at shutdown.
#include "gateway/gateway.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/as_tuple.hpp>
#include <cstdio>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "gateway/knobs.h"
#include "http/client.h"
#include "http/server.h"
#include "http/traceparent.h"
#include "support/http_client.h"
#include "support/process.h"
#include "util/log.h"

namespace kvgate {
namespace {

using namespace std::chrono_literals;
using testing::HttpClient;
using testing::wait_until;

// A worker: an HTTP server on its own thread running the test's handler.
class FakeWorker {
 public:
  explicit FakeWorker(http::Handler h) {
    http::ServerConfig cfg;
    cfg.host = "127.0.0.1";
    server_ = std::make_unique<http::Server>(std::vector<asio::io_context*>{&ctx_}, cfg,
                                             [this, h = std::move(h)](http::Exchange& ex) {
                                               requests++;
                                               return h(ex);
                                             });
    server_->start();
    thread_ = std::thread([this] {
      auto guard = asio::make_work_guard(ctx_);
      ctx_.run();
    });
  }
  ~FakeWorker() {
    server_->stop();
    ctx_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(server_->port()); }
  std::atomic<int> requests{0};

 private:
  asio::io_context ctx_{1};
  std::unique_ptr<http::Server> server_;
  std::thread thread_;
};

awaitable<void> pause(http::Exchange& ex, std::chrono::milliseconds d) {
  Timer t(ex.executor(), d);
  co_await t.async_wait(asio::as_tuple(use_awaitable));
}

http::Handler answer(int status, std::string body, std::vector<http::OwnedHeader> extra = {}) {
  return [=](http::Exchange& ex) -> awaitable<void> {
    std::vector<http::Header> h{{"content-type", "application/json"}};
    for (const auto& e : extra) h.push_back({e.name, e.value});
    co_await ex.respond(status, h, body);
  };
}

// A worker streaming `events` (SSE text) in one write after a 200 and its headers.
http::Handler sse(std::string events) {
  return [events = std::move(events)](http::Exchange& ex) -> awaitable<void> {
    const http::Header h[] = {{"content-type", "text/event-stream"}};
    co_await ex.begin_body(200, h, std::nullopt);
    co_await ex.write_body(events);
    co_await ex.end_body();
  };
}

// A policy that prefers workers in the order given (by index), and records every hook.
class RecordingPolicy final : public Policy {
 public:
  struct Event {
    char kind;  // 'd' dispatched, 'c' completed
    uint64_t worker;
    Outcome outcome;
  };
  std::string_view name() const override { return "recording"; }
  Decision select(std::span<Worker* const> available, RouteContext&) override {
    std::lock_guard lock(mu);
    for (uint64_t id : preference) {
      for (Worker* w : available) {
        if (w->id() == id) return {w, std::nullopt, "preferred", 0};
      }
    }
    return {available[0], std::nullopt, "first", 0};
  }
  void on_dispatched(const Decision& d, RouteContext&) override {
    std::lock_guard lock(mu);
    events.push_back({'d', d.worker->id(), {}});
  }
  void on_completed(const Decision& d, RouteContext&, const Outcome& o) override {
    std::lock_guard lock(mu);
    events.push_back({'c', d.worker->id(), o});
  }
  std::vector<Event> snapshot() {
    std::lock_guard lock(mu);
    return events;
  }
  // Each dispatch followed by exactly one completion of the same worker.
  // Waits (the last completion is recorded after the client has its answer) until `n` events.
  bool wait_events(size_t n) {
    return wait_until([&] { return snapshot().size() >= n; });
  }
  bool balanced() {
    auto ev = snapshot();
    if (ev.size() % 2) return false;
    for (size_t i = 0; i < ev.size(); i += 2) {
      if (ev[i].kind != 'd' || ev[i + 1].kind != 'c' || ev[i].worker != ev[i + 1].worker) {
        return false;
      }
    }
    return true;
  }
  std::mutex mu;
  std::vector<uint64_t> preference;
  std::vector<Event> events;
};

// kvgate's request path in process: a Gateway over the given worker URLs on a loopback listener.
class Harness {
 public:
  explicit Harness(std::vector<std::string> urls, std::function<void(GatewayConfig&)> tweak = {},
                   BreakerConfig breaker = breaker_config(GatewayConfig{})) {
    cfg_.retry_initial_backoff_ms = 1;
    cfg_.retry_max_backoff_ms = 30000;
    if (tweak) tweak(cfg_);
    metrics_ = std::make_unique<GatewayMetrics>(
        metrics_registry, metrics::latency_buckets(), metrics::short_latency_buckets(),
        cfg_.metrics_compat == "smg" ? MetricsCompat::kSmg : MetricsCompat::kNone);
    PoolEnv env;
    env.config = &cfg_;
    env.metrics = metrics_.get();
    env.registry = &metrics_registry;
    env.control = &control_;
    env.next_worker_id = &next_id_;
    env.breaker = breaker;
    env.health = health_config(cfg_);
    pools_ = std::make_unique<PoolManager>(env);
    pools_->set_policy_override("default", [this] {
      auto p = std::make_unique<RecordingPolicy>();
      policy = p.get();
      return p;
    });
    rules::Rule rule;
    rule.name = "default";
    rule.mode = 4;
    rule.policy_knobs = cfg_;
    for (const auto& u : urls) rule.endpoints.push_back({.url = u});
    auto errors = pools_->apply({rule});
    EXPECT_TRUE(errors.empty()) << rules::format_errors(errors);
    // Health probes do not run here (the pools are not started): every worker is up.
    for (const auto& w : pools_->table()->pools[0]->workers()->workers) w->set_healthy(true);
    gateway_ = std::make_unique<Gateway>(cfg_, *pools_, *metrics_);
    thread_state_ = std::make_unique<RequestThread>(cfg_);
    http::ServerConfig sc;
    sc.host = "127.0.0.1";
    server_ =
        std::make_unique<http::Server>(std::vector<asio::io_context*>{ctx_.get()}, sc,
                                       [this](http::Exchange& ex) { return gateway_->handle(ex); });
    server_->start();
    thread_ = std::thread([this] {
      thread_state_->bind();
      auto guard = asio::make_work_guard(*ctx_);
      ctx_->run();
    });
  }
  ~Harness() { shutdown(); }
  // kvgate's teardown order: stop the loop, close the thread state, destroy the loop (suspended
  // requests are destroyed then, and must still find what they use), then the state.
  void shutdown() {
    if (!ctx_) return;
    server_->stop();
    ctx_->stop();
    thread_.join();
    server_.reset();
    thread_state_->close();
    ctx_.reset();
    thread_state_.reset();
  }
  int port() const { return port_ ? port_ : server_->port(); }
  Worker& worker(size_t i) { return *pools_->table()->pools[0]->workers()->workers[i]; }
  Gateway& gateway() { return *gateway_; }
  PoolManager& pools() { return *pools_; }
  Admission& admission() { return gateway_->admission(); }
  double metric(const std::string& series) {
    std::string text = metrics_registry.expose();
    auto pos = text.find("\n" + series + " ");
    if (pos == std::string::npos) return -1;
    return std::atof(text.c_str() + pos + series.size() + 2);
  }

  metrics::Registry metrics_registry;
  RecordingPolicy* policy = nullptr;

 private:
  std::unique_ptr<GatewayMetrics> metrics_;  // (made once the config is tweaked: its compat)
  GatewayConfig cfg_;
  asio::io_context control_;
  std::atomic<uint64_t> next_id_{1};
  std::unique_ptr<PoolManager> pools_;
  std::unique_ptr<Gateway> gateway_;
  std::unique_ptr<asio::io_context> ctx_ = std::make_unique<asio::io_context>(1);
  std::unique_ptr<RequestThread> thread_state_;
  std::unique_ptr<http::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

const char* kBody = R"({"text":"hello","sampling_params":{"max_new_tokens":4}})";

std::string closed_url() {
  return "http://127.0.0.1:" + std::to_string(testing::free_port());
}

TEST(GatewayHooks, ConnectFailureCompletesAsNotStartedThenTheNextWorkerServes) {
  FakeWorker good(answer(200, R"({"text":"ok"})"));
  Harness h({closed_url(), good.url()});
  h.policy->preference = {1, 2};
  HttpClient c(h.port());
  auto r = c.post("/generate", kBody);
  EXPECT_EQ(r.status, 200) << r.body;
  ASSERT_TRUE(h.policy->wait_events(4));
  auto ev = h.policy->snapshot();
  ASSERT_EQ(ev.size(), 4u);
  EXPECT_EQ(ev[1].worker, 1u);
  EXPECT_FALSE(ev[1].outcome.started);  // never reached the worker: no prefix to record
  EXPECT_FALSE(ev[1].outcome.ok);
  EXPECT_EQ(ev[3].worker, 2u);
  EXPECT_TRUE(ev[3].outcome.ok);
  EXPECT_TRUE(h.policy->balanced());
}

TEST(GatewayHooks, ClientAbortMidStreamCompletesOnce) {
  FakeWorker slow([](http::Exchange& ex) -> awaitable<void> {
    const http::Header h[] = {{"content-type", "text/event-stream"}};
    co_await ex.begin_body(200, h, std::nullopt);
    for (int i = 0; i < 200; ++i) {
      bool written = co_await ex.write_body("data: {\"text\":\"x\"}\n\n");
      if (!written) co_return;
      co_await pause(ex, 20ms);
    }
    co_await ex.end_body();
  });
  Harness h({slow.url()});
  {
    HttpClient c(h.port());
    int pieces = 0;
    c.stream("POST", "/generate", R"({"text":"hi","stream":true})", {},
             [&](std::string_view) { return ++pieces < 3; });
  }
  ASSERT_TRUE(testing::wait_until([&] { return h.policy->snapshot().size() == 2; }));
  auto ev = h.policy->snapshot();
  EXPECT_EQ(ev[1].outcome.status, 499);
  EXPECT_TRUE(h.policy->balanced());
  EXPECT_TRUE(wait_until([&] { return h.worker(0).inflight() == 0; }));
}

TEST(GatewayRetry, ResetAfterTheWholeRequestIsNotRetried) {
  // The first worker takes the request and dies without answering: it may have been generating;
  // the second worker must never see the request.
  FakeWorker dying([](http::Exchange& ex) -> awaitable<void> {
    ex.abort();
    co_return;
  });
  FakeWorker good(answer(200, R"({"text":"ok"})"));
  Harness h({dying.url(), good.url()});
  h.policy->preference = {1, 2};
  HttpClient c(h.port());
  auto r = c.post("/generate", kBody);
  EXPECT_EQ(r.status, 502) << r.body;
  EXPECT_NE(r.body.find("upstream_no_answer"), std::string::npos) << r.body;
  EXPECT_EQ(r.body.find("127.0.0.1"), std::string::npos) << r.body;  // no internal address
  EXPECT_EQ(good.requests.load(), 0);
  EXPECT_EQ(h.metric("kvgate_retries_denied_total{reason=\"unsafe\"}"), 1);
  ASSERT_TRUE(h.policy->wait_events(2));
  EXPECT_TRUE(h.policy->balanced());
}

TEST(GatewayRetry, RefusalIsRetriedElsewhereAndItsDispatchCompletesAsNotStarted) {
  FakeWorker busy(answer(503, R"({"object":"error","message":"queue full"})"));
  FakeWorker good(answer(200, R"({"text":"ok"})"));
  Harness h({busy.url(), good.url()});
  h.policy->preference = {1, 2};
  HttpClient c(h.port());
  auto r = c.post("/generate", kBody);
  EXPECT_EQ(r.status, 200) << r.body;
  ASSERT_TRUE(h.policy->wait_events(4));
  auto ev = h.policy->snapshot();
  ASSERT_EQ(ev.size(), 4u);
  EXPECT_EQ(ev[1].outcome.status, 503);
  EXPECT_FALSE(ev[1].outcome.started);
  EXPECT_TRUE(h.policy->balanced());
}

TEST(GatewayRetry, WorkersOwnRefusalReachesTheClientWhenRetriesGiveUp) {
  // Both workers refuse: after the attempts, the client gets a worker's own 429, body and
  // Retry-After included, not a gateway 502.
  FakeWorker a(answer(429, R"({"error":"slow down a"})", {{"retry-after", "1"}}));
  FakeWorker b(answer(429, R"({"error":"slow down b"})", {{"retry-after", "1"}}));
  Harness h({a.url(), b.url()}, [](GatewayConfig& c) {
    c.retry_max_retries = 3;
    c.retry_max_backoff_ms = 2000;
  });
  HttpClient c(h.port());
  c.set_timeout(20s);
  auto r = c.post("/generate", kBody);
  EXPECT_EQ(r.status, 429) << r.body;
  EXPECT_NE(r.body.find("slow down"), std::string::npos) << r.body;
  EXPECT_EQ(r.header("retry-after"), "1");
  EXPECT_EQ(a.requests.load() + b.requests.load(), 3);
}

TEST(GatewayRetry, RetryAfterLongerThanTheBackoffCapPassesTheRefusalThrough) {
  FakeWorker a(answer(503, R"({"error":"draining"})", {{"retry-after", "120"}}));
  FakeWorker b(answer(200, R"({"text":"ok"})"));
  Harness h({a.url(), b.url()}, [](GatewayConfig& c) { c.retry_max_backoff_ms = 5000; });
  h.policy->preference = {1, 2};
  HttpClient c(h.port());
  auto r = c.post("/generate", kBody);
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_EQ(r.header("retry-after"), "120");
  EXPECT_EQ(b.requests.load(), 0);
  EXPECT_EQ(h.metric("kvgate_retries_denied_total{reason=\"retry_after\"}"), 1);
}

TEST(GatewayRetry, EmptyBudgetMeansTheFirstAnswerStands) {
  FakeWorker busy(answer(503, R"({"error":"busy"})"));
  FakeWorker good(answer(200, R"({"text":"ok"})"));
  Harness h({busy.url(), good.url()}, [](GatewayConfig& c) {
    c.retry_budget_percent = 0;
    c.retry_budget_min_concurrency = 0;
  });
  h.policy->preference = {1, 2};
  HttpClient c(h.port());
  auto r = c.post("/generate", kBody);
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(good.requests.load(), 0);
  EXPECT_EQ(h.metric("kvgate_retries_denied_total{reason=\"budget\"}"), 1);
}

TEST(GatewayRetry, ARequestThatFailsEverywhereIsNotChargedToTheWorkers) {
  // A poison request (500 on every worker) is retried once, then its 500 goes to the client;
  // neither worker's breaker (threshold 1) opens: the request, not the workers, is at fault.
  FakeWorker a(answer(500, R"({"error":"bad input"})"));
  FakeWorker b(answer(500, R"({"error":"bad input"})"));
  BreakerConfig br = breaker_config(GatewayConfig{});
  br.failure_threshold = 1;
  Harness h({a.url(), b.url()}, {}, br);
  h.policy->preference = {1, 2};
  HttpClient c(h.port());
  auto r = c.post("/generate", kBody);
  EXPECT_EQ(r.status, 500);
  EXPECT_EQ(a.requests.load() + b.requests.load(), 2);
  EXPECT_EQ(h.worker(0).breaker().state(), BreakerState::kClosed);
  EXPECT_EQ(h.worker(1).breaker().state(), BreakerState::kClosed);
}

TEST(GatewayRetry, A500IsChargedWhenAnotherWorkerServesTheRequest) {
  FakeWorker a(answer(500, R"({"error":"oom"})"));
  FakeWorker b(answer(200, R"({"text":"ok"})"));
  BreakerConfig br = breaker_config(GatewayConfig{});
  br.failure_threshold = 1;
  Harness h({a.url(), b.url()}, {}, br);
  h.policy->preference = {1, 2};
  HttpClient c(h.port());
  EXPECT_EQ(c.post("/generate", kBody).status, 200);
  EXPECT_EQ(h.worker(0).breaker().state(), BreakerState::kOpen);  // charged before relaying
  EXPECT_EQ(h.worker(1).breaker().state(), BreakerState::kClosed);
}

TEST(GatewayRetry, StreamAbortedInItsFirstEventIsAFailedAttempt) {
  // SGLang admits, sends 200 and the stream headers, then aborts in the first event. That is
  // not a success: the next worker serves, the client never sees the abort.
  FakeWorker aborting([](http::Exchange& ex) -> awaitable<void> {
    const http::Header h[] = {{"content-type", "text/event-stream"}};
    co_await ex.begin_body(200, h, std::nullopt);
    co_await ex.flush();
    co_await ex.write_body(
        "data: {\"text\":\"\",\"meta_info\":{\"finish_reason\":{\"type\":\"abort\",\"message\":"
        "\"queue full\",\"status_code\":503}}}\n\n");
    co_await ex.write_body("data: [DONE]\n\n");
    co_await ex.end_body();
  });
  FakeWorker good(sse("data: {\"text\":\"fine\"}\n\ndata: [DONE]\n\n"));
  BreakerConfig br = breaker_config(GatewayConfig{});
  br.failure_threshold = 1;
  Harness h({aborting.url(), good.url()}, {}, br);
  h.policy->preference = {1, 2};
  HttpClient c(h.port());
  auto r = c.post("/generate", R"({"text":"hi","stream":true})");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(testing::sse_data(r.body), (std::vector<std::string>{"{\"text\":\"fine\"}", "[DONE]"}));
  EXPECT_EQ(h.worker(0).breaker().state(), BreakerState::kOpen);
  ASSERT_TRUE(h.policy->wait_events(4));
  EXPECT_TRUE(h.policy->balanced());
}

// A short stream can be read whole by the first-event check (the answer ended before its first
// event was looked at): all of it must still reach the client, framed by length or chunked.
TEST(GatewayRelay, AStreamReadWholeByTheFirstEventCheckIsRelayedWhole) {
  const std::string events = "data: {\"text\":\"a\"}\n\ndata: {\"text\":\"b\"}\n\ndata: [DONE]\n\n";
  FakeWorker by_length([&](http::Exchange& ex) -> awaitable<void> {
    const http::Header h[] = {{"content-type", "text/event-stream"}};
    co_await ex.respond(200, h, events);
  });
  FakeWorker chunked([&](http::Exchange& ex) -> awaitable<void> {
    const http::Header h[] = {{"content-type", "text/event-stream"}};
    co_await ex.begin_body(200, h, std::nullopt);
    co_await ex.write_body(events);  // one chunk, then the last chunk: all in one read
    co_await ex.end_body();
  });
  for (FakeWorker* w : {&by_length, &chunked}) {
    Harness h({w->url()});
    HttpClient c(h.port());
    auto r = c.post("/generate", R"({"text":"hi","stream":true})");
    EXPECT_EQ(r.status, 200);
    EXPECT_EQ(testing::sse_data(r.body),
              (std::vector<std::string>{"{\"text\":\"a\"}", "{\"text\":\"b\"}", "[DONE]"}))
        << r.body;
  }
}

TEST(GatewayRetry, LastWorkerAbortingItsStreamIsRelayedAsItSentIt) {
  FakeWorker aborting([](http::Exchange& ex) -> awaitable<void> {
    const http::Header h[] = {{"content-type", "text/event-stream"}};
    co_await ex.begin_body(200, h, std::nullopt);
    co_await ex.write_body("data: {\"error\":{\"message\":\"aborted\",\"code\":503}}\n\n");
    co_await ex.write_body("data: [DONE]\n\n");
    co_await ex.end_body();
  });
  BreakerConfig br = breaker_config(GatewayConfig{});
  br.failure_threshold = 1;
  Harness h(
      {aborting.url()}, [](GatewayConfig& c) { c.retry_max_retries = 1; }, br);
  HttpClient c(h.port());
  auto r = c.post("/generate", R"({"text":"hi","stream":true})");
  EXPECT_EQ(r.status, 200);
  auto events = testing::sse_data(r.body);
  ASSERT_EQ(events.size(), 2u) << r.body;
  EXPECT_NE(events[0].find("aborted"), std::string::npos);
  EXPECT_EQ(events[1], "[DONE]");
  // Relayed because no retry could follow, but still the worker's failure, not a success.
  EXPECT_TRUE(wait_until([&] { return h.worker(0).breaker().state() == BreakerState::kOpen; }));
}

TEST(GatewayRetry, ARequestsOwnErrorInTheFirstEventIsRelayedNotRetriedNotCharged) {
  // SGLang streams a request's own error (a ValueError: input longer than the context...) as
  // 200 then data: {"error": {"message"}} (no status), or an abort naming a 4xx: the request's
  // answer, not a worker fault. Retrying it elsewhere would fail the same way on every worker
  // and open every breaker.
  for (std::string first :
       {std::string(R"(data: {"error":{"message":"input is longer than the context"}})"),
        std::string(R"(data: {"text":"","meta_info":{"finish_reason":{"type":"abort",)"
                    R"("message":"too long","status_code":400}}})")}) {
    auto script = sse(first + "\n\ndata: [DONE]\n\n");
    FakeWorker a(script), b(script);
    BreakerConfig br = breaker_config(GatewayConfig{});
    br.failure_threshold = 1;
    Harness h({a.url(), b.url()}, {}, br);
    h.policy->preference = {1, 2};
    HttpClient c(h.port());
    auto r = c.post("/generate", R"({"text":"hi","stream":true})");
    EXPECT_EQ(r.status, 200);
    EXPECT_NE(r.body.find("long"), std::string::npos) << r.body;
    EXPECT_EQ(a.requests.load() + b.requests.load(), 1);
    ASSERT_TRUE(h.policy->wait_events(2));
    EXPECT_EQ(h.worker(0).breaker().state(), BreakerState::kClosed);
  }
}

TEST(GatewayRetry, AnEngineAbortNamingNoStatusIsTheWorkersAndRetried) {
  // SGLang's FINISH_ABORT without a status_code (an abort or a drain on the engine's side) is not
  // the request's error: the next worker serves it.
  FakeWorker aborting(
      sse("data: {\"text\":\"\",\"meta_info\":{\"finish_reason\":{\"type\":\"abort\","
          "\"message\":\"Aborted\",\"status_code\":null}}}\n\ndata: [DONE]\n\n"));
  FakeWorker good(sse("data: {\"text\":\"fine\"}\n\ndata: [DONE]\n\n"));
  Harness h({aborting.url(), good.url()});
  h.policy->preference = {1, 2};
  HttpClient c(h.port());
  auto r = c.post("/generate", R"({"text":"hi","stream":true})");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(testing::sse_data(r.body), (std::vector<std::string>{"{\"text\":\"fine\"}", "[DONE]"}));
  EXPECT_EQ(good.requests.load(), 1);
}

TEST(GatewayRetry, ARelayedBackpressureAbortDoesNotOpenTheBreaker) {
  // A 429 in the first event, relayed because no retry may follow, counts as a 429 answer does:
  // backpressure, not a failure.
  FakeWorker busy(
      sse("data: {\"error\":{\"message\":\"too many requests\",\"code\":429}}\n\n"
          "data: [DONE]\n\n"));
  BreakerConfig br = breaker_config(GatewayConfig{});
  br.failure_threshold = 1;
  Harness h(
      {busy.url()}, [](GatewayConfig& c) { c.retry_max_retries = 1; }, br);
  HttpClient c(h.port());
  auto r = c.post("/generate", R"({"text":"hi","stream":true})");
  EXPECT_EQ(r.status, 200);
  EXPECT_NE(r.body.find("too many requests"), std::string::npos) << r.body;
  ASSERT_TRUE(h.policy->wait_events(2));
  EXPECT_EQ(h.worker(0).breaker().state(), BreakerState::kClosed);
}

TEST(GatewayRetry, A500IsNotChargedWhenTheNextWorkerAnswersTheRequestsOwnError) {
  FakeWorker failing(answer(500, R"({"error":"boom"})"));
  FakeWorker rejecting(sse("data: {\"error\":{\"message\":\"input too long\"}}\n\n"));
  BreakerConfig br = breaker_config(GatewayConfig{});
  br.failure_threshold = 1;
  Harness h({failing.url(), rejecting.url()}, {}, br);
  h.policy->preference = {1, 2};
  HttpClient c(h.port());
  auto r = c.post("/generate", R"({"text":"hi","stream":true})");
  EXPECT_EQ(r.status, 200);
  EXPECT_NE(r.body.find("input too long"), std::string::npos) << r.body;
  ASSERT_TRUE(h.policy->wait_events(4));
  EXPECT_EQ(h.worker(0).breaker().state(), BreakerState::kClosed);
}

TEST(GatewayRetry, WorkerDyingAfterItsHeadersIsACleanErrorNotAnEmptyReply) {
  FakeWorker dying([](http::Exchange& ex) -> awaitable<void> {
    const http::Header hdr[] = {{"content-type", "application/json"}};
    co_await ex.begin_body(200, hdr, 100);
    co_await ex.flush();  // status and headers, then the worker dies
    ex.abort();
  });
  Harness h({dying.url()});
  HttpClient c(h.port());
  auto r = c.post("/generate", kBody);
  EXPECT_EQ(r.status, 502) << r.body;
  EXPECT_NE(r.body.find("upstream_failed"), std::string::npos) << r.body;
}

TEST(GatewayRetry, AStreamCutInsideItsFirstEventIsAnErrorNotATruncatedSuccess) {
  // Part of the first event, then the worker dies: the client must not get that fragment as a
  // stream that ended cleanly (a 200 with no error and no [DONE], counted a success).
  FakeWorker dying([](http::Exchange& ex) -> awaitable<void> {
    const http::Header hdr[] = {{"content-type", "text/event-stream"}};
    co_await ex.begin_body(200, hdr, std::nullopt);
    co_await ex.write_body("data: {\"text\":\"par");
    co_await ex.flush();
    ex.abort();
  });
  Harness h({dying.url()});
  HttpClient c(h.port());
  auto r = c.post("/generate", R"({"text":"hi","stream":true})");
  EXPECT_EQ(r.status, 502) << r.body;
  EXPECT_EQ(r.body.find("\"par"), std::string::npos) << r.body;
}

TEST(GatewayRetry, AClientLeavingDuringARetryWaitFreesItsSlotAtOnce) {
  // The worker asks for 20 s before a retry; the client leaves meanwhile: its admission slot
  // must come back now, not when the wait would have ended.
  FakeWorker slow_down(answer(503, R"({"error":"later"})", {{"retry-after", "20"}}));
  FakeWorker good(answer(200, R"({"text":"ok"})"));
  Harness h({slow_down.url(), good.url()}, [](GatewayConfig& c) {
    c.max_concurrent_requests = 1;
    c.queue_size = 4;
    c.queue_timeout_secs = 60;
  });
  h.policy->preference = {1, 2};
  {
    HttpClient leaving(h.port());
    leaving.set_timeout(300ms);
    leaving.post("/generate", kBody);  // gives up during the 20 s wait
  }
  EXPECT_TRUE(wait_until([&] { return h.admission().active() == 0; }, 5s));
}

TEST(GatewayBreaker, HalfOpenSendsOneTrialWhileOthersGoElsewhere) {
  std::atomic<bool> failing{true};
  FakeWorker flaky([&](http::Exchange& ex) -> awaitable<void> {
    if (failing) {
      co_await ex.respond(502, {}, "down");
      co_return;
    }
    co_await pause(ex, 300ms);  // a slow trial: the others arrive while it runs
    co_await ex.respond(200, {}, "{}");
  });
  FakeWorker good(answer(200, R"({"text":"ok"})"));
  BreakerConfig br = breaker_config(GatewayConfig{});
  br.failure_threshold = 1;
  br.success_threshold = 1;
  br.open_timeout = 200ms;
  Harness h({flaky.url(), good.url()}, {}, br);
  h.policy->preference = {1, 2};
  HttpClient c(h.port());
  EXPECT_EQ(c.post("/generate", kBody).status, 200);  // 502 from flaky, retried on good
  ASSERT_EQ(h.worker(0).breaker().state(), BreakerState::kOpen);
  failing = false;
  int before = flaky.requests.load();
  ASSERT_TRUE(testing::wait_until([&] { return h.worker(0).available(Clock::now()); }));
  std::vector<std::future<testing::Response>> burst;
  for (int i = 0; i < 8; ++i) {
    burst.push_back(std::async(std::launch::async, [&] {
      HttpClient cc(h.port());
      return cc.post("/generate", kBody);
    }));
  }
  for (auto& f : burst) EXPECT_EQ(f.get().status, 200);
  EXPECT_EQ(flaky.requests.load() - before, 1);  // one trial, not the whole burst
  EXPECT_TRUE(wait_until([&] { return h.worker(0).breaker().state() == BreakerState::kClosed; }));
}

TEST(GatewayPools, ARequestCompletesOnThePoolItResolvedAfterItsRuleChanged) {
  // The rule is replaced (a new policy) while a request is at its worker: the completion goes to
  // the policy that decided, the new policy hears nothing of it, and the next request uses it.
  std::atomic<bool> release{false};
  FakeWorker held([&](http::Exchange& ex) -> awaitable<void> {
    while (!release.load()) co_await pause(ex, 2ms);
    co_await ex.respond(200, {}, R"({"text":"ok"})");
  });
  Harness h({held.url()});
  RecordingPolicy* first = h.policy;
  auto pending = std::async(std::launch::async, [&] {
    HttpClient c(h.port());
    return c.post("/generate", kBody);
  });
  ASSERT_TRUE(testing::wait_until([&] { return held.requests.load() == 1; }));
  rules::Rule next;
  next.name = "default";
  next.mode = 4;
  next.sel = "random";  // a policy change: a new pool and a new policy
  next.endpoints.push_back({.url = held.url()});
  RecordingPolicy* second = nullptr;
  h.pools().set_policy_override("default", [&] {
    auto p = std::make_unique<RecordingPolicy>();
    second = p.get();
    return p;
  });
  ASSERT_TRUE(h.pools().apply({next}).empty());
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(h.pools().retiring(), 1u);  // held by the request in flight
  release = true;
  EXPECT_EQ(pending.get().status, 200);
  ASSERT_TRUE(first->wait_events(2));
  EXPECT_TRUE(first->balanced());
  EXPECT_TRUE(second->snapshot().empty());
  HttpClient c(h.port());
  EXPECT_EQ(c.post("/generate", kBody).status, 200);
  ASSERT_TRUE(second->wait_events(2));
  EXPECT_TRUE(second->balanced());
  EXPECT_EQ(first->snapshot().size(), 2u);
  EXPECT_EQ(h.pools().retire(), 0u);  // the old pool goes once its last request is done
}

TEST(GatewayPools, AModelNoRuleServesIs404ElseTheCatchAllTakesIt) {
  FakeWorker a(answer(200, R"({"text":"a"})"));
  FakeWorker b(answer(200, R"({"text":"b"})"));
  Harness h({a.url()});
  rules::Rule only;
  only.name = "only-m1";
  only.mode = 4;
  only.models = {"m1"};
  only.endpoints.push_back({.url = b.url()});
  rules::Rule def = h.pools().rules()[0];
  auto all_up = [&] {  // the harness runs no health probes
    for (const auto& p : h.pools().table()->pools) {
      for (const auto& w : p->workers()->workers) w->set_healthy(true);
    }
  };
  ASSERT_TRUE(h.pools().apply({only}).empty());
  all_up();
  HttpClient c(h.port());
  auto r = c.post("/generate", R"({"model":"m2","text":"x"})");
  EXPECT_EQ(r.status, 404);
  EXPECT_NE(r.body.find("model_not_found"), std::string::npos) << r.body;
  EXPECT_EQ(c.post("/generate", "not json").status, 400);
  r = c.post("/generate", R"({"model":"m1","text":"x"})");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, R"({"text":"b"})");
  // With a catch-all beside it, other models go there.
  ASSERT_TRUE(h.pools().apply({only, def}).empty());
  all_up();
  r = c.post("/generate", R"({"model":"m2","text":"x"})");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, R"({"text":"a"})");
}

TEST(GatewayHeaders, HopByHopPinningAndForwardingHeaders) {
  std::mutex mu;
  std::map<std::string, std::string> seen;
  FakeWorker echo([&](http::Exchange& ex) -> awaitable<void> {
    {
      std::lock_guard lock(mu);
      ex.for_each_header([&](std::string_view n, std::string_view v) {
        std::string name(n);
        for (auto& ch : name) ch = static_cast<char>(std::tolower(ch));
        seen[name] = std::string(v);
      });
    }
    const http::Header h[] = {{"content-type", "application/json"},
                              {"connection", "x-internal"},
                              {"x-internal", "secret"},
                              {"x-public", "yes"}};
    co_await ex.respond(200, h, "{}");
  });
  Harness h({echo.url()});
  HttpClient c(h.port());
  auto r = c.post("/generate", kBody,
                  {{"Connection", "keep-alive, X-Hop"},
                   {"X-Hop", "must not pass"},
                   {"X-Forwarded-For", "203.0.113.7"},
                   {"X-SMG-Target-Worker", "0"},
                   {"X-Custom", "passes"}});
  ASSERT_EQ(r.status, 200);
  std::lock_guard lock(mu);
  EXPECT_EQ(seen.count("x-hop"), 0u);
  EXPECT_EQ(seen.count("x-smg-target-worker"), 0u);
  EXPECT_EQ(seen["x-custom"], "passes");
  EXPECT_EQ(seen["x-forwarded-for"], "203.0.113.7, 127.0.0.1");
  EXPECT_EQ(seen["forwarded"], "for=127.0.0.1;proto=http");
  EXPECT_FALSE(seen["x-request-id"].empty());
  EXPECT_EQ(r.header("x-internal"), "");  // named in the worker's Connection header
  EXPECT_EQ(r.header("x-public"), "yes");
}

TEST(GatewayAdmission, ClientLeavingTheQueueFreesItsPlace) {
  FakeWorker slow([](http::Exchange& ex) -> awaitable<void> {
    co_await pause(ex, 1500ms);
    co_await ex.respond(200, {}, "{}");
  });
  Harness h({slow.url()}, [](GatewayConfig& c) {
    c.max_concurrent_requests = 1;
    c.queue_size = 10;
  });
  auto first = std::async(std::launch::async, [&] {
    HttpClient c(h.port());
    return c.post("/generate", kBody);
  });
  ASSERT_TRUE(testing::wait_until([&] { return h.admission().active() == 1; }));
  {
    HttpClient queued(h.port());
    queued.set_timeout(200ms);
    queued.post("/generate", kBody);  // times out client-side and closes while queued
  }
  EXPECT_TRUE(wait_until([&] { return h.admission().queued() == 0; }, 3s));
  EXPECT_EQ(first.get().status, 200);
  EXPECT_EQ(slow.requests.load(), 1);  // the departed client's request never ran
}

TEST(GatewayShutdown, SuspendedRequestsAreCompletedWhenTheirLoopIsDestroyed) {
  // After the grace period the loops stop with requests still suspended; destroying the loop
  // destroys them, and each dispatch still gets its one completion (as a client abort).
  std::atomic<bool> reached{false};
  FakeWorker hanging([&](http::Exchange& ex) -> awaitable<void> {
    reached = true;
    co_await pause(ex, 10s);
    co_await ex.respond(200, {}, "{}");
  });
  auto h = std::make_unique<Harness>(std::vector<std::string>{hanging.url()});
  auto pending = std::async(std::launch::async, [&] {
    HttpClient c(h->port());
    c.set_timeout(15s);
    return c.post("/generate", kBody);
  });
  ASSERT_TRUE(testing::wait_until([&] { return reached.load(); }));
  RecordingPolicy* policy = h->policy;
  auto& worker = h->worker(0);
  h->shutdown();
  EXPECT_TRUE(policy->balanced());
  EXPECT_EQ(worker.inflight(), 0);
  EXPECT_EQ(pending.get().status, 0);  // the connection went away with the gateway
}

// What a worker saw of the trace context of each request it got.
struct TraceSeen {
  std::mutex mu;
  std::vector<std::string> traceparents, tracestates;
  std::vector<int> traceparent_fields, tracestate_fields;
  void record(http::Exchange& ex) {
    int parents = 0, states = 0;
    ex.for_each_header([&](std::string_view name, std::string_view) {
      if (http::iequals(name, "traceparent")) ++parents;
      if (http::iequals(name, "tracestate")) ++states;
    });
    std::lock_guard lock(mu);
    traceparents.emplace_back(ex.header("traceparent"));
    tracestates.emplace_back(ex.header("tracestate"));
    traceparent_fields.push_back(parents);
    tracestate_fields.push_back(states);
  }
  void clear() {
    std::lock_guard lock(mu);
    traceparents.clear();
    tracestates.clear();
    traceparent_fields.clear();
    tracestate_fields.clear();
  }
};

// A worker answering 503 (retried elsewhere) and one answering 200, both recording the trace
// context they got; the policy tries the refusing one first.
struct TraceWorkers {
  std::shared_ptr<TraceSeen> seen = std::make_shared<TraceSeen>();
  FakeWorker refusing{[seen = seen](http::Exchange& ex) -> awaitable<void> {
    seen->record(ex);
    const http::Header h[] = {{"content-type", "application/json"}};
    co_await ex.respond(503, h, "{}");
  }};
  FakeWorker good{[seen = seen](http::Exchange& ex) -> awaitable<void> {
    seen->record(ex);
    const http::Header h[] = {{"content-type", "application/json"}};
    co_await ex.respond(200, h, R"({"text":"ok"})");
  }};
};

// The dashboard's session cookie (the admin listener's: a browser sends a host's cookies to every
// port) never reaches a worker; the client's other cookies do, in order.
TEST(GatewayHeaders, DashboardSessionCookieIsNotForwarded) {
  auto cookies = std::make_shared<std::vector<std::string>>();
  auto mu = std::make_shared<std::mutex>();
  FakeWorker worker{[cookies, mu](http::Exchange& ex) -> awaitable<void> {
    std::string fields;  // each Cookie field as [value]: "" when none came
    ex.for_each_header([&](std::string_view name, std::string_view value) {
      if (http::iequals(name, "cookie")) fields += "[" + std::string(value) + "]";
    });
    {
      std::lock_guard lock(*mu);
      cookies->push_back(fields);
    }
    const http::Header h[] = {{"content-type", "application/json"}};
    co_await ex.respond(200, h, R"({"text":"ok"})");
  }};
  Harness h({worker.url()});
  HttpClient c(h.port());
  EXPECT_EQ(c.post("/generate", kBody,
                   {{"cookie", "a=1; kvgate_session_29001=secret; b=2; kvgate_session=x"}})
                .status,
            200);
  EXPECT_EQ(c.post("/generate", kBody, {{"cookie", "kvgate_session_29001=secret"}}).status, 200);
  EXPECT_EQ(c.post("/generate", kBody, {{"cookie", "theme=dark"}}).status, 200);
  // Several Cookie fields (a proxy from HTTP/2 may split them): each cleaned, none lost.
  EXPECT_EQ(c.post("/generate", kBody,
                   {{"cookie", "x=1; kvgate_session_1=s"}, {"cookie", "kvgate_session_2=t; y=2"}})
                .status,
            200);
  std::lock_guard lock(*mu);
  ASSERT_EQ(cookies->size(), 4u);
  EXPECT_EQ((*cookies)[0], "[a=1; b=2]");
  EXPECT_EQ((*cookies)[1], "") << "nothing left: no Cookie field";
  EXPECT_EQ((*cookies)[2], "[theme=dark]");
  EXPECT_EQ((*cookies)[3], "[x=1; y=2]");
}

constexpr std::string_view kClientTraceparent =
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

// kvgate exports no spans: a valid traceparent reaches the engine exactly as the client sent it
// (no parent-id of kvgate's, which no tracing backend would receive), on every attempt, with the
// client's tracestate (several fields combined, in order).
TEST(GatewayTrace, ValidTraceparentIsForwardedUnchangedOnEveryAttempt) {
  TraceWorkers w;
  Harness h({w.refusing.url(), w.good.url()});
  h.policy->preference = {1, 2};
  HttpClient c(h.port());
  const std::string parent(kClientTraceparent);
  auto r = c.post("/generate", kBody, {{"traceparent", parent}, {"tracestate", "vendor=abc"}});
  EXPECT_EQ(r.status, 200) << r.body;
  {
    std::lock_guard lock(w.seen->mu);
    ASSERT_EQ(w.seen->traceparents.size(), 2u) << "the 503, then the retry";
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_EQ(w.seen->traceparents[i], parent) << "attempt " << i;
      EXPECT_EQ(w.seen->traceparent_fields[i], 1);
      EXPECT_EQ(w.seen->tracestates[i], "vendor=abc");
      EXPECT_EQ(w.seen->tracestate_fields[i], 1);
    }
  }
  w.seen->clear();
  // Not sampled: the flags as they came too; two tracestate fields are one list.
  h.policy->preference = {2};
  const std::string unsampled = parent.substr(0, 53) + "00";
  r = c.post("/generate", kBody,
             {{"traceparent", unsampled}, {"tracestate", "a=1"}, {"tracestate", "b=2"}});
  EXPECT_EQ(r.status, 200) << r.body;
  std::lock_guard lock(w.seen->mu);
  ASSERT_EQ(w.seen->traceparents.size(), 1u);
  EXPECT_EQ(w.seen->traceparents[0], unsampled);
  EXPECT_EQ(w.seen->tracestates[0], "a=1,b=2");
  EXPECT_EQ(w.seen->tracestate_fields[0], 1);
}

// Without a valid traceparent (none, invalid, two fields) kvgate starts the trace: a new
// trace-id and parent-id, sampled, the same on a retry; the client's tracestate (of a trace not
// continued) is dropped.
TEST(GatewayTrace, StartedTraceDropsTracestateAndIsTheSameOnARetry) {
  TraceWorkers w;
  Harness h({w.refusing.url(), w.good.url()});
  h.policy->preference = {1, 2};
  HttpClient c(h.port());
  const std::string parent(kClientTraceparent);
  const std::vector<testing::Headers> requests = {
      {{"tracestate", "vendor=abc"}},
      {{"traceparent", "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01"},
       {"tracestate", "vendor=abc"}},
      {{"traceparent", parent}, {"traceparent", parent}, {"tracestate", "vendor=abc"}},
  };
  std::set<std::string> traces;
  for (const auto& headers : requests) {
    w.seen->clear();
    auto r = c.post("/generate", kBody, headers);
    EXPECT_EQ(r.status, 200) << r.body;
    std::lock_guard lock(w.seen->mu);
    ASSERT_EQ(w.seen->traceparents.size(), 2u);
    const std::string& tp = w.seen->traceparents[0];
    auto parsed = http::parse_traceparent(tp);
    ASSERT_TRUE(parsed) << tp;
    EXPECT_TRUE(tp.starts_with("00-"));
    EXPECT_NE(tp.substr(3, 32), "4bf92f3577b34da6a3ce929d0e0e4736");
    EXPECT_NE(tp.substr(36, 16), "00f067aa0ba902b7");
    EXPECT_EQ(parsed->flags, http::TraceContext::kSampled);
    EXPECT_EQ(w.seen->traceparents[1], tp) << "the retry carries the same traceparent";
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_EQ(w.seen->traceparent_fields[i], 1);
      EXPECT_EQ(w.seen->tracestate_fields[i], 0) << "tracestate dropped with the client's trace";
    }
    traces.insert(tp.substr(3, 32));
  }
  EXPECT_EQ(traces.size(), requests.size()) << "a new trace each";
}

// A tracestate past 512 characters is truncated as Trace Context says (whole members, the
// longest over 128 characters first, then from the end); one that fits goes on as it came.
TEST(GatewayTrace, LongTracestateIsTruncated) {
  TraceWorkers w;
  Harness h({w.good.url()});
  HttpClient c(h.port());
  const std::string member(100, 'v'), big(300, 'x');
  std::string state;
  for (char k = 'a'; k <= 'e'; ++k) state += std::string(1, k) + "=" + member + ",";
  state += "z=" + big;  // 5 x 102 + 5 commas + 302
  auto r = c.post("/generate", kBody,
                  {{"traceparent", std::string(kClientTraceparent)}, {"tracestate", state}});
  EXPECT_EQ(r.status, 200) << r.body;
  std::lock_guard lock(w.seen->mu);
  ASSERT_EQ(w.seen->tracestates.size(), 1u);
  std::string expected;
  for (char k = 'a'; k <= 'e'; ++k) {
    if (!expected.empty()) expected += ",";
    expected += std::string(1, k) + "=" + member;
  }
  EXPECT_EQ(w.seen->tracestates[0], expected.substr(0, 4 * 103 - 1)) << "z first, then e";
  EXPECT_EQ(w.seen->traceparents[0], kClientTraceparent);
}

// Reads what the log writes while it lives (the level set to debug).
class LogCapture {
 public:
  LogCapture() : file_(std::tmpfile()) {
    old_level_ = log::level();
    log::set_level(log::Level::kDebug);
    old_fd_ = log::set_fd_for_testing(::fileno(file_));
  }
  ~LogCapture() {
    log::set_fd_for_testing(old_fd_);
    log::set_level(old_level_);
    std::fclose(file_);
  }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;
  // The lines written so far.
  std::vector<std::string> lines() {
    log::flush();
    std::string text;
    char buf[4096];
    off_t at = 0;
    for (ssize_t n; (n = ::pread(::fileno(file_), buf, sizeof buf, at)) > 0; at += n) {
      text.append(buf, static_cast<size_t>(n));
    }
    std::vector<std::string> out;
    for (size_t pos = 0; pos < text.size();) {
      size_t nl = std::min(text.find('\n', pos), text.size());
      out.push_back(text.substr(pos, nl - pos));
      pos = nl + 1;
    }
    return out;
  }

 private:
  std::FILE* file_;
  int old_fd_;
  log::Level old_level_;
};

// Every line about a request carries its rid and trace_id: here the refusal of a request no
// healthy worker can take (no attempt, so no attempt warning), and a departed client's.
TEST(GatewayTrace, RequestLinesCarryRidAndTraceId) {
  FakeWorker hanging([](http::Exchange& ex) -> awaitable<void> {
    co_await pause(ex, 10s);
    co_await ex.respond(200, {}, "{}");
  });
  Harness h({hanging.url()});
  LogCapture log;
  const std::string parent(kClientTraceparent);
  const std::string trace = parent.substr(3, 32);
  auto line_with = [&](std::string_view msg, std::string_view rid) {
    for (const auto& l : log.lines()) {
      if (l.find(msg) != std::string::npos &&
          l.find("rid=" + std::string(rid)) != std::string::npos &&
          l.find("trace_id=" + trace) != std::string::npos) {
        return true;
      }
    }
    return false;
  };
  h.worker(0).set_healthy(false);
  HttpClient c(h.port());
  auto r = c.post("/generate", kBody, {{"traceparent", parent}, {"x-request-id", "no-worker-1"}});
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_TRUE(line_with("msg=\"request refused\"", "no-worker-1"));
  // A client that leaves while its request runs.
  h.worker(0).set_healthy(true);
  {
    HttpClient gone(h.port());
    gone.set_timeout(200ms);
    r = gone.post("/generate", kBody, {{"traceparent", parent}, {"x-request-id", "gone-1"}});
    EXPECT_EQ(r.status, 0);
  }
  EXPECT_TRUE(wait_until([&] { return line_with("msg=\"client went away\"", "gone-1"); }));
}

// The request signals of a streamed answer: headers, first byte, first token (not the role-only
// chunk), one inter-token gap per later output event, end to end, the tokens its usage reported.
TEST(GatewaySignals, AStreamObservesItsTimesAndTokens) {
  // The worker waits this long between the role-only chunk and the first content: the time to
  // first token includes it (it is measured from the attempt's sending, which came before the
  // wait began); had the role-only chunk counted, its sum would be below it.
  static constexpr auto kBeforeFirstToken = std::chrono::milliseconds(60);
  FakeWorker streaming([](http::Exchange& ex) -> awaitable<void> {
    const http::Header h[] = {{"content-type", "text/event-stream"}};
    co_await ex.begin_body(200, h, std::nullopt);
    co_await ex.write_body(
        "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n");
    co_await ex.flush();
    co_await pause(ex, kBeforeFirstToken);
    co_await ex.write_body("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n");
    co_await pause(ex, std::chrono::milliseconds(5));
    co_await ex.write_body(
        "data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n"
        "data: {\"choices\":[{\"delta\":{\"content\":\"c\"}}]}\n\n");
    co_await ex.write_body(
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":3,"
        "\"prompt_tokens_details\":{\"cached_tokens\":8}}}\n\ndata: [DONE]\n\n");
    co_await ex.end_body();
  });
  Harness h({streaming.url()});
  h.policy->preference = {1};
  HttpClient c(h.port());
  auto r = c.post("/v1/chat/completions",
                  R"({"messages":[{"role":"user","content":"hi"}],"stream":true})");
  ASSERT_EQ(r.status, 200);
  const std::string labels = "{rule=\"default\",worker=\"" + streaming.url() + "\",rank=\"\"}";
  ASSERT_TRUE(testing::wait_until(
      [&] { return h.metric("kvgate_e2e_request_duration_seconds_count" + labels) == 1; }));
  EXPECT_EQ(h.metric("kvgate_time_to_response_headers_seconds_count" + labels), 1);
  EXPECT_EQ(h.metric("kvgate_time_to_first_byte_seconds_count" + labels), 1);
  EXPECT_EQ(h.metric("kvgate_time_to_first_token_seconds_count" + labels), 1);
  EXPECT_GE(h.metric("kvgate_time_to_first_token_seconds_sum" + labels),
            std::chrono::duration<double>(kBeforeFirstToken).count());
  // Three output events: two gaps (the third came in the same read as the second, or after it).
  EXPECT_EQ(h.metric("kvgate_inter_token_latency_seconds_count" + labels), 2);
  EXPECT_EQ(h.metric("kvgate_prompt_tokens_total" + labels), 11);
  EXPECT_EQ(h.metric("kvgate_cached_tokens_total" + labels), 8);
  EXPECT_EQ(h.metric("kvgate_generated_tokens_total" + labels), 3);
  const std::string conn = "{rule=\"default\",worker=\"" + streaming.url() + "\"}";
  EXPECT_EQ(h.metric("kvgate_upstream_connect_seconds_count" + conn), 1);
  // A second request reuses the pooled connection: no connect observed.
  r = c.post("/v1/chat/completions",
             R"({"messages":[{"role":"user","content":"hi"}],"stream":true})");
  ASSERT_EQ(r.status, 200);
  ASSERT_TRUE(testing::wait_until(
      [&] { return h.metric("kvgate_e2e_request_duration_seconds_count" + labels) == 2; }));
  EXPECT_EQ(h.metric("kvgate_upstream_connect_seconds_count" + conn), 1);
  EXPECT_EQ(h.metric("kvgate_time_to_first_token_seconds_count" + labels), 2);
}

}  // namespace
}  // namespace kvgate

namespace kvgate {
namespace {

// A worker's times start when the attempt is sent to it, not when the request arrived: here the
// first worker takes kSlow to refuse, and the second worker's headers, first byte, first token
// and end to end leave that time out (each plus kSlow is within the request's duration, which
// holds both attempts; measured from the request's arrival, each alone would exceed kSlow).
TEST(GatewaySignals, AWorkersTimesStartWhenItsAttemptIsSent) {
  static constexpr auto kSlow = std::chrono::milliseconds(200);
  FakeWorker slow_refusal([](http::Exchange& ex) -> awaitable<void> {
    co_await pause(ex, kSlow);
    const http::Header h[] = {{"content-type", "application/json"}};
    co_await ex.respond(503, h, R"({"error":"queue full"})");
  });
  FakeWorker streaming(
      sse("data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n"
          "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n"
          "data: [DONE]\n\n"));
  Harness h({slow_refusal.url(), streaming.url()});
  h.policy->preference = {1, 2};
  HttpClient c(h.port());
  auto r = c.post("/v1/chat/completions",
                  R"({"messages":[{"role":"user","content":"hi"}],"stream":true})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(slow_refusal.requests.load(), 1);
  const std::string labels = "{rule=\"default\",worker=\"" + streaming.url() + "\",rank=\"\"}";
  const std::string duration =
      "kvgate_request_duration_seconds_sum{route=\"/v1/chat/completions\"}";
  ASSERT_TRUE(testing::wait_until([&] {
    return h.metric("kvgate_request_duration_seconds_count{route=\"/v1/chat/completions\"}") == 1;
  }));
  const double request = h.metric(duration);
  const double slow = std::chrono::duration<double>(kSlow).count();
  ASSERT_GE(request, slow);
  for (const char* family :
       {"kvgate_time_to_response_headers_seconds", "kvgate_time_to_first_byte_seconds",
        "kvgate_time_to_first_token_seconds", "kvgate_e2e_request_duration_seconds"}) {
    const std::string series = std::string(family) + "_sum" + labels;
    EXPECT_EQ(h.metric(std::string(family) + "_count" + labels), 1) << family;
    const double worker = h.metric(series);
    EXPECT_GE(worker, 0) << family;
    EXPECT_LE(worker + slow, request + 1e-6) << family << ": measured from the request's arrival";
  }
  // The client-level duration is still the request's, from its arrival.
  EXPECT_EQ(h.metric("kvgate_request_duration_seconds_count{route=\"/v1/chat/completions\"}"), 1);
}

// Output events are observed as they arrive: a stream that fails after two tokens keeps their time
// to first token and gap (the worker produced them then), but has no end to end and no tokens
// (it did not complete).
TEST(GatewaySignals, AStreamThatFailsMidResponseKeepsItsTokenTimes) {
  FakeWorker dying([](http::Exchange& ex) -> awaitable<void> {
    const http::Header hdr[] = {{"content-type", "text/event-stream"}};
    co_await ex.begin_body(200, hdr, std::nullopt);
    co_await ex.write_body(
        "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n"
        "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n");
    co_await ex.flush();
    co_await pause(ex, std::chrono::milliseconds(5));
    co_await ex.write_body(
        "data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}],\"usage\":{\"prompt_tokens\":4,"
        "\"completion_tokens\":2}}\n\n");
    co_await ex.flush();
    ex.abort();
  });
  Harness h({dying.url()});
  HttpClient c(h.port());
  auto r = c.post("/v1/chat/completions",
                  R"({"messages":[{"role":"user","content":"hi"}],"stream":true})");
  EXPECT_EQ(r.status, 200);  // the stream had begun: it ends with an error event
  EXPECT_NE(r.body.find("upstream_failed"), std::string::npos) << r.body;
  ASSERT_TRUE(testing::wait_until([&] {
    return h.metric("kvgate_request_duration_seconds_count{route=\"/v1/chat/completions\"}") == 1;
  }));
  const std::string labels = "{rule=\"default\",worker=\"" + dying.url() + "\",rank=\"\"}";
  EXPECT_EQ(h.metric("kvgate_time_to_response_headers_seconds_count" + labels), 1);
  EXPECT_EQ(h.metric("kvgate_time_to_first_token_seconds_count" + labels), 1);
  EXPECT_EQ(h.metric("kvgate_inter_token_latency_seconds_count" + labels), 1);
  EXPECT_EQ(h.metric("kvgate_e2e_request_duration_seconds_count" + labels), 0);
  EXPECT_EQ(h.metric("kvgate_generated_tokens_total" + labels), 0);
}

// --metrics-compat smg: a request routed to the worker holding its response is a selection of
// response_owner's (not of the rule's policy, which was not asked), and smg_http_requests_total
// has each request's own method (GET and DELETE of /v1/responses/{id}, not POST).
TEST(GatewaySmg, OwnerRoutedSelectionsAndTheRequestsOwnMethod) {
  FakeWorker holder([](http::Exchange& ex) -> awaitable<void> {
    const http::Header h[] = {{"content-type", "application/json"}};
    std::string body = R"({"text":"ok"})";  // /generate
    if (ex.path() == "/v1/responses/resp_held") {
      body = ex.method() == "DELETE" ? R"({"id":"resp_held","object":"response","deleted":true})"
                                     : R"({"id":"resp_held","object":"response"})";
    }
    co_await ex.respond(200, h, body);
  });
  Harness h({holder.url()}, [](GatewayConfig& cfg) { cfg.metrics_compat = "smg"; });
  HttpClient c(h.port());
  auto r = c.get("/v1/responses/resp_held");  // looked for, found on the worker, routed to it
  ASSERT_EQ(r.status, 200) << r.body;
  r = c.request("DELETE", "/v1/responses/resp_held", "");  // its owner remembered
  ASSERT_EQ(r.status, 200) << r.body;
  r = c.post("/generate", kBody);  // the rule's policy chooses
  ASSERT_EQ(r.status, 200) << r.body;
  const std::string selection =
      "smg_worker_selection_total{worker_type=\"regular\",connection_mode=\"http\",model=\"\",";
  ASSERT_TRUE(testing::wait_until([&] {
    return h.metric("smg_http_requests_total{method=\"POST\",path=\"/generate\"}") == 1;
  }));
  EXPECT_EQ(h.metric(selection + "policy=\"response_owner\"}"), 2);
  EXPECT_EQ(h.metric(selection + "policy=\"recording\"}"), 1);
  EXPECT_EQ(h.metric("smg_http_requests_total{method=\"GET\",path=\"/v1/responses/{id}\"}"), 1);
  EXPECT_EQ(h.metric("smg_http_requests_total{method=\"DELETE\",path=\"/v1/responses/{id}\"}"), 1);
  EXPECT_EQ(h.metric("smg_http_requests_total{method=\"POST\",path=\"/v1/responses/{id}\"}"), -1);
}

}  // namespace
}  // namespace kvgate
