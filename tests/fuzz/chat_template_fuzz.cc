// Fuzz target: chat templates on untrusted input. The first byte picks the mode:
//   even: the rest is a messages JSON document (any bytes), rendered with the Qwen3 template
//         (models/qwen3 when fetched, else a built-in ChatML template with tools);
//   odd:  the rest is template source, parsed and (when it parses) rendered with a fixed
//         conversation, under a size guard.
// Checks: no crash, no hang; errors are reported as errors. Renders stop after kSteps steps of
// evaluation: template source can nest loops that would run for minutes or fill memory (a list
// nested 10,000 deep per iteration of loops nested in each other), which the fuzzer would report
// as a failure though the template only does what it says.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "tokenizer/chat_template.h"
#include "tokenizer/jinja.h"

namespace {

// 0.1 to 0.25 s of rendering in the fuzz build; a chat of 4 KiB through Qwen3's template takes
// about 4,000 steps.
constexpr uint64_t kSteps = 200000;

const char kChatML[] =
    "{%- if tools %}{{- '<|im_start|>system\\n# Tools\\n' }}{%- for t in tools %}{{ t | tojson }}"
    "{%- endfor %}{{ '<|im_end|>\\n' }}{%- endif %}"
    "{%- for m in messages %}{{ '<|im_start|>' + m.role + '\\n' }}{%- if m.content is string %}"
    "{{ m.content | trim }}{%- else %}{%- for p in m.content %}{{ p.text }}{%- endfor %}{%- endif "
    "%}"
    "{%- if m.tool_calls %}{%- for c in m.tool_calls %}{{ c.function.name }}"
    "{{ c.function.arguments | tojson }}{%- endfor %}{%- endif %}{{ '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}";

std::unique_ptr<kvgate::tokenizer::ChatTemplate> make_template() {
  std::string f = KVGATE_SOURCE_DIR;
  std::string err;
  if (std::filesystem::exists(f + "/models/qwen3/tokenizer_config.json")) {
    if (auto t = kvgate::tokenizer::ChatTemplate::load(f + "/models/qwen3", err)) return t;
  }
  return kvgate::tokenizer::ChatTemplate::from_source(kChatML, {}, err);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto chat = make_template();
  kvgate::tokenizer::jinja::set_render_step_limit(kSteps);
  if (!chat || size == 0) return 0;
  std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::string out, err;
  if (data[0] % 2 == 0) {
    chat->render_json(rest, "", data[0] % 4 == 0, "", out, err);
    return 0;
  }
  if (rest.size() > 4096) return 0;
  auto t = kvgate::tokenizer::jinja::Template::parse(rest, err);
  if (!t) return 0;
  kvgate::tokenizer::jinja::Value msgs;
  kvgate::tokenizer::jinja::from_json(
      R"([{"role":"system","content":"s"},{"role":"user","content":"hi"},)"
      R"({"role":"assistant","content":"yo","tool_calls":[{"function":{"name":"f","arguments":{"a":1}}}]}])",
      msgs, err);
  t->render({{"messages", msgs}, {"add_generation_prompt", kvgate::tokenizer::jinja::Value(true)}},
            out, err);
  return 0;
}
