// gateway/response_owners: which worker created each OpenAI Responses API response. SGLang keeps a
// response's conversation in the server that answered it (serving_responses.py's response and
// message stores, in memory): a request continuing it (previous_response_id) and GET / DELETE /
// cancel of it must reach that server, whatever the rule's policy would choose. The gateway
// learns the id from the answer (the first `"id":"resp_..."` of the body or of the stream's
// response.created event) and keeps it with the rule and worker URL.
//
// Bounded (--max-response-owners entries, the oldest forgotten first) and expiring
// (--response-owner-ttl-secs after it was learned); an id the table does not know (forgotten,
// expired, learned by another gateway replica or before a restart) is looked for by asking the
// workers (gateway/proxy.cc). Thread-safe: sharded, one mutex per shard.
#pragma once

#include <chrono>
#include <cstddef>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "metrics/metrics.h"

namespace kvgate {

class ResponseOwners {
 public:
  using Clock = std::chrono::steady_clock;
  struct Owner {
    std::string rule;    // the rule (pool) whose worker created it
    std::string worker;  // the worker's URL
    int dp_rank = -1;    // the data-parallel rank that ran it (-1: not rank-aware)
  };

  ResponseOwners(size_t max_entries, std::chrono::seconds ttl);
  ResponseOwners(const ResponseOwners&) = delete;
  ResponseOwners& operator=(const ResponseOwners&) = delete;

  // Registers kvgate_response_owners and kvgate_response_owner_routes_total (once).
  void attach_metrics(metrics::Registry& registry);

  // Whether `id` can be a response id the table keeps: "resp_" then 1..128 characters of
  // [A-Za-z0-9_-] (SGLang's are "resp_" + 32 hex digits).
  static bool valid_id(std::string_view id);
  // The response id a /v1/responses answer names first (its `"id"` key: the top-level id of a
  // response object, or of the response in a stream's response.created event), or "". `text` is
  // the answer's beginning; an id cut at its end is not returned.
  static std::string_view find_id(std::string_view text);

  // False (and nothing changed) when `id` is held, unexpired, by another worker: the first owner
  // keeps it. An engine takes a client's request_id as the response's id, so a second worker can
  // make a response with an id already in use; letting it take the id over would let anyone who
  // knows another client's response id send that conversation's next turns elsewhere.
  bool learn(std::string_view id, std::string_view rule, std::string_view worker, int dp_rank = -1,
             Clock::time_point now = Clock::now());
  std::optional<Owner> find(std::string_view id, Clock::time_point now = Clock::now());
  void forget(std::string_view id);
  size_t size() const;

  // How a request naming a response was routed (the metric's `result` label): "owner" (known),
  // "found" (asked the workers, one had it), "not_found" (none had it), "owner_unavailable"
  // (its worker is down, or no longer in the rule), "conflict" (a second worker answered with
  // an id another holds).
  void count(std::string_view result);

 private:
  struct Entry {
    Owner owner;
    Clock::time_point expires;
    std::list<std::string>::iterator order;
  };
  struct Shard {
    mutable std::mutex mu;
    std::unordered_map<std::string, Entry> map;
    std::list<std::string> order;  // oldest first
  };
  Shard& shard(std::string_view id);
  void erase_locked(Shard& s, std::unordered_map<std::string, Entry>::iterator it);

  static constexpr size_t kShards = 16;
  std::vector<Shard> shards_;
  size_t per_shard_;
  std::chrono::seconds ttl_;
  metrics::Gauge* entries_ = nullptr;
  metrics::CounterFamily* routes_ = nullptr;
};

}  // namespace kvgate
