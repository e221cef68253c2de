// Tests for workers/health: parsing what servers report on /get_load and /v1/models, and the load
// plane's answer to failing polls.
#include "workers/health.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "gateway/knobs.h"
#include "http/server.h"
#include "support/process.h"

namespace kvgate {
namespace {

TEST(LoadReport, SglangArrayPerRank) {
  EXPECT_EQ(parse_load_report(R"([{"dp_rank":0,"num_reqs":3,"num_waiting_reqs":2,"num_tokens":100},
                                  {"dp_rank":1,"num_reqs":1,"num_waiting_reqs":0,"num_tokens":5}])"),
            6);
}

TEST(LoadReport, V1LoadsObject) {
  EXPECT_EQ(
      parse_load_report(
          R"({"timestamp":1,"loads":[{"dp_rank":0,"num_running_reqs":4,"num_waiting_reqs":1}]})"),
      5);
}

TEST(LoadReport, PlainLoadAndGarbage) {
  EXPECT_EQ(parse_load_report(R"({"load": 7})"), 7);
  EXPECT_EQ(parse_load_report("[]"), 0);
  EXPECT_FALSE(parse_load_report("not json"));
  EXPECT_FALSE(parse_load_report(R"([{"x":1}])"));
}

TEST(LoadReport, HostileNumbersAreClampedNotOverflowed) {
  // Figures past int64, out of range doubles and negatives: a bounded, non-negative load.
  auto huge = parse_load_report(R"({"num_reqs":9223372036854775807,"num_waiting_reqs":1})");
  ASSERT_TRUE(huge);
  EXPECT_GT(*huge, 1'000'000);
  EXPECT_EQ(parse_load_report(R"([{"num_reqs":1e300},{"num_reqs":18446744073709551615}])"), *huge);
  EXPECT_EQ(parse_load_report(R"([{"num_reqs":-5,"num_waiting_reqs":2},{"load":-1e300}])"), 2);
}

TEST(ModelList, DataEntries) {
  auto m = parse_model_list(R"({"object":"list","data":[{"id":"a","object":"model"},{"id":"b"}]})");
  ASSERT_TRUE(m);
  ASSERT_EQ(m->size(), 2u);
  EXPECT_EQ((*m)[0], R"({"id":"a","object":"model"})");
  EXPECT_FALSE(parse_model_list("{}"));
}

}  // namespace
}  // namespace kvgate

// The load plane against workers whose /get_load starts failing: a failed poll must not make a
// worker look idle (the review found it reset to 0). It keeps its last load, then, after three
// failures in a row, counts as loaded as the busiest worker.
namespace kvgate {
namespace {

class LoadServer {
 public:
  explicit LoadServer(std::atomic<int>& load) : load_(load) {
    http::ServerConfig cfg;
    cfg.host = "127.0.0.1";
    server_ = std::make_unique<http::Server>(
        std::vector<asio::io_context*>{&ctx_}, cfg, [this](http::Exchange& ex) -> awaitable<void> {
          if (ex.path() == "/get_load" && load_.load() < 0) {
            co_await ex.respond(500, {}, "overloaded");
            co_return;
          }
          std::string body = ex.path() == "/get_load"
                                 ? R"([{"dp_rank":0,"num_reqs":)" + std::to_string(load_.load()) +
                                       R"(,"num_waiting_reqs":0}])"
                                 : "{}";
          co_await ex.respond(200, {}, body);
        });
    server_->start();
    thread_ = std::thread([this] {
      auto guard = asio::make_work_guard(ctx_);
      ctx_.run();
    });
  }
  ~LoadServer() {
    server_->stop();
    ctx_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(server_->port()); }

 private:
  std::atomic<int>& load_;
  asio::io_context ctx_{1};
  std::unique_ptr<http::Server> server_;
  std::thread thread_;
};

TEST(LoadPlane, AFailingPollNeverMakesAWorkerLookIdle) {
  std::atomic<int> busy{40}, flaky{7};
  LoadServer a(busy), b(flaky);
  WorkerRegistry registry;
  auto set = std::make_shared<WorkerSet>();
  for (const auto& u : {a.url(), b.url()}) {
    http::Target t;
    ASSERT_EQ(http::parse_url(u, t), "");
    http::resolve(t);
    auto w = std::make_shared<Worker>(set->workers.size() + 1, t, breaker_config(GatewayConfig{}));
    w->set_healthy(true);
    set->workers.push_back(w);
  }
  registry.publish(set);
  Worker& wa = *set->workers[0];
  Worker& wb = *set->workers[1];
  asio::io_context control(1);
  HealthConfig hc = health_config(GatewayConfig{});
  hc.interval = std::chrono::hours(1);
  hc.poll_load = true;
  hc.load_interval = std::chrono::milliseconds(50);
  hc.timeout = std::chrono::milliseconds(500);
  HealthPlane plane(control, registry, hc);
  plane.start();
  std::thread runner([&] {
    auto guard = asio::make_work_guard(control);
    control.run();
  });
  EXPECT_TRUE(
      testing::wait_until([&] { return wa.reported_load() == 40 && wb.reported_load() == 7; }));
  flaky = -1;  // its /get_load now fails
  // It keeps its last load for the first failures, then counts as the busiest worker: never 0.
  EXPECT_TRUE(testing::wait_until([&] { return wb.reported_load() == 40; }));
  plane.stop();
  control.stop();
  runner.join();
}

}  // namespace
}  // namespace kvgate

namespace kvgate {
namespace {

TEST(ServerInfo, KvEventsDescriptorIsRead) {
  auto info =
      parse_kv_events_info(R"({"page_size":16,"kv_events":{"publisher":"zmq","endpoint_host":"*",)"
                           R"("endpoint_port_base":5557,"topic":"kv","block_size":16,"dp_size":2,)"
                           R"("replay_endpoint_port_base":5600}})");
  ASSERT_TRUE(info);
  EXPECT_EQ(info->port_base, 5557);
  EXPECT_EQ(info->replay_port_base, 5600);
  EXPECT_EQ(info->topic, "kv");
  EXPECT_EQ(info->block_size, 16);
  EXPECT_EQ(info->dp_size, 2);
  EXPECT_EQ(info->host, "*");
  // Off, absent, or not something kvgate can use: nothing.
  EXPECT_FALSE(parse_kv_events_info(R"({"kv_events":null})"));
  EXPECT_FALSE(parse_kv_events_info(R"({"page_size":16})"));
  EXPECT_FALSE(parse_kv_events_info(R"({"kv_events":{"publisher":"null"}})"));
  EXPECT_FALSE(
      parse_kv_events_info(R"({"kv_events":{"publisher":"zmq","endpoint_port_base":70000}})"));
  EXPECT_FALSE(parse_kv_events_info("not json"));
}

}  // namespace
}  // namespace kvgate
