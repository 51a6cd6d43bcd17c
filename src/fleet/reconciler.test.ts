// The reconciler's rules on their own (reconciler.ts is a pure function): what it starts,
// where, and what it stops, for definition changes, draining and lost nodes, scaling down,
// parking, demand and models held during an update. Placement is the real one.
import { test } from "node:test";
import assert from "node:assert/strict";
import type { CatalogModel } from "../catalog/catalog.ts";
import { modelDefinitionSchema } from "../catalog/model-schema.ts";
import type { FleetNode } from "./node-registry.ts";
import { placeReplicas } from "./placement.ts";
import { reconcile, type ReconcileInput } from "./reconciler.ts";
import type { ReplicaRecord } from "./replica-rows.ts";

const GiB = 1024 ** 3;

function model(name: string, scaling: { min: number; max: number }, version = "1"): CatalogModel {
  return {
    id: `m-${name}`,
    name,
    definition: modelDefinitionSchema.parse({
      source: { kind: "file", path: `/w/${name}.gguf` },
      scaling,
      description: version,
      profiles: [{ name: "cpu", engine: "llamacpp" }],
    }),
    created_by: "t",
    created_at: "2026-01-01T00:00:00Z",
    updated_by: "t",
    updated_at: "2026-01-01T00:00:00Z",
  };
}

function node(name: string, memoryGiB: number, state: FleetNode["state"] = "ready"): FleetNode {
  return {
    id: `n-${name}`,
    name,
    address: "127.0.0.1",
    labels: {},
    inventory: { cores: 8, memoryBytes: memoryGiB * GiB, gpus: [], engines: [{ engine: "llamacpp", version: "3.21.1" }] },
    state,
    draining: state === "draining",
    lastHeartbeat: 0,
    joinedAt: "",
    credentialHash: "",
  };
}

function replica(id: string, of: CatalogModel, on: FleetNode, overrides: Partial<ReplicaRecord> = {}): ReplicaRecord {
  return {
    id,
    modelId: of.id,
    profile: "cpu",
    engine: "llamacpp",
    nodeIds: [on.id],
    gpus: {},
    fingerprint: fingerprint(of),
    needs: { engine: "llamacpp", memoryBytes: 4 * GiB, cores: 1 },
    files: [],
    source: null,
    desired: "run",
    engineKey: "k",
    state: "ready",
    endpoint: null,
    attempt: 1,
    failures: 0,
    lastError: null,
    startedAt: null,
    readyAt: null,
    weightsVerified: true,
    ...overrides,
  };
}

const fingerprint = (m: CatalogModel) => `${m.name}@${m.definition.description}`;

function input(parts: Partial<ReconcileInput> & Pick<ReconcileInput, "models" | "nodes">): ReconcileInput {
  let next = 0;
  return {
    replicas: [],
    parked: new Set(),
    demand: new Map(),
    holding: new Set(),
    // Each replica takes 4 GiB: a 16 GiB node (14.4 usable) holds three.
    optionsFor: () => [{ profile: "cpu", needs: { engine: "llamacpp", memoryBytes: 4 * GiB, cores: 1 } }],
    fingerprintOf: (m) => fingerprint(m),
    weightsKeyOf: () => null,
    cachedWeights: () => new Set(),
    place: placeReplicas,
    newReplicaId: () => {
      next += 1;
      return `new-${next}`;
    },
    ...parts,
  };
}

test("scaling.min replicas are placed, one model's replicas on different nodes", () => {
  const m = model("a", { min: 2, max: 2 });
  const decision = reconcile(input({ models: [m], nodes: [node("x", 16), node("y", 16)] }));
  assert.deepEqual(decision.create.map((r) => r.nodeIds[0]).sort(), ["n-x", "n-y"]);
  assert.deepEqual(decision.stop, []);
});

test("a changed definition starts the new replica before stopping the serving old one, which stops once the new one is ready", () => {
  const old = model("a", { min: 1, max: 1 }, "1");
  const changed = model("a", { min: 1, max: 1 }, "2");
  const x = node("x", 16);
  const serving = replica("old", old, x);
  const first = reconcile(input({ models: [changed], nodes: [x], replicas: [serving] }));
  assert.equal(first.create.length, 1, "the successor is placed while there is room");
  assert.deepEqual(first.stop, [], "the old replica keeps serving meanwhile");
  const successor = replica("new-1", changed, x, { state: "starting" });
  assert.deepEqual(reconcile(input({ models: [changed], nodes: [x], replicas: [serving, successor] })).stop, [], "not before the successor is ready");
  const ready = { ...successor, state: "ready" as const };
  assert.deepEqual(
    reconcile(input({ models: [changed], nodes: [x], replicas: [serving, ready] })).stop.map((s) => s.id),
    ["old"],
  );
});

