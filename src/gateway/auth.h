// gateway/auth: the API keys' check, shared by the inference listener (--api-key) and the admin
// API (--admin-api-key): "Authorization: Bearer <key>", the scheme in any case (RFC 9110 11.1).
// The key is kept and compared as its SHA-256 digest, in constant time: neither its bytes nor its
// length leak through timing.
#pragma once

#include <array>
#include <string_view>

namespace kvgate {

class BearerKey {
 public:
  // An empty key lets every request through (no key configured).
  explicit BearerKey(std::string_view key);
  bool set() const { return set_; }
  // Whether an Authorization header value carries the key.
  bool matches(std::string_view authorization) const;
  // A presented key's digest, to compare with several keys at one hashing (matches_digest).
  using Digest = std::array<unsigned char, 32>;
  static Digest digest_of(std::string_view key);
  bool matches_digest(const Digest& presented) const;

 private:
  bool set_;
  Digest digest_{};
};

// A key nobody can guess: 32 hex digits from the kernel's generator (the doctor's key, the
// private gateway's admin key).
std::string random_key_hex();

}  // namespace kvgate
