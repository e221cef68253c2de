// Fuzz target: the response parser the upstream client runs on worker bytes (http/parser's
// HeadParser and ChunkedDecoder as UpstreamCall uses them: interim 1xx heads skipped, then the
// final head, then the body in pieces by its framing), fed in arbitrary pieces.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "http/parser.h"

using kvgate::http::BodyFraming;
using kvgate::http::ChunkedDecoder;
using kvgate::http::HeadParser;
using kvgate::http::ParseStatus;

namespace {

constexpr size_t kHeaderLimit = 8192;

void check(bool ok) {
  if (!ok) __builtin_trap();
}

bool within(std::string_view v, const char* base, size_t size) {
  return v.data() >= base && v.data() + v.size() <= base + size;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // The first byte: how the input is split, how much room body pieces get, and whether the
  // request was HEAD.
  size_t piece = 1 + data[0] % 32;
  size_t room = 1 + ((data[0] >> 5) & 3) * 40;
  bool head_request = (data[0] & 0x80) != 0;
  std::string_view in(reinterpret_cast<const char*>(data + 1), size - 1);
  size_t fed = 0, pos = 0;
  auto receive = [&] {
    if (fed == in.size()) return false;
    fed = std::min(in.size(), fed + piece);
    return true;
  };
  HeadParser head(HeadParser::Kind::kResponse);
  for (int interim = 0;; ++interim) {
    head.reset();
    if (fed < pos) fed = pos;
    ParseStatus st;
    for (;;) {
      st = head.parse(in.data() + pos, fed - pos, kHeaderLimit);
      if (st != ParseStatus::kNeedMore) break;
      if (!receive()) return 0;
    }
    if (st == ParseStatus::kError) return 0;
    check(head.head_size() <= fed - pos);
    check(head.status() >= 100 && head.status() <= 999);
    for (size_t i = 0; i < head.field_count(); ++i) {
      check(within(head.name(i), in.data() + pos, head.head_size()));
      check(within(head.value(i), in.data() + pos, head.head_size()));
      for (char c : head.value(i)) check(c != '\r' && c != '\n' && c != '\0');
    }
    pos += head.head_size();
    if (head.status() >= 200) break;
    check(head.framing(head_request) == BodyFraming::kNone);
    if (interim == 8) return 0;
  }
  BodyFraming framing = head.framing(head_request);
  bool keep = head.keep_alive(head_request);
  if (framing == BodyFraming::kUntilClose) check(!keep);
  if (framing == BodyFraming::kLength) {
    check(head.content_length() && *head.content_length() > 0);
  } else if (framing == BodyFraming::kChunked) {
    check(!head.content_length());
    ChunkedDecoder chunks;
    for (;;) {
      if (fed < pos) fed = pos;
      size_t used = 0;
      std::string_view body;
      ParseStatus st = chunks.decode(in.data() + pos, fed - pos, room, used, body);
      check(used <= fed - pos && body.size() <= room);
      if (!body.empty()) check(within(body, in.data() + pos, used));
      pos += used;
      if (st == ParseStatus::kDone) break;
      if (st == ParseStatus::kError) return 0;
      if (used == 0 && !receive()) return 0;
    }
    check(chunks.done());
  }
  return 0;
}
