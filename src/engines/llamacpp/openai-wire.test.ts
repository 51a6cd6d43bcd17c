import { test } from "node:test";
import assert from "node:assert/strict";
import { BadRequestError, parseWith } from "../../core/errors.ts";
import {
  chatChunk,
  chatCompletion,
  chatCompletionRequestSchema,
  completionRequestSchema,
  newIdentity,
  toChatJob,
  toCompletionJob,
  toolCallDelta,
  usage,
} from "./openai-wire.ts";

const chat = (body: unknown) => toChatJob(parseWith(chatCompletionRequestSchema, body));

test("chat bodies become engine-neutral jobs", () => {
  const job = chat({
    model: "m",
    messages: [
      { role: "developer", content: "Be brief." },
      {
        role: "user",
        content: [
          { type: "text", text: "Hello, " },
          { type: "text", text: "there" },
        ],
      },
      { role: "assistant", content: null },
    ],
    max_tokens: 50,
    max_completion_tokens: 7,
    stop: "END",
    seed: -1,
    temperature: 0,
    stream: true,
    stream_options: { include_usage: true },
  });
  assert.deepEqual(job.messages, [
    { role: "system", content: "Be brief." },
    { role: "user", content: "Hello, there" },
    { role: "assistant", content: "" },
  ]);
  // max_completion_tokens wins over the deprecated max_tokens; int64 seeds fold into uint32.
  assert.deepEqual(job.params, { maxTokens: 7, temperature: 0, seed: 0xffffffff, stop: ["END"] });
  assert.equal(job.stream, true);
  assert.equal(job.includeUsage, true);

  const defaults = chat({ messages: [{ role: "user", content: "hi" }], stream_options: { include_usage: true } });
  assert.deepEqual(defaults.params, { temperature: 1, stop: [] });
  assert.equal(defaults.includeUsage, false, "include_usage only applies to streams");
});

test("unsupported or malformed chat fields are 400s naming the field", () => {
  const param = (body: unknown) => {
    try {
      chat(body);
    } catch (error) {
      assert.ok(error instanceof BadRequestError);
      return error.param;
    }
    assert.fail("expected a BadRequestError");
  };
  assert.equal(param({}), "messages");
  assert.equal(param({ messages: [{ role: "function", content: "x" }] }), "messages.0.role");
  assert.equal(param({ messages: [{ role: "tool", content: "x" }] }), "messages.0.tool_call_id");
  assert.equal(param({ messages: [{ role: "user", content: [{ type: "image_url", image_url: { url: "x" } }] }] }), "messages.0.content.0");
  assert.equal(param({ messages: [{ role: "user", content: [{ type: "text" }] }] }), "messages.0.content.0.text");
  assert.equal(param({ messages: [{ role: "user", content: null }] }), "messages.0.content");
  assert.equal(param({ messages: [{ role: "user", content: "x" }], stop: ["a", "b", "c", "d", "e"] }), "stop");
  assert.equal(param({ messages: [{ role: "user", content: "x" }], max_tokens: 0 }), "max_tokens");
  assert.equal(param({ messages: [{ role: "user", content: "x" }], tools: [{ type: "function" }] }), "tools.0.function");
});

test("the bundled engine refuses image and other non-text parts with a 400 that says what is missing, instead of dropping them", () => {
  const refusal = (part: unknown) => {
    try {
      chat({ messages: [{ role: "user", content: [{ type: "text", text: "What is this?" }, part] }] });
    } catch (error) {
      assert.ok(error instanceof BadRequestError);
      return { code: error.code, param: error.param, message: error.message };
    }
    assert.fail("expected a BadRequestError");
  };
  const image = refusal({ type: "image_url", image_url: { url: "data:image/png;base64,iVBORw0KGgo=" } });
  assert.equal(image.code, "engine_has_no_vision");
  assert.equal(image.param, "messages.0.content.1");
  assert.match(image.message, /takes no image input.*vision projector.*llama-server/);
  const audio = refusal({ type: "input_audio", input_audio: { data: "AAAA", format: "wav" } });
  assert.equal(audio.code, "unsupported_content_part");
  assert.match(audio.message, /'input_audio'/);
});

test("completion prompts: a string, one string in an array, or token ids; 16 tokens by default", () => {
  const job = (prompt: unknown) => toCompletionJob(parseWith(completionRequestSchema, { prompt }));
  assert.equal(job("abc").prompt, "abc");
  assert.equal(job(["abc"]).prompt, "abc");
  assert.deepEqual(job([1, 2, 3]).prompt, [1, 2, 3]);
  assert.equal(job("abc").params.maxTokens, 16);
  assert.throws(() => job(["a", "b"]), BadRequestError);
  assert.throws(() => job(42), BadRequestError);
});

