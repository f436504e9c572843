// Streams one chat completion with the official OpenAI JS client from
// BASE_URL (the collector's proxy, ending in /v1) and prints one JSON line:
// {"outcome":"completed","text":…,"ids":…} when the stream ended normally,
// or {"outcome":"threw","error":…,"type":…,"text":…,"ids":…} when the
// client raised, text being the content received before and ids the
// number of distinct chunk ids seen. The Go test reads that line.
// FREEZE=1 asks the test's engine to freeze mid-stream (X-Test-Freeze).
// REQUEST, a JSON object, replaces members of the request; MARK_AFTER=n
// prints {"streaming":true} once n content chunks came, so that the test
// can freeze a real engine mid-stream.
import OpenAI from "openai";

const client = new OpenAI({
  baseURL: process.env.BASE_URL,
  apiKey: "test",
  maxRetries: 0,
  defaultHeaders: process.env.FREEZE ? { "X-Test-Freeze": "1" } : {},
});
const markAfter = Number(process.env.MARK_AFTER ?? 0);
let text = "";
const ids = new Set();
let contentChunks = 0;
try {
  const stream = await client.chat.completions.create({
    model: "meta-llama/Llama-3.1-8B-Instruct",
    messages: [{ role: "user", content: "What is the capital of France?" }],
    ...JSON.parse(process.env.REQUEST ?? "{}"),
    stream: true,
  });
  for await (const chunk of stream) {
    ids.add(chunk.id);
    const content = chunk.choices[0]?.delta?.content ?? "";
    text += content;
    if (content !== "" && ++contentChunks === markAfter) {
      console.log(JSON.stringify({ streaming: true }));
    }
  }
  console.log(JSON.stringify({ outcome: "completed", text, ids: ids.size }));
} catch (e) {
  console.log(JSON.stringify({ outcome: "threw", error: e.constructor.name, type: e.type ?? e.error?.type ?? null, text, ids: ids.size }));
}
