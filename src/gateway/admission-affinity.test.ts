// Admission's side of prefix routing, on a real replica table without HTTP: the ring
// follows the table (a replica that joins takes its keys at once), a retry or a cooling
// replica walks to the next one on the ring, and a request that finds every slot taken
// waits in the queue like any other.
import { test } from "node:test";
import assert from "node:assert/strict";
import type { CatalogModel } from "../catalog/catalog.ts";
import { ReplicaTable, type Replica } from "../fleet/replica-table.ts";
import { Admission } from "./admission.ts";
import { HashRing, ringHash } from "./prefix-affinity.ts";

const model = {
  id: "m-1",
  name: "affine",
  definition: { routing: "prefix", prefix: { chars: 4096, load_factor: 1.25 }, queue_size: 16, queue_timeout: 60 },
} as unknown as CatalogModel;

function replica(id: string, slots = 4): Replica {
  return {
    id,
    modelId: model.id,
    modelName: model.name,
    profile: "p",
    engine: "llamacpp",
    nodeIds: ["n1"],
    state: "ready",
    endpoint: { origin: `http://127.0.0.1/${id}`, basePath: "" },
    engineKey: null,
    upstreamModel: model.name,
    weight: 1,
    slots,
    attempt: 0,
    failures: 0,
    lastError: null,
    startedAt: null,
    readyAt: null,
  };
}

const keys = (count: number) => Array.from({ length: count }, (_, n) => ringHash(`conversation ${n}`));
const never = new AbortController().signal;

async function routeOnce(admission: Admission, affinity: number, exclude: ReadonlySet<string> = new Set()): Promise<string> {
  const lease = await admission.acquire(model, { exclude, signal: never, affinity });
  assert.ok(lease !== null);
  lease.release();
  return lease.replica.id;
}

test("a replica that joins the table takes its share of keys from the next request on", async () => {
  const table = new ReplicaTable();
  for (const id of ["r-a", "r-b", "r-c"]) table.upsert(replica(id));
  const admission = new Admission(table);
  const before = new Map<number, string>();
  for (const key of keys(300)) before.set(key, await routeOnce(admission, key));
  table.upsert(replica("r-d"));
  const ring = new HashRing(["r-a", "r-b", "r-c", "r-d"].map((id) => ({ id, weight: 1 })));
  let moved = 0;
  for (const [key, was] of before) {
    const now = await routeOnce(admission, key);
    assert.equal(now, ring.home(key), "each key goes to its home on the new ring");
    if (now !== was) {
      moved += 1;
      assert.equal(now, "r-d", "a key that moves, moves to the replica that joined");
    }
  }
  assert.ok(moved > 30, `r-d took ${moved} of 300 keys`);
  admission.close();
});

test("a retry and a cooling replica walk on to the next replica on the ring", async () => {
  const table = new ReplicaTable();
  for (const id of ["r-a", "r-b", "r-c"]) table.upsert(replica(id));
  let now = 1_000;
  const admission = new Admission(table, () => now);
  const ring = new HashRing(["r-a", "r-b", "r-c"].map((id) => ({ id, weight: 1 })));
  const key = keys(1)[0]!;
  const home = ring.home(key)!;
  const next = ring.first(key, (id) => id !== home)!;
  assert.equal(await routeOnce(admission, key), home);
  assert.equal(await routeOnce(admission, key, new Set([home])), next, "tried already");
  admission.coolDown(home);
  assert.equal(await routeOnce(admission, key), next, "cooling down");
  now += 10_000;
  assert.equal(await routeOnce(admission, key), home, "home again once its cooldown ended");
  admission.close();
});

test("a prefix-routed request that finds every slot taken waits in the queue and takes the slot that frees", async () => {
  const table = new ReplicaTable();
  for (const id of ["r-a", "r-b"]) table.upsert(replica(id, 1));
  const admission = new Admission(table);
  const ring = new HashRing(["r-a", "r-b"].map((id) => ({ id, weight: 1 })));
  const [keyA, keyB] = (() => {
    const all = keys(50);
    const a = all.find((key) => ring.home(key) === "r-a")!;
    const b = all.find((key) => ring.home(key) === "r-b")!;
    return [a, b];
  })();
  const first = await admission.acquire(model, { exclude: new Set(), signal: never, affinity: keyA });
  const second = await admission.acquire(model, { exclude: new Set(), signal: never, affinity: keyB });
  assert.deepEqual([first?.replica.id, second?.replica.id], ["r-a", "r-b"]);
  // Both full: a request of r-b's conversation waits.
  const waiting = admission.acquire(model, { exclude: new Set(), signal: never, affinity: keyB });
  assert.equal(admission.waiting(model.id), 1);
  // r-b frees: the waiter takes it.
  second!.release();
  const lease = await waiting;
  assert.equal(lease?.replica.id, "r-b");
  lease!.release();
  first!.release();
  admission.close();
});
