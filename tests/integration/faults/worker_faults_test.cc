// Integration (faults): workers that die, stall, hang or abort, under load, through the real
// kvgate binary. The invariant of every test: each client request gets exactly one complete
// answer or one clear error; none hangs; none runs twice; and what kvgate holds (descriptors,
// memory) comes back after the fault.
#include <gtest/gtest.h>

#include <future>
#include <iostream>
#include <map>
#include <thread>

#include "support/cluster.h"

namespace kvgate::testing {
namespace {

using namespace std::chrono_literals;

// A sample of a sim's Prometheus text (summed over label sets), or -1.
double sim_metric(const Sim& sim, const std::string& name) {
  HttpClient h(sim.port);
  h.set_timeout(2s);
  std::string m = h.get("/metrics").body;
  double total = 0;
  bool found = false;
  size_t pos = 0;
  while ((pos = m.find("\n" + name, pos)) != std::string::npos) {
    pos += name.size() + 1;
    if (m[pos] != '{' && m[pos] != ' ') continue;
    size_t sp = m.find(' ', m.find('}', pos) == std::string::npos ? pos : m.find('}', pos));
    total += std::atof(m.c_str() + sp + 1);
    found = true;
  }
  return found ? total : -1;
}

// How a streamed request ended, as its client saw it.
struct Outcome {
  int status = 0;
  bool complete = false;     // [DONE] and no error event
  bool clear_error = false;  // an error status with a JSON error, or an error event then [DONE]
  std::string worker;
  std::string body;
};

Outcome stream_generate(int port, int max_new_tokens, std::string rid) {
  HttpClient c(port);
  c.set_timeout(30s);
  auto r = c.post("/generate", R"({"text":"fault test )" + rid + R"(","rid":")" + rid +
                                   R"(","stream":true,"sampling_params":{"max_new_tokens":)" +
                                   std::to_string(max_new_tokens) + "}}");
  Outcome o;
  o.status = r.status;
  o.worker = r.header("x-kvgate-worker");
  o.body = r.body;
  if (r.status == 200) {
    auto events = sse_data(r.body);
    bool done = !events.empty() && events.back() == "[DONE]";
    bool error = false;
    for (const auto& e : events) error = error || e.find("\"error\"") != std::string::npos;
    o.complete = done && !error && !r.truncated;
    o.clear_error = done && error && !r.truncated;
  } else if (r.status >= 500) {
    o.clear_error = r.body.find("\"error\"") != std::string::npos;
  }
  return o;
}

// Waits until kvgate holds no more descriptors than `before` (pooled worker connections are
// reaped a few seconds after their last use).
void expect_descriptors_back(Cluster& c, int before) {
  EXPECT_TRUE(wait_until([&] { return c.gateway().fd_count() <= before; }, 15s))
      << "kvgate holds " << c.gateway().fd_count() << " descriptors, " << before << " before";
}

TEST(WorkerFaults, WorkerKilledUnderStreamingLoad) {
  Cluster c(3, {"--ttft-ms", "5", "--tpot-ms", "50", "--enable-metrics"},
            {"--policy", "round_robin", "--debug-headers", "--health-check-interval-secs", "60",
             "--cb-failure-threshold", "2", "--cb-success-threshold", "1",
             "--cb-timeout-duration-secs", "1", "--retry-initial-backoff-ms", "1"});
  {
    HttpClient warm(c.port());
    for (int i = 0; i < 3; ++i) {
      auto r = warm.post("/generate", R"({"text":"warm","sampling_params":{"max_new_tokens":1}})");
      ASSERT_EQ(r.status, 200);
    }
  }
  int fds_before = c.gateway().fd_count();
  long rss_before = c.gateway().rss_kib();
  std::string killed = c.sim(0).url();

  // Twelve long streams, spread over the three workers; then the first worker dies mid-stream.
  constexpr int kLoad = 12;
  std::vector<std::future<Outcome>> first;
  for (int i = 0; i < kLoad; ++i) {
    first.push_back(std::async(std::launch::async, [&, i] {
      return stream_generate(c.port(), 60, "a" + std::to_string(i));
    }));
  }
  auto running = [&](size_t s) { return sim_metric(c.sim(s), "sglang:num_running_reqs"); };
  ASSERT_TRUE(wait_until([&] { return running(0) + running(1) + running(2) == kLoad; }));
  int on_killed = static_cast<int>(running(0));
  ASSERT_GT(on_killed, 0);
  c.sim(0).kill();

  // New requests right after: those sent to the dead worker fail to connect and are retried.
  constexpr int kAfter = 6;
  std::vector<std::future<Outcome>> second;
  for (int i = 0; i < kAfter; ++i) {
    second.push_back(std::async(std::launch::async, [&, i] {
      return stream_generate(c.port(), 5, "b" + std::to_string(i));
    }));
  }
  int complete = 0, errors = 0;
  for (auto* batch : {&first, &second}) {
    for (auto& f : *batch) {
      Outcome o = f.get();
      ASSERT_NE(o.status, 0) << "a client got no answer at all (hung or cut)";
      EXPECT_TRUE(o.complete || o.clear_error) << o.status << " " << o.body.substr(0, 400);
      EXPECT_EQ(o.body.find(killed), std::string::npos) << "a worker URL reached a client";
      if (o.complete) ++complete;
      if (o.clear_error) {
        ++errors;
        EXPECT_EQ(o.worker, killed);  // only the dead worker's streams end in an error
      }
    }
  }
  EXPECT_EQ(errors, on_killed);
  EXPECT_EQ(complete, kLoad - on_killed + kAfter);
  // Nothing ran twice: the survivors served exactly the requests that were not on the dead one.
  double served = sim_metric(c.sim(1), "sglang:num_requests_total") +
                  sim_metric(c.sim(2), "sglang:num_requests_total");
  EXPECT_EQ(served, 3 - 1 + (kLoad - on_killed) + kAfter);  // warm-up: two of three survived
  EXPECT_TRUE(wait_until(
      [&] { return c.metric("kvgate_worker_cb_state{worker=\"" + killed + "\"}") == 1; }));

  // It comes back: after the open timeout a trial request closes the breaker and traffic resumes.
  c.sim(0).start();
  HttpClient client(c.port());
  EXPECT_TRUE(wait_until(
      [&] {
        auto r =
            client.post("/generate", R"({"text":"back?","sampling_params":{"max_new_tokens":1}})");
        return r.status == 200 && r.header("x-kvgate-worker") == killed;
      },
      15s));
  client.close();
  expect_descriptors_back(c, fds_before);
  long rss_after = c.gateway().rss_kib();
  std::cout << "kvgate RSS " << rss_before << " -> " << rss_after << " KiB\n";
  EXPECT_LT(rss_after, rss_before + 32 * 1024);
}

TEST(WorkerFaults, LongSilentPrefillIsNotCutByConnectionTimeouts) {
  // The worker sends its stream headers at once and its first token 2.5 s later (a long prefill
  // behind a queue); the client-side keep-alive and write timeouts are 1 s. Neither may cut it.
  Cluster c(1, {"--ttft-ms", "2500", "--tpot-ms", "1"},
            {"--policy", "round_robin", "--client-keepalive-timeout-secs", "1",
             "--client-write-timeout-secs", "1", "--health-check-interval-secs", "60"});
  auto generate = std::async(std::launch::async, [&] { return stream_generate(c.port(), 4, "g"); });
  HttpClient chat(c.port());
  chat.set_timeout(20s);
  auto r = chat.post("/v1/chat/completions",
                     R"({"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":4,)"
                     R"("stream":true})");
  EXPECT_EQ(r.status, 200);
  EXPECT_FALSE(r.truncated);
  auto events = sse_data(r.body);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back(), "[DONE]");
  Outcome g = generate.get();
  EXPECT_TRUE(g.complete) << g.status << " " << g.body;
  EXPECT_EQ(c.metric("kvgate_client_disconnects_total"), -1);  // none (never created)
}

