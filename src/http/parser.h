// http/parser: kvgate's HTTP/1.1 parser (RFC 9112) for the bytes clients and workers send: a
// message head (request line or status line, then fields) and the chunked transfer coding.
//
// Zero allocation on the usual path: a head is parsed in place over the contiguous bytes it
// arrived in, and its fields are kept as offsets into them (an inline array of kInlineFields,
// growing onto the heap only for heads with more fields). What framing needs is taken while
// parsing (Content-Length, Transfer-Encoding, Connection, Expect), so no field is looked up twice.
//
// Incremental: parse() is called again with the same bytes plus what arrived since; each complete
// line is parsed once, and an incomplete one is only searched for its end. Errors in a complete
// line are reported at once.
//
// Strict, because these bytes are untrusted and a proxy that frames a message differently from
// the server behind it lets requests be smuggled (what is refused: docs/security.md, "The HTTP
// parser"). Lines end with CRLF (a bare LF or CR is an error), no obs-fold, field names are
// tokens with no whitespace before the colon, field values carry no control characters but HTAB,
// a request has at most one Content-Length value (repeated fields must agree) and never both
// Content-Length and Transfer-Encoding, and a client may only send Transfer-Encoding: chunked.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace kvgate::http {

enum class ParseError : uint8_t {
  kNone,
  kHeaderLimit,          // the head did not end within its limit
  kBodyLimit,            // the (chunked) body exceeds its limit
  kBadLineEnding,        // a line not ended by CRLF
  kBadMethod,            // not a token
  kBadTarget,            // empty, or a space or control character in it
  kBadVersion,           // not HTTP/1.0 or HTTP/1.1
  kBadStatus,            // not three digits, from 100
  kBadReason,            // a control character in the reason phrase
  kBadFieldName,         // empty, not a token, or whitespace before the colon
  kBadFieldValue,        // a control character (other than HTAB) in a value
  kObsFold,              // a field line continued on the next (obsolete line folding)
  kBadContentLength,     // not digits only, or too large
  kConflictingLength,    // Content-Length values that differ
  kLengthWithEncoding,   // Content-Length and Transfer-Encoding together
  kBadTransferEncoding,  // requests: anything but "chunked" alone; responses: chunked not last
  kBadConnection,        // Connection (or Proxy-Connection) is not a list of tokens
  kBadChunkSize,         // not hexadecimal, or too large
  kBadChunkExtension,
  kBadChunkEnd,  // chunk data not followed by CRLF
  kBadTrailer,   // a malformed or oversized trailer section
};
// A short English description ("bad chunk size").
std::string_view describe(ParseError e);

enum class ParseStatus : uint8_t { kNeedMore, kDone, kError };

// How a message's body is delimited.
enum class BodyFraming : uint8_t {
  kNone,        // no body
  kLength,      // content_length() bytes
  kChunked,     // chunked transfer coding (ChunkedDecoder)
  kUntilClose,  // responses only: the body ends when the connection does
};

// One message head. Reusable: reset() before the next message.
class HeadParser {
 public:
  enum class Kind : uint8_t { kRequest, kResponse };
  static constexpr size_t kInlineFields = 32;
  struct Field {
    uint32_t name;  // offsets into the head's bytes
    uint32_t name_len;
    uint32_t value;
    uint32_t value_len;
  };

  explicit HeadParser(Kind kind) : kind_(kind) {}
  HeadParser(const HeadParser&) = delete;
  HeadParser& operator=(const HeadParser&) = delete;

  void reset();

  // Parses the head that starts at `data`: `size` bytes are here, the same as at the previous call
  // (since reset()) plus any that arrived since. The head, its final blank line included, must
  // end within `limit` bytes (else kHeaderLimit once `size` reaches the limit). kDone: the head
  // is head_size() bytes (what follows is body or the next message); kError: see error().
  ParseStatus parse(const char* data, size_t size, size_t limit);
  ParseError error() const { return error_; }
  bool done() const { return done_; }
  size_t head_size() const { return head_size_; }

  // The views below point into the bytes given to parse(). When those bytes move (a buffer that
  // grew), rebase() to their new address; offsets stay as they were.
  void rebase(const char* data) { base_ = data; }

  unsigned version() const { return version_; }                           // 10 or 11
  std::string_view method() const { return view(method_, method_len_); }  // requests
  std::string_view target() const { return view(target_, target_len_); }  // requests
  int status() const { return status_; }                                  // responses

  size_t field_count() const { return count_; }
  std::string_view name(size_t i) const { return view(at(i).name, at(i).name_len); }
  std::string_view value(size_t i) const { return view(at(i).value, at(i).value_len); }
  // The first value of a field (ASCII case-insensitive name), or empty.
  std::string_view find(std::string_view name) const;
  template <class Fn>
  void for_each(Fn&& fn) const {
    for (size_t i = 0; i < count_; ++i) fn(name(i), value(i));
  }

