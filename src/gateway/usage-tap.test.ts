import { test } from "node:test";
import assert from "node:assert/strict";
import { UsageTap, readTokenUsage } from "./usage-tap.ts";

test("finds usage in a JSON answer whose text mentions usage and braces", () => {
  const tap = new UsageTap(false);
  const body = JSON.stringify({
    id: "x",
    choices: [{ message: { content: 'he said "usage": {' } }],
    usage: { prompt_tokens: 3, completion_tokens: 4, total_tokens: 7 },
  });
  tap.push(Buffer.from(body.slice(0, 20)));
  tap.push(Buffer.from(body.slice(20)));
  assert.deepEqual(tap.usage(), { prompt_tokens: 3, completion_tokens: 4 });
});

test("finds the usage event at the end of a long stream split across chunks", () => {
  const tap = new UsageTap(true);
  const chunk = (content: string) => `data: ${JSON.stringify({ choices: [{ delta: { content } }], usage: null })}\n\n`;
  for (let i = 0; i < 2000; i += 1) tap.push(Buffer.from(chunk(`token ${i} `)));
  const tail = `data: ${JSON.stringify({ choices: [], usage: { prompt_tokens: 11, completion_tokens: 2000, total_tokens: 2011 } })}\n\ndata: [DONE]\n\n`;
  tap.push(Buffer.from(tail.slice(0, 30)));
  tap.push(Buffer.from(tail.slice(30)));
  assert.deepEqual(tap.usage(), { prompt_tokens: 11, completion_tokens: 2000 });
});

test("reports no usage when the answer has none", () => {
  const tap = new UsageTap(false);
  tap.push(Buffer.from('{"error":{"message":"x"}}'));
  assert.equal(tap.usage(), null);
});

test("finds usage at the end of a JSON answer far larger than the tail it keeps", () => {
  const tap = new UsageTap(false);
  const data = Array.from({ length: 100 }, (_, index) => ({ object: "embedding", index, embedding: Array.from({ length: 1536 }, () => 0.123456789) }));
  const body = Buffer.from(JSON.stringify({ object: "list", data, model: "e", usage: { prompt_tokens: 100, total_tokens: 100 } }));
  assert.ok(body.length > 1024 * 1024);
  for (let offset = 0; offset < body.length; offset += 16 * 1024) tap.push(body.subarray(offset, offset + 16 * 1024));
  assert.deepEqual(tap.usage(), { prompt_tokens: 100, completion_tokens: 0 });
});

test("counts that are not whole numbers >= 0 are no usage; a missing completion count is 0", () => {
  assert.deepEqual(readTokenUsage({ prompt_tokens: 3, completion_tokens: 0 }), { prompt_tokens: 3, completion_tokens: 0 });
  assert.deepEqual(readTokenUsage({ prompt_tokens: 3 }), { prompt_tokens: 3, completion_tokens: 0 }, "an embeddings answer");
  assert.deepEqual(readTokenUsage({ prompt_tokens: 3, completion_tokens: null }), { prompt_tokens: 3, completion_tokens: 0 });
  for (const usage of [
    null,
    {},
    { prompt_tokens: -1, completion_tokens: 2 },
    { prompt_tokens: 1, completion_tokens: -2 },
    { prompt_tokens: 0.5 },
    { prompt_tokens: "3" },
    { prompt_tokens: 1e300 },
    { prompt_tokens: 3, completion_tokens: "2" },
  ]) {
    assert.equal(readTokenUsage(usage), null, JSON.stringify(usage));
  }
  const tap = new UsageTap(false);
  tap.push(Buffer.from(JSON.stringify({ choices: [], usage: { prompt_tokens: -7, completion_tokens: 5 } })));
  assert.equal(tap.usage(), null);
});
