// sim/engine: see engine.h.
#include "sim/engine.h"

#include "sim/fixed_delay_scheduler.h"

namespace kvgate::sim {

Engine::Engine(EngineConfig config, const Tokenizer& tokenizer, SimMetrics& metrics)
    : config_(config), tokenizer_(tokenizer), metrics_(metrics), model_(tokenizer) {
  FixedDelayTiming timing{config.ttft, config.tpot};
  for (int r = 0; r < config.dp_size; ++r) {
    ranks_.push_back(
        std::make_unique<FixedDelayScheduler>(r, timing, config.max_total_tokens, metrics.rank(r)));
  }
}

std::string Engine::check_rank(std::optional<int64_t> rank) const {
  if (!rank || (*rank >= 0 && *rank < config_.dp_size)) return "";
  return "routed_dp_rank " + std::to_string(*rank) + " is out of range: this server has dp_size " +
         std::to_string(config_.dp_size) + " (ranks 0.." + std::to_string(config_.dp_size - 1) +
         ")";
}

int Engine::pick_rank(std::optional<int64_t> routed) {
  if (routed) return static_cast<int>(*routed);
  if (config_.dp_size == 1) return 0;
  return static_cast<int>(next_rank_.fetch_add(1, std::memory_order_relaxed) %
                          static_cast<uint64_t>(config_.dp_size));
}

std::shared_ptr<Sequence> Engine::submit(GenerationRequest request,
                                         std::shared_ptr<Notifier> notifier) {
  int rank = pick_rank(request.routed_dp_rank);
  auto stream = model_.start(request.prompt, config_.seed);
  auto seq =
      std::make_shared<Sequence>(std::move(request), stream, tokenizer_, rank, std::move(notifier));
  ranks_[static_cast<size_t>(rank)]->submit(seq);
  return seq;
}

std::vector<RankLoad> Engine::loads() const {
  std::vector<RankLoad> out;
  out.reserve(ranks_.size());
  for (const auto& r : ranks_) out.push_back(r->load());
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
