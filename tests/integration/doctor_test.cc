// kvgate doctor end to end: kvgate-sim servers (real tokenizer, two DP ranks, KV events) behind
// kvgate with a kv_exact rule. A healthy pool passes every step; each planted fault fails at the
// step that owns it, with the fix that names it.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "support/cluster.h"
#include "support/http_client.h"
#include "support/models.h"
#include "support/process.h"
#include "support/temp_dir.h"

namespace kvgate::testing {
namespace {

using namespace std::chrono_literals;
using Json = nlohmann::ordered_json;

struct Fault {
  std::vector<std::string> sim_args;  // added to this sim's command line
  bool no_events = false;             // the sim publishes no KV events
  bool unhealthy = false;             // its /health answers 503 (it serves otherwise)
  std::string rule_port;              // this endpoint's kvZmqPort in the rule, when not its own
};

// Two sims (qwen3's tokenizer, page size 16, 2 DP ranks, events bound on every address) and kvgate
// with a kv_exact rule naming them; `faults[i]` changes sim i, `rule_extra` the rule.
struct DoctorCluster {
  static constexpr int kRanks = 2;
  explicit DoctorCluster(std::vector<Fault> faults = {{}, {}},
                         const std::map<std::string, std::string>& rule = {}) {
    std::string tokenizer = models_dir() + "/qwen3";
    std::map<std::string, std::string> fields = {
        {"mode", "4"},        {"sel", "round_robin"},       {"kvEngineType", "sglang"},
        {"kvExactMode", "3"}, {"kvBlockSize", "16"},        {"kvDpRankCount", "2"},
        {"kvWarmupSec", "0"}, {"tokenizerPath", tokenizer},
    };
    for (const auto& [k, v] : rule) fields[k] = v;
    std::string yaml = "rules:\n  - name: default\n";
    for (auto& [k, v] : fields) yaml.append("    ").append(k).append(": ").append(v).append("\n");
    yaml += "    endpoints:\n";
    for (auto& f : faults) {
      Sim s;
      s.port = free_port();
      int events = free_ports(kRanks);
      s.args = {"--page-size",
                "16",
                "--dp-size",
                std::to_string(kRanks),
                "--tokenizer-path",
                tokenizer,
                "--enable-cache-report",
                "--time-scale",
                "0"};
      if (!f.no_events) {
        s.args.emplace_back("--kv-events-config");
        s.args.push_back(R"({"publisher":"zmq","endpoint":"tcp://*:)" + std::to_string(events) +
                         R"(","topic":""})");
      }
      if (f.unhealthy) {
        s.args.emplace_back("--start-unhealthy-secs");
        s.args.emplace_back("600");
      }
      s.args.insert(s.args.end(), f.sim_args.begin(), f.sim_args.end());
      s.start();  // (waits for /health to answer, 503 included)
      healthy += f.unhealthy ? 0 : 1;
      yaml += "      - url: " + s.url() + "\n        kvZmqPort: " +
              (f.rule_port.empty() ? std::to_string(events) : f.rule_port) + "\n";
      sims.push_back(std::move(s));
    }
    config = dir.write("kvgate.yaml", yaml);
    port = free_port();
    admin_port = free_port();
    gateway = std::make_unique<Process>(
        "kvgate", std::vector<std::string>{"--config", config, "--host", "127.0.0.1", "--port",
                                           std::to_string(port), "--prometheus-port",
                                           std::to_string(free_port()), "--admin-port",
                                           std::to_string(admin_port)});
    // Every worker healthy in kvgate (the doctor's step 3 must not race the first probes).
    EXPECT_TRUE(wait_until([&] {
      return json_number_field(HttpClient(port).get("/readiness").body, "healthy_workers") ==
             static_cast<double>(healthy);
    })) << gateway->log();
  }

  // The doctor's report of the rule (the admin API's).
  Json doctor(const std::string& query = "") {
    HttpClient c(admin_port);
    c.set_timeout(120s);
    auto r = c.post("/v1/rules/default/doctor" + query, "");
    EXPECT_EQ(r.status, 200) << r.body;
    Json j = Json::parse(r.body, nullptr, false);
    EXPECT_TRUE(j.is_object()) << r.body;
    return j;
  }

