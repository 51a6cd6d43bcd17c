// The Responses API's translations without a server: a request into the chat body every
// engine takes (and each bad input refused with its field named), a chat completion into
// a response object, and a chat stream into OpenAI's event sequence chunk by chunk.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { BadRequestError } from "../../core/errors.ts";
import type { StoredResponse } from "./response-store.ts";
import type { ResponseObject } from "./response-types.ts";
import { ResponsesAnswer, ResponsesStream, type ResponseTarget } from "./responses-answer.ts";
import { inputItems, parseResponsesRequest, toChatBody } from "./responses-request.ts";
import { echoOf } from "./responses-wire.ts";

function translate(json: unknown, chain: StoredResponse[] = []) {
  const request = parseResponsesRequest(json);
  return toChatBody(request, chain, inputItems(request));
}

function refusal(json: unknown): { message: string; param: string | null } {
  try {
    translate(json);
  } catch (error) {
    assert.ok(error instanceof BadRequestError, String(error));
    return { message: error.message, param: error.param };
  }
  assert.fail("the request was accepted");
}

describe("a Responses request as a chat completion", () => {
  test("instructions, sampling, tools, tool_choice, text.format and a stream's usage", () => {
    const body = translate({
      model: "demo",
      instructions: "Be brief.",
      input: "Weather in Oslo?",
      max_output_tokens: 64,
      temperature: 0.2,
      top_p: 0.9,
      user: "u-1",
      stream: true,
      parallel_tool_calls: false,
      tools: [{ type: "function", name: "get_forecast", description: "Forecast", parameters: { type: "object", properties: {} }, strict: true }],
      tool_choice: { type: "function", name: "get_forecast" },
      text: { format: { type: "json_schema", name: "answer", schema: { type: "object" }, strict: true } },
    });
    assert.deepEqual(body, {
      model: "demo",
      messages: [
        { role: "system", content: "Be brief." },
        { role: "user", content: "Weather in Oslo?" },
      ],
      max_tokens: 64,
      temperature: 0.2,
      top_p: 0.9,
      user: "u-1",
      tools: [{ type: "function", function: { name: "get_forecast", description: "Forecast", parameters: { type: "object", properties: {} }, strict: true } }],
      tool_choice: { type: "function", function: { name: "get_forecast" } },
      parallel_tool_calls: false,
      response_format: { type: "json_schema", json_schema: { name: "answer", schema: { type: "object" }, strict: true } },
      stream: true,
      stream_options: { include_usage: true },
    });
    assert.deepEqual(translate({ model: "demo", input: "x", text: { format: { type: "json_object" } } }).response_format, { type: "json_object" });
  });

  test("items: roles, images, a function call joined to the text before it, and its output as a tool message", () => {
    const body = translate({
      model: "demo",
      input: [
        { role: "developer", content: "Use tools." },
        {
          type: "message",
          role: "user",
          content: [
            { type: "input_text", text: "What is " },
            { type: "input_image", image_url: "data:image/png;base64,AAAA", detail: "low" },
          ],
        },
        { role: "assistant", content: [{ type: "output_text", text: "Let me look." }] },
        { type: "function_call", call_id: "call_1", name: "lookup", arguments: '{"q":"x"}' },
        { type: "function_call", call_id: "call_2", name: "lookup", arguments: '{"q":"y"}' },
        { type: "function_call_output", call_id: "call_1", output: "found x" },
        {
          type: "function_call_output",
          call_id: "call_2",
          output: [
            { type: "input_text", text: "found " },
            { type: "input_text", text: "y" },
          ],
        },
      ],
    });
    assert.deepEqual(body.messages, [
      { role: "system", content: "Use tools." },
      {
        role: "user",
        content: [
          { type: "text", text: "What is " },
          { type: "image_url", image_url: { url: "data:image/png;base64,AAAA", detail: "low" } },
        ],
      },
      {
        role: "assistant",
        content: "Let me look.",
        tool_calls: [
          { id: "call_1", type: "function", function: { name: "lookup", arguments: '{"q":"x"}' } },
          { id: "call_2", type: "function", function: { name: "lookup", arguments: '{"q":"y"}' } },
        ],
      },
      { role: "tool", tool_call_id: "call_1", content: "found x" },
      { role: "tool", tool_call_id: "call_2", content: "found y" },
    ]);
  });

  test("a chain: each kept response's input and output come before the new input, and its calls can be answered", () => {
    const previous: StoredResponse = {
      id: "resp_1",
      previousResponseId: null,
      model: "demo",
      input: [{ id: "msg_in", type: "message", role: "user", status: "completed", content: [{ type: "input_text", text: "Forecast?" }] }],
      response: {
        id: "resp_1",
        object: "response",
        created_at: 1,
        status: "completed",
        error: null,
        incomplete_details: null,
        output: [{ id: "fc_1", type: "function_call", status: "completed", call_id: "call_9", name: "get_forecast", arguments: "{}" }],
        usage: null,
      },
    };
    const body = translate({ model: "demo", instructions: "New rules.", input: [{ type: "function_call_output", call_id: "call_9", output: "sunny" }] }, [
      previous,
    ]);
    assert.deepEqual(body.messages, [
      { role: "system", content: "New rules." },
      { role: "user", content: "Forecast?" },
      { role: "assistant", content: null, tool_calls: [{ id: "call_9", type: "function", function: { name: "get_forecast", arguments: "{}" } }] },
      { role: "tool", tool_call_id: "call_9", content: "sunny" },
    ]);
  });

  test("a chain whose start is no longer kept: an output of a call that went with it is dropped, not refused", () => {
    const cut: StoredResponse = {
      id: "resp_2",
      previousResponseId: "resp_gone",
      model: "demo",
      input: [{ id: "fco_1", type: "function_call_output", status: "completed", call_id: "call_gone", output: "old result" }],
      response: {
        id: "resp_2",
        object: "response",
        created_at: 1,
        status: "completed",
        error: null,
        incomplete_details: null,
        output: [
          {
            id: "msg_2",
            type: "message",
            status: "completed",
            role: "assistant",
            content: [{ type: "output_text", text: "Done.", annotations: [], logprobs: [] }],
          },
        ],
        usage: null,
      },
    };
    assert.deepEqual(translate({ model: "demo", input: "Thanks" }, [cut]).messages, [
      { role: "assistant", content: "Done." },
      { role: "user", content: "Thanks" },
    ]);
  });

  test("input items get ids for input_items; the client's own ids are kept", () => {
    const items = inputItems(
      parseResponsesRequest({
        model: "demo",
        input: [
          { id: "msg_mine", role: "user", content: "a" },
          { role: "user", content: "b" },
        ],
      }),
    );
    assert.equal(items[0]!.id, "msg_mine");
    assert.match(items[1]!.id, /^msg_[0-9a-f]{32}$/);
    assert.deepEqual(items[1]!.content, [{ type: "input_text", text: "b" }]);
  });

  test("bad input is refused with the field named", () => {
    const builtIn = refusal({ model: "demo", input: "x", tools: [{ type: "function", name: "f" }, { type: "web_search" }] });
    assert.equal(builtIn.param, "tools.1.type");
    assert.match(builtIn.message, /built-in tool 'web_search' is not supported/);
    const item = refusal({
      model: "demo",
      input: [
        { role: "user", content: "x" },
        { type: "reasoning", summary: [] },
      ],
    });
    assert.equal(item.param, "input[1].type");
    assert.match(item.message, /items of type 'reasoning' are not supported/);
    assert.match(refusal({ model: "demo", input: "x", temprature: 1 }).message, /unknown field 'temprature'/);
    assert.match(refusal({ model: "demo", input: "x", conversation: "conv_1" }).message, /'conversation' is not supported: .*previous_response_id/);
    assert.match(refusal({ model: "demo", input: "x", background: true }).message, /background responses are not supported/);
    const orphan = refusal({ model: "demo", input: [{ type: "function_call_output", call_id: "call_x", output: "1" }] });
    assert.equal(orphan.param, "input[0].call_id");
    assert.match(orphan.message, /no function call with call_id 'call_x'/);
    assert.equal(refusal({ model: "demo", input: [{ role: "user", content: [{ type: "input_file", file_id: "f" }] }] }).param, "input[0].content[0].type");
    assert.equal(refusal({ model: "demo", input: [{ role: "user", content: [{ type: "input_image", file_id: "f" }] }] }).param, "input[0].content[0].file_id");
    assert.equal(refusal({ model: "demo", input: "x", tool_choice: { type: "web_search" } }).param, "tool_choice");
    assert.equal(refusal({ model: "demo", input: "x", text: { format: { type: "json_schema", schema: {} } } }).param, "text.format.name");
    // Plain fields out of range: the fast check passes them to the schema, which names them.
    assert.equal(refusal({ model: "demo", input: "x", temperature: 3 }).param, "temperature");
    assert.equal(refusal({ model: "demo", input: "x", max_output_tokens: 0 }).param, "max_output_tokens");
    assert.equal(refusal({ model: "", input: "x" }).param, "model");
    assert.equal(refusal({ model: "demo", input: 7 }).param, "input");
    assert.equal(refusal({ model: "demo", input: [] }).param, "input");
    assert.equal(refusal({ model: "demo" }).param, "input");
  });
});

