// The gateway when things go wrong: upstreams that break before or after their first
// byte, clients that stall or leave, bodies that nest too deep, models that cannot answer.
// A real llmgw server in this process, `external` profiles pointing at fake upstreams
// (test/support/fake-upstream.ts), the official openai client where the client's view
// matters, and raw sockets where the bytes on the wire do.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import net from "node:net";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import OpenAI from "openai";
import { startHarness, type Harness } from "../../test/support/server-harness.ts";
import { fakeUpstreams } from "../../test/support/fake-upstream.ts";
import { eventually } from "../../test/support/eventually.ts";
import { writeTinyLlamaGguf } from "../gguf/tiny-model.ts";
import { silentLogger } from "../core/log.ts";
import type { RenderedError } from "../core/errors.ts";
import { ReplicaTable } from "../fleet/replica-table.ts";
import { StorageUnavailableError } from "../store/storage-fault.ts";
import { Gateway } from "./gateway.ts";
import { UpstreamPools } from "./upstream.ts";

const hi = [{ role: "user" as const, content: "hi" }];

describe("gateway under faults", () => {
  let harness: Harness;
  let key: string;
  let keyId: string;
  let client: OpenAI;
  let modelDir: string;
  let ggufFile: string;
  const upstreams = fakeUpstreams();
  const upstream = upstreams.start;
  const addModel = (body: { name: string; [field: string]: unknown }) => harness.addModel(body);
  const usageRows = () => harness.server.store.db.selectFrom("usage").selectAll().where("key_id", "=", keyId).orderBy("id").execute();

  before(async () => {
    harness = await startHarness({ maxBodyBytes: 64 * 1024 });
    const created = await harness.admin("POST", "/api/v1/keys", { name: "faults" });
    key = created.body.key;
    keyId = created.body.id;
    client = new OpenAI({ apiKey: key, baseURL: `${harness.url}/v1`, maxRetries: 0 });
    modelDir = mkdtempSync(path.join(tmpdir(), "llmgw-gateway-faults-"));
    ggufFile = path.join(modelDir, "tiny.gguf");
    await writeTinyLlamaGguf({ path: ggufFile, seed: 3 });
  });

  after(async () => {
    await harness.close();
    await upstreams.closeAll();
    rmSync(modelDir, { recursive: true, force: true });
  });

  test("an upstream that fails after its headers but before any byte is retried on another replica", async () => {
    const broken = await upstream({ resetAfterHeaders: true });
    const good = await upstream({ reply: "from the good one" });
    await addModel({
      name: "headers-then-reset",
      profiles: [
        { name: "a-broken", engine: "external", url: broken.url },
        { name: "b-good", engine: "external", url: good.url },
      ],
    });
    for (let i = 0; i < 4; i += 1) {
      const answer = await client.chat.completions.create({ model: "headers-then-reset", messages: hi });
      assert.equal(answer.choices[0]?.message.content, "from the good one");
      let text = "";
      for await (const chunk of await client.chat.completions.create({ model: "headers-then-reset", messages: hi, stream: true }))
        text += chunk.choices[0]?.delta.content ?? "";
      assert.equal(text, "from the good one");
    }
    assert.ok(broken.requests.length >= 1, "the broken replica was tried");
  });

  test("a stream broken after its first byte ends with an error event: the SDK raises APIError, and no [DONE] follows", async () => {
    const breaking = await upstream({ reply: "one two three four five", chunkDelayMs: 10, resetAfterChunks: 2 });
    await addModel({ name: "breaks-mid-stream", profiles: [{ name: "p", engine: "external", url: breaking.url }] });
    let text = "";
    await assert.rejects(
      (async () => {
        for await (const chunk of await client.chat.completions.create({ model: "breaks-mid-stream", messages: hi, stream: true }))
          text += chunk.choices[0]?.delta.content ?? "";
      })(),
      (error: unknown) => {
        assert.ok(error instanceof OpenAI.APIError, `expected APIError, got ${String(error)}`);
        assert.ok(!(error instanceof OpenAI.APIConnectionError), "not a connection error: the gateway said what happened");
        assert.equal(error.code, "upstream_failed");
        assert.match(error.message, /breaks-mid-stream/);
        return true;
      },
    );
    assert.equal(text, "one two", "the chunks before the break arrived");
    const raw = await fetch(`${harness.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "breaks-mid-stream", messages: hi, stream: true }),
    });
    const events = (await raw.text()).split("\n\n").filter((event) => event !== "");
    assert.match(events.at(-1)!, /^data: \{"error":\{.*"type":"server_error".*"code":"upstream_failed"/);
    assert.ok(!events.some((event) => event.includes("[DONE]")), "never [DONE] after a failure");
  });

  test("a stream the upstream ends early without [DONE] is a failure: its own error event passes, silence gets llmgw's", async () => {
    const silent = await upstream({ reply: "one two three", endStreamEarly: "silently" });
    const saying = await upstream({ reply: "one two three", endStreamEarly: "with-error" });
    await addModel({ name: "ends-silently", profiles: [{ name: "p", engine: "external", url: silent.url }] });
    await addModel({ name: "ends-saying-why", profiles: [{ name: "p", engine: "external", url: saying.url }] });
    const consume = async (model: string) => {
      for await (const _chunk of await client.chat.completions.create({ model, messages: hi, stream: true })) {
        // the first chunk arrives; then the stream ends early
      }
    };
    await assert.rejects(consume("ends-silently"), (error: unknown) => error instanceof OpenAI.APIError && error.code === "upstream_failed");
    await assert.rejects(consume("ends-saying-why"), (error: unknown) => error instanceof OpenAI.APIError && error.code === "engine_stopping");
    const rows = await eventually("usage rows of both streams", async () => {
      const found = (await usageRows()).filter((r) => r.model === "ends-silently" || r.model === "ends-saying-why");
      return found.length === 2 ? found : undefined;
    });
    assert.deepEqual(
      rows.map((r) => r.status),
      [502, 502],
    );
  });

  test("a JSON answer cut mid-way closes the connection instead of looking complete", async () => {
    const cut = await upstream({ resetMidBody: true });
    await addModel({ name: "cut-json", profiles: [{ name: "p", engine: "external", url: cut.url }] });
    const response = await fetch(`${harness.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "cut-json", messages: hi }),
    });
    assert.equal(response.status, 200, "the status went out with the first byte");
    await assert.rejects(response.text(), "reading the rest fails: the connection was closed");
  });

  test("streams carry token counts without the client asking, and the client sees exactly the chunks it would without llmgw", async () => {
    const counted = await upstream({ reply: "alpha beta gamma delta" });
    await addModel({ name: "counted", profiles: [{ name: "p", engine: "external", url: counted.url, upstream_model: "counted" }] });
    const collect = async (sdk: OpenAI) => {
      const chunks: unknown[] = [];
      for await (const chunk of await sdk.chat.completions.create({ model: "counted", messages: hi, stream: true })) chunks.push(chunk);
      return chunks;
    };
    const direct = await collect(new OpenAI({ apiKey: "unused", baseURL: `${counted.url}/v1`, maxRetries: 0 }));
    const before = (await usageRows()).length;
    const through = await collect(client);
    assert.deepEqual(through, direct);
    assert.ok(
      direct.every((chunk) => !Object.hasOwn(chunk as object, "usage")),
      "the client did not ask for usage and sees none",
    );
    assert.equal(counted.requests.at(-1)?.body.stream_options?.include_usage, true, "the gateway asked the upstream for usage");
    const row = await eventually("the stream's usage row", async () => (await usageRows()).slice(before).find((r) => r.model === "counted"));
    assert.equal(row.completion_tokens, 4);
    assert.equal(row.prompt_tokens, 7);
    assert.equal(row.stream, 1);
    // A client that asks gets the usage chunk as the upstream sent it.
    let usage: OpenAI.CompletionUsage | undefined;
    for await (const chunk of await client.chat.completions.create({ model: "counted", messages: hi, stream: true, stream_options: { include_usage: true } }))
      usage = chunk.usage ?? usage;
    assert.equal(usage?.completion_tokens, 4);
  });

  test("a usage row for every outcome once the key is known, with its status", async () => {
    const held = await upstream({ reply: "held stream", beforeNextChunk: () => new Promise<void>(() => undefined) });
    const breaking = await upstream({ reply: "a b c", chunkDelayMs: 10, resetAfterChunks: 1 });
    const fine = await upstream({});
    await addModel({ name: "outcomes-ok", profiles: [{ name: "p", engine: "external", url: fine.url }] });
    await addModel({ name: "outcomes-held", profiles: [{ name: "p", engine: "external", url: held.url, max_inflight: 1 }], queue_size: 0 });
    await addModel({ name: "outcomes-broken", profiles: [{ name: "p", engine: "external", url: breaking.url }] });
    await addModel({
      name: "outcomes-idle",
      scaling: { min: 0, max: 1 },
      source: { kind: "file", path: ggufFile },
      profiles: [{ name: "cpu", engine: "llamacpp" }],
    });
    const before = (await usageRows()).length;
    const post = (body: unknown) =>
      fetch(`${harness.url}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
        body: typeof body === "string" ? body : JSON.stringify(body),
      });

    assert.equal((await post({ model: "outcomes-ok", messages: hi })).status, 200);
    assert.equal((await post({ model: "outcomes-ok", messages: hi, temperature: 9 })).status, 400);
    assert.equal((await post({ model: "no-such-model", messages: hi })).status, 404);
    assert.equal((await post({ model: "outcomes-ok", messages: [{ role: "user", content: "x".repeat(70 * 1024) }] })).status, 413);
    assert.equal((await post({ model: "outcomes-idle", messages: hi })).status, 503);
    const broken = await post({ model: "outcomes-broken", messages: hi, stream: true });
    await broken.text().catch(() => undefined);
    // One stream holds the only slot of outcomes-held (which queues nothing): the next
    // request gets 429; then the holder leaves (499).
    const leaving = new AbortController();
    const holding = await fetch(`${harness.url}/v1/chat/completions`, {
      method: "POST",
      signal: leaving.signal,
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "outcomes-held", messages: hi, stream: true }),
    });
    assert.equal(holding.status, 200);
    assert.equal((await post({ model: "outcomes-held", messages: hi })).status, 429);
    leaving.abort();
    await holding.body?.cancel().catch(() => undefined);

    const rows = await eventually("a usage row per outcome", async () => {
      const found = (await usageRows()).slice(before);
      const statuses = new Set(found.map((r) => r.status));
      return [200, 400, 404, 413, 503, 502, 429, 499].every((status) => statuses.has(status)) ? found : undefined;
    });
    const byStatus = (status: number) => rows.filter((r) => r.status === status);
    assert.equal(byStatus(404)[0]?.model, "no-such-model", "the model the client asked for");
    assert.equal(byStatus(413)[0]?.model, "-", "refused before the body named a model");
    assert.equal(byStatus(502)[0]?.model, "outcomes-broken");
    assert.equal(byStatus(429)[0]?.model, "outcomes-held");
    assert.ok(byStatus(200)[0]?.completion_tokens !== null);
    assert.ok(rows.every((r) => r.key_id === keyId));
  });

  test("a body nested too deep for re-serialising is a 400, and the server keeps answering", async () => {
    const deep = await upstream({});
    await addModel({ name: "deep-target", aliases: ["deep-alias"], profiles: [{ name: "p", engine: "external", url: deep.url, upstream_model: "renamed" }] });
    const nested = "[".repeat(20_000) + "]".repeat(20_000);
    const response = await fetch(`${harness.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: `{"model":"deep-alias","messages":[{"role":"user","content":"hi"}],"extra":${nested}}`,
    });
    assert.equal(response.status, 400);
    assert.equal(((await response.json()) as RenderedError["body"]).error.code, "json_too_deep");
    const answer = await client.chat.completions.create({ model: "deep-alias", messages: hi, stream: true });
    for await (const _chunk of answer) {
      // drained
    }
    assert.equal(deep.requests.at(-1)?.body.model, "renamed", "an alias still reaches the upstream under its upstream name");
  });

  test("a 503 tells a client key what is wrong without the server's paths or engine log lines; an admin sees the reason", async () => {
    await addModel({
      name: "parked-one",
      scaling: { min: 0, max: 1 },
      source: { kind: "file", path: ggufFile },
      profiles: [{ name: "cpu", engine: "llamacpp" }],
    });
    const model = harness.server.catalog.get("parked-one");
    const secretError = "llama.cpp: error loading model: /srv/llmgw/secret-models/x.gguf: tensor 'blk.0' has wrong shape";
    harness.server.replicas.upsert({
      id: "r-parked-test",
      modelId: model.id,
      modelName: model.name,
      profile: "cpu",
      engine: "llamacpp",
      nodeIds: ["local"],
      state: "parked",
      endpoint: null,
      engineKey: null,
      upstreamModel: model.name,
      weight: 1,
      slots: 1,
      attempt: 5,
      failures: 5,
      lastError: secretError,
      startedAt: null,
      readyAt: null,
    });
    try {
      await assert.rejects(client.chat.completions.create({ model: "parked-one", messages: hi }), (error: unknown) => {
        assert.ok(error instanceof OpenAI.APIError && error.status === 503);
        assert.equal(error.code, "model_parked");
        assert.match(error.message, /parked/);
        assert.doesNotMatch(error.message, /\/srv|secret|tensor|llama\.cpp:/);
        return true;
      });
      const asAdmin = new OpenAI({ apiKey: harness.adminKey, baseURL: `${harness.url}/v1`, maxRetries: 0 });
      await assert.rejects(asAdmin.chat.completions.create({ model: "parked-one", messages: hi }), (error: unknown) => {
        assert.ok(error instanceof OpenAI.APIError);
        assert.match(error.message, /wrong shape/);
        return true;
      });
    } finally {
      harness.server.replicas.remove("r-parked-test");
    }
  });
});

