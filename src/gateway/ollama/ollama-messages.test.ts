// Ollama's messages as chat-completions messages: images as data URLs of the type their
// bytes show, tool calls with ids and JSON-string arguments, tool results matched to the
// calls they answer, and a 400 naming the message for what cannot be translated.
import { test } from "node:test";
import assert from "node:assert/strict";
import { z } from "zod";
import { parseWith, type BadRequestError } from "../../core/errors.ts";
import { encodeTinyPng } from "../../../test/support/tiny-png.ts";
import { ollamaImage, ollamaMessage, toChatMessages } from "./ollama-messages.ts";

const PNG = encodeTinyPng({ width: 2, height: 2 }).toString("base64");
const JPEG = Buffer.from([0xff, 0xd8, 0xff, 0xe0, 0, 0x10, 0x4a, 0x46, 0x49, 0x46, 0, 1]).toString("base64");
const GIF = Buffer.from("GIF89a\x01\x00\x01\x00\x00\x00\x00", "latin1").toString("base64");
const WEBP = Buffer.concat([Buffer.from("RIFF"), Buffer.from([0x24, 0, 0, 0]), Buffer.from("WEBPVP8 ")]).toString("base64");

const body = z.strictObject({ messages: z.array(ollamaMessage) });

function translate(messages: unknown) {
  return toChatMessages(parseWith(body, { messages }, "request").messages);
}

function refusal(run: () => unknown): BadRequestError {
  try {
    run();
  } catch (error) {
    return error as BadRequestError;
  }
  assert.fail("it was accepted");
}

test("an image becomes a data URL whose media type its bytes show", () => {
  const cases: Array<[string, string]> = [
    [PNG, "image/png"],
    [JPEG, "image/jpeg"],
    [GIF, "image/gif"],
    [WEBP, "image/webp"],
  ];
  for (const [data, type] of cases) assert.equal(parseWith(ollamaImage, data), `data:${type};base64,${data}`);
});

test("an image that is not one, or not bare strict base64, is refused with its field named", () => {
  const cases: Array<[string, RegExp]> = [
    [Buffer.from("hello world!").toString("base64"), /not an image/],
    [`data:image/png;base64,${PNG}`, /without a 'data:/],
    [`${PNG.slice(0, 10)}\n${PNG.slice(10)}`, /strict base64/],
    [PNG.replace(/=+$/, ""), /strict base64/],
    ["", /empty/],
  ];
  for (const [image, message] of cases) {
    const error = refusal(() => translate([{ role: "user", content: "What is this?", images: [PNG, image] }]));
    assert.equal(error.status, 400);
    assert.equal(error.param, "messages.0.images.1");
    assert.match(error.message, message);
  }
});

test("a user message with images has them first, then its text, as image_url parts", () => {
  assert.deepEqual(translate([{ role: "user", content: "What is this?", images: [PNG] }]), [
    {
      role: "user",
      content: [
        { type: "image_url", image_url: { url: `data:image/png;base64,${PNG}` } },
        { type: "text", text: "What is this?" },
      ],
    },
  ]);
  assert.equal(refusal(() => translate([{ role: "assistant", content: "x", images: [PNG] }])).param, "messages.0.images");
});

test("tool calls get ids and JSON arguments; each tool result answers the open call of its name, else the first open one", () => {
  const out = translate([
    { role: "system", content: "Use tools." },
    { role: "user", content: "Weather in Paris and the time?" },
    {
      role: "assistant",
      content: "",
      tool_calls: [{ function: { name: "weather", arguments: { city: "Paris" }, index: 0 } }, { function: { name: "clock", arguments: {} } }],
    },
    { role: "tool", tool_name: "clock", content: "12:00" },
    { role: "tool", content: "sunny" },
  ]);
  assert.equal(out.length, 5);
  const assistant = out[2] as { role: string; tool_calls: Array<{ id: string; type: string; function: { name: string; arguments: string } }> };
  const [weather, clock] = assistant.tool_calls;
  assert.ok(weather && clock);
  assert.match(weather.id, /^call_[0-9a-f]{24}$/);
  assert.notEqual(weather.id, clock.id);
  assert.deepEqual(weather.function, { name: "weather", arguments: '{"city":"Paris"}' });
  assert.equal(weather.type, "function");
  assert.deepEqual(out[3], { role: "tool", tool_call_id: clock.id, content: "12:00" });
  assert.deepEqual(out[4], { role: "tool", tool_call_id: weather.id, content: "sunny" });
});

test("a tool result with no open call to answer is refused with the message named", () => {
  const lone = refusal(() =>
    translate([
      { role: "user", content: "hi" },
      { role: "tool", content: "42" },
    ]),
  );
  assert.equal(lone.param, "messages.1");
  assert.match(lone.message, /after the assistant message whose tool_calls it answers/);
  const call = { role: "assistant", content: "", tool_calls: [{ function: { name: "weather", arguments: {} } }] };
  const wrongName = refusal(() => translate([call, { role: "tool", tool_name: "clock", content: "12:00" }]));
  assert.equal(wrongName.param, "messages.1");
  assert.match(wrongName.message, /'weather'/);
  const twice = refusal(() => translate([call, { role: "tool", content: "a" }, { role: "tool", content: "b" }]));
  assert.equal(twice.param, "messages.2");
  assert.match(twice.message, /all answered/);
});

test("a message's unknown field, a wrong role and a non-object call arguments are refused by name", () => {
  assert.equal(refusal(() => translate([{ role: "user", content: "x", name: "bob" }])).param, "messages.0");
  assert.equal(refusal(() => translate([{ role: "developer", content: "x" }])).param, "messages.0.role");
  assert.equal(
    refusal(() => translate([{ role: "assistant", content: "", tool_calls: [{ function: { name: "f", arguments: "{}" } }] }])).param,
    "messages.0.tool_calls.0.function.arguments",
  );
});

test("an assistant's earlier thinking is dropped from the history", () => {
  assert.deepEqual(translate([{ role: "assistant", content: "4", thinking: "2+2 is 4" }]), [{ role: "assistant", content: "4" }]);
});
