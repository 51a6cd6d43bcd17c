// The engine's OpenAI API, end to end: a real `llmgw engine` child process serving a
// generated tiny llama model, driven by the official `openai` client. Greedy decoding
// (temperature 0) makes the random model's output deterministic, so stream and
// non-stream answers can be compared token for token.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { connect } from "node:net";
import OpenAI from "openai";
import { InternalError } from "../../core/errors.ts";
import { silentLogger } from "../../core/log.ts";
import { writeTinyLlamaGguf } from "../../gguf/tiny-model.ts";
import { createEngineServer } from "./engine-server.ts";
import type { GenerateOptions, GenerationResult, TextGenerator } from "./llama-runner.ts";
import { startEngine, waitForReady, type EngineProcess } from "../../../test/support/engine-process.ts";

const KEY = "engine-key-for-tests";
const MODEL_NAME = "tiny-chat";
const CTX_SIZE = 2048;
const PARALLEL = 2;

let dir: string;

let engine: EngineProcess;
let client: OpenAI;

const hello = [{ role: "user" as const, content: "Say hello in one sentence." }];

before(async () => {
  dir = await mkdtemp(join(tmpdir(), "llmgw-engine-api-"));
  // Seed 5: greedy replies to "hello" end on <|im_end|> after a few dozen tokens, the
  // other prompts used here run past every max_tokens below.
  const model = await writeTinyLlamaGguf({ path: join(dir, "tiny.gguf"), seed: 5 });
  engine = await startEngine({
    args: ["--model", model.path, "--key", KEY, "--threads", "1", "--parallel", String(PARALLEL), "--ctx-size", String(CTX_SIZE), "--model-name", MODEL_NAME],
  });
  await waitForReady(engine);
  client = new OpenAI({ baseURL: `${engine.url}/v1`, apiKey: KEY, maxRetries: 0, timeout: 30_000 });
});

after(async () => {
  await engine?.kill();
  await rm(dir, { recursive: true, force: true });
});

test("/v1/models names the served model; a wrong or missing key is refused", async () => {
  const models = await client.models.list();
  assert.deepEqual(
    models.data.map((m) => m.id),
    [MODEL_NAME],
  );

  const wrong = new OpenAI({ baseURL: `${engine.url}/v1`, apiKey: "not-the-key", maxRetries: 0 });
  await assert.rejects(wrong.chat.completions.create({ model: MODEL_NAME, messages: hello, max_tokens: 2 }), OpenAI.AuthenticationError);
  await assert.rejects(wrong.models.list(), OpenAI.AuthenticationError);

  const missing = await fetch(`${engine.url}/v1/models`);
  assert.equal(missing.status, 401);
  const body = (await missing.json()) as { error: { type: string; code: string } };
  assert.equal(body.error.type, "authentication_error");

  // /health needs no key.
  assert.equal((await fetch(`${engine.url}/health`)).status, 200);
});

test("non-stream chat: finish_reason length at max_tokens and usage that adds up", async () => {
  const reply = await client.chat.completions.create({ model: MODEL_NAME, messages: hello, max_tokens: 8, temperature: 0 });
  assert.equal(reply.object, "chat.completion");
  assert.equal(reply.model, MODEL_NAME);
  const choice = reply.choices[0];
  assert.ok(choice);
  assert.equal(choice.message.role, "assistant");
  assert.equal(typeof choice.message.content, "string");
  assert.ok((choice.message.content ?? "").length > 0);
  assert.equal(choice.finish_reason, "length");
  assert.ok(reply.usage);
  assert.equal(reply.usage.completion_tokens, 8);
  assert.ok(reply.usage.prompt_tokens > 5, `the ChatML prompt has more tokens than the message: ${reply.usage.prompt_tokens}`);
  assert.equal(reply.usage.total_tokens, reply.usage.prompt_tokens + reply.usage.completion_tokens);

  // max_completion_tokens is honoured like max_tokens, and a longer history costs more prompt tokens.
  const longer = await client.chat.completions.create({
    model: MODEL_NAME,
    messages: [{ role: "system", content: "You are a tiny test model." }, ...hello],
    max_completion_tokens: 3,
    temperature: 0,
  });
  assert.equal(longer.usage?.completion_tokens, 3);
  assert.equal(longer.choices[0]?.finish_reason, "length");
  assert.ok((longer.usage?.prompt_tokens ?? 0) > reply.usage.prompt_tokens);
});

