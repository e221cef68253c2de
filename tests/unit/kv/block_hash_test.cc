// Tests for kv/block_hash: the SGLang and vLLM block-hash contracts against independent reference
// implementations in Python (hashlib for SHA-256, a hand-written canonical CBOR encoder for vLLM's
// sha256_cbor), run as subprocesses.
#include "kv/block_hash.h"

#include <gtest/gtest.h>

#include <sstream>
#include <vector>

#include "support/wire.h"

namespace kvgate::kv {
namespace {

// Token ids covering every CBOR integer width and both ends of the uint32 range.
const std::vector<int32_t> kTokens = {0,      1,          23, 24, 255,  256,    65535,     65536,
                                      151643, 2147483647, 7,  42, 1000, 100000, 12,        13,
                                      14,     15,         99, 98, 97,   96,     123456789, 5};

using testing::py_list;

std::vector<std::string> sglang_reference(const std::vector<int32_t>& tokens, int page) {
  return testing::python_words(R"(
import hashlib
tokens = )" + py_list(tokens) +
                               R"(
page = )" + std::to_string(page) +
                               R"(
prev = None
out = []
for i in range(0, len(tokens) // page * page, page):
    h = hashlib.sha256()
    if prev is not None:
        h.update(prev)
    for t in tokens[i:i + page]:
        h.update(t.to_bytes(4, "little", signed=False))
    prev = h.digest()
    u = int.from_bytes(prev[:8], "big")
    out.append(u - 2**64 if u >= 2**63 else u)
print(" ".join(str(x) for x in out))
)");
}

std::vector<std::string> vllm_reference(const std::vector<int32_t>& tokens, int page,
                                        const std::string& seed) {
  return testing::python_words(R"(
import hashlib
def head(major, n):
    if n < 24: return bytes([major << 5 | n])
    for extra, size in ((24, 1), (25, 2), (26, 4), (27, 8)):
        if n < 1 << (8 * size): return bytes([major << 5 | extra]) + n.to_bytes(size, "big")
def cbor(x):
    if x is None: return b"\xf6"
    if isinstance(x, bytes): return head(2, len(x)) + x
    if isinstance(x, str): return head(3, len(x.encode())) + x.encode()
    if isinstance(x, int): return head(0, x) if x >= 0 else head(1, -1 - x)
    return head(4, len(x)) + b"".join(cbor(e) for e in x)
def sha256_cbor(x): return hashlib.sha256(cbor(x)).digest()
tokens = )" + py_list(tokens) +
                               R"(
page = )" + std::to_string(page) +
                               R"(
parent = sha256_cbor(")" + seed +
                               R"(")
out = []
for i in range(0, len(tokens) // page * page, page):
    parent = sha256_cbor((parent, tuple(tokens[i:i + page]), None))
    out.append(int.from_bytes(parent, "big") & (2**64 - 1))
print(" ".join(str(x) for x in out))
)");
}

TEST(BlockHash, SglangMatchesHashlib) {
  for (int page : {1, 4, 16}) {
    auto ref = sglang_reference(kTokens, page);
    BlockHasher h(HashScheme::kSglang);
    std::vector<uint64_t> ids(kTokens.size() / static_cast<size_t>(page));
    h.chain_ids(kTokens, static_cast<size_t>(page), ids);
    ASSERT_EQ(ref.size(), ids.size()) << "page " << page;
    bool negative = false;
    for (size_t i = 0; i < ids.size(); ++i) {
      EXPECT_EQ(std::to_string(as_signed(ids[i])), ref[i]) << "page " << page << " block " << i;
      negative = negative || as_signed(ids[i]) < 0;
    }
    if (page == 1) {
      EXPECT_TRUE(negative) << "24 blocks without one negative id: sign lost?";
    }
  }
}

