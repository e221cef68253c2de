#include "gateway/decision_log.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace kvgate {

uint64_t predicted_cached_tokens(uint64_t predicted_tokens, uint64_t predicted_chars,
                                 uint64_t request_chars, std::optional<int64_t> prompt_tokens) {
  if (predicted_tokens > 0) return predicted_tokens;
  if (predicted_chars == 0 || request_chars == 0 || !prompt_tokens || *prompt_tokens <= 0) {
    return 0;
  }
  double share =
      std::min(1.0, static_cast<double>(predicted_chars) / static_cast<double>(request_chars));
  return static_cast<uint64_t>(std::floor(share * static_cast<double>(*prompt_tokens)));
}

uint64_t predicted_cached_tokens(const DecisionRecord& r) {
  return predicted_cached_tokens(r.predicted_tokens, r.predicted_chars, r.request_chars,
                                 r.prompt_tokens);
}

std::string explain(const DecisionRecord& r) {
  std::string out(r.branch.empty() ? "?" : r.branch);
  if (!r.fallback_branch.empty()) {
    out += " (the fallback chose: ";
    out += r.fallback_branch;
    out += ')';
  }
  out += ": ";
  std::string where = r.rank >= 0 ? "rank " + std::to_string(r.rank) + " of " + r.worker : r.worker;
  if (r.by_pages()) {
    out += where + " holds " + std::to_string(r.pages(r.predicted_tokens)) + " of the prompt's " +
           std::to_string(r.pages(r.request_tokens)) + " full pages (" +
           std::to_string(r.predicted_tokens) + " of " + std::to_string(r.request_tokens) +
           " tokens)";
  } else if (r.request_chars > 0) {
    char share[32];
    std::snprintf(
        share, sizeof share, "%.0f%%",
        100.0 * static_cast<double>(r.predicted_chars) / static_cast<double>(r.request_chars));
    out += where + " was believed to hold " + std::to_string(r.predicted_chars) + " of the " +
           std::to_string(r.request_chars) + " characters (" + share + ")";
  } else {
    out += "sent to " + where;
  }
  if (r.attempt > 1) out += "; attempt " + std::to_string(r.attempt);
  if (!r.started) {
    out += "; the worker did not run it (status " + std::to_string(r.status) + ")";
  } else if (r.cached_tokens && r.prompt_tokens) {
    out += "; the engine reported " + std::to_string(*r.cached_tokens) + " of " +
           std::to_string(*r.prompt_tokens) + " prompt tokens cached";
    if (uint64_t p = predicted_cached_tokens(r); p > 0 || r.page_size > 0 || r.request_chars > 0) {
      out += " (predicted " + std::to_string(p) + ")";
    }
  } else if (r.status >= 400 || r.status == 0) {
    out += "; status " + std::to_string(r.status);
  } else {
    out += "; the engine reported no cache figures";
  }
  return out;
}

void DecisionLog::add(DecisionRecord r) {
  if (r.rid.size() > kMaxRid) r.rid.resize(kMaxRid);
  std::lock_guard lock(mu_);
  r.seq = ++added_;
  ring_[(r.seq - 1) % kCapacity] = std::move(r);
}

std::vector<DecisionRecord> DecisionLog::recent(size_t n) const {
  std::lock_guard lock(mu_);
  n = std::min({n, kCapacity, static_cast<size_t>(added_)});
  std::vector<DecisionRecord> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) out.push_back(ring_[(added_ - 1 - i) % kCapacity]);
  return out;
}

uint64_t DecisionLog::total() const {
  std::lock_guard lock(mu_);
  return added_;
}

}  // namespace kvgate