describe("gateway and clients that stall", () => {
  let harness: Harness;
  let key: string;
  const upstreams = fakeUpstreams();

  before(async () => {
    harness = await startHarness({ stalledReaderMs: 300 });
    key = await harness.clientKey();
  });

  after(async () => {
    await harness.close();
    await upstreams.closeAll();
  });

  const connect = async () => {
    const socket = net.connect(Number(new URL(harness.url).port), "127.0.0.1");
    let received = "";
    let closed = false;
    socket.on("data", (chunk: Buffer) => {
      received += chunk.toString("latin1");
    });
    socket.on("close", () => {
      closed = true;
    });
    socket.on("error", () => undefined);
    await new Promise<void>((resolve) => socket.once("connect", () => resolve()));
    return { socket, received: () => received, closed: () => closed };
  };

  test("a client that stops reading a long answer is cut off and its replica slot freed", { timeout: 120_000 }, async () => {
    // 100 chunks of 256 KiB: far more than the sockets on the way can buffer (a few MiB each).
    const long = await upstreams.start({ reply: Array.from({ length: 100 }, (_, i) => `w${i}`).join(" "), wordBytes: 256 * 1024 });
    const model = await harness.addModel({ name: "long-answer", profiles: [{ name: "p", engine: "external", url: long.url, max_inflight: 1 }] });
    const replicaId = harness.server.replicas.forModel(model.id)[0]!.id;
    const { socket } = await connect();
    // Reads nothing from here on (a paused socket also reports no close until it reads).
    socket.pause();
    const body = JSON.stringify({ model: "long-answer", messages: [{ role: "user", content: "hi" }], stream: true });
    socket.write(
      `POST /v1/chat/completions HTTP/1.1\r\nHost: llmgw\r\nAuthorization: Bearer ${key}\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`,
    );
    await eventually("the request to hold the replica's slot", () => harness.server.gateway.inFlightOf(replicaId) === 1);
    await eventually("the stalled reader to be cut off and the slot freed", () => harness.server.gateway.inFlightOf(replicaId) === 0, { timeoutMs: 60_000 });
    const row = await eventually(
      "its usage row",
      async () => (await harness.server.store.db.selectFrom("usage").selectAll().where("model", "=", "long-answer").execute())[0],
    );
    assert.equal(row.status, 499, "cut off as a client gone, not an answer relayed whole");
    socket.destroy();
  });

  test("an answer sent before the body was read (a wrong key) closes the connection, so the body cannot be trickled forever", async () => {
    const { socket, received, closed } = await connect();
    socket.write(
      "POST /v1/chat/completions HTTP/1.1\r\nHost: llmgw\r\nAuthorization: Bearer wrong-key\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{",
    );
    await eventually("the server to answer 401 and close, not wait for the rest of the body", () => closed());
    assert.match(received(), /^HTTP\/1\.1 401 /);
    assert.match(received(), /connection: close/i);
  });
});

