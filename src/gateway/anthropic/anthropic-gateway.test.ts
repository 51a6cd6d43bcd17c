// /v1/messages through a real llmgw server to fake OpenAI-compatible upstreams
// (test/support/fake-upstream.ts, standing in for any engine behind a replica), driven by
// the official @anthropic-ai/sdk: the request the upstream receives, the answer and the
// stream the SDK assembles, the usage row, and every failure in Anthropic's shape with
// llmgw's status: a wrong key, an unknown model, a bad body, an upstream's own refusal, a
// stream broken mid-way.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import Anthropic from "@anthropic-ai/sdk";
import { startHarness, type Harness } from "../../../test/support/server-harness.ts";
import { fakeUpstreams } from "../../../test/support/fake-upstream.ts";
import { eventually } from "../../../test/support/eventually.ts";
import { startJsonOnlyUpstream } from "../../../test/support/json-only-upstream.ts";

/** Anthropic's error body, as llmgw answers it and as the SDK's errors carry it in `error`. */
interface AnthropicErrorBody {
  type: "error";
  error: { type: string; message: string };
}

describe("/v1/messages through the gateway", () => {
  let harness: Harness;
  const upstreams = fakeUpstreams();
  let key: string;
  let client: Anthropic;
  let seen: Awaited<ReturnType<typeof upstreams.start>>;

  const addModel = async (name: string, url: string) => {
    const created = await harness.admin("POST", "/api/v1/models", {
      name,
      profiles: [{ name: "up", engine: "external", url: `${url}/v1`, upstream_model: `${name}-upstream` }],
    });
    assert.equal(created.status, 201, JSON.stringify(created.body));
  };

  before(async () => {
    harness = await startHarness();
    seen = await upstreams.start({ reply: "hello from the fake upstream" });
    await addModel("ext", seen.url);
    key = await harness.clientKey();
    // The SDK adds /v1/messages to the base URL itself, so the base is the server's root.
    client = new Anthropic({ apiKey: key, baseURL: harness.url, maxRetries: 0 });
  });

  after(async () => {
    await harness.close();
    await upstreams.closeAll();
  });

  test("a message: the upstream gets a chat completion with the system prompt and stop sequences; the SDK gets a message", async () => {
    const message = await client.messages.create({
      model: "ext",
      max_tokens: 32,
      system: "Answer briefly.",
      stop_sequences: ["END"],
      metadata: { user_id: "user-7" },
      messages: [{ role: "user", content: "Hi" }],
    });
    const request = seen.requests.at(-1)!;
    assert.equal(request.path, "/v1/chat/completions");
    assert.deepEqual(request.body, {
      model: "ext-upstream",
      messages: [
        { role: "system", content: "Answer briefly." },
        { role: "user", content: "Hi" },
      ],
      max_tokens: 32,
      stop: ["END"],
      user: "user-7",
    });
    assert.match(message.id, /^msg_/);
    assert.equal(message.type, "message");
    assert.equal(message.role, "assistant");
    assert.equal(message.model, "ext");
    assert.deepEqual(message.content, [{ type: "text", text: "hello from the fake upstream" }]);
    assert.equal(message.stop_reason, "end_turn");
    assert.equal(message.stop_sequence, null);
    assert.deepEqual(message.usage, { input_tokens: 7, output_tokens: 5, cache_creation_input_tokens: null, cache_read_input_tokens: null });
  });

  test("a stream: messages.stream() gets every text piece and finalMessage() the stop reason and usage", async () => {
    const stream = client.messages.stream({ model: "ext", max_tokens: 32, messages: [{ role: "user", content: "Hi" }] });
    const pieces: string[] = [];
    stream.on("text", (text) => pieces.push(text));
    const message = await stream.finalMessage();
    assert.deepEqual(pieces, ["hello", " from", " the", " fake", " upstream"]);
    assert.deepEqual(message.content, [{ type: "text", text: "hello from the fake upstream" }]);
    assert.equal(message.stop_reason, "end_turn");
    assert.deepEqual(message.usage.input_tokens, 7);
    assert.deepEqual(message.usage.output_tokens, 5);
    assert.equal(message.usage.cache_creation_input_tokens, null, "no prompt caching: null, as Anthropic says it");
    assert.equal(message.usage.cache_read_input_tokens, null);
    const request = seen.requests.at(-1)!;
    assert.equal(request.body.stream, true);
    assert.deepEqual(request.body.stream_options, { include_usage: true }, "the usage is asked for, for message_delta");
  });

  test("each request leaves a usage row for /v1/messages with the key and the token counts", async () => {
    const created = await harness.admin("POST", "/api/v1/keys", { name: "counted" });
    assert.equal(created.status, 201, JSON.stringify(created.body));
    const counted = new Anthropic({ apiKey: created.body.key, baseURL: harness.url, maxRetries: 0 });
    await counted.messages.create({ model: "ext", max_tokens: 8, messages: [{ role: "user", content: "count me" }] });
    await counted.messages.stream({ model: "ext", max_tokens: 8, messages: [{ role: "user", content: "count me too" }] }).finalMessage();
    // The recorder writes in batches about once a second; wait for both rows of this key.
    const written = await eventually("two usage rows of the key", async () => {
      const found = await harness.server.store.db.selectFrom("usage").selectAll().where("key_id", "=", created.body.id).execute();
      return found.length >= 2 ? found : undefined;
    });
    assert.equal(written.length, 2);
    for (const row of written) {
      assert.equal(row.endpoint, "/v1/messages");
      assert.equal(row.model, "ext");
      assert.equal(row.status, 200);
      assert.equal(row.prompt_tokens, 7);
      assert.equal(row.completion_tokens, 5);
    }
    assert.deepEqual(written.map((row) => row.stream).sort(), [0, 1]);
  });

  test("the key may come as Authorization: Bearer too, and anthropic-version is not required", async () => {
    const response = await fetch(`${harness.url}/v1/messages`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "ext", max_tokens: 8, messages: [{ role: "user", content: "Hi" }] }),
    });
    assert.equal(response.status, 200);
    assert.equal(((await response.json()) as { type: string }).type, "message");
  });

  test("failures come in Anthropic's shape with llmgw's status, as the SDK's error classes", async () => {
    const wrongKey = new Anthropic({ apiKey: "not-a-key", baseURL: harness.url, maxRetries: 0 });
    const auth = await wrongKey.messages.create({ model: "ext", max_tokens: 8, messages: [{ role: "user", content: "Hi" }] }).catch((e: unknown) => e);
    assert.ok(auth instanceof Anthropic.AuthenticationError, String(auth));
    assert.deepEqual(Object.keys(auth.error as object), ["type", "error"]);
    assert.equal((auth.error as AnthropicErrorBody).error.type, "authentication_error");

    const missing = await client.messages
      .create({ model: "no-such-model", max_tokens: 8, messages: [{ role: "user", content: "Hi" }] })
      .catch((e: unknown) => e);
    assert.ok(missing instanceof Anthropic.NotFoundError, String(missing));
    assert.equal((missing.error as AnthropicErrorBody).error.type, "not_found_error");
    assert.match((missing.error as AnthropicErrorBody).error.message, /no-such-model/);

    const image = await client.messages
      .create({
        model: "ext",
        max_tokens: 8,
        messages: [{ role: "user", content: [{ type: "image", source: { type: "base64", media_type: "image/png", data: "AAAA" } }] }],
      })
      .catch((e: unknown) => e);
    assert.ok(image instanceof Anthropic.BadRequestError, String(image));
    assert.equal((image.error as AnthropicErrorBody).error.type, "invalid_request_error");
    assert.match((image.error as AnthropicErrorBody).error.message, /messages\.0\.content\.0\.type'.*'image' are not supported yet/);

    const noKey = await fetch(`${harness.url}/v1/messages`, { method: "POST", body: "{}" });
    assert.equal(noKey.status, 401);
    assert.deepEqual(await noKey.json(), {
      type: "error",
      error: { type: "authentication_error", message: "No API key given. Send it as 'x-api-key: <key>' (or 'Authorization: Bearer <key>')." },
    });

    const notJson = await fetch(`${harness.url}/v1/messages`, { method: "POST", headers: { "x-api-key": key }, body: "{" });
    assert.equal(notJson.status, 400);
    assert.equal(((await notJson.json()) as AnthropicErrorBody).error.type, "invalid_request_error");

    const get = await fetch(`${harness.url}/v1/messages`, { headers: { "x-api-key": key } });
    assert.equal(get.status, 405);
    assert.deepEqual(((await get.json()) as AnthropicErrorBody).type, "error");
  });

  test("an upstream's own refusal keeps its status and message", async () => {
    const refusing = await upstreams.start({ failWithStatus: 400 });
    await addModel("refusing", refusing.url);
    const error = await client.messages.create({ model: "refusing", max_tokens: 8, messages: [{ role: "user", content: "Hi" }] }).catch((e: unknown) => e);
    assert.ok(error instanceof Anthropic.BadRequestError, String(error));
    assert.deepEqual(error.error, { type: "error", error: { type: "invalid_request_error", message: "upstream failure" } });
    const streamed = await client.messages
      .stream({ model: "refusing", max_tokens: 8, messages: [{ role: "user", content: "Hi" }] })
      .finalMessage()
      .catch((e: unknown) => e);
    assert.ok(streamed instanceof Anthropic.BadRequestError, String(streamed));
  });

  test("a stream the upstream answered with one JSON completion reaches the SDK as the full event sequence", async () => {
    const plain = await startJsonOnlyUpstream({ reply: "one piece", usage: { prompt_tokens: 4, completion_tokens: 2, total_tokens: 6 } });
    try {
      await addModel("no-streams", plain.url);
      const stream = client.messages.stream({ model: "no-streams", max_tokens: 8, messages: [{ role: "user", content: "Hi" }] });
      const pieces: string[] = [];
      stream.on("text", (text) => pieces.push(text));
      const message = await stream.finalMessage();
      assert.deepEqual(pieces, ["one piece"]);
      assert.deepEqual(message.content, [{ type: "text", text: "one piece" }]);
      assert.equal(message.stop_reason, "end_turn");
      assert.deepEqual(message.usage, { input_tokens: 4, output_tokens: 2, cache_creation_input_tokens: null, cache_read_input_tokens: null });
      assert.equal((plain.requests[0] as { stream?: unknown }).stream, true, "the upstream was asked for a stream");

      const raw = await fetch(`${harness.url}/v1/messages`, {
        method: "POST",
        headers: { "x-api-key": key, "content-type": "application/json" },
        body: JSON.stringify({ model: "no-streams", max_tokens: 8, stream: true, messages: [{ role: "user", content: "Hi" }] }),
      });
      assert.equal(raw.status, 200);
      assert.match(raw.headers.get("content-type") ?? "", /^text\/event-stream/);
      const names = [...(await raw.text()).matchAll(/^event: (\w+)$/gm)].map((match) => match[1]);
      assert.deepEqual(names, ["message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop"]);
    } finally {
      await plain.close();
    }
  });

  test("a stream broken mid-way ends with Anthropic's error event, which the SDK raises as an APIError", async () => {
    const broken = await upstreams.start({ reply: "one two three four", resetAfterChunks: 2 });
    await addModel("broken", broken.url);
    const stream = client.messages.stream({ model: "broken", max_tokens: 8, messages: [{ role: "user", content: "Hi" }] });
    const pieces: string[] = [];
    stream.on("text", (text) => pieces.push(text));
    const error = await stream.finalMessage().catch((e: unknown) => e);
    assert.deepEqual(pieces, ["one", " two"], "the text before the break arrived");
    assert.ok(error instanceof Anthropic.APIError, String(error));
    assert.ok(!(error instanceof Anthropic.APIConnectionError), "not a bare connection error");
    assert.equal((error.error as AnthropicErrorBody).error.type, "api_error");
    assert.match((error.error as AnthropicErrorBody).error.message, /failed in the middle of the answer/);

    const stopping = await upstreams.start({ reply: "one two three four", endStreamEarly: "with-error" });
    await addModel("stopping", stopping.url);
    const told = await client.messages
      .stream({ model: "stopping", max_tokens: 8, messages: [{ role: "user", content: "Hi" }] })
      .finalMessage()
      .catch((e: unknown) => e);
    assert.ok(told instanceof Anthropic.APIError, String(told));
    assert.equal((told.error as AnthropicErrorBody).error.message, "The engine is shutting down.", "the engine's own error event, translated");
  });
});