  std::optional<uint64_t> content_length() const {
    return has_length_ ? std::optional<uint64_t>(length_) : std::nullopt;
  }
  // Requests: from the head alone. Responses: pass whether the request was HEAD (1xx, 204, 304
  // and answers to HEAD have no body, whatever their fields say).
  BodyFraming framing(bool head_request = false) const;
  // Whether the connection may carry another message after this one: HTTP/1.1 unless
  // "Connection: close", HTTP/1.0 only with "Connection: keep-alive"; never after a response
  // whose body ends with the connection.
  bool keep_alive(bool head_request = false) const;
  // Whether the head has a Connection field (whose tokens may name fields to drop when
  // forwarding): without one, a proxy need not collect them.
  bool has_connection() const { return has_connection_; }
  // Requests. An HTTP/1.0 client's Expect is ignored (RFC 9110 10.1.1: it may not understand 100).
  bool expect_continue() const { return expect_continue_ && version_ >= 11; }

 private:
  const Field& at(size_t i) const {
    return i < kInlineFields ? inline_[i] : overflow_[i - kInlineFields];
  }
  std::string_view view(uint32_t off, uint32_t len) const { return {base_ + off, len}; }
  ParseStatus fail(ParseError e) {
    error_ = e;
    return ParseStatus::kError;
  }
  bool bad(ParseError e) {
    error_ = e;
    return false;
  }
  bool parse_request_line(const char* p, const char* end);
  bool parse_status_line(const char* p, const char* end);
  bool parse_field(const char* line, const char* end);
  bool on_field(std::string_view name, std::string_view value);
  ParseError finish();

  Kind kind_;
  bool start_done_ = false;
  bool done_ = false;
  ParseError error_ = ParseError::kNone;
  const char* base_ = nullptr;
  size_t line_ = 0;  // where the next line to parse starts
  size_t scan_ = 0;  // how far its end was looked for
  size_t head_size_ = 0;

  uint8_t version_ = 11;
  int status_ = 0;
  uint32_t method_ = 0, method_len_ = 0, target_ = 0, target_len_ = 0;

  bool has_length_ = false;
  bool chunked_ = false;
  bool expect_seen_ = false;
  bool expect_continue_ = false;
  bool conn_close_ = false;
  bool conn_keep_alive_ = false;
  bool has_connection_ = false;  // a Connection field (not Proxy-Connection) was seen
  uint8_t te_fields_ = 0;
  uint64_t length_ = 0;

  size_t count_ = 0;
  Field inline_[kInlineFields];
  std::vector<Field> overflow_;
};

// Decodes a chunked body (RFC 9112 7.1): chunk sizes in hex (at most 16 digits' worth of value),
// extensions checked for syntax and dropped, trailer fields checked and dropped.
class ChunkedDecoder {
 public:
  static constexpr size_t kMaxLine = 4096;  // a chunk-size line, extensions included
  static constexpr size_t kMaxTrailers = size_t{64} * 1024;  // the trailer section

  // `body_limit`: the most data the chunks may carry in total (else kBodyLimit).
  explicit ChunkedDecoder(uint64_t body_limit = UINT64_MAX) : limit_(body_limit) {}
  void reset(uint64_t body_limit = UINT64_MAX);

  // Decodes from `in` (`size` bytes: what was not used by the previous call, plus any that
  // arrived since). Sets `used` (bytes of `in` consumed, framing and data) and `data` (at most
  // `room` bytes of chunk data, pointing into `in`; at most one piece per call). kDone once the
  // last chunk and the trailers are consumed. kNeedMore: call again with the rest of `in` (when
  // `used` > 0), or with more bytes or more room (when `used` == 0).
  ParseStatus decode(const char* in, size_t size, size_t room, size_t& used,
                     std::string_view& data);
  ParseError error() const { return error_; }
  bool done() const { return state_ == State::kDone; }
  // Chunk data not yet received of the chunk being read (0 between chunks).
  uint64_t chunk_left() const { return left_; }

 private:
  enum class State : uint8_t { kSize, kData, kDataEnd, kTrailer, kDone, kError };
  ParseStatus fail(ParseError e) {
    error_ = e;
    state_ = State::kError;
    return ParseStatus::kError;
  }
  State state_ = State::kSize;
  ParseError error_ = ParseError::kNone;
  uint64_t limit_;
  uint64_t total_ = 0;
  uint64_t left_ = 0;
  size_t scan_ = 0;      // how far the current line's end was looked for
  size_t trailers_ = 0;  // trailer bytes so far
};

}  // namespace kvgate::http
