// Micro-benchmarks of the per-request hot path: body parsing, the rule table's resolve step,
// policy selection, breaker check and pass, the retry budget, a stream's first-event check, the
// relay's work per stream event (usage, output events, inter-token latency),
// metric cell lookup, JSON escaping, body rewrites, HTTP head parsing (kvgate's parser, and Beast's
// for reference), the decision log's record of each dispatch.
#include <benchmark/benchmark.h>

#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/parser.hpp>

#include "gateway/decision_log.h"
#include "gateway/errors.h"
#include "gateway/gateway_metrics.h"
#include "gateway/knobs.h"
#include "gateway/output_events.h"
#include "gateway/pools.h"
#include "gateway/retry.h"
#include "gateway/stream_check.h"
#include "gateway/usage_scanner.h"
#include "http/message.h"
#include "http/parser.h"
#include "policy/registry.h"
#include "request/body_rewrite.h"
#include "request/request_info.h"
#include "util/json.h"

namespace kvgate {
namespace {

std::string chat_body(size_t bytes) {
  std::string text;
  static const char* kWords[] = {"the ", "cache ", "router ", "sends ", "tokens ", "prefix "};
  for (size_t i = 0; text.size() < bytes; ++i) text += kWords[i % 6];
  std::string body =
      R"({"model":"qwen3","stream":true,"messages":[{"role":"system","content":"You are helpful."},{"role":"user","content":)" +
      json::quote(text) + R"(}],"max_tokens":256})";
  body.reserve(body.size() + http::kBodyPadding);
  return body;
}

void BM_ParseRequest(benchmark::State& state) {
  std::string body = chat_body(static_cast<size_t>(state.range(0)));
  RequestInfo info;
  for (auto _ : state) {
    auto err = parse_request(ApiRoute::kChatCompletions, body, info);
    benchmark::DoNotOptimize(err);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * body.size()));
}
BENCHMARK(BM_ParseRequest)->Arg(1024)->Arg(32L * 1024);

struct Workers {
  explicit Workers(int n) {
    for (int i = 0; i < n; ++i) {
      http::Target t;
      http::parse_url("http://10.0.0." + std::to_string(i + 1) + ":30000", t);
      owned.push_back(std::make_shared<Worker>(i + 1, t, breaker_config(GatewayConfig{})));
      ptrs.push_back(owned.back().get());
    }
  }
  std::vector<WorkerPtr> owned;
  std::vector<Worker*> ptrs;
};

void BM_PolicySelect(benchmark::State& state, const char* name) {
  Workers w(8);
  PolicyConfig c = policy_config(GatewayConfig{});
  c.name = name;
  std::string err;
  auto p = make_policy(c, err);
  RouteContext ctx;
  for (auto _ : state) benchmark::DoNotOptimize(p->select(w.ptrs, ctx));
}
BENCHMARK_CAPTURE(BM_PolicySelect, round_robin, "round_robin");
BENCHMARK_CAPTURE(BM_PolicySelect, random, "random");
BENCHMARK_CAPTURE(BM_PolicySelect, power_of_two, "power_of_two");

void BM_AvailabilityScan(benchmark::State& state) {
  Workers w(static_cast<int>(state.range(0)));
  std::vector<Worker*> out;
  for (auto& p : w.ptrs) p->set_healthy(true);
  for (auto _ : state) {
    out.clear();
    auto now = Clock::now();
    for (auto* p : w.ptrs) {
      if (p->available(now)) out.push_back(p);
    }
    benchmark::DoNotOptimize(out.data());
  }
}
BENCHMARK(BM_AvailabilityScan)->Arg(8)->Arg(64);

void BM_MetricCellLookup(benchmark::State& state) {
  metrics::Registry r;
  GatewayMetrics m(r, metrics::latency_buckets());
  for (auto _ : state) {
    m.requests.with({"/v1/chat/completions", "200", "qwen3", "true"}).inc();
  }
}
BENCHMARK(BM_MetricCellLookup)->Threads(1)->Threads(2);

void BM_ErrorBody(benchmark::State& state) {
  auto e = errors::upstream_unreachable(5);
  for (auto _ : state) benchmark::DoNotOptimize(error_body(e));
}
BENCHMARK(BM_ErrorBody);

// What each dispatch pays the breaker: a pass and its outcome (closed: atomics only).
void BM_BreakerPassAndOutcome(benchmark::State& state) {
  CircuitBreaker b(breaker_config(GatewayConfig{}));
  auto now = std::chrono::steady_clock::now();
  for (auto _ : state) {
    auto pass = b.admit(now);
    benchmark::DoNotOptimize(b.record_success(pass));
  }
}
BENCHMARK(BM_BreakerPassAndOutcome)->Threads(1)->Threads(2);

// Every proxied request counts itself in and out of the retry budget's base.
void BM_RetryBudget(benchmark::State& state) {
  static RetryBudget budget(retry_config(GatewayConfig{}));
  for (auto _ : state) {
    budget.request_started();
    if (budget.try_acquire()) budget.release();
    budget.request_ended();
  }
}
BENCHMARK(BM_RetryBudget)->Threads(1)->Threads(2);

// A stream's first event, checked for an abort before the client sees it (once per stream).
void BM_FirstEventCheck(benchmark::State& state) {
  std::string chunk =
      R"(data: {"id":"3f2a9c1e5b7d4e6f8a0b1c2d3e4f5a6b","object":"chat.completion.chunk",)"
      R"("created":1796264910,"model":"qwen3","choices":[{"index":0,"delta":{"role":)"
      R"("assistant","content":""},"logprobs":null,"finish_reason":null}]})"
      "\n\n";
  for (auto _ : state) {
    auto end = first_event_end(chunk);
    benchmark::DoNotOptimize(event_abort(std::string_view(chunk).substr(0, *end)));
  }
}
BENCHMARK(BM_FirstEventCheck);

// The relay's work per piece of a stream (one SSE event per read, as SGLang writes each token):
// arg 0 the usage scan alone (what a pool whose policy wants usage paid before the request
// signals), arg 1 what every stream pays now: the usage scan, the output-event scan, a clock read
// and an inter-token observation.
void BM_RelayStreamEvent(benchmark::State& state) {
  const std::string event =
      R"(data: {"id":"3f2a9c1e5b7d4e6f8a0b1c2d3e4f5a6b","object":"chat.completion.chunk",)"
      R"("created":1796264910,"model":"qwen3","choices":[{"index":0,"delta":{"content":)"
      R"(" cache"},"logprobs":null,"finish_reason":null,"matched_stop":null}],"usage":null})"
      "\n\n";
  metrics::Registry r;
  GatewayMetrics m(r, metrics::latency_buckets());
  SignalCells cells = m.signal_cells("default", "http://127.0.0.1:30001", "");
  const bool signals = state.range(0) == 1;
  UsageScanner usage;
  OutputEventCounter events;
  auto last = Clock::now();
  for (auto _ : state) {
    usage.feed(event);
    if (signals) {
      uint32_t n = events.feed(event);
      auto now = Clock::now();
      if (n > 0) {
        cells.itl->observe(std::chrono::duration<double>(now - last).count());
        cells.itl->observe_n(0, n - 1);
        last = now;
      }
    }
  }
  benchmark::DoNotOptimize(usage.completion_tokens());
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * event.size()));
}
BENCHMARK(BM_RelayStreamEvent)->Arg(0)->Arg(1);

