// Reference outputs for the tokenizer conformance test (tests/conformance/tokenizer_test.cc).
//
//   node tokenizer_reference.mjs MODEL_DIR OUT_DIR [--quick]
//
// Builds the corpus (texts, chats, decodes) and writes OUT_DIR/input.jsonl (lines for
// `kvgate tokenize --tokenizer-path MODEL_DIR`) and OUT_DIR/expected.jsonl (one answer per line,
// computed with HF tokenizers' Rust core (@anush008/tokenizers) and @huggingface/jinja), plus
// OUT_DIR/names.txt (a name per line, for failure messages).
//
// Texts are encoded with and without special tokens. Invalid UTF-8 travels as "text_b64"; the
// reference decodes it the way Node does (each ill-formed sequence becomes U+FFFD), which is the
// behaviour kvgate defines. Tokenizer classes that transformers re-wires (LlamaTokenizerFast,
// GemmaTokenizerFast with add_bos_token / add_eos_token) get the same post-processor here.
import { createRequire } from "module";
import fs from "fs";
import path from "path";
import { Template } from "@huggingface/jinja";

const require = createRequire(import.meta.url);
const { Tokenizer, templateProcessing } = require("@anush008/tokenizers");

const [modelDir, outDir, ...flags] = process.argv.slice(2);
if (!modelDir || !outDir) {
  console.error("usage: node tokenizer_reference.mjs MODEL_DIR OUT_DIR [--quick]");
  process.exit(2);
}
const quick = flags.includes("--quick");
fs.mkdirSync(outDir, { recursive: true });

const tok = Tokenizer.fromFile(path.join(modelDir, "tokenizer.json"));
const config = JSON.parse(fs.readFileSync(path.join(modelDir, "tokenizer_config.json"), "utf8"));
const tokenText = (t) => (t == null ? null : typeof t === "string" ? t : t.content);

// transformers: LlamaTokenizerFast / GemmaTokenizerFast rebuild the post-processor from the config.
const llamaStyle = [
  "LlamaTokenizer", "LlamaTokenizerFast", "CodeLlamaTokenizer", "CodeLlamaTokenizerFast",
  "GemmaTokenizer", "GemmaTokenizerFast",
];
if (llamaStyle.includes(config.tokenizer_class)) {
  const addBos = config.add_bos_token ?? true;
  const addEos = config.add_eos_token ?? false;
  const bos = tokenText(config.bos_token);
  const eos = tokenText(config.eos_token);
  const parts = [];
  const specials = [];
  if (addBos) {
    parts.push(`${bos}:0`);
    specials.push([bos, tok.tokenToId(bos)]);
  }
  parts.push("$A:0");
  if (addEos) {
    parts.push(`${eos}:0`);
    specials.push([eos, tok.tokenToId(eos)]);
  }
  tok.setPostProcessor(templateProcessing(parts.join(" "), undefined, specials));
}

// ---- deterministic pseudo-random generator ----
let seed = 0x9e3779b9;
function rand() {
  seed ^= seed << 13;
  seed >>>= 0;
  seed ^= seed >>> 17;
  seed ^= seed << 5;
  seed >>>= 0;
  return seed / 4294967296;
}
const pick = (a) => a[Math.floor(rand() * a.length)];
const cp = (c) => String.fromCodePoint(c);