test("a held model's ready outdated replica keeps serving beside its successor, a model not held is replaced as usual", () => {
  const heldOld = model("held", { min: 1, max: 1 }, "1");
  const heldNew = model("held", { min: 1, max: 1 }, "2");
  const freeOld = model("free", { min: 1, max: 1 }, "1");
  const freeNew = model("free", { min: 1, max: 1 }, "2");
  const x = node("x", 32);
  const replicas = [
    replica("held-old", heldOld, x),
    replica("held-new", heldNew, x),
    // Not ready: nothing is lost by stopping it, held or not.
    replica("held-old-failed", heldOld, x, { state: "failed" }),
    replica("free-old", freeOld, x),
    replica("free-new", freeNew, x),
  ];
  const held = reconcile(input({ models: [heldNew, freeNew], nodes: [x], replicas, holding: new Set([heldNew.id]) }));
  assert.deepEqual(held.stop.map((s) => s.id).sort(), ["free-old", "held-old-failed"]);
  assert.deepEqual(held.create, [], "the held model has its current replica; nothing more is placed");

  const released = reconcile(input({ models: [heldNew, freeNew], nodes: [x], replicas }));
  assert.ok(
    released.stop.some((s) => s.id === "held-old"),
    "once released, the old one stops",
  );

  // After a server restart every replica is "placed" until its node reports it: held, the old one stays.
  const restarted = reconcile(
    input({
      models: [heldNew],
      nodes: [x],
      replicas: [replica("held-old", heldOld, x, { state: "placed" }), replica("held-new", heldNew, x)],
      holding: new Set([heldNew.id]),
    }),
  );
  assert.deepEqual(restarted.stop, []);

  // A draining node is not held up by an update: its replica goes once replaced.
  const draining = node("d", 32, "draining");
  const onDraining = reconcile(
    input({
      models: [heldNew],
      nodes: [x, draining],
      replicas: [replica("held-old", heldOld, draining), replica("held-new", heldNew, x)],
      holding: new Set([heldNew.id]),
    }),
  );
  assert.deepEqual(
    onDraining.stop.map((s) => s.id),
    ["held-old"],
  );
});

test("without room for the successor, the old replica is stopped to make room", () => {
  const old = model("a", { min: 1, max: 1 }, "1");
  const changed = model("a", { min: 1, max: 1 }, "2");
  const small = node("x", 8); // 6 GiB usable: one 4 GiB replica
  const decision = reconcile(input({ models: [changed], nodes: [small], replicas: [replica("old", old, small)] }));
  assert.deepEqual(decision.create, []);
  assert.deepEqual(
    decision.stop.map((s) => s.id),
    ["old"],
  );
  assert.equal(decision.unplaceable.size, 0, "not reported unplaceable: room comes once the old one stops");

  // Held by an update, the serving old replica never makes room: the successor waits, and says why.
  const held = reconcile(input({ models: [changed], nodes: [small], replicas: [replica("old", old, small)], holding: new Set([changed.id]) }));
  assert.deepEqual(held.stop, []);
  assert.deepEqual(held.create, []);
  assert.match(held.unplaceable.get(changed.id)?.join("\n") ?? "", /free/, "the explanation says the room exists but is taken");
});

test("a successor that would not fit even in the old replica's room leaves the old one serving, and says why", () => {
  const old = model("a", { min: 1, max: 1 }, "1");
  const changed = model("a", { min: 1, max: 1 }, "2");
  const small = node("x", 8);
  const decision = reconcile(
    input({
      models: [changed],
      nodes: [small],
      replicas: [replica("old", old, small)],
      // The new definition asks for more than the node has at all.
      optionsFor: () => [{ profile: "cpu", needs: { engine: "llamacpp", memoryBytes: 7 * GiB, cores: 1 } }],
    }),
  );
  assert.deepEqual(decision.stop, [], "a bad edit does not take the working replica down");
  assert.deepEqual(decision.unplaceable.get(changed.id), ["x: has 6.0 GiB in all (8.0 GiB less 2.0 GiB kept for the system), needs 7.0 GiB"]);
});

