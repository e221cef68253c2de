// http/read_buffer: the bytes a connection has read and not yet used, in one contiguous block, so
// a message head is parsed where it arrived (http/parser) and its fields stay views into it.
//
// A message's head can be pinned: while it is, bytes before the pin never move (reading more only
// moves unread bytes down to the pin, or grows the block, keeping offsets), so the head's fields
// stay valid, by offset, while its body is read through the same buffer; views taken before the
// block grew stay valid too (the old block is kept until restart()). restart() unpins and moves
// what is left (a pipelined next message) to the start.
#pragma once

#include <algorithm>
#include <boost/asio/buffer.hpp>
#include <cstring>
#include <memory>
#include <vector>

namespace kvgate::http {

class ReadBuffer {
 public:
  // The size a connection's buffer starts at. A block of this size given back by release() is
  // kept for reuse by the thread that gave it back (at most kSpareBlocks per thread): a
  // connection giving its buffer back while its request runs takes one again for the next
  // request without the allocator's large-size path (~400 instructions a round trip).
  static constexpr size_t kBlockSize = 16384;
  static constexpr size_t kSpareBlocks = 16;
  static size_t spare_blocks() { return spares().size(); }  // this thread's

  ReadBuffer() = default;
  ReadBuffer(const ReadBuffer&) = delete;
  ReadBuffer& operator=(const ReadBuffer&) = delete;

  const char* data() const { return buf_.get() + begin_; }  // the unread bytes
  char* unread() { return buf_.get() + begin_; }            // the same, to rewrite in place
  size_t size() const { return end_ - begin_; }
  const char* base() const { return buf_.get(); }  // where a pinned head starts
  size_t capacity() const { return cap_; }

  void consume(size_t n) {
    begin_ += std::min(n, size());
    if (begin_ == end_) begin_ = end_ = pin_;  // nothing unread: read again right after the pin
  }
  // Keeps [base(), base() + n) in place until restart() (pin a head before consuming it).
  void pin(size_t n) { pin_ = std::min(n, end_); }
  // Unpins, and moves the unread bytes to base().
  void restart() {
    pin_ = 0;
    retired_.clear();
    if (begin_ > 0) {
      size_t n = size();
      if (n > 0) std::memmove(buf_.get(), buf_.get() + begin_, n);
      begin_ = 0;
      end_ = n;
    }
  }
  // Room after the unread bytes: all there is, and at least `min` bytes (moving the unread bytes
  // down to the pin, or growing).
  boost::asio::mutable_buffer prepare(size_t min) {
    if (cap_ - end_ < min && begin_ > pin_) {
      size_t n = size();
      std::memmove(buf_.get() + pin_, buf_.get() + begin_, n);
      begin_ = pin_;
      end_ = pin_ + n;
    }
    if (cap_ - end_ < min) grow(std::max(cap_ * 2, end_ + min));
    return {buf_.get() + end_, cap_ - end_};
  }
  void commit(size_t n) { end_ += std::min(n, cap_ - end_); }
  // Capacity of at least `n` bytes.
  void reserve(size_t n) {
    if (n > cap_) grow(n);
  }
  // Gives the memory back when nothing is unread or pinned (an idle connection). A pinned head's
  // fields are views the handler may still hold: a buffer in use is never given back.
  void release() {
    if (end_ != 0 || pin_ != 0) return;
    if (cap_ == kBlockSize && spares().size() < kSpareBlocks) spares().push_back(std::move(buf_));
    buf_.reset();
    retired_.clear();
    cap_ = begin_ = end_ = 0;
  }

 private:
  static std::vector<std::unique_ptr<char[]>>& spares() {
    thread_local std::vector<std::unique_ptr<char[]>> blocks;
    return blocks;
  }
  static std::unique_ptr<char[]> block(size_t n) {
    auto& s = spares();
    if (n == kBlockSize && !s.empty()) {
      std::unique_ptr<char[]> b = std::move(s.back());
      s.pop_back();
      return b;
    }
    return std::make_unique_for_overwrite<char[]>(n);
  }

  void grow(size_t n) {
    auto bigger = block(n);
    // Offsets are kept: the pinned bytes, then the unread ones where they were.
    if (pin_ > 0) std::memcpy(bigger.get(), buf_.get(), pin_);
    size_t from = std::max(begin_, pin_);
    if (end_ > from) std::memcpy(bigger.get() + from, buf_.get() + from, end_ - from);
    // A pinned head's old block stays allocated until restart(): whoever holds views of its
    // fields (the gateway copies a worker's headers into the answer it writes, after reading the
    // body) still reads the same bytes there. Growth doubles, so that is at most the block again.
    if (pin_ > 0) retired_.push_back(std::move(buf_));
    buf_ = std::move(bigger);
    cap_ = n;
  }

  std::vector<std::unique_ptr<char[]>> retired_;  // earlier blocks of a pinned head (see grow)
  std::unique_ptr<char[]> buf_;
  size_t cap_ = 0;
  size_t begin_ = 0;
  size_t end_ = 0;
  size_t pin_ = 0;
};

}  // namespace kvgate::http
