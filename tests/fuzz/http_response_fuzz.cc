// Fuzz target: the HTTP/1.1 response parser the upstream client runs on worker bytes (Beast's
// parser with a buffer body, as UpstreamCall reads it: head, then body pieces).
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/parser.hpp>
#include <cstddef>
#include <cstdint>

namespace bhttp = boost::beast::http;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  bhttp::response_parser<bhttp::buffer_body> parser;
  parser.header_limit(8192);
  parser.body_limit(boost::none);
  boost::beast::error_code ec;
  const char* p = reinterpret_cast<const char*>(data);
  size_t left = size;
  char body[97];
  while (left > 0 && !parser.is_done()) {
    parser.get().body().data = body;
    parser.get().body().size = sizeof body;
    size_t used = parser.put(boost::asio::buffer(p, left), ec);
    if (ec == bhttp::error::need_buffer) ec = {};
    if (ec) return 0;
    if (used == 0 && parser.get().body().size == sizeof body) return 0;  // no progress
    p += used;
    left -= used;
  }
  if (parser.is_header_done()) {
    (void)parser.get().result_int();
    (void)parser.content_length();
    (void)parser.keep_alive();
  }
  return 0;
}
