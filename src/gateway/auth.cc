// gateway/auth: see auth.h.
#include "gateway/auth.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <random>

#include "http/message.h"

namespace kvgate {
namespace {

std::array<unsigned char, 32> sha256(std::string_view s) {
  std::array<unsigned char, 32> d{};
  SHA256(reinterpret_cast<const unsigned char*>(s.data()), s.size(), d.data());
  return d;
}

}  // namespace

BearerKey::BearerKey(std::string_view key) : set_(!key.empty()), digest_(sha256(key)) {}

bool BearerKey::matches(std::string_view auth) const {
  if (!set_) return true;
  size_t sp = auth.find(' ');
  if (sp == std::string_view::npos || !http::iequals(auth.substr(0, sp), "bearer")) return false;
  std::string_view token = auth.substr(sp + 1);
  while (!token.empty() && token.front() == ' ') token.remove_prefix(1);
  auto digest = sha256(token);
  return CRYPTO_memcmp(digest.data(), digest_.data(), digest.size()) == 0;
}

BearerKey::Digest BearerKey::digest_of(std::string_view key) {
  return sha256(key);
}

bool BearerKey::matches_digest(const Digest& presented) const {
  return set_ && CRYPTO_memcmp(presented.data(), digest_.data(), presented.size()) == 0;
}

std::string random_key_hex() {
  static constexpr char kHex[] = "0123456789abcdef";
  std::random_device rd;  // getrandom(2): not the request path's PRNG
  std::string key;
  key.reserve(32);
  for (int i = 0; i < 4; ++i) {
    uint32_t v = rd();
    for (int j = 0; j < 8; ++j) key.push_back(kHex[(v >> (j * 4)) & 15]);
  }
  return key;
}

}  // namespace kvgate
