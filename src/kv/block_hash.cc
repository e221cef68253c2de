// kv/block_hash: see block_hash.h.
#include "kv/block_hash.h"

#include <openssl/evp.h>

#include <cstdlib>
#include <cstring>
#include <vector>

namespace kvgate::kv {
namespace {

using namespace std::string_view_literals;

// SHA-256 with the algorithm fetched once per thread: OpenSSL 3's one-shot SHA256() fetches it
// (under a lock) on every call, which cost more than the hash itself for one-token pages.
struct Sha256 {
  EVP_MD* md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  ~Sha256() {
    EVP_MD_CTX_free(ctx);
    EVP_MD_free(md);
  }
};

Digest sha256(const std::vector<uint8_t>& buf) {
  thread_local Sha256 sha;
  Digest d{};
  unsigned len = 0;
  EVP_DigestInit_ex2(sha.ctx, sha.md, nullptr);
  EVP_DigestUpdate(sha.ctx, buf.data(), buf.size());
  EVP_DigestFinal_ex(sha.ctx, d.data(), &len);
  return d;
}

// A scratch buffer per thread: hashing a page never allocates after the first one.
std::vector<uint8_t>& scratch() {
  thread_local std::vector<uint8_t> buf;
  buf.clear();
  return buf;
}

uint64_t load_be64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | p[i];
  return v;
}

// Canonical CBOR head (major type + argument), shortest form.
void cbor_head(std::vector<uint8_t>& out, uint8_t major, uint64_t arg) {
  const auto m = static_cast<uint8_t>(major << 5);
  if (arg < 24) {
    out.push_back(static_cast<uint8_t>(m | arg));
  } else if (arg <= 0xff) {
    out.push_back(m | 24);
    out.push_back(static_cast<uint8_t>(arg));
  } else if (arg <= 0xffff) {
    out.push_back(m | 25);
    out.push_back(static_cast<uint8_t>(arg >> 8));
    out.push_back(static_cast<uint8_t>(arg));
  } else if (arg <= 0xffffffffull) {
    out.push_back(m | 26);
    for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<uint8_t>(arg >> s));
  } else {
    out.push_back(m | 27);
    for (int s = 56; s >= 0; s -= 8) out.push_back(static_cast<uint8_t>(arg >> s));
  }
}

// SHA-256(domain || text): the seeds of SGLang's namespaces.
Digest domain_digest(std::string_view domain, std::string_view text) {
  auto& buf = scratch();
  buf.reserve(domain.size() + text.size());
  for (char ch : domain) buf.push_back(static_cast<uint8_t>(ch));
  for (char ch : text) buf.push_back(static_cast<uint8_t>(ch));
  return sha256(buf);
}

}  // namespace

std::string_view to_string(HashScheme s) {
  switch (s) {
    case HashScheme::kSglang:
      return "sha256_sglang";
    case HashScheme::kVllmSha256Cbor:
      return "sha256_cbor";
  }
  return "?";
}

Digest sglang_page_digest(const Digest* parent, std::span<const int32_t> tokens) {
  auto& buf = scratch();
  buf.reserve(32 + tokens.size() * 4);
  if (parent) buf.insert(buf.end(), parent->begin(), parent->end());
  for (int32_t t : tokens) {
    auto u = static_cast<uint32_t>(t);
    buf.push_back(static_cast<uint8_t>(u));
    buf.push_back(static_cast<uint8_t>(u >> 8));
    buf.push_back(static_cast<uint8_t>(u >> 16));
    buf.push_back(static_cast<uint8_t>(u >> 24));
  }
  return sha256(buf);
}

uint64_t sglang_block_id(const Digest& d) {
  return load_be64(d.data());
}

Digest sglang_salt_seed(std::string_view cache_salt) {
  return domain_digest("sglang-cache-salt-v1\0"sv, cache_salt);
}

Digest sglang_lora_seed(std::string_view lora_name) {
  return domain_digest("sglang-kv-event-lora-v1\0"sv, lora_name);
}

uint64_t sglang_lora_block_id(const Digest& lora_seed, uint64_t id) {
  auto& buf = scratch();
  buf.reserve(40);
  for (uint8_t b : lora_seed) buf.push_back(b);
  for (int s = 56; s >= 0; s -= 8) buf.push_back(static_cast<uint8_t>(id >> s));
  return load_be64(sha256(buf).data());
}

Digest vllm_none_hash(std::string_view seed) {
  auto& buf = scratch();
  cbor_head(buf, 3, seed.size());  // text string
  buf.insert(buf.end(), seed.begin(), seed.end());
  return sha256(buf);
}

std::string vllm_default_seed() {
  const char* env = std::getenv("PYTHONHASHSEED");
  return env ? std::string(env) : std::string("vllm-none-hash");
}

Digest vllm_page_digest(const Digest& parent, std::span<const int32_t> tokens) {
  auto& buf = scratch();
  buf.reserve(40 + tokens.size() * 5);
  cbor_head(buf, 4, 3);   // (parent, tokens, extra_keys)
  cbor_head(buf, 2, 32);  // parent: 32-byte string
  buf.insert(buf.end(), parent.begin(), parent.end());
  cbor_head(buf, 4, tokens.size());
  for (int32_t t : tokens) cbor_head(buf, 0, static_cast<uint32_t>(t));
  buf.push_back(0xf6);  // extra_keys: None
  return sha256(buf);
}

uint64_t vllm_block_id(const Digest& d) {
  return load_be64(d.data() + 24);
}

BlockHasher::BlockHasher(HashScheme scheme, std::string_view vllm_seed) : scheme_(scheme) {
  if (scheme_ == HashScheme::kVllmSha256Cbor) {
    none_hash_ = vllm_none_hash(vllm_seed.empty() ? vllm_default_seed() : std::string(vllm_seed));
  }
}

Digest BlockHasher::page(const Digest* parent, std::span<const int32_t> tokens) const {
  if (scheme_ == HashScheme::kSglang) return sglang_page_digest(parent, tokens);
  return vllm_page_digest(parent ? *parent : none_hash_, tokens);
}

uint64_t BlockHasher::id(const Digest& d) const {
  return scheme_ == HashScheme::kSglang ? sglang_block_id(d) : vllm_block_id(d);
}

void BlockHasher::chain_ids(std::span<const int32_t> tokens, size_t page_size,
                            std::span<uint64_t> out, const Digest* seed) const {
  Digest prev{};
  const Digest* parent = seed;
  const size_t pages = page_size ? tokens.size() / page_size : 0;
  for (size_t i = 0; i < pages && i < out.size(); ++i) {
    prev = page(parent, tokens.subspan(i * page_size, page_size));
    parent = &prev;
    out[i] = id(prev);
  }
}

}  // namespace kvgate::kv
