// The llama runner in-process, on the bundled llama.cpp with generated tiny models:
// parallel generations share decode steps (counted through the context's own batching
// hook), token counts are what the sequence sampled, and text never carries a partial
// UTF-8 character. The "scripted" model replies with a known token sequence whose
// multi-byte characters are spread over byte tokens (<0xE2> <0x80> <0x94> is "—"), so
// every stop sequence and max_tokens can be placed exactly, even mid-character.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { AddressInfo } from "node:net";
import OpenAI from "openai";
import { silentLogger } from "../../core/log.ts";
import { writeTinyLlamaGguf } from "../../gguf/tiny-model.ts";
import { createEngineServer } from "./engine-server.ts";
import { LlamaEmbedder } from "./llama-embedder.ts";
import { LlamaRunner, type GenerateOptions, type GenerationResult } from "./llama-runner.ts";
import type { GenerationParams } from "./openai-wire.ts";

// The scripted reply, one token each: " say", "—" (3 bytes), " hi", "é" (2 bytes), "!", "😁" (4 bytes).
const SCRIPT = ["▁say", "<0xE2>", "<0x80>", "<0x94>", "▁hi", "<0xC3>", "<0xA9>", "!", "<0xF0>", "<0x9F>", "<0x98>", "<0x81>"];
const SCRIPT_TEXT = "say— hié!😁";

let dir: string;
let scripted: LlamaRunner;
// A reply that ends with the end-of-turn token right after a two-byte character: "sayé".
let endsAfterAccent: LlamaRunner;
let endless: LlamaRunner;

before(async () => {
  dir = await mkdtemp(join(tmpdir(), "llmgw-runner-"));
  const script = await writeTinyLlamaGguf({ path: join(dir, "scripted.gguf"), embeddingLength: 32, layers: 1, replyScript: SCRIPT });
  scripted = await LlamaRunner.load({ modelPath: script.path, contextSize: 1024, parallel: 1, threads: 1, logger: silentLogger() });
  const short = await writeTinyLlamaGguf({
    path: join(dir, "short.gguf"),
    embeddingLength: 32,
    layers: 1,
    replyScript: ["▁say", "<0xC3>", "<0xA9>", "<|im_end|>"],
  });
  endsAfterAccent = await LlamaRunner.load({ modelPath: short.path, contextSize: 512, parallel: 1, threads: 1, logger: silentLogger() });
  // Endless: greedy decoding never ends a reply, so every generation runs to max_tokens.
  const long = await writeTinyLlamaGguf({ path: join(dir, "endless.gguf"), seed: 5, endless: true });
  endless = await LlamaRunner.load({ modelPath: long.path, contextSize: 4 * 512, parallel: 4, threads: 1, logger: silentLogger() });
});

after(async () => {
  await scripted?.dispose();
  await endsAfterAccent?.dispose();
  await endless?.dispose();
  await rm(dir, { recursive: true, force: true });
});

const params = (overrides: Partial<GenerationParams>): GenerationParams => ({ temperature: 0, stop: [], ...overrides });

interface Outcome extends GenerationResult {
  chunks: string[];
}

async function generate(
  runner: LlamaRunner,
  kind: "chat" | "complete",
  overrides: Partial<GenerationParams>,
  extra: Partial<GenerateOptions> = {},
): Promise<Outcome> {
  const chunks: string[] = [];
  const options: GenerateOptions = { params: params(overrides), signal: new AbortController().signal, onText: (text) => chunks.push(text), ...extra };
  const result = kind === "chat" ? await runner.chat([{ role: "user", content: "hello" }], options) : await runner.complete("hello", options);
  return { ...result, chunks };
}

