// The Ollama error dialect: llmgw's status, headers and message in Ollama's `{"error"}`
// body; a broken stream's last JSON line; an upstream's error answer keeping its message.
import { test } from "node:test";
import assert from "node:assert/strict";
import { BadRequestError, TooManyRequestsError } from "../../core/errors.ts";
import { OLLAMA_ERRORS, streamErrorMessage, upstreamErrorBody } from "./ollama-errors.ts";

test("an llmgw error keeps its status, headers and message, in Ollama's body", () => {
  const rendered = OLLAMA_ERRORS.render(new TooManyRequestsError("Slow down.", { retryAfterSeconds: 7, headers: { "x-ratelimit-limit-requests": "10" } }));
  assert.equal(rendered.status, 429);
  assert.equal(rendered.headers["retry-after"], "7");
  assert.equal(rendered.headers["x-ratelimit-limit-requests"], "10");
  assert.deepEqual(rendered.body, { error: "Slow down." });
  assert.deepEqual(OLLAMA_ERRORS.render(new BadRequestError("bad")).body, { error: "bad" });
});

test("anything that is not an llmgw error is an internal error whose text is not shown", () => {
  const rendered = OLLAMA_ERRORS.render(new Error("/secret/path exploded"));
  assert.equal(rendered.status, 500);
  assert.doesNotMatch(JSON.stringify(rendered.body), /secret/);
});

test("a broken stream ends with one JSON line that the clients raise as an error", () => {
  const line = OLLAMA_ERRORS.streamFailureEvent({ message: "The replica went away.", code: "upstream_failed" });
  assert.ok(line.endsWith("\n"));
  assert.equal(line.indexOf("\n"), line.length - 1, "one line");
  assert.deepEqual(JSON.parse(line), { error: "The replica went away." });
});

test("an upstream's error answer keeps its message, wherever it put it", () => {
  assert.deepEqual(upstreamErrorBody(400, JSON.stringify({ error: { message: "the prompt is too long", code: 400 } })), { error: "the prompt is too long" });
  assert.deepEqual(upstreamErrorBody(400, JSON.stringify({ detail: "field required" })), { error: "field required" });
  assert.deepEqual(upstreamErrorBody(500, JSON.stringify({ error: "plain" })), { error: "plain" });
  assert.deepEqual(upstreamErrorBody(502, "Bad Gateway"), { error: "The model server answered HTTP 502: Bad Gateway" });
  assert.deepEqual(upstreamErrorBody(503, ""), { error: "The model server answered HTTP 503" });
});

test("an error event inside a stream gives its message", () => {
  assert.equal(streamErrorMessage({ message: "out of memory", type: "server_error" }), "out of memory");
  assert.equal(streamErrorMessage("boom"), "boom");
  assert.match(streamErrorMessage({}), /failed in the middle/);
});
