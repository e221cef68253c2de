// Integration tests of rules changed live: the admin API (auth, rule round trips, workers,
// fan-out routes, server info), two models in two pools, a live update and a delete-and-recreate
// under load with no failed request, a rule's history and rollback, and a config file reload that
// fails and leaves the old configuration serving.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <thread>

#include "support/cluster.h"
#include "support/http_client.h"
#include "support/process.h"
#include "support/temp_dir.h"

namespace kvgate::testing {
namespace {

using namespace std::chrono_literals;

const char kKey[] = "s3cret-admin-key";

// AdminApi::kMaxSessions (the test does not link the admin API's header).
constexpr size_t kMaxSessions = 64;

struct Admin {
  int port;
  std::string key = kKey;
  Response call(const std::string& method, const std::string& path, const std::string& body = "") {
    HttpClient c(port);
    c.set_timeout(10s);
    Headers h;
    if (!key.empty()) h.push_back({"authorization", "Bearer " + key});
    h.push_back({"content-type", "application/json"});
    return c.request(method, path, body, h);
  }
};

// A cluster whose kvgate has an admin listener with a key, and debug headers.
struct AdminCluster {
  explicit AdminCluster(int sims, std::vector<std::string> extra = {})
      : key_file(dir.write("admin.key", std::string(kKey) + "\n")),
        admin_port(free_port()),
        cluster(sims, {}, with(extra)) {}
  std::vector<std::string> with(std::vector<std::string> extra) {
    std::vector<std::string> a = {"--admin-port",         std::to_string(admin_port),
                                  "--admin-api-key-file", key_file,
                                  "--debug-headers",      "--policy",
                                  "round_robin"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  Admin admin() const { return Admin{admin_port}; }
  TempDir dir;
  std::string key_file;
  int admin_port;
  Cluster cluster;
};

std::string rule_json(const std::string& name, const std::string& model,
                      const std::vector<std::string>& urls,
                      const std::string& sel = "round_robin") {
  std::string eps;
  for (const auto& u : urls)
    eps += (eps.empty() ? "" : ",") + std::string(R"({"url":")") + u + "\"}";
  return R"({"name":")" + name + R"(","mode":4,"sel":")" + sel + R"(","models":[")" + model +
         R"("],"endpoints":[)" + eps + "]}";
}

std::string gen_body(const std::string& model) {
  return R"({"model":")" + model +
         R"(","text":"hello there","sampling_params":{"max_new_tokens":2}})";
}

TEST(Admin, KeyMissingWrongAndRight) {
  AdminCluster a(1);
  Admin admin = a.admin();
  admin.key = "";
  EXPECT_EQ(admin.call("GET", "/v1/rules").status, 401);
  admin.key = "wrong";
  auto r = admin.call("GET", "/v1/rules");
  EXPECT_EQ(r.status, 401);
  EXPECT_NE(r.body.find("invalid_admin_key"), std::string::npos) << r.body;
  admin.key = kKey;
  r = admin.call("GET", "/v1/rules");
  EXPECT_EQ(r.status, 200);
  EXPECT_NE(r.body.find(R"("name":"default")"), std::string::npos) << r.body;
  // The inference listener does not answer admin routes.
  HttpClient c(a.cluster.port());
  EXPECT_EQ(c.get("/v1/rules").status, 404);
}

TEST(Admin, RepeatedAuthFailuresAreRefusedForAWhile) {
  AdminCluster a(1);
  Admin admin = a.admin();
  admin.key = "wrong";
  int refused = 0;
  for (int i = 0; i < 12; ++i) {
    int s = admin.call("GET", "/v1/rules").status;
    if (s == 429) ++refused;
  }
  EXPECT_GE(refused, 2);
  auto r = admin.call("GET", "/v1/rules");
  EXPECT_EQ(r.status, 429);  // a wrong key from a refused address
  EXPECT_FALSE(r.header("retry-after").empty());
  admin.key = kKey;  // the operator at the same address is not locked out
  EXPECT_EQ(admin.call("GET", "/v1/rules").status, 200);
}

TEST(Admin, BrowsersAndRebindingAreRefused) {
  Cluster sims(1, {}, {}, false);
  int admin_port = free_port();
  // No key: the listener answers only requests addressed to a loopback address, and no browser.
  Process gw("kvgate", {"--worker-urls", sims.sim(0).url(), "--host", "127.0.0.1", "--port",
                        std::to_string(free_port()), "--prometheus-port",
                        std::to_string(free_port()), "--admin-port", std::to_string(admin_port)});
  ASSERT_TRUE(wait_until(
      [&] {
        HttpClient c(admin_port);
        return c.get("/v1/rules").status == 200;
      },
      20s))
      << gw.log();
  std::string rule = R"({"url":"http://127.0.0.1:1"})";
  HttpClient c(admin_port);
  auto r = c.request("POST", "/workers", rule,
                     {{"origin", "http://evil.example"}, {"content-type", "application/json"}});
  EXPECT_EQ(r.status, 403) << r.body;
  r = c.request("POST", "/workers", rule, {{"content-type", "text/plain"}});
  EXPECT_EQ(r.status, 415) << r.body;
  HttpClient raw(admin_port);
  std::string answer = raw.raw(
      "GET /v1/rules HTTP/1.1\r\nHost: rebound.evil.example:29001\r\nConnection: close\r\n\r\n",
      5s);
  EXPECT_TRUE(answer.starts_with("HTTP/1.1 403")) << answer;
  r = c.request("POST", "/v1/rules", std::string(100000, '[') + std::string(100000, ']'),
                {{"content-type", "application/json"}});
  EXPECT_EQ(r.status, 400) << r.body;  // and the control thread is still there:
  EXPECT_EQ(c.get("/v1/rules").status, 200);
  EXPECT_EQ(gw.stop(10s), 0) << gw.log();
}

