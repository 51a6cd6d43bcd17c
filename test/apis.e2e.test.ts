// The APIs applications speak besides chat completions, end to end as their users run
// them: `llmgw up --demo` as a child process, driven by the official openai client
// (client.responses: create, stream, previous_response_id, a function-call round trip and
// the Agents-style loop that answers calls until the model answers in text) and by the
// official ollama client (chat, streaming and not, generate, list, show, ps, embed,
// format with a JSON schema, the :latest tag, and the errors it raises). The demo model
// has random weights, so only a grammar (a required tool call, a schema) makes an answer
// predictable; otherwise the tests assert what the APIs promise: counts, shapes, chains.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import OpenAI from "openai";
import { Ollama } from "ollama";
import { z } from "zod";
import { findFreePort } from "../src/agent/free-port.ts";
import { readyLine, startUp } from "./support/up-demo.ts";

// A random model closes a string only by chance: every string is bounded, so the answer
// ends within its token bound (the grammar then has to close it).
const Forecast = z.object({ city: z.string().max(10), days: z.number().int() });
const forecastSchema = {
  type: "object",
  properties: { city: { type: "string", maxLength: 10 }, days: { type: "integer" } },
  required: ["city", "days"],
  additionalProperties: false,
};
const forecastTool = {
  type: "function" as const,
  name: "get_forecast",
  description: "The weather forecast for a city.",
  parameters: forecastSchema,
  strict: true,
};

/** The text of a response's messages (the SDK adds `output_text` to created responses, not to a stream's final one). */
function textOf(response: { output: Array<{ type: string; content?: Array<{ type: string; text?: string }> }> }): string {
  return response.output
    .flatMap((item) => (item.type === "message" ? (item.content ?? []) : []))
    .map((part) => (part.type === "output_text" ? (part.text ?? "") : ""))
    .join("");
}

