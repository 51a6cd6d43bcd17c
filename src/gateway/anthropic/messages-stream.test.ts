// The stream translator: a canned chat-completion SSE stream, cut at every byte boundary,
// gives Anthropic's events in their order, with the stop reason and usage of its last
// chunks; an upstream error event and a stream without [DONE] end as the relay needs.
import { test } from "node:test";
import assert from "node:assert/strict";
import { MessagesStream } from "./messages-stream.ts";

const request = { model: "demo", messages: [], max_tokens: 8, stop: ["END"], stream: true };

function chunk(choice: Record<string, unknown> | null, extra: Record<string, unknown> = {}): string {
  const choices = choice === null ? [] : [{ index: 0, delta: {}, logprobs: null, finish_reason: null, ...choice }];
  return `data: ${JSON.stringify({ id: "chatcmpl-1", object: "chat.completion.chunk", created: 1, model: "up", choices, ...extra })}\n\n`;
}

const CANNED =
  chunk({ delta: { role: "assistant", content: "" } }, { usage: null }) +
  chunk({ delta: { content: "Héllo" } }, { usage: null }) +
  chunk({ delta: { content: " wörld 😁" } }, { usage: null }) +
  chunk({ finish_reason: "stop", stop_reason: "END" }, { usage: null }) +
  chunk(null, { usage: { prompt_tokens: 12, completion_tokens: 4, total_tokens: 16 } }) +
  "data: [DONE]\n\n";

/** An event's data: each has its `type`; the tests compare the rest whole, so it stays unknown. */
interface EventData {
  type: string;
  message?: { id: string };
  delta?: unknown;
  usage?: unknown;
}

interface Event {
  name: string;
  data: EventData;
}

/** Parses the translator's output into named events, checking the framing. */
function parseEvents(text: string): Event[] {
  assert.ok(text === "" || text.endsWith("\n\n"), "whole events only");
  return text
    .split("\n\n")
    .filter((part) => part !== "")
    .map((part) => {
      const match = /^event: (\w+)\ndata: (.*)$/.exec(part);
      assert.ok(match, `an event line and a data line: ${JSON.stringify(part)}`);
      const data = JSON.parse(match[2]!) as EventData;
      assert.equal(data.type, match[1], "the data's type is the event's name");
      return { name: match[1]!, data };
    });
}

function translate(input: Buffer, cuts: number[]): { out: string; translator: MessagesStream } {
  const translator = new MessagesStream(request);
  const parts: Buffer[] = [];
  let from = 0;
  for (const cut of [...cuts, input.length]) {
    parts.push(translator.push(input.subarray(from, cut)));
    from = cut;
  }
  parts.push(translator.end());
  return { out: Buffer.concat(parts).toString("utf8"), translator };
}

test("a chat stream becomes Anthropic's events in order, whatever the chunk boundaries", () => {
  const input = Buffer.from(CANNED, "utf8");
  let reference: string | null = null;
  for (let cut = 1; cut < input.length; cut += 1) {
    const { out, translator } = translate(input, [cut]);
    // Ids are random per message; the rest must not depend on where the bytes were cut.
    const normalised = out.replace(/msg_[0-9a-f]{24}/g, "msg_X");
    reference ??= normalised;
    assert.equal(normalised, reference, `cut at byte ${cut}`);
    assert.deepEqual(translator.usage(), { prompt_tokens: 12, completion_tokens: 4 });
  }
  const events = parseEvents(translate(input, []).out);
  assert.deepEqual(
    events.map((e) => e.name),
    ["message_start", "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop", "message_delta", "message_stop"],
  );
  const start = events[0]!.data.message;
  assert.ok(start !== undefined, "message_start carries the message");
  assert.match(start.id, /^msg_/);
  assert.deepEqual(
    { ...start, id: "x" },
    {
      id: "x",
      type: "message",
      role: "assistant",
      model: "demo",
      content: [],
      stop_reason: null,
      stop_sequence: null,
      usage: { input_tokens: 0, output_tokens: 0, cache_creation_input_tokens: null, cache_read_input_tokens: null },
    },
  );
  assert.deepEqual(events[1]!.data, { type: "content_block_start", index: 0, content_block: { type: "text", text: "" } });
  assert.deepEqual(
    events.slice(2, 4).map((e) => e.data.delta),
    [
      { type: "text_delta", text: "Héllo" },
      { type: "text_delta", text: " wörld 😁" },
    ],
  );
  assert.deepEqual(events[4]!.data, { type: "content_block_stop", index: 0 });
  assert.deepEqual(events[5]!.data, {
    type: "message_delta",
    delta: { stop_reason: "stop_sequence", stop_sequence: "END" },
    usage: { input_tokens: 12, output_tokens: 4, cache_creation_input_tokens: null, cache_read_input_tokens: null },
  });
});

test("CRLF framing, extra lines of other servers, and max_tokens", () => {
  const input = `${chunk({ delta: { content: "a" } })}: keep-alive\n\n${chunk({ finish_reason: "length" })}data: [DONE]\n\n`.replaceAll("\n", "\r\n");
  const events = parseEvents(translate(Buffer.from(input), []).out);
  assert.deepEqual(
    events.map((e) => e.name),
    ["message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop"],
  );
  assert.deepEqual(events[4]!.data.delta, { stop_reason: "max_tokens", stop_sequence: null });
  assert.deepEqual(
    events[4]!.data.usage,
    { input_tokens: 0, output_tokens: 0, cache_creation_input_tokens: null, cache_read_input_tokens: null },
    "no usage chunk: zeros",
  );
});

test("a reply without text has no content block", () => {
  const events = parseEvents(
    translate(Buffer.from(`${chunk({ delta: { role: "assistant", content: "" } })}${chunk({ finish_reason: "stop" })}data: [DONE]\n\n`), []).out,
  );
  assert.deepEqual(
    events.map((e) => e.name),
    ["message_start", "message_delta", "message_stop"],
  );
  assert.deepEqual(events[1]!.data.delta, { stop_reason: "end_turn", stop_sequence: null });
});

test("the upstream's error event becomes Anthropic's error event, and nothing follows it", () => {
  const failure = `data: ${JSON.stringify({ error: { message: "The engine is shutting down.", type: "server_error", param: null, code: "engine_stopping" } })}\n\n`;
  const events = parseEvents(translate(Buffer.from(`${chunk({ delta: { content: "a" } })}${failure}data: [DONE]\n\n`), []).out);
  assert.deepEqual(
    events.map((e) => e.name),
    ["message_start", "content_block_start", "content_block_delta", "error"],
  );
  assert.deepEqual(events[3]!.data, { type: "error", error: { type: "api_error", message: "The engine is shutting down." } });
});

test("a stream that stops without [DONE] is left open for the relay to end with its error event", () => {
  const events = parseEvents(translate(Buffer.from(chunk({ delta: { content: "a" } }) + chunk({ delta: { content: "b" } })), []).out);
  assert.deepEqual(
    events.map((e) => e.name),
    ["message_start", "content_block_start", "content_block_delta", "content_block_delta"],
  );
});
