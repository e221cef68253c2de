// http/parser: see parser.h.
#include "http/parser.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "http/message.h"

namespace kvgate::http {

namespace {

enum : uint8_t {
  kToken = 1,   // tchar (RFC 9110 5.6.2)
  kValue = 2,   // field-vchar, SP or HTAB (RFC 9110 5.5): no CTL but HTAB, no DEL
  kTarget = 4,  // request-target: VCHAR or obs-text (no SP, no CTL, no DEL)
  kQdText = 8,  // quoted-string's qdtext (RFC 9110 5.6.4)
};

constexpr bool tchar(unsigned c) {
  if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return true;
  switch (c) {
    case '!':
    case '#':
    case '$':
    case '%':
    case '&':
    case '\'':
    case '*':
    case '+':
    case '-':
    case '.':
    case '^':
    case '_':
    case '`':
    case '|':
    case '~':
      return true;
    default:
      return false;
  }
}

struct Table {
  uint8_t c[256] = {};
};

constexpr Table make_table() {
  Table t;
  for (unsigned c = 0; c < 256; ++c) {
    uint8_t v = 0;
    if (tchar(c)) v |= kToken;
    bool vchar = (c >= 0x21 && c <= 0x7e) || c >= 0x80;
    if (vchar || c == ' ' || c == '\t') v |= kValue;
    if (vchar) v |= kTarget;
    if ((vchar && c != '"' && c != '\\') || c == ' ' || c == '\t') v |= kQdText;
    t.c[c] = v;
  }
  return t;
}
constexpr Table kTable = make_table();

inline bool is(char c, uint8_t cls) {
  return (kTable.c[static_cast<unsigned char>(c)] & cls) != 0;
}

// Whether every byte of [p, end) is of class `cls`. Eight bytes at a time while no byte is below
// `low` or DEL (the classes checked this way allow every other byte, but HTAB for kValue).
inline bool all_of(const char* p, const char* end, uint8_t cls, unsigned char low) {
  constexpr uint64_t kOnes = 0x0101010101010101ull;
  constexpr uint64_t kHigh = 0x8080808080808080ull;
  const uint64_t below = kOnes * low;
  const uint64_t del = kOnes * 0x7f;
  while (end - p >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    uint64_t x = w ^ del;
    // A byte below `low` (of those under 0x80), or a byte equal to DEL: check them one by one.
    if ((((w - below) & ~w) | ((x - kOnes) & ~x)) & kHigh) break;
    p += 8;
  }
  for (; p < end; ++p) {
    if (!is(*p, cls)) return false;
  }
  return true;
}

inline const char* skip_ws(const char* p, const char* end) {
  while (p < end && (*p == ' ' || *p == '\t')) ++p;
  return p;
}

inline std::string_view trim(std::string_view v) {
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
  return v;
}

// Calls fn(element) for each non-empty element of a comma-separated list (RFC 9110 5.6.1:
// elements separated by OWS "," OWS; empty ones allowed). Returns false when fn does.
template <class Fn>
bool for_each_element(std::string_view v, Fn&& fn) {
  while (true) {
    size_t comma = v.find(',');
    std::string_view e = trim(v.substr(0, comma));
    if (!e.empty() && !fn(e)) return false;
    if (comma == std::string_view::npos) return true;
    v.remove_prefix(comma + 1);
  }
}

bool is_token(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!is(c, kToken)) return false;
  }
  return true;
}

