// The stream translator: a canned chat-completion SSE stream, cut at every byte boundary,
// gives Ollama's lines in order (text pieces, the tool calls once complete, the done line
// with the final usage); a stream without [DONE] gives no done line; an upstream error
// event becomes the last line.
import { test } from "node:test";
import assert from "node:assert/strict";
import { OllamaStream } from "./ollama-stream.ts";
import type { AnswerRequest } from "./ollama-lines.ts";

function chunk(choice: Record<string, unknown> | null, extra: Record<string, unknown> = {}): string {
  const choices = choice === null ? [] : [{ index: 0, delta: {}, logprobs: null, finish_reason: null, ...choice }];
  return `data: ${JSON.stringify({ id: "chatcmpl-1", object: "chat.completion.chunk", created: 1, model: "up", choices, ...extra })}\n\n`;
}

const USAGE = chunk(null, { usage: { prompt_tokens: 12, completion_tokens: 4, total_tokens: 16 } });

const TEXT =
  chunk({ delta: { role: "assistant", content: "" } }) +
  chunk({ delta: { content: "Héllo" } }) +
  chunk({ delta: { content: " wörld 😁" } }) +
  chunk({ finish_reason: "stop" }) +
  USAGE +
  "data: [DONE]\n\n";

type Line = Record<string, unknown>;

function parseLines(text: string): Line[] {
  assert.ok(text === "" || text.endsWith("\n"), "whole lines only");
  return text
    .split("\n")
    .filter((line) => line !== "")
    .map((line) => JSON.parse(line) as Line);
}

/** Feeds the input in pieces cut at `cuts`; returns every line and the translator. */
function translate(input: string, cuts: number[], request: Partial<AnswerRequest> = {}) {
  const translator = new OllamaStream({ kind: "chat", model: "llama:latest", stream: true, startedAt: 0, clock: () => 0, ...request });
  const bytes = Buffer.from(input, "utf8");
  const parts: Buffer[] = [];
  let from = 0;
  for (const cut of [...cuts, bytes.length]) {
    parts.push(translator.push(bytes.subarray(from, cut)));
    from = cut;
  }
  parts.push(translator.end());
  return { lines: parseLines(Buffer.concat(parts).toString("utf8")), translator };
}

function withoutTimes(line: Line | undefined): Line {
  assert.ok(line);
  assert.ok(!Number.isNaN(Date.parse(line.created_at as string)), "created_at is an ISO time");
  const { created_at: _, ...rest } = line;
  return rest;
}

test("text pieces become lines as they come, and [DONE] the done line with the final usage, however the bytes are cut", () => {
  const length = Buffer.byteLength(TEXT);
  for (let cut = 0; cut <= length; cut += 1) {
    const { lines, translator } = translate(TEXT, [cut]);
    assert.deepEqual(lines.map(withoutTimes), [
      { model: "llama:latest", message: { role: "assistant", content: "Héllo" }, done: false },
      { model: "llama:latest", message: { role: "assistant", content: " wörld 😁" }, done: false },
      {
        model: "llama:latest",
        message: { role: "assistant", content: "" },
        done: true,
        done_reason: "stop",
        total_duration: 0,
        load_duration: 0,
        prompt_eval_count: 12,
        prompt_eval_duration: 0,
        eval_count: 4,
        eval_duration: 0,
      },
    ]);
    assert.deepEqual(translator.usage(), { prompt_tokens: 12, completion_tokens: 4 });
  }
  assert.deepEqual(new OllamaStream({ kind: "chat", model: "m", stream: true, startedAt: 0 }).head(), {
    status: 200,
    contentType: "application/x-ndjson",
    stream: true,
  });
});

