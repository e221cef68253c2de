// sim/engine: see engine.h.
#include "sim/engine.h"

#include <algorithm>

#include "sim/config.h"

namespace kvgate::sim {
namespace {

std::chrono::nanoseconds ms(double v) {
  return std::chrono::nanoseconds(static_cast<int64_t>(v * 1e6));
}
std::chrono::nanoseconds us(double v) {
  return std::chrono::nanoseconds(static_cast<int64_t>(v * 1e3));
}
std::chrono::nanoseconds scaled(std::chrono::nanoseconds d, double scale) {
  return std::chrono::nanoseconds(static_cast<int64_t>(static_cast<double>(d.count()) * scale));
}

}  // namespace

EngineConfig engine_config(const SimConfig& c) {
  EngineConfig e;
  e.dp_size = static_cast<int>(c.dp_size);
  e.max_total_tokens = c.max_total_tokens;
  e.page_size = c.page_size;
  e.seed = static_cast<uint64_t>(c.seed);
  e.scheduler = c.scheduler == "fixed" ? SchedulerKind::kFixed : SchedulerKind::kBatch;
  e.time_scale = c.time_scale;
  e.ttft = ms(c.ttft_ms);
  e.tpot = ms(c.tpot_ms);
  e.batch.step_fixed = ms(c.step_fixed_ms);
  e.batch.per_prefill_token = us(c.step_prefill_token_us);
  e.batch.per_running_request = us(c.step_running_request_us);
  e.limits.chunked_prefill_size = c.chunked_prefill_size;
  e.limits.max_running_requests = c.max_running_requests;
  e.max_queued_requests = c.max_queued_requests;
  e.event_format = c.kv_events_format == "vllm" ? kv::WireFormat::kVllm : kv::WireFormat::kSglang;
  e.events_per_page = c.kv_events_per_page;
  e.role = c.disaggregation_mode == "prefill"  ? PdRole::kPrefill
           : c.disaggregation_mode == "decode" ? PdRole::kDecode
                                               : PdRole::kNone;
  e.transfer_fixed = ms(c.pd_transfer_fixed_ms);
  e.transfer_per_token = us(c.pd_transfer_token_us);
  return e;
}

Engine::Engine(EngineConfig config, const Tokenizer& tokenizer, SimMetrics& metrics,
               std::vector<std::unique_ptr<RankEventSink>> sinks, RoomListener* rooms)
    : config_(config),
      tokenizer_(tokenizer),
      metrics_(metrics),
      model_(tokenizer),
      logprobs_(tokenizer, config.seed),
      sinks_(std::move(sinks)) {
  const bool vllm = config.event_format == kv::WireFormat::kVllm;
  for (int r = 0; r < config.dp_size; ++r) {
    decode_queues_.push_back(std::make_unique<DecodeQueues>());
    RankSetup s;
    s.dp_rank = r;
    s.cache =
        RadixCacheConfig{.page_size = config.page_size,
                         .capacity = config.max_total_tokens,
                         .events = true,
                         .scheme = vllm ? kv::HashScheme::kVllmSha256Cbor : kv::HashScheme::kSglang,
                         .grouping = vllm                     ? EventGrouping::kPerNode
                                     : config.events_per_page ? EventGrouping::kPerPage
                                                              : EventGrouping::kMerged};
    // A PD decode server does not cache prompts: only the prefill side's events carry blocks.
    s.caching = config.role != PdRole::kDecode;
    s.events =
        static_cast<size_t>(r) < sinks_.size() ? sinks_[static_cast<size_t>(r)].get() : nullptr;
    s.metrics = &metrics.rank(r);
    s.role = config.role;
    s.rooms = rooms;
    s.transfer_fixed = config.transfer_fixed;
    s.transfer_per_token = config.transfer_per_token;
    if (config.scheduler == SchedulerKind::kFixed) {
      // The fixed scheduler's delays, and its transfer time, shrink with --time-scale.
      s.transfer_fixed = scaled(s.transfer_fixed, config.time_scale);
      s.transfer_per_token = scaled(s.transfer_per_token, config.time_scale);
      FixedDelayTiming t{scaled(config.ttft, config.time_scale),
                         scaled(config.tpot, config.time_scale)};
      ranks_.push_back(std::make_unique<FixedDelayScheduler>(s, t));
    } else {
      BatchTiming t = config.batch;
      t.time_scale = config.time_scale;
      ranks_.push_back(std::make_unique<BatchScheduler>(s, t, config.limits));
    }
  }
}

Engine::~Engine() {
  stop();
}

void Engine::stop() {
  for (auto& r : ranks_) r->stop();
}

std::string Engine::check_rank(std::optional<int64_t> rank) const {
  if (!rank || (*rank >= 0 && *rank < config_.dp_size)) return "";
  return "routed_dp_rank=" + std::to_string(*rank) + " out of range [0, " +
         std::to_string(config_.dp_size) + ")";
}

std::string Engine::check_queue(std::optional<int64_t> rank, size_t n) const {
  if (config_.max_queued_requests <= 0) return "";
  int64_t waiting = 0;
  if (rank) {
    waiting = ranks_[static_cast<size_t>(*rank)]->waiting();
  } else {
    waiting = std::numeric_limits<int64_t>::max();
    for (const auto& r : ranks_) waiting = std::min(waiting, r->waiting());
  }
  if (waiting + static_cast<int64_t>(n) <= config_.max_queued_requests) return "";
  return "The request queue is full.";
}

int Engine::pick_rank(std::optional<int64_t> routed, std::optional<uint64_t> room) {
  if (routed) return static_cast<int>(*routed);
  if (config_.dp_size == 1) return 0;
  if (config_.role == PdRole::kPrefill && room) {
    return static_cast<int>(*room % static_cast<uint64_t>(config_.dp_size));
  }
  return static_cast<int>(next_rank_.fetch_add(1, std::memory_order_relaxed) %
                          static_cast<uint64_t>(config_.dp_size));
}

std::shared_ptr<Sequence> Engine::submit(GenerationRequest request,
                                         std::shared_ptr<Notifier> notifier) {
  int rank = pick_rank(
      request.routed_dp_rank,
      request.bootstrap ? std::optional<uint64_t>(request.bootstrap->room) : std::nullopt);
  auto& sp = request.sampling;
  const auto prompt = static_cast<int64_t>(request.prompt.size());
  // SGLang clips max_new_tokens to what fits the KV pool (max_req_len - input length).
  sp.max_new_tokens =
      std::min(sp.max_new_tokens, std::max<int64_t>(0, config_.max_total_tokens - prompt));
  if (config_.role == PdRole::kPrefill && sp.max_new_tokens > 1) sp.max_new_tokens = 1;
  auto stream = model_.start(request.prompt, config_.seed);
  auto seq =
      std::make_shared<Sequence>(std::move(request), stream, tokenizer_, rank, std::move(notifier));
  ranks_[static_cast<size_t>(rank)]->submit(seq);
  return seq;
}

std::vector<RankLoad> Engine::loads() const {
  std::vector<RankLoad> out;
  out.reserve(ranks_.size());
  for (const auto& r : ranks_) {
    out.push_back(r->load());
    out.back().max_running_requests = config_.limits.max_running_requests;
    const DecodeQueues& q = *decode_queues_[out.size() - 1];
    out.back().decode_prealloc = q.prealloc.load(std::memory_order_relaxed);
    out.back().decode_transfer = q.transfer.load(std::memory_order_relaxed);
  }
  return out;
}

bool Engine::flush_cache() {
  for (const auto& r : ranks_) {
    RankLoad l = r->load();
    if (l.running > 0 || l.waiting > 0) return false;
  }
  bool ok = true;
  for (auto& r : ranks_) ok = r->flush_cache() && ok;
  return ok;
}

}  // namespace kvgate::sim
