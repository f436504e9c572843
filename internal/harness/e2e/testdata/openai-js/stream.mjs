// Streams one chat completion with the official OpenAI JS client from
// BASE_URL (the collector's proxy, ending in /v1) and prints one JSON line:
// {"outcome":"completed","text":…} when the stream ended normally, or
// {"outcome":"threw","error":…,"type":…,"text":…} when the client raised,
// text being the content received before. The Go test reads that line.
// FREEZE=1 asks the test's engine to freeze mid-stream (X-Test-Freeze).
import OpenAI from "openai";

const client = new OpenAI({
  baseURL: process.env.BASE_URL,
  apiKey: "test",
  maxRetries: 0,
  defaultHeaders: process.env.FREEZE ? { "X-Test-Freeze": "1" } : {},
});
let text = "";
try {
  const stream = await client.chat.completions.create({
    model: "meta-llama/Llama-3.1-8B-Instruct",
    messages: [{ role: "user", content: "What is the capital of France?" }],
    stream: true,
  });
  for await (const chunk of stream) {
    text += chunk.choices[0]?.delta?.content ?? "";
  }
  console.log(JSON.stringify({ outcome: "completed", text }));
} catch (e) {
  console.log(JSON.stringify({ outcome: "threw", error: e.constructor.name, type: e.type ?? e.error?.type ?? null, text }));
}