TEST(WorkerFaults, HangingWorkerTimesOutAndLeavesNothingBehind) {
  Cluster c(1, {"--hang-rate", "1"},
            {"--policy", "round_robin", "--request-timeout-secs", "1",
             "--health-check-interval-secs", "60"});
  int fds_before = c.gateway().fd_count();
  std::vector<std::future<Response>> calls;
  for (int i = 0; i < 8; ++i) {
    calls.push_back(std::async(std::launch::async, [&, i] {
      HttpClient h(c.port());
      h.set_timeout(20s);
      return h.post("/generate",
                    R"({"text":"hang","stream":)" + std::string(i % 2 ? "true" : "false") + "}");
    }));
  }
  for (auto& f : calls) {
    Response r = f.get();
    EXPECT_EQ(r.status, 504) << r.body;
    EXPECT_NE(r.body.find("upstream_timeout"), std::string::npos);
  }
  expect_descriptors_back(c, fds_before);
}

TEST(WorkerFaults, AbortInTheFirstEventIsRetriedAndFedToTheBreaker) {
  // The first worker admits every request and aborts it in the first event (as SGLang does when
  // its queue is full); clients never see those aborts: the second worker serves them.
  Cluster c(2, {"--ttft-ms", "1", "--tpot-ms", "1"},
            {"--policy", "round_robin", "--debug-headers", "--health-check-interval-secs", "60",
             "--cb-failure-threshold", "3", "--retry-initial-backoff-ms", "1"});
  HttpClient sim0(c.sim(0).port);
  ASSERT_EQ(sim0.post("/sim/faults", R"({"abort_first_event_rate":1.0})").status, 200);
  std::string bad = c.sim(0).url();
  for (int i = 0; i < 6; ++i) {
    Outcome o = stream_generate(c.port(), 3, "abort" + std::to_string(i));
    EXPECT_TRUE(o.complete) << o.body;
    EXPECT_EQ(o.worker, c.sim(1).url());
  }
  HttpClient client(c.port());
  auto whole = client.post("/generate", R"({"text":"not streamed"})");
  EXPECT_EQ(whole.status, 200) << whole.body;
  EXPECT_GE(c.metric("kvgate_upstream_stream_aborts_total{worker=\"" + bad + "\"}"), 3);
  EXPECT_EQ(c.metric("kvgate_worker_cb_state{worker=\"" + bad + "\"}"), 1);
}

