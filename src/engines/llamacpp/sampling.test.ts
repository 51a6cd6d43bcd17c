// Logprobs and sampling parameters of the bundled engine, over HTTP with the official
// openai client, on generated tiny models in-process. The "scripted" model replies with a
// known token sequence whose multi-byte characters are spread over byte tokens, so the
// logprob entries can be checked token by token; the "endless" random model never ends a
// reply, so sampling parameters can be compared over a fixed number of tokens.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { AddressInfo } from "node:net";
import OpenAI from "openai";
import { readGgufFileInfo, type Token } from "node-llama-cpp";
import { silentLogger } from "../../core/log.ts";
import { writeTinyLlamaGguf } from "../../gguf/tiny-model.ts";
import { createEngineServer, type EngineServer } from "./engine-server.ts";
import { LlamaRunner } from "./llama-runner.ts";
import { trimDistribution } from "./sampled-distributions.ts";
import { keepForLogprobs, mostLikely } from "./token-logprobs.ts";
import type { TokenDistribution } from "./decode-lockstep.ts";

// " say", "—" (3 bytes), " hi", "é" (2 bytes), "!", "😁" (4 bytes): one token each.
const SCRIPT = ["▁say", "<0xE2>", "<0x80>", "<0x94>", "▁hi", "<0xC3>", "<0xA9>", "!", "<0xF0>", "<0x9F>", "<0x98>", "<0x81>"];
const SCRIPT_TEXT = "say— hié!😁";

interface Served {
  runner: LlamaRunner;
  server: EngineServer;
  client: OpenAI;
  url: string;
  /** Vocabulary piece → token id. */
  ids: Map<string, number>;
}

let dir: string;
let scripted: Served;
let endless: Served;
let short: Served;
let imEnd: number;

async function serve(modelPath: string, name: string): Promise<Served> {
  const runner = await LlamaRunner.load({ modelPath, contextSize: 1024, parallel: 1, threads: 1, logger: silentLogger() });
  const server = createEngineServer({ key: "k", modelName: name, logger: silentLogger() });
  server.setGenerator(runner);
  const address: AddressInfo = await server.listen("127.0.0.1", 0);
  const url = `http://127.0.0.1:${address.port}/v1`;
  const info = await readGgufFileInfo(modelPath);
  const pieces = (info.metadata.tokenizer?.ggml?.tokens ?? []) as string[];
  return { runner, server, url, client: new OpenAI({ baseURL: url, apiKey: "k", maxRetries: 0 }), ids: new Map(pieces.map((piece, id) => [piece, id])) };
}

before(async () => {
  dir = await mkdtemp(join(tmpdir(), "llmgw-sampling-"));
  const script = await writeTinyLlamaGguf({ path: join(dir, "scripted.gguf"), embeddingLength: 32, layers: 1, replyScript: SCRIPT });
  scripted = await serve(script.path, "scripted");
  const long = await writeTinyLlamaGguf({ path: join(dir, "endless.gguf"), seed: 5, endless: true });
  endless = await serve(long.path, "endless");
  // "sayé" and the end of the turn.
  const ends = await writeTinyLlamaGguf({
    path: join(dir, "short.gguf"),
    embeddingLength: 32,
    layers: 1,
    replyScript: ["▁say", "<0xC3>", "<0xA9>", "<|im_end|>"],
  });
  imEnd = ends.tokens.imEnd;
  short = await serve(ends.path, "short");
});

after(async () => {
  for (const served of [scripted, endless, short]) {
    await served?.server.shutdown(1000);
    await served?.runner.dispose();
  }
  await rm(dir, { recursive: true, force: true });
});

const hi = [{ role: "user" as const, content: "hi" }];

interface Entry {
  token: string;
  logprob: number;
  bytes: number[] | null;
  top_logprobs: Array<{ token: string; logprob: number; bytes: number[] | null }>;
}

function textOf(entries: readonly Entry[]): string {
  return Buffer.from(entries.flatMap((entry) => entry.bytes ?? [])).toString("utf8");
}

