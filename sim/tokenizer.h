// sim/tokenizer: the Tokenizer interface every part of the sim counts and generates tokens through,
// its byte-level stand-in, and the model's real tokenizer (src/tokenizer: tokenizer.json, ids as
// HF tokenizers) selected by --tokenizer-path; nothing else in sim/ knows which one runs.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvgate::sim {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::string_view name() const = 0;
  // Appends the ids of `text` to `out`. Special tokens written in the text (e.g. "<|im_start|>")
  // become their single ids, as when SGLang encodes a rendered chat template.
  virtual void encode(std::string_view text, std::vector<int32_t>& out) const = 0;
  // HF's encode(text, add_special_tokens), what SGLang's /tokenize answers: with
  // add_special_tokens, encode()'s ids inside the post-processor's tokens (e.g. Llama's BOS);
  // without, encode()'s ids. The stand-in has no post-processor: encode()'s ids either way.
  virtual void tokenize(std::string_view text, bool add_special_tokens,
                        std::vector<int32_t>& out) const = 0;
  // Appends the text of one token; nothing for an id outside the vocabulary.
  virtual void decode_token(int32_t id, std::string& out) const = 0;
  virtual int32_t vocab_size() const = 0;
  // The token that ends a turn (a generation that stops "naturally" matches it).
  virtual int32_t eos_token_id() const = 0;
  virtual bool is_special(int32_t id) const = 0;

  void decode(std::span<const int32_t> ids, std::string& out) const {
    for (int32_t id : ids) decode_token(id, out);
  }
  // HF's decode(ids, skip_special_tokens) as SGLang's /detokenize runs it (its tokenizers load
  // with clean_up_tokenization_spaces=False): ids outside the vocabulary give nothing, the
  // special ones are left out with skip_special_tokens, ill-formed UTF-8 becomes U+FFFD.
  virtual std::string detokenize(std::span<const int32_t> ids, bool skip_special_tokens) const = 0;
};

// The stand-in: ids 0-255 are bytes, then the special tokens <|im_start|>, <|im_end|>,
// <|endoftext|>, then one token per word of sim/words.h without and with a leading space. A letter
// run that is a listed word (and not glued to a preceding letter) encodes as one token; everything
// else byte by byte. decode(encode(s)) == s for every string.
class StandInTokenizer final : public Tokenizer {
 public:
  StandInTokenizer();
  ~StandInTokenizer() override;
  std::string_view name() const override { return "byte-level stand-in"; }
  void encode(std::string_view text, std::vector<int32_t>& out) const override;
  void tokenize(std::string_view text, bool add_special_tokens,
                std::vector<int32_t>& out) const override;
  void decode_token(int32_t id, std::string& out) const override;
  std::string detokenize(std::span<const int32_t> ids, bool skip_special_tokens) const override;
  int32_t vocab_size() const override;
  int32_t eos_token_id() const override { return kImEnd; }
  bool is_special(int32_t id) const override { return id >= kImStart && id <= kEndOfText; }

  static constexpr int32_t kImStart = 256;
  static constexpr int32_t kImEnd = 257;
  static constexpr int32_t kEndOfText = 258;
  static constexpr int32_t kFirstWord = 259;

 private:
  struct WordTable;
  // Token of the word `letters` (bare or with a leading space), or -1.
  int32_t word_id(std::string_view letters, bool spaced) const;
  std::unique_ptr<WordTable> words_;
};

// The tokenizer for --tokenizer-path: the stand-in when the path is empty, else the model's
// tokenizer.json (encode without added special tokens, as SGLang encodes a rendered chat prompt).
// `note` names what was loaded (for a startup log line). Returns nullptr with `error` set when the
// directory holds no tokenizer this build can run exactly.
std::unique_ptr<Tokenizer> make_tokenizer(std::string_view path, std::string& note,
                                          std::string& error);

}  // namespace kvgate::sim
