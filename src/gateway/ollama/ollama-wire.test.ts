// The wire formats of Ollama's proxied routes: where the key is read (and what a client
// without one is told), what each route runs as upstream, and which rewriter an answer
// gets (a successful event stream line by line, anything else whole).
import { test } from "node:test";
import assert from "node:assert/strict";
import type { IncomingMessage } from "node:http";
import { AuthenticationError } from "../../core/errors.ts";
import type { WireContext } from "../wire-format.ts";
import { OllamaAnswer, OllamaEmbedAnswer } from "./ollama-answer.ts";
import { OLLAMA_ERRORS } from "./ollama-errors.ts";
import { OllamaStream } from "./ollama-stream.ts";
import { OLLAMA_PROXY_ROUTES, ollamaApiKey, ollamaChat, ollamaEmbed, ollamaGenerationWire } from "./ollama-wire.ts";

const context: WireContext = { principal: { keyId: "k", name: "k", role: "client", allowedModels: null, expiresAt: null }, knows: () => true };

function request(headers: Record<string, string>): IncomingMessage {
  return { headers } as unknown as IncomingMessage;
}

test("the key is read from Authorization: Bearer; without one the 401 says how to give it in the ollama client", () => {
  assert.equal(ollamaApiKey(request({ authorization: "Bearer sk-123" })), "sk-123");
  assert.throws(
    () => ollamaApiKey(request({})),
    (error: unknown) =>
      error instanceof AuthenticationError &&
      error.status === 401 &&
      error.code === "missing_api_key" &&
      error.message.includes("new Ollama({ host, headers: { Authorization: 'Bearer <key>' } })"),
  );
});

test("each route runs as chat completions or embeddings upstream, answering failures in Ollama's shape", () => {
  assert.deepEqual(Object.fromEntries(Object.entries(OLLAMA_PROXY_ROUTES).map(([path, route]) => [path, route.path])), {
    "/api/chat": "/v1/chat/completions",
    "/api/generate": "/v1/chat/completions",
    "/api/embed": "/v1/embeddings",
    "/api/embeddings": "/v1/embeddings",
  });
  for (const route of Object.values(OLLAMA_PROXY_ROUTES)) assert.equal(route.wire.errors, OLLAMA_ERRORS);
});

test("a successful event stream is translated line by line; JSON answers and errors whole", async () => {
  const exchange = await ollamaChat.begin({ model: "m", messages: [{ role: "user", content: "hi" }] }, context);
  assert.equal(exchange.body.stream, true);
  assert.ok(exchange.answer({ status: 200, eventStream: true }) instanceof OllamaStream);
  assert.ok(exchange.answer({ status: 200, eventStream: false }) instanceof OllamaAnswer);
  assert.ok(exchange.answer({ status: 500, eventStream: true }) instanceof OllamaAnswer);
  const embed = await ollamaEmbed.begin({ model: "m", input: "x" }, context);
  assert.ok(embed.answer({ status: 200, eventStream: false }) instanceof OllamaEmbedAnswer);
});

test("the durations count from when the request was taken", async () => {
  const clock = { now: 5_000 };
  const wire = ollamaGenerationWire("generate", () => clock.now);
  const exchange = await wire.begin({ model: "m", prompt: "hi", stream: false }, context);
  clock.now = 9_000;
  const rewriter = exchange.answer({ status: 200, eventStream: false });
  rewriter.push(
    Buffer.from(JSON.stringify({ choices: [{ message: { content: "yo" }, finish_reason: "stop" }], usage: { prompt_tokens: 1, completion_tokens: 1 } })),
  );
  const answer = JSON.parse(rewriter.end().toString("utf8")) as { total_duration: number; response: string };
  assert.equal(answer.response, "yo");
  assert.equal(answer.total_duration, 4_000);
});
