// The local node of `llmgw up` inside a real server: the in-process agent joined to the
// server's fleet, real engine processes (`llmgw engine` on a tiny generated GGUF), real
// supervisors, the gateway routing to them. Timings are shortened so failures park quickly.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { mkdtempSync, readdirSync, readFileSync, rmSync, truncateSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import OpenAI from "openai";
import { writeTinyLlamaGguf } from "../gguf/tiny-model.ts";
import type { RenderedError } from "../core/errors.ts";
import { startHarnessWithAgent, type Harness } from "../../test/support/server-harness.ts";
import type { NodeAgent } from "./node-agent.ts";
import { processIsGone } from "../../test/support/engine-process.ts";
import { UNLOADABLE_GGUF_COMPLAINT, writeUnloadableGguf } from "../../test/support/unloadable-gguf.ts";
import { eventually } from "../../test/support/eventually.ts";
import type { ReplicaState } from "../fleet/replica-table.ts";

describe("local node", () => {
  let harness: Harness;
  let agent: NodeAgent;
  let modelDir: string;
  let modelFile: string;

  before(async () => {
    modelDir = mkdtempSync(path.join(tmpdir(), "llmgw-agent-models-"));
    modelFile = path.join(modelDir, "tiny.gguf");
    // Endless: the random model may otherwise end a reply early on `<|im_end|>`, and the
    // answer below must run to max_tokens.
    await writeTinyLlamaGguf({ path: modelFile, seed: 7, endless: true });
    ({ harness, agent } = await startHarnessWithAgent({
      supervisor: { backoff: { initialMs: 50, maxMs: 200 }, parkAfter: { failures: 3, windowMs: 60_000 }, stopGraceMs: 3000 },
    }));
  });

  after(async () => {
    await harness.close();
    rmSync(modelDir, { recursive: true, force: true });
  });

  test("weights that went bad after the model was added are reported and never started", async () => {
    // The catalog refuses bad weights at the door, so the file is cut short (as by an
    // interrupted copy) after the model was accepted, then the model is started.
    const brokenFile = path.join(modelDir, "broken.gguf");
    const { bytes } = await writeTinyLlamaGguf({ path: brokenFile, seed: 8 });
    await harness.addModel({
      name: "broken",
      scaling: { min: 0, max: 1 },
      source: { kind: "file", path: brokenFile },
      profiles: [{ name: "cpu", engine: "llamacpp", ctx_size: 512, parallel: 1 }],
    });
    truncateSync(brokenFile, Math.floor(bytes / 2));
    assert.equal((await harness.admin("PATCH", "/api/v1/models/broken", { scaling: { min: 1 } })).status, 200);
    const failed = await eventually("the broken model to report its weights", async () => {
      const { body } = await harness.admin("GET", "/api/v1/models/broken/health");
      return body.weights_problem !== null ? body : undefined;
    });
    assert.equal(failed.state, "failed");
    assert.match(failed.reason, /broken\.gguf/);
    assert.match(failed.reason, /truncated/);
    assert.deepEqual(failed.replicas, [], "nothing was placed, so no engine starts on weights that cannot load");

    const response = await fetch(`${harness.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${await harness.clientKey()}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "broken", messages: [{ role: "user", content: "x" }] }),
    });
    assert.equal(response.status, 503);
    const error = ((await response.json()) as RenderedError["body"]).error;
    assert.equal(error.code, "model_failed");
    assert.doesNotMatch(error.message, /broken\.gguf/, "a client key is not shown the server's paths");

    // Restored weights are picked up on the next pass, without a change to the model.
    await writeTinyLlamaGguf({ path: brokenFile, seed: 8 });
    await eventually("the restored model to become ready", async () => {
      const { body } = await harness.admin("GET", "/api/v1/models/broken/health");
      return body.state === "ready" ? body : undefined;
    });
    await harness.admin("DELETE", "/api/v1/models/broken");
  });

  test("an engine that fails at every start parks the model with the reason, in the store, until the definition changes", async () => {
    // `llmgw engine` exits at once on weights llama.cpp refuses to load: a crash at start.
    const unloadable = path.join(modelDir, "unloadable.gguf");
    await writeUnloadableGguf({ path: unloadable });
    await harness.addModel({
      name: "crashing",
      source: { kind: "file", path: unloadable },
      profiles: [{ name: "cpu", engine: "llamacpp", ctx_size: 512, parallel: 1 }],
    });
    const parked = await eventually("the crashing model to park", async () => {
      const { body } = await harness.admin("GET", "/api/v1/models/crashing");
      return body.health.state === "parked" ? body : undefined;
    });
    assert.match(parked.health.reason, /Parked after 3 failures/);
    assert.match(parked.health.reason, /on node 'local'/);
    assert.match(parked.health.reason, UNLOADABLE_GGUF_COMPLAINT, "the engine's own complaint is kept");
    assert.equal(parked.replicas[0].failures, 3);
    // Parking is the model's state in the store: a restarted server keeps it.
    const stored = await harness.server.store.db.selectFrom("model_states").selectAll().execute();
    assert.equal(stored.length, 1);
    assert.match(stored[0]!.parked_reason!, UNLOADABLE_GGUF_COMPLAINT);
    const events = await harness.admin("GET", "/api/v1/events?kind=model_parked");
    assert.match(events.body.data[0].message, /Model 'crashing' is parked/);

    const response = await fetch(`${harness.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${await harness.clientKey()}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "crashing", messages: [{ role: "user", content: "x" }] }),
    });
    assert.equal(response.status, 503);
    assert.equal(((await response.json()) as RenderedError["body"]).error.code, "model_parked");

    // Any change to the definition ends parking: the parked replica goes and a fresh one
    // (new id, new run folder) tries again, even though nothing about how the engine runs changed.
    const parkedReplica = harness.server.replicas.all().find((r) => r.modelName === "crashing")!;
    assert.equal((await harness.admin("PATCH", "/api/v1/models/crashing", { description: "try again" })).status, 200);
    const fresh = await eventually("a fresh replica of the unparked model", () =>
      harness.server.replicas.all().find((r) => r.modelName === "crashing" && r.id !== parkedReplica.id && r.attempt >= 1),
    );
    await eventually("the fresh replica's own run folder", () => readdirSync(path.join(harness.dataDir, "runs")).some((d) => d.startsWith(fresh.id)));
    await eventually("the parked replica to be gone", () => harness.server.replicas.get(parkedReplica.id) === undefined);

    // Fixing the weights replaces the replica, which starts afresh and answers.
    const fixed = await harness.admin("PATCH", "/api/v1/models/crashing", { source: { kind: "file", path: modelFile } });
    assert.equal(fixed.status, 200);
    await eventually("the fixed model to become ready", async () => {
      const { body } = await harness.admin("GET", "/api/v1/models/crashing");
      return body.health.state === "ready" ? body : undefined;
    });
    assert.equal((await harness.server.store.db.selectFrom("model_states").selectAll().execute()).length, 0, "parking was cleared in the store");
    await harness.admin("DELETE", "/api/v1/models/crashing");
  });

  test("a local file that no longer matches the sha256 its origin published is refused before start, and named", async () => {
    const copy = path.join(modelDir, "published.gguf");
    const { bytes } = await writeTinyLlamaGguf({ path: copy, seed: 9 });
    const sha256 = createHash("sha256").update(readFileSync(copy)).digest("hex");
    const altered = readFileSync(copy);
    altered[altered.length - 1] = (altered[altered.length - 1] ?? 0) ^ 0x01;
    writeFileSync(copy, altered);
    await harness.addModel({
      name: "published",
      source: { kind: "file", path: copy },
      origin: { repo: "local/tiny", revision: "1", files: [{ path: "published.gguf", sha256, bytes }] },
      profiles: [{ name: "cpu", engine: "llamacpp", ctx_size: 512, parallel: 1 }],
    });
    const refused = await eventually("the altered weights refused", async () => {
      const { body } = await harness.admin("GET", "/api/v1/models/published/health");
      return body.replicas[0]?.last_error?.includes(sha256) ? body : undefined;
    });
    assert.equal(refused.replicas[0].weights_verified, false);
    assert.deepEqual(
      agent.engineProcesses().filter((p) => p.modelName === "published"),
      [],
      "no engine runs on them",
    );
    await harness.admin("DELETE", "/api/v1/models/published");
  });

  test("a model is served by a supervised engine, and deleting it stops the engine", async () => {
    assert.equal(
      (
        await harness.admin("POST", "/api/v1/models", {
          name: "tiny",
          source: { kind: "file", path: modelFile },
          profiles: [{ name: "cpu", engine: "llamacpp", ctx_size: 1024, parallel: 2 }],
        })
      ).status,
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
      ["stopping", "removed"],
    );
    assert.equal(seen.find((step) => step.state === "stopping")?.engineGone, false, "stopping is shown while the engine still runs");
    assert.equal(seen.at(-1)?.engineGone, true, "the replica is removed only once its engine is gone");
    assert.deepEqual(
      agent.engineProcesses().filter((p) => p.modelName === "tiny"),
      [],
    );
  });
});
