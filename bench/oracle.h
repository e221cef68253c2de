// bench/oracle: the workload's upper bound on cache reuse. It sees every request in arrival order
// as the engine would (the prompt rendered and tokenized exactly as kvgate-sim does) and counts the
// prompt tokens an infinite cache with perfect routing would hold: the leading full pages of the
// prompt that an earlier request's prompt or prompt + output already contained. Pages are compared
// through chained hashes, as SGLang keys its blocks.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

#include "sim/chat_template.h"
#include "sim/tokenizer.h"

namespace kvgate::bench {

class PrefixOracle {
 public:
  PrefixOracle(std::unique_ptr<sim::Tokenizer> tokenizer,
               std::unique_ptr<sim::ChatTemplate> chat_template, int page_size);

  const sim::Tokenizer& tokenizer() const { return *tokenizer_; }
  const sim::ChatTemplate& chat_template() const { return *template_; }

  // The tokens of a prompt: chat messages rendered with the generation prompt, or plain text.
  std::vector<int32_t> chat_tokens(std::span<const sim::ChatMessage> messages) const;
  std::vector<int32_t> text_tokens(std::string_view text) const;

  // A request arrives: returns how many of its tokens were reusable, then records its prompt.
  size_t arrive(std::span<const int32_t> prompt);
  // A request finished: its prompt followed by its output is cached too.
  void finish(std::span<const int32_t> prompt, std::string_view output_text);

  uint64_t prompt_tokens() const { return prompt_tokens_; }
  uint64_t reusable_tokens() const { return reusable_tokens_; }
  double upper_bound() const {
    return prompt_tokens_
               ? static_cast<double>(reusable_tokens_) / static_cast<double>(prompt_tokens_)
               : 0;
  }

 private:
  void insert(std::span<const int32_t> tokens);

  std::unique_ptr<sim::Tokenizer> tokenizer_;
  std::unique_ptr<sim::ChatTemplate> template_;
  size_t page_;
  std::mutex mu_;
  std::unordered_set<uint64_t> pages_;  // chained hash of every full-page prefix seen
  uint64_t prompt_tokens_ = 0;
  uint64_t reusable_tokens_ = 0;
};

}  // namespace kvgate::bench