test("streamed chat: same id and created, role first, content equals the non-stream answer, include_usage last", async () => {
  const plain = await client.chat.completions.create({ model: MODEL_NAME, messages: hello, max_tokens: 12, temperature: 0 });
  const stream = await client.chat.completions.create({
    model: MODEL_NAME,
    messages: hello,
    max_tokens: 12,
    temperature: 0,
    stream: true,
    stream_options: { include_usage: true },
  });
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  assert.ok(chunks.length >= 3);
  const first = chunks[0];
  const last = chunks.at(-1);
  assert.ok(first && last);
  assert.equal(first.choices[0]?.delta.role, "assistant");
  for (const chunk of chunks) {
    assert.equal(chunk.id, first.id);
    assert.equal(chunk.created, first.created);
    assert.equal(chunk.object, "chat.completion.chunk");
  }
  // Every chunk but the last carries usage: null; the last has no choices and the numbers.
  for (const chunk of chunks.slice(0, -1)) assert.equal(chunk.usage, null);
  assert.deepEqual(last.choices, []);
  assert.deepEqual(last.usage, plain.usage);
  const finishes = chunks.flatMap((c) => c.choices.map((choice) => choice.finish_reason)).filter((f) => f !== null);
  assert.deepEqual(finishes, ["length"]);
  const text = chunks.map((c) => c.choices[0]?.delta.content ?? "").join("");
  assert.equal(text, plain.choices[0]?.message.content);

  // Without include_usage no chunk carries a usage field.
  const bare = await client.chat.completions.create({ model: MODEL_NAME, messages: hello, max_tokens: 3, temperature: 0, stream: true });
  for await (const chunk of bare) {
    assert.equal(chunk.usage, undefined);
    assert.equal(chunk.choices.length, 1);
  }
});

test("completions endpoint: non-stream and stream agree, with usage", async () => {
  const plain = await client.completions.create({ model: MODEL_NAME, prompt: "hello world", max_tokens: 10, temperature: 0 });
  assert.equal(plain.object, "text_completion");
  assert.equal(plain.choices[0]?.finish_reason, "length");
  assert.equal(plain.usage?.completion_tokens, 10);
  // BOS plus "▁hello", "▁world".
  assert.equal(plain.usage?.prompt_tokens, 3);
  assert.equal(plain.usage?.total_tokens, 13);

  const stream = await client.completions.create({
    model: MODEL_NAME,
    prompt: "hello world",
    max_tokens: 10,
    temperature: 0,
    stream: true,
    stream_options: { include_usage: true },
  });
  let text = "";
  let finish: string | null = null;
  let lastUsage: unknown;
  const ids = new Set<string>();
  for await (const chunk of stream) {
    ids.add(chunk.id);
    text += chunk.choices[0]?.text ?? "";
    finish = chunk.choices[0]?.finish_reason ?? finish;
    lastUsage = chunk.usage;
  }
  assert.equal(ids.size, 1);
  assert.equal(text, plain.choices[0]?.text);
  assert.equal(finish, "length");
  assert.deepEqual(lastUsage, plain.usage);

  // Token ids are accepted as the prompt, and ids outside the vocabulary refused.
  const byIds = await client.completions.create({ model: MODEL_NAME, prompt: [40, 41], max_tokens: 2, temperature: 0 });
  assert.equal(byIds.usage?.prompt_tokens, 3);
  await assert.rejects(
    client.completions.create({ model: MODEL_NAME, prompt: [40, 1_000_000], max_tokens: 2 }),
    (error: unknown) => error instanceof OpenAI.BadRequestError && error.param === "prompt",
  );
});

test("a reply that reaches the end-of-turn token finishes with stop, before max_tokens", async () => {
  const messages = [{ role: "user" as const, content: "hello" }];
  const reply = await client.chat.completions.create({ model: MODEL_NAME, messages, max_tokens: 500, temperature: 0 });
  assert.equal(reply.choices[0]?.finish_reason, "stop");
  const completionTokens = reply.usage?.completion_tokens ?? 0;
  assert.ok(completionTokens > 1 && completionTokens < 500, `completion_tokens ${completionTokens}`);
  assert.doesNotMatch(reply.choices[0]?.message.content ?? "", /<\|im_end\|>/);

  const stream = await client.chat.completions.create({
    model: MODEL_NAME,
    messages,
    max_tokens: 500,
    temperature: 0,
    stream: true,
    stream_options: { include_usage: true },
  });
  let text = "";
  let finish: string | null = null;
  let streamedUsage: unknown;
  for await (const chunk of stream) {
    text += chunk.choices[0]?.delta.content ?? "";
    finish = chunk.choices[0]?.finish_reason ?? finish;
    streamedUsage = chunk.usage ?? streamedUsage;
  }
  assert.equal(finish, "stop");
  assert.equal(text, reply.choices[0]?.message.content);
  assert.deepEqual(streamedUsage, reply.usage);
});