test("a replica being stopped holds its room until its node confirms; on a lost node it is forgotten", () => {
  const m = model("a", { min: 1, max: 1 });
  const small = node("x", 8);
  const other = model("b", { min: 1, max: 1 });
  const stopping = replica("going", other, small, { desired: "stop", state: "stopping" });
  const decision = reconcile(
    input({
      models: [m, other],
      nodes: [small],
      replicas: [stopping],
      optionsFor: (mm) => (mm.id === m.id ? [{ profile: "cpu", needs: { engine: "llamacpp", memoryBytes: 4 * GiB, cores: 1 } }] : []),
    }),
  );
  assert.deepEqual(decision.create, [], "its 4 GiB are not free yet");
  const lost = node("l", 8, "lost");
  const forgotten = reconcile(input({ models: [m], nodes: [lost], replicas: [replica("going", other, lost, { desired: "stop", state: "stopping" })] }));
  assert.deepEqual(
    forgotten.stop.map((s) => s.id),
    ["going"],
  );
});

test("a draining node's replica is replaced elsewhere first; a lost node's replica is stopped at once", () => {
  const m = model("a", { min: 1, max: 1 });
  const draining = node("d", 16, "draining");
  const other = node("o", 16);
  const first = reconcile(input({ models: [m], nodes: [draining, other], replicas: [replica("r", m, draining)] }));
  assert.deepEqual(
    first.create.map((r) => r.nodeIds[0]),
    ["n-o"],
  );
  assert.deepEqual(first.stop, []);

  const lost = node("l", 16, "lost");
  const second = reconcile(input({ models: [m], nodes: [lost, other], replicas: [replica("r", m, lost)] }));
  assert.deepEqual(
    second.stop.map((s) => s.id),
    ["r"],
  );
  assert.deepEqual(
    second.create.map((r) => r.nodeIds[0]),
    ["n-o"],
  );
});

test("scaling down stops the replicas that do not serve first; a parked model gets no new replica; demand drives min 0", () => {
  const m = model("a", { min: 1, max: 3 });
  const x = node("x", 32);
  const replicas = [replica("ready-1", m, x), replica("failing", m, x, { state: "failed" }), replica("ready-2", m, x)];
  const stops = reconcile(input({ models: [m], nodes: [x], replicas })).stop.map((s) => s.id);
  assert.equal(stops.length, 2, "min 1 of 3 running: two stop");
  assert.ok(stops.includes("failing"), "the failing one is among them");

  assert.deepEqual(reconcile(input({ models: [m], nodes: [x], parked: new Set([m.id]) })).create, []);

  const lazy = model("lazy", { min: 0, max: 2 });
  assert.deepEqual(reconcile(input({ models: [lazy], nodes: [x] })).create, [], "no demand, no replica");
  assert.equal(reconcile(input({ models: [lazy], nodes: [x], demand: new Map([[lazy.id, 1]]) })).create.length, 1);
});

test("a model no node can take says what each node lacks", () => {
  const m = model("a", { min: 1, max: 1 });
  const decision = reconcile(input({ models: [m], nodes: [node("small", 4), node("gone", 64, "lost")] }));
  assert.deepEqual(decision.unplaceable.get(m.id), ["gone: lost", "small: has 2.0 GiB in all (4.0 GiB less 2.0 GiB kept for the system), needs 4.0 GiB"]);
});

// --- Spread and rebalance ---------------------------------------------------------------

test("an update's successors spread: replicas being replaced do not count as the model on their node", () => {
  const old = model("a", { min: 2, max: 2 }, "1");
  const changed = model("a", { min: 2, max: 2 }, "2");
  // Both old replicas on x (after y was lost and came back). y is smaller, so bin-packing
  // alone would put both successors there; counting the old ones as "a on x" did just that.
  const x = node("x", 32);
  const y = node("y", 16);
  const replicas = [replica("old-1", old, x), replica("old-2", old, x)];
  for (const holding of [new Set<string>(), new Set([changed.id])]) {
    const decision = reconcile(input({ models: [changed], nodes: [x, y], replicas, holding }));
    assert.deepEqual(decision.create.map((r) => r.nodeIds[0]).sort(), ["n-x", "n-y"], `one successor on each node (held: ${holding.size > 0})`);
  }
  // Half updated: y runs a current replica, x only an old one, so the next successor goes to x
  // (by fit alone, y would take it: it has less room left).
  const half = reconcile(input({ models: [changed], nodes: [x, y], replicas: [replica("cur", changed, y), replica("old", old, x)] }));
  assert.deepEqual(
    half.create.map((r) => r.nodeIds[0]),
    ["n-x"],
  );
});