// chunk-ext = *( BWS ";" BWS chunk-ext-name [ BWS "=" BWS chunk-ext-val ] ) (RFC 9112 7.1.1)
bool valid_chunk_ext(const char* p, const char* end) {
  while (p < end) {
    p = skip_ws(p, end);
    if (p == end || *p != ';') return false;
    p = skip_ws(p + 1, end);
    const char* name = p;
    while (p < end && is(*p, kToken)) ++p;
    if (p == name) return false;
    const char* q = skip_ws(p, end);
    if (q == end || *q != '=') continue;  // no value; the next extension, or the end
    p = skip_ws(q + 1, end);
    if (p == end) return false;
    if (*p == '"') {
      ++p;
      for (;;) {
        if (p == end) return false;
        if (*p == '"') break;
        if (*p == '\\') {
          if (++p == end || !is(*p, kValue)) return false;
        } else if (!is(*p, kQdText)) {
          return false;
        }
        ++p;
      }
      ++p;
    } else {
      const char* val = p;
      while (p < end && is(*p, kToken)) ++p;
      if (p == val) return false;
    }
  }
  return true;
}

// A trailer field line (without its CRLF): field-name ":" OWS field-value OWS.
bool valid_field_line(const char* p, const char* end) {
  const char* name = p;
  while (p < end && is(*p, kToken)) ++p;
  if (p == name || p == end || *p != ':') return false;
  return all_of(p + 1, end, kValue, 0x20);
}

