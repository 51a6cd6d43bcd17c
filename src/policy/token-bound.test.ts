// The upper bound of a request's tokens: bytes of its text plus the template's allowances,
// token ids as they are, and the output from max_tokens or the model's limits.
import { test } from "node:test";
import assert from "node:assert/strict";
import type { CatalogModel } from "../catalog/catalog.ts";
import { DEFAULT_MAX_OUTPUT, MEDIA_PART_ALLOWANCE, PER_MESSAGE_ALLOWANCE, PER_REQUEST_ALLOWANCE, tokenBound } from "./token-bound.ts";

function model(limits: { context_length?: number; max_output?: number } = {}): CatalogModel {
  return { id: "m", name: "m", definition: { ...limits } } as unknown as CatalogModel;
}

test("a chat prompt counts the UTF-8 bytes of every message field, plus the template's allowances", () => {
  const body = { model: "m", messages: [{ role: "system", content: "héllo" }, { role: "user", content: [{ type: "text", text: "日本" }] }] };
  const bound = tokenBound("/v1/chat/completions", body, model());
  // "system" 6 + "héllo" 6 bytes; "user" 4 + "日本" 6 bytes + 1 per text part.
  assert.equal(bound.prompt, PER_REQUEST_ALLOWANCE + 2 * PER_MESSAGE_ALLOWANCE + 6 + 6 + 4 + 6 + 1);
  assert.equal(bound.output, DEFAULT_MAX_OUTPUT);
  const withTools = tokenBound("/v1/chat/completions", { ...body, tools: [{ type: "function", function: { name: "f" } }] }, model());
  assert.equal(withTools.prompt - bound.prompt, Buffer.byteLength(JSON.stringify([{ type: "function", function: { name: "f" } }])), "tool definitions are rendered into the prompt");
});

test("the output is max_tokens, else max_completion_tokens, else the model's max_output or context length", () => {
  const messages = [{ role: "user", content: "hi" }];
  assert.equal(tokenBound("/v1/chat/completions", { model: "m", messages, max_tokens: 7, max_completion_tokens: 9 }, model({ max_output: 100 })).output, 7);
  assert.equal(tokenBound("/v1/chat/completions", { model: "m", messages, max_completion_tokens: 9 }, model({ max_output: 100 })).output, 9);
  assert.equal(tokenBound("/v1/chat/completions", { model: "m", messages }, model({ max_output: 100, context_length: 2048 })).output, 100);
  assert.equal(tokenBound("/v1/chat/completions", { model: "m", messages }, model({ context_length: 2048 })).output, 2048);
  assert.equal(tokenBound("/v1/chat/completions", { model: "m", messages, max_tokens: 5000 }, model({ context_length: 2048 })).output, 2048, "no request outputs more than the context");
});

test("an image part counts an allowance, and the context length caps the prompt", () => {
  const messages = [{ role: "user", content: [{ type: "image_url", image_url: { url: "https://x/y.png" } }] }];
  assert.ok(tokenBound("/v1/chat/completions", { model: "m", messages }, model()).prompt >= MEDIA_PART_ALLOWANCE);
  assert.equal(tokenBound("/v1/chat/completions", { model: "m", messages }, model({ context_length: 4096 })).prompt, 4096);
});

test("completions and embeddings count token ids as they are and strings by their bytes", () => {
  assert.equal(tokenBound("/v1/completions", { model: "m", prompt: [1, 2, 3], max_tokens: 4 }, model()).prompt, 3 + PER_REQUEST_ALLOWANCE);
  assert.equal(tokenBound("/v1/completions", { model: "m", prompt: "abc" }, model()).prompt, 3 + PER_REQUEST_ALLOWANCE);
  assert.deepEqual(tokenBound("/v1/embeddings", { model: "m", input: ["ab", "cde"] }, model()), { prompt: 2 + 1 + 3 + 1, output: 0 });
  assert.deepEqual(tokenBound("/v1/embeddings", { model: "m", input: [[1, 2], [3]] }, model()), { prompt: 2 + 1 + 1 + 1, output: 0 });
});
