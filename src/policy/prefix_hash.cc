// policy/prefix_hash: see prefix_hash.h.
#include "policy/prefix_hash.h"

#include <algorithm>
#include <cmath>

#include "prefix/approx_tree.h"

namespace kvgate {
Decision PrefixHashPolicy::select(std::span<Worker* const> available, RouteContext& ctx) {
  std::string_view text = ctx.request ? std::string_view(ctx.request->text) : std::string_view();
  auto state = ring_.get();
  if (text.empty() || state->ring.empty()) {
    return {least_inflight(available, ctx, rng_), std::nullopt, "no_text", 0};
  }
  // The first --prefix-token-count tokens when the request was tokenized (--tokenizer-path, or
  // input_ids), else as many characters.
  const auto& tokens = ctx.request->tokens;
  uint64_t h = 0;
  if (!tokens.empty()) {
    size_t n = std::min(tokens.size(), prefix_);
    h = prefix::hash64(
        std::string_view(reinterpret_cast<const char*>(tokens.data()), n * sizeof(int32_t)));
  } else {
    h = prefix::hash64(first_chars(text, prefix_));
  }
  Worker* owner = nullptr;
  state->ring.walk(h, [&](size_t m) {
    owner = find_available(available, ctx, state->ids[m]);
    return owner != nullptr;
  });
  if (!owner) return {least_inflight(available, ctx, rng_), std::nullopt, "no_owner", 0};
  int64_t total = inflight_spread(available, ctx).total;
  double bound = static_cast<double>(total + 1) / static_cast<double>(available.size()) * factor_;
  if (static_cast<double>(owner->fleet_inflight()) <= bound)
    return {owner, std::nullopt, "ring", 0};
  // The owner is over the bound: the least loaded worker under it (there always is one: the
  // average load is below the bound).
  Worker* pick = least_inflight(available, ctx, rng_);
  return {pick, std::nullopt, "overloaded", 0};
}

}  // namespace kvgate
