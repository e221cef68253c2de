// Micro-benchmarks of src/tokenizer: encode throughput (tokens/s, single thread and two threads
// sharing one tokenizer), the first 256 ids of a document (encode_prefix), chat-template rendering
// of a 20-turn conversation, and load cost and memory per tokenizer. bench/tokenizer/run compares
// the encode figures with HF tokenizers on the same corpus in the same run (KVGATE_TOKENIZER_CORPUS
// names the corpus file it writes).
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "gateway/config.h"
#include "kv/inventory.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/piece_cache.h"
#include "tokenizer/tokenizer.h"

namespace kvgate::tokenizer {
namespace {

std::string models_dir() {
  if (const char* e = std::getenv("KVGATE_MODELS_DIR")) return e;
  std::string f = __FILE__;  // <repo>/bench/micro/tokenizer_bench.cc
  for (int i = 0; i < 3; ++i) f = f.substr(0, f.find_last_of('/'));
  return f + "/models";
}

// The corpus: KVGATE_TOKENIZER_CORPUS (documents separated by U+001E), or a built-in mix.
const std::vector<std::string>& corpus() {
  static const std::vector<std::string> docs = [] {
    std::vector<std::string> out;
    if (const char* path = std::getenv("KVGATE_TOKENIZER_CORPUS")) {
      std::ifstream in(path, std::ios::binary);
      std::stringstream ss;
      ss << in.rdbuf();
      std::string all = ss.str();
      size_t start = 0;
      while (start <= all.size()) {
        size_t end = all.find('\x1e', start);
        if (end == std::string::npos) end = all.size();
        out.push_back(all.substr(start, end - start));
        start = end + 1;
      }
      return out;
    }
    const char* parts[] = {
        "The gateway sends each request to the server that already holds the longest part of its "
        "prompt in KV cache. It's fast, isn't it? They'll measure 42.7% fewer prefill tokens.\n\n",
        "for (size_t i = 0; i < n; ++i) {\n  sum += v[i] * w[i];\n}\n",
        "人工智能正在改变我们的生活方式。大型语言模型可以理解和生成自然语言。",
        "東京の天気は晴れです。 인공지능은 우리의 삶을 변화시키고 있습니다. ",
        "Great job! 🎉🎉 👍🏽 👨‍👩‍👧 Order #48213 shipped on 2024-03-17, total "
        "$1,299.99. ",
        "        \n\t\t\n   def handler(request):\n    return {\"ok\": True}\n",
    };
    uint32_t s = 12345;
    for (int d = 0; d < 256; ++d) {
      std::string doc;
      while (doc.size() < 4096) {
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        doc += parts[s % 6];
      }
      out.push_back(std::move(doc));
    }
    return out;
  }();
  return docs;
}

const Tokenizer* tokenizer(const std::string& model) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<Tokenizer>> loaded;
  std::lock_guard lock(mu);
  auto& t = loaded[model];
  if (!t) {
    std::string err;
    t = Tokenizer::load(models_dir() + "/" + model, err);
    if (!t) std::fprintf(stderr, "tokenizer_bench: %s\n", err.c_str());
  }
  return t.get();
}

// A second instance of the model's tokenizer, with a piece cache of the gateway's default size
// (--tokenizer-cache-bytes), as the gateway sets it up.
struct CachedTokenizer {
  std::unique_ptr<Tokenizer> tokenizer;
  std::shared_ptr<PieceCache> cache;
};
const CachedTokenizer* cached_tokenizer(const std::string& model) {
  static std::mutex mu;
  static std::map<std::string, CachedTokenizer> loaded;
  std::lock_guard lock(mu);
  auto& t = loaded[model];
  if (!t.tokenizer) {
    std::string err;
    t.tokenizer = Tokenizer::load(models_dir() + "/" + model, err);
    if (!t.tokenizer) {
      std::fprintf(stderr, "tokenizer_bench: %s\n", err.c_str());
      return nullptr;
    }
    t.cache = std::make_shared<PieceCache>(
        static_cast<size_t>(kvgate::GatewayConfig{}.tokenizer_cache_bytes));
    t.tokenizer->set_piece_cache(t.cache);
  }
  return &t;
}

uint32_t fnv(const std::vector<int32_t>& ids, uint32_t h) {
  for (int32_t id : ids) {
    auto u = static_cast<uint32_t>(id);
    for (int k = 0; k < 4; ++k) {
      h ^= (u >> (8 * k)) & 0xFF;
      h *= 16777619u;
    }
  }
  return h;
}

// 4 KB requests one after another (what the gateway does per request).
void BM_EncodeRequests(benchmark::State& state, const char* model) {
  const Tokenizer* t = tokenizer(model);
  if (!t) {
    state.SkipWithError("tokenizer files missing: run scripts/setup");
    return;
  }
  const auto& docs = corpus();
  std::vector<int32_t> ids;
  uint32_t checksum = 2166136261u;
  int64_t per_pass = 0;
  for (const auto& d : docs) {  // warm-up pass: caches, and the checksum of the output
    ids.clear();
    t->encode(d, false, ids);
    checksum = fnv(ids, checksum);
    per_pass += static_cast<int64_t>(ids.size());
  }
  int64_t tokens = 0;
  for (auto _ : state) {
    for (const auto& d : docs) {
      ids.clear();
      t->encode(d, false, ids);
      tokens += static_cast<int64_t>(ids.size());
    }
  }
  state.SetItemsProcessed(tokens);
  state.counters["checksum"] = checksum;
  state.counters["tokens_per_pass"] = static_cast<double>(per_pass);
}
BENCHMARK_CAPTURE(BM_EncodeRequests, qwen3, "qwen3")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_EncodeRequests, llama3, "llama3")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_EncodeRequests, qwen3_2threads, "qwen3")
    ->Threads(2)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// The whole corpus as one document.
