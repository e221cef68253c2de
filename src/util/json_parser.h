// util/json_parser: keeping a thread's reusable simdjson DOM parser from holding an outsized
// buffer. A parser's buffers grow to the largest document it parsed and stay that size, so after
// one 500 MB body every thread that parsed one would keep that much for good. Callers that keep a
// parser per thread release it once the document it parsed is no longer used.
#pragma once

#include <simdjson.h>

#include <cstddef>

namespace kvgate::json {

// Parsers are kept for reuse up to this capacity; beyond it the next document allocates anew.
inline constexpr size_t kParserRetainedBytes = size_t{1} << 20;

// Replaces `p` by a fresh parser when it grew past kParserRetainedBytes (frees its buffers).
inline void release_if_large(simdjson::dom::parser& p) {
  if (p.capacity() > kParserRetainedBytes) p = simdjson::dom::parser();
}

// release_if_large at the end of a scope (after every use of the parsed document).
class ParserRelease {
 public:
  explicit ParserRelease(simdjson::dom::parser& p) : p_(p) {}
  ~ParserRelease() { release_if_large(p_); }
  ParserRelease(const ParserRelease&) = delete;
  ParserRelease& operator=(const ParserRelease&) = delete;

 private:
  simdjson::dom::parser& p_;
};

}  // namespace kvgate::json
