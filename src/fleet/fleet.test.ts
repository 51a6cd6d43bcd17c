// The fleet through its agent protocol, with the test as the agent: a real server (store,
// catalog, gateway table) and calls to join, heartbeat and assignments as `llmgw agent`
// makes them, without engines. What the gateway may route to follows what the node says.
//
// Then a model update on a Fleet of its own, on SQLite and PostgreSQL, with the test's
// clock, the gateway's in-flight counts as a map the test sets, and a fake node that runs
// whatever it is assigned (as an agent does) and reports it ready: replicas are drained
// before they stop, outdated ones are held while an update is checked, and a model's
// replicas split by definition.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { writeTinyLlamaGguf } from "../gguf/tiny-model.ts";
import type { Store } from "../store/store.ts";
import { startHarness, type Harness } from "../../test/support/server-harness.ts";
import { JOIN_TOKEN, replicaReport, startClockedFleet } from "../../test/support/clocked-fleet.ts";
import { eventually } from "../../test/support/eventually.ts";
import { testBothStores } from "../../test/support/stores.ts";
import type { Assignment, ReplicaReport } from "./agent-protocol.ts";
import type { Fleet } from "./fleet.ts";
import type { NodeInventory } from "./fleet-types.ts";
import type { ReplicaTable } from "./replica-table.ts";

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
  const beat = (replicas: ReplicaReport[], agentRun = "run-1") =>
    fleet().heartbeat(credential, { name: "n1", address: "127.0.0.1", inventory, labels: {}, replicas, agentRun });
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
    await harness.addModel({
      name: "m",
      source: { kind: "file", path: modelFile },
      profiles: [{ name: "cpu", engine: "llamacpp", ctx_size: 512, parallel: 1 }],
    });
    const woken = await polling;
    assert.equal(woken.assignments.length, 1, "the poll answered with the new assignment");
    const [assignment] = woken.assignments;
    assert.equal(assignment!.modelName, "m");
    assert.equal(assignment!.files[0]!.file, modelFile);
    assert.equal(table(assignment!.replicaId)?.state, "placed");

    await beat([report(assignment!, { state: "ready" })]);
    assert.equal(table(assignment!.replicaId)?.state, "ready");
    assert.equal(table(assignment!.replicaId)?.endpoint?.origin, "http://127.0.0.1:9");

    // An endpoint on another address than the node's: the heartbeat is refused whole, and
    // the engine key is not sent there (routes stay on the endpoint the node reported before).
    await assert.rejects(beat([report(assignment!, { state: "ready", endpoint: { host: "10.9.9.9", port: 9 } })]), {
      code: "node_address_mismatch",
      status: 409,
    });
    assert.equal(table(assignment!.replicaId)?.endpoint?.origin, "http://127.0.0.1:9");

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
    assert.equal(
      (await fleet().assignments(credential, { knownVersion: null, waitMs: 0, signal: AbortSignal.timeout(5000) })).assignments.length,
      1,
      "and it is still assigned there",
    );
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
    const unparked = await eventually("a model_unparked event", async () => {
      const events = await harness.server.events.list({ kinds: ["model_unparked"] });
      return events.length > 0 ? events : undefined;
    });
    assert.deepEqual(
      unparked.map((e) => [e.subject, e.data]),
      [["model:m", { model: "m" }]],
      "one event, for m",
    );
    // The parked one is gone once the node no longer reports it.
    await beat([], "run-2");
    assert.equal(table(assignment!.replicaId), undefined);
  });
});

// --- A model update on a Fleet of its own -------------------------------------------------

/** Two weights files: the model's definition moves from the first to the second. */
const weightsDir = mkdtempSync(path.join(tmpdir(), "llmgw-fleet-update-"));
const weightsA = path.join(weightsDir, "a.gguf");
const weightsB = path.join(weightsDir, "b.gguf");
const weightsWritten = Promise.all([writeTinyLlamaGguf({ path: weightsA, seed: 11 }), writeTinyLlamaGguf({ path: weightsB, seed: 12 })]);
after(() => rmSync(weightsDir, { recursive: true, force: true }));