TEST(WorkerFaults, ClientsLeavingTheQueueNeverReachAWorker) {
  Cluster c(1, {"--ttft-ms", "1500", "--tpot-ms", "1", "--enable-metrics"},
            {"--policy", "round_robin", "--max-concurrent-requests", "1", "--queue-size", "10",
             "--health-check-interval-secs", "60"});
  auto first = std::async(std::launch::async, [&] {
    HttpClient h(c.port());
    return h.post("/generate", R"({"text":"first"})");
  });
  ASSERT_TRUE(wait_until([&] {
    return sim_metric(c.sim(0), "sglang:num_running_reqs") +
               sim_metric(c.sim(0), "sglang:num_queue_reqs") ==
           1;
  }));
  for (int i = 0; i < 3; ++i) {
    HttpClient gone(c.port());
    gone.set_timeout(100ms);
    gone.post("/generate", R"({"text":"impatient"})");  // gives up while queued
  }
  EXPECT_TRUE(wait_until([&] { return c.metric("kvgate_admission_queue_depth") == 0; }));
  EXPECT_EQ(first.get().status, 200);
  EXPECT_TRUE(wait_until([&] { return c.metric("kvgate_client_disconnects_total") == 3; }));
  EXPECT_EQ(sim_metric(c.sim(0), "sglang:num_requests_total"), 1);
}

}  // namespace
}  // namespace kvgate::testing