/** Every entry's shape: logprobs <= 0, bytes that spell the token, alternatives sorted. */
function checkEntries(entries: readonly Entry[], top: number, where: string): void {
  for (const entry of entries) {
    assert.ok(entry.logprob <= 0, `${where}: logprob ${entry.logprob} of ${JSON.stringify(entry.token)}`);
    assert.ok(entry.bytes, `${where}: bytes`);
    const decoded = Buffer.from(entry.bytes).toString("utf8");
    if (entry.token.startsWith("bytes:")) {
      assert.equal(
        entry.token,
        `bytes:${entry.bytes.map((b) => `\\x${b.toString(16).padStart(2, "0")}`).join("")}`,
        `${where}: a partial character is named by its bytes`,
      );
    } else assert.equal(decoded, entry.token, `${where}: bytes decode to the token`);
    assert.equal(entry.top_logprobs.length, top, `${where}: ${top} alternatives for ${JSON.stringify(entry.token)}`);
    for (let i = 1; i < entry.top_logprobs.length; i += 1) {
      assert.ok((entry.top_logprobs[i - 1] as Entry).logprob >= (entry.top_logprobs[i] as Entry).logprob, `${where}: alternatives sorted, most likely first`);
    }
    for (const alternative of entry.top_logprobs) assert.ok(alternative.logprob <= 0);
  }
}

test("chat logprobs: one entry per token, bytes that spell the reply, top_logprobs sorted and as many as asked; the stream carries the same per chunk", async () => {
  const request = { model: "scripted", messages: hi, max_tokens: 12, temperature: 0, logprobs: true, top_logprobs: 5 } as const;
  const reply = await scripted.client.chat.completions.create(request);
  const choice = reply.choices[0];
  assert.equal(choice?.message.content, SCRIPT_TEXT);
  const content = choice?.logprobs?.content as Entry[] | undefined;
  assert.ok(content);
  assert.equal(choice?.logprobs?.refusal, null);
  // Twelve tokens, twelve entries; the byte tokens of "—", "é" and "😁" are named by their bytes.
  assert.equal(content.length, SCRIPT.length);
  assert.deepEqual(
    content.slice(0, 2).map((entry) => entry.token),
    ["say", "bytes:\\xe2"],
  );
  assert.equal(textOf(content), SCRIPT_TEXT);
  checkEntries(content, 5, "non-stream");
  // Greedy decoding takes the most likely token: it heads its own alternatives.
  for (const entry of content) {
    assert.equal(entry.top_logprobs[0]?.token, entry.token);
    assert.equal(entry.top_logprobs[0]?.logprob, entry.logprob);
  }

  const stream = await scripted.client.chat.completions.create({ ...request, stream: true });
  const streamed: Entry[] = [];
  for await (const chunk of stream) {
    const delta = chunk.choices[0]?.delta.content ?? "";
    const entries = (chunk.choices[0]?.logprobs?.content ?? []) as Entry[];
    // Each chunk carries the logprobs of exactly the text it carries.
    assert.equal(textOf(entries), delta, `chunk ${JSON.stringify(delta)}`);
    streamed.push(...entries);
  }
  assert.deepEqual(streamed, content);

  // Without logprobs, none.
  const plain = await scripted.client.chat.completions.create({ model: "scripted", messages: hi, max_tokens: 3, temperature: 0 });
  assert.equal(plain.choices[0]?.logprobs, null);
});

test("chat logprobs with a stop sequence: entries for the tokens wholly inside the reply; a token cut by the stop has none", async () => {
  const reply = await scripted.client.chat.completions.create({ model: "scripted", messages: hi, max_tokens: 12, temperature: 0, stop: "i", logprobs: true });
  assert.equal(reply.choices[0]?.message.content, "say— h");
  const content = reply.choices[0]?.logprobs?.content as Entry[];
  assert.equal(textOf(content), "say—");
  checkEntries(content, 0, "stop");
});

