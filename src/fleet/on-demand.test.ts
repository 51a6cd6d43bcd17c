// Models served on demand (scaling.min 0) in a real server with its local node: the first
// requests start a replica and wait for it in the admission queue, idle replicas stop,
// never under a request in flight, and a request that arrives while one stops waits for a
// fresh start. The fleet's clock is the test's, so "idle for its idle_seconds" is a step
// of the clock, not a wait.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import OpenAI from "openai";
import { writeTinyLlamaGguf } from "../gguf/tiny-model.ts";
import { startHarnessWithAgent, type Harness } from "../../test/support/server-harness.ts";
import { eventually } from "../../test/support/eventually.ts";

describe("on demand", () => {
  let harness: Harness;
  let modelDir: string;
  let client: OpenAI;
  let offset = 0;

  before(async () => {
    modelDir = mkdtempSync(path.join(tmpdir(), "llmgw-on-demand-"));
    const modelFile = path.join(modelDir, "tiny.gguf");
    await writeTinyLlamaGguf({ path: modelFile, seed: 5 });
    // The node timeout is far beyond the steps of the clock below, so moving it loses no node.
    ({ harness } = await startHarnessWithAgent({ fleetClock: () => Date.now() + offset, nodeTimeoutMs: 600_000, supervisor: { stopGraceMs: 3000 } }));
    await harness.addModel({
      name: "lazy",
      source: { kind: "file", path: modelFile },
      scaling: { min: 0, max: 1, idle_seconds: 5 },
      profiles: [{ name: "cpu", engine: "llamacpp", ctx_size: 1024, parallel: 4 }],
    });
    client = new OpenAI({ apiKey: harness.adminKey, baseURL: `${harness.url}/v1`, maxRetries: 0, timeout: 120_000 });
  });

  after(async () => {
    await harness.close();
    rmSync(modelDir, { recursive: true, force: true });
  });

  const lazyReplicas = () => harness.server.replicas.all().filter((r) => r.modelName === "lazy");
  const ask = () => client.chat.completions.create({ model: "lazy", messages: [{ role: "user", content: "Hello" }], max_tokens: 2 });

  test("a cold start with 20 concurrent requests starts one replica and answers them all", async () => {
    assert.deepEqual(lazyReplicas(), [], "nothing runs before the first request");
    const started = new Set<string>();
    const unsubscribe = harness.server.replicas.onChange((replica) => {
      if (replica.modelName === "lazy") started.add(replica.id);
    });
    try {
      const answers = await Promise.all(Array.from({ length: 20 }, () => ask()));
      assert.equal(answers.length, 20);
      for (const answer of answers) assert.equal(answer.usage?.completion_tokens, 2);
    } finally {
      unsubscribe();
    }
    assert.equal(started.size, 1, "one replica served the burst");
    assert.equal(lazyReplicas()[0]?.state, "ready");
  });

  test("an idle replica stops, never under a request in flight; a request during the stop waits for a fresh start", async () => {
    const [replica] = lazyReplicas();
    assert.ok(replica !== undefined && replica.state === "ready");
    // A stream read only to its first chunk: the request stays in flight.
    const stream = await client.chat.completions.create({ model: "lazy", messages: [{ role: "user", content: "Hello" }], max_tokens: 50, stream: true });
    const iterator = stream[Symbol.asyncIterator]();
    await iterator.next();
    offset += 6_000;
    harness.server.fleet.checkNow();
    assert.equal(harness.server.replicas.get(replica.id)?.state, "ready", "not stopped while a request is in flight");
    while (!(await iterator.next()).done) {
      // Read the rest: the request ends, and the idle clock starts from its end.
    }

    // The request that arrives while the replica stops: sent the moment it shows "stopping".
    let during: Promise<unknown> | undefined;
    const unsubscribe = harness.server.replicas.onChange((changed) => {
      if (changed.id === replica.id && changed.state === "stopping" && during === undefined) during = ask();
    });
    try {
      offset += 6_000;
      harness.server.fleet.checkNow();
      assert.equal(harness.server.replicas.get(replica.id)?.state, "stopping", "idle for longer than idle_seconds: it stops");
      assert.ok(during !== undefined, "a request was sent during the stop");
      const answer = (await during) as OpenAI.ChatCompletion;
      assert.equal(answer.usage?.completion_tokens, 2, "it waited for a fresh start instead of failing");
    } finally {
      unsubscribe();
    }
    await eventually("the idle replica gone", () => harness.server.replicas.get(replica.id) === undefined);
    const fresh = lazyReplicas();
    assert.equal(fresh.length, 1);
    assert.notEqual(fresh[0]!.id, replica.id, "a new replica answered it");
  });
});