interface UpdateRig {
  fleet: Fleet;
  table: ReplicaTable;
  store: Store;
  /** The gateway's requests in flight at each replica, as the test sets them. */
  inFlight: Map<string, number>;
  /** Moves the fleet's clock. */
  advance(ms: number): void;
  /** Adds model "m" on the first weights file and waits for its first placement. */
  addModel(): Promise<string>;
  /** Moves model "m" to the second weights file (a new revision) and waits for the pass. */
  changeWeights(): Promise<void>;
  /** Points model "m" back at the first weights file (an update that failed), without waiting. */
  changeWeightsBack(): Promise<void>;
  /** The weights file a replica's assignment tells its node to load. */
  sourceOf(replicaId: string): Promise<string | undefined>;
  weights: { a: string; b: string };
  /** The replica ids in the node's assignments (what its agent keeps running). */
  assigned(): Promise<string[]>;
  /** One round of the fake node: runs what it is assigned, reports all of it ready, and waits for the fleet's passes. */
  sync(): Promise<string[]>;
  /** The stored row's desired state (undefined once the row is gone). */
  desiredInStore(replicaId: string): Promise<string | null | undefined>;
  close(): Promise<void>;
}

async function startUpdateRig(store: Store, options: { drainTimeoutMs?: number } = {}): Promise<UpdateRig> {
  await weightsWritten;
  const inFlight = new Map<string, number>();
  const { fleet, catalog, table, now, advance } = await startClockedFleet(store, {
    // Far beyond the steps of the clock below: moving it loses no node.
    nodeTimeoutMs: 3_600_000,
    inFlight: (replicaId) => inFlight.get(replicaId) ?? 0,
    ...(options.drainTimeoutMs === undefined ? {} : { drainTimeoutMs: options.drainTimeoutMs }),
  });
  const { credential } = await fleet.join({ joinToken: JOIN_TOKEN, name: "n1", address: "127.0.0.1", inventory, labels: {} });
  const ports = new Map<string, number>();
  const assignments = async () => (await fleet.assignments(credential, { knownVersion: null, waitMs: 0, signal: AbortSignal.timeout(5000) })).assignments;
  const assigned = async () => (await assignments()).map((a) => a.replicaId);
  const sync = async () => {
    const running = await assigned();
    const replicas = running.map((id) => {
      if (!ports.has(id)) ports.set(id, 20_000 + ports.size);
      return replicaReport(id, "ready", ports.get(id)!, now());
    });
    await fleet.heartbeat(credential, { name: "n1", address: "127.0.0.1", inventory, labels: {}, replicas, agentRun: "run-1" });
    await fleet.settled();
    return running;
  };
  return {
    fleet,
    table,
    store,
    inFlight,
    advance,
    addModel: async () => {
      const model = await catalog.create(
        { name: "m", source: { kind: "file", path: weightsA }, profiles: [{ name: "cpu", engine: "llamacpp", ctx_size: 512, parallel: 1 }] },
        "test",
      );
      await fleet.settled();
      return model.id;
    },
    changeWeights: async () => {
      await catalog.update("m", { source: { kind: "file", path: weightsB } }, "test");
      await fleet.settled();
    },
    changeWeightsBack: async () => {
      await catalog.update("m", { source: { kind: "file", path: weightsA } }, "test");
    },
    sourceOf: async (replicaId) => {
      const source = (await assignments()).find((a) => a.replicaId === replicaId)?.source;
      return source?.kind === "file" ? source.path : undefined;
    },
    weights: { a: weightsA, b: weightsB },
    assigned,
    sync,
    desiredInStore: async (replicaId) => (await store.db.selectFrom("replicas").select("desired").where("id", "=", replicaId).executeTakeFirst())?.desired,
    close: () => fleet.stop(),
  };
}

/** Places the model, runs its replica, changes its weights: returns the old replica's id, and the new one's once the node ran it. */
async function updateUnderway(
  rig: UpdateRig,
  beforeSuccessorReady: (old: string) => void = () => {},
): Promise<{ modelId: string; old: string; successor: string }> {
  const modelId = await rig.addModel();
  const [old] = await rig.sync();
  assert.ok(old !== undefined, "the model's first replica is assigned");
  assert.equal(rig.table.get(old)?.state, "ready");
  await rig.changeWeights();
  beforeSuccessorReady(old);
  // The node runs both; the successor's "ready" is what lets the old one go.
  const running = await rig.sync();
  const successor = running.find((id) => id !== old);
  assert.ok(successor !== undefined, `a successor was placed beside ${old} (assigned: ${running.join(", ")})`);
  return { modelId, old, successor };
}

