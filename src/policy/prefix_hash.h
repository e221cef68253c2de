// policy/prefix_hash: the hash of the request's first --prefix-token-count tokens (characters
// without --tokenizer-path, unless it sends input_ids; only those tokens are computed) picks a
// worker on a consistent-hash ring; the pick stands while its load is <= (total + 1) / n *
// --prefix-hash-load-factor, else the least-loaded worker under that bound. Works over HTTP
// (sgl-model-gateway's only works over gRPC).
#pragma once

#include "policy/common.h"
#include "policy/registry.h"
#include "policy/ring_state.h"

namespace kvgate {

class PrefixHashPolicy final : public Policy {
 public:
  explicit PrefixHashPolicy(const PolicyConfig& c)
      : prefix_(static_cast<size_t>(c.prefix_token_count)),
        factor_(c.prefix_hash_load_factor),
        rng_(c.seed),
        ring_(160) {}
  std::string_view name() const override { return "prefix_hash"; }
  Decision select(std::span<Worker* const> available, RouteContext& ctx) override;
  void on_workers_changed(const WorkerSet& set) override { ring_.rebuild(set); }
  // Only the ids that are hashed are computed.
  ParseOptions parse_options() const override {
    return {.want_text = true, .want_tokens = true, .max_tokens = prefix_};
  }

 private:
  size_t prefix_;
  double factor_;
  PolicyRng rng_;
  RingHolder ring_;
};

}  // namespace kvgate
