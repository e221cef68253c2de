// Integration: the metrics as their consumers see them. A real Prometheus (Debian's) scrapes
// kvgate and answers a query of the time-to-first-token histogram; docs/metrics.md lists exactly
// the families and label sets kvgate exports (with --metrics-compat smg, every policy family and
// traffic on every path); every query of the Grafana dashboard (examples/grafana) runs on that
// Prometheus over documented series; the request's trace id is in kvgate's log lines.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string_view>

#include "support/cluster.h"
#include "support/http_client.h"
#include "support/models.h"
#include "support/process.h"
#include "support/temp_dir.h"

namespace kvgate::testing {
namespace {

using namespace std::chrono_literals;

const std::vector<std::string> kFast = {"--ttft-ms", "1", "--tpot-ms", "1"};
const char* kStreamChat =
    R"({"messages":[{"role":"user","content":"Hello there"}],"max_tokens":8,"stream":true,)"
    R"("stream_options":{"include_usage":true}})";

std::string url_encode(const std::string& s) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

struct Family {
  std::string type;
  std::set<std::string> labels;
  bool seen_labels = false;  // a sample gave its labels
};

// The tables of docs/metrics.md: rows "| `name` | type | `a`, `b` | ... |".
std::map<std::string, Family> documented() {
  std::ifstream in(std::string(KVGATE_SOURCE_DIR) + "/docs/metrics.md");
  std::map<std::string, Family> out;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.starts_with("| `kvgate_") && !line.starts_with("| `smg_")) continue;
    std::vector<std::string> cells;
    std::stringstream row(line.substr(1));
    for (std::string cell; std::getline(row, cell, '|');) cells.push_back(cell);
    if (cells.size() < 4) continue;
    auto strip = [](const std::string& s) {
      std::string r;
      for (char ch : s) {
        if (ch != '`' && ch != ' ') r.push_back(ch);
      }
      return r;
    };
    Family f;
    f.type = strip(cells[1]);
    std::stringstream labels(cells[2]);
    for (std::string l; std::getline(labels, l, ',');) {
      if (!strip(l).empty()) f.labels.insert(strip(l));
    }
    out[strip(cells[0])] = f;
  }
  return out;
}

// The PromQL of every panel of examples/grafana/kvgate-dashboard.json (rows' panels included),
// its variables replaced as Grafana would with "All" selected.
std::vector<std::string> grafana_queries() {
  std::ifstream in(std::string(KVGATE_SOURCE_DIR) + "/examples/grafana/kvgate-dashboard.json");
  auto dash = nlohmann::json::parse(in, nullptr, false);
  std::vector<std::string> out;
  if (dash.is_discarded()) return out;
  std::function<void(const nlohmann::json&)> walk = [&](const nlohmann::json& panel) {
    for (const auto& t : panel.value("targets", nlohmann::json::array())) {
      std::string expr = t.value("expr", "");
      expr = std::regex_replace(expr, std::regex(R"(\$__rate_interval)"), "1m");
      expr = std::regex_replace(expr, std::regex(R"(\$\{?(rule|worker|policy)\}?)"), ".*");
      if (!expr.empty()) out.push_back(expr);
    }
    for (const auto& p : panel.value("panels", nlohmann::json::array())) walk(p);
  };
  for (const auto& p : dash.value("panels", nlohmann::json::array())) walk(p);
  return out;
}