// The same for the output-event scan alone, on the chunk shapes it meets.
void BM_OutputEventScan(benchmark::State& state, const std::string& event) {
  OutputEventCounter events;
  for (auto _ : state) benchmark::DoNotOptimize(events.feed(event));
}
// A /v1/responses stream's text delta (SGLang's shape), through the Responses format's scan.
void BM_OutputEventScanResponses(benchmark::State& state) {
  const std::string event =
      "event: response.output_text.delta\n"
      R"(data: {"type":"response.output_text.delta","sequence_number":7,"item_id":)"
      R"("msg_3f2a9c1e5b7d4e6f8a0b1c2d3e4f5a6b","output_index":0,"content_index":0,)"
      R"("delta":" cache","logprobs":[]})"
      "\n\n";
  OutputEventCounter events(OutputEventCounter::Format::kResponses);
  if (events.feed(event) != 1) state.SkipWithError("the event is not one output event");
  for (auto _ : state) benchmark::DoNotOptimize(events.feed(event));
}
BENCHMARK(BM_OutputEventScanResponses);
BENCHMARK_CAPTURE(BM_OutputEventScan, chat_content,
                  std::string(R"(data: {"id":"3f2a9c1e5b7d4e6f8a0b1c2d3e4f5a6b","object":)"
                              R"("chat.completion.chunk","created":1796264910,"model":"qwen3",)"
                              R"("choices":[{"index":0,"delta":{"content":" cache"},)"
                              R"("logprobs":null,"finish_reason":null}],"usage":null})"
                              "\n\n"));