test("chat logprobs while sampling: finite logprobs of the distribution sampled from, at most top_logprobs alternatives", async () => {
  const reply = await endless.client.chat.completions.create({
    model: "endless",
    messages: hi,
    max_tokens: 6,
    temperature: 0.8,
    seed: 3,
    logprobs: true,
    top_logprobs: 3,
  });
  const content = reply.choices[0]?.logprobs?.content as Entry[];
  assert.equal(content.length, 6, "one entry per token of the endless reply");
  assert.equal(textOf(content), reply.choices[0]?.message.content);
  for (const entry of content) {
    assert.ok(entry.logprob <= 0 && entry.logprob > -9999, `the sampled token had a probability: ${entry.logprob}`);
    assert.ok(entry.top_logprobs.length >= 1 && entry.top_logprobs.length <= 3);
  }
});

test("without top_logprobs, each token's logprob is the same figure as with alternatives (llama.cpp's confidence, not the whole distribution)", async () => {
  for (const temperature of [0, 0.8]) {
    const request = { model: "endless", messages: hi, max_tokens: 8, temperature, seed: 3, logprobs: true } as const;
    const alone = (await endless.client.chat.completions.create(request)).choices[0]?.logprobs?.content as Entry[];
    const withTop = (await endless.client.chat.completions.create({ ...request, top_logprobs: 2 })).choices[0]?.logprobs?.content as Entry[];
    assert.equal(alone.length, 8);
    assert.deepEqual(
      alone.map((entry) => entry.token),
      withTop.map((entry) => entry.token),
    );
    for (const [i, entry] of alone.entries()) {
      assert.deepEqual(entry.top_logprobs, []);
      assert.ok(
        entry.logprob > -9999 && Math.abs(entry.logprob - (withTop[i] as Entry).logprob) < 1e-5,
        `temperature ${temperature}, token ${i}: ${entry.logprob} vs ${(withTop[i] as Entry).logprob}`,
      );
    }
  }
});

test("completions logprobs: tokens, token_logprobs, top_logprobs maps with the sampled token, text_offset; streamed too", async () => {
  const request = { model: "scripted", prompt: "hi", max_tokens: 8, temperature: 0, logprobs: 2 } as const;
  const reply = await scripted.client.completions.create(request);
  const choice = reply.choices[0];
  const text = choice?.text ?? "";
  assert.equal(text, "say— hié!");
  const logprobs = choice?.logprobs;
  assert.ok(logprobs?.tokens && logprobs.token_logprobs && logprobs.top_logprobs && logprobs.text_offset);
  assert.deepEqual(logprobs.tokens, ["say", "bytes:\\xe2", "bytes:\\x80", "bytes:\\x94", " hi", "bytes:\\xc3", "bytes:\\xa9", "!"]);
  assert.deepEqual(logprobs.text_offset, [0, 3, 3, 3, 4, 7, 7, 8]);
  logprobs.tokens.forEach((token, index) => {
    const top = logprobs.top_logprobs?.[index] ?? {};
    assert.ok(Object.keys(top).length <= 3, "at most logprobs + 1 tokens");
    assert.equal(top[token], logprobs.token_logprobs?.[index], "the sampled token is among them");
    assert.ok((logprobs.token_logprobs?.[index] ?? 1) <= 0);
    if (!token.startsWith("bytes:")) assert.ok(text.startsWith(token, logprobs.text_offset?.[index]), `${token} at its offset`);
  });

  const stream = await scripted.client.completions.create({ ...request, stream: true });
  const tokens: string[] = [];
  const offsets: number[] = [];
  for await (const chunk of stream) {
    tokens.push(...(chunk.choices[0]?.logprobs?.tokens ?? []));
    offsets.push(...(chunk.choices[0]?.logprobs?.text_offset ?? []));
  }
  assert.deepEqual(tokens, logprobs.tokens);
  assert.deepEqual(offsets, logprobs.text_offset);
});