void BM_EncodeDocument(benchmark::State& state, const char* model) {
  const Tokenizer* t = tokenizer(model);
  if (!t) {
    state.SkipWithError("tokenizer files missing: run scripts/setup");
    return;
  }
  std::string all;
  for (const auto& d : corpus()) all += d;
  std::vector<int32_t> ids;
  t->encode(all, false, ids);
  int64_t tokens = 0;
  for (auto _ : state) {
    ids.clear();
    t->encode(all, false, ids);
    tokens += static_cast<int64_t>(ids.size());
  }
  state.SetItemsProcessed(tokens);
}
BENCHMARK_CAPTURE(BM_EncodeDocument, qwen3, "qwen3")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_EncodeDocument, llama3, "llama3")->Unit(benchmark::kMillisecond);

// The first 256 ids of that document (what prefix_hash asks for): encode_prefix stops early.
void BM_EncodePrefix256Document(benchmark::State& state, const char* model) {
  const Tokenizer* t = tokenizer(model);
  if (!t) {
    state.SkipWithError("tokenizer files missing: run scripts/setup");
    return;
  }
  std::string all;
  for (const auto& d : corpus()) all += d;
  std::vector<int32_t> ids;
  for (auto _ : state) {
    ids.clear();
    t->encode_prefix(all, false, 256, ids);
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(all.size()));
}
BENCHMARK_CAPTURE(BM_EncodePrefix256Document, qwen3, "qwen3")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_EncodePrefix256Document, llama3, "llama3")->Unit(benchmark::kMicrosecond);

// The 20-turn conversation of bench/tokenizer/ref_bench.mjs.
jinja::Value twenty_turns() {
  std::vector<jinja::Value> msgs;
  auto msg = [](const char* role, std::string content) {
    jinja::Value m = jinja::Value::object();
    m.obj_mut().set("role", jinja::Value(role));
    m.obj_mut().set("content", jinja::Value(std::move(content)));
    return m;
  };
  msgs.push_back(msg("system", "You are a helpful assistant."));
  for (int i = 0; i < 10; ++i) {
    msgs.push_back(msg("user", "Question number " + std::to_string(i) +
                                   ": what does the cache router do with prefix " +
                                   std::to_string(i) + "?"));
    msgs.push_back(msg("assistant", "Answer number " + std::to_string(i) +
                                        ": it sends the request to the worker holding the "
                                        "longest prefix."));
  }
  return jinja::Value::array(std::move(msgs));
}