BENCHMARK_CAPTURE(BM_OutputEventScan, generate,
                  std::string(R"(data: {"text":"The cache router sends tokens","output_ids":)"
                              R"([791,6636,9457,22014,11460],"meta_info":{"id":"a1","finish_)"
                              R"(reason":null,"prompt_tokens":48,"completion_tokens":5,)"
                              R"("cached_tokens":32}})"
                              "\n\n"));

void BM_JsonQuote(benchmark::State& state) {
  std::string s(4096, 'a');
  for (size_t i = 0; i < s.size(); i += 37) s[i] = '"';
  std::string out;
  for (auto _ : state) {
    out.clear();
    json::append_string(out, s);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * s.size()));
}
BENCHMARK(BM_JsonQuote);

// The resolve step of every request: the rule table's snapshot, the rule that takes it, the pool
// pinned (reference counts). Arg: rules in the table (each naming one model, plus a catch-all).
void BM_ResolvePool(benchmark::State& state) {
  GatewayConfig cfg;
  metrics::Registry registry;
  GatewayMetrics metrics(registry, metrics::latency_buckets());
  asio::io_context control;
  std::atomic<uint64_t> next_id{1};
  PoolEnv env;
  env.config = &cfg;
  env.metrics = &metrics;
  env.registry = &registry;
  env.control = &control;
  env.next_worker_id = &next_id;
  PoolManager pools(env);
  std::vector<rules::Rule> rules;
  for (int64_t i = 0; i < state.range(0); ++i) {
    rules::Rule r;
    r.name = "r" + std::to_string(i);
    r.mode = 4;
    r.sel = "round_robin";
    if (i + 1 < state.range(0)) r.models = {"model-" + std::to_string(i)};
    r.endpoints.push_back({.url = "http://127.0.0.1:" + std::to_string(20000 + i)});
    rules.push_back(std::move(r));
  }
  if (!pools.apply(rules).empty()) {
    state.SkipWithError("rules did not apply");
    return;
  }
  std::string model = "model-" + std::to_string(state.range(0) / 2);
  for (auto _ : state) {
    auto table = pools.table();
    auto pool = table->resolve(30000, "/v1/chat/completions", model);
    benchmark::DoNotOptimize(pool.get());
  }
  pools.shutdown();
}
BENCHMARK(BM_ResolvePool)->Arg(1)->Arg(8)->Arg(64)->ThreadRange(1, 2)->UseRealTime();

// routed_dp_rank appended to a 4 KB chat body (a copy of the body: what a rewrite costs).
void BM_BodyRewrite(benchmark::State& state) {
  std::string body = chat_body(4096);
  const BodyField rank{"routed_dp_rank", "3"};
  for (auto _ : state) benchmark::DoNotOptimize(add_fields(body, {&rank, 1}));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * body.size()));
}
BENCHMARK(BM_BodyRewrite);