test("a storage fault met before the key is known is a 503 that names no server path or database address and keeps the fault's Retry-After", async () => {
  // The key service behind the gateway's narrow KeyVerifier interface, as it fails when
  // PostgreSQL is unreachable: its StorageUnavailableError names where the data lives.
  const keys = {
    verify: async () => {
      throw new StorageUnavailableError({
        where: "PostgreSQL at postgres://db.internal:5432/llmgw",
        kind: "unreachable",
        faultCode: "ECONNREFUSED",
        cause: new Error("connect ECONNREFUSED"),
      });
    },
  };
  const replicas = new ReplicaTable();
  const gateway = new Gateway({ catalog: { resolve: () => undefined, list: () => [] }, keys, replicas, pools: new UpstreamPools(), logger: silentLogger() });
  const server = http.createServer(gateway.handle);
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  try {
    const { port } = server.address() as net.AddressInfo;
    const response = await fetch(`http://127.0.0.1:${port}/v1/models`, { headers: { authorization: "Bearer llmgw-any" } });
    assert.equal(response.status, 503);
    assert.equal(response.headers.get("retry-after"), "5", "the fault's own wait: an unreachable database is used again within seconds");
    const { error } = (await response.json()) as { error: { code: string; message: string } };
    assert.equal(error.code, "storage_unavailable");
    assert.match(error.message, /cannot use its database right now, so it cannot check this key or its limits\. Retry in 5 s; .*tell an administrator/);
    assert.doesNotMatch(error.message, /postgres|db\.internal|5432/);
  } finally {
    gateway.close();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }
});