// Debian's Prometheus on a loopback port, scraping `targets` every second, its data in `dir`.
struct Prometheus {
  Prometheus(const TempDir& dir, const std::vector<int>& targets) : port(free_port()) {
    std::string yaml =
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: kvgate\n    static_configs:\n      - targets: [";
    for (size_t i = 0; i < targets.size(); ++i) {
      yaml += (i ? ", " : "") + std::string("'127.0.0.1:") + std::to_string(targets[i]) + "'";
    }
    yaml += "]\n";
    std::string config = dir.write("prometheus.yml", yaml);
    process = std::make_unique<Process>(
        "/usr/bin/prometheus",
        std::vector<std::string>{"--config.file=" + config, "--storage.tsdb.path=" + dir / "tsdb",
                                 "--web.listen-address=127.0.0.1:" + std::to_string(port)});
  }
  // The JSON answer of an instant query ("" when Prometheus does not answer yet).
  std::string query(const std::string& promql) {
    HttpClient c(port);
    auto r = c.get("/api/v1/query?query=" + url_encode(promql));
    return r.status == 200 ? r.body : "";
  }
  int port;
  std::unique_ptr<Process> process;
};

TEST(Metrics, PrometheusScrapesTheTimeToFirstTokenHistogram) {
  Cluster c(2, kFast, {"--policy", "round_robin"});
  TempDir dir;
  Prometheus prom(dir, {c.metrics_port()});
  // Ready when it answers a query at all.
  ASSERT_TRUE(wait_until([&] { return !prom.query("up").empty(); }, 30s)) << prom.process->log();
  const std::string promql =
      "histogram_quantile(0.5, sum by (le) (rate(kvgate_time_to_first_token_seconds_bucket[1m])))";
  HttpClient client(c.port());
  std::string answer;
  // rate() needs two scrapes with traffic between them: streams go on until the query has a
  // value (bounded: about 2 s of scrapes are needed; 60 s is the failure).
  bool answered = wait_until(
      [&] {
        auto r = client.post("/v1/chat/completions", kStreamChat);
        EXPECT_EQ(r.status, 200) << r.body;
        answer = prom.query(promql);
        return answer.find("\"result\":[{") != std::string::npos &&
               answer.find("NaN") == std::string::npos;
      },
      60s);
  ASSERT_TRUE(answered) << answer << "\n" << prom.process->log();
  EXPECT_NE(answer.find("\"status\":\"success\""), std::string::npos) << answer;
  // The per-worker split has both workers (round_robin sent streams to each).
  std::string per_worker;
  EXPECT_TRUE(wait_until(
      [&] {
        per_worker =
            prom.query("count(sum by (worker) (kvgate_time_to_first_token_seconds_count))");
        return per_worker.find("\"2\"]") != std::string::npos;
      },
      30s))
      << per_worker;

  // The Grafana dashboard: every query is valid PromQL over series docs/metrics.md documents, and
  // Prometheus runs it; the overview's have values here.
  const auto queries = grafana_queries();
  ASSERT_GE(queries.size(), 20u) << "examples/grafana/kvgate-dashboard.json was not read";
  const auto doc = documented();
  const std::regex name(R"(\b(kvgate_[a-z0-9_]+))");
  for (const auto& q : queries) {
    for (std::sregex_iterator it(q.begin(), q.end(), name), end; it != end; ++it) {
      std::string series = (*it)[1];
      for (const char* suffix : {"_bucket", "_sum", "_count"}) {
        std::string base = series.substr(0, series.size() - std::string_view(suffix).size());
        if (series.ends_with(suffix) && doc.contains(base) && doc.at(base).type == "histogram") {
          series = base;
        }
      }
      EXPECT_TRUE(doc.contains(series))
          << series << " (Grafana: " << q << ") is not in docs/metrics.md";
    }
    std::string answer = prom.query(q);
    EXPECT_NE(answer.find("\"status\":\"success\""), std::string::npos) << q << "\n" << answer;
  }
  for (const std::string q :
       {R"(sum(rate(kvgate_requests_total{route!~"/health|/liveness|/readiness"}[1m])))",
        "max by (worker) (kvgate_worker_health{worker=~\".*\"})"}) {
    EXPECT_NE(std::find(queries.begin(), queries.end(), q), queries.end()) << q;
    EXPECT_NE(prom.query(q).find("\"result\":[{"), std::string::npos) << q;
  }
}

// ---------------------------------------------------------------------------------------------
// docs/metrics.md against the exposition.

// Families (# TYPE) and the label names of their samples.
void add_exposition(const std::string& text, std::map<std::string, Family>& out) {
  std::stringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.starts_with("# TYPE ")) {
      std::stringstream parts(line.substr(7));
      std::string name, type;
      parts >> name >> type;
      out[name].type = type;
      continue;
    }
    if (line.empty() || line[0] == '#') continue;
    size_t brace = line.find('{');
    size_t space = line.find(' ');
    std::string sample = line.substr(0, std::min(brace, space));
    std::string name = sample;
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      if (!out.contains(name) && sample.ends_with(suffix)) {
        name = sample.substr(0, sample.size() - std::string(suffix).size());
      }
    }
    std::set<std::string> labels;
    if (brace != std::string::npos && brace < space) {
      // name{a="x",b="y\"z"} value
      size_t i = brace + 1;
      while (i < line.size() && line[i] != '}') {
        size_t eq = line.find('=', i);
        labels.insert(line.substr(i, eq - i));
        i = eq + 2;  // past ="
        while (i < line.size() && line[i] != '"') i += line[i] == '\\' ? 2 : 1;
        ++i;  // past the closing quote
        if (i < line.size() && line[i] == ',') ++i;
      }
    }
    labels.erase("le");
    Family& f = out[name];
    if (f.seen_labels && f.labels != labels) {
      ADD_FAILURE() << name << " has samples with different label sets: " << line;
    }
    f.labels = labels;
    f.seen_labels = true;
  }
}

