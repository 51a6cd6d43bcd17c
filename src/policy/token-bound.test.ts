// The upper bound of a request's tokens: the bytes of the whole body plus the template's
// allowances, media parts by an allowance, the output from the larger max-token field or the
// model's limits, and prompt + output together capped at the context length.
import { test } from "node:test";
import assert from "node:assert/strict";
import type { CatalogModel } from "../catalog/catalog.ts";
import { worstCaseUsage } from "./limits.ts";
import {
  DEFAULT_MAX_OUTPUT,
  MEDIA_PART_ALLOWANCE,
  PER_INPUT_ALLOWANCE,
  PER_MESSAGE_ALLOWANCE,
  PER_REQUEST_ALLOWANCE,
  PER_TOOL_ALLOWANCE,
  TOOLS_ALLOWANCE,
  tokenBound,
} from "./token-bound.ts";

function model(limits: { context_length?: number; max_output?: number } = {}): CatalogModel {
  return { id: "m", name: "m", definition: { ...limits } } as unknown as CatalogModel;
}

const bodyBytes = (body: unknown) => Buffer.byteLength(JSON.stringify(body), "utf8");

test("a chat prompt counts the UTF-8 bytes of the whole body, plus the template's allowances", () => {
  const body = {
    model: "m",
    messages: [
      { role: "system", content: "héllo" },
      { role: "user", content: [{ type: "text", text: "日本" }] },
    ],
  };
  const bound = tokenBound("/v1/chat/completions", body, model());
  assert.equal(bound.prompt, PER_REQUEST_ALLOWANCE + 2 * PER_MESSAGE_ALLOWANCE + bodyBytes(body));
  assert.ok(bound.prompt > Buffer.byteLength("systemhéllouser日本"), "every text the template may print is covered");
  assert.equal(bound.output, DEFAULT_MAX_OUTPUT);
  assert.equal(bound.total, bound.prompt + bound.output);
});

test("tools add the function-calling preamble a template prints (whatever tool_choice says), and each tool call in the history its markers", () => {
  const tool = { type: "function", function: { name: "f" } };
  const call = { id: "call_1", type: "function", function: { name: "f", arguments: "{}" } };
  const body = {
    model: "m",
    messages: [
      { role: "user", content: "x" },
      { role: "assistant", content: null, tool_calls: [call, call] },
      { role: "tool", tool_call_id: "call_1", content: "ok" },
    ],
    tools: [tool, tool],
    tool_choice: "none",
  };
  const bound = tokenBound("/v1/chat/completions", body, model());
  assert.equal(bound.prompt, PER_REQUEST_ALLOWANCE + 3 * PER_MESSAGE_ALLOWANCE + TOOLS_ALLOWANCE + 4 * PER_TOOL_ALLOWANCE + bodyBytes(body));
  // The bundled engine measured 542 prompt tokens for a 113-byte request with one bare tool (ChatML demo model); the e2e test checks the bound against a live engine.
  const minimal = { messages: [{ role: "user", content: "x" }], max_tokens: 1, tools: [tool] };
  assert.ok(tokenBound("/v1/chat/completions", minimal, model()).prompt >= 542);
  assert.equal(
    tokenBound("/v1/chat/completions", { ...minimal, tools: [] }, model()).prompt,
    PER_REQUEST_ALLOWANCE + PER_MESSAGE_ALLOWANCE + bodyBytes({ ...minimal, tools: [] }),
  );
});

test("the body's length as it arrived stands for its serialised bytes (never fewer: parsing only drops whitespace and escapes)", () => {
  const raw = '{ "model": "m", "messages": [ { "role": "user", "content": "caf\\u00e9" } ] }';
  const body = JSON.parse(raw) as Record<string, unknown>;
  assert.ok(Buffer.byteLength(raw) > bodyBytes(body));
  const bound = tokenBound("/v1/chat/completions", body, model(), Buffer.byteLength(raw));
  assert.equal(bound.prompt, PER_REQUEST_ALLOWANCE + PER_MESSAGE_ALLOWANCE + Buffer.byteLength(raw));
  assert.ok(bound.prompt >= tokenBound("/v1/chat/completions", body, model()).prompt);
});

test("fields an engine may render into the prompt count too (vLLM documents, chat_template_kwargs, a completions suffix)", () => {
  const messages = [{ role: "user", content: "hi" }];
  const plain = tokenBound("/v1/chat/completions", { model: "m", messages }, model()).prompt;
  const documents = [{ title: "a", text: "x".repeat(10_000) }];
  const withDocuments = tokenBound(
    "/v1/chat/completions",
    { model: "m", messages, documents, chat_template_kwargs: { extra: "y".repeat(500) } },
    model(),
  ).prompt;
  assert.ok(withDocuments - plain >= 10_500, `documents and template arguments add their bytes (added ${withDocuments - plain})`);
  const suffix = "z".repeat(3000);
  assert.ok(tokenBound("/v1/completions", { model: "m", prompt: "a", suffix }, model()).prompt >= 3000 + PER_REQUEST_ALLOWANCE);
});

