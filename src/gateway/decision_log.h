// gateway/decision_log: the last routing decisions, for the dashboard and GET /v1/stats ("explain
// a decision"). Every dispatch records one entry when it closes (proxy.cc's Dispatch::finish):
// which policy chose which worker and rank, by which branch, what it expected the worker to hold
// (kv_exact: pages; cache_aware: characters) and what the engine then reported cached.
//
// Bounded: a ring of kCapacity entries (the oldest overwritten); a client can make entries, never
// more of them. Strings a client controls (the request id) are cut to kMaxRid bytes. Request
// threads add under a mutex held for a copy; the admin API reads a copy of the ring.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvgate {

struct DecisionRecord {
  uint64_t seq = 0;                            // 1, 2, ... in the order added (set by add())
  std::chrono::system_clock::time_point time;  // when the dispatch closed
  double duration_ms = 0;                      // dispatch opened -> closed
  std::string rid;
  std::string rule;
  std::string worker;  // its URL
  // Static storage (policy names, branches, route labels, role labels, admitted model labels).
  std::string_view route;
  std::string_view model;
  std::string_view policy;
  std::string_view branch;
  std::string_view fallback_branch;  // kv_exact's fallback: the inner policy's branch
  std::string_view role;             // regular, prefill, decode
  int rank = -1;                     // DP rank the decision named; -1: none
  int attempt = 1;                   // 1: the request's first attempt
  int status = 0;
  bool started = true;  // false: the worker certainly did not run it
  // What the policy expected the worker to hold: kv_exact in tokens (whole pages of page_size),
  // cache_aware in characters of the request text.
  int64_t page_size = 0;  // kv_exact's page size; 0 for other policies
  uint64_t predicted_tokens = 0;
  uint64_t predicted_chars = 0;
  uint64_t request_tokens = 0;  // the request's own tokens, when kvgate tokenized it
  uint64_t request_chars = 0;   // characters of the routing text, when the policy matched it
  // As the engine reported them for this attempt (usage / meta_info), when it did.
  std::optional<int64_t> prompt_tokens;
  std::optional<int64_t> cached_tokens;

  // kv_exact decided on the pages it matched (not its fallback): the prediction is in pages.
  bool by_pages() const { return page_size > 0 && fallback_branch.empty(); }
  uint64_t pages(uint64_t tokens) const { return tokens / static_cast<uint64_t>(page_size); }
};

// The tokens a decision expected cached on its worker, comparable with the engine's
// cached_tokens: kv_exact's predicted tokens; cache_aware's predicted characters scaled by the
// prompt's tokens per character (needs the engine's prompt_tokens); 0 otherwise.
uint64_t predicted_cached_tokens(const DecisionRecord& r);
uint64_t predicted_cached_tokens(uint64_t predicted_tokens, uint64_t predicted_chars,
                                 uint64_t request_chars, std::optional<int64_t> prompt_tokens);

// One sentence saying why the decision went where it did, and how the prediction turned out.
std::string explain(const DecisionRecord& r);

class DecisionLog {
 public:
  static constexpr size_t kCapacity = 256;
  static constexpr size_t kMaxRid = 64;

  DecisionLog() { ring_.resize(kCapacity); }
  DecisionLog(const DecisionLog&) = delete;
  DecisionLog& operator=(const DecisionLog&) = delete;

  void add(DecisionRecord r);
  // The newest `n` (at most kCapacity), newest first.
  std::vector<DecisionRecord> recent(size_t n) const;
  // Entries added since start (what was overwritten included).
  uint64_t total() const;

 private:
  mutable std::mutex mu_;
  std::vector<DecisionRecord> ring_;
  uint64_t added_ = 0;
};

}  // namespace kvgate
