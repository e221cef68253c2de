// policy/chwbl: see chwbl.h.
#include "policy/chwbl.h"

#include <cmath>

namespace kvgate {
int64_t ChwblPolicy::capacity(int64_t total, size_t n, double factor) {
  return static_cast<int64_t>(
      std::ceil(factor * static_cast<double>(total + 1) / static_cast<double>(n)));
}

Decision ChwblPolicy::select(std::span<Worker* const> available, RouteContext& ctx) {
  auto state = ring_.get();
  std::string key;
  std::string_view header_key = routing_key(ctx);
  if (!header_key.empty()) {
    key = header_key;
  } else if (ctx.request) {
    const RequestInfo& r = *ctx.request;
    key = r.model;
    key.push_back('\x1f');
    std::string_view msg = r.first_user().empty() ? std::string_view(r.text) : r.first_user();
    key.append(first_chars(msg, key_chars_));
  }
  if (state->ring.empty()) {
    return {least_inflight(available, ctx, rng_), std::nullopt, "no_ring", 0};
  }
  int64_t total = inflight_spread(available, ctx).total;
  int64_t cap = capacity(total, available.size(), factor_);
  Worker* pick = nullptr;
  bool owner = true;
  bool first = true;
  state->ring.walk(prefix::hash64(key), [&](size_t m) {
    Worker* w = find_available(available, ctx, state->ids[m]);
    bool fits = w && w->fleet_inflight() < cap;
    if (!fits && first) owner = false;
    first = false;
    if (fits) pick = w;
    return fits;
  });
  if (!pick) return {least_inflight(available, ctx, rng_), std::nullopt, "all_full", 0};
  return {pick, std::nullopt, owner ? "owner" : "overflow", 0};
}

}  // namespace kvgate