test("stream chunks: usage null only with include_usage", () => {
  const identity = newIdentity("chat", "m", () => 1_700_000_000_500);
  assert.match(identity.id, /^chatcmpl-[0-9a-f]{24}$/);
  assert.equal(identity.created, 1_700_000_000);
  const withUsage = chatChunk(identity, { delta: { content: "x" }, finishReason: null }, true);
  assert.equal((withUsage as { usage?: unknown }).usage, null);
  const without = chatChunk(identity, { delta: { content: "x" }, finishReason: null }, false);
  assert.equal("usage" in without, false);
  const last = chatChunk(identity, { usage: usage(3, 4) }, true);
  assert.deepEqual(last.choices, []);
  assert.deepEqual((last as { usage: unknown }).usage, { prompt_tokens: 3, completion_tokens: 4, total_tokens: 7 });
});

test("sampling fields and logprobs normalise into generation parameters", () => {
  const job = chat({
    messages: [{ role: "user", content: "x" }],
    top_k: 5,
    min_p: 0.1,
    repeat_penalty: 1.3,
    logit_bias: { "12": -100, "7": 2.5 },
    logprobs: true,
    top_logprobs: 4,
  });
  assert.deepEqual(job.params, {
    temperature: 1,
    stop: [],
    topK: 5,
    minP: 0.1,
    repeatPenalty: 1.3,
    logitBias: [
      [7, 2.5],
      [12, -100],
    ],
    logprobs: { top: 4 },
  });
  // logprobs alone: the sampled token, no alternatives; completions count alternatives.
  assert.deepEqual(chat({ messages: [{ role: "user", content: "x" }], logprobs: true }).params.logprobs, { top: 0 });
  assert.equal(chat({ messages: [{ role: "user", content: "x" }], logprobs: false }).params.logprobs, undefined);
  assert.deepEqual(toCompletionJob(parseWith(completionRequestSchema, { prompt: "p", logprobs: 3 })).params.logprobs, { top: 3 });
  assert.throws(
    () => chat({ messages: [{ role: "user", content: "x" }], logit_bias: { a: 1 } }),
    (error: unknown) => error instanceof BadRequestError && error.param === "logit_bias.a",
  );
  assert.throws(
    () => chat({ messages: [{ role: "user", content: "x" }], logit_bias: { "1": 101 } }),
    (error: unknown) => error instanceof BadRequestError && error.param === "logit_bias.1",
  );
});

test("tool calls and tool results in the history; answers with tool calls have content null", () => {
  const job = chat({
    messages: [
      { role: "user", content: "weather?" },
      { role: "assistant", content: null, tool_calls: [{ id: "call_1", type: "function", function: { name: "w", arguments: '{"c":"x"}' } }] },
      { role: "tool", tool_call_id: "call_1", content: "sunny" },
    ],
    tools: [{ type: "function", function: { name: "w", parameters: { type: "object", properties: { c: { type: "string" } } } } }],
  });
  assert.deepEqual(job.messages.slice(1), [
    { role: "assistant", content: "", toolCalls: [{ id: "call_1", name: "w", arguments: '{"c":"x"}' }] },
    { role: "tool", content: "sunny", toolCallId: "call_1" },
  ]);
  assert.deepEqual(
    job.structure.tools?.callable.map((f) => f.name),
    ["w"],
  );

  const identity = newIdentity("chat", "m", () => 0);
  const answer = chatCompletion(identity, {
    text: "",
    toolCalls: [{ id: "call_2", name: "w", arguments: "{}" }],
    finishReason: "tool_calls",
    usage: usage(1, 2),
  });
  assert.deepEqual(answer.choices[0]?.message, {
    role: "assistant",
    content: null,
    refusal: null,
    tool_calls: [{ id: "call_2", type: "function", function: { name: "w", arguments: "{}" } }],
  });
  assert.equal(answer.choices[0]?.finish_reason, "tool_calls");
  assert.deepEqual(chatChunk(identity, { delta: toolCallDelta({ index: 0, id: "call_2", name: "w" }), finishReason: null }, false).choices[0]?.delta, {
    tool_calls: [{ index: 0, id: "call_2", type: "function", function: { name: "w", arguments: "" } }],
  });
});
