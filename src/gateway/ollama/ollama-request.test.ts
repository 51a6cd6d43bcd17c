// The request bodies of /api/chat, /api/generate, /api/embed and /api/embeddings: each
// field mapped onto the chat-completions or embeddings body, Ollama's defaults (stream on)
// kept, `name:latest` resolved, and every field llmgw cannot honour refused by name.
import { test } from "node:test";
import assert from "node:assert/strict";
import type { BadRequestError } from "../../core/errors.ts";
import type { WireContext } from "../wire-format.ts";
import { encodeTinyPng } from "../../../test/support/tiny-png.ts";
import { catalogName, chatRequest, embeddingsRequest, embedRequest, generateRequest } from "./ollama-request.ts";

const context: WireContext = { principal: { keyId: "k", name: "k", role: "client", allowedModels: null, expiresAt: null }, knows: (name) => name === "llama" };
const PNG = encodeTinyPng({ width: 1, height: 1 }).toString("base64");
const hi = [{ role: "user", content: "hi" }];

function refusal(run: () => unknown): BadRequestError {
  try {
    run();
  } catch (error) {
    return error as BadRequestError;
  }
  assert.fail("it was accepted");
}

test("a chat streams by default, asking for its usage; stream false asks for one JSON answer", () => {
  const streamed = chatRequest({ model: "llama", messages: hi }, context);
  assert.equal(streamed.stream, true);
  assert.deepEqual(streamed.body, { model: "llama", messages: hi, stream: true, stream_options: { include_usage: true } });
  const whole = chatRequest({ model: "llama", messages: hi, stream: false, keep_alive: "5m" }, context);
  assert.equal(whole.stream, false);
  assert.deepEqual(whole.body, { model: "llama", messages: hi });
});

test("a chat's tools, format and options go on the body", () => {
  const tool = {
    type: "function",
    function: { name: "weather", description: "Weather", parameters: { type: "object", properties: { city: { type: "string" } } } },
  };
  const { body } = chatRequest(
    { model: "llama", messages: hi, stream: false, tools: [tool], format: "json", options: { temperature: 0.1, num_predict: 64 }, think: false },
    context,
  );
  assert.deepEqual(body, { model: "llama", messages: hi, tools: [tool], response_format: { type: "json_object" }, temperature: 0.1, max_tokens: 64 });
  const schema = { type: "object", properties: { answer: { type: "string" } }, required: ["answer"] };
  assert.deepEqual(chatRequest({ model: "llama", messages: hi, format: schema }, context).body.response_format, {
    type: "json_schema",
    json_schema: { name: "response", schema },
  });
  assert.equal(chatRequest({ model: "llama", messages: hi, format: "" }, context).body.response_format, undefined);
});

test("name:latest is the catalog's name when the catalog knows only the bare one; the answer keeps the name asked for", () => {
  const translated = chatRequest({ model: "llama:latest", messages: hi }, context);
  assert.equal(translated.body.model, "llama");
  assert.equal(translated.model, "llama:latest");
  assert.equal(catalogName("other:latest", context), "other:latest", "an unknown name goes on as given, for the gateway's 404");
  assert.equal(catalogName("llama:7b", context), "llama:7b");
  assert.equal(catalogName("both:latest", { knows: (name) => name === "both:latest" || name === "both" }), "both:latest");
});