test("stop sequences end the reply before the stop text with finish_reason stop", async () => {
  const greedy = await client.chat.completions.create({ model: MODEL_NAME, messages: hello, max_tokens: 40, temperature: 0 });
  const full = greedy.choices[0]?.message.content ?? "";
  // A stop string taken from the middle of the deterministic answer: two ASCII letters
  // whose first occurrence is past the start.
  const match = [...full.matchAll(/[a-z]{2}/g)].find((m) => m.index > 0 && full.indexOf(m[0]) === m.index);
  assert.ok(match, `the greedy answer has a usable stop string: ${JSON.stringify(full)}`);
  const stop = match[0];

  const stopped = await client.chat.completions.create({ model: MODEL_NAME, messages: hello, max_tokens: 40, temperature: 0, stop: [stop, "never-there"] });
  assert.equal(stopped.choices[0]?.finish_reason, "stop");
  assert.equal(stopped.choices[0]?.message.content, full.slice(0, match.index));
  // vLLM's field: which stop sequence ended the reply (the Anthropic translation needs it).
  assert.equal((stopped.choices[0] as unknown as { stop_reason?: string }).stop_reason, stop);
  assert.equal((greedy.choices[0] as unknown as { stop_reason?: string }).stop_reason, undefined, "no stop sequence, no stop_reason");

  const streamed = await client.chat.completions.create({ model: MODEL_NAME, messages: hello, max_tokens: 40, temperature: 0, stop, stream: true });
  let text = "";
  let finish: string | null = null;
  let stopReason: string | undefined;
  for await (const chunk of streamed) {
    text += chunk.choices[0]?.delta.content ?? "";
    finish = chunk.choices[0]?.finish_reason ?? finish;
    stopReason ??= (chunk.choices[0] as unknown as { stop_reason?: string } | undefined)?.stop_reason;
  }
  assert.equal(finish, "stop");
  assert.equal(stopReason, stop);
  assert.equal(text, full.slice(0, match.index), "the stop text never reaches the stream");
});

test("seed makes sampling repeatable; temperature 0 is deterministic", async () => {
  const ask = (options: { temperature: number; seed?: number; top_p?: number }) =>
    client.chat.completions.create({ model: MODEL_NAME, messages: hello, max_tokens: 24, ...options }).then((r) => r.choices[0]?.message.content);
  const seeded = await ask({ temperature: 1, seed: 1234 });
  assert.equal(await ask({ temperature: 1, seed: 1234 }), seeded);
  const otherSeeds = await Promise.all([ask({ temperature: 1, seed: 1 }), ask({ temperature: 1, seed: 2 })]);
  assert.ok(
    otherSeeds.some((text) => text !== seeded),
    "another seed samples something else",
  );
  assert.equal(await ask({ temperature: 0 }), await ask({ temperature: 0 }));
  assert.equal(await ask({ temperature: 0.7, seed: 99, top_p: 0.9 }), await ask({ temperature: 0.7, seed: 99, top_p: 0.9 }));
});

test(`${PARALLEL} concurrent streams are generated side by side and both complete`, async () => {
  const run = async (content: string) => {
    const stream = await client.chat.completions.create({
      model: MODEL_NAME,
      messages: [{ role: "user", content }],
      max_tokens: 200,
      temperature: 0,
      stream: true,
    });
    let firstContentAt = 0;
    let tokens = "";
    let finish: string | null = null;
    for await (const chunk of stream) {
      const delta = chunk.choices[0]?.delta.content ?? "";
      if (delta !== "" && firstContentAt === 0) firstContentAt = performance.now();
      tokens += delta;
      finish = chunk.choices[0]?.finish_reason ?? finish;
    }
    return { firstContentAt, doneAt: performance.now(), tokens, finish };
  };
  const [a, b] = await Promise.all([run("hi"), run("Say hello in one sentence.")]);
  for (const r of [a, b]) {
    assert.equal(r.finish, "length");
    assert.ok(r.tokens.length > 0);
  }
  // Interleaved, not one after the other: each started streaming before the other ended.
  assert.ok(a.firstContentAt < b.doneAt && b.firstContentAt < a.doneAt, "the two generations overlapped");
});

