import { test } from "node:test";
import assert from "node:assert/strict";
import { StreamUsageFilter, withUsageRequested } from "./stream-usage.ts";

const chunk = (fields: Record<string, unknown>) => `data: ${JSON.stringify({ id: "c1", object: "chat.completion.chunk", ...fields })}\n\n`;

/** Feeds `text` to a filter in pieces of `size` bytes and returns what the client would get. */
function filterInPieces(text: string, size: number): { out: string; filter: StreamUsageFilter } {
  const filter = new StreamUsageFilter();
  const bytes = Buffer.from(text);
  const parts: Buffer[] = [];
  for (let i = 0; i < bytes.length; i += size) parts.push(filter.push(bytes.subarray(i, i + size)));
  parts.push(filter.end());
  return { out: Buffer.concat(parts).toString(), filter };
}

test("takes out the usage-only chunk and the usage:null fields, whatever the chunk boundaries", () => {
  const upstream =
    chunk({ choices: [{ index: 0, delta: { content: "é" }, finish_reason: null }], usage: null }) +
    chunk({ choices: [{ index: 0, delta: {}, finish_reason: "stop" }], usage: null }) +
    chunk({ choices: [], usage: { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5 } }) +
    "data: [DONE]\n\n";
  const expected =
    chunk({ choices: [{ index: 0, delta: { content: "é" }, finish_reason: null }] }) +
    chunk({ choices: [{ index: 0, delta: {}, finish_reason: "stop" }] }) +
    "data: [DONE]\n\n";
  for (const size of [1, 7, 64, upstream.length]) {
    const { out, filter } = filterInPieces(upstream, size);
    assert.equal(out, expected, `pieces of ${size} bytes`);
    assert.deepEqual(filter.usage(), { prompt_tokens: 3, completion_tokens: 2 });
  }
});

test("events without usage pass byte for byte, CRLF framing included", () => {
  const upstream = 'data: {"choices":[{"delta":{"content":"a"}}]}\r\n\r\ndata: [DONE]\r\n\r\n';
  const { out, filter } = filterInPieces(upstream, 5);
  assert.equal(out, upstream);
  assert.equal(filter.usage(), null);
});

test("an event cut by the upstream's end is passed on as it is", () => {
  const { out } = filterInPieces('data: {"choices":[]', 4);
  assert.equal(out, 'data: {"choices":[]');
});

test("asking for usage splices the field into the body as it arrived, and leaves a body with stream_options to be serialised", () => {
  const body = { model: "m", stream: true, messages: [{ role: "user", content: "héllo \\u00e9 {}" }] };
  for (const text of [JSON.stringify(body), ` \n\t${JSON.stringify(body, null, 2)}`]) {
    const spliced = withUsageRequested(Buffer.from(text), body);
    assert.ok(spliced !== null);
    assert.deepEqual(JSON.parse(spliced.toString("utf8")), { stream_options: { include_usage: true }, ...body });
  }
  assert.equal(withUsageRequested(Buffer.from('{"model":"m","stream_options":null}'), { model: "m", stream_options: null }), null);
  assert.equal(withUsageRequested(Buffer.from('{"model":"m","stream_options":{}}'), { model: "m", stream_options: {} }), null);
  // Invalid UTF-8 is left to the parsed body's serialisation, which carries the repaired text.
  const invalid = Buffer.concat([Buffer.from('{"model":"m","prompt":"'), Buffer.from([0xff, 0xfe]), Buffer.from('"}')]);
  assert.equal(withUsageRequested(invalid, JSON.parse(invalid.toString("utf8"))), null);
});
