// Autoscaling end to end (issue 28): a real server with its local node and the bundled
// engine on a generated model, the official openai client as the application. Requests
// queued beyond the target for up_after start a second replica, which takes the queue; a
// load below half the target for down_after stops one of the two while each has a stream
// in flight, and the one that goes is drained: its stream ends complete, and only then does
// its engine stop. The fleet's clock is the test's, so "for up_after" is a step of the
// clock, not a wait; engines start and answer in real time.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import OpenAI from "openai";
import { writeTinyLlamaGguf } from "../src/gguf/tiny-model.ts";
import type { StoredEvent } from "../src/events/event-log.ts";
import { startHarnessWithAgent, type Harness } from "./support/server-harness.ts";
import { eventually } from "./support/eventually.ts";

/** Tokens each stream asks for: enough that it is still being generated while the test looks at the fleet. */
const STREAM_TOKENS = 1500;

describe("autoscaling with the bundled engine", { timeout: 300_000 }, () => {
  let harness: Harness;
  let modelDir: string;
  let client: OpenAI;
  let offset = 0;

  before(async () => {
    modelDir = mkdtempSync(path.join(tmpdir(), "llmgw-autoscaling-"));
    const modelFile = path.join(modelDir, "tiny.gguf");
    // Endless: no end-of-text token, so every stream runs to its max_tokens.
    await writeTinyLlamaGguf({ path: modelFile, seed: 28, endless: true });
    // The node timeout is far beyond the steps of the clock below, so moving it loses no node.
    ({ harness } = await startHarnessWithAgent({ fleetClock: () => Date.now() + offset, nodeTimeoutMs: 3_600_000, supervisor: { stopGraceMs: 3000 } }));
    await harness.addModel({
      name: "elastic",
      source: { kind: "file", path: modelFile },
      // One request per replica at a time; 3 in flight and queued per replica is the target.
      scaling: { min: 1, max: 2, target: 3, up_after: 10, down_after: 60 },
      profiles: [{ name: "cpu", engine: "llamacpp", ctx_size: 2048, parallel: 1, threads: 1 }],
    });
    client = new OpenAI({ apiKey: harness.adminKey, baseURL: `${harness.url}/v1`, maxRetries: 0, timeout: 120_000 });
    await eventually("the first replica ready", () => replicas().some((r) => r.state === "ready"), { timeoutMs: 120_000 });
  });

  after(async () => {
    await harness?.close();
    rmSync(modelDir, { recursive: true, force: true });
  });

  const replicas = () => harness.server.replicas.all().filter((r) => r.modelName === "elastic");
  const ready = () => replicas().filter((r) => r.state === "ready");
  const modelId = () => replicas()[0]!.modelId;
  const open = () =>
    client.chat.completions.create({
      model: "elastic",
      messages: [{ role: "user", content: "Count" }],
      max_tokens: STREAM_TOKENS,
      stream: true,
      stream_options: { include_usage: true },
      temperature: 0,
    });
  /** Reads the rest of a stream: the tokens the engine generated for it and how it finished. */
  const readRest = async (iterator: AsyncIterator<OpenAI.ChatCompletionChunk>) => {
    let tokens: number | undefined;
    let finish: string | null = null;
    for (let next = await iterator.next(); !next.done; next = await iterator.next()) {
      finish = next.value.choices[0]?.finish_reason ?? finish;
      tokens = next.value.usage?.completion_tokens ?? tokens;
    }
    return { tokens, finish };
  };
  const complete = { tokens: STREAM_TOKENS, finish: "length" };
  /** The fleet's clock moves on by `ms`; then its tick runs (the autoscaler decides on it). */
  const tick = async (ms: number) => {
    offset += ms;
    harness.server.fleet.checkNow();
    await harness.server.fleet.settled();
  };
  const scaled = async (count: number) =>
    eventually(`${count} model_scaled events`, async () => {
      const events = await harness.server.events.list({ kinds: ["model_scaled"] });
      return events.length >= count ? events.sort((a: StoredEvent, b: StoredEvent) => a.id - b.id) : undefined;
    });

  test("requests queued beyond the target for up_after start a second replica, which takes the queue", async () => {
    // 4 at once on 1 replica that serves 1: 1 in flight and 3 queued, above the target of 3.
    const streams = Array.from({ length: 4 }, () => open());
    await eventually("1 in flight and 3 queued", () => harness.server.gateway.waitingFor(modelId()) === 3);
    await tick(1_000);
    assert.equal(replicas().length, 1, "not before up_after");
    await tick(10_000);
    await eventually("a second replica placed", () => replicas().length === 2);
    const [up] = await scaled(1);
    assert.deepEqual({ ...up!.data, why: undefined }, { model: "elastic", direction: "up", from: 1, to: 2, why: undefined });
    assert.match(String(up!.data.why), /^4 requests in flight and queued over 1 replica \(target 3 each\) for 1\d s$/);
    await eventually("both replicas ready", () => ready().length === 2, { timeoutMs: 120_000 });
    // Every request is answered in full: the queued ones by either replica.
    for (const stream of streams) assert.deepEqual(await readRest((await stream)[Symbol.asyncIterator]()), complete);
    const health = await harness.admin("GET", "/api/v1/models/elastic/health");
    assert.equal(health.body.autoscaling.desired, 2);
    assert.equal(health.body.autoscaling.last.direction, "up");
  });

  test("below half the target for down_after, one replica goes, drained of its stream first", async () => {
    assert.equal(ready().length, 2);
    // One stream on each replica (each serves one at a time): 2 over 2 replicas, below half the target of 3.
    const first = await open();
    const second = await open();
    const iterators = [first, second].map((stream) => stream[Symbol.asyncIterator]());
    for (const iterator of iterators) await iterator.next();
    const busy = ready().filter((replica) => harness.server.gateway.inFlightOf(replica.id) > 0);
    assert.equal(busy.length, 2, "a stream in flight at each replica");

    const stoppingSeen = new Map<string, number>();
    const unsubscribe = harness.server.replicas.onChange((replica) => {
      // How many requests the replica had when it left routing: a drained stop has them finish first.
      if (replica.modelName === "elastic" && replica.state === "stopping" && !stoppingSeen.has(replica.id))
        stoppingSeen.set(replica.id, harness.server.gateway.inFlightOf(replica.id));
    });
    try {
      await tick(1_000);
      await tick(61_000);
      await eventually("one replica leaves routing", () => stoppingSeen.size === 1);
      const [goneId, inFlightThen] = [...stoppingSeen][0]!;
      assert.equal(inFlightThen, 1, "it still had its stream in flight");
      assert.ok(
        replicas().some((r) => r.id === goneId && r.state === "stopping"),
        "and keeps running it while it drains",
      );
      const [, down] = await scaled(2);
      assert.deepEqual({ ...down!.data, why: undefined }, { model: "elastic", direction: "down", from: 2, to: 1, why: undefined });

      // Both streams end complete: the drained replica's engine was not stopped under its request.
      const rest = await Promise.all(iterators.map(readRest));
      for (const result of rest) assert.deepEqual(result, complete);
      await eventually("the drained replica gone", () => !replicas().some((r) => r.id === goneId), { timeoutMs: 60_000 });
    } finally {
      unsubscribe();
    }
    assert.equal(ready().length, 1);
    // One left, and requests still answered.
    const answer = await client.chat.completions.create({ model: "elastic", messages: [{ role: "user", content: "Hi" }], max_tokens: 3 });
    assert.equal(answer.usage?.completion_tokens, 3);
  });
});
