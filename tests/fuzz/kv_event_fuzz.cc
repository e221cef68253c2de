// Fuzz target: the KV event decoder (kv/events), which reads what engines publish over ZeroMQ
// (untrusted bytes). Any input must decode or fail with an error code; whatever decodes must
// survive a round trip through both wire shapes unchanged.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "kv/events.h"

namespace {

// `salt`: compare the cache_salt too (SGLang's shape carries it; vLLM's has no place for it).
bool same(const kvgate::kv::EventBatch& a, const kvgate::kv::EventBatch& b, bool salt) {
  if (a.events.size() != b.events.size() || a.dp_rank != b.dp_rank) return false;
  for (size_t i = 0; i < a.events.size(); ++i) {
    if (a.events[i].index() != b.events[i].index()) return false;
    if (const auto* s = std::get_if<kvgate::kv::BlockStored>(&a.events[i])) {
      const auto& t = std::get<kvgate::kv::BlockStored>(b.events[i]);
      if (s->block_hashes != t.block_hashes || s->token_ids != t.token_ids ||
          s->parent_block_hash != t.parent_block_hash || s->block_size != t.block_size ||
          (salt && s->cache_salt != t.cache_salt)) {
        return false;
      }
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvgate::kv;
  std::string_view in(reinterpret_cast<const char*>(data), size);
  EventBatch batch;
  if (decode_batch(in, batch).ok()) {
    for (auto f : {WireFormat::kSglang, WireFormat::kVllm}) {
      std::string out;
      encode_batch(batch, f, out);
      EventBatch again;
      if (!decode_batch(out, again).ok() || !same(batch, again, f == WireFormat::kSglang)) {
        __builtin_trap();
      }
    }
  }
  if (size >= 9) {
    std::string_view frames[] = {in.substr(0, 1), in.substr(1, 8), in.substr(9)};
    Message m;
    (void)decode_message(frames, m);
  }
  return 0;
}
