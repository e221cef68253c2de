// gateway/usage_scanner: reads cached_tokens and prompt_tokens out of a response body as it is
// relayed (SGLang's meta_info, or OpenAI usage), whole or as SSE chunks, without buffering it: a
// search for the two keys in each piece, with a small carry so a key split between pieces is found.
// The last value seen wins (stream chunks repeat them).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kvgate {

class UsageScanner {
 public:
  void feed(std::string_view data);
  std::optional<int64_t> cached_tokens() const { return cached_; }
  std::optional<int64_t> prompt_tokens() const { return prompt_; }

 private:
  void scan(std::string_view s);
  std::string carry_;
  std::optional<int64_t> cached_;
  std::optional<int64_t> prompt_;
};

}  // namespace kvgate
