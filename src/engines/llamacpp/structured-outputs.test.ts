// Structured outputs and tool calls on the bundled engine, over HTTP with the official
// openai client, on a generated tiny model with random weights: whatever such a model
// "wants", the grammar makes the answer parse and satisfy the schema, and a forced tool
// call is a valid call. Answers are checked with zod against the schema that was sent.
// Greedy decoding (temperature 0) keeps each answer the same from run to run.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { AddressInfo } from "node:net";
import OpenAI from "openai";
import { zodFunction, zodResponseFormat } from "openai/helpers/zod";
import { z } from "zod";
import { silentLogger } from "../../core/log.ts";
import { GGUFValueType, writeTinyLlamaGguf } from "../../gguf/tiny-model.ts";
import { createEngineServer, type EngineServer } from "./engine-server.ts";
import { LlamaRunner } from "./llama-runner.ts";

const MODEL = "tiny-struct";
let dir: string;
let runner: LlamaRunner;
let server: EngineServer;
let client: OpenAI;

before(async () => {
  dir = await mkdtemp(join(tmpdir(), "llmgw-struct-"));
  const model = await writeTinyLlamaGguf({ path: join(dir, "tiny.gguf"), seed: 5 });
  runner = await LlamaRunner.load({ modelPath: model.path, contextSize: 4096, parallel: 1, threads: 1, logger: silentLogger() });
  server = createEngineServer({ key: "k", modelName: MODEL, logger: silentLogger() });
  server.setGenerator(runner);
  const address: AddressInfo = await server.listen("127.0.0.1", 0);
  client = new OpenAI({ baseURL: `http://127.0.0.1:${address.port}/v1`, apiKey: "k", maxRetries: 0, timeout: 60_000 });
});

after(async () => {
  await server?.shutdown(1000);
  await runner?.dispose();
  await rm(dir, { recursive: true, force: true });
});

const ask = [{ role: "user" as const, content: "Describe a tiny llama as JSON." }];

// Bounded strings, enums, integers and booleans: a random model closes a string only by
// chance, so every string has a maxLength for the answer to end within max_tokens.
const Llama = z.object({
  name: z.string().max(8),
  age: z.number().int(),
  cute: z.boolean(),
  colour: z.enum(["white", "brown", "black"]),
  friends: z.array(z.object({ id: z.number().int(), nickname: z.string().max(4).nullable() })).max(2),
  weight: z.number(),
});

const WeatherArgs = z.object({ city: z.string().max(10), days: z.number().int(), unit: z.enum(["c", "f"]) });
const weatherTool = zodFunction({ name: "get_weather", parameters: WeatherArgs, description: "Weather forecast for a city." });
const pingTool = {
  type: "function" as const,
  function: { name: "ping", description: "Checks the connection.", parameters: { type: "object", properties: {} } },
};