test("bad requests are 400s naming the field; unknown routes 404; over-long prompts 400", async () => {
  await assert.rejects(
    client.chat.completions.create({ model: MODEL_NAME, messages: [], max_tokens: 2 }),
    (error: unknown) => error instanceof OpenAI.BadRequestError && error.param === "messages",
  );
  await assert.rejects(
    client.chat.completions.create({ model: MODEL_NAME, messages: hello, max_tokens: 2, temperature: 5 }),
    (error: unknown) => error instanceof OpenAI.BadRequestError && error.param === "temperature",
  );
  await assert.rejects(
    client.chat.completions.create({ model: MODEL_NAME, messages: hello, n: 2 }),
    (error: unknown) => error instanceof OpenAI.BadRequestError && error.param === "n",
  );

  const malformed = await fetch(`${engine.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${KEY}`, "content-type": "application/json" },
    body: '{"messages": [',
  });
  assert.equal(malformed.status, 400);
  const malformedBody = (await malformed.json()) as { error: { code: string; type: string; message: string } };
  assert.equal(malformedBody.error.code, "invalid_json");
  assert.equal(malformedBody.error.type, "invalid_request_error");

  const unknown = await fetch(`${engine.url}/v1/rerank`, { method: "POST", headers: { authorization: `Bearer ${KEY}` }, body: "{}" });
  assert.equal(unknown.status, 404);
  assert.equal(((await unknown.json()) as { error: { type: string } }).error.type, "not_found_error");

  // --ctx-size is shared by the --parallel sequences, so one request gets CTX_SIZE / PARALLEL.
  const long = "hello ".repeat(CTX_SIZE / PARALLEL + 10);
  await assert.rejects(
    client.chat.completions.create({ model: MODEL_NAME, messages: [{ role: "user", content: long }], max_tokens: 2 }),
    (error: unknown) => error instanceof OpenAI.BadRequestError && error.code === "context_length_exceeded",
  );
  const fits = "hello ".repeat(CTX_SIZE / PARALLEL - 100);
  const ok = await client.chat.completions.create({ model: MODEL_NAME, messages: [{ role: "user", content: fits }], max_tokens: 2, temperature: 0 });
  assert.ok((ok.usage?.prompt_tokens ?? 0) > CTX_SIZE / PARALLEL - 100);
});

// In-process: the engine's HTTP layer over a stand-in generator (llama.cpp cannot be
// made to fail on demand), a real node:http server and real clients.

/** A stand-in for the llama runner that streams `chunks` and then fails like a llama.cpp error would. */
function failingGenerator(chunks: string[]): TextGenerator {
  const run = async (options: GenerateOptions): Promise<GenerationResult> => {
    options.onStart?.();
    for (const chunk of chunks) options.onText?.(chunk);
    throw new InternalError("llama.cpp failed while generating; the engine log has the details.", { code: "generation_failed" });
  };
  return { chat: (_messages, options) => run(options), complete: (_prompt, options) => run(options), contextPerRequest: 512, dispose: async () => undefined };
}

async function inProcessEngine(generator: TextGenerator | null, options: { bodyTimeoutMs?: number; maxBodyBytes?: number } = {}) {
  const server = createEngineServer({ key: KEY, modelName: MODEL_NAME, logger: silentLogger(), ...options });
  if (generator) server.setGenerator(generator);
  const address = await server.listen("127.0.0.1", 0);
  return { server, url: `http://127.0.0.1:${address.port}`, close: () => server.shutdown(1000) };
}

/** Sends raw bytes on a new socket and collects everything until the server closes it. */
function rawExchange(port: number, request: string): Promise<string> {
  return new Promise((resolve, reject) => {
    let received = "";
    const socket = connect(port, "127.0.0.1", () => socket.write(request));
    socket.setEncoding("utf8");
    socket.on("data", (text: string) => {
      received += text;
    });
    socket.on("error", reject);
    // Resolves only when the server closes the connection: a hang fails the test's deadline.
    socket.on("close", () => resolve(received));
  });
}

