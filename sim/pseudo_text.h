// sim/pseudo_text: the simulated model's output. A deterministic stream of word tokens seeded by
// the prompt's token ids and --seed (same prompt + seed = same text; a longer generation extends a
// shorter one), one word per output token, drawn from sim/words.h through the Tokenizer interface.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "sim/tokenizer.h"
#include "util/random.h"

namespace kvgate::sim {

class PseudoText {
 public:
  // Keeps the words that `tokenizer` encodes as one token each (all of them for the stand-in).
  explicit PseudoText(const Tokenizer& tokenizer);

  class Stream {
   public:
    int32_t next();

   private:
    friend class PseudoText;
    Stream(const PseudoText* model, uint64_t seed, bool bare_first)
        : model_(model), rng_(seed), bare_next_(bare_first) {}
    const PseudoText* model_;
    Rng rng_;
    bool bare_next_;
  };

  // The stream continuing `prompt`. The first word has no leading space when the prompt ends in
  // whitespace (or is empty), so the text reads naturally after a chat template's "assistant\n".
  Stream start(std::span<const int32_t> prompt, uint64_t seed) const;
  // The first `n` tokens of start(prompt, seed).
  std::vector<int32_t> generate(std::span<const int32_t> prompt, uint64_t seed, size_t n) const;
  size_t word_count() const { return words_.size(); }

  static uint64_t prompt_hash(std::span<const int32_t> prompt, uint64_t seed);

 private:
  struct Word {
    int32_t bare;
    int32_t spaced;
  };
  const Tokenizer& tokenizer_;
  std::vector<Word> words_;
};

}  // namespace kvgate::sim
