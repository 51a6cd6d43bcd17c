// The answers given whole: a chat completion as Ollama's chat or generate answer (or, for
// a client that asked for a stream, as its lines), the counts and durations of the done
// fields, tool calls with object arguments, upstream errors in Ollama's shape, and
// embeddings in both of Ollama's shapes.
import { test } from "node:test";
import assert from "node:assert/strict";
import { OllamaAnswer, OllamaEmbedAnswer } from "./ollama-answer.ts";
import type { AnswerRequest } from "./ollama-lines.ts";

/** A clock the test moves: nanoseconds. */
function manualClock(start = 1_000_000) {
  const clock = { now: start, read: () => clock.now };
  return clock;
}

function completion(message: Record<string, unknown>, finish = "stop", usage: unknown = { prompt_tokens: 11, completion_tokens: 5, total_tokens: 16 }) {
  return JSON.stringify({
    id: "chatcmpl-1",
    object: "chat.completion",
    choices: [{ index: 0, message: { role: "assistant", ...message }, finish_reason: finish }],
    usage,
  });
}

function run(rewriter: OllamaAnswer | OllamaEmbedAnswer, body: string, clock?: { now: number }, step = 0): string {
  const parts = [rewriter.push(Buffer.from(body.slice(0, 10)))];
  if (clock) clock.now += step;
  parts.push(rewriter.push(Buffer.from(body.slice(10))), rewriter.end());
  return Buffer.concat(parts).toString("utf8");
}

test("a chat answer: the message, done, the reason, the counts and nanosecond durations", () => {
  const clock = manualClock();
  const request: AnswerRequest = { kind: "chat", model: "llama:latest", stream: false, startedAt: clock.now, clock: clock.read };
  const rewriter = new OllamaAnswer(request, 200);
  clock.now += 2_000_000; // The answer's first byte comes 2 ms after the request.
  const answer = JSON.parse(run(rewriter, completion({ content: "Hello there" }, "length"), clock, 500_000)) as Record<string, unknown>;
  assert.ok(!Number.isNaN(Date.parse(answer.created_at as string)));
  delete answer.created_at;
  assert.deepEqual(answer, {
    model: "llama:latest",
    message: { role: "assistant", content: "Hello there" },
    done: true,
    done_reason: "length",
    total_duration: 2_500_000,
    load_duration: 0,
    prompt_eval_count: 11,
    prompt_eval_duration: 2_000_000,
    eval_count: 5,
    eval_duration: 500_000,
  });
  assert.deepEqual(rewriter.usage(), { prompt_tokens: 11, completion_tokens: 5 });
  assert.deepEqual(rewriter.head(), { status: 200, contentType: "application/json" });
});

test("tool calls come with their arguments as objects, and a tool-call finish is 'stop'", () => {
  const rewriter = new OllamaAnswer({ kind: "chat", model: "m", stream: false, startedAt: 0 }, 200);
  const calls = [
    { id: "call_1", type: "function", function: { name: "weather", arguments: '{"city":"Paris"}' } },
    { id: "call_2", type: "function", function: { name: "clock", arguments: "" } },
    { id: "call_3", type: "function", function: { name: "broken", arguments: '{"city":' } },
  ];
  const answer = JSON.parse(run(rewriter, completion({ content: null, tool_calls: calls }, "tool_calls"))) as { message: unknown; done_reason: string };
  assert.equal(answer.done_reason, "stop");
  assert.deepEqual(answer.message, {
    role: "assistant",
    // A call whose arguments are no object is kept as text rather than lost.
    content: '{"name":"broken","arguments":"{\\"city\\":"}',
    tool_calls: [{ function: { name: "weather", arguments: { city: "Paris" } } }, { function: { name: "clock", arguments: {} } }],
  });
});

test("a generate answer has `response`; an upstream's reasoning comes as `thinking`", () => {
  const rewriter = new OllamaAnswer({ kind: "generate", model: "m", stream: false, startedAt: 0 }, 200);
  const answer = JSON.parse(run(rewriter, completion({ content: "42", reasoning_content: "6 times 7" }))) as Record<string, unknown>;
  assert.equal(answer.response, "42");
  assert.equal(answer.thinking, "6 times 7");
  assert.equal(answer.message, undefined);
  assert.equal(answer.context, undefined, "no token context is given");
  assert.equal(answer.done, true);
});