test("the output is the larger of max_tokens and max_completion_tokens, else the model's max_output or context length", () => {
  const messages = [{ role: "user", content: "hi" }];
  const output = (fields: object, limits = {}) => tokenBound("/v1/chat/completions", { model: "m", messages, ...fields }, model(limits)).output;
  assert.equal(
    output({ max_tokens: 1, max_completion_tokens: 100_000 }),
    100_000,
    "engines read max_completion_tokens first: the small max_tokens must not hide it",
  );
  assert.equal(output({ max_tokens: 100_000, max_completion_tokens: 1 }), 100_000);
  assert.equal(output({ max_completion_tokens: 9 }, { max_output: 100 }), 9);
  assert.equal(output({}, { max_output: 100, context_length: 2048 }), 100);
  assert.equal(output({}, { context_length: 2048 }), 2048);
  assert.equal(output({ max_tokens: 5000 }, { context_length: 2048 }), 2048, "no request outputs more than the context");
});

test("prompt and output together never pass the context length, and the split is priced at its dearest", () => {
  const messages = [{ role: "user", content: "x".repeat(1000) }];
  const bound = tokenBound("/v1/chat/completions", { model: "m", messages }, model({ context_length: 4096 }));
  assert.equal(bound.output, 4096, "no max_tokens and no max_output: the whole context may be output");
  assert.ok(bound.prompt > 1000 && bound.prompt < 4096);
  assert.equal(bound.total, 4096, "one context holds prompt and output, so a tpm of the context length admits it");
  const dearOutput = worstCaseUsage(bound, { input_per_million: 1, output_per_million: 4 });
  assert.deepEqual(dearOutput, { prompt_tokens: 0, completion_tokens: 4096 });
  const dearInput = worstCaseUsage(bound, { input_per_million: 4, output_per_million: 1 });
  assert.deepEqual(dearInput, { prompt_tokens: bound.prompt, completion_tokens: 4096 - bound.prompt });
  const unbounded = tokenBound("/v1/chat/completions", { model: "m", messages, max_tokens: 10 }, model());
  assert.deepEqual(worstCaseUsage(unbounded, { input_per_million: 1, output_per_million: 4 }), { prompt_tokens: unbounded.prompt, completion_tokens: 10 });
});

test("an image part counts an allowance instead of its bytes, a file part at least its bytes, and the context length caps the prompt", () => {
  const dataUrl = `data:image/png;base64,${"A".repeat(200_000)}`;
  const image = [{ role: "user", content: [{ type: "image_url", image_url: { url: dataUrl } }] }];
  const imagePrompt = tokenBound("/v1/chat/completions", { model: "m", messages: image }, model()).prompt;
  assert.ok(imagePrompt >= MEDIA_PART_ALLOWANCE && imagePrompt < MEDIA_PART_ALLOWANCE + 1000, `an image counts its allowance (${imagePrompt})`);
  const file = [{ role: "user", content: [{ type: "file", file: { file_data: "B".repeat(50_000) } }] }];
  assert.ok(tokenBound("/v1/chat/completions", { model: "m", messages: file }, model()).prompt >= 50_000);
  assert.equal(tokenBound("/v1/chat/completions", { model: "m", messages: image }, model({ context_length: 4096 })).prompt, 4096);
});

test("completions and embeddings: token ids and strings by their bytes in the body, each embeddings input with its special tokens", () => {
  const completions = { model: "m", prompt: [1, 2, 3], max_tokens: 4 };
  assert.equal(tokenBound("/v1/completions", completions, model()).prompt, bodyBytes(completions) + PER_REQUEST_ALLOWANCE);
  const strings = { model: "m", input: ["ab", "cde"] };
  assert.deepEqual(tokenBound("/v1/embeddings", strings, model()), {
    prompt: bodyBytes(strings) + 2 * PER_INPUT_ALLOWANCE,
    output: 0,
    total: bodyBytes(strings) + 2 * PER_INPUT_ALLOWANCE,
  });
  const ids = { model: "m", input: [[1, 2], [3]] };
  assert.equal(tokenBound("/v1/embeddings", ids, model()).prompt, bodyBytes(ids) + 2 * PER_INPUT_ALLOWANCE);
  const manyIds = { model: "m", input: Array.from({ length: 1000 }, (_, i) => i % 10) };
  assert.ok(tokenBound("/v1/embeddings", manyIds, model()).prompt >= 1000 + 2, "each id takes at least two bytes of JSON");
  // The context length caps each input, not the request: three inputs near the limit use three contexts.
  const long = { model: "m", input: ["x ".repeat(600), "y ".repeat(600), "z ".repeat(600)] };
  assert.equal(tokenBound("/v1/embeddings", long, model({ context_length: 512 })).prompt, 3 * 512);
  assert.equal(
    tokenBound("/v1/embeddings", { model: "m", input: "short" }, model({ context_length: 512 })).prompt,
    bodyBytes({ model: "m", input: "short" }) + PER_INPUT_ALLOWANCE,
  );
});
