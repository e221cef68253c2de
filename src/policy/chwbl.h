// policy/chwbl: consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam 2018), as
// KubeAI and the KV-exact gateway use it. The key is X-SMG-Routing-Key when present, else the model
// plus the first --chwbl-key-chars characters of the first user message (the prompt otherwise).
// 256 virtual nodes per worker. A worker may take a request while its load is below
// ceil(--chwbl-load-factor * (total + 1) / n); a full owner passes the request clockwise.
#pragma once

#include "policy/common.h"
#include "policy/registry.h"
#include "policy/ring_state.h"

namespace kvgate {

class ChwblPolicy final : public Policy {
 public:
  explicit ChwblPolicy(const PolicyConfig& c)
      : key_chars_(static_cast<size_t>(c.chwbl_key_chars)),
        factor_(c.chwbl_load_factor),
        rng_(c.seed),
        ring_(256) {}
  std::string_view name() const override { return "chwbl"; }
  Decision select(std::span<Worker* const> available, RouteContext& ctx) override;
  void on_workers_changed(const WorkerSet& set) override { ring_.rebuild(set); }
  ParseOptions parse_options() const override { return {.want_text = true}; }

  // The load bound for `total` requests in flight over `n` workers.
  static int64_t capacity(int64_t total, size_t n, double factor);

 private:
  size_t key_chars_;
  double factor_;
  PolicyRng rng_;
  RingHolder ring_;
};

}  // namespace kvgate