function target(kept: ResponseObject[] = []): ResponseTarget {
  const request = parseResponsesRequest({ model: "demo", input: "x", max_output_tokens: 5 });
  return { head: { id: "resp_t", createdAt: 42, echo: echoOf(request) }, keep: async (response) => void kept.push(response) };
}

/** The events of an SSE text: [type, data] in order. */
function eventsOf(text: string): Array<{ type: string } & Record<string, unknown>> {
  return text
    .split("\n\n")
    .filter((block) => block.trim() !== "")
    .map((block) => {
      const name = /^event: (.*)$/m.exec(block)?.[1];
      const data = JSON.parse(/^data: (.*)$/m.exec(block)![1]!) as { type: string } & Record<string, unknown>;
      assert.equal(data.type, name, "the event's name is its type");
      return data;
    });
}

const sse = (chunk: unknown) => Buffer.from(`data: ${typeof chunk === "string" ? chunk : JSON.stringify(chunk)}\n\n`);

describe("a chat completion as a response", () => {
  test("text and tool calls become items; usage is read; the response is kept before its end", async () => {
    const kept: ResponseObject[] = [];
    const answer = new ResponsesAnswer(target(kept), 200, false);
    answer.push(
      Buffer.from(
        JSON.stringify({
          choices: [
            {
              message: { content: "Checking.", tool_calls: [{ id: "call_a", type: "function", function: { name: "lookup", arguments: '{"q":1}' } }] },
              finish_reason: "tool_calls",
            },
          ],
          usage: { prompt_tokens: 11, completion_tokens: 7, prompt_tokens_details: { cached_tokens: 4 } },
        }),
      ),
    );
    await answer.beforeEnd();
    const response = JSON.parse(answer.end().toString("utf8")) as ResponseObject;
    assert.deepEqual(kept, [response], "the very response the client gets was kept first");
    assert.equal(response.id, "resp_t");
    assert.equal(response.status, "completed");
    assert.equal(response.model, "demo");
    assert.equal(response.max_output_tokens, 5);
    assert.deepEqual(
      response.output.map((item) =>
        item.type === "message" ? ["message", item.content[0]!.text] : ["function_call", item.call_id, item.name, item.arguments],
      ),
      [
        ["message", "Checking."],
        ["function_call", "call_a", "lookup", '{"q":1}'],
      ],
    );
    assert.deepEqual(response.usage, {
      input_tokens: 11,
      input_tokens_details: { cached_tokens: 4 },
      output_tokens: 7,
      output_tokens_details: { reasoning_tokens: 0 },
      total_tokens: 18,
    });
    assert.deepEqual(answer.usage(), { prompt_tokens: 11, completion_tokens: 7 });
    assert.deepEqual(answer.head(), { status: 200, contentType: "application/json", stream: false });
  });

  test("max_tokens reached: incomplete, with the reason; a stream request answered with JSON gets the whole event sequence", () => {
    const answer = new ResponsesAnswer(target(), 200, true);
    answer.push(
      Buffer.from(JSON.stringify({ choices: [{ message: { content: "abc" }, finish_reason: "length" }], usage: { prompt_tokens: 3, completion_tokens: 5 } })),
    );
    const events = eventsOf(answer.end().toString("utf8"));
    assert.deepEqual(
      events.map((event) => event.type),
      [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
      ],
    );
    assert.deepEqual(
      events.map((event) => event.sequence_number),
      events.map((_, index) => index),
    );
    const final = events.at(-1)!.response as ResponseObject;
    assert.equal(final.status, "incomplete");
    assert.deepEqual(final.incomplete_details, { reason: "max_output_tokens" });
    assert.deepEqual(answer.head(), { status: 200, contentType: "text/event-stream", stream: true }, "a failure event can still end it");
  });

  test("an upstream's error answer passes as it is; an answer that is no chat completion is a 502", () => {
    const error = new ResponsesAnswer(target(), 400, false);
    const body = JSON.stringify({ error: { message: "prompt too long", type: "invalid_request_error", code: null, param: null } });
    error.push(Buffer.from(body));
    assert.equal(error.end().toString("utf8"), body);
    assert.deepEqual(error.head(), { status: 400, contentType: "application/json", stream: false });
    const garbage = new ResponsesAnswer(target(), 200, false);
    garbage.push(Buffer.from("<html>"));
    assert.match(garbage.end().toString("utf8"), /not a chat completion/);
    assert.equal(garbage.head().status, 502);
  });
});

