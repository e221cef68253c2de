// Fuzz target: Tokenizer::encode / decode on untrusted text (any bytes, invalid UTF-8 included)
// and ids. Uses models/qwen3 when scripts/setup fetched it (its NFC normalizer, added tokens and
// regex), else a small built-in byte-level tokenizer. Checks: no crash, every id in range, and
// decode(encode(text)) == text for valid UTF-8 (byte-level BPE is lossless).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace {

const char kTiny[] = R"({"version":"1.0","added_tokens":[
  {"id":300,"content":"<|im_start|>","special":true},{"id":301,"content":"<x>","special":false,"lstrip":true,"rstrip":true}],
  "normalizer":{"type":"NFC"},
  "pre_tokenizer":{"type":"Sequence","pretokenizers":[
    {"type":"Split","pattern":{"Regex":"(?i:'s|'t)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},"behavior":"Isolated","invert":false},
    {"type":"ByteLevel","add_prefix_space":false,"use_regex":false}]},
  "post_processor":null,"decoder":{"type":"ByteLevel"},
  "model":{"type":"BPE","vocab":{},"merges":[]}})";

std::unique_ptr<kvgate::tokenizer::Tokenizer> make_tokenizer() {
  std::string f = KVGATE_SOURCE_DIR;
  std::string err;
  if (std::filesystem::exists(f + "/models/qwen3/tokenizer.json")) {
    if (auto t = kvgate::tokenizer::Tokenizer::load(f + "/models/qwen3", err)) return t;
  }
  // Built-in: a vocabulary of the 256 byte-level characters.
  std::string json = kTiny;
  std::string vocab;
  // Byte-level alphabet: printable Latin-1 stand for themselves, the rest map to U+0100...
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    char32_t c = printable ? static_cast<char32_t>(b) : next++;
    std::string s;
    kvgate::tokenizer::unicode::append_utf8(c, s);
    if (s == "\"" || s == "\\") s.insert(0, "\\");
    if (!vocab.empty()) vocab += ',';
    vocab.append("\"").append(s).append("\":").append(std::to_string(b));
  }
  json.replace(json.find("\"vocab\":{}"), 10, "\"vocab\":{" + vocab + "}");
  return kvgate::tokenizer::Tokenizer::from_json(json, "", err);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto tok = make_tokenizer();
  if (!tok) __builtin_trap();
  std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<int32_t> ids;
  std::string err;
  if (!tok->encode(text, size % 2 == 0, ids, &err)) return 0;  // regex resource limit: reported
  for (int32_t id : ids) {
    if (id < 0 || id >= tok->vocab_size()) __builtin_trap();
  }
  std::vector<int32_t> plain;
  tok->encode(text, false, plain);
  if (kvgate::tokenizer::unicode::is_valid_utf8(text) && tok->decode(plain) != text) {
    // NFC may legitimately change text; compare against the normalized form then.
    std::string nfc;
    kvgate::tokenizer::unicode::normalize(kvgate::tokenizer::unicode::Form::kNFC, text, nfc);
    if (tok->decode(tok->encode(nfc)) != nfc) __builtin_trap();
  }
  // Arbitrary ids (including out of range) decode without crashing.
  std::vector<int32_t> raw;
  for (size_t i = 0; i + 4 <= size && raw.size() < 64; i += 4) {
    int32_t v;
    std::memcpy(&v, data + i, 4);
    raw.push_back(v);
  }
  (void)tok->decode(raw, size % 3 == 0);
  return 0;
}