int unhex(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string_view describe(ParseError e) {
  switch (e) {
    case ParseError::kNone:
      return "no error";
    case ParseError::kHeaderLimit:
      return "header section too large";
    case ParseError::kBodyLimit:
      return "body too large";
    case ParseError::kBadLineEnding:
      return "bad line ending (CRLF expected)";
    case ParseError::kBadMethod:
      return "bad method";
    case ParseError::kBadTarget:
      return "bad request target";
    case ParseError::kBadVersion:
      return "bad HTTP version";
    case ParseError::kBadStatus:
      return "bad status code";
    case ParseError::kBadReason:
      return "bad reason phrase";
    case ParseError::kBadFieldName:
      return "bad header field name";
    case ParseError::kBadFieldValue:
      return "bad header field value";
    case ParseError::kObsFold:
      return "folded header line (obs-fold)";
    case ParseError::kBadContentLength:
      return "bad Content-Length";
    case ParseError::kConflictingLength:
      return "conflicting Content-Length values";
    case ParseError::kLengthWithEncoding:
      return "both Content-Length and Transfer-Encoding";
    case ParseError::kBadTransferEncoding:
      return "unsupported Transfer-Encoding";
    case ParseError::kBadConnection:
      return "bad Connection header";
    case ParseError::kBadChunkSize:
      return "bad chunk size";
    case ParseError::kBadChunkExtension:
      return "bad chunk extension";
    case ParseError::kBadChunkEnd:
      return "chunk data not followed by CRLF";
    case ParseError::kBadTrailer:
      return "bad chunked trailer";
  }
  return "unknown error";
}

// ---- HeadParser ----

void HeadParser::reset() {
  start_done_ = false;
  done_ = false;
  error_ = ParseError::kNone;
  base_ = nullptr;
  line_ = scan_ = head_size_ = 0;
  version_ = 11;
  status_ = 0;
  method_ = method_len_ = target_ = target_len_ = 0;
  has_length_ = chunked_ = expect_seen_ = expect_continue_ = false;
  conn_close_ = conn_keep_alive_ = has_connection_ = false;
  te_fields_ = 0;
  length_ = 0;
  count_ = 0;
  overflow_.clear();
}

ParseStatus HeadParser::parse(const char* data, size_t size, size_t limit) {
  if (done_) return ParseStatus::kDone;
  if (error_ != ParseError::kNone) return ParseStatus::kError;
  base_ = data;
  limit = std::min<size_t>(limit, std::numeric_limits<uint32_t>::max());
  const size_t end = std::min(size, limit);
  for (;;) {
    const void* nl = scan_ < end ? std::memchr(data + scan_, '\n', end - scan_) : nullptr;
    if (nl == nullptr) {
      scan_ = end;
      return size >= limit ? fail(ParseError::kHeaderLimit) : ParseStatus::kNeedMore;
    }
    size_t eol = static_cast<size_t>(static_cast<const char*>(nl) - data);
    if (eol == line_ || data[eol - 1] != '\r') return fail(ParseError::kBadLineEnding);
    const char* ls = data + line_;
    const char* le = data + eol - 1;
    if (!start_done_) {
      bool ok = kind_ == Kind::kRequest ? parse_request_line(ls, le) : parse_status_line(ls, le);
      if (!ok) return ParseStatus::kError;
      start_done_ = true;
    } else if (ls == le) {
      head_size_ = eol + 1;
      ParseError e = finish();
      if (e != ParseError::kNone) return fail(e);
      done_ = true;
      return ParseStatus::kDone;
    } else if (*ls == ' ' || *ls == '\t') {
      return fail(ParseError::kObsFold);
    } else if (!parse_field(ls, le)) {
      return ParseStatus::kError;
    }
    line_ = scan_ = eol + 1;
  }
}

bool HeadParser::parse_request_line(const char* p, const char* end) {
  // request-line = method SP request-target SP HTTP-version
  const char* m = p;
  while (p < end && is(*p, kToken)) ++p;
  if (p == m || p == end || *p != ' ') return bad(ParseError::kBadMethod);
  method_ = static_cast<uint32_t>(m - base_);
  method_len_ = static_cast<uint32_t>(p - m);
  const char* t = ++p;
  const void* sp = std::memchr(t, ' ', static_cast<size_t>(end - t));
  if (sp == nullptr || sp == t) return bad(ParseError::kBadTarget);
  p = static_cast<const char*>(sp);
  if (!all_of(t, p, kTarget, 0x21)) return bad(ParseError::kBadTarget);
  target_ = static_cast<uint32_t>(t - base_);
  target_len_ = static_cast<uint32_t>(p - t);
  ++p;
  if (end - p != 8 || std::memcmp(p, "HTTP/1.", 7) != 0 || (p[7] != '0' && p[7] != '1')) {
    return bad(ParseError::kBadVersion);
  }
  version_ = p[7] == '1' ? 11 : 10;
  return true;
}

bool HeadParser::parse_status_line(const char* p, const char* end) {
  // status-line = HTTP-version SP status-code SP [ reason-phrase ]
  if (end - p < 9 || std::memcmp(p, "HTTP/1.", 7) != 0 || (p[7] != '0' && p[7] != '1') ||
      p[8] != ' ') {
    return bad(ParseError::kBadVersion);
  }
  version_ = p[7] == '1' ? 11 : 10;
  p += 9;
  if (end - p < 4 || p[0] < '1' || p[0] > '9' || p[1] < '0' || p[1] > '9' || p[2] < '0' ||
      p[2] > '9' || p[3] != ' ') {
    return bad(ParseError::kBadStatus);
  }
  status_ = (p[0] - '0') * 100 + (p[1] - '0') * 10 + (p[2] - '0');
  if (!all_of(p + 4, end, kValue, 0x20)) return bad(ParseError::kBadReason);
  return true;
}

bool HeadParser::parse_field(const char* line, const char* end) {
  // field-line = field-name ":" OWS field-value OWS
  const char* p = line;
  while (p < end && is(*p, kToken)) ++p;
  if (p == line || p == end || *p != ':') return bad(ParseError::kBadFieldName);
  const char* colon = p;
  const char* v = skip_ws(p + 1, end);
  if (!all_of(v, end, kValue, 0x20)) return bad(ParseError::kBadFieldValue);
  const char* ve = end;
  while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t')) --ve;
  Field f{static_cast<uint32_t>(line - base_), static_cast<uint32_t>(colon - line),
          static_cast<uint32_t>(v - base_), static_cast<uint32_t>(ve - v)};
  if (count_ < kInlineFields) {
    inline_[count_] = f;
  } else {
    overflow_.push_back(f);
  }
  ++count_;
  return on_field(std::string_view(line, static_cast<size_t>(colon - line)),
                  std::string_view(v, static_cast<size_t>(ve - v)));
}

// Takes what framing and connection handling need from a field.
bool HeadParser::on_field(std::string_view name, std::string_view value) {
  switch (name.size()) {
    case 6:  // expect
      if (!expect_seen_ && iequals_lower(name, "expect")) {
        expect_seen_ = true;
        expect_continue_ = iequals(value, "100-continue");
      }
      return true;
    case 10:  // connection
    case 16:  // proxy-connection (as Beast did: its tokens count too)
      if (bool conn = name.size() == 10 && iequals_lower(name, "connection");
          conn || iequals_lower(name, "proxy-connection")) {
        has_connection_ = has_connection_ || conn;
        bool ok = for_each_element(value, [&](std::string_view e) {
          if (!is_token(e)) return false;
          if (iequals(e, "close")) conn_close_ = true;
          if (iequals(e, "keep-alive")) conn_keep_alive_ = true;
          return true;
        });
        if (!ok) return bad(ParseError::kBadConnection);
      }
      return true;
    case 14:  // content-length
      if (iequals_lower(name, "content-length")) {
        // 1*DIGIT: no sign, no list, no space inside (the value is trimmed already).
        if (value.empty() || value.size() > 20) return bad(ParseError::kBadContentLength);
        uint64_t v = 0;
        for (char c : value) {
          if (c < '0' || c > '9') return bad(ParseError::kBadContentLength);
          uint64_t d = static_cast<uint64_t>(c - '0');
          if (v > (std::numeric_limits<uint64_t>::max() - d) / 10) {
            return bad(ParseError::kBadContentLength);
          }
          v = v * 10 + d;
        }
        if (has_length_ && v != length_) return bad(ParseError::kConflictingLength);
        has_length_ = true;
        length_ = v;
      }
      return true;
    case 17:  // transfer-encoding
      if (iequals_lower(name, "transfer-encoding")) {
        if (te_fields_ < 255) ++te_fields_;
        if (kind_ == Kind::kRequest) {
          // Clients: "chunked" alone, in one field (RFC 9112 6.1: anything else leaves the length
          // unknown, or needs a decoding the worker may not do).
          if (te_fields_ > 1 || !iequals(value, "chunked")) {
            return bad(ParseError::kBadTransferEncoding);
          }
          chunked_ = true;
          return true;
        }
        // Workers: a list of codings (over any number of fields); chunked, if there, last and once.
        bool any = false;
        bool ok = for_each_element(value, [&](std::string_view e) {
          any = true;
          if (chunked_ || !is_token(e)) return false;  // a coding after chunked
          if (iequals(e, "chunked")) chunked_ = true;
          return true;
        });
        if (!ok || !any) return bad(ParseError::kBadTransferEncoding);
      }
      return true;
    default:
      return true;
  }
}

ParseError HeadParser::finish() {
  if (te_fields_ > 0 && has_length_) return ParseError::kLengthWithEncoding;
  return ParseError::kNone;
}

std::string_view HeadParser::find(std::string_view name) const {
  for (size_t i = 0; i < count_; ++i) {
    const Field& f = at(i);
    if (f.name_len == name.size() && iequals(view(f.name, f.name_len), name)) {
      return view(f.value, f.value_len);
    }
  }
  return {};
}

BodyFraming HeadParser::framing(bool head_request) const {
  if (kind_ == Kind::kResponse &&
      (head_request || status_ / 100 == 1 || status_ == 204 || status_ == 304)) {
    return BodyFraming::kNone;
  }
  if (chunked_) return BodyFraming::kChunked;
  if (te_fields_ > 0) return BodyFraming::kUntilClose;  // responses only (requests: refused)
  if (has_length_) return length_ > 0 ? BodyFraming::kLength : BodyFraming::kNone;
  return kind_ == Kind::kRequest ? BodyFraming::kNone : BodyFraming::kUntilClose;
}

bool HeadParser::keep_alive(bool head_request) const {
  bool keep = version_ >= 11 ? !conn_close_ : conn_keep_alive_ && !conn_close_;
  // RFC 9112 6.1: an HTTP/1.0 message with Transfer-Encoding has faulty framing (a 1.0 hop before
  // us may not have read it as chunked): it is processed, then the connection closes.
  if (version_ < 11 && te_fields_ > 0) keep = false;
  return keep && framing(head_request) != BodyFraming::kUntilClose;
}

// ---- ChunkedDecoder ----

void ChunkedDecoder::reset(uint64_t body_limit) {
  state_ = State::kSize;
  error_ = ParseError::kNone;
  limit_ = body_limit;
  total_ = left_ = 0;
  scan_ = trailers_ = 0;
}

ParseStatus ChunkedDecoder::decode(const char* in, size_t size, size_t room, size_t& used,
                                   std::string_view& data) {
  used = 0;
  data = {};
  size_t pos = 0;
  for (;;) {
    switch (state_) {
      case State::kDone:
        used = pos;
        return ParseStatus::kDone;
      case State::kError:
        used = pos;
        return ParseStatus::kError;
      case State::kData: {
        size_t take = static_cast<size_t>(std::min<uint64_t>(left_, std::min(size - pos, room)));
        used = pos;
        if (take == 0) return ParseStatus::kNeedMore;
        data = std::string_view(in + pos, take);
        used = pos + take;
        left_ -= take;
        if (left_ == 0) state_ = State::kDataEnd;
        return ParseStatus::kNeedMore;  // one piece per call
      }
      case State::kDataEnd: {
        size_t have = size - pos;
        if (have >= 1 && in[pos] != '\r') return fail(ParseError::kBadChunkEnd);
        if (have >= 2 && in[pos + 1] != '\n') return fail(ParseError::kBadChunkEnd);
        if (have < 2) {
          used = pos;
          return ParseStatus::kNeedMore;
        }
        pos += 2;
        state_ = State::kSize;
        break;
      }
      case State::kSize:
      case State::kTrailer: {
        // One line: a chunk size (with extensions), or a trailer field (or the blank line).
        bool trailer = state_ == State::kTrailer;
        size_t max = trailer ? kMaxTrailers - trailers_ : kMaxLine;
        size_t end = std::min(size, pos + max);
        size_t from = pos + scan_;
        const void* nl = from < end ? std::memchr(in + from, '\n', end - from) : nullptr;
        if (nl == nullptr) {
          if (size - pos >= max) {
            return fail(trailer ? ParseError::kBadTrailer : ParseError::kBadChunkSize);
          }
          scan_ = end - pos;
          used = pos;
          return ParseStatus::kNeedMore;
        }
        size_t eol = static_cast<size_t>(static_cast<const char*>(nl) - in);
        if (eol == pos || in[eol - 1] != '\r') {
          return fail(trailer ? ParseError::kBadTrailer : ParseError::kBadLineEnding);
        }
        const char* p = in + pos;
        const char* le = in + eol - 1;
        scan_ = 0;
        if (trailer) {
          if (p == le) {  // the blank line: the end of the message
            state_ = State::kDone;
            used = eol + 1;
            return ParseStatus::kDone;
          }
          // No obs-fold (a line starting with whitespace), and a well-formed field otherwise.
          if (!valid_field_line(p, le)) return fail(ParseError::kBadTrailer);
          trailers_ += eol + 1 - pos;
          pos = eol + 1;
          break;
        }
        uint64_t v = 0;
        int d = unhex(*p);
        if (d < 0) return fail(ParseError::kBadChunkSize);
        for (; p < le && (d = unhex(*p)) >= 0; ++p) {
          if (v >> 60) return fail(ParseError::kBadChunkSize);  // more than 64 bits
          v = v * 16 + static_cast<uint64_t>(d);
        }
        if (!valid_chunk_ext(p, le)) return fail(ParseError::kBadChunkExtension);
        pos = eol + 1;
        if (v == 0) {
          state_ = State::kTrailer;
          break;
        }
        if (v > limit_ - total_) return fail(ParseError::kBodyLimit);
        total_ += v;
        left_ = v;
        state_ = State::kData;
        break;
      }
    }
  }
}

}  // namespace kvgate::http