test("each field llmgw cannot honour is refused by name, saying what to do", () => {
  const cases: Array<[unknown, string | null, RegExp]> = [
    [{ model: "llama", messages: hi, think: true }, "think", /thinking/],
    [{ model: "llama", messages: hi, think: "high" }, "think", /thinking/],
    [{ model: "llama", messages: hi, logprobs: true }, "logprobs", /\/v1\/chat\/completions/],
    [{ model: "llama", messages: hi, top_logprobs: 3 }, "top_logprobs", /log probabilities/],
    [{ model: "llama", messages: hi, format: "yaml" }, "format", /"json"/],
    [{ model: "llama", messages: hi, format: ["json"] }, "format", /JSON schema/],
    [{ model: "llama", messages: hi, options: { temperature: "warm" } }, "options.temperature", /must be a number/],
    [{ model: "llama", messages: hi, options: { num_gpus: 1 } }, "options.num_gpus", /not an Ollama option/],
    [{ model: "llama", messages: hi, seed: 1 }, null, /unknown field 'seed'; \/api\/chat takes model, messages/],
    [{ model: "llama", messages: [] }, "messages", /at least one message/],
    [{ messages: hi }, "model", /GET \/api\/tags/],
  ];
  for (const [body, param, message] of cases) {
    const error = refusal(() => chatRequest(body, context));
    assert.equal(error.status, 400, JSON.stringify(body));
    assert.equal(error.param, param, JSON.stringify(body));
    assert.match(error.message, message);
  }
});

test("a generate request is a chat of its system prompt and one user turn with its images", () => {
  const { body, stream, model } = generateRequest(
    { model: "llama", prompt: "Describe it.", system: "Be brief.", images: [PNG], options: { seed: 7 }, raw: false, context: [] },
    context,
  );
  assert.equal(stream, true);
  assert.equal(model, "llama");
  assert.deepEqual(body, {
    model: "llama",
    messages: [
      { role: "system", content: "Be brief." },
      {
        role: "user",
        content: [
          { type: "image_url", image_url: { url: `data:image/png;base64,${PNG}` } },
          { type: "text", text: "Describe it." },
        ],
      },
    ],
    seed: 7,
    stream: true,
    stream_options: { include_usage: true },
  });
  assert.deepEqual(generateRequest({ model: "llama", prompt: "Hi", stream: false }, context).body, {
    model: "llama",
    messages: [{ role: "user", content: "Hi" }],
  });
});

test("generate refuses what it cannot do, naming the field", () => {
  const cases: Array<[Record<string, unknown>, string, RegExp]> = [
    [{ prompt: "x", raw: true }, "raw", /\/v1\/completions/],
    [{ prompt: "x", suffix: "end" }, "suffix", /not supported/],
    [{ prompt: "x", template: "{{ .Prompt }}" }, "template", /chat template/],
    [{ prompt: "x", context: [1, 2, 3] }, "context", /\/api\/chat/],
    [{ prompt: "x", width: 512 }, "width", /image generation/],
    [{ prompt: "x", images: ["bm90IGFuIGltYWdl"] }, "images.0", /not an image/],
    [{ prompt: "" }, "prompt", /nothing to generate/],
    [{}, "prompt", /nothing to generate/],
  ];
  for (const [fields, param, message] of cases) {
    const error = refusal(() => generateRequest({ model: "llama", ...fields }, context));
    assert.equal(error.status, 400, JSON.stringify(fields));
    assert.equal(error.param, param, JSON.stringify(fields));
    assert.match(error.message, message);
  }
});

test("embed takes a string or strings; the legacy embeddings route one prompt; dimensions is refused", () => {
  assert.deepEqual(embedRequest({ model: "llama:latest", input: ["a", "b"], truncate: true, keep_alive: 0, options: { num_ctx: 512 } }, context), {
    body: { model: "llama", input: ["a", "b"] },
    model: "llama:latest",
  });
  assert.deepEqual(embedRequest({ model: "llama", input: "a" }, context).body, { model: "llama", input: "a" });
  assert.deepEqual(embeddingsRequest({ model: "llama", prompt: "a" }, context), { body: { model: "llama", input: "a" }, model: "llama" });
  assert.equal(refusal(() => embedRequest({ model: "llama", input: "a", dimensions: 256 }, context)).param, "dimensions");
  assert.equal(refusal(() => embedRequest({ model: "llama", input: 5 }, context)).param, "input");
  assert.equal(refusal(() => embeddingsRequest({ model: "llama", input: "a" }, context)).param, "prompt");
});