TEST(Admin, WithoutAKeyTheAdminListenerStaysOnLoopback) {
  auto r = run("kvgate", {"--worker-urls", "http://127.0.0.1:1", "--admin-host", "0.0.0.0",
                          "--port", "0", "--prometheus-port", "0", "--admin-port", "0"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("--admin-host 0.0.0.0 is not a loopback address"), std::string::npos)
      << r.output;
}

TEST(Admin, RuleCreateGetUpdateDeleteAndValidation) {
  AdminCluster a(2);
  Admin admin = a.admin();
  std::string url1 = a.cluster.sim(1).url();
  auto r = admin.call("POST", "/v1/rules", rule_json("qwen", "qwen3", {url1}));
  ASSERT_EQ(r.status, 201) << r.body;
  EXPECT_NE(r.body.find(R"("kvBlockSize":16)"), std::string::npos) << r.body;  // defaults filled
  EXPECT_EQ(admin.call("POST", "/v1/rules", rule_json("qwen", "qwen3", {url1})).status, 409);
  r = admin.call("GET", "/v1/rules/qwen");
  EXPECT_EQ(r.status, 200);
  EXPECT_NE(r.body.find(R"("models":["qwen3"])"), std::string::npos) << r.body;

  // Invalid: every error, each with field, value and message.
  r = admin.call("POST", "/v1/rules",
                 R"({"name":"bad","mode":4,"kvDpRankCount":9,"kvZmqPort":70000,"sel":"nope",)"
                 R"("endpoints":[{"url":"http://127.0.0.1:1"},{"url":"http://127.0.0.1:1"}]})");
  ASSERT_EQ(r.status, 400) << r.body;
  for (const char* field : {"kvDpRankCount", "kvZmqPort", "sel", "endpoints"}) {
    EXPECT_NE(r.body.find(std::string(R"("field":")") + field), std::string::npos)
        << field << ": " << r.body;
  }
  EXPECT_EQ(admin.call("GET", "/v1/rules/bad").status, 404);  // nothing was created
  r = admin.call("POST", "/v1/rules/validate", rule_json("v", "m", {url1}));
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(admin.call("GET", "/v1/rules/v").status, 404);  // a dry run creates nothing

  // Update live; the engine cannot change.
  r = admin.call("PUT", "/v1/rules/qwen", rule_json("qwen", "qwen3", {url1}, "random"));
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_NE(r.body.find(R"("sel":"random")"), std::string::npos) << r.body;
  std::string sglang = rule_json("qwen", "qwen3", {url1});
  sglang.insert(1, R"("kvEngineType":"sglang",)");
  r = admin.call("PUT", "/v1/rules/qwen", sglang);
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_NE(r.body.find("kvEngineType"), std::string::npos) << r.body;

  r = admin.call("GET", "/v1/rules/qwen/inventory");
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(admin.call("DELETE", "/v1/rules/qwen").status, 204);
  EXPECT_EQ(admin.call("GET", "/v1/rules/qwen").status, 404);
  EXPECT_EQ(admin.call("DELETE", "/v1/rules/qwen").status, 404);
}

TEST(Admin, TwoModelsInTwoPools) {
  AdminCluster a(3);
  Admin admin = a.admin();
  std::string url2 = a.cluster.sim(2).url();
  // "default" has all three sims; "other" only the third.
  ASSERT_EQ(admin.call("POST", "/v1/rules", rule_json("other", "other-model", {url2})).status, 201);
  HttpClient c(a.cluster.port());
  std::set<std::string> default_workers;
  for (int i = 0; i < 6; ++i) {
    auto r = c.post("/generate", gen_body("other-model"));
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.header("x-kvgate-worker"), url2);
    r = c.post("/generate", gen_body("base"));
    ASSERT_EQ(r.status, 200) << r.body;
    default_workers.insert(r.header("x-kvgate-worker"));
  }
  EXPECT_EQ(default_workers.size(), 3u);
  auto models = c.get("/v1/models");
  EXPECT_NE(models.body.find("other-model"), std::string::npos) << models.body;
  auto ready = c.get("/readiness");
  EXPECT_EQ(ready.status, 200) << ready.body;
  EXPECT_EQ(ready.body.find("other"), std::string::npos) << "rule names on a public probe";
}

TEST(Admin, LiveUpdateAndDeleteRecreateUnderLoadFailNoRequest) {
  AdminCluster a(3, {"--policy", "cache_aware"});
  Admin admin = a.admin();
  std::string u0 = a.cluster.sim(0).url(), u1 = a.cluster.sim(1).url(), u2 = a.cluster.sim(2).url();
  ASSERT_EQ(admin.call("POST", "/v1/rules", rule_json("other", "other-model", {u1, u2})).status,
            201);
  std::atomic<bool> stop{false};
  std::atomic<int> ok{0}, failed{0};
  std::string first_failure;
  std::mutex mu;
  std::vector<std::thread> clients;
  for (int t = 0; t < 4; ++t) {
    clients.emplace_back([&, t] {
      HttpClient c(a.cluster.port());
      c.set_timeout(10s);
      for (int i = 0; !stop.load(); ++i) {
        std::string model = (i + t) % 2 ? "other-model" : "base";
        auto r = c.post("/generate", gen_body(model));
        if (r.status == 200) {
          ++ok;
        } else {
          ++failed;
          std::lock_guard lock(mu);
          if (first_failure.empty()) first_failure = std::to_string(r.status) + " " + r.body;
        }
      }
    });
  }
  auto wait_ok = [&](int n) { return wait_until([&] { return ok.load() >= n; }, 20s); };
  ASSERT_TRUE(wait_ok(50));
  // Live updates: the policy, then the endpoints, of both rules.
  EXPECT_EQ(admin
                .call("PUT", "/v1/rules/other",
                      rule_json("other", "other-model", {u1, u2}, "power_of_two"))
                .status,
            200);
  ASSERT_TRUE(wait_ok(ok.load() + 50));
  EXPECT_EQ(
      admin.call("PUT", "/v1/rules/other", rule_json("other", "other-model", {u0, u2})).status,
      200);
  ASSERT_TRUE(wait_ok(ok.load() + 30));
  // Scaling out and in (only endpoints change: the policy carries on, in flight and after).
  EXPECT_EQ(
      admin.call("PUT", "/v1/rules/other", rule_json("other", "other-model", {u0, u1, u2})).status,
      200);
  ASSERT_TRUE(wait_ok(ok.load() + 30));
  EXPECT_EQ(
      admin.call("PUT", "/v1/rules/other", rule_json("other", "other-model", {u0, u2})).status,
      200);
  std::string def = R"({"name":"default","mode":4,"sel":"random","kvEngineType":"sglang",)"
                    R"("endpoints":[{"url":")" +
                    u0 + R"("},{"url":")" + u1 + R"("}]})";
  auto put = admin.call("PUT", "/v1/rules/default", def);
  EXPECT_EQ(put.status, 200) << put.body;
  ASSERT_TRUE(wait_ok(ok.load() + 50));
  // Delete and recreate (requests for its model fall to the catch-all meanwhile).
  EXPECT_EQ(admin.call("DELETE", "/v1/rules/other").status, 204);
  ASSERT_TRUE(wait_ok(ok.load() + 30));
  EXPECT_EQ(admin.call("POST", "/v1/rules", rule_json("other", "other-model", {u2})).status, 201);
  ASSERT_TRUE(wait_ok(ok.load() + 50));
  stop = true;
  for (auto& t : clients) t.join();
  EXPECT_EQ(failed.load(), 0) << first_failure;
  EXPECT_GT(ok.load(), 200);
  // Every replaced pool is destroyed once its last request is done; live workers keep their
  // series.
  EXPECT_TRUE(wait_until([&] { return a.cluster.metric("kvgate_pools_retiring") == 0; }))
      << a.cluster.metric("kvgate_pools_retiring");
  EXPECT_EQ(a.cluster.metric("kvgate_worker_health{worker=\"" + u2 + "\"}"), 1);
  EXPECT_GE(a.cluster.metric("kvgate_rule_changes_total{result=\"applied\"}"), 5);
}

