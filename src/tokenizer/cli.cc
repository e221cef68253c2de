// tokenizer/cli: `kvgate tokenize`. See cli.h.
#include "tokenizer/cli.h"

#include <simdjson.h>

#include <charconv>
#include <iostream>
#include <vector>

#include "tokenizer/chat_template.h"
#include "tokenizer/piece_cache.h"
#include "tokenizer/tokenizer.h"
#include "util/base64.h"
#include "util/flags.h"
#include "util/json.h"
#include "util/json_parser.h"

namespace kvgate::tokenizer {
namespace {

struct TokenizeConfig {
  std::string tokenizer_path;
  bool add_special_tokens = false;
  int64_t tokenizer_cache_bytes = 67108864;
};

std::vector<flags::Knob<TokenizeConfig>> tokenize_knobs() {
  using C = TokenizeConfig;
  return {
      {.name = "tokenizer-path",
       .group = "Tokenizer",
       .value_name = "DIR",
       .help = "Directory with tokenizer.json and tokenizer_config.json (chat template).",
       .field = &C::tokenizer_path},
      {.name = "add-special-tokens",
       .group = "Tokenizer",
       .help = "Add the post-processor's special tokens (e.g. BOS) to {\"text\"} lines, as HF "
               "encode(add_special_tokens=True). A line's \"add_special_tokens\" overrides it.",
       .field = &C::add_special_tokens},
      {.name = "tokenizer-cache-bytes",
       .group = "Tokenizer",
       .value_name = "BYTES",
       .help = "Bound of the cache of pieces' ids (the text between added tokens, as the "
               "gateway's --tokenizer-cache-bytes); 0: no cache.",
       .field = &C::tokenizer_cache_bytes,
       .min = 0},
  };
}

void append_ids(std::string& out, const std::vector<int32_t>& ids) {
  out.push_back('[');
  char buf[16];
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out.push_back(',');
    auto r = std::to_chars(buf, buf + sizeof(buf), ids[i]);
    out.append(buf, static_cast<size_t>(r.ptr - buf));
  }
  out.push_back(']');
}

std::string error_line(std::string_view msg) {
  std::string out = "{\"error\":";
  json::append_string(out, msg);
  out.push_back('}');
  return out;
}

std::string handle_line(std::string_view line, const Tokenizer& tok, const ChatTemplate* chat,
                        const std::string& chat_error, bool add_special_default) {
  thread_local simdjson::dom::parser parser;
  json::ParserRelease release(parser);  // a huge line does not stay allocated
  simdjson::padded_string padded(line);
  simdjson::dom::element root;
  if (auto e = parser.parse(padded).get(root); e) {
    return error_line(std::string("invalid JSON line: ") + simdjson::error_message(e));
  }
  if (!root.is_object()) return error_line("each line must be a JSON object");
  bool add_special = add_special_default;
  bool add_special_given = false;
  if (auto v = root["add_special_tokens"]; !v.error()) {
    if (v.get(add_special)) return error_line("add_special_tokens must be a boolean");
    add_special_given = true;
  }
  std::string out;
  std::vector<int32_t> ids;
  std::string err;

  simdjson::dom::element text, messages, decode;
  std::string raw;
  bool has_text = !root["text"].get(text);
  bool from_b64 = false;
  if (!has_text && !root["text_b64"].get(text)) {
    // Raw bytes (possibly not UTF-8), for callers whose text is not valid JSON string content.
    std::string_view b64;
    if (text.get(b64) || !base64_decode(b64, raw)) return error_line("text_b64 must be base64");
    has_text = from_b64 = true;
  }
  if (has_text) {
    std::string_view s = raw;
    if (!from_b64 && text.get(s)) return error_line("text must be a string");
    if (!tok.encode(s, add_special, ids, &err)) return error_line(err);
    out = "{\"ids\":";
    append_ids(out, ids);
    out.push_back('}');
    return out;
  }
  if (!root["messages"].get(messages)) {
    if (!chat) return error_line(chat_error);
    if (!messages.is_array()) return error_line("messages must be an array");
    bool gen = false;
    if (auto v = root["add_generation_prompt"]; !v.error() && !v.is_null()) {
      if (v.get(gen)) return error_line("add_generation_prompt must be a boolean");
    }
    std::string tools_json, extra_json;
    if (auto v = root["tools"]; !v.error() && !v.is_null()) {
      if (!v.is_array()) return error_line("tools must be an array");
      tools_json = simdjson::minify(v.value_unsafe());
    }
    if (auto v = root["chat_template_kwargs"]; !v.error() && !v.is_null()) {
      if (!v.is_object()) return error_line("chat_template_kwargs must be an object");
      extra_json = simdjson::minify(v.value_unsafe());
    }
    std::string prompt;
    if (!chat->render_json(simdjson::minify(messages), tools_json, gen, extra_json, prompt, err)) {
      return error_line(err);
    }
    if (!tok.encode(prompt, add_special_given && add_special, ids, &err)) return error_line(err);
    out = "{\"prompt\":";
    json::append_string(out, prompt);
    out.append(",\"ids\":");
    append_ids(out, ids);
    out.push_back('}');
    return out;
  }
  if (!root["decode"].get(decode)) {
    simdjson::dom::array arr;
    if (decode.get(arr)) return error_line("decode must be an array of ids");
    for (auto x : arr) {
      int64_t id;
      if (x.get(id) || id < 0 || id > INT32_MAX) return error_line("decode ids must be integers");
      ids.push_back(static_cast<int32_t>(id));
    }
    bool skip = false;
    if (auto v = root["skip_special_tokens"]; !v.error() && v.get(skip)) skip = false;
    out = "{\"text\":";
    json::append_string(out, tok.decode(ids, skip));
    out.push_back('}');
    return out;
  }
  return error_line("a line needs \"text\", \"messages\" or \"decode\"");
}

}  // namespace