std::string join(const std::set<std::string>& s) {
  std::string out;
  for (const auto& x : s) out += (out.empty() ? "" : ", ") + x;
  return out;
}

// One kvgate with every kind of policy (and so every policy's families): a kv_exact rule over a
// server publishing KV events (with a tokenizer: the piece cache's families), a cache_aware rule
// with dpAware over a server with two ranks, a round_robin rule whose first server refuses with
// 503 (retries), and a manual catch-all; --metrics-compat smg, a concurrency limit (the admission
// queue histogram), streamed and whole answers on each. The exposition's families and label sets
// must be docs/metrics.md's tables, both ways.
TEST(Metrics, DocumentedSeriesAreTheExposedOnes) {
  KVGATE_REQUIRE_MODEL("qwen3");
  const std::string tokenizer = models_dir() + "/qwen3";
  TempDir dir;
  Sim kv, ranks, flaky;
  kv.port = free_port();
  const int events = free_ports(1);
  kv.args = {
      "--page-size",
      "16",
      "--tokenizer-path",
      tokenizer,
      "--enable-cache-report",
      "--time-scale",
      "0",
      "--kv-events-config",
      R"({"publisher":"zmq","endpoint":"tcp://*:)" + std::to_string(events) + R"(","topic":""})"};
  ranks.port = free_port();
  ranks.args = {"--dp-size", "2", "--enable-cache-report", "--ttft-ms", "1", "--tpot-ms", "1"};
  flaky.port = free_port();
  flaky.args = {"--fail-rate", "1", "--fail-status", "503", "--ttft-ms", "1"};
  kv.start();
  ranks.start();
  flaky.start();
  const std::string yaml =
      "rules:\n"
      "  - name: kv\n    models: [kv]\n    mode: 4\n    sel: round_robin\n"
      "    kvEngineType: sglang\n    kvExactMode: 3\n    kvBlockSize: 16\n    kvWarmupSec: 0\n"
      "    tokenizerPath: " +
      tokenizer + "\n    endpoints:\n      - url: " + kv.url() +
      "\n        kvZmqPort: " + std::to_string(events) +
      "\n"
      "  - name: ca\n    models: [ca]\n    mode: 4\n    sel: cache_aware\n    dpAware: true\n"
      "    endpoints: [" +
      ranks.url() +
      "]\n"
      "  - name: rr\n    models: [rr]\n    mode: 4\n    sel: round_robin\n"
      "    endpoints: [" +
      flaky.url() + ", " + ranks.url() +
      "]\n"
      "  - name: man\n    mode: 4\n    sel: manual\n    endpoints: [" +
      ranks.url() + "]\n";
  const std::string config = dir.write("kvgate.yaml", yaml);
  const int port = free_port(), metrics_port = free_port(), admin_port = free_port();
  Process gateway("kvgate",
                  {"--config", config, "--host", "127.0.0.1", "--port", std::to_string(port),
                   "--prometheus-host", "127.0.0.1", "--prometheus-port",
                   std::to_string(metrics_port), "--admin-port", std::to_string(admin_port),
                   "--metrics-compat", "smg", "--max-concurrent-requests", "8",
                   "--health-check-interval-secs", "1", "--retry-initial-backoff-ms", "1",
                   // (no NATS nor etcd there: the replica series exist all the same)
                   "--replica-sync", "nats://127.0.0.1:" + std::to_string(free_port()),
                   "--replica-registry", "etcd://127.0.0.1:" + std::to_string(free_port())});
  auto scrape = [&] {
    HttpClient m(metrics_port);
    auto r = m.get("/metrics");
    return r.status == 200 ? r.body : std::string();
  };
  // Ready: every server healthy (the dpAware rule knows its ranks once /server_info answered).
  ASSERT_TRUE(wait_until(
      [&] {
        HttpClient c(port);
        return c.get("/readiness").body.find("\"healthy_workers\":5") != std::string::npos;
      },
      30s))
      << gateway.log();
  HttpClient client(port);
  auto chat = [](const std::string& model, bool stream) {
    return R"({"model":")" + model +
           R"(","messages":[{"role":"user","content":"Tell me about caches"}],"max_tokens":4,)"
           R"("stream":)" +
           (stream ? "true" : "false") + "}";
  };
  for (const std::string model : {"kv", "ca", "rr", "rr", "whatever"}) {
    for (bool stream : {false, true}) {
      auto r = client.post("/v1/chat/completions", chat(model, stream),
                           {{"X-SMG-Routing-Key", "user-1"}});
      EXPECT_EQ(r.status, 200) << model << " " << r.body << gateway.log();
    }
  }
  client.get("/nope");
  // Wait for what is counted off the request path: the kv_exact events, the requests' counts.
  std::string text;
  ASSERT_TRUE(wait_until(
      [&] {
        text = scrape();
        return text.find("kvgate_kv_events_total{") != std::string::npos &&
               text.find("smg_worker_retries_total{") != std::string::npos &&
               text.find("kvgate_requests_total{route=\"unknown\"") != std::string::npos;
      },
      30s))
      << text << gateway.log();

  std::map<std::string, Family> exposed;
  add_exposition(text, exposed);
  const std::map<std::string, Family> doc = documented();
  ASSERT_GT(doc.size(), 50u) << "the tables of docs/metrics.md were not read";
  for (const auto& [name, f] : exposed) {
    auto it = doc.find(name);
    if (it == doc.end()) {
      ADD_FAILURE() << name << " (" << f.type << ", labels: " << join(f.labels)
                    << ") is exported but has no row in docs/metrics.md";
      continue;
    }
    EXPECT_EQ(it->second.type, f.type) << name;
    if (f.seen_labels) {
      EXPECT_EQ(join(it->second.labels), join(f.labels)) << name << ": docs/metrics.md's labels";
    }
  }
  for (const auto& [name, f] : doc) {
    EXPECT_TRUE(exposed.contains(name))
        << "docs/metrics.md has a row for " << name << ", which kvgate does not export";
  }
  // The new request signals and the smg series have samples here (their labels were compared).
  for (const char* name :
       {"kvgate_time_to_first_token_seconds", "kvgate_inter_token_latency_seconds",
        "kvgate_time_to_response_headers_seconds", "kvgate_time_to_first_byte_seconds",
        "kvgate_e2e_request_duration_seconds", "kvgate_upstream_connect_seconds",
        "kvgate_admission_queue_seconds", "kvgate_prompt_tokens_total",
        "kvgate_cached_tokens_total", "kvgate_generated_tokens_total", "smg_http_requests_total",
        "smg_router_requests_total", "smg_worker_requests_active", "smg_worker_health",
        "smg_worker_cb_state", "smg_worker_retries_total", "smg_worker_selection_total",
        "smg_cache_aware_policy_branch_total"}) {
    EXPECT_TRUE(exposed[name].seen_labels) << name << " has no sample\n" << text;
  }
  // The dpAware rule's signals carry the rank its decision named.
  EXPECT_NE(text.find("kvgate_time_to_first_token_seconds_count{rule=\"ca\",worker=\"" +
                      ranks.url() + "\",rank=\""),
            std::string::npos);
  EXPECT_EQ(text.find("kvgate_time_to_first_token_seconds_count{rule=\"ca\",worker=\"" +
                      ranks.url() + "\",rank=\"\"}"),
            std::string::npos)
      << "a dpAware decision names its rank";
  auto r = run("/usr/bin/promtool", {"check", "metrics"}, text);
  EXPECT_EQ(r.status, 0) << r.output;
}

