// Micro-benchmarks of kvgate-sim's engine: what the simulator itself costs, so it is never the
// bottleneck of a routing benchmark. The radix cache serving a shared-prefix workload, KV event
// encoding/decoding and publishing over ZeroMQ, and the continuous-batching scheduler running
// 1,000 concurrent simulated requests on one core (BatchCore driven without sleeping).
#include <benchmark/benchmark.h>
#include <zmq.h>

#include <atomic>
#include <numeric>
#include <thread>

#include "kv/events.h"
#include "kv/publisher.h"
#include "sim/batch_scheduler.h"
#include "sim/kv_events.h"
#include "sim/pseudo_text.h"
#include "sim/sim_metrics.h"
#include "sim/tokenizer.h"
#include "util/random.h"

namespace kvgate::sim {
namespace {

// The SGLang router benchmark's shape: groups sharing a long system prompt, then a unique question.
struct Workload {
  Workload(int groups, int prefix, int question, uint64_t seed) : rng(seed) {
    for (int g = 0; g < groups; ++g) {
      std::vector<int32_t> p(static_cast<size_t>(prefix));
      for (auto& t : p) t = static_cast<int32_t>(rng.below(150000));
      prefixes.push_back(std::move(p));
    }
    question_len = question;
  }
  std::vector<int32_t> next() {
    std::vector<int32_t> p = prefixes[rng.below(prefixes.size())];
    for (int i = 0; i < question_len; ++i) p.push_back(static_cast<int32_t>(rng.below(150000)));
    return p;
  }
  Rng rng;
  std::vector<std::vector<int32_t>> prefixes;
  int question_len;
};

// One request through the cache as the scheduler drives it: match, prefill, insert the prompt,
// 64 decode tokens, insert prompt + output. Events on (SGLang hashing), capacity forces eviction.
void BM_RadixCacheServe(benchmark::State& state) {
  const auto page = state.range(0);
  RadixCache cache(RadixCacheConfig{.page_size = page, .capacity = 300000, .events = true});
  Workload w(64, 1024, 128, 1);
  Rng rng(2);
  uint64_t events = 0, hits = 0, prompt = 0;
  for (auto _ : state) {
    auto tokens = w.next();
    const auto n = static_cast<int64_t>(tokens.size());
    auto h = cache.acquire(std::span<const int32_t>(tokens).first(static_cast<size_t>(n - 1)));
    hits += static_cast<uint64_t>(h.tree_len);
    prompt += static_cast<uint64_t>(n);
    cache.allocate(h, n - h.tree_len);
    cache.commit(h, tokens);
    for (int i = 0; i < 64; ++i) tokens.push_back(static_cast<int32_t>(rng.below(150000)));
    cache.allocate(h, 63);
    cache.release(h, tokens, true);
    events += cache.take_events().size();
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["events/req"] =
      benchmark::Counter(static_cast<double>(events) / static_cast<double>(state.iterations()));
  state.counters["hit_rate"] = static_cast<double>(hits) / static_cast<double>(prompt);
}
BENCHMARK(BM_RadixCacheServe)->Arg(1)->Arg(16);

kv::EventBatch sample_batch(int events, int page) {
  kv::EventBatch b;
  b.ts = 1767225600.5;
  b.dp_rank = 0;
  kv::BlockHasher hasher(kv::HashScheme::kSglang);
  kv::Digest prev{};
  for (int i = 0; i < events; ++i) {
    kv::BlockStored s;
    std::vector<int32_t> tokens(static_cast<size_t>(page));
    std::iota(tokens.begin(), tokens.end(), i * page);
    auto d = hasher.page(i ? &prev : nullptr, tokens);
    s.block_hashes = {hasher.id(d)};
    if (i) s.parent_block_hash = hasher.id(prev);
    s.token_ids = tokens;
    s.block_size = page;
    s.medium = kv::Medium::kGpu;
    b.events.emplace_back(std::move(s));
    prev = d;
  }
  return b;
}

void BM_EncodeBatch(benchmark::State& state) {
  auto b = sample_batch(64, 16);
  const auto f = state.range(0) == 0 ? kv::WireFormat::kSglang : kv::WireFormat::kVllm;
  std::string out;
  for (auto _ : state) {
    out.clear();
    kv::encode_batch(b, f, out);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * 64);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * out.size()));
  state.SetLabel(f == kv::WireFormat::kSglang ? "sglang, 64 events/batch" : "vllm, 64 events");
}
BENCHMARK(BM_EncodeBatch)->Arg(0)->Arg(1);

void BM_DecodeBatch(benchmark::State& state) {
  auto b = sample_batch(64, 16);
  const auto f = state.range(0) == 0 ? kv::WireFormat::kSglang : kv::WireFormat::kVllm;
  std::string payload;
  kv::encode_batch(b, f, payload);
  kv::EventBatch out;
  for (auto _ : state) {
    auto st = kv::decode_batch(payload, out);
    benchmark::DoNotOptimize(st);
  }
  state.SetItemsProcessed(state.iterations() * 64);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * payload.size()));
  state.SetLabel(f == kv::WireFormat::kSglang ? "sglang" : "vllm");
}
BENCHMARK(BM_DecodeBatch)->Arg(0)->Arg(1);