TEST(Admin, WorkersApiAndFanOutRoutes) {
  AdminCluster a(2);
  Admin admin = a.admin();
  auto r = admin.call("GET", "/workers");
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(json_number_field(r.body, "total"), 2) << r.body;

  // Take sim 1 out, then back in.
  std::string u1 = a.cluster.sim(1).url();
  r = admin.call("DELETE", "/workers/" + std::string("http%3A%2F%2F127.0.0.1%3A") +
                               std::to_string(a.cluster.sim(1).port));
  EXPECT_EQ(r.status, 204) << r.body;
  EXPECT_EQ(json_number_field(admin.call("GET", "/workers").body, "total"), 1);
  r = admin.call("POST", "/workers", R"({"url":")" + u1 + R"(","modle_id":"m"})");
  EXPECT_EQ(r.status, 400) << r.body;  // a typo never adds the worker somewhere unmeant
  EXPECT_NE(r.body.find("unknown field"), std::string::npos) << r.body;
  EXPECT_EQ(admin.call("GET", "/v1/rules/default/inventory").status, 200);
  EXPECT_EQ(admin.call("POST", "/v1/rules/default/inventory", "{}").status, 405);
  r = admin.call("POST", "/workers", R"({"url":")" + u1 + R"("})");
  EXPECT_EQ(r.status, 201) << r.body;
  EXPECT_EQ(admin.call("POST", "/workers", R"({"url":")" + u1 + R"("})").status, 409);
  EXPECT_TRUE(a.cluster.wait_healthy(2));

  r = admin.call("POST", "/flush_cache");
  EXPECT_EQ(r.status, 200) << r.body;
  r = admin.call("GET", "/get_loads");
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_NE(r.body.find(R"("load":)"), std::string::npos) << r.body;

  // Engine configuration: the admin listener answers, the public one does not.
  r = admin.call("GET", "/get_server_info");
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_NE(r.body.find("page_size"), std::string::npos) << r.body;
  HttpClient c(a.cluster.port());
  EXPECT_EQ(c.get("/get_server_info").status, 404);
  r = admin.call("GET", "/v1/config");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body.find(kKey), std::string::npos) << "the admin key leaked: " << r.body;
  EXPECT_NE(r.body.find(R"("admin-api-key": "<redacted>")"), std::string::npos) << r.body;
}

using Json = nlohmann::json;

Json parsed(const Response& r) {
  Json j = Json::parse(r.body, nullptr, false);
  return j.is_discarded() ? Json() : j;
}

