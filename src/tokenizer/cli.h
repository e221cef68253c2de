// tokenizer/cli: `kvgate tokenize --tokenizer-path DIR [--add-special-tokens]`, a JSON-lines
// filter for tests and users. Each stdin line is one request, each stdout line its answer, in
// order:
//   {"text": "..."}                          -> {"ids": [...]}
//   {"messages": [...], "add_generation_prompt": true, "tools": [...], ...}
//                                            -> {"prompt": "<rendered chat template>", "ids":
//                                            [...]}
//   {"decode": [ids...]}                     -> {"text": "..."}
//   {"text_b64": "<base64>"}                 -> {"ids": [...]}   (raw bytes, e.g. invalid UTF-8)
// A line may set "add_special_tokens" (overrides the flag; chat prompts default to false, as
// transformers' apply_chat_template) and, for chat, "chat_template_kwargs" (extra template
// variables such as enable_thinking). A line that fails gets {"error": "..."} naming the problem.
#pragma once

#include <iosfwd>
#include <span>
#include <string>

namespace kvgate::tokenizer {

// `args` are the arguments after "tokenize". Returns the process exit status.
int run_tokenize_command(std::span<const std::string> args, std::istream& in, std::ostream& out,
                         std::ostream& err);
int run_tokenize_command(int argc, char** argv);

}  // namespace kvgate::tokenizer
