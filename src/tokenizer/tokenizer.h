// tokenizer/tokenizer: a Hugging Face tokenizer.json (+ tokenizer_config.json) loaded into the
// pipeline the engine runs: added/special tokens split out first, normalizer, pre-tokenizers,
// BPE, post-processor; and decode. Ids are identical to HF tokenizers (tests/conformance).
//
// Supported: model BPE (byte-level, or character-level with byte_fallback / unk as SentencePiece
// conversions write it); normalizers NFC/NFD/NFKC/NFKD, Prepend, Replace, Strip, Sequence;
// pre-tokenizers Split (regex via PCRE2 JIT, or literal; every split behaviour and invert),
// ByteLevel, Metaspace, Digits, Sequence; post-processors ByteLevel, TemplateProcessing, Bert,
// Roberta, Sequence; decoders ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence.
// Anything else is refused at load with a message naming it, never tokenized approximately.
//
// Like transformers' LlamaTokenizerFast/GemmaTokenizerFast, a tokenizer_config.json naming those
// classes with add_bos_token/add_eos_token decides the special tokens added around a sequence.
//
// Text that is not valid UTF-8 is encoded as if each ill-formed sequence were U+FFFD (the
// WHATWG/Unicode "maximal subpart" replacement, what Node or a browser would decode it to).
//
// Thread safety: a loaded Tokenizer is immutable; encode/decode may run on any number of threads
// at once. Each thread keeps its own word -> ids cache and scratch buffers (no locks); a scratch
// buffer one huge text grew past 1 MiB is freed after that text. A PieceCache (set_piece_cache)
// is shared by the threads: it holds the ids of whole pieces between added tokens, so the
// messages of a chat's earlier turns are not tokenized again (tokenizer/piece_cache.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvgate::tokenizer {

class PieceCache;

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
};

class Tokenizer {
 public:
  // Loads DIR/tokenizer.json and, when present, DIR/tokenizer_config.json. Returns nullptr with
  // `error` naming the file and the unsupported component on failure.
  static std::unique_ptr<Tokenizer> load(const std::string& dir, std::string& error);
  // Same from the two documents' text (config may be empty).
  static std::unique_ptr<Tokenizer> from_json(std::string_view tokenizer_json,
                                              std::string_view config_json, std::string& error);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Appends the ids of `text` to `out`. With add_special_tokens, the post-processor's tokens
  // (e.g. BOS) surround them, as HF's encode(text, add_special_tokens=True). Returns false with
  // `error` set only when the regex engine runs out of resources on pathological input (the
  // output is then incomplete and must not be used).
  bool encode(std::string_view text, bool add_special_tokens, std::vector<int32_t>& out,
              std::string* error = nullptr) const;
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = false) const;
  // The first `max_tokens` ids encode() would append (the post-processor's included), without
  // tokenizing the rest where the pipeline allows: each Split of the pre-tokenizer is scanned a
  // little at a time and the model stops once enough ids exist. What still reads the whole text:
  // the UTF-8 check, the added-token scan and the normalizer; a tokenizer without a Split (Llama
  // 2's has no pre-tokenizer) still runs the model over each whole segment between added tokens.
  bool encode_prefix(std::string_view text, bool add_special_tokens, size_t max_tokens,
                     std::vector<int32_t>& out, std::string* error = nullptr) const;

  // Looks up and stores in `cache` the ids of each piece of text between two added tokens (the
  // pieces of at least PieceCache::kMinPieceBytes): same ids, without tokenizing a piece again.
  // Null: no cache (the default). Call before the tokenizer is shared with other threads. Has no
  // effect on a pipeline where a piece's ids depend on where it sits in the text (a Metaspace
  // pre-tokenizer with prepend_scheme "first"): see uses_piece_cache().
  void set_piece_cache(std::shared_ptr<PieceCache> cache);
  // Whether encodes use a piece cache (one was set and the pipeline allows it).
  bool uses_piece_cache() const;
  // Whether the ids of a piece between added tokens depend on its bytes alone in this pipeline.
  bool pieces_are_position_independent() const;

  // Text of the ids (invalid UTF-8 from partial byte tokens becomes U+FFFD, as HF).
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // Appends the bytes one token stands for in the middle of a text (byte-level: its raw bytes,
  // possibly part of a UTF-8 sequence; SentencePiece-style: "▁" as a space, <0xXX> as that
  // byte; added tokens: their content). Concatenating the tokens of a sequence this way and
  // repairing UTF-8 gives decode() except for decoders that strip the first space.
  void append_token_bytes(int32_t id, std::string& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::string id_to_token(int32_t id) const;
  // One past the largest id (model vocabulary plus added tokens).
  int32_t vocab_size() const;
  bool is_special(int32_t id) const;
  const std::vector<AddedToken>& added_tokens() const;

  // From tokenizer_config.json (empty / nullopt when not set).
  const std::string& bos_token() const;
  const std::string& eos_token() const;
  std::optional<int32_t> bos_token_id() const;
  std::optional<int32_t> eos_token_id() const;

  // One line naming the pipeline, e.g. "BPE byte-level, NFC, Split+ByteLevel, 151669 tokens".
  const std::string& description() const;
  // Heap memory held by the loaded tables (not counting per-thread caches).
  size_t memory_bytes() const;
  // Heap bytes of the calling thread's encode scratch buffers (word caches not counted). Each is
  // reused from text to text and freed after a text that grew it past 1 MiB, so this stays small
  // whatever the largest text was (for tests).
  static size_t thread_scratch_bytes();

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Reads a whole file; false with `error` set when it cannot.
bool read_file(const std::string& path, std::string& out, std::string& error);

}  // namespace kvgate::tokenizer
