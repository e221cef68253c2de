// bench/workload: see workload.h.
#include "bench/workload.h"

#include <simdjson.h>

#include <cmath>
#include <fstream>
#include <set>
#include <unordered_set>

#include "sim/words.h"
#include "util/random.h"

namespace kvgate::bench {

size_t Workload::requests() const {
  size_t n = 0;
  for (const auto& s : sessions) n += s.turns.size();
  return n;
}

std::string word_text(uint64_t seed, size_t n) {
  Rng rng(seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull);
  std::string s;
  s.reserve(n * 6);
  for (size_t i = 0; i < n; ++i) {
    if (i) s.push_back(' ');
    s.append(sim::kWords[rng.below(sim::kWords.size())]);
  }
  return s;
}

namespace {

// Exponential inter-arrival times for a Poisson process of `rate` per second.
double next_gap(Rng& rng, double rate) {
  return -std::log(1.0 - rng.uniform()) / rate;
}

int scaled(int v, double scale) {
  return std::max(1, static_cast<int>(std::lround(v / scale)));
}

}  // namespace

Workload multiturn(const MultiturnOptions& o) {
  Workload w;
  w.name = "multiturn";
  Rng rng(o.seed);
  double t = 0;
  for (int u = 0; u < o.users; ++u) {
    Session s;
    uint64_t user_seed = o.seed * 1000003ull + static_cast<uint64_t>(u);
    if (o.system_words > 0)
      s.system = word_text(user_seed ^ 0x5157, static_cast<size_t>(o.system_words));
    for (int k = 0; k < o.turns; ++k) {
      Turn turn;
      turn.user =
          word_text(user_seed * 31 + static_cast<uint64_t>(k), static_cast<size_t>(o.user_words));
      turn.max_tokens = o.output_tokens;
      // A user's pause is exponential around the mean (a person, not a metronome: fixed pauses
      // keep the users of one server in lockstep, all prefilling in the same step).
      turn.think_s = k == 0 || o.think_s <= 0 ? 0 : next_gap(rng, 1.0 / o.think_s);
      s.turns.push_back(std::move(turn));
    }
    if (o.rate > 0) {
      s.arrival_s = t;
      t += next_gap(rng, o.rate);
    }
    w.sessions.push_back(std::move(s));
  }
  w.open_loop = o.rate > 0;
  w.concurrency = o.concurrency > 0 ? o.concurrency : o.users;
  w.description =
      std::to_string(o.users) + " users x " + std::to_string(o.turns) + " turns, " +
      std::to_string(o.user_words) + " words per message, " + std::to_string(o.output_tokens) +
      " output tokens" +
      (o.system_words ? ", " + std::to_string(o.system_words) + "-word system prompt" : "") +
      (o.rate > 0 ? ", open loop" : ", closed loop");
  return w;
}

Workload shared_prefix(const SharedPrefixOptions& o) {
  Workload w;
  w.name = "shared-prefix";
  int sys = scaled(o.system_tokens, o.scale), q = scaled(o.question_tokens, o.scale);
  int out = scaled(o.output_tokens, o.scale);
  std::vector<Session> all;
  for (int g = 0; g < o.groups; ++g) {
    std::string system =
        word_text(o.seed * 7919 + static_cast<uint64_t>(g), static_cast<size_t>(sys));
    for (int p = 0; p < o.prompts; ++p) {
      Session s;
      s.system = system;
      Turn turn;
      turn.user =
          word_text(o.seed * 104729 + static_cast<uint64_t>(g) * 100003 + static_cast<uint64_t>(p),
                    static_cast<size_t>(q));
      turn.max_tokens = out;
      s.turns.push_back(std::move(turn));
      all.push_back(std::move(s));
    }
  }
  // Shuffle (deterministically) so groups interleave, as they do in SGLang's benchmark.
  Rng rng(o.seed);
  for (size_t i = all.size(); i > 1; --i) std::swap(all[i - 1], all[rng.below(i)]);
  double t = 0;
  for (auto& s : all) {
    if (o.rate > 0) {
      s.arrival_s = t;
      t += next_gap(rng, o.rate);
    }
  }
  w.sessions = std::move(all);
  w.open_loop = o.rate > 0;
  w.concurrency = o.concurrency;
  w.description = std::to_string(o.groups) + " groups x " + std::to_string(o.prompts) +
                  " prompts, system " + std::to_string(sys) + " / question " + std::to_string(q) +
                  " / output " + std::to_string(out) + " tokens";
  return w;
}

namespace {

struct TraceLine {
  double timestamp_ms;
  int64_t input_length;
  int64_t output_length;
  std::vector<uint64_t> hash_ids;
};

std::string read_trace(const TraceOptions& o, std::vector<TraceLine>& out) {
  std::ifstream in(o.path);
  if (!in) return "cannot open trace '" + o.path + "'";
  simdjson::dom::parser parser;
  std::string line;
  size_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty()) continue;
    simdjson::dom::element e;
    std::string where = o.path + ":" + std::to_string(n) + ": ";
    if (parser.parse(line).get(e)) return where + "not valid JSON";
    TraceLine t{};
    double ts = 0;
    if (e["timestamp"].get_double().get(ts)) {
      int64_t its = 0;
      if (e["timestamp"].get_int64().get(its)) return where + "missing \"timestamp\"";
      ts = static_cast<double>(its);
    }
    t.timestamp_ms = ts;
    if (e["input_length"].get_int64().get(t.input_length) || t.input_length <= 0) {
      return where + "missing or bad \"input_length\"";
    }
    if (e["output_length"].get_int64().get(t.output_length)) {
      return where + "missing \"output_length\"";
    }
    simdjson::dom::array ids;
    if (e["hash_ids"].get_array().get(ids)) return where + "missing \"hash_ids\"";
    for (auto id : ids) {
      uint64_t v = 0;
      if (id.get_uint64().get(v)) return where + "\"hash_ids\" must hold integers";
      t.hash_ids.push_back(v);
    }
    out.push_back(std::move(t));
    if (o.max_requests && out.size() >= o.max_requests) break;
  }
  if (out.empty()) return "trace '" + o.path + "' has no requests";
  return "";
}

}  // namespace

