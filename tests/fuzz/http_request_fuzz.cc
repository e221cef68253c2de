// Fuzz target: the request parser the server runs on client bytes (http/parser's HeadParser and
// ChunkedDecoder with the server's limits), fed in arbitrary pieces as TCP might deliver them,
// several pipelined messages in a row. Checks what the server relies on: the head lies within
// the bytes given, every field it hands on is a token name and a value without CR, LF or other
// control characters (no header injection when forwarded), a request never has two framings, and
// the decoder never returns more than it was given or more than the body limit.
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
constexpr uint64_t kBodyLimit = 1 << 16;

void check(bool ok) {
  if (!ok) __builtin_trap();
}

bool within(std::string_view v, const char* base, size_t size) {
  return v.data() >= base && v.data() + v.size() <= base + size;
}

void check_head(const HeadParser& h, const char* base) {
  size_t n = h.head_size();
  check(h.version() == 10 || h.version() == 11);
  for (size_t i = 0; i < h.field_count(); ++i) {
    std::string_view name = h.name(i), value = h.value(i);
    check(within(name, base, n) && within(value, base, n) && !name.empty());
    for (char c : name) {
      auto u = static_cast<unsigned char>(c);
      check(u > 0x20 && u < 0x7f && c != ':' && c != '"' && c != '(' && c != ',');
    }
    for (char c : value) {
      auto u = static_cast<unsigned char>(c);
      check((u >= 0x20 || c == '\t') && u != 0x7f);
    }
    if (!value.empty()) {
      check(value.front() != ' ' && value.front() != '\t');
      check(value.back() != ' ' && value.back() != '\t');
    }
    check(h.find(name).data() != nullptr);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // The first byte chooses how the input is split and how much room chunk data gets.
  size_t piece = 1 + data[0] % 64;
  size_t room = 1 + (data[0] >> 6) * 50;
  std::string_view in(reinterpret_cast<const char*>(data + 1), size - 1);
  size_t fed = 0;  // bytes of `in` received so far
  size_t pos = 0;  // where the current message starts
  auto receive = [&] {
    if (fed == in.size()) return false;
    fed = std::min(in.size(), fed + piece);
    return true;
  };
  HeadParser head(HeadParser::Kind::kRequest);
  ChunkedDecoder chunks;
  for (int message = 0; message < 4 && pos < in.size(); ++message) {
    head.reset();
    if (fed < pos) fed = pos;
    ParseStatus st;
    for (;;) {
      st = head.parse(in.data() + pos, fed - pos, kHeaderLimit);
      if (st != ParseStatus::kNeedMore) break;
      if (!receive()) return 0;
    }
    if (st == ParseStatus::kError) return 0;
    check(head.done() && head.head_size() <= fed - pos && head.head_size() <= kHeaderLimit);
    check_head(head, in.data() + pos);
    check(!head.method().empty() && !head.target().empty());
    for (char c : head.target()) check(static_cast<unsigned char>(c) > 0x20 && c != 0x7f);
    pos += head.head_size();
    BodyFraming framing = head.framing();
    check(framing != BodyFraming::kUntilClose);
    check(!(framing == BodyFraming::kChunked && head.content_length()));
    (void)head.keep_alive();
    (void)head.expect_continue();
    if (framing == BodyFraming::kLength) {
      uint64_t len = *head.content_length();
      check(len > 0);
      if (len > kBodyLimit || len > in.size() - pos) return 0;  // 413, or the body never ends
      pos += len;
    } else if (framing == BodyFraming::kChunked) {
      chunks.reset(kBodyLimit);
      uint64_t total = 0;
      for (;;) {
        if (fed < pos) fed = pos;
        size_t used = 0;
        std::string_view piece_data;
        st = chunks.decode(in.data() + pos, fed - pos, room, used, piece_data);
        check(used <= fed - pos && piece_data.size() <= room);
        if (!piece_data.empty()) check(within(piece_data, in.data() + pos, used));
        total += piece_data.size();
        check(total <= kBodyLimit);
        pos += used;
        if (st == ParseStatus::kDone) break;
        if (st == ParseStatus::kError) return 0;
        if (used == 0 && !receive()) return 0;
      }
    }
  }
  return 0;
}