test("the durations split at the first piece of output", () => {
  const clock = { now: 1_000 };
  const translator = new OllamaStream({ kind: "generate", model: "m", stream: true, startedAt: 1_000, clock: () => clock.now });
  clock.now = 4_000;
  translator.push(Buffer.from(chunk({ delta: { content: "a" } })));
  clock.now = 10_000;
  const lines = parseLines(translator.push(Buffer.from(`${chunk({ finish_reason: "length" })}${USAGE}data: [DONE]\n\n`)).toString("utf8"));
  const done = lines.at(-1);
  assert.equal(done?.response, "");
  assert.equal(done?.done_reason, "length");
  assert.equal(done?.total_duration, 9_000);
  assert.equal(done?.prompt_eval_duration, 3_000);
  assert.equal(done?.eval_duration, 6_000);
});

test("generate's pieces are `response`", () => {
  const { lines } = translate(TEXT, [], { kind: "generate" });
  assert.equal(lines[0]?.response, "Héllo");
  assert.equal(lines[0]?.message, undefined);
});

test("tool-call deltas are put together and given as one line with object arguments when the calls are complete", () => {
  const stream =
    chunk({
      delta: { role: "assistant", content: null, tool_calls: [{ index: 0, id: "call_a", type: "function", function: { name: "weather", arguments: "" } }] },
    }) +
    chunk({ delta: { tool_calls: [{ index: 0, function: { arguments: '{"city":' } }] } }) +
    chunk({ delta: { tool_calls: [{ index: 1, id: "call_b", type: "function", function: { name: "clock", arguments: "{}" } }] } }) +
    chunk({ delta: { tool_calls: [{ index: 0, function: { arguments: '"Paris"}' } }] } }) +
    chunk({ finish_reason: "tool_calls" }) +
    USAGE +
    "data: [DONE]\n\n";
  for (const cuts of [[], [37], [200, 401]]) {
    const { lines } = translate(stream, cuts);
    assert.equal(lines.length, 2);
    assert.deepEqual(withoutTimes(lines[0]), {
      model: "llama:latest",
      message: {
        role: "assistant",
        content: "",
        tool_calls: [{ function: { name: "weather", arguments: { city: "Paris" } } }, { function: { name: "clock", arguments: {} } }],
      },
      done: false,
    });
    assert.equal(lines[1]?.done, true);
    assert.equal(lines[1]?.done_reason, "stop");
  }
});

test("calls of an upstream that never gave a finish reason are given at [DONE]", () => {
  const stream = `${chunk({ delta: { tool_calls: [{ index: 0, function: { name: "f", arguments: '{"x":1}' } }] } })}data: [DONE]\n\n`;
  const { lines } = translate(stream, []);
  assert.deepEqual((lines[0]?.message as { tool_calls?: unknown } | undefined)?.tool_calls, [{ function: { name: "f", arguments: { x: 1 } } }]);
  assert.equal(lines[1]?.done, true);
  assert.equal(lines[1]?.prompt_eval_count, 0, "no usage: zeros");
});

test("a stream that ends without [DONE] gives no done line: the relay ends it with the failure line", () => {
  const cutShort = `${chunk({ delta: { content: "Hel" } })}${chunk({ delta: { content: "lo" } })}data: {"choices":[{"delta":{"content":"!"`;
  const { lines } = translate(cutShort, [5]);
  assert.equal(lines.length, 2);
  assert.ok(lines.every((line) => line.done === false));
});

test("an upstream's error event becomes the last line, and nothing after it is translated", () => {
  const stream =
    chunk({ delta: { content: "Hel" } }) +
    `data: ${JSON.stringify({ error: { message: "The engine ran out of memory.", code: 500 } })}\n\n` +
    chunk({ delta: { content: "lo" } }) +
    "data: [DONE]\n\n";
  const { lines } = translate(stream, []);
  assert.equal(lines.length, 2);
  assert.deepEqual(lines[1], { error: "The engine ran out of memory." });
});

test("an upstream's reasoning pieces come as `thinking`", () => {
  const stream = `${chunk({ delta: { reasoning_content: "Let me see." } })}${chunk({ delta: { content: "4" } })}data: [DONE]\n\n`;
  const { lines } = translate(stream, []);
  assert.deepEqual(lines[0]?.message, { role: "assistant", content: "", thinking: "Let me see." });
  assert.deepEqual(lines[1]?.message, { role: "assistant", content: "4" });
});
