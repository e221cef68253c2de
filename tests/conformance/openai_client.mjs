// Conformance: the official `openai` npm client, as a real application would use it, against
// kvgate (which forwards to kvgate-sim). Usage: node openai_client.mjs http://127.0.0.1:PORT
// Exits 0 when every check passed; prints what failed otherwise.
import OpenAI from "openai";

const base = process.argv[2];
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: "unused", maxRetries: 0, timeout: 20000 });
let failures = 0;
function check(cond, what, detail) {
  if (!cond) {
    failures++;
    console.error(`FAIL ${what}${detail === undefined ? "" : ": " + JSON.stringify(detail)}`);
  } else {
    console.log(`ok   ${what}`);
  }
}

const messages = [
  { role: "system", content: "You are a helpful assistant." },
  { role: "user", content: "Name three colors." },
];

// Chat, non-streamed.
const chat = await client.chat.completions.create({ model: "kvgate-sim", messages, max_tokens: 12 });
check(chat.object === "chat.completion", "chat: object", chat.object);
check(chat.choices.length === 1, "chat: one choice", chat.choices.length);
check(typeof chat.choices[0].message.content === "string" && chat.choices[0].message.content.length > 0,
      "chat: content", chat.choices[0].message);
check(chat.choices[0].message.role === "assistant", "chat: role");
check(chat.choices[0].finish_reason === "length", "chat: finish_reason", chat.choices[0].finish_reason);
check(chat.usage.completion_tokens === 12, "chat: usage.completion_tokens", chat.usage);
check(chat.usage.prompt_tokens > 0, "chat: usage.prompt_tokens", chat.usage);

// Chat, streamed: deltas concatenate to the same text as the non-streamed answer.
const stream = await client.chat.completions.create({
  model: "kvgate-sim", messages, max_tokens: 12, stream: true, stream_options: { include_usage: true },
});
let text = "", finish = null, usage = null, chunks = 0;
for await (const chunk of stream) {
  chunks++;
  if (chunk.usage) usage = chunk.usage;
  for (const c of chunk.choices) {
    if (c.delta?.content) text += c.delta.content;
    if (c.finish_reason) finish = c.finish_reason;
  }
}
check(chunks >= 3, "chat stream: several chunks", chunks);
check(text === chat.choices[0].message.content, "chat stream: same text as non-stream", { text, expected: chat.choices[0].message.content });
check(finish === "length", "chat stream: finish_reason", finish);
check(usage && usage.completion_tokens === 12, "chat stream: usage chunk", usage);

// Completions, non-streamed and streamed.
const comp = await client.completions.create({ model: "kvgate-sim", prompt: "Once upon a time", max_tokens: 8 });
check(comp.object === "text_completion", "completions: object", comp.object);
check(comp.choices[0].text.length > 0, "completions: text", comp.choices[0]);
check(comp.usage.completion_tokens === 8, "completions: usage", comp.usage);
const cstream = await client.completions.create({
  model: "kvgate-sim", prompt: "Once upon a time", max_tokens: 8, stream: true,
});
let ctext = "";
for await (const chunk of cstream) for (const c of chunk.choices) ctext += c.text ?? "";
check(ctext === comp.choices[0].text, "completions stream: same text", { ctext, expected: comp.choices[0].text });

// Models, and an error the client surfaces as an exception with the gateway's status.
const models = await client.models.list();
check(models.data.some((m) => m.id === "kvgate-sim"), "models: served model listed", models.data);
try {
  await client.chat.completions.create({ model: "kvgate-sim", messages: "not a list", max_tokens: 4 });
  check(false, "bad request: raises");
} catch (e) {
  check(e.status === 400, "bad request: 400 surfaced by the client", e.status);
}

console.log(failures === 0 ? "all openai client checks passed" : `${failures} check(s) failed`);
process.exit(failures === 0 ? 0 : 1);