// The trace id of a request is on each of its log lines: the warning of the attempt that failed,
// and (debug) the gateway's refusal that followed it.
TEST(Metrics, TraceIdIsInTheRequestsLogLines) {
  Cluster c(1, kFast, {"--policy", "round_robin", "--disable-retries", "--log-level", "debug"});
  c.sim(0).kill();
  HttpClient client(c.port());
  const std::string trace = "0af7651916cd43dd8448eb211c80319c";
  auto r = client.post("/generate", R"({"text":"hi","sampling_params":{"max_new_tokens":2}})",
                       {{"traceparent", "00-" + trace + "-b7ad6b7169203331-01"}});
  EXPECT_GE(r.status, 500);
  auto line_has_trace = [&](std::string_view msg) {
    const std::string log = c.gateway().log();
    for (size_t pos = 0; pos < log.size();) {
      size_t end = std::min(log.find('\n', pos), log.size());
      std::string_view line = std::string_view(log).substr(pos, end - pos);
      if (line.find(msg) != std::string_view::npos &&
          line.find("trace_id=" + trace) != std::string_view::npos) {
        return true;
      }
      pos = end + 1;
    }
    return false;
  };
  EXPECT_TRUE(wait_until([&] {
    return line_has_trace("msg=\"upstream attempt failed\"") &&
           line_has_trace("msg=\"request refused\"");
  })) << c.gateway().log();
}

}  // namespace
}  // namespace kvgate::testing
