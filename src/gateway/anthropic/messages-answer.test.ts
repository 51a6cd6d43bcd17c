// The non-streamed answer of /v1/messages and the Anthropic error shape: a chat
// completion becomes one message, the stop reason follows the documented rule, and
// llmgw's errors and the upstream's keep their status with Anthropic's body.
import { test } from "node:test";
import assert from "node:assert/strict";
import {
  AuthenticationError,
  BadRequestError,
  NotFoundError,
  PayloadTooLargeError,
  PermissionDeniedError,
  TooManyRequestsError,
  UnavailableError,
  UpstreamError,
} from "../../core/errors.ts";
import { MessagesAnswer, stopOutcome } from "./messages-answer.ts";
import { anthropicStreamFailureEvent, renderAnthropicError, upstreamErrorBody } from "./anthropic-errors.ts";

const request = { model: "demo-alias", messages: [], max_tokens: 8, stop: ["END"] };

function completion(choice: Record<string, unknown>, usage: unknown = { prompt_tokens: 11, completion_tokens: 3, total_tokens: 14 }) {
  return {
    id: "chatcmpl-1",
    object: "chat.completion",
    created: 1,
    model: "upstream-name",
    choices: [{ index: 0, message: { role: "assistant", content: "Hi there" }, finish_reason: "stop", ...choice }],
    usage,
  };
}

/** Runs one upstream answer through the rewriter, split in two chunks as a socket may deliver it. */
function rewrite(status: number, body: string) {
  const answer = new MessagesAnswer(request, status);
  const half = Math.floor(body.length / 2);
  assert.equal(answer.push(Buffer.from(body.slice(0, half))).length, 0, "nothing goes out before the whole answer is in");
  assert.equal(answer.push(Buffer.from(body.slice(half))).length, 0);
  const out = answer.end();
  return { json: JSON.parse(out.toString("utf8")), head: answer.head(), usage: answer.usage() };
}

test("a chat completion becomes a message with the requested model name, text content and usage", () => {
  const { json, head, usage } = rewrite(200, JSON.stringify(completion({})));
  assert.match(json.id, /^msg_[0-9a-f]{24}$/);
  assert.deepEqual(
    { ...json, id: "x" },
    {
      id: "x",
      type: "message",
      role: "assistant",
      model: "demo-alias",
      content: [{ type: "text", text: "Hi there" }],
      stop_reason: "end_turn",
      stop_sequence: null,
      usage: { input_tokens: 11, output_tokens: 3, cache_creation_input_tokens: null, cache_read_input_tokens: null },
    },
  );
  assert.deepEqual(head, { status: 200, contentType: "application/json" });
  assert.deepEqual(usage, { prompt_tokens: 11, completion_tokens: 3 });
});

test("an empty reply has no content block, and a missing usage gives zeros", () => {
  const { json, usage } = rewrite(200, JSON.stringify(completion({ message: { role: "assistant", content: "" } }, null)));
  assert.deepEqual(json.content, []);
  assert.deepEqual(json.usage, { input_tokens: 0, output_tokens: 0, cache_creation_input_tokens: null, cache_read_input_tokens: null });
  assert.equal(usage, null);
});

test("a stream request the upstream answered with one JSON completion gets the message as the full event sequence", () => {
  const answer = new MessagesAnswer({ ...request, stream: true }, 200);
  assert.equal(answer.push(Buffer.from(JSON.stringify(completion({ finish_reason: "length" })))).length, 0);
  const text = answer.end().toString("utf8");
  assert.deepEqual(answer.head(), { status: 200, contentType: "text/event-stream" });
  assert.deepEqual(answer.usage(), { prompt_tokens: 11, completion_tokens: 3 });
  const events = text
    .split("\n\n")
    .filter((part) => part !== "")
    .map((part) => {
      const match = /^event: (\w+)\ndata: (.*)$/.exec(part);
      assert.ok(match, `an event line and a data line: ${JSON.stringify(part)}`);
      return { name: match[1]!, data: JSON.parse(match[2]!) };
    });
  assert.deepEqual(
    events.map((e) => e.name),
    ["message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop"],
  );
  const start = events[0]!.data.message;
  assert.deepEqual(
    { ...start, id: "x" },
    {
      id: "x",
      type: "message",
      role: "assistant",
      model: "demo-alias",
      content: [],
      stop_reason: null,
      stop_sequence: null,
      usage: { input_tokens: 11, output_tokens: 0, cache_creation_input_tokens: null, cache_read_input_tokens: null },
    },
  );
  assert.deepEqual(events[2]!.data.delta, { type: "text_delta", text: "Hi there" });
  assert.deepEqual(events[4]!.data, {
    type: "message_delta",
    delta: { stop_reason: "max_tokens", stop_sequence: null },
    usage: { input_tokens: 11, output_tokens: 3, cache_creation_input_tokens: null, cache_read_input_tokens: null },
  });

  const refused = new MessagesAnswer({ ...request, stream: true }, 400);
  refused.push(Buffer.from(JSON.stringify({ error: { message: "no", type: "invalid_request_error", param: null, code: null } })));
  assert.equal(JSON.parse(refused.end().toString("utf8")).type, "error");
  assert.deepEqual(refused.head(), { status: 400, contentType: "application/json" }, "an error keeps its status and JSON body");
});

