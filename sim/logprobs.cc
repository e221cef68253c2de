// sim/logprobs: see logprobs.h.
#include "sim/logprobs.h"

#include <algorithm>
#include <unordered_set>

#include "sim/responses.h"
#include "util/json.h"

namespace kvgate::sim {
namespace {

uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Uniform in [0, 1) from a hash.
double unit(uint64_t h) {
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

// A float32 value, as the engine's logprob tensors hold them.
double f32(double v) {
  return static_cast<double>(static_cast<float>(v));
}

uint64_t position_key(uint64_t seed, int32_t token, int64_t pos) {
  uint64_t h = mix(seed ^ 0x6c6f6770726f6273ull);  // "logprobs"
  h = mix(h ^ static_cast<uint32_t>(token));
  return mix(h ^ static_cast<uint64_t>(pos));
}

// One [logprob, token_id, text-or-null] row; a null logprob when `null_value`.
void append_row(std::string& out, const LogprobModel& m, bool text, bool null_value, double v,
                int32_t id) {
  out.push_back('[');
  if (null_value) {
    out.append("null");
  } else {
    append_double(out, v);
  }
  out.push_back(',');
  append_int(out, id);
  out.push_back(',');
  if (text) {
    // SGLang decodes each id on its own (tokenizer.batch_decode([[id] for id in ids])).
    std::string s;
    m.tokenizer().decode_token(id, s);
    json::append_string(out, s);
  } else {
    out.append("null");
  }
  out.push_back(']');
}

// The top-k rows of one position.
void append_top(std::string& out, const LogprobModel& m, bool text, int32_t token, int64_t pos,
                size_t k) {
  thread_local std::vector<std::pair<double, int32_t>> top;
  top.clear();
  m.top(token, pos, k, top);
  out.push_back('[');
  for (size_t i = 0; i < top.size(); ++i) {
    if (i) out.push_back(',');
    append_row(out, m, text, false, top[i].first, top[i].second);
  }
  out.push_back(']');
}

// The token_ids_logprob rows of one position (one per requested id, in the request's order).
void append_ids(std::string& out, const LogprobModel& m, bool text, int32_t token, int64_t pos,
                std::span<const int32_t> ids) {
  out.push_back('[');
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out.push_back(',');
    append_row(out, m, text, false, m.logprob_of(token, pos, ids[i]), ids[i]);
  }
  out.push_back(']');
}

}  // namespace

double LogprobModel::logprob(int32_t token, int64_t pos) const {
  const double u = unit(position_key(seed_, token, pos));
  return f32(-(0.001 + 2.999 * u * u));
}

void LogprobModel::top(int32_t token, int64_t pos, size_t k,
                       std::vector<std::pair<double, int32_t>>& out) const {
  if (k == 0) return;
  const auto vocab = static_cast<uint64_t>(std::max(tokenizer_.vocab_size(), 1));
  k = std::min<size_t>(k, vocab);
  const uint64_t key = position_key(seed_, token, pos);
  double v = logprob(token, pos);
  out.emplace_back(v, token);
  std::unordered_set<int32_t> used{token};
  for (size_t j = 1; j < k; ++j) {
    const uint64_t h = mix(key ^ (j * 0x9e3779b97f4a7c15ull));
    auto id = static_cast<int32_t>(h % vocab);
    while (used.contains(id)) id = static_cast<int32_t>((static_cast<uint64_t>(id) + 1) % vocab);
    used.insert(id);
    // Strictly below the previous one (by far more than a float32 step at these magnitudes).
    v = f32(v - (0.01 + 1.5 * unit(mix(h))));
    out.emplace_back(v, id);
  }
}

double LogprobModel::logprob_of(int32_t token, int64_t pos, int32_t candidate) const {
  const double v = logprob(token, pos);
  if (candidate == token) return v;
  const uint64_t h = mix(position_key(seed_, token, pos) ^ static_cast<uint32_t>(candidate));
  return f32(v - (0.5 + 15.0 * unit(h)));
}

void append_logprob_keys(std::string& out, const LogprobRows& r) {
  if (!r.model || !r.params) return;
  const LogprobModel& m = *r.model;
  const LogprobParams& lp = *r.params;
  const bool text = lp.return_text_in_logprobs;
  const auto n = static_cast<int64_t>(r.prompt.size());
  // The prompt rows: from the first row's position to the prompt's end; the first has no logprob
  // (SGLang: [None] + the computed ones minus the last, which is the first output token's).
  const int64_t first = std::clamp<int64_t>(lp.first_input_row(n), 0, n);
  const int64_t input_end = r.prompt_rows ? n : first;
  const size_t from = std::min(r.output_from, r.output.size());
  auto out_pos = [n](size_t j) { return n + static_cast<int64_t>(j); };

  out.append(R"(,"input_token_logprobs":[)");
  for (int64_t p = first; p < input_end; ++p) {
    if (p > first) out.push_back(',');
    const int32_t id = r.prompt[static_cast<size_t>(p)];
    append_row(out, m, text, p == first, p == first ? 0 : m.logprob(id, p), id);
  }
  out.append(R"(],"output_token_logprobs":[)");
  for (size_t j = from; j < r.output.size(); ++j) {
    if (j > from) out.push_back(',');
    append_row(out, m, text, false, m.logprob(r.output[j], out_pos(j)), r.output[j]);
  }
  out.append(R"(],"output_token_logprobs_length":)");
  append_int(out, static_cast<int64_t>(r.output.size()));

  if (lp.top_logprobs_num > 0) {
    const auto k = static_cast<size_t>(lp.top_logprobs_num);
    out.append(R"(,"input_top_logprobs":[)");
    for (int64_t p = first; p < input_end; ++p) {
      if (p > first) out.push_back(',');
      if (p == first) {
        out.append("null");
      } else {
        append_top(out, m, text, r.prompt[static_cast<size_t>(p)], p, k);
      }
    }
    out.append(R"(],"output_top_logprobs":[)");
    for (size_t j = from; j < r.output.size(); ++j) {
      if (j > from) out.push_back(',');
      append_top(out, m, text, r.output[j], out_pos(j), k);
    }
    out.push_back(']');
  }

  if (!lp.token_ids.empty()) {
    out.append(R"(,"input_token_ids_logprobs":[)");
    for (int64_t p = first; p < input_end; ++p) {
      if (p > first) out.push_back(',');
      if (p == first) {
        out.append("null");
      } else {
        append_ids(out, m, text, r.prompt[static_cast<size_t>(p)], p, lp.token_ids);
      }
    }
    // A decode server's list starts at its second output token (the first came from the
    // prefill without this row); an incremental chunk cuts the same count off its front as off
    // the other output lists.
    const size_t start = (r.prompt_rows ? 0 : 1) + from;
    out.append(R"(],"output_token_ids_logprobs":[)");
    for (size_t j = start; j < r.output.size(); ++j) {
      if (j > start) out.push_back(',');
      append_ids(out, m, text, r.output[j], out_pos(j), lp.token_ids);
    }
    out.push_back(']');
  }
}

}  // namespace kvgate::sim