std::string trace(const TraceOptions& o, Workload& w) {
  std::vector<TraceLine> lines;
  if (std::string e = read_trace(o, lines); !e.empty()) return e;
  w = Workload{};
  w.name = "trace";
  int block_words = scaled(o.block_tokens, o.length_scale);
  double t0 = lines.front().timestamp_ms;
  for (const auto& l : lines) {
    int words = scaled(static_cast<int>(l.input_length), o.length_scale);
    std::string prompt;
    for (size_t b = 0; b < l.hash_ids.size() && words > 0; ++b) {
      int take = std::min(words, block_words);
      if (!prompt.empty()) prompt.push_back(' ');
      std::string block =
          word_text(l.hash_ids[b] * 2654435761ull + 17, static_cast<size_t>(block_words));
      // Keep `take` words of the block.
      size_t pos = 0;
      for (int k = 0; k < take && pos != std::string::npos; ++k) pos = block.find(' ', pos + 1);
      prompt.append(pos == std::string::npos ? block : block.substr(0, pos));
      words -= take;
    }
    Session s;
    Turn turn;
    turn.user = std::move(prompt);
    turn.max_tokens =
        scaled(static_cast<int>(std::max<int64_t>(1, l.output_length)), o.length_scale);
    s.turns.push_back(std::move(turn));
    s.arrival_s = (l.timestamp_ms - t0) / 1000.0 / o.time_scale;
    w.sessions.push_back(std::move(s));
  }
  w.open_loop = true;
  w.concurrency = 0;
  w.description = std::to_string(lines.size()) + " requests of " + o.path + ", time / " +
                  std::to_string(o.time_scale).substr(0, 5) + ", lengths / " +
                  std::to_string(o.length_scale).substr(0, 5);
  return "";
}

double trace_upper_bound(const TraceOptions& o, std::string& error) {
  std::vector<TraceLine> lines;
  error = read_trace(o, lines);
  if (!error.empty()) return 0;
  // A block counts when the whole prefix of blocks up to it was seen before (chained).
  std::unordered_set<uint64_t> seen;
  double total = 0, reusable = 0;
  for (const auto& l : lines) {
    total += static_cast<double>(l.input_length);
    uint64_t chain = 0xcbf29ce484222325ull;
    bool prefix = true;
    int64_t covered = 0;
    for (uint64_t id : l.hash_ids) {
      chain = (chain ^ id) * 0x100000001b3ull + (chain >> 29);
      int64_t block = std::min<int64_t>(o.block_tokens, l.input_length - covered);
      if (block <= 0) break;
      if (prefix && seen.count(chain)) {
        reusable += static_cast<double>(block);
      } else {
        prefix = false;
      }
      covered += block;
      seen.insert(chain);
    }
  }
  return total > 0 ? reusable / total : 0;
}

}  // namespace kvgate::bench
