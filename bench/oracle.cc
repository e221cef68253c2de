// bench/oracle: see oracle.h.
#include "bench/oracle.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace kvgate::bench {
namespace {

uint64_t chain(uint64_t parent, std::span<const int32_t> page) {
  return XXH64(page.data(), page.size_bytes(), parent ^ 0x9e3779b97f4a7c15ull);
}

}  // namespace

PrefixOracle::PrefixOracle(std::unique_ptr<sim::Tokenizer> tokenizer,
                           std::unique_ptr<sim::ChatTemplate> chat_template, int page_size)
    : tokenizer_(std::move(tokenizer)),
      template_(std::move(chat_template)),
      page_(static_cast<size_t>(std::max(1, page_size))) {}

std::vector<int32_t> PrefixOracle::chat_tokens(std::span<const sim::ChatMessage> messages) const {
  std::string text;
  template_->render(messages, true, text);
  return text_tokens(text);
}

std::vector<int32_t> PrefixOracle::text_tokens(std::string_view text) const {
  std::vector<int32_t> ids;
  tokenizer_->encode(text, ids);
  return ids;
}

size_t PrefixOracle::arrive(std::span<const int32_t> prompt) {
  std::lock_guard lock(mu_);
  size_t reusable = 0;
  uint64_t h = 0;
  for (size_t i = 0; i + page_ <= prompt.size(); i += page_) {
    h = chain(h, prompt.subspan(i, page_));
    if (!pages_.count(h)) break;
    reusable += page_;
  }
  prompt_tokens_ += prompt.size();
  reusable_tokens_ += reusable;
  insert(prompt);
  return reusable;
}

void PrefixOracle::finish(std::span<const int32_t> prompt, std::string_view output_text) {
  std::vector<int32_t> all(prompt.begin(), prompt.end());
  tokenizer_->encode(output_text, all);
  std::lock_guard lock(mu_);
  insert(all);
}

void PrefixOracle::insert(std::span<const int32_t> tokens) {
  uint64_t h = 0;
  for (size_t i = 0; i + page_ <= tokens.size(); i += page_) {
    h = chain(h, tokens.subspan(i, page_));
    pages_.insert(h);
  }
}

}  // namespace kvgate::bench
