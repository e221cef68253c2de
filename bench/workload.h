// bench/workload: the request streams kvgate-bench drives, deterministic from a seed. A workload is
// a list of sessions; a session is a system prompt and turns, each turn a new user message whose
// prompt is the whole history so far (the assistant's actual replies included, filled in at run
// time). Sessions start in a closed loop (N users at once) or at open-loop arrival times.
//   multiturn      U users x T turns, like SGLang's bench_multiturn
//   shared-prefix  G groups x P prompts sharing a system prompt, like generated-shared-prefix
//   trace          a Mooncake-format JSONL trace: hash_ids of 512-token blocks become word text,
//                  so equal leading ids share a prefix; timing compressed, lengths scaled
// Text comes from a fixed word list (sim/words.h) so it tokenizes like real text.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace kvgate::bench {

struct Turn {
  std::string user;     // the new user message
  int max_tokens = 16;  // output tokens asked for
  double think_s = 0;   // pause before this turn (after the previous reply)
};

struct Session {
  std::string system;  // system prompt ("" = none)
  std::vector<Turn> turns;
  double arrival_s = 0;  // open loop: start time from the beginning of the run
};

struct Workload {
  std::string name;
  std::string description;  // one line: sizes and shape
  std::vector<Session> sessions;
  bool open_loop = false;  // sessions start at arrival_s; else `concurrency` users loop
  int concurrency = 1;
  size_t requests() const;
};

// `n` words of the list, deterministic from `seed`, separated by single spaces (no leading space).
std::string word_text(uint64_t seed, size_t n);

struct MultiturnOptions {
  int users = 8;
  int turns = 4;
  int system_words = 0;  // a per-user system prompt (0 = none)
  int user_words = 64;   // each new user message
  int output_tokens = 32;
  double think_s = 0;
  double rate = 0;      // > 0: open loop, users arrive at this rate (Poisson), else closed loop
  int concurrency = 0;  // closed loop: users at once (0 = all)
  uint64_t seed = 1;
};
Workload multiturn(const MultiturnOptions& o);

struct SharedPrefixOptions {
  int groups = 64;
  int prompts = 16;  // per group
  int system_tokens = 2048;
  int question_tokens = 128;
  int output_tokens = 256;
  double scale = 1;  // sizes are divided by this
  int concurrency = 16;
  double rate = 0;  // > 0: open loop at this request rate
  uint64_t seed = 1;
};
Workload shared_prefix(const SharedPrefixOptions& o);

struct TraceOptions {
  std::string path;
  double time_scale = 1;    // timestamps are divided by this (10 = ten times faster)
  double length_scale = 1;  // token counts are divided by this
  size_t max_requests = 0;  // 0 = all
  int block_tokens = 512;   // tokens per hash id (Mooncake: 512)
};
// Returns "" or an error naming the file, line and problem.
std::string trace(const TraceOptions& o, Workload& w);

// The trace's own upper bound (as in shared/data/mooncake/README.md): the share of input tokens in
// leading blocks already seen in an earlier request, whole blocks capped at the input length.
double trace_upper_bound(const TraceOptions& o, std::string& error);

}  // namespace kvgate::bench