describe("the Responses and Ollama APIs through llmgw up --demo", { timeout: 300_000 }, () => {
  let dataDir: string;
  let port: number;
  let adminKey: string;
  let client: OpenAI;
  let ollama: Ollama;

  before(async () => {
    dataDir = mkdtempSync(path.join(tmpdir(), "llmgw-apis-"));
    port = await findFreePort("127.0.0.1");
    const up = await startUp(dataDir, port);
    adminKey = readFileSync(path.join(dataDir, "admin.key"), "utf8").trim();
    await readyLine(up.stdout, port);
    client = new OpenAI({ apiKey: adminKey, baseURL: `http://127.0.0.1:${port}/v1`, maxRetries: 0 });
    ollama = new Ollama({ host: `http://127.0.0.1:${port}`, headers: { Authorization: `Bearer ${adminKey}` } });
  });

  after(() => {
    rmSync(dataDir, { recursive: true, force: true });
  });

  test("responses.create, not streamed and streamed, and previous_response_id carrying the conversation", async () => {
    const first = await client.responses.create({ model: "demo", input: "Hello there", max_output_tokens: 6, temperature: 0 });
    assert.equal(first.status, first.usage!.output_tokens < 6 ? "completed" : "incomplete", JSON.stringify(first));
    assert.equal(typeof first.output_text, "string");
    assert.ok(first.usage!.input_tokens > 0);

    // The raw events: the SDK's stream helper takes its final response from response.completed
    // only, and an answer cut at max_output_tokens ends with response.incomplete (as OpenAI's).
    let streamed = "";
    let last: OpenAI.Responses.ResponseStreamEvent | undefined;
    for await (const event of await client.responses.create({ model: "demo", input: "Hello there", max_output_tokens: 6, temperature: 0, stream: true })) {
      if (event.type === "response.output_text.delta") streamed += event.delta;
      last = event;
    }
    assert.ok(last?.type === "response.completed" || last?.type === "response.incomplete", JSON.stringify(last));
    assert.equal(last.response.status, first.status);
    assert.equal(textOf(last.response), streamed);
    assert.equal(streamed, first.output_text, "greedy decoding: the same text streamed or not");
    assert.deepEqual(last.response.usage, first.usage);

    const second = await client.responses.create({ model: "demo", input: "And then?", previous_response_id: first.id, max_output_tokens: 2 });
    assert.equal(second.previous_response_id, first.id);
    assert.ok(
      second.usage!.input_tokens > first.usage!.input_tokens + first.usage!.output_tokens,
      `the first turn and its answer are in the prompt: ${second.usage!.input_tokens} input tokens against ${first.usage!.input_tokens} + ${first.usage!.output_tokens}`,
    );
    const items = await client.responses.inputItems.list(second.id);
    assert.equal(items.data.length, 1, "input_items lists this request's own input");
  });

  test("a function call answered and continued: the Agents-style loop runs until the model answers in text", async () => {
    const calls: Array<z.infer<typeof Forecast>> = [];
    let response = await client.responses.create({
      model: "demo",
      input: "What is the weather in Oslo?",
      tools: [forecastTool],
      tool_choice: "required",
      parallel_tool_calls: false,
      max_output_tokens: 300,
      temperature: 0,
    });
    const firstInput = response.usage!.input_tokens;
    for (let turn = 0; turn < 4; turn += 1) {
      const pending = response.output.filter((item) => item.type === "function_call");
      if (pending.length === 0) break;
      const outputs = pending.map((call) => {
        assert.equal(call.name, "get_forecast");
        const args = Forecast.parse(JSON.parse(call.arguments));
        calls.push(args);
        return { type: "function_call_output" as const, call_id: call.call_id, output: JSON.stringify({ celsius: 3, sky: "overcast", days: args.days }) };
      });
      // Like the Agents SDK: the outputs go back on the kept response; then the model may answer.
      response = await client.responses.create({
        model: "demo",
        previous_response_id: response.id,
        input: outputs,
        tools: [forecastTool],
        tool_choice: "none",
        max_output_tokens: 4,
        temperature: 0,
      });
    }
    assert.equal(calls.length, 1, "one required call, then text");
    assert.ok(!response.output.some((item) => item.type === "function_call"));
    assert.ok(response.usage!.input_tokens > firstInput, "the call and its output are in the prompt of the turn after");

    // Streamed: the SDK assembles the call's arguments from their deltas.
    const stream = client.responses.stream({
      model: "demo",
      input: "Weather in Bergen?",
      tools: [forecastTool],
      tool_choice: { type: "function", name: "get_forecast" },
      parallel_tool_calls: false,
      max_output_tokens: 300,
      temperature: 0,
    });
    let argumentDeltas = 0;
    stream.on("response.function_call_arguments.delta", () => (argumentDeltas += 1));
    const final = await stream.finalResponse();
    const call = final.output.find((item) => item.type === "function_call");
    assert.ok(call?.type === "function_call", JSON.stringify(final.output));
    Forecast.parse(JSON.parse(call.arguments));
    assert.ok(argumentDeltas > 0);
  });

  test("text.format with a JSON schema gives JSON of that schema", async () => {
    const response = await client.responses.create({
      model: "demo",
      input: "Forecast, as JSON.",
      text: { format: { type: "json_schema", name: "forecast", schema: forecastSchema, strict: true } },
      max_output_tokens: 300,
      temperature: 0,
    });
    assert.equal(response.status, "completed", JSON.stringify(response));
    Forecast.parse(JSON.parse(response.output_text));
  });

  test("ollama: list, show, ps and version read the catalog", async () => {
    const listed = await ollama.list();
    assert.ok(
      listed.models.some((model) => model.name === "demo"),
      JSON.stringify(listed),
    );
    const shown = await ollama.show({ model: "demo:latest" });
    assert.ok(shown.capabilities.includes("completion"), JSON.stringify(shown.capabilities));
    const running = await ollama.ps();
    assert.ok(
      running.models.some((model) => model.name === "demo"),
      "the demo model has a ready replica",
    );
    assert.match((await ollama.version()).version, /^\d+\.\d+\.\d+/);
  });

  test("ollama: chat not streamed and streamed agree; generate; num_predict bounds the answer", async () => {
    const options = { num_predict: 5, temperature: 0 };
    const whole = await ollama.chat({ model: "demo", messages: [{ role: "user", content: "Hello there" }], stream: false, options });
    assert.equal(whole.done, true);
    assert.equal(whole.message.role, "assistant");
    assert.equal(whole.eval_count, 5);
    assert.equal(whole.done_reason, "length");
    assert.ok(whole.prompt_eval_count > 0);

    let text = "";
    let last: Awaited<ReturnType<typeof ollama.chat>> | undefined;
    for await (const part of await ollama.chat({ model: "demo:latest", messages: [{ role: "user", content: "Hello there" }], stream: true, options })) {
      text += part.message.content;
      last = part;
    }
    assert.equal(text, whole.message.content, "greedy decoding: the same text streamed or not");
    assert.equal(last?.done, true);
    assert.equal(last?.eval_count, 5);

    const generated = await ollama.generate({ model: "demo", prompt: "Hello there", system: "Be brief.", stream: false, options: { num_predict: 3 } });
    assert.equal(generated.done, true);
    assert.equal(generated.eval_count, 3);
    assert.equal(typeof generated.response, "string");
  });

  test("ollama: format with a JSON schema, and embed", async () => {
    const answer = await ollama.chat({
      model: "demo",
      messages: [{ role: "user", content: "Forecast, as JSON." }],
      format: forecastSchema,
      stream: false,
      options: { num_predict: 300, temperature: 0 },
    });
    Forecast.parse(JSON.parse(answer.message.content));

    const embedded = await ollama.embed({ model: "demo", input: ["the weather is fine", "a cat on a mat"] });
    assert.equal(embedded.embeddings.length, 2);
    assert.ok(embedded.embeddings[0]!.length > 0);
    assert.notDeepEqual(embedded.embeddings[0], embedded.embeddings[1]);
    assert.ok(embedded.prompt_eval_count > 0);
  });

  test("ollama: errors in its shape the client raises: an unknown tag, an option of the wrong type, model management", async () => {
    const refused = async (call: Promise<unknown>, status: number, message: RegExp) => {
      await assert.rejects(call, (error: unknown) => {
        assert.equal((error as { name?: string }).name, "ResponseError", String(error));
        assert.equal((error as { status_code?: number }).status_code, status);
        assert.match((error as Error).message, message);
        return true;
      });
    };
    await refused(ollama.chat({ model: "demo:7b", messages: [{ role: "user", content: "x" }], stream: false }), 404, /demo:7b/);
    await refused(
      ollama.chat({ model: "demo", messages: [{ role: "user", content: "x" }], stream: false, options: { temperature: "warm" as unknown as number } }),
      400,
      /options\.temperature/,
    );
    await refused(ollama.pull({ model: "llama3" }), 501, /ctl model serve/);
    const anonymous = new Ollama({ host: `http://127.0.0.1:${port}` });
    await refused(anonymous.list(), 401, /Authorization: Bearer/);
  });
});
