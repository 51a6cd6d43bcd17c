// The engine's OpenAI API, end to end: a real `llmgw engine` child process serving a
// generated tiny llama model, driven by the official `openai` client. Greedy decoding
// (temperature 0) makes the random model's output deterministic, so stream and
// non-stream answers can be compared token for token.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createServer, type IncomingMessage } from "node:http";
import { connect, type AddressInfo } from "node:net";
import OpenAI from "openai";
import { LlmgwError } from "../../core/errors.ts";
import { writeTinyLlamaGguf } from "../../gguf/tiny-model.ts";
import { readJsonBody } from "./engine-server.ts";
import { startEngine, waitForReady, type EngineProcess } from "../../../test/support/engine-process.ts";

const KEY = "engine-key-for-tests";
const MODEL_NAME = "tiny-chat";
const CTX_SIZE = 2048;
const PARALLEL = 2;

let dir: string;

const withDeadline = <T>(promise: Promise<T>, ms: number, what: string): Promise<T> =>
  Promise.race([promise, new Promise<T>((_, reject) => setTimeout(() => reject(new Error(`${what} did not happen within ${ms} ms`)), ms).unref())]);
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

  const stream = await client.chat.completions.create({ model: MODEL_NAME, messages, max_tokens: 500, temperature: 0, stream: true, stream_options: { include_usage: true } });
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

  const streamed = await client.chat.completions.create({ model: MODEL_NAME, messages: hello, max_tokens: 40, temperature: 0, stop, stream: true });
  let text = "";
  let finish: string | null = null;
  for await (const chunk of streamed) {
    text += chunk.choices[0]?.delta.content ?? "";
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  assert.equal(finish, "stop");
  assert.equal(text, full.slice(0, match.index), "the stop text never reaches the stream");
});

test("seed makes sampling repeatable; temperature 0 is deterministic", async () => {
  const ask = (options: { temperature: number; seed?: number; top_p?: number }) =>
    client.chat.completions.create({ model: MODEL_NAME, messages: hello, max_tokens: 24, ...options }).then((r) => r.choices[0]?.message.content);
  const seeded = await ask({ temperature: 1, seed: 1234 });
  assert.equal(await ask({ temperature: 1, seed: 1234 }), seeded);
  const otherSeeds = await Promise.all([ask({ temperature: 1, seed: 1 }), ask({ temperature: 1, seed: 2 })]);
  assert.ok(otherSeeds.some((text) => text !== seeded), "another seed samples something else");
  assert.equal(await ask({ temperature: 0 }), await ask({ temperature: 0 }));
  assert.equal(await ask({ temperature: 0.7, seed: 99, top_p: 0.9 }), await ask({ temperature: 0.7, seed: 99, top_p: 0.9 }));
});

test(`${PARALLEL} concurrent streams are generated side by side and both complete`, async () => {
  const run = async (content: string) => {
    const stream = await client.chat.completions.create({ model: MODEL_NAME, messages: [{ role: "user", content }], max_tokens: 200, temperature: 0, stream: true });
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

  const unknown = await fetch(`${engine.url}/v1/embeddings`, { method: "POST", headers: { authorization: `Bearer ${KEY}` }, body: "{}" });
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

test("reading a request body always settles: a client gone before or while it is read is client_closed, not a bad request", async () => {
  // In-process: a plain node:http server whose handler reads the body at a chosen moment,
  // driven by a raw socket that sends part of a body and then disappears.
  const outcomes = new Map<string, Promise<{ value?: unknown; code?: string }>>();
  const settle = (req: IncomingMessage): Promise<{ value?: unknown; code?: string }> =>
    readJsonBody(req, 64).then(
      (value) => ({ value }),
      (error: unknown) => ({ code: error instanceof LlmgwError ? error.code : `not an LlmgwError: ${String(error)}` }),
    );
  const server = createServer((req, res) => {
    const path = req.url ?? "";
    let reading: Promise<{ value?: unknown; code?: string }>;
    if (path === "/destroyed-first") {
      // The request is gone before the handler reads: no 'end' or 'error' will ever come.
      req.destroy();
      reading = settle(req);
    } else if (path === "/after-socket-close") {
      reading = new Promise((resolve) => req.socket.once("close", () => setTimeout(() => resolve(settle(req)), 20)));
    } else {
      reading = settle(req);
    }
    outcomes.set(path, reading);
    void reading.then(() => {
      if (!res.destroyed) res.end();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  const send = (path: string, body: string, contentLength: number, hangUp: boolean): Promise<void> =>
    new Promise((resolve) => {
      const socket = connect(port, "127.0.0.1", () => {
        socket.write(`POST ${path} HTTP/1.1\r\nHost: engine\r\nContent-Type: application/json\r\nContent-Length: ${contentLength}\r\n\r\n${body}`);
        if (hangUp) setTimeout(() => socket.destroy(), 50);
      });
      socket.on("data", () => socket.destroy());
      socket.on("error", () => undefined);
      socket.on("close", () => resolve());
    });
  const outcome = async (path: string) => {
    await new Promise<void>((resolve) => {
      const check = () => (outcomes.has(path) ? resolve() : setTimeout(check, 5));
      check();
    });
    return withDeadline(outcomes.get(path) as Promise<{ value?: unknown; code?: string }>, 5_000, `the body read of ${path} settling`);
  };
  try {
    await send("/whole", '{"a":1}', 7, false);
    assert.deepEqual(await outcome("/whole"), { value: { a: 1 } });
    await send("/mid-body", '{"a":', 40, true);
    assert.deepEqual(await outcome("/mid-body"), { code: "client_closed" });
    await send("/after-socket-close", '{"a":', 40, true);
    assert.deepEqual(await outcome("/after-socket-close"), { code: "client_closed" });
    await send("/destroyed-first", '{"a":1}', 7, false);
    assert.deepEqual(await outcome("/destroyed-first"), { code: "client_closed" });
    await send("/too-large", `"${"x".repeat(100)}"`, 102, false);
    assert.deepEqual(await outcome("/too-large"), { code: "payload_too_large" });
  } finally {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  }
});
