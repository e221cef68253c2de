// gateway/output_events: counts, in a worker's SSE stream as it is relayed, the events that carry
// generated output, for the time to first token and the inter-token latency. Zero-copy: each piece
// is scanned where it lies, with a small carry of the current event's last bytes so that a key
// split between two reads is still found.
//
// An event is the text up to a blank line ("\n\n" or "\n\r\n", as stream_check reads them). Keys
// are read outside any string (a key's own quotes, not escaped ones), with up to 8 spaces after
// the colon. Which events carry output depends on the stream's shape:
//
// kDefault (/generate, /v1/chat/completions, /v1/completions): an event that has one of
//   "content", "text", "reasoning_content", "reasoning", "delta"  followed by a non-empty string,
//   "tool_calls"                                                   followed by a non-empty array.
// So SGLang's /generate events (text, the whole text so far or the increment), OpenAI chat chunks
// with content, reasoning or tool calls and completions chunks with text count. These do not: the
// first chat chunk that only names the role (`"delta":{"role":"assistant","content":""}`), a
// finish chunk (`"delta":{}`), the usage chunk of stream_options.include_usage (`"choices":[]`),
// an error event, `data: [DONE]`, comments and keep-alives.
//
// kResponses (/v1/responses): only the delta events, one per increment: an event whose "type" is
// a string ending in ".delta" (at most 48 characters: response.output_text.delta,
// response.reasoning_text.delta, response.function_call_arguments.delta, ...) and whose "delta" is
// a non-empty string. The events that repeat the whole text (response.output_text.done,
// response.content_part.done, response.output_item.done, response.completed with the response)
// and the lifecycle events (response.created, response.in_progress, *.added) do not count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvgate {

class OutputEventCounter {
 public:
  enum class Format { kDefault, kResponses };
  explicit OutputEventCounter(Format format = Format::kDefault) : format_(format) {}

  // Feeds the next piece of the stream; returns how many output events ended in it.
  uint32_t feed(std::string_view piece);
  // Events that ended so far, output or not (tests).
  uint64_t events() const { return events_; }

  // Longer than what decides a key: the byte before it, the key, 8 spaces and the bytes of value
  // it looks at (kResponses: "type" and a string of up to 48 characters, 66 bytes in all).
  static constexpr size_t kCarry = 72;

 private:
  void scan(std::string_view s);
  void scan_responses(std::string_view s);
  void scan_segment(std::string_view seg);
  Format format_;
  bool output_ = false;  // the event being read carries output (so far)
  // kResponses: the event read so far has a non-empty "delta" string, a "type" ending in .delta.
  bool delta_ = false;
  bool delta_type_ = false;
  char last_[2] = {0, 0};  // the last two bytes fed (a blank line split between pieces)
  std::string carry_;      // the current event's last bytes (at most kCarry)
  uint64_t events_ = 0;
};

}  // namespace kvgate
