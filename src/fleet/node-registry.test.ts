// Nodes on SQLite and PostgreSQL, with injected clocks: joining, what each refused
// credential is told, loss and return (a drain survives both, and a restarted server
// reads the loss back; undrain ends it), two agents joining under one name at once, and
// a wall clock that jumps forward losing no node (ages are on the monotonic clock).
import assert from "node:assert/strict";
import { silentLogger } from "../core/log.ts";
import { LlmgwError } from "../core/errors.ts";
import { testBothDatabases } from "../../test/support/stores.ts";
import type { NodeInventory } from "./fleet-types.ts";
import { NodeRegistry } from "./node-registry.ts";

const inventory: NodeInventory = { cores: 8, memoryBytes: 32 * 1024 ** 3, gpus: [], engines: [{ engine: "llamacpp", version: "3.21.1" }] };
const TOKEN = "ljt_test";

function refusedWith(code: string, message?: RegExp) {
  return (error: unknown) => {
    assert.ok(error instanceof LlmgwError, String(error));
    assert.equal(error.code, code);
    if (message !== undefined) assert.match(error.message, message);
    return true;
  };
}

testBothDatabases("nodes join with the token, and each wrong credential is refused saying why", async (database) => {
  const now = 1_000_000;
  const store = await database.open();
  try {
    const registry = new NodeRegistry({ store, joinToken: () => TOKEN, logger: silentLogger(), clock: () => now, monotonic: () => now });
    await registry.load();
    await assert.rejects(registry.join({ joinToken: "ljt_other", name: "a", address: "10.0.0.1", inventory, labels: {} }), refusedWith("invalid_join_token"));
    const a = await registry.join({ joinToken: TOKEN, name: "a", address: "10.0.0.1", inventory, labels: { zone: "x" } });
    const b = await registry.join({ joinToken: TOKEN, name: "b", address: "10.0.0.2", inventory, labels: {} });
    assert.equal(registry.authenticate(a.credential, "a").name, "a");
    assert.throws(() => registry.authenticate(TOKEN), refusedWith("invalid_node_credential"), "the join token is no node credential");
    assert.throws(() => registry.authenticate(a.credential, "b"), refusedWith("node_credential_mismatch", /belongs to node 'a', not 'b'/));
    assert.throws(() => registry.authenticate(`${a.credential.slice(0, -2)}xx`), refusedWith("invalid_node_credential"));
    await assert.rejects(
      registry.join({ joinToken: TOKEN, name: "a", address: "10.0.0.9", inventory, labels: {} }),
      refusedWith("node_name_taken", /ctl node remove a/),
    );
    // Two joins under one name at once: one wins, the other is told the name is taken.
    const results = await Promise.allSettled([
      registry.join({ joinToken: TOKEN, name: "c", address: "10.0.0.3", inventory, labels: {} }),
      registry.join({ joinToken: TOKEN, name: "c", address: "10.0.0.4", inventory, labels: {} }),
    ]);
    assert.equal(results.filter((r) => r.status === "fulfilled").length, 1);
    const failed = results.find((r) => r.status === "rejected") as PromiseRejectedResult;
    refusedWith("node_name_taken")(failed.reason);

    await registry.remove(registry.byName("b"));
    assert.throws(() => registry.authenticate(b.credential), refusedWith("node_removed", /Node 'b' was removed/));

    // A restarted server knows the same: the hash is stored, the credential is not.
    const again = new NodeRegistry({ store, joinToken: () => TOKEN, logger: silentLogger(), clock: () => now, monotonic: () => now });
    await again.load();
    assert.equal(again.authenticate(a.credential, "a").id, a.nodeId);
    assert.throws(() => again.authenticate(b.credential), refusedWith("node_removed"));
    const row = await store.db.selectFrom("nodes").selectAll().where("id", "=", a.nodeId).executeTakeFirstOrThrow();
    assert.notEqual(row.credential_hash, a.credential);
    assert.ok(!JSON.stringify(row).includes(a.credential.split(".").at(-1)!), "no part of the secret is stored");
  } finally {
    await store.close();
  }
});

