// gateway/output_events: counts, in a worker's SSE stream as it is relayed, the events that carry
// generated output, for the time to first token and the inter-token latency. Zero-copy: each piece
// is scanned where it lies, with a small carry of the current event's last bytes so that a key
// split between two reads is still found.
//
// An event is the text up to a blank line ("\n\n" or "\n\r\n", as stream_check reads them). It
// carries output when it has, outside any string (a key's own quotes, not escaped ones), one of
//   "content", "text", "reasoning_content", "reasoning", "delta"  followed by a non-empty string,
//   "tool_calls"                                                   followed by a non-empty array,
// (up to 8 spaces allowed after the colon). So these count: SGLang's /generate events (text, the
// whole text so far or the increment), OpenAI chat chunks with content, reasoning or tool calls,
// completions chunks with text, the Responses API's output_text deltas. These do not: the first
// chat chunk that only names the role (`"delta":{"role":"assistant","content":""}`), a finish
// chunk (`"delta":{}`), the usage chunk of stream_options.include_usage (`"choices":[]`), an error
// event, `data: [DONE]`, comments and keep-alives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvgate {

class OutputEventCounter {
 public:
  // Feeds the next piece of the stream; returns how many output events ended in it.
  uint32_t feed(std::string_view piece);
  // Events that ended so far, output or not (tests).
  uint64_t events() const { return events_; }

  static constexpr size_t kCarry = 32;  // longer than a key, 8 spaces and two bytes of value

 private:
  void scan(std::string_view s);
  void scan_segment(std::string_view seg);
  bool output_ = false;    // the event being read carries output (so far)
  char last_[2] = {0, 0};  // the last two bytes fed (a blank line split between pieces)
  std::string carry_;      // the current event's last bytes (at most kCarry)
  uint64_t events_ = 0;
};

}  // namespace kvgate