test("a stream request the upstream answered whole gets the lines of a stream: the answer, then the done line", () => {
  const rewriter = new OllamaAnswer({ kind: "chat", model: "m", stream: true, startedAt: 0 }, 200);
  const text = run(rewriter, completion({ content: "Hi" }));
  assert.ok(text.endsWith("\n"));
  const lines = text
    .trimEnd()
    .split("\n")
    .map((line) => JSON.parse(line) as Record<string, unknown>);
  assert.equal(lines.length, 2);
  assert.deepEqual(lines[0]?.message, { role: "assistant", content: "Hi" });
  assert.equal(lines[0]?.done, false);
  assert.equal(lines[1]?.done, true);
  assert.deepEqual(lines[1]?.message, { role: "assistant", content: "" });
  assert.equal(lines[1]?.eval_count, 5);
  assert.deepEqual(rewriter.head(), { status: 200, contentType: "application/x-ndjson", stream: true });
});

test("an upstream error keeps its status and becomes {error}, also for a stream request", () => {
  const rewriter = new OllamaAnswer({ kind: "chat", model: "m", stream: true, startedAt: 0 }, 400);
  const body = run(rewriter, JSON.stringify({ error: { message: "the request exceeds the available context size", type: "invalid_request_error" } }));
  assert.deepEqual(JSON.parse(body), { error: "the request exceeds the available context size" });
  assert.deepEqual(rewriter.head(), { status: 400, contentType: "application/json" });
  assert.equal(rewriter.usage(), null);
});

test("an answer that is no chat completion is a 502 in Ollama's shape", () => {
  const rewriter = new OllamaAnswer({ kind: "chat", model: "m", stream: true, startedAt: 0 }, 200);
  const body = JSON.parse(run(rewriter, "<html>proxy error</html>")) as { error: string };
  assert.match(body.error, /not a chat completion/);
  assert.deepEqual(rewriter.head(), { status: 502, contentType: "application/json" });
});

test("embeddings: /api/embed's vectors in input order with counts; /api/embeddings' one vector", () => {
  const clock = manualClock();
  const answer = JSON.stringify({
    object: "list",
    data: [
      { object: "embedding", index: 1, embedding: [0.3, 0.4] },
      { object: "embedding", index: 0, embedding: [0.1, 0.2] },
    ],
    usage: { prompt_tokens: 6, total_tokens: 6 },
  });
  const embed = new OllamaEmbedAnswer({ kind: "embed", model: "emb:latest", startedAt: clock.now, clock: clock.read }, 200);
  clock.now += 3_000;
  assert.deepEqual(JSON.parse(run(embed, answer)), {
    model: "emb:latest",
    embeddings: [
      [0.1, 0.2],
      [0.3, 0.4],
    ],
    total_duration: 3_000,
    load_duration: 0,
    prompt_eval_count: 6,
  });
  assert.deepEqual(embed.usage(), { prompt_tokens: 6, completion_tokens: 0 });
  const legacy = new OllamaEmbedAnswer({ kind: "embeddings", model: "emb", startedAt: 0 }, 200);
  assert.deepEqual(JSON.parse(run(legacy, answer)), { embedding: [0.1, 0.2] });
  assert.deepEqual(legacy.head(), { status: 200, contentType: "application/json" });
});

test("an embeddings error keeps its status; vectors that are not numbers are a 502", () => {
  const failed = new OllamaEmbedAnswer({ kind: "embed", model: "m", startedAt: 0 }, 400);
  assert.deepEqual(JSON.parse(run(failed, JSON.stringify({ error: { message: "input is too large to process" } }))), {
    error: "input is too large to process",
  });
  assert.equal(failed.head().status, 400);
  const base64 = new OllamaEmbedAnswer({ kind: "embed", model: "m", startedAt: 0 }, 200);
  assert.match((JSON.parse(run(base64, JSON.stringify({ data: [{ index: 0, embedding: "AAAA" }] }))) as { error: string }).error, /not a list of embeddings/);
  assert.equal(base64.head().status, 502);
});