for (const kind of ["chat", "complete"] as const) {
  test(`${kind}: max_tokens counts sampled tokens, also when it lands inside a multi-byte character`, async () => {
    // [tokens, text]: a character whose bytes are not all there is left out, never sent as U+FFFD.
    const cases: Array<[number, string]> = [
      [1, "say"],
      [2, "say"],
      [3, "say"],
      [4, "say—"],
      [6, "say— hi"],
      [7, "say— hié"],
      [11, "say— hié!"],
      [12, SCRIPT_TEXT],
      [24, `${SCRIPT_TEXT} ${SCRIPT_TEXT}`],
    ];
    for (const [maxTokens, text] of cases) {
      const outcome = await generate(scripted, kind, { maxTokens });
      assert.equal(outcome.text, text, `max_tokens ${maxTokens}`);
      assert.equal(outcome.chunks.join(""), text, `max_tokens ${maxTokens}: the streamed text is the reply`);
      assert.ok(!outcome.chunks.some((chunk) => chunk.includes("\uFFFD")), `max_tokens ${maxTokens}: no U+FFFD in ${JSON.stringify(outcome.chunks)}`);
      assert.equal(outcome.completionTokens, maxTokens, `max_tokens ${maxTokens}: completion tokens`);
      assert.equal(outcome.finishReason, "length");
    }
  });

  test(`${kind}: a stop sequence ends the reply before it, counts every token sampled through it, and splits no character`, async () => {
    // [stop, text before it, tokens sampled until the stop sequence was complete].
    const cases: Array<[string, string, number]> = [
      // After "—", whose three byte tokens are held until the character is whole.
      ["hi", "say— ", 5],
      // A stop sequence that starts with a multi-byte character.
      ["— h", "say", 5],
      ["!", "say— hié", 8],
      // Spanning two replies of the script, and one that never comes.
      ["😁 say", "say— hié!", 13],
    ];
    for (const [stop, text, tokens] of cases) {
      const outcome = await generate(scripted, kind, { maxTokens: 30, stop: [stop, "never there"] });
      assert.equal(outcome.finishReason, "stop", `stop ${JSON.stringify(stop)}`);
      assert.equal(outcome.text, text, `stop ${JSON.stringify(stop)}`);
      assert.equal(outcome.chunks.join(""), text, `stop ${JSON.stringify(stop)}: the streamed text is the reply`);
      assert.ok(!outcome.chunks.some((chunk) => chunk.includes("\uFFFD")), `stop ${JSON.stringify(stop)}: no U+FFFD in ${JSON.stringify(outcome.chunks)}`);
      assert.equal(outcome.completionTokens, tokens, `stop ${JSON.stringify(stop)}: completion tokens`);
    }
  });
}

test("a stop sequence ending in a multi-byte character: the completion endpoint sees it one token late, and counts that token", async () => {
  // LlamaCompletion releases the text of a character's last byte token only with the next
  // token, so "é" is seen when "!" (token 8) has been sampled; the chat endpoint sees it
  // at token 7.
  for (const [stop, text, chatTokens] of [
    ["é", "say— hi", 7],
    ["😁", "say— hié!", 12],
  ] as const) {
    const completion = await generate(scripted, "complete", { maxTokens: 30, stop: [stop] });
    assert.deepEqual([completion.text, completion.completionTokens], [text, chatTokens + 1], `complete, stop ${stop}`);
    const chat = await generate(scripted, "chat", { maxTokens: 30, stop: [stop] });
    assert.deepEqual([chat.text, chat.completionTokens], [text, chatTokens], `chat, stop ${stop}`);
  }
});

test("a reply that ends on the end-of-turn token right after a multi-byte character keeps the character and counts the end token", async () => {
  for (const kind of ["chat", "complete"] as const) {
    const outcome = await generate(endsAfterAccent, kind, { maxTokens: 30 });
    assert.deepEqual(
      { text: outcome.text, streamed: outcome.chunks.join(""), finish: outcome.finishReason, tokens: outcome.completionTokens },
      { text: "sayé", streamed: "sayé", finish: "stop", tokens: 4 },
      kind,
    );
  }
});

test("an aborted generation reports what it sampled until then", async () => {
  const controller = new AbortController();
  const outcome = await generate(
    scripted,
    "chat",
    { maxTokens: 500 },
    {
      signal: controller.signal,
      onText: (text) => {
        // " hi" is the fifth token; the abort is seen before the sixth is sampled.
        if (text === " hi") controller.abort(new Error("client gone"));
      },
    },
  );
  assert.equal(outcome.aborted, true);
  assert.equal(outcome.completionTokens, 5);
});