TEST(BlockHash, SglangFirstPageHasNoParentAndChains) {
  const std::vector<int32_t> a = {1, 2, 3, 4};
  Digest d1 = sglang_page_digest(nullptr, a);
  Digest d2 = sglang_page_digest(&d1, a);
  EXPECT_NE(d1, d2) << "the parent digest is part of the hash";
  EXPECT_EQ(sglang_block_id(d1), sglang_block_id(sglang_page_digest(nullptr, a)));
}

TEST(BlockHash, VllmSha256CborMatchesReference) {
  for (int page : {1, 16}) {
    for (const std::string seed : {"vllm-none-hash", "42"}) {
      auto ref = vllm_reference(kTokens, page, seed);
      BlockHasher h(HashScheme::kVllmSha256Cbor, seed);
      std::vector<uint64_t> ids(kTokens.size() / static_cast<size_t>(page));
      h.chain_ids(kTokens, static_cast<size_t>(page), ids);
      ASSERT_EQ(ref.size(), ids.size());
      for (size_t i = 0; i < ids.size(); ++i) {
        EXPECT_EQ(std::to_string(ids[i]), ref[i]) << "page " << page << " seed " << seed;
      }
    }
  }
}

TEST(BlockHash, PartialPagesAreNotHashed) {
  BlockHasher h(HashScheme::kSglang);
  std::vector<int32_t> tokens(37, 5);
  std::vector<uint64_t> ids(10, 0);
  h.chain_ids(tokens, 16, ids);
  EXPECT_NE(ids[0], 0u);
  EXPECT_NE(ids[1], 0u);
  EXPECT_EQ(ids[2], 0u) << "37 tokens hold two full pages of 16";
}

// SGLang's namespaced ids (mem_cache/utils.py, mem_cache/events.py), written out in Python: the
// salt seeds the chain, the adapter's name mixes every published id.
std::vector<std::string> namespaced_reference(const std::vector<int32_t>& tokens, int page,
                                              const std::string& salt, const std::string& lora) {
  return testing::python_words(R"(
import hashlib
tokens = )" + py_list(tokens) +
                               R"(
page = )" + std::to_string(page) +
                               R"(
salt, lora = ")" + salt + R"(", ")" +
                               lora +
                               R"("
prev = hashlib.sha256(b"sglang-cache-salt-v1\0" + salt.encode()).digest() if salt else None
seed = hashlib.sha256(b"sglang-kv-event-lora-v1\0" + lora.encode()).digest() if lora else None
out = []
for i in range(0, len(tokens) // page * page, page):
    h = hashlib.sha256()
    if prev is not None:
        h.update(prev)
    for t in tokens[i:i + page]:
        h.update(t.to_bytes(4, "little", signed=False))
    prev = h.digest()
    v = int.from_bytes(prev[:8], "big", signed=True)
    if seed is not None:
        v = int.from_bytes(hashlib.sha256(seed + v.to_bytes(8, "big", signed=True)).digest()[:8],
                           "big", signed=True)
    out.append(v)
print(" ".join(str(x) for x in out))
)");
}

TEST(BlockHash, SglangSaltSeedsAndLoraMixesTheChain) {
  for (const auto& [salt, lora] : std::vector<std::pair<std::string, std::string>>{
           {"tenant-a", ""}, {"", "adapter-a"}, {"tenant-a", "adapter-a"}, {"ü", ""}}) {
    auto ref = namespaced_reference(kTokens, 4, salt, lora);
    BlockHasher h(HashScheme::kSglang);
    std::vector<uint64_t> ids(kTokens.size() / 4);
    const Digest seed = sglang_salt_seed(salt);
    h.chain_ids(kTokens, 4, ids, salt.empty() ? nullptr : &seed);
    if (!lora.empty()) {
      const Digest ls = sglang_lora_seed(lora);
      for (auto& id : ids) id = sglang_lora_block_id(ls, id);
    }
    ASSERT_EQ(ref.size(), ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      EXPECT_EQ(std::to_string(as_signed(ids[i])), ref[i])
          << "salt '" << salt << "' lora '" << lora << "' block " << i;
    }
  }
}

}  // namespace
}  // namespace kvgate::kv
