// bench/tokenizer/corpus.mjs: writes the mixed benchmark corpus both sides tokenize.
//
//   node bench/tokenizer/corpus.mjs OUT_FILE [MEGABYTES]
//
// Documents of about 4 KB (a typical prompt) mixing English prose, code, Chinese/Japanese/Korean,
// emoji, Arabic/Devanagari, digits and whitespace runs, separated by U+001E (record separator).
import fs from "fs";

const [out, mbArg] = process.argv.slice(2);
if (!out) {
  console.error("usage: node corpus.mjs OUT_FILE [MEGABYTES]");
  process.exit(2);
}
const bytes = Number(mbArg ?? 2) * 1024 * 1024;
let seed = 12345;
const rand = () => {
  seed ^= seed << 13;
  seed >>>= 0;
  seed ^= seed >>> 17;
  seed ^= seed << 5;
  seed >>>= 0;
  return seed / 4294967296;
};
const pick = (a) => a[Math.floor(rand() * a.length)];
const words = (
  "the of and to in is that for it as was with be by on not he this are or his from at which " +
  "but have an they you were her she there been one all we their can has more when will would " +
  "cache routing prefix tokens server request latency throughput gateway engine model prompt " +
  "attention transformer kernel memory bandwidth scheduler batch decode prefill page block hash"
).split(" ");
const prose = () => {
  let s = "";
  const n = 20 + Math.floor(rand() * 60);
  for (let i = 0; i < n; ++i) {
    let w = pick(words);
    if (rand() < 0.1) w = w[0].toUpperCase() + w.slice(1);
    if (rand() < 0.05) w += pick(["'s", "'t", "'re", "'ll"]);
    s += w + (rand() < 0.08 ? pick([",", ".", ";", ":", "!", "?"]) : "") + " ";
  }
  return s.trim() + ".\n\n";
};
const code = [
  "for (size_t i = 0; i < n; ++i) {\n  sum += v[i] * w[i];\n}\n",
  "def handler(request):\n    body = json.loads(request.body)\n    return {\"ok\": True, \"n\": len(body)}\n",
  "    if (err != nil) {\n        return fmt.Errorf(\"open %s: %w\", path, err)\n    }\n",
  "SELECT name, COUNT(*) AS n FROM events WHERE ts > NOW() - INTERVAL '1 day' GROUP BY name;\n",
];
const other = [
  "人工智能正在改变我们的生活方式。大型语言模型可以理解和生成自然语言。",
  "東京の天気は晴れです。明日は雨が降るかもしれません。",
  "인공지능은 우리의 삶을 변화시키고 있습니다.",
  "الذكاء الاصطناعي يغير طريقة حياتنا. ",
  "कृत्रिम बुद्धिमत्ता हमारे जीवन को बदल रही है। ",
  "Great job! 🎉🎉 👍🏽 👨‍👩‍👧 🚀✨ ",
  "Order #48213 shipped on 2024-03-17 at 14:05; total $1,299.99 (3 items). ",
  "        \n\t\t\n   ",
];
const docs = [];
let total = 0;
while (total < bytes) {
  let d = "";
  while (Buffer.byteLength(d) < 4096) {
    const r = rand();
    d += r < 0.6 ? prose() : r < 0.8 ? pick(code) : pick(other);
  }
  docs.push(d);
  total += Buffer.byteLength(d);
}
fs.writeFileSync(out, docs.join("\x1e"));
console.log(`${docs.length} documents, ${(total / 1048576).toFixed(2)} MB -> ${out}`);