// The worker that served one /generate for `model`.
std::string served_by(int port, const std::string& model) {
  HttpClient c(port);
  auto r = c.post("/generate", gen_body(model));
  return r.status == 200 ? r.header("x-kvgate-worker") : "status " + std::to_string(r.status);
}

TEST(Admin, HistoryRecordsCreateUpdateWorkersAndDelete) {
  AdminCluster a(2);
  Admin admin = a.admin();
  std::string u0 = a.cluster.sim(0).url(), u1 = a.cluster.sim(1).url();
  auto r = admin.call("GET", "/v1/rules/default/history");
  ASSERT_EQ(r.status, 200) << r.body;
  Json h = parsed(r);
  EXPECT_EQ(h["rule"], "default");
  EXPECT_EQ(h["current"], 1);
  ASSERT_EQ(h["versions"].size(), 1u) << r.body;
  EXPECT_EQ(h["versions"][0]["version"], 1);
  EXPECT_EQ(h["versions"][0]["source"], "startup");
  EXPECT_EQ(h["versions"][0]["rule"], parsed(admin.call("GET", "/v1/rules/default")));
  EXPECT_TRUE(std::regex_match(h["versions"][0]["time"].get<std::string>(),
                               std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)")))
      << h["versions"][0]["time"];
  EXPECT_FALSE(h["versions"][0].contains("restored"));

  ASSERT_EQ(admin.call("POST", "/v1/rules", rule_json("qwen", "qwen3", {u1})).status, 201);
  ASSERT_EQ(admin.call("PUT", "/v1/rules/qwen", rule_json("qwen", "qwen3", {u1}, "random")).status,
            200);
  ASSERT_EQ(admin.call("POST", "/workers", R"({"url":")" + u0 + R"(","rule":"qwen"})").status, 201);
  // Out of both rules in one change: a version of each.
  ASSERT_EQ(admin
                .call("DELETE",
                      "/workers/http%3A%2F%2F127.0.0.1%3A" + std::to_string(a.cluster.sim(0).port))
                .status,
            204);
  ASSERT_EQ(admin.call("DELETE", "/v1/rules/qwen").status, 204);

  h = parsed(admin.call("GET", "/v1/rules/qwen/history"));
  EXPECT_EQ(h["rule"], "qwen");
  EXPECT_EQ(h["current"], 6);
  const Json& v = h["versions"];  // newest first
  ASSERT_EQ(v.size(), 6u) << h.dump();
  std::vector<std::string> sources;
  for (const auto& e : v) sources.push_back(e["source"]);
  EXPECT_EQ(sources, (std::vector<std::string>{"api", "workers", "workers", "api", "api", "api"}));
  for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(v[i]["version"], 6 - i);
  EXPECT_TRUE(v[0]["rule"].is_null());  // deleted
  EXPECT_EQ(v[1]["rule"]["endpoints"].size(), 1u);
  EXPECT_EQ(v[2]["rule"]["endpoints"].size(), 2u);
  EXPECT_EQ(v[2]["rule"]["endpoints"][1]["url"], u0);
  EXPECT_EQ(v[3]["rule"]["sel"], "random");
  EXPECT_EQ(v[4]["rule"]["sel"], "round_robin");
  EXPECT_EQ(v[4]["rule"]["models"], Json::array({"qwen3"}));
  EXPECT_TRUE(v[5]["rule"].is_null());  // before it was created
  EXPECT_LE(v[5]["time"].get<std::string>(), v[0]["time"].get<std::string>());
  h = parsed(admin.call("GET", "/v1/rules/default/history"));
  EXPECT_EQ(h["current"], 2);
  EXPECT_EQ(h["versions"][0]["source"], "workers");
  EXPECT_EQ(a.cluster.metric("kvgate_rule_history_versions"), 8);

  r = admin.call("GET", "/v1/rules/never/history");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(parsed(r)["error"]["code"], "rule_not_found") << r.body;
  EXPECT_EQ(admin.call("POST", "/v1/rules/qwen/history").status, 405);
}

TEST(Admin, RollbackRestoresTheWholePreviousRuleAndRoutingFollows) {
  AdminCluster a(3);
  Admin admin = a.admin();
  std::string u1 = a.cluster.sim(1).url(), u2 = a.cluster.sim(2).url();
  std::string first = R"({"name":"m","mode":4,"sel":"round_robin","models":["mm"],)"
                      R"("maxTreeSize":12345,"kvWarmupSec":7,"policySeed":42,)"
                      R"("endpoints":[{"url":")" +
                      u1 + R"(","weight":3}]})";
  std::string second = R"({"name":"m","mode":4,"sel":"cache_aware","models":["mm","mm2"],)"
                       R"("cacheThreshold":0.9,"endpoints":[")" +
                       u2 + R"("]})";
  ASSERT_EQ(admin.call("POST", "/v1/rules", first).status, 201);
  Json v1 = parsed(admin.call("GET", "/v1/rules/m"));
  ASSERT_EQ(admin.call("PUT", "/v1/rules/m", second).status, 200);
  Json v2 = parsed(admin.call("GET", "/v1/rules/m"));
  ASSERT_NE(v1, v2);
  EXPECT_EQ(served_by(a.cluster.port(), "mm"), u2);

  auto r = admin.call("POST", "/v1/rules/m/rollback");
  ASSERT_EQ(r.status, 200) << r.body;
  Json out = parsed(r);
  EXPECT_EQ(out["rule"], "m");
  EXPECT_EQ(out["restored"], 2);
  EXPECT_EQ(out["version"], 4);
  EXPECT_EQ(out["action"], "replaced");
  EXPECT_EQ(out["in_force"], v1);
  EXPECT_EQ(parsed(admin.call("GET", "/v1/rules/m")), v1);  // every field
  EXPECT_EQ(served_by(a.cluster.port(), "mm"), u1);

  // Again: back to what the first rollback replaced.
  r = admin.call("POST", "/v1/rules/m/rollback");
  ASSERT_EQ(r.status, 200) << r.body;
  out = parsed(r);
  EXPECT_EQ(out["restored"], 3);
  EXPECT_EQ(out["version"], 5);
  EXPECT_EQ(out["in_force"], v2);
  EXPECT_EQ(parsed(admin.call("GET", "/v1/rules/m")), v2);
  EXPECT_EQ(served_by(a.cluster.port(), "mm"), u2);
  EXPECT_EQ(served_by(a.cluster.port(), "mm2"), u2);

  // A given version; then the history says what each rollback restored.
  r = admin.call("POST", "/v1/rules/m/rollback?to=2");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(parsed(r)["version"], 6);
  EXPECT_EQ(parsed(admin.call("GET", "/v1/rules/m")), v1);
  EXPECT_EQ(served_by(a.cluster.port(), "mm"), u1);
  Json h = parsed(admin.call("GET", "/v1/rules/m/history"));
  EXPECT_EQ(h["current"], 6);
  EXPECT_EQ(h["versions"][0]["source"], "rollback");
  EXPECT_EQ(h["versions"][0]["restored"], 2);
  EXPECT_EQ(h["versions"][1]["restored"], 3);
  EXPECT_EQ(h["versions"][2]["restored"], 2);
  EXPECT_FALSE(h["versions"][3].contains("restored"));
  EXPECT_EQ(h["versions"][0]["rule"], v1);

  // A deleted rule comes back; a created one goes.
  ASSERT_EQ(admin.call("DELETE", "/v1/rules/m").status, 204);
  r = admin.call("POST", "/v1/rules/m/rollback");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(parsed(r)["action"], "created");
  EXPECT_EQ(parsed(admin.call("GET", "/v1/rules/m")), v1);
  EXPECT_EQ(served_by(a.cluster.port(), "mm"), u1);
  r = admin.call("POST", "/v1/rules/m/rollback?to=1");
  ASSERT_EQ(r.status, 200) << r.body;
  out = parsed(r);
  EXPECT_EQ(out["action"], "deleted");
  EXPECT_TRUE(out["in_force"].is_null());
  EXPECT_EQ(admin.call("GET", "/v1/rules/m").status, 404);
}