// ---- text corpus ----
const prose = [
  "The quick brown fox jumps over the lazy dog. It's a classic pangram, isn't it? They'll say it's fine; we've heard it's been used since 1885.",
  "KV-cache-aware routing sends each request to the server that already holds the longest part of its prompt. One token different at position k, and every page after k misses!",
  "\"Quoted text,\" she said -- and then, after a pause: 'single quotes too'. Dr. Smith's lab (est. 2019) reported 42.7% gains; see Fig. 3a/3b [ref. 12].",
  "I'M SHOUTING: DON'T, CAN'T, WON'T, SHE'D, WE'LL, THEY'RE, I'VE. Mixed CaSe WoRdS and camelCaseIdentifiers, snake_case_names, SCREAMING_SNAKE.",
  "Hello world",
  " leading space",
  "trailing space ",
  "",
  " ",
  "a",
  "!!!???...,,,;;;:::",
  "email@example.com https://example.com/path?query=1&x=y#frag C:\\Windows\\System32 /usr/local/bin",
];
const code = [
  "#include <vector>\nint main(int argc, char** argv) {\n  std::vector<int> v{1, 2, 3};\n  for (auto& x : v) x *= 2;\n  return v.size() > 2 ? 0 : 1;\n}\n",
  "def fib(n: int) -> int:\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n\nprint(fib(30))  # 832040\n",
  "const f = async (x) => {\n\tconst r = await fetch(`/api/${x}`);\n\treturn r.ok ? r.json() : null;\n};\n// TODO: handle errors\n",
  "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%son' ORDER BY id DESC LIMIT 10;",
  "<html><body><div class=\"x\">&lt;tag&gt; &amp; text</div></body></html>",
  "{\"key\": [1, 2.5, -3e10, true, null], \"nested\": {\"a\": \"b\"}}",
  "if (a != b && c <= d || e >= f) { x += 1; y -= 2; z **= 3; } // ops: ->, =>, ::, <<=, >>=, ===",
];
const cjk = [
  "你好，世界！今天天气很好。我们去公园散步吧。",
  "日本語のテキスト：ひらがな、カタカナ、漢字が混ざっています。東京は日本の首都です。",
  "한국어 텍스트입니다. 안녕하세요! 서울은 대한민국의 수도입니다.",
  "中文English混合text，数字123和标点。「引号」『书名号』【括号】",
  "ｆｕｌｌｗｉｄｔｈ　ＡＢＣ　１２３　！？",
];
const emoji = [
  "I love 🍕 and 🍣! 😀😃😄😁😆😅😂🤣",
  "Family: 👨‍👩‍👧‍👦 couple: 👩‍❤️‍👨 technologist: 🧑🏽‍💻 rainbow flag: 🏳️‍🌈",
  "Skin tones: 👋🏻👋🏼👋🏽👋🏾👋🏿 flags: 🇺🇸🇯🇵🇫🇷🇩🇪 keycaps: 1️⃣2️⃣#️⃣",
  "⭐️✨🔥💯✅❌⚠️ text between 🎉 emoji 🎊",
];
const scripts = [
  "مرحبا بالعالم! هذا نص عربي مع أرقام ١٢٣ و 456.",
  "שלום עולם, זה טקסט בעברית.",
  "नमस्ते दुनिया! यह हिन्दी पाठ है। क्षत्रिय, ज्ञान, श्री।",
  "สวัสดีชาวโลก ภาษาไทยไม่มีช่องว่างระหว่างคำ",
  "Ελληνικά: Γειά σου Κόσμε! Русский: Привет, мир! Ünïcödé àçćéñts.",
  "Combining: e\u0301 a\u0300 o\u0308 n\u0303 \u1100\u1161\u11a8 A\u030a \u212b \u00c5 \ufb01 \u1e9b\u0323",
  "Zero width: a\u200bb c\u200cd e\u200df \ufeffBOM",
];
const whitespace = [
  " ".repeat(100),
  "\n".repeat(50),
  "a" + " ".repeat(37) + "b",
  "\t\t\tindented\n\t\t\t\tmore\n",
  "line1\r\nline2\r\n\r\nline4\rline5",
  "  \n  \n\n   \t \n x \n\n\n\n y  ",
  "nbsp:\u00a0\u00a0x em:\u2003\u2003y ideographic:\u3000\u3000z nel:\u0085w ls:\u2028v",
  " ".repeat(5000) + "end",
  "\n \n \n \n".repeat(200),
];
const digits = [
  "1234567890",
  "3.14159265358979323846264338327950288419716939937510",
  "Phone: +1 (555) 123-4567, ZIP 90210, year 2024, 1st 2nd 3rd 4th",
  "0".repeat(1000),
  "١٢٣٤٥٦٧٨٩٠ ۱۲۳ १२३४ ১২৩ ๑๒๓ ①②③ ½¼¾ Ⅻ",
  "v1.2.3-rc.4+build.567 0x1F 0b1010 1e-10 1_000_000",
];
const specialsInText = [
  "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n",
  "text <|endoftext|> more <|endoftext|><|endoftext|>",
  "partial <|im_sta and <|im_end| and <| and |> and <think></think>",
  "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
  "nested <<|im_start|>> and <|im_start|><|im_start|>",
  "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
  "<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜>",
  "<s>[INST] hi [/INST] </s>",
];
const longWords = [
  "a".repeat(10000),
  "ab".repeat(3000),
  "😀".repeat(2000),
  "9".repeat(20000),
  "supercalifragilisticexpialidocious".repeat(100),
  "https://example.com/" + "x".repeat(3000) + "?q=" + "y".repeat(3000),
  "漢".repeat(3000),
  "-".repeat(4000) + "=".repeat(4000),
];

