// Admission control over real HTTP: a real llmgw server in this process and fake
// upstreams whose answers the test holds at a gate, so it decides when a slot frees and
// can check who waited, who was refused and who went where.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import OpenAI from "openai";
import { startHarness, type Harness } from "../../test/support/server-harness.ts";
import { fakeUpstreams } from "../../test/support/fake-upstream.ts";
import { eventually } from "../../test/support/eventually.ts";
import { Gate } from "../../test/support/gate.ts";
import path from "node:path";
import { writeTinyLlamaGguf } from "../gguf/tiny-model.ts";

const hi = (n: number) => [{ role: "user" as const, content: `request ${n}` }];

describe("admission", () => {
  let harness: Harness;
  let client: OpenAI;
  const upstreams = fakeUpstreams();
  const upstream = upstreams.start;
  const addModel = (body: { name: string; [field: string]: unknown }) => harness.addModel(body);
  const gateway = () => harness.server.gateway;

  before(async () => {
    harness = await startHarness();
    client = new OpenAI({ apiKey: await harness.clientKey(), baseURL: `${harness.url}/v1`, maxRetries: 0 });
  });

  after(async () => {
    await harness.close();
    await upstreams.closeAll();
  });

  test("a replica never has more than its slots in flight; the others wait and are served in arrival order", async () => {
    const gate = new Gate();
    const busy = await upstream({ beforeAnswer: gate.wait });
    const model = await addModel({ name: "two-slots", profiles: [{ name: "p", engine: "external", url: busy.url, max_inflight: 2 }] });
    const answers: Promise<unknown>[] = [];
    for (let n = 0; n < 6; n += 1) {
      answers.push(client.chat.completions.create({ model: "two-slots", messages: hi(n) }));
      // Each request is in place (at the upstream or in the queue) before the next is sent.
      await eventually(`request ${n} admitted or queued`, () => busy.requests.length + gateway().waitingFor(model.id) === n + 1);
    }
    assert.equal(busy.inFlight(), 2);
    assert.equal(gateway().waitingFor(model.id), 4);
    gate.open();
    await Promise.all(answers);
    assert.equal(busy.maxInFlight(), 2, "never more than max_inflight at the upstream");
    assert.deepEqual(
      busy.requests.map((r) => r.body.messages[0].content),
      [0, 1, 2, 3, 4, 5].map((n) => `request ${n}`),
      "first come, first served",
    );
  });

  test("a full queue answers 429 model_overloaded with Retry-After, and sends nothing upstream", async () => {
    const gate = new Gate();
    const busy = await upstream({ beforeAnswer: gate.wait });
    const model = await addModel({ name: "tiny-queue", profiles: [{ name: "p", engine: "external", url: busy.url, max_inflight: 1 }], queue_size: 1 });
    const first = client.chat.completions.create({ model: "tiny-queue", messages: hi(1) });
    await eventually("the first request at the upstream", () => busy.inFlight() === 1);
    const second = client.chat.completions.create({ model: "tiny-queue", messages: hi(2) });
    await eventually("the second request queued", () => gateway().waitingFor(model.id) === 1);
    const third = await fetch(`${harness.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${client.apiKey}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "tiny-queue", messages: hi(3) }),
    });
    assert.equal(third.status, 429);
    assert.equal(third.headers.get("retry-after"), "1");
    const body = (await third.json()) as { error: { code: string; type: string; message: string } };
    assert.equal(body.error.code, "model_overloaded");
    assert.equal(body.error.type, "rate_limit_error");
    assert.match(body.error.message, /queue of 1 is full/);
    gate.open();
    await Promise.all([first, second]);
    assert.equal(busy.requests.length, 2, "the refused request never reached the upstream");
  });

  test("a wait past queue_timeout answers 503 queue_timeout", async () => {
    const gate = new Gate();
    const busy = await upstream({ beforeAnswer: gate.wait });
    await addModel({ name: "short-wait", profiles: [{ name: "p", engine: "external", url: busy.url, max_inflight: 1 }], queue_timeout: 0.5 });
    const first = client.chat.completions.create({ model: "short-wait", messages: hi(1) });
    await eventually("the first request at the upstream", () => busy.inFlight() === 1);
    await assert.rejects(client.chat.completions.create({ model: "short-wait", messages: hi(2) }), (error: unknown) => {
      assert.ok(error instanceof OpenAI.APIError && error.status === 503, String(error));
      assert.equal(error.code, "queue_timeout");
      assert.equal(error.headers?.get("retry-after"), "5");
      return true;
    });
    gate.open();
    await first;
    assert.equal(busy.requests.length, 1, "the request that timed out never reached the upstream");
  });

  test("a model whose only replica is still starting: the wait ends as model_starting, not as overload", async () => {
    const gguf = path.join(harness.dataDir, "starting.gguf");
    await writeTinyLlamaGguf({ path: gguf, seed: 6 });
    const model = await addModel({
      name: "still-starting",
      scaling: { min: 0, max: 1 },
      source: { kind: "file", path: gguf },
      profiles: [{ name: "cpu", engine: "llamacpp" }],
      queue_timeout: 0.5,
    });
    harness.server.replicas.upsert({
      id: "r-starting-test",
      modelId: model.id,
      modelName: model.name,
      profile: "cpu",
      engine: "llamacpp",
      nodeIds: ["local"],
      state: "starting",
      endpoint: null,
      engineKey: null,
      upstreamModel: model.name,
      weight: 1,
      slots: 1,
      attempt: 1,
      failures: 0,
      lastError: null,
      startedAt: null,
      readyAt: null,
    });
    try {
      await assert.rejects(client.chat.completions.create({ model: "still-starting", messages: hi(1) }), (error: unknown) => {
        assert.ok(error instanceof OpenAI.APIError && error.status === 503, String(error));
        assert.equal(error.code, "model_starting");
        return true;
      });
      assert.equal((await harness.admin("PATCH", "/api/v1/models/still-starting", { queue_size: 0 })).status, 200);
      await assert.rejects(client.chat.completions.create({ model: "still-starting", messages: hi(2) }), (error: unknown) => {
        assert.ok(error instanceof OpenAI.APIError && error.status === 503, `no 429 for a model that is starting: ${String(error)}`);
        assert.equal(error.code, "model_starting");
        return true;
      });
    } finally {
      harness.server.replicas.remove("r-starting-test");
    }
  });

  test("a waiting request goes to whichever replica frees a slot first", async () => {
    const gateA = new Gate();
    const gateB = new Gate();
    const a = await upstream({ beforeAnswer: gateA.wait, reply: "from a" });
    const b = await upstream({ beforeAnswer: gateB.wait, reply: "from b" });
    const model = await addModel({
      name: "two-replicas",
      profiles: [
        { name: "a", engine: "external", url: a.url, max_inflight: 1 },
        { name: "b", engine: "external", url: b.url, max_inflight: 1 },
      ],
    });
    const first = client.chat.completions.create({ model: "two-replicas", messages: hi(1) });
    const second = client.chat.completions.create({ model: "two-replicas", messages: hi(2) });
    await eventually("both replicas busy", () => a.inFlight() === 1 && b.inFlight() === 1);
    const third = client.chat.completions.create({ model: "two-replicas", messages: hi(3) });
    await eventually("the third request queued", () => gateway().waitingFor(model.id) === 1);
    gateB.releaseOne();
    await eventually("the third request at replica b", () => b.requests.length === 2);
    assert.equal(a.requests.length, 1, "replica a stayed busy and got nothing more");
    gateA.open();
    gateB.open();
    const answers = await Promise.all([first, second, third]);
    assert.equal(answers[2]?.choices[0]?.message.content, "from b");
  });

  test("requests go to the highest-priority profile with a ready replica, waiting for it when it is busy; a lower one serves when it is down", async () => {
    const held = new Gate();
    const primary = await upstream({ beforeAnswer: held.wait, reply: "primary" });
    const fallback = await upstream({ reply: "fallback" });
    const model = await addModel({
      name: "prioritised",
      profiles: [
        // Listed first and weighted higher, yet lower in priority: priority decides.
        { name: "fallback", engine: "external", url: fallback.url, priority: 0, weight: 10, max_inflight: 4 },
        { name: "primary", engine: "external", url: primary.url, priority: 5, max_inflight: 1 },
      ],
    });
    const first = client.chat.completions.create({ model: "prioritised", messages: hi(1) });
    await eventually("the primary busy", () => primary.inFlight() === 1);
    const second = client.chat.completions.create({ model: "prioritised", messages: hi(2) });
    await eventually("the second request waiting for the primary", () => gateway().waitingFor(model.id) === 1);
    held.open();
    assert.deepEqual(
      (await Promise.all([first, second])).map((a) => a.choices[0]?.message.content),
      ["primary", "primary"],
    );
    assert.equal(fallback.requests.length, 0, "an idle lower-priority replica gets nothing while the primary is ready");

    // The primary down (nothing listens there): the request fails over to the fallback.
    await harness.admin("PATCH", "/api/v1/models/prioritised", {
      profiles: [
        { name: "fallback", engine: "external", url: fallback.url, priority: 0, max_inflight: 4 },
        { name: "primary", engine: "external", url: "http://127.0.0.1:9", priority: 5, max_inflight: 1 },
      ],
    });
    const failedOver = await client.chat.completions.create({ model: "prioritised", messages: hi(3) });
    assert.equal(failedOver.choices[0]?.message.content, "fallback");
  });

  test("a client that leaves while waiting leaves the queue", async () => {
    const gate = new Gate();
    const busy = await upstream({ beforeAnswer: gate.wait });
    const model = await addModel({ name: "leave-queue", profiles: [{ name: "p", engine: "external", url: busy.url, max_inflight: 1 }] });
    const first = client.chat.completions.create({ model: "leave-queue", messages: hi(1) });
    await eventually("the first request at the upstream", () => busy.inFlight() === 1);
    const controller = new AbortController();
    const leaving = client.chat.completions.create({ model: "leave-queue", messages: hi(2) }, { signal: controller.signal });
    await eventually("the second request queued", () => gateway().waitingFor(model.id) === 1);
    controller.abort();
    await assert.rejects(leaving);
    await eventually("the queue to empty", () => gateway().waitingFor(model.id) === 0);
    gate.open();
    await first;
    assert.equal(busy.requests.length, 1, "the request that left never reached the upstream");
  });
});
