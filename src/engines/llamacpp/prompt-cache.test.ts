// The engine's prompt cache on the bundled llama.cpp with a generated tiny model: a
// request is given the free sequence that already holds the longest prefix of its
// prompt, evaluates only the rest, and says so in llama-server's `timings` (cache_n). Two
// prompts on a two-sequence engine keep a sequence each, so both are found again; a
// sequence sharing only the BOS token is not taken over while an unused one is free.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { AddressInfo } from "node:net";
import { silentLogger } from "../../core/log.ts";
import { writeTinyLlamaGguf } from "../../gguf/tiny-model.ts";
import { createEngineServer } from "./engine-server.ts";
import { LlamaRunner, type GenerationResult } from "./llama-runner.ts";
import type { ChatMessage } from "./openai-wire.ts";

let dir: string;
let runner: LlamaRunner;

before(async () => {
  dir = await mkdtemp(join(tmpdir(), "llmgw-prompt-cache-"));
  const model = await writeTinyLlamaGguf({ path: join(dir, "endless.gguf"), seed: 3, endless: true });
  runner = await LlamaRunner.load({ modelPath: model.path, contextSize: 2 * 1024, parallel: 2, threads: 1, logger: silentLogger() });
});

after(async () => {
  await runner?.dispose();
  await rm(dir, { recursive: true, force: true });
});

/** A prompt of a few hundred tokens, different for each topic. */
const longText = (topic: string, lines = 40) => Array.from({ length: lines }, (_, index) => `${topic} line ${index} says hello world`).join("\n");

const complete = (prompt: string): Promise<GenerationResult> =>
  runner.complete(prompt, { params: { temperature: 0, stop: [], maxTokens: 3 }, signal: new AbortController().signal });

const chat = (messages: ChatMessage[]): Promise<GenerationResult> =>
  runner.chat(messages, { params: { temperature: 0, stop: [], maxTokens: 3 }, signal: new AbortController().signal });

test("completions: each of two long prompts keeps its sequence, and a request that extends one evaluates only what is new", async () => {
  const first = await complete(longText("apples"));
  assert.equal(first.cachedTokens, 0, "nothing was cached before");
  assert.ok(first.promptTokens > 300, `a long prompt: ${first.promptTokens} tokens`);
  // Shares only the BOS token with the first: takes the unused sequence, not the first's.
  const second = await complete(longText("pears"));
  assert.equal(second.cachedTokens, 0);

  const firstAgain = await complete(`${longText("apples")}\nand one more line`);
  const secondAgain = await complete(`${longText("pears")}\nand one more line`);
  // The reply's tokens and the prompt's last token are evaluated again, nothing before.
  assert.ok(firstAgain.cachedTokens >= first.promptTokens - 2, `apples: ${firstAgain.cachedTokens} of ${first.promptTokens} cached`);
  assert.ok(secondAgain.cachedTokens >= second.promptTokens - 2, `pears: ${secondAgain.cachedTokens} of ${second.promptTokens} cached`);
  assert.ok(firstAgain.cachedTokens < firstAgain.promptTokens);

  // The same prompt again: all but its last token, which must be evaluated for the next one.
  const repeated = await complete(`${longText("pears")}\nand one more line`);
  assert.equal(repeated.cachedTokens, repeated.promptTokens - 1);
});

test("chat: the next turn of a conversation with a long system prompt reuses the system prompt and the earlier turns", async () => {
  const system: ChatMessage = { role: "system", content: longText("the rules", 25) };
  const turn1 = await chat([system, { role: "user", content: "What is the first rule?" }]);
  // Another conversation in between, which must not take the first one's sequence.
  await chat([
    { role: "system", content: longText("other rules", 25) },
    { role: "user", content: "Hi" },
  ]);
  const turn2 = await chat([
    system,
    { role: "user", content: "What is the first rule?" },
    { role: "assistant", content: "It says hello." },
    { role: "user", content: "And the second?" },
  ]);
  assert.ok(turn2.cachedTokens > turn1.promptTokens - 20, `${turn2.cachedTokens} of the first turn's ${turn1.promptTokens} prompt tokens reused`);
  assert.ok(turn2.cachedTokens < turn2.promptTokens);
});

test("HTTP: a non-streamed answer carries llama-server's timings, cache_n and prompt_n adding up to the prompt", async () => {
  const server = createEngineServer({ key: "k", modelName: "tiny", logger: silentLogger() });
  server.setGenerator(runner);
  const address: AddressInfo = await server.listen("127.0.0.1", 0);
  try {
    const ask = async (prompt: string) => {
      const response = await fetch(`http://127.0.0.1:${address.port}/v1/completions`, {
        method: "POST",
        headers: { authorization: "Bearer k", "content-type": "application/json" },
        body: JSON.stringify({ model: "tiny", prompt, max_tokens: 2, temperature: 0 }),
      });
      assert.equal(response.status, 200);
      return (await response.json()) as {
        usage: { prompt_tokens: number; completion_tokens: number };
        timings: { cache_n: number; prompt_n: number; predicted_n: number };
      };
    };
    const cold = await ask(longText("plums"));
    const warm = await ask(`${longText("plums")}\nthen more`);
    for (const answer of [cold, warm]) {
      assert.equal(answer.timings.cache_n + answer.timings.prompt_n, answer.usage.prompt_tokens);
      assert.equal(answer.timings.predicted_n, answer.usage.completion_tokens);
    }
    assert.ok(warm.timings.cache_n >= cold.usage.prompt_tokens - 2, `warm: ${JSON.stringify(warm.timings)}, cold prompt ${cold.usage.prompt_tokens}`);
    assert.ok(warm.timings.prompt_n < 20);
  } finally {
    await server.shutdown();
  }
});

test("completions: a prompt that nearly fills the context is evaluated whole, not cut at its front", async () => {
  // LlamaCompletion keeps room for a context shift (a tenth of the context) and drops the
  // front of a longer prompt unless told otherwise; the engine refuses what does not fit
  // instead, so every token it accepts must reach the sequence.
  const sequenceContext = 1024; // 2,048 tokens shared by two sequences
  const probe = await complete(longText("plums", 40));
  const tokensPerLine = probe.promptTokens / 40;
  const lines = Math.floor((0.96 * sequenceContext) / tokensPerLine);
  const first = await complete(longText("plums", lines));
  assert.ok(
    first.promptTokens > 0.9 * sequenceContext && first.promptTokens < sequenceContext - 3,
    `the prompt fills 90–100% of a sequence's context: ${first.promptTokens} tokens`,
  );
  // Had its front been dropped, the sequence would hold only the tail and share nothing
  // past BOS with the same prompt sent again.
  const again = await complete(longText("plums", lines));
  assert.equal(again.cachedTokens, again.promptTokens - 1, `${again.cachedTokens} of ${again.promptTokens} tokens reused`);
});