describe("a chat stream as Responses events", () => {
  test("text, then tool calls in pieces: items open and close in order, and the completion waits for the response to be kept", async () => {
    const kept: ResponseObject[] = [];
    const stream = new ResponsesStream(target(kept));
    let out = "";
    out += stream.push(sse({ choices: [{ delta: { role: "assistant", content: "Hm" } }] })).toString();
    out += stream.push(sse({ choices: [{ delta: { content: "m." } }] })).toString();
    out += stream.push(sse({ choices: [{ delta: { tool_calls: [{ index: 0, id: "call_1", function: { name: "lookup", arguments: "" } }] } }] })).toString();
    // A piece split across network chunks.
    const split = sse({ choices: [{ delta: { tool_calls: [{ index: 0, function: { arguments: '{"q":' } }] } }] });
    out += stream.push(split.subarray(0, 10)).toString();
    out += stream.push(split.subarray(10)).toString();
    out += stream.push(sse({ choices: [{ delta: { tool_calls: [{ index: 0, function: { arguments: "2}" } }] } }] })).toString();
    out += stream.push(sse({ choices: [{ delta: { tool_calls: [{ index: 1, id: "call_2", function: { name: "other", arguments: "{}" } }] } }] })).toString();
    out += stream.push(sse({ choices: [{ delta: {}, finish_reason: "tool_calls" }] })).toString();
    out += stream.push(sse({ choices: [], usage: { prompt_tokens: 9, completion_tokens: 12 } })).toString();
    out += stream.push(sse("[DONE]")).toString();
    assert.doesNotMatch(out, /response\.completed/, "not before the response is kept");
    assert.equal(kept.length, 0);
    await stream.beforeEnd();
    assert.equal(kept.length, 1);
    out += stream.end().toString();
    const events = eventsOf(out);
    assert.deepEqual(
      events.map((event) => event.type),
      [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
      ],
    );
    assert.deepEqual(
      events.map((event) => event.sequence_number),
      events.map((_, index) => index),
    );
    const done = events.filter((event) => event.type === "response.function_call_arguments.done");
    assert.deepEqual(
      done.map((event) => [event.output_index, event.arguments]),
      [
        [1, '{"q":2}'],
        [2, "{}"],
      ],
    );
    const final = events.at(-1)!.response as ResponseObject;
    assert.deepEqual(final, kept[0]);
    assert.equal(final.status, "completed");
    assert.deepEqual(final.usage?.total_tokens, 21);
    assert.deepEqual(stream.usage(), { prompt_tokens: 9, completion_tokens: 12 });
  });

  test("a stream without [DONE] completes nothing and keeps nothing; its failure event continues the sequence", async () => {
    const kept: ResponseObject[] = [];
    const stream = new ResponsesStream(target(kept));
    let out = stream.push(sse({ choices: [{ delta: { content: "partial" } }] })).toString();
    await stream.beforeEnd();
    out += stream.end().toString();
    out += stream.failureEvent({ message: "the replica failed", code: "upstream_failed" });
    const events = eventsOf(out);
    assert.equal(kept.length, 0);
    assert.deepEqual(events.at(-1), { type: "error", code: "upstream_failed", message: "the replica failed", param: null, sequence_number: events.length - 1 });
    assert.ok(!events.some((event) => event.type === "response.completed"));
  });

  test("[DONE] without its blank line, or without the space: the response completes and is kept", async () => {
    for (const done of ["data: [DONE]\n", "data:[DONE]\n\n"]) {
      const kept: ResponseObject[] = [];
      const stream = new ResponsesStream(target(kept));
      let out = stream.push(sse({ choices: [{ delta: { content: "hi" }, finish_reason: "stop" }] })).toString();
      out += stream.push(Buffer.from(done)).toString();
      await stream.beforeEnd();
      out += stream.end().toString();
      assert.equal(stream.complete(), true, JSON.stringify(done));
      assert.equal(kept.length, 1, JSON.stringify(done));
      assert.equal(eventsOf(out).at(-1)!.type, "response.completed");
    }
  });

  test("chunks no chat stream sends (null, a null choice, a null tool call) are skipped, never thrown on", () => {
    const stream = new ResponsesStream(target());
    for (const chunk of ["null", "3", '"x"', { choices: [null] }, { choices: [{ delta: null }] }, { choices: [{ delta: { tool_calls: [null, 4] } }] }]) {
      assert.doesNotThrow(() => stream.push(sse(chunk)));
    }
    stream.push(sse("[DONE]"));
    assert.equal(stream.complete(), true);
    const answer = new ResponsesAnswer(target(), 200, false);
    answer.push(Buffer.from(JSON.stringify({ choices: [{ message: { content: "x", tool_calls: [null] }, finish_reason: "stop" }] })));
    assert.equal((JSON.parse(answer.end().toString()) as ResponseObject).status, "completed");
  });

  test("an upstream's own error event becomes the error event, and nothing after it is translated", () => {
    const stream = new ResponsesStream(target());
    let out = stream.push(sse({ error: { message: "context full", code: "context_length_exceeded" } })).toString();
    out += stream.push(sse({ choices: [{ delta: { content: "late" } }] })).toString();
    out += stream.end().toString();
    const events = eventsOf(out);
    assert.deepEqual(
      events.map((event) => event.type),
      ["response.created", "response.in_progress", "error"],
    );
    assert.equal(events[2]!.message, "context full");
  });
});