// Publishing batches of 8 events (a typical step) over TCP to a subscriber draining them on
// another thread. Process CPU time: the sim's thread, ZeroMQ's I/O thread and the subscriber.
void BM_PublishEvents(benchmark::State& state) {
  static int port = 47000;
  ++port;
  std::string err;
  std::vector<std::unique_ptr<RankEventSink>> sinks;
  KvEventsSettings s;
  s.publisher = "zmq";
  s.endpoint = "tcp://*:" + std::to_string(port);
  if (auto e = open_rank_sinks(s, 1, kv::WireFormat::kSglang, sinks); !e.empty()) {
    state.SkipWithError(e.c_str());
    return;
  }
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> received{0};
  std::thread sub([&] {
    void* ctx = zmq_ctx_new();
    void* sock = zmq_socket(ctx, ZMQ_SUB);
    zmq_setsockopt(sock, ZMQ_SUBSCRIBE, "", 0);
    int timeout = 50;
    zmq_setsockopt(sock, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
    std::string ep = "tcp://127.0.0.1:" + std::to_string(port);
    zmq_connect(sock, ep.c_str());
    char buf[8192];
    while (!stop.load()) {
      if (zmq_recv(sock, buf, sizeof buf, 0) >= 0) received.fetch_add(1);
    }
    zmq_close(sock);
    zmq_ctx_term(ctx);
  });
  const auto proto = sample_batch(8, 16).events;
  for (auto _ : state) {
    std::vector<kv::Event> events(proto.begin(), proto.end());
    sinks[0]->publish(std::move(events));
  }
  stop = true;
  sub.join();
  state.SetItemsProcessed(state.iterations() * 8);
  state.counters["frames_received"] = static_cast<double>(received.load());
}
BENCHMARK(BM_PublishEvents)->MeasureProcessCPUTime()->UseRealTime();

// 1,000 concurrent simulated requests (shared-prefix prompts of ~1,150 tokens, 128 output tokens)
// through one rank's BatchCore, from arrival to the last token, on one core: admission,
// chunked prefill, decode steps, cache inserts and evictions, and KV events encoded and published
// to a ZeroMQ PUB socket (no subscriber). One iteration = the whole run.
void BM_Scheduler1000(benchmark::State& state) {
  const bool events = state.range(0) != 0;
  const int64_t page = state.range(1);
  asio::io_context ctx(1);
  StandInTokenizer tok;
  PseudoText model(tok);
  SimMetrics metrics("m", 1);
  std::vector<std::unique_ptr<RankEventSink>> sinks;
  if (events) {
    KvEventsSettings s;
    s.publisher = "zmq";
    s.endpoint = "tcp://*:" + std::to_string(47500 + page);
    if (auto e = open_rank_sinks(s, 1, kv::WireFormat::kSglang, sinks); !e.empty()) {
      state.SkipWithError(e.c_str());
      return;
    }
  }
  RankSetup setup;
  setup.cache = RadixCacheConfig{.page_size = page, .capacity = 2000000, .events = events};
  setup.events = events ? sinks[0].get() : nullptr;
  setup.metrics = &metrics.rank(0);
  auto n = std::make_shared<Notifier>(ctx.get_executor());
  Workload w(64, 1024, 128, 3);
  uint64_t steps = 0, published = 0, event_count = 0;
  double simulated = 0;
  for (auto _ : state) {
    state.PauseTiming();
    BatchCore core(setup, BatchTiming{}, BatchLimits{.max_running_requests = 1024});
    std::vector<std::shared_ptr<Sequence>> seqs;
    for (int i = 0; i < 1000; ++i) {
      GenerationRequest r;
      r.prompt = w.next();
      r.sampling.max_new_tokens = 128;
      auto stream = model.start(r.prompt, 0);
      seqs.push_back(std::make_shared<Sequence>(std::move(r), stream, tok, 0, n));
    }
    const uint64_t before = events ? sinks[0]->published() : 0;
    const uint64_t events_before = events ? sinks[0]->events_published() : 0;
    state.ResumeTiming();
    for (auto& s : seqs) core.enqueue(s);
    auto now = Clock::now();
    while (core.has_requests()) {
      auto d = core.begin_step(now);
      if (!d) break;
      now += *d;
      simulated += std::chrono::duration<double>(*d).count();
      core.end_step(now);
      ctx.poll();  // the consumers' wake-ups (on the HTTP threads in the server)
    }
    steps += core.steps();
    state.PauseTiming();
    if (events) {
      published += sinks[0]->published() - before;
      event_count += sinks[0]->events_published() - events_before;
    }
    seqs.clear();
    ctx.restart();
    ctx.poll();
    state.ResumeTiming();
  }
  const auto it = static_cast<double>(state.iterations());
  state.SetItemsProcessed(state.iterations() * 1000);
  state.counters["steps"] = static_cast<double>(steps) / it;
  state.counters["batches"] = static_cast<double>(published) / it;
  state.counters["events"] = static_cast<double>(event_count) / it;
  state.counters["simulated_s"] = simulated / it;
}
BENCHMARK(BM_Scheduler1000)
    ->ArgNames({"events", "page"})
    ->Args({0, 16})
    ->Args({1, 16})
    ->Args({1, 1})
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3);

}  // namespace
}  // namespace kvgate::sim
