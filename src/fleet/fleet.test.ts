// The fleet through its agent protocol, with the test as the agent: a real server (store,
// catalog, gateway table) and calls to join, heartbeat and assignments as `llmgw agent`
// makes them, without engines. What the gateway may route to follows what the node says.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import { writeTinyLlamaGguf } from "../gguf/tiny-model.ts";
import { startHarness, type Harness } from "../../test/support/server-harness.ts";
import { eventually } from "../../test/support/eventually.ts";
import type { Assignment, ReplicaReport } from "./agent-protocol.ts";
import type { NodeInventory } from "./fleet-types.ts";

const inventory: NodeInventory = { cores: 8, memoryBytes: 32 * 1024 ** 3, gpus: [], engines: [{ engine: "llamacpp", version: "3.21.1" }] };

describe("fleet protocol", () => {
  let harness: Harness;
  let credential: string;
  let modelFile: string;

  before(async () => {
    harness = await startHarness();
    modelFile = path.join(harness.dataDir, "tiny.gguf");
    await writeTinyLlamaGguf({ path: modelFile, seed: 3 });
    ({ credential } = await harness.server.fleet.join({ joinToken: harness.server.joinToken(), name: "n1", address: "127.0.0.1", inventory, labels: {} }));
  });

  after(async () => {
    await harness.close();
  });

  const fleet = () => harness.server.fleet;
  const beat = (replicas: ReplicaReport[], agentRun = "run-1") => fleet().heartbeat(credential, { name: "n1", address: "127.0.0.1", inventory, labels: {}, replicas, agentRun });
  const report = (assignment: Assignment, fields: Partial<ReplicaReport>): ReplicaReport => ({
    id: assignment.replicaId,
    state: "ready",
    endpoint: { host: "127.0.0.1", port: 9 },
    attempt: 1,
    failures: 0,
    lastError: null,
    lastErrorCode: null,
    startedAt: Date.now(),
    readyAt: Date.now(),
    weightsVerified: true,
    ...fields,
  });
  const table = (id: string) => harness.server.replicas.get(id);

  test("a placement wakes the node's long poll; what the node reports is what the gateway routes to", async () => {
    await beat([]);
    const first = await fleet().assignments(credential, { knownVersion: null, waitMs: 0, signal: AbortSignal.timeout(5000) });
    assert.deepEqual(first.assignments, []);
    const polling = fleet().assignments(credential, { knownVersion: first.version, waitMs: 20_000, signal: AbortSignal.timeout(30_000) });
    await harness.addModel({ name: "m", source: { kind: "file", path: modelFile }, profiles: [{ name: "cpu", engine: "llamacpp", ctx_size: 512, parallel: 1 }] });
    const woken = await polling;
    assert.equal(woken.assignments.length, 1, "the poll answered with the new assignment");
    const [assignment] = woken.assignments;
    assert.equal(assignment!.modelName, "m");
    assert.equal(assignment!.files[0]!.file, modelFile);
    assert.equal(table(assignment!.replicaId)?.state, "placed");

    await beat([report(assignment!, { state: "ready" })]);
    assert.equal(table(assignment!.replicaId)?.state, "ready");
    assert.equal(table(assignment!.replicaId)?.endpoint?.origin, "http://127.0.0.1:9");

    // An endpoint on another address than the node's: the engine key is not sent there.
    await beat([report(assignment!, { state: "ready", endpoint: { host: "10.9.9.9", port: 9 } })]);
    assert.equal(table(assignment!.replicaId)?.endpoint, null);
    assert.notEqual(table(assignment!.replicaId)?.state, "ready");
    await beat([report(assignment!, { state: "ready" })]);

    // The agent starts again (kill -9 and back before the node timeout): its first
    // heartbeat carries none of the old engines, which are not routed to any more.
    await beat([], "run-2");
    assert.equal(table(assignment!.replicaId)?.state, "placed");
    assert.equal(table(assignment!.replicaId)?.endpoint, null);
    await beat([report(assignment!, { state: "ready", endpoint: { host: "127.0.0.1", port: 10 } })], "run-2");
    assert.equal(table(assignment!.replicaId)?.endpoint?.origin, "http://127.0.0.1:10");

    // An agent that stops says so: nothing is routed there while it is away.
    await beat([report(assignment!, { state: "stopped", endpoint: null })], "run-2");
    assert.equal(table(assignment!.replicaId)?.state, "stopped");
    assert.equal((await fleet().assignments(credential, { knownVersion: null, waitMs: 0, signal: AbortSignal.timeout(5000) })).assignments.length, 1, "and it is still assigned there");
  });

  test("a parked replica parks its model in the store, and a restarted agent is not told to try it again", async () => {
    const [assignment] = (await fleet().assignments(credential, { knownVersion: null, waitMs: 0, signal: AbortSignal.timeout(5000) })).assignments;
    await beat([report(assignment!, { state: "parked", endpoint: null, failures: 5, lastError: "Parked after 5 failures: it crashed" })], "run-2");
    await eventually("the model parked", async () => (await harness.admin("GET", "/api/v1/models/m/health")).body.state === "parked");
    assert.equal((await harness.server.store.db.selectFrom("model_states").selectAll().execute()).length, 1);
    const after = await fleet().assignments(credential, { knownVersion: null, waitMs: 0, signal: AbortSignal.timeout(5000) });
    assert.deepEqual(after.assignments, [], "not assigned while parked");

    assert.deepEqual((await harness.admin("POST", "/api/v1/models/m/unpark")).body, { model: "m", unparked: 1 });
    const fresh = await eventually("a fresh assignment after the unpark", async () => {
      const set = await fleet().assignments(credential, { knownVersion: null, waitMs: 0, signal: AbortSignal.timeout(5000) });
      return set.assignments.find((a) => a.replicaId !== assignment!.replicaId);
    });
    assert.equal(fresh.modelName, "m");
    // The parked one is gone once the node no longer reports it.
    await beat([], "run-2");
    assert.equal(table(assignment!.replicaId), undefined);
  });
});