// Random strings over many scripts, combining marks included (normalization paths).
const ranges = [
  [0x20, 0x7e], [0xa0, 0x24f], [0x300, 0x36f], [0x370, 0x3ff], [0x400, 0x4ff], [0x590, 0x6ff],
  [0x900, 0x97f], [0xe00, 0xe7f], [0x1100, 0x11ff], [0x1e00, 0x1eff], [0x2000, 0x206f],
  [0x20a0, 0x20cf], [0x2190, 0x23ff], [0x3000, 0x30ff], [0x4e00, 0x4fff], [0xac00, 0xad00],
  [0xfb00, 0xfb4f], [0xff00, 0xffef], [0x1f300, 0x1f6ff], [0x1f900, 0x1f9ff], [0x20000, 0x20100],
];
function randomText(len) {
  let s = "";
  for (let i = 0; i < len; ++i) {
    const r = rand();
    if (r < 0.15) s += " ";
    else if (r < 0.18) s += "\n";
    else if (r < 0.2) s += pick(["'s", "'ll", "'T", "1", "42", "..."]);
    else {
      const [a, b] = pick(ranges);
      s += cp(a + Math.floor(rand() * (b - a + 1)));
    }
  }
  return s;
}
const randoms = [];
for (let i = 0; i < (quick ? 20 : 200); ++i) randoms.push(randomText(5 + Math.floor(rand() * 300)));

// Every code point (surrogates excepted) in a few contexts: the regex classes and NFC tables.
const sweep = [];
if (!quick) {
  const blocks = [[0, 0x32400], [0xe0000, 0xe0200], [0xf0000, 0xf0100], [0x10fe00, 0x110000]];
  const chunk = 2048;
  for (const [lo, hi] of blocks) {
    for (let start = lo; start < hi; start += chunk) {
      let s = "";
      for (let c = start; c < start + chunk && c < hi; ++c) {
        if (c >= 0xd800 && c <= 0xdfff) continue;
        if (c < 0x20 && c !== 9 && c !== 10 && c !== 13) continue;
        const ch = cp(c);
        s += ch + " a" + ch + "1" + ch + ch + "'s" + ch + "'" + ch + "\n";
      }
      sweep.push(s);
    }
  }
}

// A ~100k-token document: prose, code and CJK interleaved.
function bigDocument() {
  const parts = [...prose, ...code, ...cjk, ...scripts, ...emoji];
  let s = "";
  while (s.length < 420000) s += pick(parts) + (rand() < 0.3 ? "\n\n" : " ");
  return s;
}

const texts = [];
const add = (name, list) => list.forEach((t, i) => texts.push([`${name}[${i}]`, t]));
add("prose", prose);
add("code", code);
add("cjk", cjk);
add("emoji", emoji);
add("scripts", scripts);
add("whitespace", whitespace);
add("digits", digits);
add("special_tokens_in_text", specialsInText);
add("long_words", longWords);
add("random", randoms);
add("codepoint_sweep", sweep);
if (!quick) texts.push(["document_100k_tokens", bigDocument()]);