testBothStores("a replica with requests in flight leaves routing but runs on its node until they are done, then stops", async (store) => {
  const rig = await startUpdateRig(store);
  try {
    const { modelId, old, successor } = await updateUnderway(rig, (id) => rig.inFlight.set(id, 2));
    assert.equal(rig.table.get(successor)?.state, "ready");
    assert.equal(rig.table.get(old)?.state, "stopping", "out of routing: the gateway sends it nothing new");
    assert.ok((await rig.assigned()).includes(old), "still in its node's assignments: the engine keeps serving what it has");
    await eventually("the row still desired run while it drains", async () => (await rig.desiredInStore(old)) === "run");

    // Its node reports it ready again: it stays out of routing, and the reconciler does not count it as serving.
    await rig.sync();
    assert.equal(rig.table.get(old)?.state, "stopping");
    assert.deepEqual(
      rig.fleet.replicasByDefinition(modelId).outdated.map((r) => [r.id, r.state]),
      [[old, "stopping"]],
    );
    rig.inFlight.set(old, 1);
    rig.fleet.checkNow();
    await rig.fleet.settled();
    assert.ok((await rig.assigned()).includes(old), "one request left: still draining");

    rig.inFlight.set(old, 0);
    rig.fleet.checkNow();
    await rig.fleet.settled();
    assert.deepEqual(await rig.assigned(), [successor], "drained: its node is told to stop it");
    assert.equal(rig.table.get(old)?.state, "stopping");
    await eventually("the row desired stop", async () => (await rig.desiredInStore(old)) === "stop");
    // The node stopped it and no longer reports it: it is gone.
    await rig.sync();
    assert.equal(rig.table.get(old), undefined);
    await eventually("the row gone", async () => (await rig.desiredInStore(old)) === undefined);
  } finally {
    await rig.close();
  }
});

testBothStores("a drain that outlasts its deadline stops the replica anyway", async (store) => {
  const rig = await startUpdateRig(store, { drainTimeoutMs: 30_000 });
  try {
    const { old, successor } = await updateUnderway(rig, (id) => rig.inFlight.set(id, 1));
    assert.equal(rig.table.get(old)?.state, "stopping");
    rig.advance(29_000);
    rig.fleet.checkNow();
    await rig.fleet.settled();
    assert.ok((await rig.assigned()).includes(old), "before the deadline it still drains");
    rig.advance(1_000);
    rig.fleet.checkNow();
    await rig.fleet.settled();
    assert.deepEqual(await rig.assigned(), [successor], "at the deadline it is stopped with its request still in flight");
  } finally {
    await rig.close();
  }
});

testBothStores("holdOutdated keeps the old ready replica serving beside its ready successor; the last release stops it", async (store) => {
  const rig = await startUpdateRig(store);
  try {
    const modelId = await rig.addModel();
    const [old] = await rig.sync();
    assert.ok(old !== undefined);
    const first = rig.fleet.holdOutdated(modelId);
    const second = rig.fleet.holdOutdated(modelId);
    await rig.changeWeights();
    const running = await rig.sync();
    const successor = running.find((id) => id !== old);
    assert.ok(successor !== undefined, "the successor is placed while the model is held");
    await rig.sync();
    assert.equal(rig.fleet.replicasByDefinition(modelId).current[0]?.state, "ready", "its engine is ready");
    assert.equal(rig.table.get(old)?.state, "ready", "the old one still serves beside the ready successor");
    assert.equal(rig.table.get(successor)?.endpoint, null, "the unproven successor takes no client traffic while held");
    assert.equal(rig.table.get(successor)?.state, "starting", "to clients it is still starting, so requests wait for it rather than give up");
    assert.notEqual(rig.table.get(old)?.endpoint, null);
    assert.notEqual(rig.fleet.replicasByDefinition(modelId).current[0]?.endpoint, null, "the update job still reaches it directly");
    assert.deepEqual((await rig.assigned()).sort(), [old, successor].sort());
    assert.equal(await rig.sourceOf(old), rig.weights.a, "the held old replica keeps loading its own weights, should its engine restart");
    assert.equal(await rig.sourceOf(successor), rig.weights.b);

    first();
    first(); // A second call of one release ends nothing more.
    await rig.fleet.settled();
    assert.ok((await rig.assigned()).includes(old), "held until every hold is released");

    second();
    await rig.fleet.settled();
    assert.deepEqual(await rig.assigned(), [successor], "released: the old one stops");
    assert.notEqual(rig.table.get(successor)?.endpoint, null, "released: the successor takes traffic");
    assert.equal(rig.table.get(successor)?.state, "ready");
    assert.equal(rig.table.get(old)?.state, "stopping");
  } finally {
    await rig.close();
  }
});