describe("gateway time limits", () => {
  let harness: Harness;
  let key: string;
  let keyId: string;

  before(async () => {
    harness = await startHarness({ bodyTimeoutMs: 300, headerTimeoutMs: 400, keepAliveTimeoutMs: 300 });
    const created = await harness.admin("POST", "/api/v1/keys", { name: "stalling" });
    key = created.body.key;
    keyId = created.body.id;
  });

  after(async () => {
    await harness.close();
  });

  /** Opens a raw connection, writes `text`, and collects what the server sends until it closes. */
  const rawExchange = async (text: string) => {
    const { port } = new URL(harness.url);
    const socket = net.connect(Number(port), "127.0.0.1");
    let received = "";
    let closed = false;
    socket.setEncoding("utf8");
    socket.on("data", (chunk: string) => {
      received += chunk;
    });
    socket.on("close", () => {
      closed = true;
    });
    socket.on("error", () => undefined);
    await new Promise<void>((resolve) => socket.once("connect", () => resolve()));
    socket.write(text);
    return { received: () => received, closed: () => closed, socket };
  };

  test("a body that stalls gets 408 and the connection closes; the usage row says 408", async () => {
    const exchange = await rawExchange(
      `POST /v1/chat/completions HTTP/1.1\r\nHost: llmgw\r\nAuthorization: Bearer ${key}\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n{"model":"x",`,
    );
    await eventually("the server to close the stalled connection", () => exchange.closed(), { timeoutMs: 30_000 });
    assert.match(exchange.received(), /^HTTP\/1\.1 408 /);
    assert.match(exchange.received(), /body_timeout/);
    const row = await eventually(
      "a usage row for the stalled body",
      async () => (await harness.server.store.db.selectFrom("usage").selectAll().where("key_id", "=", keyId).execute())[0],
    );
    assert.equal(row.status, 408);
  });

  test("an admin API body that stalls gets the same 408, and an oversized one 413", async () => {
    const exchange = await rawExchange(
      `POST /api/v1/models HTTP/1.1\r\nHost: llmgw\r\nAuthorization: Bearer ${harness.adminKey}\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n{"name":`,
    );
    await eventually("the server to close the stalled admin request", () => exchange.closed(), { timeoutMs: 30_000 });
    assert.match(exchange.received(), /^HTTP\/1\.1 408 /);
    assert.match(exchange.received(), /body_timeout/);
    const huge = await harness.admin("POST", "/api/v1/models", { name: "big", description: "x".repeat(2 * 1024 * 1024) });
    assert.equal(huge.status, 413);
    assert.equal(huge.body.error.code, "request_too_large");
  });

  test("headers that stall get 408 and the connection closes", async () => {
    const exchange = await rawExchange("POST /v1/chat/completions HTTP/1.1\r\nHost: llmgw\r\n");
    await eventually("the server to close the connection with stalled headers", () => exchange.closed(), { timeoutMs: 30_000 });
    assert.match(exchange.received(), /^HTTP\/1\.1 408 /);
  });

  test("an idle keep-alive connection is closed", async () => {
    const exchange = await rawExchange("GET /healthz HTTP/1.1\r\nHost: llmgw\r\nConnection: keep-alive\r\n\r\n");
    await eventually("the answer", () => /\r\n\r\n\{.*\}/s.test(exchange.received()));
    assert.match(exchange.received(), /^HTTP\/1\.1 200 /);
    await eventually("the server to close the idle connection", () => exchange.closed(), { timeoutMs: 30_000 });
  });
});
