// policy/consistent_hashing: see consistent_hashing.h.
#include "policy/consistent_hashing.h"

#include <charconv>

#include "http/message.h"

namespace kvgate {

Decision ConsistentHashingPolicy::select(std::span<Worker* const> available, RouteContext& ctx) {
  auto state = ring_.get();
  std::string_view target = ctx.header("x-smg-target-worker");
  if (!target.empty()) {
    size_t index = 0;
    auto [p, ec] = std::from_chars(target.data(), target.data() + target.size(), index);
    if (ec != std::errc() || p != target.data() + target.size() || index >= state->ids.size()) {
      return {nullptr, std::nullopt, "target_invalid", 0};
    }
    Worker* w = find_available(available, ctx, state->ids[index]);
    return {w, std::nullopt, w ? "target" : "target_unavailable", 0};
  }
  std::string_view key = routing_key(ctx);
  std::string_view branch = "routing_key";
  std::string cookies;  // the Cookie field without the dashboard's session (see below)
  for (auto [header, name] :
       {std::pair{"authorization", "authorization"}, std::pair{"x-forwarded-for", "forwarded_for"},
        std::pair{"cookie", "cookie"}}) {
    if (!key.empty()) break;
    key = ctx.header(header);
    branch = name;
  }
  if (branch == "cookie" && key.find(http::kSessionCookiePrefix) != std::string_view::npos)
      [[unlikely]] {
    // The admin listener's dashboard session (a browser sends it to every port of the host) is
    // not the client's identity: signing in or out must not move the client to another worker.
    cookies = http::without_cookies(key, http::kSessionCookiePrefix);
    key = cookies;
  }
  if (key.empty() || state->ring.empty()) {
    return {available[rng_.below(available.size())], std::nullopt, "random", 0};
  }
  Worker* pick = nullptr;
  bool first = true;
  bool owner = true;
  state->ring.walk(prefix::hash64(key), [&](size_t m) {
    pick = find_available(available, ctx, state->ids[m]);
    if (!pick && first) owner = false;
    first = false;
    return pick != nullptr;
  });
  if (!pick) return {available[rng_.below(available.size())], std::nullopt, "random", 0};
  return {pick, std::nullopt, owner ? branch : "ring_next", 0};
}

}  // namespace kvgate
