// sim/tokenizer: see tokenizer.h.
#include "sim/tokenizer.h"

#include <array>

#include "sim/words.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace kvgate::sim {
namespace {

constexpr std::array<std::string_view, 3> kSpecials = {"<|im_start|>", "<|im_end|>",
                                                       "<|endoftext|>"};

bool is_letter(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

uint32_t fnv1a(std::string_view s) {
  uint32_t h = 2166136261u;
  for (char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= 16777619u;
  }
  return h;
}

}  // namespace

// Open addressing over the word list: a letter run is looked up with one hash and a probe or two.
struct StandInTokenizer::WordTable {
  static constexpr size_t kSlots = 1024;  // power of two, 4x the words
  std::array<int16_t, kSlots> slot;

  WordTable() {
    slot.fill(-1);
    for (size_t i = 0; i < kWords.size(); ++i) {
      size_t s = fnv1a(kWords[i]) & (kSlots - 1);
      while (slot[s] >= 0) s = (s + 1) & (kSlots - 1);
      slot[s] = static_cast<int16_t>(i);
    }
  }
  int find(std::string_view w) const {
    for (size_t s = fnv1a(w) & (kSlots - 1);; s = (s + 1) & (kSlots - 1)) {
      if (slot[s] < 0) return -1;
      if (kWords[static_cast<size_t>(slot[s])] == w) return slot[s];
    }
  }
};

StandInTokenizer::StandInTokenizer() : words_(std::make_unique<WordTable>()) {}
StandInTokenizer::~StandInTokenizer() = default;

int32_t StandInTokenizer::vocab_size() const {
  return kFirstWord + 2 * static_cast<int32_t>(kWords.size());
}

int32_t StandInTokenizer::word_id(std::string_view letters, bool spaced) const {
  if (letters.size() > 16) return -1;  // longer than any listed word
  int w = words_->find(letters);
  if (w < 0) return -1;
  return kFirstWord + 2 * w + (spaced ? 1 : 0);
}

void StandInTokenizer::encode(std::string_view text, std::vector<int32_t>& out) const {
  const size_t n = text.size();
  auto letter_run = [&](size_t from) {
    size_t end = from;
    while (end < n && is_letter(text[end])) ++end;
    return end;
  };
  size_t i = 0;
  while (i < n) {
    char c = text[i];
    if (c == ' ' && i + 1 < n && is_letter(text[i + 1])) {
      size_t end = letter_run(i + 1);
      if (int32_t id = word_id(text.substr(i + 1, end - i - 1), true); id >= 0) {
        out.push_back(id);
        i = end;
        continue;
      }
    } else if (is_letter(c) && (i == 0 || !is_letter(text[i - 1]))) {
      size_t end = letter_run(i);
      if (int32_t id = word_id(text.substr(i, end - i), false); id >= 0) {
        out.push_back(id);
        i = end;
        continue;
      }
    } else if (c == '<' && i + 1 < n && text[i + 1] == '|') {
      bool matched = false;
      for (size_t s = 0; s < kSpecials.size(); ++s) {
        if (text.substr(i).starts_with(kSpecials[s])) {
          out.push_back(kImStart + static_cast<int32_t>(s));
          i += kSpecials[s].size();
          matched = true;
          break;
        }
      }
      if (matched) continue;
    }
    out.push_back(static_cast<unsigned char>(c));
    ++i;
  }
}

void StandInTokenizer::tokenize(std::string_view text, bool /*add_special_tokens*/,
                                std::vector<int32_t>& out) const {
  encode(text, out);
}

std::string StandInTokenizer::detokenize(std::span<const int32_t> ids,
                                         bool skip_special_tokens) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (!skip_special_tokens || !is_special(id)) decode_token(id, bytes);
  }
  std::string out;
  tokenizer::unicode::append_sanitized_utf8(bytes, out);
  return out;
}

void StandInTokenizer::decode_token(int32_t id, std::string& out) const {
  if (id < 0) return;
  if (id < 256) {
    out.push_back(static_cast<char>(id));
  } else if (id < kFirstWord) {
    out.append(kSpecials[static_cast<size_t>(id - kImStart)]);
  } else if (id < vocab_size()) {
    int32_t w = (id - kFirstWord) / 2;
    if ((id - kFirstWord) % 2 == 1) out.push_back(' ');
    out.append(kWords[static_cast<size_t>(w)]);
  }
}

namespace {

// The model's tokenizer behind the sim's interface.
class HfTokenizer final : public Tokenizer {
 public:
  explicit HfTokenizer(std::unique_ptr<tokenizer::Tokenizer> t)
      : t_(std::move(t)), name_("tokenizer.json: " + t_->description()) {
    eos_ = t_->eos_token_id().value_or(-1);
  }
  std::string_view name() const override { return name_; }
  void encode(std::string_view text, std::vector<int32_t>& out) const override {
    t_->encode(text, false, out);
  }
  void tokenize(std::string_view text, bool add_special_tokens,
                std::vector<int32_t>& out) const override {
    t_->encode(text, add_special_tokens, out);
  }
  std::string detokenize(std::span<const int32_t> ids, bool skip_special_tokens) const override {
    return t_->decode(ids, skip_special_tokens);
  }
  void decode_token(int32_t id, std::string& out) const override {
    if (id < 0 || id >= t_->vocab_size()) return;
    t_->append_token_bytes(id, out);
  }
  int32_t vocab_size() const override { return t_->vocab_size(); }
  int32_t eos_token_id() const override { return eos_; }
  bool is_special(int32_t id) const override { return t_->is_special(id); }

 private:
  std::unique_ptr<tokenizer::Tokenizer> t_;
  std::string name_;
  int32_t eos_ = -1;
};

}  // namespace

std::unique_ptr<Tokenizer> make_tokenizer(std::string_view path, std::string& note,
                                          std::string& error) {
  error.clear();
  note.clear();
  if (path.empty()) return std::make_unique<StandInTokenizer>();
  auto t = tokenizer::Tokenizer::load(std::string(path), error);
  if (!t) return nullptr;
  if (!t->eos_token_id()) {
    error = std::string(path) + ": tokenizer_config.json names no eos_token in the vocabulary";
    return nullptr;
  }
  auto hf = std::make_unique<HfTokenizer>(std::move(t));
  note = std::string(hf->name());
  return hf;
}

}  // namespace kvgate::sim