int run_tokenize_command(std::span<const std::string> args, std::istream& in, std::ostream& out,
                         std::ostream& err) {
  TokenizeConfig cfg;
  auto knobs = tokenize_knobs();
  std::vector<std::string> argv(args.begin(), args.end());
  auto parsed = flags::parse(std::span<const flags::Knob<TokenizeConfig>>(knobs), argv, cfg, "");
  if (!parsed.ok) {
    err << "kvgate tokenize: " << parsed.error << "\n";
    return 2;
  }
  if (parsed.help) {
    out << flags::help(
        std::span<const flags::Knob<TokenizeConfig>>(knobs),
        "kvgate tokenize --tokenizer-path DIR [--add-special-tokens] < lines.jsonl",
        "Reads JSON lines on stdin and writes one JSON line per input line:\n"
        "  {\"text\": \"...\"}                          -> {\"ids\": [...]}\n"
        "  {\"messages\": [...], \"add_generation_prompt\": true, \"tools\": [...],\n"
        "   \"chat_template_kwargs\": {...}}            -> {\"prompt\": \"...\", \"ids\": [...]}\n"
        "  {\"decode\": [ids...]}                     -> {\"text\": \"...\"}\n"
        "A line that fails gets {\"error\": \"...\"}.",
        "");
    return 0;
  }
  if (!parsed.positional.empty()) {
    err << "kvgate tokenize: unexpected argument '" << parsed.positional[0] << "'\n";
    return 2;
  }
  if (cfg.tokenizer_path.empty()) {
    err << "kvgate tokenize: --tokenizer-path DIR is required\n";
    return 2;
  }
  std::string error;
  auto tok = Tokenizer::load(cfg.tokenizer_path, error);
  if (!tok) {
    err << "kvgate tokenize: " << error << "\n";
    return 1;
  }
  if (cfg.tokenizer_cache_bytes > 0) {
    tok->set_piece_cache(
        std::make_shared<PieceCache>(static_cast<size_t>(cfg.tokenizer_cache_bytes)));
  }
  std::string chat_error;
  auto chat = ChatTemplate::load(cfg.tokenizer_path, chat_error);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    out << handle_line(line, *tok, chat.get(), chat_error, cfg.add_special_tokens) << '\n';
  }
  out.flush();
  return 0;
}

int run_tokenize_command(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  std::ios::sync_with_stdio(false);
  return run_tokenize_command(args, std::cin, std::cout, std::cerr);
}

}  // namespace kvgate::tokenizer
