// End to end, as an application uses the bundled engine: `llmgw up --demo` as a child
// process, the official openai client through the gateway to the demo model (random
// weights, so only a grammar makes an answer predictable): structured outputs, tool calls
// (the SDK's stream helper assembling one), embeddings, logprobs, the fields the engine
// refuses, and at the end the usage the gateway recorded, which must add up to what every
// answer said it used.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import OpenAI from "openai";
import { zodFunction, zodResponseFormat } from "openai/helpers/zod";
import { z } from "zod";
import { findFreePort } from "../src/agent/free-port.ts";
import type { CatalogModel } from "../src/catalog/catalog.ts";
import { tokenBound } from "../src/policy/token-bound.ts";
import { eventually } from "./support/eventually.ts";
import { readyLine, startUp } from "./support/up-demo.ts";

describe("the bundled engine's OpenAI surface through llmgw up --demo", { timeout: 300_000 }, () => {
  let dataDir: string;
  let port: number;
  let adminKey: string;
  let client: OpenAI;
  let stop: () => Promise<void>;
  /** What the answers said they used, to compare with the usage the gateway recorded. */
  const used = { prompt_tokens: 0, completion_tokens: 0, requests: 0 };
  const count = (usage: { prompt_tokens: number; completion_tokens?: number } | null | undefined) => {
    assert.ok(usage, "every answer here reports its usage");
    used.prompt_tokens += usage.prompt_tokens;
    used.completion_tokens += usage.completion_tokens ?? 0;
    used.requests += 1;
  };

  before(async () => {
    dataDir = mkdtempSync(path.join(tmpdir(), "llmgw-features-"));
    port = await findFreePort("127.0.0.1");
    const up = await startUp(dataDir, port);
    adminKey = readFileSync(path.join(dataDir, "admin.key"), "utf8").trim();
    client = new OpenAI({ apiKey: adminKey, baseURL: `http://127.0.0.1:${port}/v1`, maxRetries: 0 });
    await readyLine(up.stdout, port);
    stop = async () => {
      up.child.kill("SIGTERM");
      await up.exited;
    };
  });

  after(async () => {
    await stop?.();
    rmSync(dataDir, { recursive: true, force: true });
  });

  // A random model closes a string only by chance: every string is bounded, so the answer
  // ends within max_tokens (the grammar then has to close it).
  const Pet = z.object({ name: z.string().max(8), age: z.number().int(), kind: z.enum(["cat", "dog", "llama"]), vaccinated: z.boolean() });
  const Forecast = z.object({ city: z.string().max(10), days: z.number().int() });
  const forecastTool = zodFunction({ name: "get_forecast", parameters: Forecast, description: "The weather forecast for a city." });
  const ask = [{ role: "user" as const, content: "Describe a pet." }];

  test("structured outputs: chat.completions.parse with a zod schema, json_object, and a schema keyword the grammar cannot enforce", async () => {
    for (const temperature of [0, 1]) {
      const parsed = await client.chat.completions.parse({
        model: "demo",
        messages: ask,
        response_format: zodResponseFormat(Pet, "pet"),
        max_tokens: 400,
        temperature,
        seed: 3,
      });
      count(parsed.usage);
      const choice = parsed.choices[0]!;
      assert.equal(choice.finish_reason, "stop", choice.message.content ?? "");
      assert.ok(choice.message.parsed, `parsed: ${choice.message.content}`);
      Pet.parse(choice.message.parsed);
    }
    const stream = await client.chat.completions.create({
      model: "demo",
      messages: ask,
      response_format: zodResponseFormat(Pet, "pet"),
      max_tokens: 400,
      temperature: 0,
      stream: true,
      stream_options: { include_usage: true },
    });
    let text = "";
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta.content ?? "";
      if (chunk.usage) count(chunk.usage);
    }
    Pet.parse(JSON.parse(text));

    const object = await client.chat.completions.create({
      model: "demo",
      messages: ask,
      response_format: { type: "json_object" },
      max_tokens: 1500,
      temperature: 1,
      seed: 5,
    });
    count(object.usage);
    const value: unknown = JSON.parse(object.choices[0]!.message.content ?? "");
    assert.ok(typeof value === "object" && value !== null && !Array.isArray(value), object.choices[0]!.message.content ?? "");

    await assert.rejects(
      client.chat.completions.create({
        model: "demo",
        messages: ask,
        response_format: {
          type: "json_schema",
          json_schema: { name: "p", schema: { type: "object", properties: { code: { type: "string", pattern: "^[A-Z]+$" } } } },
        },
      }),
      (error: unknown) => {
        assert.ok(error instanceof OpenAI.BadRequestError);
        assert.match(error.message, /pattern/);
        return true;
      },
    );
  });

  /** The prompt bound budgets and rate limits reserve (policy/token-bound.ts) must cover what the engine counted. */
  const assertBoundCovers = (body: Record<string, unknown>, promptTokens: number) => {
    const bound = tokenBound("/v1/chat/completions", body, { id: "demo", name: "demo", definition: {} } as unknown as CatalogModel);
    assert.ok(bound.prompt >= promptTokens, `the reserved prompt bound ${bound.prompt} covers the ${promptTokens} prompt tokens the engine counted`);
  };

  test("tool calls: a required call with arguments valid for its schema, assembled by the SDK's stream helper, and its result fed back", async () => {
    const request = {
      model: "demo",
      messages: ask,
      tools: [forecastTool],
      tool_choice: "required" as const,
      parallel_tool_calls: false,
      max_tokens: 300,
      temperature: 0,
    };
    const answer = await client.chat.completions.create(request);
    count(answer.usage);
    assertBoundCovers(JSON.parse(JSON.stringify(request)), answer.usage!.prompt_tokens);
    // A bare tool: few bytes in the body, and still the whole function-calling preamble in the prompt.
    const bare = {
      model: "demo",
      messages: [{ role: "user" as const, content: "x" }],
      tools: [{ type: "function" as const, function: { name: "f" } }],
      tool_choice: "none" as const,
      max_tokens: 1,
    };
    const bareAnswer = await client.chat.completions.create(bare);
    count(bareAnswer.usage);
    assertBoundCovers(bare, bareAnswer.usage!.prompt_tokens);
    const choice = answer.choices[0]!;
    assert.equal(choice.finish_reason, "tool_calls");
    const call = choice.message.tool_calls?.[0];
    assert.ok(call?.type === "function", JSON.stringify(choice.message));
    assert.equal(call.function.name, "get_forecast");
    Forecast.parse(JSON.parse(call.function.arguments));

    // The SDK's stream helper assembles the call from OpenAI's deltas.
    const runner = client.chat.completions.stream({
      model: "demo",
      messages: ask,
      tools: [forecastTool],
      tool_choice: { type: "function", function: { name: "get_forecast" } },
      parallel_tool_calls: false,
      max_tokens: 300,
      temperature: 0,
      stream_options: { include_usage: true },
    });
    const final = await runner.finalChatCompletion();
    count(final.usage);
    const streamed = final.choices[0]!.message.tool_calls?.[0];
    assert.ok(streamed?.type === "function", JSON.stringify(final.choices[0]));
    assert.equal(streamed.function.name, "get_forecast");
    assert.deepEqual(streamed.function.parsed_arguments, Forecast.parse(JSON.parse(streamed.function.arguments)));
    assert.equal(final.choices[0]!.finish_reason, "tool_calls");

    // The result goes back into the conversation: the prompt grows by it.
    const followUpRequest = {
      model: "demo",
      messages: [
        ...ask,
        { role: "assistant" as const, content: null, tool_calls: [call] },
        { role: "tool" as const, tool_call_id: call.id, content: JSON.stringify({ celsius: 3, sky: "overcast" }) },
      ],
      tools: [forecastTool],
      tool_choice: "none" as const,
      max_tokens: 4,
      temperature: 0,
    };
    const followUp = await client.chat.completions.create(followUpRequest);
    count(followUp.usage);
    assertBoundCovers(JSON.parse(JSON.stringify(followUpRequest)), followUp.usage!.prompt_tokens);
    assert.equal(followUp.choices[0]!.message.tool_calls, undefined);
    assert.ok(followUp.usage!.prompt_tokens > answer.usage!.prompt_tokens, "the call and its result are in the prompt");
  });

  test("embeddings: one unit vector per input, the same for the same input, base64 equal to floats, token arrays accepted", async () => {
    const texts = ["the weather is fine", "a cat on a mat", "the weather is fine"];
    const floats = await client.embeddings.create({ model: "demo", input: texts, encoding_format: "float" });
    count(floats.usage);
    assert.equal(floats.object, "list");
    assert.equal(floats.data.length, 3);
    const dimensions = floats.data[0]!.embedding.length;
    assert.ok(dimensions > 0);
    for (const [index, item] of floats.data.entries()) {
      assert.equal(item.index, index);
      assert.equal(item.embedding.length, dimensions);
      const norm = Math.hypot(...item.embedding);
      assert.ok(Math.abs(norm - 1) < 1e-4, `input ${index} is L2-normalised (norm ${norm})`);
    }
    assert.deepEqual(floats.data[2]!.embedding, floats.data[0]!.embedding, "the same input gives the same vector");
    assert.notDeepEqual(floats.data[1]!.embedding, floats.data[0]!.embedding);
    assert.ok(floats.usage.prompt_tokens >= texts.length, "usage counts the inputs' tokens");

    // The SDK asks for base64 by default and decodes it: the same vectors arrive.
    const decoded = await client.embeddings.create({ model: "demo", input: texts[0]! });
    count(decoded.usage);
    const first = decoded.data[0]!.embedding;
    assert.equal(first.length, dimensions);
    first.forEach((value, index) => {
      assert.ok(Math.abs(value - floats.data[0]!.embedding[index]!) < 1e-6);
    });

    const tokens = await client.embeddings.create({ model: "demo", input: [[1, 2, 3]], encoding_format: "float" });
    count(tokens.usage);
    assert.equal(tokens.data[0]!.embedding.length, dimensions);

    await assert.rejects(client.embeddings.create({ model: "demo", input: "x".repeat(1), dimensions: dimensions + 1 }), (error: unknown) => {
      assert.ok(error instanceof OpenAI.BadRequestError);
      assert.match(error.message, /dimensions/);
      return true;
    });
  });

  test("logprobs: one entry per token, each ≤ 0, top_logprobs sorted and as many as asked, in answers and streams", async () => {
    const answer = await client.chat.completions.create({
      model: "demo",
      messages: [{ role: "user", content: "Hello" }],
      max_tokens: 6,
      temperature: 0,
      logprobs: true,
      top_logprobs: 3,
    });
    count(answer.usage);
    const content = answer.choices[0]!.logprobs?.content;
    assert.ok(content && content.length > 0, "logprobs.content is there");
    assert.ok(content.length <= answer.usage!.completion_tokens);
    // The random weights may pick a byte token that is part of a character: its text is then
    // named "bytes:\\x..", as OpenAI names them, and only the bytes add up to the answer.
    assert.equal(
      Buffer.from(content.flatMap((entry) => entry.bytes ?? [])).toString("utf8"),
      answer.choices[0]!.message.content,
      "the tokens' bytes spell the answer",
    );
    for (const entry of content) {
      assert.ok(entry.logprob <= 0);
      assert.equal(entry.top_logprobs.length, 3);
      const figures = entry.top_logprobs.map((alternative) => alternative.logprob);
      assert.deepEqual(
        figures,
        [...figures].sort((a, b) => b - a),
        "alternatives are sorted, most likely first",
      );
      assert.ok(figures.every((figure) => figure <= 0));
      if (!entry.token.startsWith("bytes:")) assert.deepEqual(entry.bytes, [...Buffer.from(entry.token, "utf8")]);
    }

    const stream = await client.chat.completions.create({
      model: "demo",
      messages: [{ role: "user", content: "Hello" }],
      max_tokens: 6,
      temperature: 0,
      logprobs: true,
      top_logprobs: 2,
      stream: true,
      stream_options: { include_usage: true },
    });
    const streamed: OpenAI.ChatCompletionTokenLogprob[] = [];
    for await (const chunk of stream) {
      streamed.push(...(chunk.choices[0]?.logprobs?.content ?? []));
      if (chunk.usage) count(chunk.usage);
    }
    // Greedy decoding gives the same tokens; the figures agree to float noise (llama.cpp's
    // sums may run in another order from one decode to the next).
    assert.deepEqual(
      streamed.map((entry) => entry.token),
      content.map((entry) => entry.token),
      "a stream carries the same tokens as the answer",
    );
    streamed.forEach((entry, index) => {
      assert.ok(Math.abs(entry.logprob - content[index]!.logprob) < 1e-3, `token ${index}: ${entry.logprob} ≈ ${content[index]!.logprob}`);
    });

    const completion = await client.completions.create({ model: "demo", prompt: "Once upon", max_tokens: 4, temperature: 0, logprobs: 2 });
    count(completion.usage);
    const logprobs = completion.choices[0]!.logprobs!;
    assert.ok(logprobs.tokens!.length > 0);
    assert.equal(logprobs.tokens!.length, completion.usage!.completion_tokens - (completion.choices[0]!.finish_reason === "stop" ? 1 : 0));
    assert.ok(logprobs.token_logprobs!.every((figure) => figure <= 0));
  });

  test("fields the engine cannot honour are refused with a 400 that names them, through the gateway", async () => {
    const refused: Array<[string, Record<string, unknown>]> = [
      ["n", { n: 2 }],
      ["top_logprobs", { top_logprobs: 2 }],
      ["audio", { audio: { voice: "alloy", format: "wav" } }],
      ["prediction", { prediction: { type: "content", content: "x" } }],
      ["reasoning_effort", { reasoning_effort: "high" }],
    ];
    for (const [field, extra] of refused) {
      await assert.rejects(
        client.chat.completions.create({
          model: "demo",
          messages: [{ role: "user", content: "Hi" }],
          max_tokens: 2,
          ...extra,
        } as OpenAI.ChatCompletionCreateParamsNonStreaming),
        (error: unknown) => {
          assert.ok(error instanceof OpenAI.BadRequestError, `${field}: a 400, got ${String(error)}`);
          assert.ok(error.message.includes(field), `${field}: the message names it: ${error.message}`);
          return true;
        },
      );
    }
  });

  test("the usage the gateway recorded adds up to what the answers reported", async () => {
    const usage = async () => {
      const response = await fetch(`http://127.0.0.1:${port}/api/v1/usage?group_by=model&model=demo`, { headers: { authorization: `Bearer ${adminKey}` } });
      assert.equal(response.status, 200);
      return ((await response.json()) as { data: Array<{ requests: number; errors: number; prompt_tokens: number; completion_tokens: number }> }).data[0];
    };
    await eventually("the usage rows to be written", async () => {
      const row = await usage();
      return row !== undefined && row.requests - row.errors >= used.requests;
    });
    const row = (await usage())!;
    assert.equal(row.prompt_tokens, used.prompt_tokens);
    assert.equal(row.completion_tokens, used.completion_tokens);
  });
});