test("parallel generations share llama.cpp's decode batches, chat and completion alike", async () => {
  const tokens = 32;
  for (const active of [2, 3, 4]) {
    const before = endless.decodeBatches();
    const results = await Promise.all(
      Array.from({ length: active }, (_, index) => generate(endless, index % 2 === 0 ? "chat" : "complete", { maxTokens: tokens })),
    );
    const after = endless.decodeBatches();
    for (const result of results) assert.equal(result.completionTokens, tokens);
    const batches = after.batches - before.batches;
    // One batch per step for all of them, plus a few while the prompts start one by one.
    // Without the lockstep the sequences take turns: about `active` × tokens batches.
    assert.ok(batches <= tokens + 2 * active, `${active} generations of ${tokens} tokens took ${batches} decode batches`);
    const perBatch = (after.sequenceSteps - before.sequenceSteps) / batches;
    assert.ok(perBatch >= active - 0.5, `${active} generations: ${perBatch.toFixed(2)} sequences per batch`);
  }
});

test("a generation that starts while another runs joins its decode steps", async () => {
  const before = endless.decodeBatches();
  let joined: Promise<Outcome> | undefined;
  let chunks = 0;
  const first = generate(
    endless,
    "complete",
    { maxTokens: 64 },
    {
      onText: () => {
        chunks += 1;
        if (chunks === 8) joined = generate(endless, "chat", { maxTokens: 24 });
      },
    },
  );
  const long = await first;
  assert.ok(joined, "the second generation started while the first ran");
  const short = await joined;
  assert.equal(long.completionTokens, 64);
  assert.equal(short.completionTokens, 24);
  const after = endless.decodeBatches();
  // The second one's 24 steps were shared with the first one's.
  assert.ok(after.sharedBatches - before.sharedBatches >= 20, `${after.sharedBatches - before.sharedBatches} shared batches`);
});

test("over HTTP with the openai client: usage counts stop-sequence tokens and no chunk holds U+FFFD", async () => {
  const server = createEngineServer({ key: "k", modelName: "scripted", logger: silentLogger() });
  server.setGenerator(scripted);
  const address: AddressInfo = await server.listen("127.0.0.1", 0);
  try {
    const client = new OpenAI({ baseURL: `http://127.0.0.1:${address.port}/v1`, apiKey: "k", maxRetries: 0 });
    const plain = await client.chat.completions.create({
      model: "scripted",
      messages: [{ role: "user", content: "hi" }],
      max_tokens: 30,
      temperature: 0,
      stop: "hi",
    });
    assert.equal(plain.choices[0]?.message.content, "say— ");
    assert.equal(plain.usage?.completion_tokens, 5);

    const stream = await client.completions.create({
      model: "scripted",
      prompt: "hi",
      max_tokens: 30,
      temperature: 0,
      stop: "hi",
      stream: true,
      stream_options: { include_usage: true },
    });
    const texts: string[] = [];
    let completionTokens: number | undefined;
    for await (const chunk of stream) {
      if (chunk.choices[0]?.text) texts.push(chunk.choices[0].text);
      completionTokens = chunk.usage?.completion_tokens ?? completionTokens;
    }
    assert.equal(texts.join(""), "say— ");
    assert.ok(!texts.some((text) => text.includes("\uFFFD")), JSON.stringify(texts));
    assert.equal(completionTokens, 5);
  } finally {
    await server.shutdown(1000);
  }
});

test("the embedding context gets half the generation threads (at least one), so both together do not oversubscribe the cores", async () => {
  const model = join(dir, "threads.gguf");
  await writeTinyLlamaGguf({ path: model, embeddingLength: 32, layers: 1 });
  for (const [threads, expected] of [
    [4, 2],
    [3, 1],
    [1, 1],
  ] as const) {
    const runner = await LlamaRunner.load({ modelPath: model, contextSize: 256, parallel: 1, threads, logger: silentLogger() });
    try {
      assert.ok(runner.embedder instanceof LlamaEmbedder);
      assert.equal(runner.embedder.threads, expected, `generation threads ${threads}`);
      const [vector] = (await runner.embedder.embed(["hello"], new AbortController().signal)).vectors;
      assert.equal(vector?.length, 32, "the embedding context works with them");
    } finally {
      await runner.dispose();
    }
  }
});