  TempDir dir;
  std::vector<Sim> sims;
  int healthy = 0;
  std::string config;
  int port = 0;
  int admin_port = 0;
  std::unique_ptr<Process> gateway;
};

std::string text_of(const Json& report) {
  return report.dump(2);
}

// The report stopped at `step`, whose fix contains `fix` and whose details contain `detail`.
void expect_fails_at(const Json& report, int step, const std::string& fix,
                     const std::string& detail = "") {
  ASSERT_TRUE(report.is_object());
  EXPECT_FALSE(report.value("ok", true)) << text_of(report);
  EXPECT_EQ(report.value("failed_step", 0), step) << text_of(report);
  for (const auto& s : report["steps"]) {
    int n = s.value("step", 0);
    std::string status = s.value("status", "");
    if (n < step) {
      EXPECT_NE(status, "FAIL") << text_of(report);
    } else if (n == step) {
      EXPECT_EQ(status, "FAIL") << text_of(report);
      ASSERT_TRUE(s["fix"].is_string()) << text_of(report);
      EXPECT_NE(s["fix"].get<std::string>().find(fix), std::string::npos)
          << "fix: " << s["fix"] << "\n"
          << text_of(report);
      if (!detail.empty()) {
        EXPECT_NE(s["details"].dump().find(detail), std::string::npos) << text_of(report);
      }
    } else {
      EXPECT_EQ(status, "SKIP") << text_of(report);  // it stops at the first failure
    }
  }
}

TEST(Doctor, AHealthyPoolPassesEveryStep) {
  KVGATE_REQUIRE_MODEL("qwen3");
  DoctorCluster c;
  auto out = run("kvgate", {"doctor", "--admin-url",
                            "http://127.0.0.1:" + std::to_string(c.admin_port), "--settle", "20"});
  EXPECT_EQ(out.status, 0) << out.output << c.gateway->log();
  for (int step = 1; step <= 7; ++step) {
    // Step 4 warns: the sims bind their publishers on every address (as SGLang does for
    // tcp://*), which only the operator can judge.
    std::string status = step == 4 ? "WARN  " : "PASS  ";
    EXPECT_NE(out.output.find(status + std::to_string(step) + " "), std::string::npos)
        << out.output;
  }
  EXPECT_NE(out.output.find("listen on every address"), std::string::npos) << out.output;
  EXPECT_NE(out.output.find("no step failed; 1 warning(s)"), std::string::npos) << out.output;
  // Step 5 proved a hit with the engine's own count, step 4 saw every rank's sequence move.
  EXPECT_NE(out.output.find("kv_exact hit on"), std::string::npos) << out.output;
  EXPECT_NE(out.output.find("4 (endpoint, rank) publishers"), std::string::npos) << out.output;
  // JSON for machines: the same steps.
  auto js =
      run("kvgate", {"doctor", "--admin-url", "http://127.0.0.1:" + std::to_string(c.admin_port),
                     "--json", "--steps", "5-6"});
  EXPECT_EQ(js.status, 0) << js.output;
  Json j = Json::parse(js.output, nullptr, false);
  ASSERT_TRUE(j.is_object()) << js.output;
  EXPECT_TRUE(j["ok"].get<bool>());
  EXPECT_EQ(j["rules"][0]["steps"].size(), 2u) << js.output;
}

// Whether a process runs with the private gateway's command line for `config` (kvgate doctor
// --config starts it with --port 0, which the test's own kvgate does not use).
bool private_gateway_running(const std::string& config) {
  const std::string want = std::string("--config\0", 9) + config + std::string("\0--host\0", 8) +
                           std::string(
                               "127.0.0.1\0--port\0"
                               "0\0",
                               19);
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    std::ifstream f(entry.path() / "cmdline", std::ios::binary);
    std::string cmdline((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (cmdline.find(want) != std::string::npos) return true;
  }
  return false;
}

TEST(Doctor, RunsAgainstAConfigFileWithAPrivateGateway) {
  KVGATE_REQUIRE_MODEL("qwen3");
  DoctorCluster c;
  auto out = run("kvgate", {"doctor", "--config", c.config, "--steps", "1-4"});
  EXPECT_EQ(out.status, 0) << out.output;
  // Its private gateway is gone with it.
  EXPECT_FALSE(private_gateway_running(c.config));
  EXPECT_NE(out.output.find("PASS  3 proxy path"), std::string::npos) << out.output;
  EXPECT_NE(out.output.find("WARN  4 event plane"), std::string::npos) << out.output;
}

// A doctor killed mid-run (a timeout's SIGKILL) takes its private gateway with it: it must not go
// on health-checking and subscribing to the engines.
TEST(Doctor, AKilledDoctorTakesItsPrivateGatewayWithIt) {
  KVGATE_REQUIRE_MODEL("qwen3");
  DoctorCluster c;
  Process doctor("kvgate", {"doctor", "--config", c.config, "--settle", "60"});
  ASSERT_TRUE(wait_until([&] { return private_gateway_running(c.config); }, 20s)) << doctor.log();
  doctor.kill_now();
  EXPECT_TRUE(wait_until([&] { return !private_gateway_running(c.config); }, 20s))
      << "the private kvgate outlived kvgate doctor";
}

// A client that hangs up ends its run: the gateway does not keep the doctor (and its armed key)
// busy for nobody, and the next run may start. The run here would wait 30 s for the unhealthy
// worker first; the next run gets in well before.
TEST(Doctor, ARunWhoseClientLeftStopsAndFreesTheDoctor) {
  KVGATE_REQUIRE_MODEL("qwen3");
  DoctorCluster c({{}, {.unhealthy = true}});
  {
    HttpClient impatient(c.admin_port);
    impatient.set_timeout(800ms);
    auto r = impatient.post("/v1/rules/default/doctor?settle=60", "");
    EXPECT_EQ(r.status, 0) << "the run outlasted the client's patience: " << r.body;
  }  // the connection closes here
  int status = 0;
  std::string body;
  EXPECT_TRUE(wait_until(
      [&] {
        HttpClient admin(c.admin_port);
        admin.set_timeout(120s);
        auto r = admin.post("/v1/rules/default/doctor?steps=1", "");
        status = r.status;
        body = r.body;
        return r.status != 409;
      },
      15s))
      << body;
  EXPECT_EQ(status, 200) << body;
}

TEST(Doctor, AnEndpointWithAnotherPageSizeFailsPoolHomogeneity) {
  KVGATE_REQUIRE_MODEL("qwen3");
  DoctorCluster c({{}, {.sim_args = {"--page-size", "32"}}});
  expect_fails_at(c.doctor(), 2, "same --page-size", "different page sizes");
}

TEST(Doctor, AnEndpointWithAnotherTokenizerFailsPoolHomogeneity) {
  KVGATE_REQUIRE_MODEL("qwen3");
  KVGATE_REQUIRE_MODEL("llama3");
  DoctorCluster c({{}, {.sim_args = {"--tokenizer-path", models_dir() + "/llama3"}}});
  expect_fails_at(c.doctor(), 2, "same tokenizer", "the tokenizers differ");
}

TEST(Doctor, ARuleTokenizerOtherThanTheEnginesFailsPoolHomogeneity) {
  KVGATE_REQUIRE_MODEL("qwen3");
  KVGATE_REQUIRE_MODEL("llama3");
  DoctorCluster c({{}, {}}, {{"tokenizerPath", models_dir() + "/llama3"}});
  expect_fails_at(c.doctor(), 2, "tokenizerPath", "kvgate's tokenizer");
}

TEST(Doctor, AWrongKvDpRankCountFailsPoolHomogeneity) {
  KVGATE_REQUIRE_MODEL("qwen3");
  DoctorCluster c({{}, {}}, {{"kvDpRankCount", "1"}});
  expect_fails_at(c.doctor(), 2, "set kvDpRankCount to 2");
}

TEST(Doctor, AClosedEventPortFailsTheEventPlane) {
  KVGATE_REQUIRE_MODEL("qwen3");
  DoctorCluster c({{}, {.no_events = true}});
  expect_fails_at(c.doctor(), 4, "--kv-events-config", "KV events are off");
}

TEST(Doctor, AWrongKvZmqPortFailsTheEventPlane) {
  KVGATE_REQUIRE_MODEL("qwen3");
  int wrong = free_ports(2);
  DoctorCluster c({{}, {.rule_port = std::to_string(wrong)}});
  expect_fails_at(c.doctor(), 4, "set kvZmqPort to", "kvZmqPort " + std::to_string(wrong));
}

TEST(Doctor, EventsInTheOtherEnginesShapeFailTheEventPlane) {
  KVGATE_REQUIRE_MODEL("qwen3");
  DoctorCluster c(
      {{.sim_args = {"--kv-events-format", "vllm"}}, {.sim_args = {"--kv-events-format", "vllm"}}});
  expect_fails_at(c.doctor(), 4, "set kvEngineType to vllm", "vLLM's shape");
}

// PUT ?verify=true: a change that keeps parity stays; one that breaks it (a kvBlockSize the
// engines do not use) is rolled back by the gateway itself, to the complete previous rule.
TEST(Doctor, VerifyKeepsAGoodChangeAndRollsBackABadOne) {
  KVGATE_REQUIRE_MODEL("qwen3");
  DoctorCluster c;
  HttpClient admin(c.admin_port);
  admin.set_timeout(120s);
  const Headers json = {{"content-type", "application/json"}};
  Json rule = Json::parse(admin.get("/v1/rules/default").body);
  ASSERT_EQ(rule["sel"], "round_robin");

  rule["sel"] = "chwbl";
  auto good = admin.request("PUT", "/v1/rules/default?verify=true&timeout=20", rule.dump(), json);
  ASSERT_EQ(good.status, 200) << good.body << c.gateway->log();
  Json g = Json::parse(good.body);
  EXPECT_TRUE(g["verified"].get<bool>()) << good.body;
  EXPECT_EQ(g["rule"]["sel"], "chwbl");
  EXPECT_EQ(g["report"]["steps"].size(), 3u) << good.body;  // steps 4-6
  EXPECT_EQ(Json::parse(admin.get("/v1/rules/default").body)["sel"], "chwbl");

  rule["kvBlockSize"] = 32;
  auto bad = admin.request("PUT", "/v1/rules/default?verify=true&timeout=10", rule.dump(), json);
  ASSERT_EQ(bad.status, 409) << bad.body << c.gateway->log();
  Json b = Json::parse(bad.body);
  EXPECT_FALSE(b["verified"].get<bool>());
  EXPECT_TRUE(b["rolled_back"].get<bool>()) << bad.body;
  EXPECT_EQ(b["error"]["code"], "rolled_back") << bad.body;
  EXPECT_NE(b["report"].dump().find("set kvBlockSize to 16"), std::string::npos) << bad.body;
  Json now = Json::parse(admin.get("/v1/rules/default").body);
  EXPECT_EQ(now["kvBlockSize"], 16) << now.dump();
  EXPECT_EQ(now["sel"], "chwbl") << "the version before the bad change, whole";
  EXPECT_EQ(now, b["in_force"]);
  Json history = Json::parse(admin.get("/v1/rules/default/history").body);
  EXPECT_EQ(history["versions"][0]["source"], "rollback") << history.dump();

  EXPECT_EQ(admin.request("PUT", "/v1/rules/default?verify=maybe", rule.dump(), json).status, 400);
  // verify needs kv_exact: refused before anything changes.
  Json plain = now;
  plain["kvExactMode"] = 0;
  auto refused = admin.request("PUT", "/v1/rules/default?verify=true", plain.dump(), json);
  EXPECT_EQ(refused.status, 400) << refused.body;
  EXPECT_NE(refused.body.find("kvExactMode 0"), std::string::npos) << refused.body;
  EXPECT_EQ(Json::parse(admin.get("/v1/rules/default").body), now);
}

TEST(Doctor, BadStepsAndUnknownRulesAreRefusedClearly) {
  KVGATE_REQUIRE_MODEL("qwen3");
  DoctorCluster c;
  HttpClient admin(c.admin_port);
  EXPECT_EQ(admin.post("/v1/rules/default/doctor?steps=0-9", "").status, 400);
  EXPECT_EQ(admin.post("/v1/rules/default/doctor?settle=abc", "").status, 400);
  EXPECT_EQ(admin.post("/v1/rules/nope/doctor", "").status, 404);
  EXPECT_EQ(admin.get("/v1/rules/default/doctor").status, 405);
  auto usage = run("kvgate", {"doctor"});
  EXPECT_EQ(usage.status, 2) << usage.output;
  EXPECT_NE(usage.output.find("either --admin-url"), std::string::npos) << usage.output;
  auto steps = run("kvgate", {"doctor", "--admin-url", "http://127.0.0.1:1", "--steps", "8"});
  EXPECT_EQ(steps.status, 2) << steps.output;
  EXPECT_NE(steps.output.find("--steps"), std::string::npos) << steps.output;
}

// The doctor's header pins a worker only with this process's key: while a doctor run holds the
// key armed, a client's guess is ignored (routed as any request, no debug headers).
TEST(Doctor, AGuessedDoctorKeyIsIgnoredWhileADoctorRuns) {
  KVGATE_REQUIRE_MODEL("qwen3");
  DoctorCluster c;
  std::atomic<bool> done{false};
  std::thread doctor([&] {
    HttpClient admin(c.admin_port);
    admin.set_timeout(120s);
    auto r = admin.post("/v1/rules/default/doctor?steps=1-6", "");
    EXPECT_EQ(r.status, 200) << r.body;
    done = true;
  });
  HttpClient client(c.port);
  int sent = 0;
  while (!done) {
    auto r = client.post(
        "/v1/chat/completions",
        R"({"messages":[{"role":"user","content":"hello"}],"max_tokens":1})",
        {{"x-kvgate-doctor", "00000000000000000000000000000000 pin=" + c.sims[0].url()}});
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.header("x-kvgate-worker"), "") << "debug headers only for the doctor";
    ++sent;
  }
  doctor.join();
  EXPECT_GT(sent, 10);
}

// A worker the gateway's health check holds unhealthy: it serves directly (step 1), but the
// gateway does not route to it (step 3 names the health check).
TEST(Doctor, AnUnhealthyWorkerFailsTheProxyPath) {
  KVGATE_REQUIRE_MODEL("qwen3");
  DoctorCluster c({{}, {.unhealthy = true}});
  auto report = c.doctor("?settle=2");
  expect_fails_at(report, 3, "health check marks", "unhealthy");
}

}  // namespace
}  // namespace kvgate::testing