test("usage counts that are not whole numbers >= 0 are no usage", () => {
  for (const usage of [
    { prompt_tokens: -5, completion_tokens: 3 },
    { prompt_tokens: 5, completion_tokens: -1 },
    { prompt_tokens: 1.5, completion_tokens: 3 },
    { prompt_tokens: "5", completion_tokens: 3 },
  ]) {
    const { json, usage: found } = rewrite(200, JSON.stringify(completion({}, usage)));
    assert.equal(found, null, JSON.stringify(usage));
    assert.deepEqual(json.usage, { input_tokens: 0, output_tokens: 0, cache_creation_input_tokens: null, cache_read_input_tokens: null });
  }
});

test("stop reasons: length is max_tokens; stop_sequence only when the server names a requested sequence", () => {
  assert.deepEqual(stopOutcome("length", null, ["END"]), { stop_reason: "max_tokens", stop_sequence: null });
  assert.deepEqual(stopOutcome("stop", "END", ["END"]), { stop_reason: "stop_sequence", stop_sequence: "END" });
  assert.deepEqual(stopOutcome("stop", null, ["END"]), { stop_reason: "end_turn", stop_sequence: null }, "the server did not say: end of turn");
  assert.deepEqual(stopOutcome("stop", 2, ["END"]), { stop_reason: "end_turn", stop_sequence: null }, "vLLM's stop token id is no stop sequence");
  assert.deepEqual(stopOutcome("stop", "OTHER", ["END"]), { stop_reason: "end_turn", stop_sequence: null });
  const { json } = rewrite(200, JSON.stringify(completion({ stop_reason: "END" })));
  assert.equal(json.stop_reason, "stop_sequence");
  assert.equal(json.stop_sequence, "END");
});

test("an upstream error answer keeps its status and message in Anthropic's shape", () => {
  const openai = rewrite(
    400,
    JSON.stringify({ error: { message: "at most 4 stop sequences are allowed", type: "invalid_request_error", param: "stop", code: "invalid_field" } }),
  );
  assert.deepEqual(openai.json, { type: "error", error: { type: "invalid_request_error", message: "at most 4 stop sequences are allowed" } });
  assert.deepEqual(openai.head, { status: 400, contentType: "application/json" });
  assert.deepEqual(upstreamErrorBody(422, JSON.stringify({ object: "error", message: "bad input" })), {
    type: "error",
    error: { type: "invalid_request_error", message: "bad input" },
  });
  assert.deepEqual(upstreamErrorBody(503, "<html>Service Unavailable</html>"), {
    type: "error",
    error: { type: "api_error", message: "The model server answered HTTP 503: <html>Service Unavailable</html>" },
  });
});

test("a 200 answer that is no chat completion becomes a 502 api_error", () => {
  const { json, head } = rewrite(200, "<html>proxy page</html>");
  assert.equal(head.status, 502);
  assert.equal(json.error.type, "api_error");
  assert.match(json.error.message, /was not a chat completion/);
});

test("llmgw's errors: the status and headers stay, the body is Anthropic's", () => {
  const cases: Array<[Error, number, string]> = [
    [new BadRequestError("bad"), 400, "invalid_request_error"],
    [new AuthenticationError("who"), 401, "authentication_error"],
    [new PermissionDeniedError("no"), 403, "permission_error"],
    [new NotFoundError("gone"), 404, "not_found_error"],
    [new PayloadTooLargeError("big"), 413, "request_too_large"],
    [
      new TooManyRequestsError("slow down", { code: "rate_limit_exceeded", retryAfterSeconds: 7, headers: { "x-ratelimit-remaining-requests": "0" } }),
      429,
      "rate_limit_error",
    ],
    [new TooManyRequestsError("queue full", { code: "model_overloaded", retryAfterSeconds: 1 }), 429, "overloaded_error"],
    [new UnavailableError("waited too long", { code: "queue_timeout" }), 503, "overloaded_error"],
    [new UnavailableError("starting", { code: "model_starting", retryAfterSeconds: 5 }), 503, "api_error"],
    [new UpstreamError("replica broke"), 502, "api_error"],
    [new Error("a secret path /var/x"), 500, "api_error"],
  ];
  for (const [error, status, type] of cases) {
    const rendered = renderAnthropicError(error);
    assert.equal(rendered.status, status, error.message);
    assert.deepEqual(Object.keys(rendered.body), ["type", "error"]);
    assert.equal(rendered.body.type, "error");
    assert.equal(rendered.body.error.type, type, error.message);
  }
  const limited = renderAnthropicError(cases[5]![0]);
  assert.equal(limited.headers["retry-after"], "7");
  assert.equal(limited.headers["x-ratelimit-remaining-requests"], "0");
  assert.equal(renderAnthropicError(new Error("a secret path /var/x")).body.error.message.includes("/var/x"), false, "an internal fault's text is not shown");
  assert.equal(
    anthropicStreamFailureEvent({ message: "The replica failed.", code: "upstream_failed" }),
    'event: error\ndata: {"type":"error","error":{"type":"api_error","message":"The replica failed."}}\n\n',
  );
});
