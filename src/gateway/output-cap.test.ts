import assert from "node:assert/strict";
import { test } from "node:test";
import { outputCapOf } from "./output-cap.ts";

const chat = "/v1/chat/completions";
const base = { model: "m", messages: [] };

test("no cap, or an endpoint without generated tokens: nothing changes", () => {
  assert.equal(outputCapOf(chat, { ...base, max_tokens: 10 }, null), null);
  assert.equal(outputCapOf("/v1/embeddings", { model: "m", input: "x" }, 5), null);
});

test("max_tokens is capped, or set when the client sent no limit", () => {
  assert.deepEqual(outputCapOf(chat, { ...base, max_tokens: 500 }, 100), { max_tokens: 100 });
  assert.deepEqual(outputCapOf(chat, { ...base }, 100), { max_tokens: 100 });
  assert.deepEqual(outputCapOf("/v1/completions", { model: "m", prompt: "x" }, 64), { max_tokens: 64 });
  assert.equal(outputCapOf(chat, { ...base, max_tokens: 50 }, 100), null, "a smaller limit stays as sent");
});

test("a chat client that sent only max_completion_tokens keeps to that field (reasoning models refuse max_tokens)", () => {
  assert.deepEqual(outputCapOf(chat, { ...base, max_completion_tokens: 5000 }, 100), { max_completion_tokens: 100 });
  assert.equal(outputCapOf(chat, { ...base, max_completion_tokens: 10 }, 100), null);
});

test("both fields sent: both capped, so no engine reads past the reservation whichever field it prefers", () => {
  assert.deepEqual(outputCapOf(chat, { ...base, max_tokens: 1, max_completion_tokens: 100_000 }, 1000), { max_tokens: 1, max_completion_tokens: 1000 });
});