test("json_schema: chat.completions.parse gets an answer that satisfies the zod schema, stream and not", async () => {
  for (const temperature of [0, 1]) {
    const parsed = await client.chat.completions.parse({
      model: MODEL,
      messages: ask,
      response_format: zodResponseFormat(Llama, "llama"),
      max_tokens: 400,
      temperature,
      seed: 7,
    });
    const choice = parsed.choices[0];
    assert.equal(choice?.finish_reason, "stop", choice?.message.content ?? "");
    assert.ok(choice?.message.parsed, "parsed against the schema");
    Llama.parse(choice.message.parsed);
  }

  const stream = await client.chat.completions.create({
    model: MODEL,
    messages: ask,
    response_format: zodResponseFormat(Llama, "llama"),
    max_tokens: 400,
    temperature: 0,
    stream: true,
  });
  let text = "";
  let finish: string | null | undefined;
  for await (const chunk of stream) {
    text += chunk.choices[0]?.delta.content ?? "";
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  assert.equal(finish, "stop");
  Llama.parse(JSON.parse(text));
  const again = await client.chat.completions.create({
    model: MODEL,
    messages: ask,
    response_format: zodResponseFormat(Llama, "llama"),
    max_tokens: 400,
    temperature: 0,
  });
  assert.equal(again.choices[0]?.message.content, text, "the stream carries the same answer");
});

test("json_object: the answer is a JSON object, stream and not", async () => {
  for (const seed of [1, 2]) {
    const answer = await client.chat.completions.create({
      model: MODEL,
      messages: ask,
      response_format: { type: "json_object" },
      max_tokens: 1500,
      temperature: 1,
      seed,
    });
    assert.equal(answer.choices[0]?.finish_reason, "stop");
    const value: unknown = JSON.parse(answer.choices[0]?.message.content ?? "");
    assert.ok(typeof value === "object" && value !== null && !Array.isArray(value), answer.choices[0]?.message.content ?? "");
  }
  const stream = await client.chat.completions.create({
    model: MODEL,
    messages: ask,
    response_format: { type: "json_object" },
    max_tokens: 1500,
    temperature: 1,
    seed: 3,
    stream: true,
  });
  let text = "";
  for await (const chunk of stream) text += chunk.choices[0]?.delta.content ?? "";
  const value: unknown = JSON.parse(text);
  assert.ok(typeof value === "object" && value !== null && !Array.isArray(value), text);
  const nonStream = await client.chat.completions.create({
    model: MODEL,
    messages: ask,
    response_format: { type: "json_object" },
    max_tokens: 1500,
    temperature: 1,
    seed: 3,
  });
  assert.equal(text, nonStream.choices[0]?.message.content, "the stream carries the same answer, to the last character");
});

/** The text the logprob entries spell, from their bytes. */
function spelled(entries: ReadonlyArray<{ bytes: number[] | null }>): string {
  return Buffer.from(entries.flatMap((entry) => entry.bytes ?? [])).toString("utf8");
}

test("logprobs under a json_schema grammar: entries spell the answer, stream chunks their delta, and top_logprobs hold only tokens the grammar allows", async () => {
  const schema = {
    type: "object",
    properties: { name: { type: "string", maxLength: 8 }, n: { type: "integer" }, ok: { type: "boolean" } },
    required: ["name", "n", "ok"],
    additionalProperties: false,
  };
  const request = {
    model: MODEL,
    messages: ask,
    max_tokens: 100,
    temperature: 0,
    logprobs: true,
    top_logprobs: 3,
    response_format: { type: "json_schema" as const, json_schema: { name: "x", schema } },
  };
  const answer = await client.chat.completions.create(request);
  const choice = answer.choices[0];
  assert.equal(choice?.finish_reason, "stop");
  const content = choice?.logprobs?.content ?? [];
  assert.ok(content.length > 0);
  assert.equal(spelled(content), choice?.message.content);
  JSON.parse(choice?.message.content ?? "");
  let cut = 0;
  for (const entry of content) {
    // Tokens the grammar forbids have no probability: they are no alternatives (no -9999 filler).
    for (const alternative of entry.top_logprobs)
      assert.ok(alternative.logprob > -9999 && alternative.logprob <= 0, `${JSON.stringify(entry.token)}: ${JSON.stringify(entry.top_logprobs)}`);
    // Greedy: the answer's token is the likeliest allowed one, first among its alternatives.
    assert.equal(entry.top_logprobs[0]?.token, entry.token);
    assert.equal(entry.top_logprobs[0]?.logprob, entry.logprob);
    if (entry.top_logprobs.length < 3) cut += 1;
  }
  assert.ok(cut > 0, "where the grammar leaves fewer than 3 tokens, the list is shorter");
  assert.ok(
    content.some((entry) => entry.logprob === 0),
    "a token the grammar forces has logprob 0",
  );

  const stream = await client.chat.completions.create({ ...request, stream: true });
  const streamed: typeof content = [];
  let text = "";
  for await (const chunk of stream) {
    const delta = chunk.choices[0]?.delta.content ?? "";
    const entries = chunk.choices[0]?.logprobs?.content ?? [];
    assert.equal(spelled(entries), delta, `chunk ${JSON.stringify(delta)}`);
    text += delta;
    streamed.push(...entries);
  }
  assert.equal(text, choice?.message.content);
  assert.deepEqual(
    streamed.map((entry) => entry.token),
    content.map((entry) => entry.token),
  );
});

test("logprobs with a forced tool call: the answer's logprobs content is empty, and the stream's tool-call chunks carry logprobs null", async () => {
  const request = { model: MODEL, messages: ask, max_tokens: 300, temperature: 0, logprobs: true, tools: [weatherTool], tool_choice: "required" as const };
  const answer = await client.chat.completions.create(request);
  const choice = answer.choices[0];
  assert.equal(choice?.finish_reason, "tool_calls");
  assert.deepEqual(choice?.logprobs, { content: [], refusal: null });
  const call = choice?.message.tool_calls?.[0];
  assert.ok(call?.type === "function");
  WeatherArgs.parse(JSON.parse(call.function.arguments));

  const stream = await client.chat.completions.create({ ...request, stream: true, stream_options: { include_usage: true } });
  const order: string[] = [];
  let args = "";
  for await (const chunk of stream) {
    const only = chunk.choices[0];
    if (!only) {
      order.push("usage");
      continue;
    }
    for (const delta of only.delta.tool_calls ?? []) {
      assert.equal(only.logprobs ?? null, null, "a tool-call chunk has no logprobs");
      order.push(delta.id !== undefined ? "call" : "arguments");
      args += delta.function?.arguments ?? "";
    }
    if (only.finish_reason) order.push(only.finish_reason);
  }
  assert.equal(order[0], "call");
  assert.deepEqual(order.slice(-2), ["tool_calls", "usage"]);
  assert.ok(order.slice(1, -2).every((step) => step === "arguments") && order.length > 4, order.join(" "));
  assert.equal(args, call.function.arguments);
});

test("a schema keyword the grammar cannot enforce is a 400 naming it and its path", async () => {
  const refused = client.chat.completions.create({
    model: MODEL,
    messages: ask,
    response_format: {
      type: "json_schema",
      json_schema: { name: "p", schema: { type: "object", properties: { age: { type: "string", pattern: "^[0-9]+$" } } } },
    },
  });
  await assert.rejects(refused, (error: unknown) => {
    assert.ok(error instanceof OpenAI.BadRequestError);
    assert.equal(error.param, "response_format.json_schema.schema.properties.age.pattern");
    assert.match(error.message, /response_format\.json_schema\.schema\.properties\.age.*keyword 'pattern' is not supported/);
    return true;
  });
  // Within the bounds the translation checks, but more than llama.cpp repeats a string
  // character rule: its refusal is the schema's fault, a 400, and the engine goes on.
  const tooLong = client.chat.completions.create({
    model: MODEL,
    messages: ask,
    response_format: { type: "json_schema", json_schema: { name: "p", schema: { type: "object", properties: { text: { type: "string", minLength: 2000 } } } } },
  });
  await assert.rejects(tooLong, (error: unknown) => {
    assert.ok(error instanceof OpenAI.BadRequestError, String(error));
    assert.equal(error.param, "response_format.json_schema.schema");
    assert.match(error.message, /could not build a grammar/);
    return true;
  });
  const after = await client.chat.completions.create({
    model: MODEL,
    messages: ask,
    response_format: { type: "json_object" },
    max_tokens: 1500,
    temperature: 1,
    seed: 1,
  });
  assert.equal(after.choices[0]?.finish_reason, "stop");
});

test("tool_choice required: a valid call with finish_reason tool_calls, stream deltas assemble into the same call shape", async () => {
  for (const seed of [1, 2, 3]) {
    const answer = await client.chat.completions.create({
      model: MODEL,
      messages: ask,
      tools: [weatherTool, pingTool],
      tool_choice: "required",
      max_tokens: 300,
      temperature: 1,
      seed,
    });
    const choice = answer.choices[0];
    assert.equal(choice?.finish_reason, "tool_calls");
    assert.equal(choice?.message.content, null);
    const call = choice?.message.tool_calls?.[0];
    assert.ok(call && call.type === "function", JSON.stringify(choice?.message));
    assert.match(call.id, /^call_/);
    if (call.function.name === "get_weather") WeatherArgs.parse(JSON.parse(call.function.arguments));
    else assert.deepEqual(JSON.parse(call.function.arguments), {});
    assert.ok((answer.usage?.completion_tokens ?? 0) > 0);
  }

  const stream = await client.chat.completions.create({
    model: MODEL,
    messages: ask,
    tools: [weatherTool],
    tool_choice: "required",
    max_tokens: 300,
    temperature: 0,
    stream: true,
    stream_options: { include_usage: true },
  });
  const calls: Array<{ id: string; name: string; arguments: string }> = [];
  let argumentDeltas = 0;
  let finish: string | null | undefined;
  let completionTokens: number | undefined;
  for await (const chunk of stream) {
    for (const delta of chunk.choices[0]?.delta.tool_calls ?? []) {
      if (delta.id !== undefined) {
        // The first delta of a call: index, id, type, name and empty arguments.
        assert.equal(delta.index, calls.length);
        assert.equal(delta.type, "function");
        assert.equal(delta.function?.arguments, "");
        calls.push({ id: delta.id, name: delta.function?.name ?? "", arguments: "" });
      } else {
        (calls[delta.index] as { arguments: string }).arguments += delta.function?.arguments ?? "";
        argumentDeltas += 1;
      }
    }
    finish = chunk.choices[0]?.finish_reason ?? finish;
    completionTokens = chunk.usage?.completion_tokens ?? completionTokens;
  }
  assert.equal(finish, "tool_calls");
  assert.equal(calls.length, 1);
  assert.equal(calls[0]?.name, "get_weather");
  assert.ok(argumentDeltas > 1, "arguments arrive in pieces");
  WeatherArgs.parse(JSON.parse(calls[0]?.arguments ?? ""));
  const whole = await client.chat.completions.create({
    model: MODEL,
    messages: ask,
    tools: [weatherTool],
    tool_choice: "required",
    max_tokens: 300,
    temperature: 0,
  });
  assert.equal(
    whole.choices[0]?.message.tool_calls?.[0]?.type === "function" ? whole.choices[0].message.tool_calls[0].function.arguments : "",
    calls[0]?.arguments,
  );
  assert.equal(whole.usage?.completion_tokens, completionTokens, "the stream's usage counts the same tokens");
});

test("a tool call cut off by max_tokens: stream and non-stream both carry it, with the arguments made so far and finish_reason length", async () => {
  const request = { model: MODEL, messages: ask, tools: [weatherTool], tool_choice: "required" as const, max_tokens: 20, temperature: 0 };
  const whole = await client.chat.completions.create(request);
  const choice = whole.choices[0];
  assert.equal(choice?.finish_reason, "length");
  const call = choice?.message.tool_calls?.[0];
  assert.ok(call?.type === "function", JSON.stringify(choice?.message));
  assert.equal(call.function.name, "get_weather");
  assert.ok(call.function.arguments.startsWith("{"), call.function.arguments);
  assert.throws(() => JSON.parse(call.function.arguments), "the arguments are cut off");

  const stream = await client.chat.completions.create({ ...request, stream: true });
  const calls: Array<{ name: string; arguments: string }> = [];
  let finish: string | null | undefined;
  for await (const chunk of stream) {
    for (const delta of chunk.choices[0]?.delta.tool_calls ?? []) {
      if (delta.id !== undefined) calls.push({ name: delta.function?.name ?? "", arguments: "" });
      else (calls[delta.index] as { arguments: string }).arguments += delta.function?.arguments ?? "";
    }
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  assert.equal(finish, "length");
  assert.deepEqual(calls, [{ name: call.function.name, arguments: call.function.arguments }]);
});

test("a named tool_choice calls that function", async () => {
  for (const name of ["ping", "get_weather"]) {
    const answer = await client.chat.completions.create({
      model: MODEL,
      messages: ask,
      tools: [weatherTool, pingTool],
      tool_choice: { type: "function", function: { name } },
      max_tokens: 300,
      temperature: 0,
    });
    const call = answer.choices[0]?.message.tool_calls?.[0];
    assert.ok(call?.type === "function");
    assert.equal(call.function.name, name);
    assert.equal(answer.choices[0]?.finish_reason, "tool_calls");
  }
});

test("tool results go back into the conversation: the prompt holds them", async () => {
  const first = await client.chat.completions.create({
    model: MODEL,
    messages: ask,
    tools: [weatherTool],
    tool_choice: "required",
    max_tokens: 300,
    temperature: 0,
  });
  const assistant = first.choices[0]?.message;
  const call = assistant?.tool_calls?.[0];
  assert.ok(assistant && call);
  const withResult = (result: string) =>
    client.chat.completions.create({
      model: MODEL,
      messages: [
        ...ask,
        { role: "assistant", content: null, tool_calls: assistant.tool_calls ?? [] },
        { role: "tool", tool_call_id: call.id, content: result },
      ],
      tools: [weatherTool],
      max_tokens: 5,
      temperature: 0,
    });
  const short = await withResult('{"temp": 3}');
  const long = await withResult('{"temp": 3, "sky": "clear with a few clouds over the mountains"}');
  const prompt = (answer: { usage?: { prompt_tokens: number } | null | undefined }) => answer.usage?.prompt_tokens ?? 0;
  assert.ok(prompt(short) > prompt(first), `the call and its result are in the prompt: ${prompt(short)} > ${prompt(first)}`);
  assert.ok(prompt(long) > prompt(short), `a longer result makes a longer prompt: ${prompt(long)} > ${prompt(short)}`);

  const orphan = client.chat.completions.create({ model: MODEL, messages: [...ask, { role: "tool", tool_call_id: "call_x", content: "1" }], max_tokens: 5 });
  await assert.rejects(orphan, (error: unknown) => error instanceof OpenAI.BadRequestError && error.param === "messages.1.tool_call_id");
  const unanswered = client.chat.completions.create({
    model: MODEL,
    messages: [...ask, { role: "assistant", content: null, tool_calls: assistant.tool_calls ?? [] }],
    max_tokens: 5,
  });
  await assert.rejects(unanswered, (error: unknown) => error instanceof OpenAI.BadRequestError && /has no tool message/.test(error.message));
});

test("a second tool message for the same tool_call_id is a 400 naming it", async () => {
  const call = { id: "call_1", type: "function" as const, function: { name: "get_weather", arguments: '{"city":"Oslo","days":1,"unit":"c"}' } };
  const messages = [
    ...ask,
    { role: "assistant" as const, content: null, tool_calls: [call] },
    { role: "tool" as const, tool_call_id: "call_1", content: "sunny" },
  ];
  const once = await client.chat.completions.create({ model: MODEL, messages, tools: [weatherTool], max_tokens: 1, temperature: 0 });
  assert.ok((once.usage?.prompt_tokens ?? 0) > 0);
  const twice = client.chat.completions.create({
    model: MODEL,
    messages: [...messages, { role: "tool", tool_call_id: "call_1", content: "again" }],
    tools: [weatherTool],
    max_tokens: 1,
  });
  await assert.rejects(twice, (error: unknown) => {
    assert.ok(error instanceof OpenAI.BadRequestError, String(error));
    assert.equal(error.param, "messages.3.tool_call_id");
    assert.match(error.message, /'call_1' already has its result/);
    return true;
  });
});

test("tool_choice none answers in text with no tool calls, with the tools still in the prompt", async () => {
  const answer = await client.chat.completions.create({
    model: MODEL,
    messages: ask,
    tools: [weatherTool],
    tool_choice: "none",
    max_tokens: 20,
    temperature: 0,
  });
  assert.equal(answer.choices[0]?.message.tool_calls, undefined);
  assert.notEqual(answer.choices[0]?.finish_reason, "tool_calls");
  assert.equal(typeof answer.choices[0]?.message.content, "string");
  const auto = await client.chat.completions.create({ model: MODEL, messages: ask, tools: [weatherTool], max_tokens: 1, temperature: 0 });
  const bare = await client.chat.completions.create({ model: MODEL, messages: ask, max_tokens: 1, temperature: 0 });
  assert.equal(answer.usage?.prompt_tokens, auto.usage?.prompt_tokens);
  assert.ok((answer.usage?.prompt_tokens ?? 0) > (bare.usage?.prompt_tokens ?? 0));
});

test("bad tool definitions are 400s naming the field", async () => {
  const cases: Array<[Record<string, unknown>, string]> = [
    [{ tools: [pingTool, pingTool] }, "tools.1.function.name"],
    [{ tools: [{ type: "function", function: { name: "bad name" } }] }, "tools.0.function.name"],
    [
      { tools: [{ type: "function", function: { name: "f", parameters: { type: "object", properties: { n: { type: "integer", minimum: 1 } } } } }] },
      "tools.0.function.parameters.properties.n.minimum",
    ],
    [{ tools: [pingTool], tool_choice: { type: "function", function: { name: "nope" } } }, "tool_choice.function.name"],
  ];
  for (const [extra, param] of cases) {
    const refused = client.chat.completions.create({ model: MODEL, messages: ask, max_tokens: 5, ...extra } as never);
    await assert.rejects(refused, (error: unknown) => {
      assert.ok(error instanceof OpenAI.BadRequestError, String(error));
      assert.equal(error.param, param);
      return true;
    });
  }
});

test("a tool whose parameter grammar llama.cpp refuses is a 400 naming the tool, before any stream starts, whatever tool_choice says", async () => {
  // Within the bounds the translation checks, but more than llama.cpp repeats a string
  // character rule; LlamaChat would compile it only once the model calls the tool.
  const long = {
    type: "function" as const,
    function: { name: "essay", parameters: { type: "object", properties: { text: { type: "string", minLength: 2000 } } } },
  };
  for (const [choice, stream] of [
    ["auto", false],
    ["required", false],
    ["required", true],
    [{ type: "function", function: { name: "essay" } }, true],
  ] as const) {
    const refused = client.chat.completions.create({
      model: MODEL,
      messages: ask,
      tools: [pingTool, long],
      tool_choice: choice,
      max_tokens: 5,
      stream,
    } as never);
    await assert.rejects(refused, (error: unknown) => {
      assert.ok(error instanceof OpenAI.BadRequestError, `${JSON.stringify(choice)} stream ${stream}: ${String(error)}`);
      assert.equal(error.param, "tools.1.function.parameters");
      assert.match(error.message, /could not build a grammar for the parameters of 'essay'/);
      return true;
    });
  }
  // tool_choice none: the tool cannot be called, so its grammar is never built.
  const none = await client.chat.completions.create({ model: MODEL, messages: ask, tools: [long], tool_choice: "none", max_tokens: 2, temperature: 0 });
  assert.equal(none.choices[0]?.message.tool_calls, undefined);

  // A U+0000 cuts llama.cpp's grammar text short: refused by the translation, naming the keyword.
  const nul: Array<[Record<string, unknown>, string, string]> = [
    [{ e: { enum: ["a\u0000b"] } }, "tools.0.function.parameters.properties.e.enum", "'enum'"],
    [{ c: { const: "\u0000" } }, "tools.0.function.parameters.properties.c.const", "'const'"],
    [{ "a\u0000": { type: "string" } }, "tools.0.function.parameters.properties", "'properties'"],
  ];
  for (const [properties, param, keyword] of nul) {
    for (const stream of [false, true]) {
      const tool = { type: "function" as const, function: { name: "f", parameters: { type: "object", properties } } };
      const refused = client.chat.completions.create({ model: MODEL, messages: ask, tools: [tool], tool_choice: "required", max_tokens: 5, stream } as never);
      await assert.rejects(refused, (error: unknown) => {
        assert.ok(error instanceof OpenAI.BadRequestError, String(error));
        assert.equal(error.param, param);
        assert.ok(error.message.includes(keyword) && error.message.includes("U+0000"), error.message);
        return true;
      });
    }
  }
  // The engine goes on: a valid forced call still comes back.
  const after = await client.chat.completions.create({
    model: MODEL,
    messages: ask,
    tools: [weatherTool],
    tool_choice: "required",
    max_tokens: 300,
    temperature: 0,
  });
  assert.equal(after.choices[0]?.finish_reason, "tool_calls");
});

// A Hermes-style template (the shape Qwen 2.5 and Hermes models ship) that defines tool
// use: tools in the system turn, calls as <tool_call> JSON, results as <tool_response>.
const TOOL_TEMPLATE =
  "{%- if tools %}<|im_start|>system\n# Tools\n\nFunction signatures are within <tools></tools>:\n<tools>{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>\n\n" +
  'For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n{% endif %}' +
  "{%- for message in messages %}" +
  "{%- if message.role == 'user' or message.role == 'system' or (message.role == 'assistant' and not message.tool_calls) %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}" +
  "{%- elif message.role == 'assistant' %}{{- '<|im_start|>assistant' }}{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}" +
  "{%- for tool_call in message.tool_calls %}{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}" +
  "{{- '\\n<tool_call>\\n{\"name\": \"' }}{{- tool_call.name }}{{- '\", \"arguments\": ' }}{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}" +
  "{%- elif message.role == 'tool' %}{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}" +
  "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}" +
  "{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

test("a model whose own template defines tool use gets its calls in that template's syntax, and their results back", async () => {
  const model = await writeTinyLlamaGguf({
    path: join(dir, "tools.gguf"),
    seed: 5,
    extraMetadata: { "tokenizer.chat_template": { value: TOOL_TEMPLATE, type: GGUFValueType.STRING } },
  });
  const own = await LlamaRunner.load({ modelPath: model.path, contextSize: 4096, parallel: 1, threads: 1, logger: silentLogger() });
  const ownServer = createEngineServer({ key: "k", modelName: MODEL, logger: silentLogger() });
  ownServer.setGenerator(own);
  try {
    // node-llama-cpp renders this template itself (not its ChatML wrapper) and reads the
    // call syntax out of it.
    assert.equal(own.chatWrapperName, "JinjaTemplate");
    const address: AddressInfo = await ownServer.listen("127.0.0.1", 0);
    const ownClient = new OpenAI({ baseURL: `http://127.0.0.1:${address.port}/v1`, apiKey: "k", maxRetries: 0, timeout: 60_000 });
    const first = await ownClient.chat.completions.create({
      model: MODEL,
      messages: ask,
      tools: [weatherTool],
      tool_choice: "required",
      parallel_tool_calls: false,
      max_tokens: 300,
      temperature: 0,
    });
    const calls = first.choices[0]?.message.tool_calls ?? [];
    assert.equal(calls.length, 1, "parallel_tool_calls false: one call");
    const call = calls[0];
    assert.ok(call?.type === "function");
    WeatherArgs.parse(JSON.parse(call.function.arguments));
    assert.equal(first.choices[0]?.finish_reason, "tool_calls");
    const fed = await ownClient.chat.completions.create({
      model: MODEL,
      messages: [...ask, { role: "assistant", content: null, tool_calls: calls }, { role: "tool", tool_call_id: call.id, content: "sunny" }],
      tools: [weatherTool],
      max_tokens: 3,
      temperature: 0,
    });
    assert.ok((fed.usage?.prompt_tokens ?? 0) > (first.usage?.prompt_tokens ?? 0), `${fed.usage?.prompt_tokens} > ${first.usage?.prompt_tokens}`);
  } finally {
    await ownServer.shutdown(1000);
    await own.dispose();
  }
});