TEST(Admin, RollbackRefusalsChangeNothing) {
  AdminCluster a(2);
  Admin admin = a.admin();
  std::string u0 = a.cluster.sim(0).url(), u1 = a.cluster.sim(1).url();
  auto code = [](const Response& r) { return parsed(r)["error"]["code"]; };
  auto r = admin.call("POST", "/v1/rules/default/rollback");
  EXPECT_EQ(r.status, 409) << r.body;
  EXPECT_EQ(code(r), "nothing_to_roll_back");
  EXPECT_NE(r.body.find("one version only"), std::string::npos) << r.body;
  r = admin.call("POST", "/v1/rules/nope/rollback");
  EXPECT_EQ(r.status, 404) << r.body;
  EXPECT_EQ(code(r), "rule_not_found");

  // Rule a's first version claims m1, which rule b has claimed since.
  ASSERT_EQ(admin.call("POST", "/v1/rules", rule_json("a", "m1", {u1})).status, 201);
  ASSERT_EQ(admin.call("PUT", "/v1/rules/a", rule_json("a", "m2", {u1})).status, 200);
  ASSERT_EQ(admin.call("POST", "/v1/rules", rule_json("b", "m1", {u0})).status, 201);
  Json before = parsed(admin.call("GET", "/v1/rules/a/history"));
  r = admin.call("POST", "/v1/rules/a/rollback");
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(code(r), "invalid_rule");
  ASSERT_TRUE(parsed(r)["error"]["details"].is_array()) << r.body;
  EXPECT_NE(r.body.find("m1"), std::string::npos) << r.body;
  EXPECT_EQ(parsed(admin.call("GET", "/v1/rules/a"))["models"], Json::array({"m2"}));
  EXPECT_EQ(parsed(admin.call("GET", "/v1/rules/a/history")), before);
  EXPECT_EQ(served_by(a.cluster.port(), "m1"), u0);

  r = admin.call("POST", "/v1/rules/a/rollback?to=99");
  EXPECT_EQ(r.status, 404) << r.body;
  EXPECT_EQ(code(r), "version_not_found");
  r = admin.call("POST", "/v1/rules/a/rollback?to=two");
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(code(r), "invalid_version");
  r = admin.call("POST", "/v1/rules/a/rollback?to=3");  // the version in force
  EXPECT_EQ(r.status, 409) << r.body;
  EXPECT_EQ(admin.call("GET", "/v1/rules/a/rollback").status, 405);
  EXPECT_EQ(parsed(admin.call("GET", "/v1/rules/a/history")), before);

  // The admin key is needed, for both routes.
  for (const std::string& key : {std::string(), std::string("wrong")}) {
    admin.key = key;
    EXPECT_EQ(admin.call("GET", "/v1/rules/a/history").status, 401) << key;
    EXPECT_EQ(admin.call("POST", "/v1/rules/a/rollback?to=1").status, 401) << key;
  }
  admin.key = kKey;
  EXPECT_EQ(parsed(admin.call("GET", "/v1/rules/a/history")), before);
}