void BM_ChatRender20Turns(benchmark::State& state, const char* model) {
  std::string err;
  auto ct = ChatTemplate::load(models_dir() + "/" + model, err);
  if (!ct) {
    state.SkipWithError(err.c_str());
    return;
  }
  ChatTemplate::Input in;
  in.messages = twenty_turns();
  in.add_generation_prompt = true;
  std::string out;
  for (auto _ : state) {
    out.clear();
    if (!ct->render(in, out, err)) state.SkipWithError(err.c_str());
    benchmark::DoNotOptimize(out.data());
  }
}
BENCHMARK_CAPTURE(BM_ChatRender20Turns, qwen3, "qwen3")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_ChatRender20Turns, llama3, "llama3")->Unit(benchmark::kMicrosecond);

// Render plus tokenization of the prompt (what kv_exact needs per chat request).
void BM_ChatRenderAndEncode20Turns(benchmark::State& state, const char* model) {
  std::string err;
  auto ct = ChatTemplate::load(models_dir() + "/" + model, err);
  const Tokenizer* t = tokenizer(model);
  if (!ct || !t) {
    state.SkipWithError("tokenizer files missing: run scripts/setup");
    return;
  }
  ChatTemplate::Input in;
  in.messages = twenty_turns();
  in.add_generation_prompt = true;
  std::string out;
  std::vector<int32_t> ids;
  for (auto _ : state) {
    out.clear();
    ids.clear();
    ct->render(in, out, err);
    t->encode(out, false, ids);
    benchmark::DoNotOptimize(ids.data());
  }
}
BENCHMARK_CAPTURE(BM_ChatRenderAndEncode20Turns, qwen3, "qwen3")->Unit(benchmark::kMicrosecond);

