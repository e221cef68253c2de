// kv/block_hash: the block-hash contracts of the engines' KV events (REFERENCE.md section 3). A
// block is one full page of token ids; its hash chains over every page before it.
//   SGLang: digest = SHA-256(parent digest (absent for the first page) || each token as uint32
//           little-endian); the published id is the first 8 digest bytes big-endian, as int64.
//   SGLang namespaces (newest builds): a request's cache_salt seeds the chain, i.e. the first
//   page's
//           parent digest is SHA-256("sglang-cache-salt-v1\0" || salt) (mem_cache/utils.py
//           compute_node_event_hash_values); a LoRA adapter then mixes every published id (the
//           parent ids too) with SHA-256("sglang-kv-event-lora-v1\0" || adapter name): the id
//           becomes the first 8 bytes, big-endian, of SHA-256(lora seed || id as 8 bytes
//           big-endian) (mem_cache/events.py kv_event_lora_seed / namespace_event_block_hash).
//   vLLM sha256_cbor: digest = SHA-256(canonical CBOR [parent digest, [tokens...], null]); the
//           first page's parent is NONE_HASH = sha256_cbor(seed) (seed: PYTHONHASHSEED, else
//           "vllm-none-hash"); the published id is the last 8 digest bytes big-endian, unsigned.
// Published ids travel as uint64_t bit patterns everywhere in kv/ (as_signed() gives SGLang's
// view).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace kvgate::kv {

using Digest = std::array<uint8_t, 32>;

enum class HashScheme : uint8_t {
  kSglang,          // chained SHA-256 over uint32 LE tokens; id = first 8 bytes, signed
  kVllmSha256Cbor,  // vLLM's sha256_cbor; id = last 8 bytes, unsigned
};

std::string_view to_string(HashScheme s);

inline int64_t as_signed(uint64_t id) {
  return static_cast<int64_t>(id);
}

// SGLang's page digest. `parent` is null for the first page of a sequence.
Digest sglang_page_digest(const Digest* parent, std::span<const int32_t> tokens);
// The int64 SGLang publishes for a digest (its bit pattern as uint64_t).
uint64_t sglang_block_id(const Digest& d);
// The chain seed of a salted SGLang request: the parent digest of its first page.
Digest sglang_salt_seed(std::string_view cache_salt);
// The seed a LoRA adapter's name gives SGLang's published ids.
Digest sglang_lora_seed(std::string_view lora_name);
// A published id mixed with a LoRA seed.
uint64_t sglang_lora_block_id(const Digest& lora_seed, uint64_t id);

// vLLM's NONE_HASH for a seed: sha256(cbor(text seed)).
Digest vllm_none_hash(std::string_view seed);
// The seed vLLM uses: $PYTHONHASHSEED when set, else "vllm-none-hash".
std::string vllm_default_seed();
// vLLM's sha256_cbor block digest with no extra keys; `parent` is the previous page's digest or
// NONE_HASH for the first page.
Digest vllm_page_digest(const Digest& parent, std::span<const int32_t> tokens);
// The unsigned id vLLM publishes (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES): the last 8 bytes.
uint64_t vllm_block_id(const Digest& d);

// One scheme, ready to chain pages (the vLLM root seed resolved once).
class BlockHasher {
 public:
  explicit BlockHasher(HashScheme scheme, std::string_view vllm_seed = {});
  HashScheme scheme() const { return scheme_; }
  // The digest of a page after `parent` (null: the first page of a sequence).
  Digest page(const Digest* parent, std::span<const int32_t> tokens) const;
  // The published id of a digest.
  uint64_t id(const Digest& d) const;
  // Ids of every full page of `tokens` (a trailing partial page is ignored). `seed`, when given,
  // is the parent digest of the first page (SGLang's salted chains).
  void chain_ids(std::span<const int32_t> tokens, size_t page_size, std::span<uint64_t> out,
                 const Digest* seed = nullptr) const;

 private:
  HashScheme scheme_;
  Digest none_hash_{};
};

}  // namespace kvgate::kv
