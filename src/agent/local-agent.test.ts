// The local agent inside a real server: real engine processes (`llmgw engine` on a tiny
// generated GGUF), real supervisors, the gateway routing to them. Timings are shortened
// so failures park quickly.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, readdirSync, rmSync, truncateSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import OpenAI from "openai";
import { writeTinyLlamaGguf } from "../gguf/tiny-model.ts";
import { startHarnessWithAgent, type Harness } from "../../test/support/server-harness.ts";
import type { LocalAgent } from "./local-agent.ts";
import { processIsGone } from "../../test/support/engine-process.ts";
import { eventually } from "../../test/support/eventually.ts";
import type { ReplicaState } from "../fleet/replica-table.ts";

describe("local agent", () => {
  let harness: Harness;
  let agent: LocalAgent;
  let modelDir: string;
  let modelFile: string;

  before(async () => {
    modelDir = mkdtempSync(path.join(tmpdir(), "llmgw-agent-models-"));
    modelFile = path.join(modelDir, "tiny.gguf");
    await writeTinyLlamaGguf({ path: modelFile, seed: 7 });
    ({ harness, agent } = await startHarnessWithAgent({
      supervisor: { backoff: { initialMs: 50, maxMs: 200 }, parkAfter: { failures: 3, windowMs: 60_000 }, stopGraceMs: 3000 },
    }));
  });

  after(async () => {
    await harness.close();
    rmSync(modelDir, { recursive: true, force: true });
  });

  test("weights that went bad after the model was added are recorded and park the model instead of looping", async () => {
    // The catalog refuses bad weights at the door, so the file is cut short (as by an
    // interrupted copy) after the model was accepted, then the model is started.
    const brokenFile = path.join(modelDir, "broken.gguf");
    const { bytes } = await writeTinyLlamaGguf({ path: brokenFile, seed: 8 });
    const created = await harness.admin("POST", "/api/v1/models", {
      name: "broken",
      scaling: { min: 0, max: 1 },
      source: { kind: "file", path: brokenFile },
      profiles: [{ name: "cpu", engine: "llamacpp", ctx_size: 512, parallel: 1 }],
    });
    assert.equal(created.status, 201);
    truncateSync(brokenFile, Math.floor(bytes / 2));
    assert.equal((await harness.admin("PATCH", "/api/v1/models/broken", { scaling: { min: 1 } })).status, 200);
    const parked = await eventually("the broken model to park", async () => {
      const { body } = await harness.admin("GET", "/api/v1/models/broken");
      return body.health.state === "parked" ? body : undefined;
    });
    assert.match(parked.health.reason, /broken\.gguf is truncated/);
    assert.match(parked.health.reason, /parked after 3 failed starts/);
    assert.equal(parked.replicas[0].failures, 3);

    const key = await harness.clientKey();
    const response = await fetch(`${harness.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "broken", messages: [{ role: "user", content: "x" }] }),
    });
    assert.equal(response.status, 503);
    const error = ((await response.json()) as any).error;
    // The reason (with the path) is for administrators (above); what a client is told is the gateway's.
    assert.equal(error.code, "model_parked");
    assert.doesNotMatch(error.message, /broken\.gguf/, "a client key is not shown the server's paths");

    // Any change to the definition ends parking: the same replica starts a new run (a new
    // state folder) even though nothing about how the engine runs changed.
    const parkedReplica = harness.server.replicas.all().find((r) => r.modelName === "broken")!;
    const runsOf = () => readdirSync(path.join(harness.dataDir, "runs")).filter((d) => d.startsWith(parkedReplica.id)).length;
    assert.equal(runsOf(), 1);
    assert.equal((await harness.admin("PATCH", "/api/v1/models/broken", { description: "try again" })).status, 200);
    await eventually("a second run of the parked replica", () => runsOf() === 2);
    assert.equal(harness.server.replicas.get(parkedReplica.id)?.id, parkedReplica.id, "the replica was unparked, not replaced");

    // Fixing the weights source replaces the replica, which starts afresh.
    const fixed = await harness.admin("PATCH", "/api/v1/models/broken", { source: { kind: "file", path: modelFile } });
    assert.equal(fixed.status, 200);
    await eventually("the fixed model to become ready", async () => {
      const { body } = await harness.admin("GET", "/api/v1/models/broken");
      return body.health.state === "ready" ? body : undefined;
    });
    await harness.admin("DELETE", "/api/v1/models/broken");
  });

  test("a model is served by a supervised engine, and deleting it stops the engine", async () => {
    assert.equal(
      (await harness.admin("POST", "/api/v1/models", { name: "tiny", source: { kind: "file", path: modelFile }, profiles: [{ name: "cpu", engine: "llamacpp", ctx_size: 1024, parallel: 2 }] })).status,
      201,
    );
    await eventually("tiny to be ready", async () => {
      const { body } = await harness.admin("GET", "/api/v1/models/tiny");
      return body.health.state === "ready" ? body : undefined;
    });
    const client = new OpenAI({ apiKey: await harness.clientKey(), baseURL: `${harness.url}/v1`, maxRetries: 0 });
    const answer = await client.chat.completions.create({ model: "tiny", messages: [{ role: "user", content: "Hello" }], max_tokens: 5 });
    assert.equal(answer.usage?.completion_tokens, 5);
    assert.equal(answer.choices[0]?.finish_reason, "length");

    const replica = harness.server.replicas.all().find((r) => r.modelName === "tiny")!;
    const engineResponse = await fetch(`${replica.endpoint!.origin}/v1/models`);
    assert.equal(engineResponse.status, 401, "the engine refuses requests without the engine key");

    const pid = agent.engineProcesses().find((p) => p.modelName === "tiny")!.pid;
    assert.ok(!processIsGone(pid));
    // What the replica table shows while the model is deleted, and whether the engine was
    // still running at each step: the replica stays, as "stopping", until its engine is gone.
    const seen: Array<{ state: ReplicaState | "removed"; engineGone: boolean }> = [];
    const unsubscribe = harness.server.replicas.onChange((changed, removed) => {
      if (changed.id === replica.id) seen.push({ state: removed ? "removed" : changed.state, engineGone: processIsGone(pid) });
    });
    try {
      await harness.admin("DELETE", "/api/v1/models/tiny");
      await eventually("the replica of the deleted model to be removed", () => seen.at(-1)?.state === "removed");
    } finally {
      unsubscribe();
    }
    assert.ok(processIsGone(pid), "the engine exited");
    assert.equal(harness.server.replicas.all().filter((r) => r.modelName === "tiny").length, 0);
    assert.deepEqual(
      seen.map((step) => step.state).filter((state, i, all) => state !== all[i - 1]),
      ["stopping", "stopped", "removed"],
    );
    assert.equal(seen.find((step) => step.state === "stopping")?.engineGone, false, "stopping is shown while the engine still runs");
    assert.equal(seen.at(-1)?.engineGone, true, "the replica is removed only once its engine is gone");
    assert.deepEqual(agent.engineProcesses().filter((p) => p.modelName === "tiny"), []);
  });
});
