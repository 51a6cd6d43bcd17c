// The Messages request check and its translation into a chat-completions body.
import { test } from "node:test";
import assert from "node:assert/strict";
import { LlmgwError } from "../../core/errors.ts";
import { messagesToChatBody } from "./messages-request.ts";

const base = { model: "demo", max_tokens: 16, messages: [{ role: "user", content: "Hello" }] };

function refusal(body: unknown): LlmgwError {
  try {
    messagesToChatBody(body);
  } catch (error) {
    assert.ok(error instanceof LlmgwError, `expected an LlmgwError, got ${String(error)}`);
    return error;
  }
  assert.fail(`expected a refusal of ${JSON.stringify(body)}`);
}

test("a full request: system first, stop sequences, sampling, user id, and a stream that asks for its usage", () => {
  const body = messagesToChatBody({
    ...base,
    system: "Answer briefly.",
    stop_sequences: ["END", "\n\n"],
    temperature: 0.5,
    top_p: 0.9,
    top_k: 40,
    stream: true,
    metadata: { user_id: "user-7" },
  });
  assert.deepEqual(body, {
    model: "demo",
    messages: [
      { role: "system", content: "Answer briefly." },
      { role: "user", content: "Hello" },
    ],
    max_tokens: 16,
    stop: ["END", "\n\n"],
    temperature: 0.5,
    top_p: 0.9,
    top_k: 40,
    user: "user-7",
    stream: true,
    stream_options: { include_usage: true },
  });
});

test("a minimal request sends only what was given: no system message, no stop, not streamed", () => {
  assert.deepEqual(messagesToChatBody(base), { model: "demo", messages: [{ role: "user", content: "Hello" }], max_tokens: 16 });
  assert.deepEqual(messagesToChatBody({ ...base, system: "", stop_sequences: [], stream: false }), {
    model: "demo",
    messages: [{ role: "user", content: "Hello" }],
    max_tokens: 16,
  });
});

test("text blocks become text parts, and consecutive turns of one role are joined", () => {
  const body = messagesToChatBody({
    ...base,
    system: [{ type: "text", text: "Be kind.", cache_control: { type: "ephemeral" } }],
    messages: [
      { role: "user", content: "one" },
      { role: "user", content: [{ type: "text", text: "two" }] },
      { role: "assistant", content: "three" },
      { role: "user", content: "four" },
    ],
  });
  assert.deepEqual(body.messages, [
    { role: "system", content: [{ type: "text", text: "Be kind." }] },
    {
      role: "user",
      content: [
        { type: "text", text: "one" },
        { type: "text", text: "two" },
      ],
    },
    { role: "assistant", content: "three" },
    { role: "user", content: "four" },
  ]);
});

test("refusals name the field and say what to send", () => {
  const cases: Array<[unknown, string | null, RegExp]> = [
    [{ model: "demo", messages: base.messages }, "max_tokens", /is required/],
    [{ ...base, max_tokens: 0 }, "max_tokens", /at least 1/],
    [{ ...base, max_tokens: 2.5 }, "max_tokens", /integer/],
    [{ ...base, model: undefined }, "model", /is required/],
    [{ ...base, messages: [] }, "messages", /at least one message/],
    [{ ...base, messages: [{ role: "system", content: "x" }] }, "messages.0.role", /top-level 'system' field/],
    [
      { ...base, messages: [{ role: "user", content: [{ type: "image", source: { type: "base64", data: "" } }] }] },
      "messages.0.content.0.type",
      /type 'image' are not supported yet/,
    ],
    [
      { ...base, messages: [{ role: "user", content: [{ type: "tool_use", id: "t", name: "f", input: {} }] }] },
      "messages.0.content.0.type",
      /type 'tool_use' are not supported yet/,
    ],
    [{ ...base, messages: [{ role: "user", content: [{ type: "text" }] }] }, "messages.0.content.0.text", /is required/],
    [{ ...base, messages: [{ role: "user", content: 42 }] }, "messages.0.content", /string or an array of text blocks/],
    [{ ...base, temperature: 1.5 }, "temperature", /1/],
    [{ ...base, stop_sequences: [""] }, "stop_sequences.0", /must not be empty/],
    [{ ...base, tools: [] }, null, /field 'tools' is not supported by llmgw's \/v1\/messages yet/],
    [{ ...base, stop_sequence: ["x"] }, null, /unknown field 'stop_sequence'; \/v1\/messages takes model, messages, max_tokens/],
  ];
  for (const [body, param, message] of cases) {
    const error = refusal(body);
    assert.equal(error.status, 400, JSON.stringify(body));
    assert.equal(error.param, param, JSON.stringify(body));
    assert.match(error.message, message);
  }
});
