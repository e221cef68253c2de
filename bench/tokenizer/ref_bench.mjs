// bench/tokenizer/ref_bench.mjs: the reference side of the tokenizer benchmark.
//
//   node bench/tokenizer/ref_bench.mjs MODEL_DIR CORPUS_FILE [SECONDS]
//
// Encodes every document of the corpus (U+001E separated) one after another with HF tokenizers'
// Rust core (@anush008/tokenizers, one call in flight: single-threaded), repeating for SECONDS,
// and prints one JSON line: tokens/s for 4 KB requests and for the whole corpus as one document,
// the FNV-1a checksum of all ids (to check both sides produce the same output), and the
// @huggingface/jinja render time of a 20-turn chat, and the load time and RSS growth of loading
// the tokenizer.
import { createRequire } from "module";
import fs from "fs";
import path from "path";

const require = createRequire(path.resolve("tests/conformance/package.json"));
const { Tokenizer } = require("@anush008/tokenizers");
const { Template } = require("@huggingface/jinja");

const [modelDir, corpusFile, secsArg] = process.argv.slice(2);
const secs = Number(secsArg ?? 3);
const rssBefore = process.memoryUsage().rss;
const loadStart = process.hrtime.bigint();
const tok = Tokenizer.fromFile(path.join(modelDir, "tokenizer.json"));
const load_ms = Number(process.hrtime.bigint() - loadStart) / 1e6;
const load_rss_bytes = process.memoryUsage().rss - rssBefore;
const config = JSON.parse(fs.readFileSync(path.join(modelDir, "tokenizer_config.json"), "utf8"));
const docs = fs.readFileSync(corpusFile, "utf8").split("\x1e");

function fnv(ids, h) {
  for (const id of ids) {
    for (let k = 0; k < 4; ++k) {
      h ^= (id >>> (8 * k)) & 0xff;
      h = Math.imul(h, 16777619) >>> 0;
    }
  }
  return h;
}

// Warm up (fills the BPE cache, as the C++ side's warm-up does) and checksum.
let checksum = 2166136261;
let tokensPerPass = 0;
for (const d of docs) {
  const ids = (await tok.encode(d, null, { addSpecialTokens: false })).getIds();
  checksum = fnv(ids, checksum);
  tokensPerPass += ids.length;
}

async function measure(list) {
  let tokens = 0;
  const start = process.hrtime.bigint();
  let elapsed = 0;
  do {
    for (const d of list) tokens += (await tok.encode(d, null, { addSpecialTokens: false })).getLength();
    elapsed = Number(process.hrtime.bigint() - start) / 1e9;
  } while (elapsed < secs);
  return tokens / elapsed;
}
const requests = await measure(docs);
const whole = await measure([docs.join("")]);

// 20-turn chat render (the same conversation as the C++ benchmark).
let render_us = null;
if (typeof config.chat_template === "string") {
  const t = new Template(config.chat_template);
  const messages = [{ role: "system", content: "You are a helpful assistant." }];
  for (let i = 0; i < 10; ++i) {
    messages.push({ role: "user", content: `Question number ${i}: what does the cache router do with prefix ${i}?` });
    messages.push({ role: "assistant", content: `Answer number ${i}: it sends the request to the worker holding the longest prefix.` });
  }
  const vars = { messages, add_generation_prompt: true, tools: null, bos_token: config.bos_token ?? "", eos_token: config.eos_token ?? "" };
  for (let i = 0; i < 200; ++i) t.render(vars);
  const n = 5000;
  const s = process.hrtime.bigint();
  for (let i = 0; i < n; ++i) t.render(vars);
  render_us = Number(process.hrtime.bigint() - s) / 1e3 / n;
}
console.log(JSON.stringify({ model: path.basename(modelDir), docs: docs.length, tokens_per_pass: tokensPerPass, checksum, requests_tokens_per_s: Math.round(requests), document_tokens_per_s: Math.round(whole), chat20_render_us: render_us, load_ms, load_rss_bytes }));