testBothStores(
  "an update released as rejected: the model points back, its new replica stops without ever taking traffic, the old one serves on",
  async (store) => {
    const rig = await startUpdateRig(store);
    try {
      const modelId = await rig.addModel();
      const [old] = await rig.sync();
      assert.ok(old !== undefined);
      const release = rig.fleet.holdOutdated(modelId);
      await rig.changeWeights();
      const successor = (await rig.sync()).find((id) => id !== old)!;
      await rig.sync();
      assert.equal(rig.fleet.replicasByDefinition(modelId).current[0]?.state, "ready");
      // The new revision failed its check: the model points back, then the hold ends.
      await rig.changeWeightsBack();
      const seen: string[] = [];
      const unsubscribe = rig.table.onChange((replica) => {
        if (replica.id === successor) seen.push(`${replica.state}${replica.endpoint === null ? "" : " with endpoint"}`);
      });
      release("rejected");
      await rig.fleet.settled();
      unsubscribe();
      assert.ok(seen.length > 0 && !seen.includes("ready with endpoint"), `the rejected replica was never routable: ${seen.join(", ")}`);
      // Row writes follow the reconciliation on their own chain: waited for, not assumed done.
      await eventually("the rejected replica's row desired stop", async () => (await rig.desiredInStore(successor)) === "stop");
      assert.deepEqual(await rig.assigned(), [old]);
      assert.equal(rig.table.get(old)?.state, "ready");
      assert.deepEqual(
        rig.fleet.replicasByDefinition(modelId).current.map((r) => r.id),
        [old],
        "the old one is current again",
      );
    } finally {
      await rig.close();
    }
  },
);

testBothStores("replicasByDefinition splits a model's running replicas by definition", async (store) => {
  const rig = await startUpdateRig(store);
  try {
    const modelId = await rig.addModel();
    const [old] = await rig.sync();
    assert.ok(old !== undefined);
    assert.deepEqual(
      rig.fleet.replicasByDefinition(modelId).current.map((r) => r.id),
      [old],
    );
    assert.deepEqual(rig.fleet.replicasByDefinition(modelId).outdated, []);

    await rig.changeWeights();
    const [current] = rig.fleet.replicasByDefinition(modelId).current;
    assert.ok(current !== undefined && current.id !== old, "the successor is the current one");
    assert.equal(current.state, "placed");
    assert.equal(current.endpoint, null, "not running yet");
    assert.deepEqual(current.nodeNames, ["n1"]);
    assert.equal(current.profile, "cpu");
    assert.equal(current.engine, "llamacpp");
    assert.deepEqual(
      current.files.map((f) => f.file),
      [weightsB],
      "placed with the new revision's file",
    );
    assert.match(current.engineKey ?? "", /^[0-9a-f]{48}$/);

    const outdated = rig.fleet.replicasByDefinition(modelId).outdated;
    assert.deepEqual(
      outdated.map((r) => r.id),
      [old],
    );
    assert.equal(outdated[0]!.state, "ready");
    assert.deepEqual(
      outdated[0]!.files.map((f) => f.file),
      [weightsA],
    );
    assert.match(outdated[0]!.endpoint?.origin ?? "", /^http:\/\/127\.0\.0\.1:\d+$/);
    assert.equal(outdated[0]!.weightsVerified, true);
    assert.equal(outdated[0]!.lastError, null);

    // The successor ready, the old one stops: only what runs, of the current definition, is left.
    await rig.sync();
    assert.deepEqual(rig.fleet.replicasByDefinition(modelId).outdated, []);
    assert.deepEqual(
      rig.fleet.replicasByDefinition(modelId).current.map((r) => [r.id, r.state]),
      [[current.id, "ready"]],
    );
    assert.deepEqual(rig.fleet.replicasByDefinition("no-such-model").current, []);
  } finally {
    await rig.close();
  }
});
