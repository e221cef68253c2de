// sim/pseudo_text: see pseudo_text.h.
#include "sim/pseudo_text.h"

#include <string>

#include "sim/words.h"

namespace kvgate::sim {
namespace {

uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The id of `text` when the tokenizer encodes it as exactly one token, else -1.
int32_t single_token(const Tokenizer& tok, std::string_view text) {
  std::vector<int32_t> ids;
  tok.encode(text, ids);
  return ids.size() == 1 ? ids[0] : -1;
}

}  // namespace

PseudoText::PseudoText(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {
  std::string spaced;
  for (auto w : kWords) {
    spaced.assign(" ").append(w);
    int32_t s = single_token(tokenizer, spaced);
    if (s < 0) continue;
    int32_t b = single_token(tokenizer, w);
    words_.push_back({b >= 0 ? b : s, s});
  }
  if (words_.empty()) {  // a tokenizer with no word tokens: fall back to letters
    std::vector<int32_t> ids;
    tokenizer.encode("a", ids);
    words_.push_back({ids.at(0), ids.at(0)});
  }
}

uint64_t PseudoText::prompt_hash(std::span<const int32_t> prompt, uint64_t seed) {
  uint64_t h = mix(seed ^ 0x6b76676174652d73ull);
  for (int32_t id : prompt) h = mix(h ^ static_cast<uint32_t>(id));
  return mix(h ^ prompt.size());
}

PseudoText::Stream PseudoText::start(std::span<const int32_t> prompt, uint64_t seed) const {
  bool bare = true;
  if (!prompt.empty()) {
    std::string last;
    tokenizer_.decode_token(prompt.back(), last);
    char c = last.empty() ? ' ' : last.back();
    bare = c == ' ' || c == '\n' || c == '\t' || c == '\r' || tokenizer_.is_special(prompt.back());
  }
  return Stream(this, prompt_hash(prompt, seed), bare);
}

int32_t PseudoText::Stream::next() {
  const Word& w = model_->words_[rng_.below(model_->words_.size())];
  bool bare = bare_next_;
  bare_next_ = false;
  return bare ? w.bare : w.spaced;
}

std::vector<int32_t> PseudoText::generate(std::span<const int32_t> prompt, uint64_t seed,
                                          size_t n) const {
  std::vector<int32_t> out;
  out.reserve(n);
  Stream s = start(prompt, seed);
  for (size_t i = 0; i < n; ++i) out.push_back(s.next());
  return out;
}

}  // namespace kvgate::sim