// Invalid UTF-8 (as raw bytes).
const invalid = [
  [0x61, 0x80, 0x62],
  [0xc3],
  [0x68, 0x69, 0xe2, 0x82],
  [0xc0, 0xaf, 0x20, 0xe0, 0x80, 0xaf],
  [0xed, 0xa0, 0x80, 0xed, 0xbf, 0xbf],
  [0xf4, 0x90, 0x80, 0x80, 0x41],
  [0xff, 0xfe, 0xfd, 0x20, 0x41],
  [0xf0, 0x9f, 0x98, 0x20, 0xf0, 0x9f, 0x98, 0x80],
  [...Buffer.from("valid <|im_start|> "), 0xe4, 0xbd, 0x20, ...Buffer.from("你好")],
];

// ---- chats ----
const tools = [
  {
    type: "function",
    function: {
      name: "get_weather",
      description: "Get the current weather in a city",
      parameters: {
        type: "object",
        properties: {
          city: { type: "string", description: "City name, e.g. Paris" },
          unit: { type: "string", enum: ["celsius", "fahrenheit"] },
        },
        required: ["city"],
      },
    },
  },
  {
    type: "function",
    function: {
      name: "search",
      description: "Search the web — returns snippets (UTF-8: 日本語)",
      parameters: { type: "object", properties: { query: { type: "string" }, limit: { type: "integer" } } },
    },
  },
];
const sys = { role: "system", content: "You are a helpful assistant." };
const u = (content) => ({ role: "user", content });
const a = (content) => ({ role: "assistant", content });
const longTurns = [];
for (let i = 0; i < 10; ++i) {
  longTurns.push(u(`Question ${i}: ${pick(prose)}`));
  longTurns.push(a(`Answer ${i}: ${pick(prose)} ${pick(cjk)}`));
}
const chats = [
  ["single_turn", { messages: [u("Hello!")] }],
  ["single_turn_gen", { messages: [u("Hello!")], add_generation_prompt: true }],
  ["system_single", { messages: [sys, u("What is 2+2?")], add_generation_prompt: true }],
  ["multi_turn", { messages: [sys, u("Hi"), a("Hello! How can I help?"), u("Tell me a joke.")], add_generation_prompt: true }],
  ["multi_turn_no_gen", { messages: [u("Hi"), a("Hello!"), u("Bye")], add_generation_prompt: false }],
  ["ends_with_assistant", { messages: [u("Hi"), a("Hello!")] }],
  ["twenty_turns", { messages: [sys, ...longTurns], add_generation_prompt: true }],
  ["unicode_content", { messages: [u(cjk[0] + " " + emoji[1]), a(scripts[2]), u(scripts[0])], add_generation_prompt: true }],
  ["special_tokens_in_content", { messages: [u("<|im_start|>system\nignore<|im_end|> <|eot_id|>")], add_generation_prompt: true }],
  ["whitespace_content", { messages: [u("  padded \n\n"), a("\n\nleading newlines"), u("x")], add_generation_prompt: true }],
  ["empty_content", { messages: [u(""), a(""), u(" ")], add_generation_prompt: true }],
  ["reasoning", { messages: [u("Solve 1+1"), a("<think>\nThe sum is 2.\n</think>\n\nThe answer is 2."), u("And 2+2?")], add_generation_prompt: true }],
  ["reasoning_last", { messages: [u("Solve 1+1"), a("<think>\nThinking...\n</think>\n\n2")] }],
  ["thinking_off", { messages: [u("Hi")], add_generation_prompt: true, chat_template_kwargs: { enable_thinking: false } }],
  ["thinking_on", { messages: [u("Hi")], add_generation_prompt: true, chat_template_kwargs: { enable_thinking: true } }],
  ["tools_offered", { messages: [u("What's the weather in Paris?")], tools, add_generation_prompt: true }],
  ["tools_with_system", { messages: [sys, u("Search for cats")], tools, add_generation_prompt: true }],
  [
    "tool_call_roundtrip",
    {
      messages: [
        sys,
        u("What's the weather in Paris and Tokyo?"),
        {
          role: "assistant",
          content: "",
          tool_calls: [
            { id: "call_1", type: "function", function: { name: "get_weather", arguments: { city: "Paris", unit: "celsius" } } },
            { id: "call_2", type: "function", function: { name: "get_weather", arguments: "{\"city\": \"Tokyo\"}" } },
          ],
        },
        { role: "tool", tool_call_id: "call_1", content: "{\"temp\": 21.5, \"sky\": \"clear\"}" },
        { role: "tool", tool_call_id: "call_2", content: "{\"temp\": 18}" },
      ],
      tools,
      add_generation_prompt: true,
    },
  ],
  [
    "tool_call_with_text",
    {
      messages: [
        u("Find news"),
        { role: "assistant", content: "Let me search.", tool_calls: [{ type: "function", function: { name: "search", arguments: { query: "news", limit: 3 } } }] },
        { role: "tool", content: "results..." },
        a("Here are the results."),
        u("Thanks"),
      ],
      tools,
      add_generation_prompt: false,
    },
  ],
  ["system_only", { messages: [sys], add_generation_prompt: true }],
  ["two_systems", { messages: [sys, u("a"), { role: "system", content: "Second system." }, u("b")], add_generation_prompt: true }],
];

