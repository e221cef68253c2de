// gateway/response_owners: see response_owners.h.
#include "gateway/response_owners.h"

#include <algorithm>
#include <functional>

#include "metrics/metrics.h"

namespace kvgate {

// A small table is one shard (its bound exact); a large one is split to spread the locks, each
// shard holding its part of the bound.
ResponseOwners::ResponseOwners(size_t max_entries, std::chrono::seconds ttl)
    : shards_(max_entries >= 1024 ? kShards : 1),
      per_shard_(std::max<size_t>(1, (max_entries + shards_.size() - 1) / shards_.size())),
      ttl_(ttl) {}

void ResponseOwners::attach_metrics(metrics::Registry& registry) {
  if (entries_) return;
  entries_ = &registry
                  .gauge("kvgate_response_owners",
                         "Responses API ids whose creating worker the gateway remembers "
                         "(--max-response-owners at most)")
                  .with({});
  routes_ = &registry.counter(
      "kvgate_response_owner_routes_total",
      "Requests naming a response (previous_response_id, GET/DELETE/cancel of one), by how they "
      "were routed: owner (remembered), found (the workers were asked), not_found, "
      "owner_unavailable, lookup_busy, refused, conflict",
      {"result"});
}

bool ResponseOwners::valid_id(std::string_view id) {
  if (!id.starts_with("resp_") || id.size() <= 5 || id.size() > 133) return false;
  return std::all_of(id.begin() + 5, id.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
  });
}

std::string_view ResponseOwners::find_id(std::string_view text) {
  size_t pos = 0;
  while ((pos = text.find("\"id\"", pos)) != std::string_view::npos) {
    size_t i = pos + 4;
    pos = i;
    while (i < text.size() && (text[i] == ' ' || text[i] == '\t')) ++i;
    if (i >= text.size() || text[i] != ':') continue;
    ++i;
    while (i < text.size() && (text[i] == ' ' || text[i] == '\t')) ++i;
    if (i >= text.size() || text[i] != '"') continue;
    size_t start = i + 1;
    size_t end = text.find('"', start);
    if (end == std::string_view::npos) return {};  // cut: the rest has not come yet
    std::string_view id = text.substr(start, end - start);
    if (id.starts_with("resp_")) return valid_id(id) ? id : std::string_view{};
  }
  return {};
}

ResponseOwners::Shard& ResponseOwners::shard(std::string_view id) {
  return shards_[std::hash<std::string_view>{}(id) % shards_.size()];
}

void ResponseOwners::erase_locked(Shard& s, std::unordered_map<std::string, Entry>::iterator it) {
  s.order.erase(it->second.order);
  s.map.erase(it);
  if (entries_) entries_->add(-1);
}

bool ResponseOwners::learn(std::string_view id, std::string_view rule, std::string_view worker,
                           int dp_rank, Clock::time_point now) {
  if (!valid_id(id)) return true;
  Shard& s = shard(id);
  std::lock_guard lock(s.mu);
  if (auto it = s.map.find(std::string(id)); it != s.map.end()) {
    const Owner& held = it->second.owner;
    if (it->second.expires > now && (held.worker != worker || held.rule != rule)) return false;
    erase_locked(s, it);
  }
  while (s.map.size() >= per_shard_) erase_locked(s, s.map.find(s.order.front()));
  s.order.emplace_back(id);
  auto order = std::prev(s.order.end());
  s.map.emplace(std::string(id),
                Entry{Owner{std::string(rule), std::string(worker), dp_rank}, now + ttl_, order});
  if (entries_) entries_->add(1);
  // The oldest entries expire first (one TTL for all): those at the front that have, go.
  while (!s.order.empty()) {
    auto front = s.map.find(s.order.front());
    if (front->second.expires > now) break;
    erase_locked(s, front);
  }
  return true;
}

std::optional<ResponseOwners::Owner> ResponseOwners::find(std::string_view id,
                                                          Clock::time_point now) {
  Shard& s = shard(id);
  std::lock_guard lock(s.mu);
  auto it = s.map.find(std::string(id));
  if (it == s.map.end()) return std::nullopt;
  if (it->second.expires <= now) {
    erase_locked(s, it);
    return std::nullopt;
  }
  return it->second.owner;
}

void ResponseOwners::forget(std::string_view id) {
  Shard& s = shard(id);
  std::lock_guard lock(s.mu);
  if (auto it = s.map.find(std::string(id)); it != s.map.end()) erase_locked(s, it);
}

size_t ResponseOwners::size() const {
  size_t n = 0;
  for (const Shard& s : shards_) {
    std::lock_guard lock(s.mu);
    n += s.map.size();
  }
  return n;
}

void ResponseOwners::count(std::string_view result) {
  if (routes_) routes_->with({result}).inc();
}

}  // namespace kvgate
