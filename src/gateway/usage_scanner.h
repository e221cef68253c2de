// gateway/usage_scanner: reads the token counts an engine reports out of a response body as it is
// relayed (SGLang's meta_info, OpenAI's usage, streamed usage chunks), whole or as SSE chunks,
// without buffering it: a search for the keys in each piece, with a small carry so a key split
// between pieces is found. The last value seen wins (stream chunks repeat them, cumulative).
//   prompt_tokens, or input_tokens         -> prompt_tokens() (OpenAI and SGLang; the Responses
//                                             API names it input_tokens)
//   cached_tokens                          -> cached_tokens() (SGLang meta_info, OpenAI's
//                                             prompt_tokens_details, the Responses API's
//                                             input_tokens_details)
//   completion_tokens, or output_tokens    -> completion_tokens() (OpenAI and SGLang; the
//                                             Responses API and Anthropic's messages name it
//                                             output_tokens)
// Only whole keys count: input_tokens_details, cache_read_input_tokens or reasoning_tokens are
// other keys.
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
  std::optional<int64_t> completion_tokens() const { return completion_; }

 private:
  void scan(std::string_view s);
  std::string carry_;
  std::optional<int64_t> cached_;
  std::optional<int64_t> prompt_;
  std::optional<int64_t> completion_;
};

}  // namespace kvgate