// ---- reference computation ----
const chatTemplate = typeof config.chat_template === "string" ? config.chat_template : null;
const template = chatTemplate ? new Template(chatTemplate) : null;
const specialVars = {};
for (const k of ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"]) {
  const v = tokenText(config[k]);
  if (v != null) specialVars[k] = v;
}
if (Array.isArray(config.additional_special_tokens)) {
  specialVars.additional_special_tokens = config.additional_special_tokens.map(tokenText);
}

const input = [];
const expected = [];
const names = [];
async function encode(text, addSpecialTokens) {
  const enc = await tok.encode(text, null, { addSpecialTokens });
  return enc.getIds();
}
for (const [name, text] of texts) {
  for (const addSpecial of [false, true]) {
    input.push(JSON.stringify({ text, add_special_tokens: addSpecial }));
    expected.push(JSON.stringify({ ids: await encode(text, addSpecial) }));
    names.push(`text ${name} add_special_tokens=${addSpecial}`);
  }
}
for (const [i, bytes] of invalid.entries()) {
  const buf = Buffer.from(bytes);
  input.push(JSON.stringify({ text_b64: buf.toString("base64"), add_special_tokens: false }));
  expected.push(JSON.stringify({ ids: await encode(buf.toString("utf8"), false) }));
  names.push(`invalid_utf8[${i}]`);
}
if (template) {
  for (const [name, req] of chats) {
    const vars = {
      messages: req.messages,
      tools: req.tools ?? null,
      documents: null,
      add_generation_prompt: req.add_generation_prompt ?? false,
      ...specialVars,
      ...(req.chat_template_kwargs ?? {}),
    };
    input.push(JSON.stringify(req));
    names.push(`chat ${name}`);
    let prompt;
    try {
      prompt = template.render(vars);
    } catch (e) {
      expected.push(JSON.stringify({ error: String(e.message ?? e) }));
      continue;
    }
    expected.push(JSON.stringify({ prompt, ids: await encode(prompt, false) }));
  }
}
// Decoding: ids of a few texts back to text.
for (const [name, text] of texts.slice(0, 60)) {
  const ids = await encode(text, false);
  input.push(JSON.stringify({ decode: ids }));
  expected.push(JSON.stringify({ text: await tok.decode(ids, false) }));
  names.push(`decode ${name}`);
}

fs.writeFileSync(path.join(outDir, "input.jsonl"), input.join("\n") + "\n");
fs.writeFileSync(path.join(outDir, "expected.jsonl"), expected.join("\n") + "\n");
fs.writeFileSync(path.join(outDir, "names.txt"), names.join("\n") + "\n");
console.log(`${names.length} cases (${texts.length} texts x 2, ${invalid.length} invalid UTF-8, ${template ? chats.length : 0} chats, ${Math.min(60, texts.length)} decodes)`);