// The dashboard (GET /ui): the key given once as ?token= opens a session (an HttpOnly,
// SameSite=Strict cookie) and the redirect drops the token; the cookie opens /ui and /v1/stats
// and nothing else; browsers reach /v1/stats only from the page itself.
TEST(Dashboard, TokenOpensASessionTheCookieReadsOnlyTheDashboard) {
  AdminCluster a(1);
  HttpClient c(a.admin_port);
  c.set_timeout(10s);
  auto login = c.get("/ui?token=" + std::string(kKey));
  ASSERT_EQ(login.status, 303) << login.body;
  EXPECT_EQ(login.header("location"), "/ui");  // the token is not in the URL any more
  std::string set = login.header("set-cookie");
  EXPECT_NE(set.find("HttpOnly"), std::string::npos) << set;
  EXPECT_NE(set.find("SameSite=Strict"), std::string::npos) << set;
  EXPECT_NE(set.find("Path=/"), std::string::npos) << set;
  EXPECT_EQ(set.find(kKey), std::string::npos) << "the cookie is not the key: " << set;
  // Named per admin port: two kvgates on one host keep their sessions apart.
  const std::string name = "kvgate_session_" + std::to_string(a.admin_port);
  ASSERT_TRUE(set.starts_with(name + "=")) << set;
  std::string cookie = set.substr(0, set.find(';'));
  // Another site of the host may plant a pair of the same name first: the real one still counts.
  const std::string planted = name + "=junk; " + cookie;
  EXPECT_EQ(c.request("GET", "/ui", "", {{"cookie", planted}}).status, 200);
  // The token opens a session on any of the page's addresses.
  EXPECT_EQ(c.get("/ui/?token=" + std::string(kKey)).status, 303);
  EXPECT_EQ(c.get("/ui/index.html?token=" + std::string(kKey)).status, 303);

  auto page = c.request("GET", "/ui", "", {{"cookie", cookie}, {"sec-fetch-site", "none"}});
  ASSERT_EQ(page.status, 200) << page.body;
  EXPECT_TRUE(page.header("content-type").starts_with("text/html")) << page.header("content-type");
  EXPECT_NE(page.header("content-security-policy").find("frame-ancestors 'none'"),
            std::string::npos);
  EXPECT_NE(page.body.find("/ui/app.js"), std::string::npos);
  for (const char* asset : {"/ui/app.js", "/ui/app.css"}) {
    auto r = c.request("GET", asset, "", {{"cookie", cookie}, {"sec-fetch-site", "same-origin"}});
    EXPECT_EQ(r.status, 200) << asset;
    EXPECT_FALSE(r.body.empty()) << asset;
  }
  auto stats =
      c.request("GET", "/v1/stats", "", {{"cookie", cookie}, {"sec-fetch-site", "same-origin"}});
  ASSERT_EQ(stats.status, 200) << stats.body;
  EXPECT_NE(stats.body.find(R"("rules":)"), std::string::npos) << stats.body;
  EXPECT_EQ(stats.header("cache-control"), "no-store");

  // A page of another site cannot read the figures, even with the browser's cookie.
  auto cross = c.request(
      "GET", "/v1/stats", "",
      {{"cookie", cookie}, {"sec-fetch-site", "cross-site"}, {"origin", "http://evil.example"}});
  EXPECT_EQ(cross.status, 403) << cross.body;
  auto same_site =
      c.request("GET", "/v1/stats", "", {{"cookie", cookie}, {"sec-fetch-site", "same-site"}});
  EXPECT_EQ(same_site.status, 403) << "another port of the host is same-site, not same-origin";
  // ?decisions=N (at most the log's 256); a count that is not one is refused.
  EXPECT_EQ(c.request("GET", "/v1/stats?decisions=5", "", {{"cookie", cookie}}).status, 200);
  EXPECT_EQ(c.request("GET", "/v1/stats?decisions=x", "", {{"cookie", cookie}}).status, 400);
  // A link from another site carries no SameSite=Strict cookie: the page loads itself again from
  // its own origin (then the cookie goes), rather than asking to sign in.
  auto linked = c.request("GET", "/ui", "", {{"sec-fetch-site", "cross-site"}});
  EXPECT_EQ(linked.status, 200);
  EXPECT_NE(linked.body.find(R"(http-equiv="refresh" content="0; url=/ui?bounced=1")"),
            std::string::npos)
      << linked.body;
  // Neither this page nor the sign-in page sends the browser for /favicon.ico (refused: 403).
  EXPECT_NE(linked.body.find(R"(<link rel="icon" href="data:,">)"), std::string::npos);
  // Once only: the reload seen as cross-site again gets the sign-in page, not another reload.
  auto again = c.request("GET", "/ui?bounced=1", "", {{"sec-fetch-site", "cross-site"}});
  EXPECT_EQ(again.status, 401);
  EXPECT_NE(again.body.find("/ui?token="), std::string::npos) << again.body;
  // The cookie is no admin key: the API's other routes refuse it.
  EXPECT_EQ(c.request("GET", "/v1/rules", "", {{"cookie", cookie}}).status, 401);
  EXPECT_EQ(c.request("DELETE", "/v1/rules/default", "", {{"cookie", cookie}}).status, 401);
  // Read-only routes.
  EXPECT_EQ(
      c.request("POST", "/v1/stats", "", {{"authorization", "Bearer " + std::string(kKey)}}).status,
      405);
  // A forged or stale cookie is no session; the page tells how to open one.
  auto forged = c.request("GET", "/ui", "", {{"cookie", "kvgate_session=00ff"}});
  EXPECT_EQ(forged.status, 401);
  EXPECT_NE(forged.body.find("/ui?token="), std::string::npos) << forged.body;
  EXPECT_NE(forged.body.find(R"(<link rel="icon" href="data:,">)"), std::string::npos);
  auto no_session = c.request("GET", "/v1/stats", "", {{"sec-fetch-site", "same-origin"}});
  EXPECT_EQ(no_session.status, 401);
  EXPECT_NE(no_session.body.find("no_session"), std::string::npos) << no_session.body;
  // Scripts use the key.
  EXPECT_EQ(
      c.request("GET", "/v1/stats", "", {{"authorization", "Bearer " + std::string(kKey)}}).status,
      200);

  // Signing out ends the session, from the page only (another port's page is same-site).
  EXPECT_EQ(
      c.request("GET", "/ui/logout", "", {{"cookie", cookie}, {"sec-fetch-site", "same-site"}})
          .status,
      403);
  EXPECT_EQ(c.request("HEAD", "/ui/logout", "", {{"cookie", cookie}}).status, 403);
  EXPECT_EQ(c.request("GET", "/ui", "", {{"cookie", cookie}}).status, 200);
  auto out =
      c.request("GET", "/ui/logout", "", {{"cookie", cookie}, {"sec-fetch-site", "same-origin"}});
  EXPECT_EQ(out.status, 303);
  EXPECT_NE(out.header("set-cookie").find("Max-Age=0"), std::string::npos);
  EXPECT_EQ(c.request("GET", "/ui", "", {{"cookie", cookie}}).status, 401);
}