testBothDatabases("a lost node is written as lost, and a drained one comes back draining", async (database) => {
  let now = 1_000_000;
  const store = await database.open();
  try {
    const registry = new NodeRegistry({ store, joinToken: () => TOKEN, logger: silentLogger(), clock: () => now, monotonic: () => now });
    await registry.load();
    await registry.join({ joinToken: TOKEN, name: "a", address: "10.0.0.1", inventory, labels: {} });
    await registry.join({ joinToken: TOKEN, name: "d", address: "10.0.0.2", inventory, labels: {} });
    registry.setState(registry.byName("d"), "draining");
    now += 10_000;
    assert.deepEqual(registry.expire(15_000), [], "not yet");
    now += 6_000;
    assert.deepEqual(
      registry
        .expire(15_000)
        .map((n) => n.name)
        .sort(),
      ["a", "d"],
    );
    await registry.flush();
    const restarted = new NodeRegistry({ store, joinToken: () => TOKEN, logger: silentLogger(), clock: () => now, monotonic: () => now });
    await restarted.load();
    assert.equal(restarted.byName("a").state, "lost", "a restarted server does not take a lost node for ready");

    const d = registry.byName("d");
    assert.equal(registry.heartbeat(d, { address: "10.0.0.2", inventory, labels: {} }), true, "it is back");
    assert.equal(d.state, "draining", "the operator's drain still holds");
    const a = registry.byName("a");
    assert.equal(registry.heartbeat(a, { address: "10.0.0.1", inventory: { ...inventory, cores: 16 }, labels: {} }), true);
    assert.equal(a.state, "ready");
    await registry.flush();
    const stored = await store.db.selectFrom("nodes").select(["name", "state", "inventory"]).orderBy("name").execute();
    assert.deepEqual(
      stored.map((n) => [n.name, n.state]),
      [
        ["a", "ready"],
        ["d", "draining"],
      ],
    );
    assert.equal((JSON.parse(stored[0]!.inventory) as NodeInventory).cores, 16, "the reported inventory is kept");
  } finally {
    await store.close();
  }
});

testBothDatabases("an undrained node is ready again, a lost one that was draining comes back ready, and one not draining is refused", async (database) => {
  let now = 1_000_000;
  const store = await database.open();
  try {
    const registry = new NodeRegistry({ store, joinToken: () => TOKEN, logger: silentLogger(), clock: () => now, monotonic: () => now });
    await registry.load();
    await registry.join({ joinToken: TOKEN, name: "here", address: "10.0.0.1", inventory, labels: {} });
    await registry.join({ joinToken: TOKEN, name: "away", address: "10.0.0.2", inventory, labels: {} });
    await registry.join({ joinToken: TOKEN, name: "gone", address: "10.0.0.3", inventory, labels: {} });
    assert.throws(
      () => registry.endDrain(registry.byName("here")),
      refusedWith("node_not_draining", /^Node 'here' is not draining \(it is ready\); there is nothing to undrain\.$/),
    );
    assert.equal(registry.byName("here").state, "ready");
    registry.setState(registry.byName("here"), "draining");
    registry.setState(registry.byName("away"), "draining");
    now += 20_000;
    registry.heartbeat(registry.byName("here"), { address: "10.0.0.1", inventory, labels: {} });
    assert.deepEqual(
      registry.expire(15_000).map((n) => n.name),
      ["away", "gone"],
    );
    assert.throws(
      () => registry.endDrain(registry.byName("gone")),
      refusedWith("node_not_draining", /^Node 'gone' is not draining \(it is lost\); there is nothing to undrain\.$/),
    );

    registry.endDrain(registry.byName("here"));
    assert.equal(registry.byName("here").state, "ready");
    assert.throws(() => registry.endDrain(registry.byName("here")), refusedWith("node_not_draining"), "a second undrain finds no drain");
    const away = registry.byName("away");
    registry.endDrain(away);
    assert.equal(away.state, "lost", "still lost until its agent is back");
    assert.equal(registry.heartbeat(away, { address: "10.0.0.2", inventory, labels: {} }), true);
    assert.equal(away.state, "ready", "back, and no longer draining");

    await registry.flush();
    const restarted = new NodeRegistry({ store, joinToken: () => TOKEN, logger: silentLogger(), clock: () => now, monotonic: () => now });
    await restarted.load();
    assert.deepEqual([restarted.byName("here").state, restarted.byName("away").state], ["ready", "ready"], "the undrain is stored");
  } finally {
    await store.close();
  }
});

testBothDatabases("a wall clock that jumps an hour forward loses no node; the monotonic clock passing the timeout does", async (database) => {
  let wall = 1_000_000;
  let monotonic = 50;
  const store = await database.open();
  try {
    const registry = new NodeRegistry({ store, joinToken: () => TOKEN, logger: silentLogger(), clock: () => wall, monotonic: () => monotonic });
    await registry.load();
    await registry.join({ joinToken: TOKEN, name: "a", address: "10.0.0.1", inventory, labels: {} });
    await registry.join({ joinToken: TOKEN, name: "b", address: "10.0.0.2", inventory, labels: {} });
    wall += 3_600_000;
    monotonic += 1_000;
    assert.deepEqual(registry.expire(15_000), [], "an hour on the wall clock, a second really: no node is lost");
    registry.heartbeat(registry.byName("a"), { address: "10.0.0.1", inventory, labels: {} });
    assert.equal(registry.byName("a").lastHeartbeat, wall, "the wall clock is what is shown and stored");
    monotonic += 15_001;
    assert.deepEqual(
      registry.expire(15_000).map((n) => n.name),
      ["a", "b"],
      "past the timeout on the monotonic clock both are lost, the wall clock standing still",
    );
    await registry.flush();
    const row = await store.db.selectFrom("nodes").select(["last_heartbeat"]).where("name", "=", "a").executeTakeFirstOrThrow();
    assert.equal(row.last_heartbeat, new Date(wall).toISOString());
  } finally {
    await store.close();
  }
});
