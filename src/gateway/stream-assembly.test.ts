// The JSON answer made of an upstream's stream (stream-assembly.ts): what a client that did
// not ask for a stream gets when the gateway ran its request as one, byte boundaries
// anywhere, tool calls and log probabilities merged, and the failures said as errors.
import { test } from "node:test";
import assert from "node:assert/strict";
import { StreamAssembly } from "./stream-assembly.ts";

const BASE = { id: "chatcmpl-1", object: "chat.completion.chunk", created: 1764500000, model: "up" };

function sse(...chunks: unknown[]): string {
  return `${chunks.map((chunk) => `data: ${JSON.stringify(chunk)}\n\n`).join("")}data: [DONE]\n\n`;
}

/** Feeds the stream in pieces of `size` bytes (UTF-8 characters split too) and returns the answer. */
function assemble(stream: string, size: number, completions = false, stopped = false) {
  const assembly = new StreamAssembly(completions);
  const bytes = Buffer.from(stream);
  for (let i = 0; i < bytes.length; i += size) assembly.push(bytes.subarray(i, i + size));
  return { answer: JSON.parse(assembly.answer(stopped).toString("utf8")), status: assembly.status(), usage: assembly.usage() };
}

test("a chat stream becomes the chat.completion it stands for, text and reasoning joined, usage kept, whatever the chunk boundaries", () => {
  const stream = sse(
    { ...BASE, choices: [{ index: 0, delta: { role: "assistant", content: "" }, finish_reason: null }] },
    { ...BASE, choices: [{ index: 0, delta: { reasoning_content: "thinking… " }, finish_reason: null }] },
    { ...BASE, choices: [{ index: 0, delta: { content: "Grüße" }, finish_reason: null }] },
    { ...BASE, choices: [{ index: 0, delta: { content: " aus Oslo" }, finish_reason: null }], system_fingerprint: "fp_1" },
    { ...BASE, choices: [{ index: 0, delta: {}, finish_reason: "stop" }] },
    { ...BASE, choices: [], usage: { prompt_tokens: 9, completion_tokens: 4, total_tokens: 13 } },
  );
  for (const size of [1, 3, 50, stream.length]) {
    const { answer, status, usage } = assemble(stream, size);
    assert.equal(status, 200);
    assert.deepEqual(usage, { prompt_tokens: 9, completion_tokens: 4 });
    assert.deepEqual(answer, {
      id: "chatcmpl-1",
      object: "chat.completion",
      created: 1764500000,
      model: "up",
      choices: [
        { index: 0, message: { role: "assistant", content: "Grüße aus Oslo", reasoning_content: "thinking… " }, logprobs: null, finish_reason: "stop" },
      ],
      system_fingerprint: "fp_1",
      usage: { prompt_tokens: 9, completion_tokens: 4, total_tokens: 13 },
    });
  }
});

test("tool calls are merged by their index, arguments joined; log probabilities joined", () => {
  const stream = sse(
    {
      ...BASE,
      choices: [
        {
          index: 0,
          delta: { role: "assistant", content: null, tool_calls: [{ index: 0, id: "call_a", type: "function", function: { name: "weather", arguments: "" } }] },
        },
      ],
    },
    {
      ...BASE,
      choices: [
        { index: 0, delta: { tool_calls: [{ index: 0, function: { arguments: '{"city":' } }] }, logprobs: { content: [{ token: "a", logprob: -0.1 }] } },
      ],
    },
    { ...BASE, choices: [{ index: 0, delta: { tool_calls: [{ index: 1, id: "call_b", type: "function", function: { name: "time", arguments: "{}" } }] } }] },
    {
      ...BASE,
      choices: [
        { index: 0, delta: { tool_calls: [{ index: 0, function: { arguments: '"Oslo"}' } }] }, logprobs: { content: [{ token: "b", logprob: -0.2 }] } },
      ],
    },
    { ...BASE, choices: [{ index: 0, delta: {}, finish_reason: "tool_calls" }] },
  );
  const { answer } = assemble(stream, 7);
  assert.deepEqual(answer.choices[0].message.tool_calls, [
    { id: "call_a", type: "function", function: { name: "weather", arguments: '{"city":"Oslo"}' } },
    { id: "call_b", type: "function", function: { name: "time", arguments: "{}" } },
  ]);
  assert.equal(answer.choices[0].message.content, null, "no text: content stays null, as OpenAI sends it with tool calls");
  assert.deepEqual(answer.choices[0].logprobs, {
    content: [
      { token: "a", logprob: -0.1 },
      { token: "b", logprob: -0.2 },
    ],
  });
  assert.equal(answer.choices[0].finish_reason, "tool_calls");
  assert.equal(answer.usage, undefined, "no usage chunk, no usage");
});