TEST(Dashboard, SessionsAreBoundedTheOldestGoFirst) {
  AdminCluster a(1);
  HttpClient c(a.admin_port);
  c.set_timeout(10s);
  std::vector<std::string> cookies;
  for (size_t i = 0; i < kMaxSessions + 6; ++i) {
    auto r = c.get("/ui?token=" + std::string(kKey));
    ASSERT_EQ(r.status, 303);
    std::string set = r.header("set-cookie");
    cookies.push_back(set.substr(0, set.find(';')));
  }
  // The first ones were evicted; the last 64 still open the page.
  EXPECT_EQ(c.request("GET", "/ui", "", {{"cookie", cookies.front()}}).status, 401);
  EXPECT_EQ(c.request("GET", "/ui", "", {{"cookie", cookies[5]}}).status, 401);
  EXPECT_EQ(c.request("GET", "/ui", "", {{"cookie", cookies[6]}}).status, 200);
  EXPECT_EQ(c.request("GET", "/ui", "", {{"cookie", cookies.back()}}).status, 200);
}

TEST(Dashboard, WrongTokensCountAsFailedAuthentications) {
  AdminCluster a(1);
  HttpClient c(a.admin_port);
  c.set_timeout(10s);
  int refused = 0;
  for (int i = 0; i < 12; ++i) {
    auto r = c.get("/ui?token=wrong-key-guess");
    EXPECT_TRUE(r.status == 401 || r.status == 429) << r.status;
    EXPECT_TRUE(r.header("set-cookie").empty());
    if (r.status == 429) ++refused;
  }
  EXPECT_GE(refused, 2);
  // The right key still opens a session from that address.
  EXPECT_EQ(c.get("/ui?token=" + std::string(kKey)).status, 303);
  // Pages asked for with no key offered (no session yet) are not counted as guesses.
  AdminCluster b(1);
  HttpClient d(b.admin_port);
  d.set_timeout(10s);
  for (int i = 0; i < 15; ++i) EXPECT_EQ(d.get("/ui").status, 401);
}

TEST(Dashboard, StatsShowWorkersBranchesAndExplainedDecisions) {
  AdminCluster a(2);
  HttpClient gw(a.cluster.port());
  gw.set_timeout(10s);
  for (int i = 0; i < 6; ++i) {
    ASSERT_EQ(gw.post("/generate", gen_body("any")).status, 200);
  }
  auto r = a.admin().call("GET", "/v1/stats");
  ASSERT_EQ(r.status, 200) << r.body;
  auto s = nlohmann::json::parse(r.body);
  EXPECT_GE(s["requests"]["total"].get<int>(), 6);
  ASSERT_EQ(s["rules"].size(), 1u);
  const auto& workers = s["rules"][0]["workers"];
  ASSERT_EQ(workers.size(), 2u);
  for (const auto& w : workers) {
    EXPECT_TRUE(w["healthy"].get<bool>());
    EXPECT_EQ(w["breaker"], "closed");
    EXPECT_EQ(w["requests"], 3) << w;  // round_robin
  }
  bool round_robin = false;
  for (const auto& b : s["branches"]) {
    round_robin = round_robin || (b["policy"] == "round_robin" && b["count"].get<int>() >= 6);
  }
  EXPECT_TRUE(round_robin) << s["branches"];
  const auto& recent = s["decisions"]["recent"];
  ASSERT_GE(recent.size(), 6u);
  EXPECT_EQ(recent[0]["route"], "/generate");
  EXPECT_EQ(recent[0]["status"], 200);
  EXPECT_EQ(recent[0]["attempt"], 1);
  EXPECT_EQ(recent[0]["rule"], "default");
  EXPECT_NE(recent[0]["explain"].get<std::string>().find("next: sent to http://127.0.0.1:"),
            std::string::npos)
      << recent[0]["explain"];
  // Alternating workers, newest first.
  EXPECT_NE(recent[0]["worker"], recent[1]["worker"]);
}