// What an OpenAI SDK client sends (python httpx), and what an SGLang worker (uvicorn) answers a
// non-streamed chat with; the request is as kvgate forwards it too.
constexpr std::string_view kRequestHead =
    "POST /v1/chat/completions HTTP/1.1\r\n"
    "Host: gateway.internal:30000\r\n"
    "Accept-Encoding: gzip, deflate\r\n"
    "Connection: keep-alive\r\n"
    "Accept: application/json\r\n"
    "Content-Type: application/json\r\n"
    "User-Agent: OpenAI/Python 1.54.3\r\n"
    "X-Stainless-Lang: python\r\n"
    "X-Stainless-Package-Version: 1.54.3\r\n"
    "X-Stainless-OS: Linux\r\n"
    "X-Stainless-Arch: x64\r\n"
    "X-Stainless-Runtime: CPython\r\n"
    "X-Stainless-Runtime-Version: 3.11.9\r\n"
    "Authorization: Bearer sk-0123456789abcdef0123456789abcdef0123456789abcdef\r\n"
    "X-Stainless-Async: false\r\n"
    "x-stainless-retry-count: 0\r\n"
    "Content-Length: 1024\r\n"
    "\r\n";
constexpr std::string_view kResponseHead =
    "HTTP/1.1 200 OK\r\n"
    "date: Tue, 04 Mar 2025 10:00:00 GMT\r\n"
    "server: uvicorn\r\n"
    "content-length: 742\r\n"
    "content-type: application/json\r\n"
    "x-request-id: 7f3c2a1e-5b6d-4c8e-9f0a-1b2c3d4e5f60\r\n"
    "\r\n";

void BM_ParseRequestHead(benchmark::State& state) {
  http::HeadParser p(http::HeadParser::Kind::kRequest);
  for (auto _ : state) {
    p.reset();
    auto st = p.parse(kRequestHead.data(), kRequestHead.size(), 65536);
    benchmark::DoNotOptimize(st);
    benchmark::DoNotOptimize(p.find("authorization"));
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kRequestHead.size()));
}
BENCHMARK(BM_ParseRequestHead);

void BM_ParseResponseHead(benchmark::State& state) {
  http::HeadParser p(http::HeadParser::Kind::kResponse);
  for (auto _ : state) {
    p.reset();
    auto st = p.parse(kResponseHead.data(), kResponseHead.size(), 65536);
    benchmark::DoNotOptimize(st);
    benchmark::DoNotOptimize(p.find("content-type"));
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kResponseHead.size()));
}
BENCHMARK(BM_ParseResponseHead);

// The same heads through Beast's parser (what kvgate ran before its own): a parser and its
// field allocations per message, as the server and client made them.
template <bool kRequest>
void BM_BeastParseHead(benchmark::State& state, std::string_view head) {
  namespace bhttp = boost::beast::http;
  for (auto _ : state) {
    bhttp::parser<kRequest, bhttp::empty_body> p;
    p.header_limit(65536);
    boost::beast::error_code ec;
    p.put(boost::asio::buffer(head.data(), head.size()), ec);
    benchmark::DoNotOptimize(ec);
    benchmark::DoNotOptimize(p.get()[kRequest ? "authorization" : "content-type"]);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * head.size()));
}
void BM_BeastParseRequestHead(benchmark::State& state) {
  BM_BeastParseHead<true>(state, kRequestHead);
}
void BM_BeastParseResponseHead(benchmark::State& state) {
  BM_BeastParseHead<false>(state, kResponseHead);
}
BENCHMARK(BM_BeastParseRequestHead);
BENCHMARK(BM_BeastParseResponseHead);

// What each dispatch adds to the decision log when it closes (the dashboard's "last decisions"):
// a record with the strings a request carries (rid, rule, worker URL) copied under the log's
// mutex. Threads(2): two request threads recording at once.
void BM_DecisionLogAdd(benchmark::State& state) {
  static DecisionLog log;
  for (auto _ : state) {
    DecisionRecord r;
    r.time = std::chrono::system_clock::now();
    r.rid = "8e19a18626209cdbba3a40d6815853ea";
    r.rule = "default";
    r.worker = "http://10.0.0.17:30000";
    r.route = "/v1/chat/completions";
    r.policy = "kv_exact";
    r.branch = "kv_exact_hit";
    r.rank = 1;
    r.page_size = 16;
    r.predicted_tokens = 192;
    r.request_tokens = 330;
    r.prompt_tokens = 330;
    r.cached_tokens = 192;
    r.status = 200;
    log.add(std::move(r));
  }
}
BENCHMARK(BM_DecisionLogAdd)->Threads(1)->Threads(2)->UseRealTime();

}  // namespace
}  // namespace kvgate