test("logit_bias: -100 bans a token (also the end of the turn), +100 forces one", async () => {
  const say = scripted.ids.get("▁say") as number;
  const banned = await scripted.client.chat.completions.create({ model: "scripted", messages: hi, max_tokens: 6, temperature: 0, logit_bias: { [say]: -100 } });
  assert.ok(!(banned.choices[0]?.message.content ?? "").includes("say"), JSON.stringify(banned.choices[0]?.message.content));

  // node-llama-cpp's TokenBias would drop a bias on an end-of-generation token.
  const ended = await short.client.chat.completions.create({ model: "short", messages: hi, max_tokens: 10, temperature: 0 });
  assert.equal(ended.choices[0]?.finish_reason, "stop");
  const onAndOn = await short.client.chat.completions.create({ model: "short", messages: hi, max_tokens: 10, temperature: 0, logit_bias: { [imEnd]: -100 } });
  assert.equal(onAndOn.choices[0]?.finish_reason, "length");
  assert.equal(onAndOn.usage?.completion_tokens, 10);

  const hiToken = endless.ids.get("▁hi") as number;
  const forced = await endless.client.completions.create({
    model: "endless",
    prompt: "Once",
    max_tokens: 6,
    temperature: 1,
    seed: 9,
    logprobs: 0,
    logit_bias: { [hiToken]: 100 },
  });
  // The reply's first token loses its leading space, as the text does.
  assert.equal(forced.choices[0]?.text, "hi hi hi hi hi hi");
  assert.deepEqual(forced.choices[0]?.logprobs?.tokens, ["hi", " hi", " hi", " hi", " hi", " hi"]);

  const outside = await fetch(`${endless.url}/chat/completions`, {
    method: "POST",
    headers: { authorization: "Bearer k", "content-type": "application/json" },
    body: JSON.stringify({ messages: hi, logit_bias: { "999999": 5 } }),
  });
  assert.equal(outside.status, 400);
  assert.equal(((await outside.json()) as { error: { param: string } }).error.param, "logit_bias");
});

async function endlessText(body: Record<string, unknown>): Promise<string> {
  const reply = await endless.client.completions.create({
    model: "endless",
    prompt: "Once upon a time",
    max_tokens: 24,
    ...body,
  } as OpenAI.CompletionCreateParamsNonStreaming);
  return reply.choices[0]?.text ?? "";
}

test("top_k 1 and min_p 1 keep only the most likely token: greedy at any temperature", async () => {
  const greedy = await endlessText({ temperature: 0 });
  const sampled = await endlessText({ temperature: 2, seed: 1 });
  assert.notEqual(sampled, greedy, "sampling at temperature 2 leaves the greedy path (else this test could not fail)");
  assert.equal(await endlessText({ temperature: 2, seed: 1, top_k: 1 }), greedy);
  assert.equal(await endlessText({ temperature: 2, seed: 1, min_p: 1 }), greedy);
});

test("presence, frequency and repeat penalties change a greedy reply that repeats itself", async () => {
  const tokensOf = async (body: Record<string, unknown>) => {
    const reply = await endless.client.completions.create({
      model: "endless",
      prompt: "Once upon a time",
      max_tokens: 32,
      temperature: 0,
      logprobs: 0,
      ...body,
    } as OpenAI.CompletionCreateParamsNonStreaming);
    return reply.choices[0]?.logprobs?.tokens ?? [];
  };
  const plain = await tokensOf({});
  const distinct = (tokens: string[]) => new Set(tokens).size;
  assert.ok(distinct(plain) < plain.length, `the plain greedy reply repeats tokens: ${JSON.stringify(plain)}`);
  for (const penalty of [{ presence_penalty: 2 }, { frequency_penalty: 2 }, { repeat_penalty: 2 }]) {
    const penalised = await tokensOf(penalty);
    assert.ok(distinct(penalised) > distinct(plain), `${JSON.stringify(penalty)}: ${distinct(penalised)} distinct tokens against ${distinct(plain)}`);
  }
});