TEST(Admin, ExposeServerInfoAnswersOnThePublicListener) {
  AdminCluster a(1, {"--expose-server-info"});
  HttpClient c(a.cluster.port());
  auto r = c.get("/get_server_info");
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_NE(r.body.find("page_size"), std::string::npos) << r.body;
}

TEST(ConfigReload, AFailedReloadLeavesTheOldConfigurationServing) {
  Cluster sims(2, {}, {}, false);  // its kvgate is not used
  TempDir dir;
  std::string u0 = sims.sim(0).url(), u1 = sims.sim(1).url();
  auto yaml = [&](const std::string& sel, const std::string& extra) {
    return "policy: round_robin\nrules:\n  - name: main\n    mode: 4\n    sel: " + sel +
           "\n    endpoints:\n      - url: " + u0 + "\n      - url: " + u1 + "\n" + extra;
  };
  std::string file = dir.write("kvgate.yaml", yaml("round_robin", ""));
  int port = free_port(), admin_port = free_port();
  Process gw("kvgate", {"--config", file, "--host", "127.0.0.1", "--port", std::to_string(port),
                        "--prometheus-port", std::to_string(free_port()), "--admin-port",
                        std::to_string(admin_port), "--shutdown-grace-period-secs", "2"});
  ASSERT_TRUE(wait_until(
      [&] {
        HttpClient c(port);
        return c.get("/readiness").status == 200;
      },
      20s))
      << gw.log();
  Admin admin{admin_port, ""};
  HttpClient c(port);
  ASSERT_EQ(c.post("/generate", gen_body("m")).status, 200);

  // An invalid file: the reload is refused with its line, the old rules keep serving.
  dir.write("kvgate.yaml", yaml("round_robin", "    kvDpRankCount: 12\n"));
  auto r = admin.call("POST", "/v1/config/reload");
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_NE(r.body.find("kvgate.yaml:"), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("kvDpRankCount"), std::string::npos) << r.body;
  ::kill(gw.pid(), SIGHUP);
  EXPECT_TRUE(wait_until([&] { return gw.log().find("was not reloaded") != std::string::npos; }));
  EXPECT_EQ(c.post("/generate", gen_body("m")).status, 200);
  EXPECT_NE(admin.call("GET", "/v1/rules/main").body.find(R"("sel":"round_robin")"),
            std::string::npos);

  // A knob that cannot change live refuses the whole reload.
  dir.write("kvgate.yaml", "queue-size: 7\n" + yaml("random", ""));
  r = admin.call("POST", "/v1/config/reload");
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_NE(r.body.find("queue-size"), std::string::npos) << r.body;
  EXPECT_NE(admin.call("GET", "/v1/rules/main").body.find(R"("sel":"round_robin")"),
            std::string::npos);

  // A valid change applies, by SIGHUP too.
  dir.write("kvgate.yaml", yaml("random", ""));
  ::kill(gw.pid(), SIGHUP);
  EXPECT_TRUE(wait_until([&] {
    return admin.call("GET", "/v1/rules/main").body.find(R"("sel":"random")") != std::string::npos;
  }));
  EXPECT_EQ(c.post("/generate", gen_body("m")).status, 200);
  EXPECT_EQ(gw.stop(10s), 0) << gw.log();
}

TEST(ConfigFile, ErrorsAtStartupNameTheFileAndLine) {
  TempDir dir;
  std::string file = dir.write("bad.yaml",
                               "port: 0\nrules:\n  - name: a\n    mode: 4\n    kvDpRankCount: 9\n"
                               "    endpoints: [{url: 'http://127.0.0.1:1'}]\n");
  auto r = run("kvgate", {"--config", file, "--prometheus-port", "0", "--admin-port", "0"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find(file + ":5:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("kvDpRankCount"), std::string::npos) << r.output;
}

}  // namespace
// Route-only: where a request would go, without sending it; with ?at= decided at that moment
// (the answer says how late it was), and a moment that is not one, or more than a second ahead,
// refused.
TEST(Admin, RouteOnlyDecidesWithoutSendingAndAtAMomentAsked) {
  AdminCluster ac(2);
  Admin admin = ac.admin();
  const std::string body =
      R"({"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":2})";
  Response r = admin.call("POST", "/v1/route?path=/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_NE(r.body.find(R"("worker":"http://)"), std::string::npos) << r.body;
  EXPECT_EQ(r.body.find("late_us"), std::string::npos) << r.body;
  const int64_t now = std::chrono::duration_cast<std::chrono::microseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  const auto t0 = std::chrono::steady_clock::now();
  r = admin.call("POST", "/v1/route?path=/v1/chat/completions&at=" + std::to_string(now + 200000),
                 body);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 150ms);  // it waited for the moment
  EXPECT_GE(json_number_field(r.body, "late_us"), 0) << r.body;
  for (const std::string& bad :
       {std::string("soon"), std::string("12x"), std::to_string(now + 5'000'000),
        std::to_string(now - 5'000'000), std::string("0"), std::string("-1")}) {
    r = admin.call("POST", "/v1/route?path=/v1/chat/completions&at=" + bad, body);
    EXPECT_EQ(r.status, 400) << bad << " " << r.body;
    EXPECT_NE(r.body.find("bad_at"), std::string::npos) << r.body;
  }
  // Nothing was sent: no request went through the gateway's request path.
  EXPECT_EQ(ac.cluster.metrics().find("kvgate_requests_total{route=\"/v1/chat/completions\""),
            std::string::npos)
      << ac.cluster.metrics();
}

}  // namespace kvgate::testing
