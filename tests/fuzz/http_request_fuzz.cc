// Fuzz target: the HTTP/1.1 request parser the server runs on client bytes (Beast's parser with
// kvgate's padded body and limits), fed in arbitrary pieces.
#include <boost/beast/http/parser.hpp>
#include <cstddef>
#include <cstdint>

#include "http/padded_body.h"

namespace bhttp = boost::beast::http;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // The first byte chooses how the input is split, as TCP might deliver it.
  size_t piece = 1 + data[0] % 64;
  const char* p = reinterpret_cast<const char*>(data + 1);
  size_t left = size - 1;
  for (int message = 0; message < 4 && left > 0; ++message) {
    bhttp::request_parser<kvgate::http::PaddedStringBody> parser;
    parser.header_limit(8192);
    parser.body_limit(1 << 16);
    boost::beast::error_code ec;
    while (left > 0 && !parser.is_done()) {
      size_t n = std::min(piece, left);
      size_t used = parser.put(boost::asio::buffer(p, n), ec);
      if (ec == bhttp::error::need_more) {
        ec = {};
        if (used == 0 && n == left) return 0;  // needs bytes we do not have
        if (used == 0) {
          piece *= 2;
          continue;
        }
      }
      if (ec) return 0;
      p += used;
      left -= used;
    }
    if (parser.is_done()) {
      auto& req = parser.get();
      (void)req.target();
      (void)req.keep_alive();
      if (req.body().capacity() < req.body().size()) __builtin_trap();
    }
  }
  return 0;
}