test("rebalance: two ready replicas on x and a ready y with room: one more starts on y, and one on x stops only once it is ready", () => {
  const m = model("a", { min: 2, max: 2 });
  const x = node("x", 32);
  const y = node("y", 16);
  const together = [replica("r1", m, x, { startedAt: "2026-01-01T00:00:01Z" }), replica("r2", m, x, { startedAt: "2026-01-01T00:00:02Z" })];
  const first = reconcile(input({ models: [m], nodes: [x, y], replicas: together }));
  assert.deepEqual(
    first.create.map((r) => r.nodeIds),
    [["n-y"]],
  );
  assert.deepEqual(first.stop, [], "nothing stops before the new one serves");
  assert.deepEqual(first.moves, [{ modelId: m.id, replicaId: "new-1", from: "n-x", to: ["n-y"] }]);
  assert.equal(first.spread.get(m.id), "2 replicas on x: moving one to y");

  // Starting (or failed and waiting for its node's retry): nothing stops, nothing more starts.
  for (const state of ["placed", "starting", "failed"] as const) {
    const moving = reconcile(input({ models: [m], nodes: [x, y], replicas: [...together, replica("new-1", m, y, { state })] }));
    assert.deepEqual(moving.stop, [], `${state}: no stop`);
    assert.deepEqual(moving.create, [], `${state}: one move at a time`);
    assert.equal(moving.spread.get(m.id), "2 replicas on x: moving one to y");
  }

  // Ready: one of x's stops (not the newest replica, which is the one on y).
  const done = reconcile(input({ models: [m], nodes: [x, y], replicas: [...together, replica("new-1", m, y, { startedAt: "2026-01-01T00:00:09Z" })] }));
  assert.deepEqual(done.create, []);
  assert.equal(done.stop.length, 1);
  assert.match(done.stop[0]!.id, /^r[12]$/);
  assert.match(done.stop[0]!.why, /shared node 'x'/);

  // Spread: nothing more moves, back or forth.
  const spread = reconcile(input({ models: [m], nodes: [x, y], replicas: [replica("r1", m, x), replica("new-1", m, y)] }));
  assert.deepEqual([spread.create, spread.stop, spread.moves, spread.spread.size], [[], [], [], 0]);
});

test("no move when the other node lacks room, is lost, or just came back; the model's spread line says why", () => {
  const m = model("a", { min: 2, max: 2 });
  const other = model("b", { min: 1, max: 1 });
  const x = node("x", 32);
  const y = node("y", 16);
  const together = [replica("r1", m, x), replica("r2", m, x)];

  // y's room is taken by another model's replica: 14 GiB usable, 12 used.
  const full = reconcile(
    input({
      models: [m, other],
      nodes: [x, y],
      replicas: [...together, replica("b1", other, y, { needs: { engine: "llamacpp", memoryBytes: 12 * GiB, cores: 1 } })],
    }),
  );
  assert.deepEqual(full.create, []);
  assert.equal(full.spread.get(m.id), "2 replicas on x: y has no room (2.0 GiB free, needs 4.0 GiB)");

  const tiny = reconcile(input({ models: [m], nodes: [x, node("y", 4)], replicas: together }));
  assert.equal(tiny.spread.get(m.id), "2 replicas on x: y cannot run it (has 2.0 GiB in all (4.0 GiB less 2.0 GiB kept for the system), needs 4.0 GiB)");

  const lost = reconcile(input({ models: [m], nodes: [x, node("y", 16, "lost")], replicas: together }));
  assert.deepEqual(lost.create, []);
  assert.equal(lost.spread.get(m.id), "2 replicas on x: y is lost");

  const back = reconcile(input({ models: [m], nodes: [x, y], replicas: together, settling: new Map([["n-y", 6_500]]) }));
  assert.deepEqual(back.create, [], "a node that just came back gets no move yet");
  assert.equal(back.spread.get(m.id), "2 replicas on x: y came back a moment ago; one moves there in 7 s if it stays");

  const alone = reconcile(input({ models: [m], nodes: [x], replicas: together }));
  assert.equal(alone.spread.get(m.id), "2 replicas on x: x is the only node");
});

