// The gateway over real HTTP: a real llmgw server in this process, `external` profiles
// pointing at fake OpenAI-compatible upstreams (test/support/fake-upstream.ts), driven by
// the official openai client where the behaviour is the client's to see.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import OpenAI from "openai";
import path from "node:path";
import { writeTinyLlamaGguf } from "../gguf/tiny-model.ts";
import { findFreePort } from "../agent/free-port.ts";
import type { RenderedError } from "../core/errors.ts";
import { startHarness, type Harness } from "../../test/support/server-harness.ts";
import { startFakeUpstream, type FakeUpstream } from "../../test/support/fake-upstream.ts";
import { eventually } from "../../test/support/eventually.ts";

describe("gateway", () => {
  let harness: Harness;
  let upstream: FakeUpstream;
  let slow: FakeUpstream;
  let key: string;
  let client: OpenAI;

  before(async () => {
    harness = await startHarness({ maxBodyBytes: 64 * 1024 });
    upstream = await startFakeUpstream({ key: "upstream-key" });
    // Sends its first chunk, then holds the stream until the client goes away.
    slow = await startFakeUpstream({ reply: "one two three four five six seven eight", beforeNextChunk: () => new Promise<void>(() => undefined) });
    const created = await harness.admin("POST", "/api/v1/models", {
      name: "ext",
      aliases: ["ext-alias"],
      profiles: [{ name: "up", engine: "external", url: `${upstream.url}/v1`, api_key: "upstream-key", upstream_model: "upstream-name" }],
    });
    assert.equal(created.status, 201, JSON.stringify(created.body));
    assert.equal((await harness.admin("POST", "/api/v1/models", { name: "slow", profiles: [{ name: "s", engine: "external", url: slow.url }] })).status, 201);
    key = await harness.clientKey();
    client = new OpenAI({ apiKey: key, baseURL: `${harness.url}/v1`, maxRetries: 0 });
  });

  after(async () => {
    await harness.close();
    await upstream.close();
    await slow.close();
  });

  test("lists models with aliases, filtered by the key's allowed models", async () => {
    const all = await client.models.list();
    assert.deepEqual(all.data.map((m) => m.id).sort(), ["ext", "ext-alias", "slow"]);
    const limited = new OpenAI({ apiKey: await harness.clientKey({ allowed_models: ["slow"] }), baseURL: `${harness.url}/v1`, maxRetries: 0 });
    assert.deepEqual(
      (await limited.models.list()).data.map((m) => m.id),
      ["slow"],
    );
  });

  test("proxies a chat request to the external server with its key and model name", async () => {
    const answer = await client.chat.completions.create({ model: "ext-alias", messages: [{ role: "user", content: "hi" }] });
    assert.equal(answer.choices[0]?.message.content, "hello from the fake upstream");
    assert.equal(answer.usage?.total_tokens, 12);
    const seen = upstream.requests.at(-1)!;
    assert.equal(seen.path, "/v1/chat/completions");
    assert.equal(seen.authorization, "Bearer upstream-key", "the gateway sends the profile's key, not the client's");
    assert.equal(seen.body.model, "upstream-name", "the alias is rewritten to the upstream's model name");
  });

  test("engine fields (tools, response_format, logprobs, sampling) reach the upstream unchanged, also when the gateway rewrites the body", async () => {
    // The alias makes the gateway re-serialise the body (another model name upstream), and
    // the key's tpm makes it cap the output (max_tokens): neither may drop or change a field
    // the gateway does not know, since vLLM and external servers honour them.
    const limited = await harness.clientKey({ tpm: 1_000_000 });
    const chat = {
      model: "ext-alias",
      messages: [
        { role: "user", content: "weather in Oslo?" },
        { role: "assistant", content: null, tool_calls: [{ id: "call_1", type: "function", function: { name: "weather", arguments: '{"city":"Oslo"}' } }] },
        { role: "tool", tool_call_id: "call_1", content: '{"celsius":3}' },
      ],
      tools: [
        {
          type: "function",
          function: {
            name: "weather",
            description: "Weather now",
            parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
            strict: true,
          },
        },
      ],
      tool_choice: { type: "function", function: { name: "weather" } },
      parallel_tool_calls: false,
      response_format: { type: "json_schema", json_schema: { name: "w", schema: { type: "object", properties: { c: { type: "number" } } }, strict: true } },
      logprobs: true,
      top_logprobs: 3,
      logit_bias: { "42": -100 },
      top_k: 5,
      min_p: 0.05,
      repeat_penalty: 1.1,
      presence_penalty: 0.5,
      frequency_penalty: 0.25,
    };
    for (const sendKey of [key, limited]) {
      const response = await fetch(`${harness.url}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${sendKey}`, "content-type": "application/json" },
        body: JSON.stringify(chat),
      });
      assert.equal(response.status, 200, await response.text());
      const { model, max_tokens, stream, stream_options, ...rest } = upstream.requests.at(-1)!.body;
      assert.equal(model, "upstream-name");
      const { model: _alias, ...sentFields } = chat;
      assert.deepEqual(rest, sentFields);
      if (sendKey === limited) {
        assert.equal(typeof max_tokens, "number", "the limited key's reservation caps the output upstream");
        // An external server is not trusted to keep to it: the request runs as a stream there (relay-assembled.ts).
        assert.deepEqual({ stream, stream_options }, { stream: true, stream_options: { include_usage: true } });
      } else assert.deepEqual({ max_tokens, stream, stream_options }, { max_tokens: undefined, stream: undefined, stream_options: undefined });
    }
    const completion = { model: "ext-alias", prompt: "Once", logprobs: 2, echo: false, best_of: 1, suffix: null, max_tokens: 4 };
    const answered = await fetch(`${harness.url}/v1/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: JSON.stringify(completion),
    });
    await answered.arrayBuffer();
    assert.deepEqual(upstream.requests.at(-1)!.body, { ...completion, model: "upstream-name" });
    const embedding = {
      model: "ext-alias",
      input: [
        [1, 2, 3],
        [4, 5],
      ],
      encoding_format: "base64",
      dimensions: 3,
    };
    const embedded = await fetch(`${harness.url}/v1/embeddings`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: JSON.stringify(embedding),
    });
    assert.equal(embedded.status, 200);
    await embedded.arrayBuffer();
    assert.deepEqual(upstream.requests.at(-1)!.body, { ...embedding, model: "upstream-name" });
  });

  test("streams chunk by chunk without buffering", { timeout: 60_000 }, async () => {
    // The upstream sends its first chunk and then holds the rest until the test has seen
    // that chunk arrive through the gateway: a gateway that buffered would never deliver it.
    let releaseRest!: () => void;
    const rest = new Promise<void>((resolve) => {
      releaseRest = resolve;
    });
    const held = await startFakeUpstream({ reply: "one two three", beforeNextChunk: () => rest });
    try {
      assert.equal((await harness.admin("POST", "/api/v1/models", { name: "held", profiles: [{ name: "h", engine: "external", url: held.url }] })).status, 201);
      const stream = await client.chat.completions.create({
        model: "held",
        messages: [{ role: "user", content: "hi" }],
        stream: true,
        stream_options: { include_usage: true },
      });
      let text = "";
      let usage: OpenAI.CompletionUsage | undefined;
      for await (const chunk of stream) {
        text += chunk.choices[0]?.delta.content ?? "";
        if (chunk.usage) usage = chunk.usage;
        releaseRest();
      }
      assert.equal(text, "one two three");
      assert.equal(usage?.completion_tokens, 3);
    } finally {
      await harness.admin("DELETE", "/api/v1/models/held");
      await held.close();
    }
  });

  test("a client that disconnects cancels the upstream stream", async () => {
    const before = slow.cancelledStreams();
    const controller = new AbortController();
    const stream = await client.chat.completions.create(
      { model: "slow", messages: [{ role: "user", content: "hi" }], stream: true },
      { signal: controller.signal },
    );
    let chunks = 0;
    try {
      for await (const _chunk of stream) {
        chunks += 1;
        controller.abort();
      }
    } catch {
      // The SDK may end the loop with an abort error or quietly; both are a client going away.
    }
    assert.equal(chunks, 1);
    await eventually("the upstream stream to be cancelled", () => slow.cancelledStreams() === before + 1);
  });

  test("a replica that refuses or answers 503 before the first byte is replaced by another", async () => {
    const failing = await startFakeUpstream({ failWithStatus: 503 });
    const good = await startFakeUpstream({ reply: "from the good one" });
    try {
      // A port that was free a moment ago: nothing listens there, so connecting is refused.
      const refusedPort = await findFreePort("127.0.0.1");
      const created = await harness.admin("POST", "/api/v1/models", {
        name: "multi",
        profiles: [
          { name: "refused", engine: "external", url: `http://127.0.0.1:${refusedPort}` },
          { name: "failing", engine: "external", url: failing.url },
          { name: "good", engine: "external", url: good.url },
        ],
      });
      assert.equal(created.status, 201);
      for (let i = 0; i < 3; i += 1) {
        const answer = await client.chat.completions.create({ model: "multi", messages: [{ role: "user", content: "hi" }] });
        assert.equal(answer.choices[0]?.message.content, "from the good one");
      }
      assert.ok(failing.requests.length >= 1, "the failing replica was tried");
    } finally {
      await harness.admin("DELETE", "/api/v1/models/multi");
      await failing.close();
      await good.close();
    }
  });

  test("embeddings pass through with usage, and the upstream's own headers stay behind", async () => {
    const response = await fetch(`${harness.url}/v1/embeddings`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "ext", input: ["a", "b"] }),
    });
    assert.equal(response.status, 200);
    assert.equal(response.headers.get("set-cookie"), null, "cookies of the external server are not the client's");
    const answer = (await response.json()) as { data: { embedding: number[] }[]; usage: { prompt_tokens: number } };
    assert.equal(answer.data.length, 2);
    assert.deepEqual(answer.data[0]?.embedding, [0.25, -0.5, 0.75]);
    assert.equal(answer.usage.prompt_tokens, 6);
    assert.equal(upstream.requests.at(-1)?.path, "/v1/embeddings");
  });

  test("a replica that resets the connection before answering is replaced by another", async () => {
    const resetting = await startFakeUpstream({ resetOnRequest: true });
    const good = await startFakeUpstream({ reply: "after the reset" });
    try {
      assert.equal(
        (
          await harness.admin("POST", "/api/v1/models", {
            name: "reset",
            profiles: [
              { name: "a-resets", engine: "external", url: resetting.url },
              { name: "b-good", engine: "external", url: good.url },
            ],
          })
        ).status,
        201,
      );
      for (let i = 0; i < 4; i += 1) {
        const answer = await client.chat.completions.create({ model: "reset", messages: [{ role: "user", content: "hi" }] });
        assert.equal(answer.choices[0]?.message.content, "after the reset");
      }
      assert.ok(resetting.requests.length >= 1, "the resetting replica was tried");
    } finally {
      await harness.admin("DELETE", "/api/v1/models/reset");
      await resetting.close();
      await good.close();
    }
  });

  test("an external server that refuses llmgw's key gives a 502 naming the profile, not a 401 about the client's key", async () => {
    assert.equal(
      (
        await harness.admin("POST", "/api/v1/models", {
          name: "wrong-key",
          profiles: [{ name: "up", engine: "external", url: upstream.url, api_key: "not-the-upstream-key" }],
        })
      ).status,
      201,
    );
    try {
      await assert.rejects(client.chat.completions.create({ model: "wrong-key", messages: [{ role: "user", content: "x" }] }), (error: unknown) => {
        assert.ok(error instanceof OpenAI.InternalServerError, String(error));
        assert.equal(error.status, 502);
        assert.equal(error.code, "upstream_auth_failed");
        assert.match(error.message, /wrong-key\/up/);
        return true;
      });
    } finally {
      await harness.admin("DELETE", "/api/v1/models/wrong-key");
    }
  });

  test("errors come back in OpenAI's shape with the SDK's classes", async () => {
    const bad = new OpenAI({ apiKey: "llmgw-not-a-real-key", baseURL: `${harness.url}/v1`, maxRetries: 0 });
    await assert.rejects(bad.models.list(), OpenAI.AuthenticationError);
    await assert.rejects(client.chat.completions.create({ model: "nope", messages: [{ role: "user", content: "x" }] }), (error: unknown) => {
      assert.ok(error instanceof OpenAI.NotFoundError);
      assert.equal(error.code, "model_not_found");
      return true;
    });
    await assert.rejects(client.chat.completions.create({ model: "ext", messages: [] }), (error: unknown) => {
      assert.ok(error instanceof OpenAI.BadRequestError);
      assert.equal(error.param, "messages");
      return true;
    });
    await assert.rejects(client.chat.completions.create({ model: "ext", messages: [{ role: "user", content: "x" }], temperature: 7 }), (error: unknown) => {
      assert.ok(error instanceof OpenAI.BadRequestError);
      assert.equal(error.param, "temperature");
      return true;
    });
    const limited = new OpenAI({ apiKey: await harness.clientKey({ allowed_models: ["slow"] }), baseURL: `${harness.url}/v1`, maxRetries: 0 });
    // A model the key may not use looks like one that does not exist: it cannot enumerate the catalog.
    await assert.rejects(limited.chat.completions.create({ model: "ext", messages: [{ role: "user", content: "x" }] }), (error: unknown) => {
      assert.ok(error instanceof OpenAI.NotFoundError);
      assert.equal(error.code, "model_not_found");
      return true;
    });
  });

  test("malformed JSON, oversized bodies and unknown endpoints are refused clearly", async () => {
    const post = (body: string) =>
      fetch(`${harness.url}/v1/chat/completions`, { method: "POST", headers: { authorization: `Bearer ${key}`, "content-type": "application/json" }, body });
    const malformed = await post("{not json");
    assert.equal(malformed.status, 400);
    assert.equal(((await malformed.json()) as RenderedError["body"]).error.code, "invalid_json");
    const huge = await post(JSON.stringify({ model: "ext", messages: [{ role: "user", content: "x".repeat(70 * 1024) }] }));
    assert.equal(huge.status, 413);
    assert.match(((await huge.json()) as RenderedError["body"]).error.message, /larger than 64 KiB/);
    const unknown = await fetch(`${harness.url}/v1/images/generations`, { method: "POST", headers: { authorization: `Bearer ${key}` }, body: "{}" });
    assert.equal(unknown.status, 404);
  });

  test("a body that gives a top-level key twice is refused in OpenAI's error shape, and nothing reaches the upstream", async () => {
    const before = upstream.requests.length;
    const response = await fetch(`${harness.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      // The gateway would check "slow"; an engine's parser that keeps the first key would run "ext".
      body: '{"model":"ext","messages":[{"role":"user","content":"hi"}],"model":"slow"}',
    });
    assert.equal(response.status, 400);
    const body = (await response.json()) as RenderedError["body"];
    assert.deepEqual(body.error, {
      message: "The request body has the key 'model' twice; send each key once.",
      type: "invalid_request_error",
      param: "model",
      code: "duplicate_key",
    });
    assert.equal(upstream.requests.length, before);
  });

  test("a body that repeats a key inside a message is refused with the key's place, and nothing reaches the upstream", async () => {
    const before = upstream.requests.length;
    const response = await fetch(`${harness.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      // The gateway's checks would read "ok" (JSON.parse keeps the last); an engine keeping the first would run "evil".
      body: '{"model":"ext","messages":[{"role":"user","content":"evil","content":"ok"}]}',
    });
    assert.equal(response.status, 400);
    const body = (await response.json()) as RenderedError["body"];
    assert.deepEqual(body.error, {
      message: "The request body has the key 'content' twice in messages[0]; send each key once.",
      type: "invalid_request_error",
      param: "messages[0].content",
      code: "duplicate_key",
    });
    assert.equal(upstream.requests.length, before);
  });

  test("revocation applies to the next request", async () => {
    const created = await harness.admin("POST", "/api/v1/keys", { name: "short-lived" });
    const shortLived = new OpenAI({ apiKey: created.body.key, baseURL: `${harness.url}/v1`, maxRetries: 0 });
    await shortLived.models.list();
    assert.equal((await harness.admin("DELETE", `/api/v1/keys/${created.body.id}`)).status, 200);
    await assert.rejects(shortLived.models.list(), (error: unknown) => error instanceof OpenAI.AuthenticationError && /revoked/.test(error.message));
  });

  test("a model without a ready replica answers 503 with Retry-After and the reason", async () => {
    // Real weights: the catalog refuses a source that cannot run.
    const weights = path.join(harness.dataDir, "idle.gguf");
    await writeTinyLlamaGguf({ path: weights, seed: 1 });
    const created = await harness.admin("POST", "/api/v1/models", {
      name: "idle",
      scaling: { min: 0, max: 1 },
      source: { kind: "file", path: weights },
      profiles: [{ name: "cpu", engine: "llamacpp" }],
    });
    assert.equal(created.status, 201);
    const response = await fetch(`${harness.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "idle", messages: [{ role: "user", content: "x" }] }),
    });
    // On demand, but no node has joined this server to start it on.
    assert.equal(response.status, 503);
    assert.equal(response.headers.get("retry-after"), "30");
    const error = ((await response.json()) as RenderedError["body"]).error;
    assert.equal(error.code, "model_unplaceable");
    assert.match(error.message, /cannot run now: no node can take a replica/);
  });

  test("usage is recorded per request with tokens and the key", async () => {
    // A key of its own: earlier tests of this file send completions too, and their rows may
    // be written at any moment.
    const created = await harness.admin("POST", "/api/v1/keys", { name: "usage-counted" });
    const counted = new OpenAI({ apiKey: created.body.key, baseURL: `${harness.url}/v1`, maxRetries: 0 });
    const countRows = async () =>
      await harness.server.store.db.selectFrom("usage").selectAll().where("endpoint", "=", "/v1/completions").where("key_id", "=", created.body.id).execute();
    assert.equal((await countRows()).length, 0);
    await counted.completions.create({ model: "ext", prompt: "count me" });
    // The recorder writes in batches about once a second; wait for this one.
    const rows = await eventually("a usage row for /v1/completions", async () => {
      const found = await countRows();
      return found.length > 0 ? found : undefined;
    });
    const last = rows.at(-1);
    assert.ok(last, "a usage row was written");
    assert.equal(last.prompt_tokens, 7);
    assert.equal(last.completion_tokens, 5);
    assert.equal(last.status, 200);
    assert.equal(last.key_id, created.body.id);
  });
});