test("OpenAI fields the engine cannot honour are 400s naming the field; harmless ones are accepted", async () => {
  const post = async (path: string, body: Record<string, unknown>) => {
    const response = await fetch(`${scripted.url}${path}`, {
      method: "POST",
      headers: { authorization: "Bearer k", "content-type": "application/json" },
      body: JSON.stringify({ max_tokens: 2, temperature: 0, ...body }),
    });
    const json = (await response.json()) as { error?: { param: string; message: string } };
    return { status: response.status, param: json.error?.param, message: json.error?.message ?? "" };
  };
  const chat: Array<[string, unknown]> = [
    ["top_logprobs", 2],
    ["audio", { voice: "alloy", format: "wav" }],
    ["modalities", ["text", "audio"]],
    ["prediction", { type: "content", content: "x" }],
    ["reasoning_effort", "low"],
    ["verbosity", "low"],
    ["web_search_options", {}],
    ["functions", [{ name: "f" }]],
    ["function_call", "auto"],
    ["service_tier", "flex"],
    ["store", true],
    ["n", 2],
  ];
  for (const [field, value] of chat) {
    const outcome = await post("/chat/completions", { messages: hi, [field]: value });
    assert.equal(outcome.status, 400, field);
    assert.ok(outcome.param?.startsWith(field), `${field}: param ${outcome.param}`);
    assert.ok(outcome.message.includes(field), `${field}: ${outcome.message}`);
  }
  assert.equal((await post("/chat/completions", { messages: hi, logprobs: true, top_logprobs: 21 })).param, "top_logprobs");
  for (const [field, value] of [
    ["best_of", 2],
    ["suffix", "end"],
    ["echo", true],
    ["logprobs", 6],
  ] as const) {
    const outcome = await post("/completions", { prompt: "hi", [field]: value });
    assert.equal(outcome.status, 400, field);
    assert.equal(outcome.param, field);
  }
  const harmless = {
    user: "u",
    metadata: { team: "a" },
    safety_identifier: "s",
    prompt_cache_key: "p",
    service_tier: "auto",
    store: false,
    modalities: ["text"],
  };
  assert.equal((await post("/chat/completions", { messages: hi, ...harmless })).status, 200);
});

test("a distribution is read only as far as logprobs need: node-llama-cpp's order is most likely first", () => {
  // A 150k-token distribution, most likely first, as node-llama-cpp hands it over.
  const size = 150_000;
  const entries = Array.from({ length: size }, (_, i): [number, number] => [i, (size - i) / (size * size)]);
  let read = 0;
  const counted = {
    *[Symbol.iterator]() {
      for (const entry of entries) {
        read += 1;
        yield entry;
      }
    },
    get: (token: number) => entries[token]?.[1],
  } as unknown as TokenDistribution;
  assert.deepEqual(
    mostLikely(counted, 3).map(([token]) => token),
    [0, 1, 2],
  );
  assert.equal(read, 3, "no entry past the third is read");
  read = 0;
  const kept = keepForLogprobs(2)(70_000 as Token, counted);
  assert.deepEqual([...kept.keys()], [0, 1, 70_000], "the two likeliest and the sampled token");
  assert.ok(read <= 3, `read ${read} entries`);
  // No token without probability is an alternative.
  assert.deepEqual(
    mostLikely(
      new Map([
        [5, 1],
        [1, 0],
        [2, 0],
      ]) as unknown as TokenDistribution,
      3,
    ),
    [[5, 1]],
  );

  // The flat [token, probability, ...] array is cut to the first pairs and the sampled token's.
  const flat = entries.flat();
  assert.deepEqual(trimDistribution(flat, 70_000, 2), [0, entries[0]?.[1], 1, entries[1]?.[1], 70_000, entries[70_000]?.[1]]);
  assert.deepEqual(trimDistribution(flat, 1, 2), [0, entries[0]?.[1], 1, entries[1]?.[1]]);
  const short = [3, 0.5, 4, 0.5];
  assert.equal(trimDistribution(short, 4, 2), short);
});