test("a move whose replica parked is given up: it stops, its node cools down, and another node with room takes the move", () => {
  const m = model("a", { min: 2, max: 2 });
  const x = node("x", 32);
  const y = node("y", 16);
  const z = node("z", 16);
  const together = [replica("r1", m, x), replica("r2", m, x)];
  const parking =
    "Parked after 5 failures within 600 s (5 in this run); no more attempts until the replica is unparked or its model changes. Last failure: it crashed.";
  const failed = replica("mv", m, y, { state: "parked", failures: 5, lastError: parking });
  const now = Date.parse("2026-01-01T10:00:30Z");

  // Underway and retrying it is a move (its parking must not park the model); parked, it is given up.
  const retrying = reconcile(input({ models: [m], nodes: [x, y], replicas: [...together, replica("mv", m, y, { state: "failed" })] }));
  assert.deepEqual([...retrying.moving], ["mv"]);
  const gaveUp = reconcile(input({ models: [m], nodes: [x, y], replicas: [...together, failed], now }));
  assert.deepEqual(gaveUp.stop, [{ id: "mv", why: "a rebalance move that failed on node 'y'" }]);
  assert.deepEqual(gaveUp.failedMoves, [{ modelId: m.id, replicaId: "mv", cooldowns: [{ nodeId: "n-y", until: now + 600_000, lastError: "it crashed" }] }]);
  assert.deepEqual(gaveUp.create, [], "no move back to y at once");
  assert.equal(gaveUp.spread.get(m.id), "2 replicas on x: moving one to y failed: it crashed; not tried again before 10:11 UTC");

  // While y cools down, z (with room) takes the move instead.
  const cooling = new Map([[m.id, gaveUp.failedMoves[0]!.cooldowns]]);
  const elsewhere = reconcile(input({ models: [m], nodes: [x, y, z], replicas: together, moveCooldowns: cooling }));
  assert.deepEqual(elsewhere.moves, [{ modelId: m.id, replicaId: "new-1", from: "n-x", to: ["n-z"] }]);
  assert.deepEqual([...elsewhere.moving], ["new-1"]);
});

test("no move while the model is not all ready, held by an update, or parked", () => {
  const m = model("a", { min: 2, max: 2 });
  const x = node("x", 32);
  const y = node("y", 16);
  const notReady = reconcile(input({ models: [m], nodes: [x, y], replicas: [replica("r1", m, x), replica("r2", m, x, { state: "starting" })] }));
  assert.deepEqual(notReady.create, []);
  assert.equal(notReady.spread.get(m.id), "2 replicas on x: one moves to another node once all its replicas are ready");
  const together = [replica("r1", m, x), replica("r2", m, x)];
  const held = reconcile(input({ models: [m], nodes: [x, y], replicas: together, holding: new Set([m.id]) }));
  assert.deepEqual(held.create, []);
  assert.match(held.spread.get(m.id) ?? "", /once its update/);
  const parked = reconcile(input({ models: [m], nodes: [x, y], replicas: together, parked: new Set([m.id]) }));
  assert.deepEqual(parked.create, []);
  assert.match(parked.spread.get(m.id) ?? "", /once the model is unparked/);
});

test("scaling down stops replicas on the most crowded node first, so the ones left are spread", () => {
  const m = model("a", { min: 2, max: 2 });
  const x = node("x", 32);
  const y = node("y", 16);
  // The newest is on y: by age alone it would go, leaving both on x.
  const decision = reconcile(
    input({
      models: [m],
      nodes: [x, y],
      replicas: [
        replica("x1", m, x, { startedAt: "2026-01-01T00:00:01Z" }),
        replica("x2", m, x, { startedAt: "2026-01-01T00:00:02Z" }),
        replica("y1", m, y, { startedAt: "2026-01-01T00:00:03Z" }),
        replica("y2", m, y, { startedAt: "2026-01-01T00:00:04Z" }),
      ].slice(0, 3),
    }),
  );
  assert.deepEqual(
    decision.stop.map((s) => s.id),
    ["x2"],
  );
});