test("a completions stream becomes a text_completion; stopped at the bound, every open choice ends with length", () => {
  const stream = sse(
    { ...BASE, object: "text_completion", choices: [{ index: 0, text: "Once", logprobs: { tokens: ["Once"], token_logprobs: [-0.5] }, finish_reason: null }] },
    {
      ...BASE,
      object: "text_completion",
      choices: [{ index: 0, text: " upon", logprobs: { tokens: [" upon"], token_logprobs: [-0.25] }, finish_reason: null }],
    },
  ).replace("data: [DONE]\n\n", "");
  const { answer, status } = assemble(stream, 11, true, true);
  assert.equal(status, 200);
  assert.equal(answer.object, "text_completion");
  assert.deepEqual(answer.choices, [
    { index: 0, text: "Once upon", logprobs: { tokens: ["Once", " upon"], token_logprobs: [-0.5, -0.25] }, finish_reason: "length" },
  ]);
});

test("CRLF and CR framing read alike", () => {
  const lf = sse(
    { ...BASE, choices: [{ index: 0, delta: { content: "one" } }] },
    { ...BASE, choices: [{ index: 0, delta: { content: " two" }, finish_reason: "stop" }] },
  );
  for (const framed of [lf.replaceAll("\n", "\r\n"), lf.replaceAll("\n", "\r")]) {
    const { answer, status } = assemble(framed, 5);
    assert.equal(status, 200);
    assert.equal(answer.choices[0].message.content, "one two");
  }
});

test("an error event of the upstream, or a stream that ends before [DONE], becomes a 502 error answer", () => {
  const failed = `data: ${JSON.stringify({ ...BASE, choices: [{ index: 0, delta: { content: "half" } }] })}\n\ndata: ${JSON.stringify({ error: { message: "engine stopping", type: "server_error", code: "engine_stopping" } })}\n\n`;
  const withError = assemble(failed, 9);
  assert.equal(withError.status, 502);
  assert.deepEqual(withError.answer, { error: { message: "engine stopping", type: "server_error", code: "engine_stopping" } });
  const cutShort = assemble(`data: ${JSON.stringify({ ...BASE, choices: [{ index: 0, delta: { content: "half" } }] })}\n\n`, 9);
  assert.equal(cutShort.status, 502);
  assert.equal(cutShort.answer.error.code, "upstream_failed");
});

test("a tool call's name repeated in every delta is set, not joined; a blank line of LF then CR LF ends an event too", () => {
  const stream = sse(
    { ...BASE, choices: [{ index: 0, delta: { tool_calls: [{ index: 0, id: "c", type: "function", function: { name: "get_weather", arguments: "{" } }] } }] },
    { ...BASE, choices: [{ index: 0, delta: { tool_calls: [{ index: 0, function: { name: "get_weather", arguments: "}" } }] }, finish_reason: "tool_calls" }] },
  ).replaceAll("\n\n", "\n\r\n");
  const { answer, status } = assemble(stream, 3);
  assert.equal(status, 200);
  assert.deepEqual(answer.choices[0].message.tool_calls, [{ id: "c", type: "function", function: { name: "get_weather", arguments: "{}" } }]);
});

test("only the one choice asked for is kept (n is 1): other indexes add nothing", () => {
  const stream = sse(
    { ...BASE, choices: [{ index: 0, delta: { content: "kept" } }] },
    { ...BASE, choices: [{ index: 7, delta: { content: "dropped" } }] },
    { ...BASE, choices: [{ index: 0, delta: {}, finish_reason: "stop" }] },
  );
  const { answer } = assemble(stream, 16);
  assert.deepEqual(
    answer.choices.map((choice: { index: number; message: { content: string } }) => [choice.index, choice.message.content]),
    [[0, "kept"]],
  );
});