test("a stream that fails after its first byte ends with the one failure event and closes, never [DONE]", { timeout: 30_000 }, async () => {
  const engine = await inProcessEngine(failingGenerator(["Hel", "lo"]));
  // No keep-alive timeout: an idle connection stays open for good, so the exchange below
  // ends only if the engine closes the connection because the stream failed.
  engine.server.server.keepAliveTimeout = 0;
  try {
    const body = JSON.stringify({ model: MODEL_NAME, messages: hello, stream: true });
    const port = Number(new URL(engine.url).port);
    // Keep-alive asked for, so only the failure makes the server close the connection.
    const raw = await rawExchange(
      port,
      `POST /v1/chat/completions HTTP/1.1\r\nHost: engine\r\nConnection: keep-alive\r\nAuthorization: Bearer ${KEY}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
    );
    assert.match(raw, /^HTTP\/1\.1 200 OK/);
    assert.ok(!raw.includes("[DONE]"), raw);
    const events = [...raw.matchAll(/data: (.*)\n\n/g)].map(
      (match) => JSON.parse(match[1] ?? "null") as { choices?: Array<{ delta: { content?: string } }>; error?: unknown },
    );
    assert.deepEqual(
      events.slice(1, 3).map((event) => event.choices?.[0]?.delta.content),
      ["Hel", "lo"],
    );
    assert.deepEqual(events.at(-1), {
      error: { message: "llama.cpp failed while generating; the engine log has the details.", type: "server_error", param: null, code: "generation_failed" },
    });
    assert.equal(events.length, 4, "role chunk, two content chunks, the failure event");

    // The official client raises an APIError for it: not a connection error, not a clean end.
    const client = new OpenAI({ baseURL: `${engine.url}/v1`, apiKey: KEY, maxRetries: 0 });
    const stream = await client.chat.completions.create({ model: MODEL_NAME, messages: hello, stream: true });
    const seen: string[] = [];
    await assert.rejects(
      (async () => {
        for await (const chunk of stream) seen.push(chunk.choices[0]?.delta.content ?? "");
      })(),
      (error: unknown) =>
        error instanceof OpenAI.APIError && !(error instanceof OpenAI.APIConnectionError) && /llama\.cpp failed while generating/.test(error.message),
    );
    assert.equal(seen.join(""), "Hello");
  } finally {
    await engine.close();
  }
});

test("a failure before the first byte is a plain HTTP error with its status", async () => {
  const engine = await inProcessEngine(failingGenerator([]));
  try {
    // Non-stream: nothing is sent until the answer is complete, so the error keeps its status.
    const response = await fetch(`${engine.url}/v1/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${KEY}`, "content-type": "application/json" },
      body: JSON.stringify({ model: MODEL_NAME, prompt: "hi" }),
    });
    assert.equal(response.status, 500);
    assert.deepEqual(((await response.json()) as { error: { code: string } }).error.code, "generation_failed");
  } finally {
    await engine.close();
  }
  // No model yet: 503 with Retry-After, like llama-server while loading.
  const loading = await inProcessEngine(null);
  try {
    const response = await fetch(`${loading.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${KEY}`, "content-type": "application/json" },
      body: JSON.stringify({ model: MODEL_NAME, messages: hello }),
    });
    assert.equal(response.status, 503);
    assert.equal(response.headers.get("retry-after"), "1");
  } finally {
    await loading.close();
  }
});

test("request bodies: a stalled one gets 408 and a closed connection, an oversized one 413, a broken one 400", async () => {
  const engine = await inProcessEngine(failingGenerator([]), { bodyTimeoutMs: 300, maxBodyBytes: 1024 });
  const port = Number(new URL(engine.url).port);
  try {
    // Half a body, then silence: the engine answers 408 and closes the socket itself.
    const stalled = await rawExchange(
      port,
      `POST /v1/chat/completions HTTP/1.1\r\nHost: engine\r\nAuthorization: Bearer ${KEY}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"messages": [`,
    );
    assert.match(stalled, /^HTTP\/1\.1 408 /);
    assert.match(stalled, /"code":"body_timeout"/);

    const big = await fetch(`${engine.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${KEY}`, "content-type": "application/json" },
      body: JSON.stringify({ messages: [{ role: "user", content: "x".repeat(2048) }] }),
    });
    assert.equal(big.status, 413);
    assert.equal(((await big.json()) as { error: { code: string } }).error.code, "request_too_large");

    const deep = await fetch(`${engine.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${KEY}`, "content-type": "application/json" },
      body: "[".repeat(500) + "]".repeat(500),
    });
    assert.equal(deep.status, 400);
    assert.equal(((await deep.json()) as { error: { code: string } }).error.code, "json_too_deep");
  } finally {
    await engine.close();
  }
});