// kv_exact's routing work for turn 21 of a chat (issue 11: p50 <= 30 us for a 20-turn chat):
// render, tokenize, key the pages, match them against an inventory where 16 (endpoint, rank)
// sources hold the conversation (all of it on one, its first half on the others), and pick the
// lowest cost. The request is the 20 turns of twenty_turns() plus a new question; the last answer
// (the engine wrote it: the gateway never tokenized it) and the new question are different text on
// every iteration. `warm`: the gateway routed the chat's previous turn, so the piece cache holds
// every earlier message and only those two are tokenized; cold: no piece cache, everything is.
void BM_KvExactRouting20Turns(benchmark::State& state, bool warm) {
  std::string err;
  auto ct = ChatTemplate::load(models_dir() + "/qwen3", err);
  const CachedTokenizer* cached = warm ? cached_tokenizer("qwen3") : nullptr;
  const Tokenizer* t = warm ? (cached ? cached->tokenizer.get() : nullptr) : tokenizer("qwen3");
  if (!ct || !t) {
    state.SkipWithError("tokenizer files missing: run scripts/setup");
    return;
  }
  ChatTemplate::Input in;
  in.messages = twenty_turns();
  in.add_generation_prompt = true;
  {
    jinja::Value q = jinja::Value::object();
    q.obj_mut().set("role", jinja::Value("user"));
    q.obj_mut().set("content", jinja::Value(""));
    in.messages.arr_mut().items.push_back(std::move(q));
  }
  auto& items = in.messages.arr_mut().items;
  const size_t answer = items.size() - 2, question = items.size() - 1;
  // Never reset: google benchmark runs this function several times, and a text of an earlier run
  // would be a hit.
  static uint64_t turn = 0;
  auto next_turn = [&] {
    ++turn;
    std::string k = std::to_string(turn);
    items[answer].obj_mut().set(
        "content", jinja::Value("Answer number 9 (take " + k +
                                "): it sends the request to the worker holding the longest "
                                "prefix."));
    items[question].obj_mut().set(
        "content", jinja::Value("Question number 10 (take " + k +
                                "): and when that worker is busy, where does the request go?"));
  };
  std::string out;
  std::vector<int32_t> ids;
  if (warm) {  // the previous turn's request: every message before the last answer
    ChatTemplate::Input previous;
    previous.messages = twenty_turns();
    previous.messages.arr_mut().items.pop_back();
    previous.add_generation_prompt = true;
    ct->render(previous, out, err);
    t->encode(out, false, ids);
  }
  next_turn();
  out.clear();
  ids.clear();
  ct->render(in, out, err);
  t->encode(out, false, ids);
  constexpr size_t kPage = 16;
  kv::Inventory inv(kv::InventoryOptions{.page_size = kPage});
  const size_t pages = ids.size() / kPage;
  for (uint32_t s = 1; s <= 16; ++s) {
    size_t held = s == 1 ? pages : pages / 2;
    kv::BlockStored st;
    st.block_size = kPage;
    st.medium = kv::Medium::kGpu;
    for (size_t i = 0; i < held; ++i) st.block_hashes.push_back(uint64_t{s} << 32 | i);
    st.token_ids.assign(ids.begin(), ids.begin() + static_cast<long>(held * kPage));
    kv::EventBatch b;
    b.events.emplace_back(std::move(st));
    inv.apply(s, b);
  }
  std::vector<kv::BlockKey> keys;
  std::vector<kv::SourceMatch> matches;
  const PieceCache::Stats before = warm ? cached->cache->stats() : PieceCache::Stats{};
  for (auto _ : state) {
    next_turn();  // two strings (~0.1 us): what parsing the request's new messages costs anyway
    out.clear();
    ids.clear();
    keys.clear();
    ct->render(in, out, err);
    t->encode(out, false, ids);
    kv::chain_keys(ids, kPage, kv::chain_seed(std::nullopt, std::nullopt), keys);
    inv.match(keys, matches);
    double best = 1e18;
    uint32_t chosen = 0;
    for (const auto& m : matches) {
      double cost = static_cast<double>(ids.size()) - m.pages * kPage;
      if (cost < best) {
        best = cost;
        chosen = m.source;
      }
    }
    benchmark::DoNotOptimize(chosen);
  }
  state.counters["tokens"] = static_cast<double>(ids.size());
  state.counters["pages_matched"] = matches.empty() ? 0 : matches.front().gpu_pages;
  if (warm) {
    // Pieces per request looked up, and found (only this benchmark uses that cache).
    const PieceCache::Stats after = cached->cache->stats();
    const double n = static_cast<double>(state.iterations());
    state.counters["piece_lookups"] =
        static_cast<double>(after.hits + after.misses - before.hits - before.misses) / n;
    state.counters["piece_hits"] = static_cast<double>(after.hits - before.hits) / n;
  }
}
BENCHMARK_CAPTURE(BM_KvExactRouting20Turns, cold, false)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_KvExactRouting20Turns, warm, true)->Unit(benchmark::kMicrosecond);

long rss_kb() {
  std::ifstream in("/proc/self/statm");
  long pages = 0, resident = 0;
  in >> pages >> resident;
  return resident * 4;
}

// Load time and memory of one tokenizer (its tables; the first load also maps ICU data).
void BM_LoadTokenizer(benchmark::State& state, const char* model) {
  double heap = 0, rss = 0;
  for (auto _ : state) {
    long before = rss_kb();
    std::string err;
    auto t = Tokenizer::load(models_dir() + "/" + model, err);
    if (!t) {
      state.SkipWithError(err.c_str());
      return;
    }
    rss = static_cast<double>(rss_kb() - before) * 1024;
    heap = static_cast<double>(t->memory_bytes());
    benchmark::DoNotOptimize(t.get());
  }
  state.counters["table_bytes"] = heap;
  state.counters["rss_delta_bytes"] = rss;
}
BENCHMARK_CAPTURE(BM_LoadTokenizer, qwen3, "qwen3")->Iterations(3)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_LoadTokenizer, llama3, "llama3")->Iterations(3)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace kvgate::tokenizer
