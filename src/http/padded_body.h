// http/padded_body: a Beast Body whose std::string keeps kBodyPadding spare bytes of capacity, so
// simdjson can parse request and response bodies in place without copying them.
#pragma once

#include <algorithm>
#include <boost/beast/core/buffers_range.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/optional.hpp>
#include <cstring>
#include <string>

#include "http/message.h"

namespace kvgate::http {

struct PaddedStringBody {
  using value_type = std::string;

  static std::uint64_t size(const value_type& body) { return body.size(); }

  class reader {
   public:
    template <bool isRequest, class Fields>
    reader(boost::beast::http::header<isRequest, Fields>&, value_type& body) : body_(body) {}

    void init(const boost::optional<std::uint64_t>& length, boost::beast::error_code& ec) {
      ec = {};
      if (length) {
        if (*length > body_.max_size() - kBodyPadding) {
          ec = boost::beast::http::error::buffer_overflow;
          return;
        }
        body_.reserve(static_cast<size_t>(*length) + kBodyPadding);
      }
    }

    template <class ConstBufferSequence>
    std::size_t put(const ConstBufferSequence& buffers, boost::beast::error_code& ec) {
      ec = {};
      size_t extra = boost::asio::buffer_size(buffers);
      size_t size = body_.size();
      if (size + extra + kBodyPadding > body_.capacity()) {
        body_.reserve(std::max(body_.capacity() * 2, size + extra + kBodyPadding));
      }
      body_.resize(size + extra);
      char* dest = body_.data() + size;
      for (auto b : boost::beast::buffers_range_ref(buffers)) {
        std::memcpy(dest, b.data(), b.size());
        dest += b.size();
      }
      return extra;
    }

    void finish(boost::beast::error_code& ec) {
      ec = {};
      if (body_.capacity() < body_.size() + kBodyPadding)
        body_.reserve(body_.size() + kBodyPadding);
    }

   private:
    value_type& body_;
  };
};

}  // namespace kvgate::http
