// Every server's gateway load on one PostgreSQL: a server with requests writes its row each
// beat and deletes it once idle; the leader adds the other servers' fresh rows to its own
// live counts, passes over rows gone stale (a server that died writing) and rows it cannot
// read; a clean stop deletes the row. On SQLite nothing is written and the local counts are
// the whole load.
import assert from "node:assert/strict";
import { silentLogger } from "../core/log.ts";
import type { GatewayLoad } from "../gateway/admission.ts";
import type { Store } from "../store/store.ts";
import { eventually } from "../../test/support/eventually.ts";
import { testBothStores } from "../../test/support/stores.ts";
import { GatewayLoads } from "./gateway-loads.ts";

class FakeGateway {
  current: GatewayLoad = { models: new Map(), replicas: new Map() };
  load(): GatewayLoad {
    return { models: new Map(this.current.models), replicas: new Map(this.current.replicas) };
  }
  inFlightOf(replicaId: string): number {
    return this.current.replicas.get(replicaId) ?? 0;
  }
}

function loadsOf(store: Store, server: string, gateway: FakeGateway, options: { freshMs?: number } = {}) {
  return new GatewayLoads({ store, server, local: () => gateway, logger: silentLogger(), reportMs: 20, ...options });
}

testBothStores("the leader counts every server's requests in flight and queued, while their rows are fresh", async (store) => {
  const leaderGateway = new FakeGateway();
  const otherGateway = new FakeGateway();
  const leader = loadsOf(store, "a", leaderGateway);
  const other = loadsOf(store, "b", otherGateway);
  leader.start();
  other.start();
  try {
    leaderGateway.current = { models: new Map([["m1", 2]]), replicas: new Map([["r1", 2]]) };
    otherGateway.current = {
      models: new Map([
        ["m1", 3],
        ["m2", 1],
      ]),
      replicas: new Map([
        ["r1", 1],
        ["r2", 1],
      ]),
    };
    if (store.dialect === "sqlite") {
      // One server: its own counts are the load, and no row is written.
      assert.equal(await leader.refresh(), true);
      assert.equal(leader.known, true);
      assert.equal(leader.model("m1"), 2);
      assert.equal(leader.replica("r2"), 0);
      await new Promise((resolve) => setTimeout(resolve, 100));
      assert.deepEqual(await store.db.selectFrom("gateway_loads").selectAll().execute(), []);
      return;
    }
    await eventually("the other server's load read", async () => {
      assert.equal(await leader.refresh(), true);
      return leader.model("m1") === 5 ? true : undefined;
    });
    assert.equal(leader.known, true);
    assert.equal(leader.model("m2"), 1);
    assert.equal(leader.replica("r1"), 3, "in flight at one replica from both servers");
    assert.equal(leader.replica("r2"), 1);

    // The other server's requests end: its row goes, and so does its share.
    otherGateway.current = { models: new Map(), replicas: new Map() };
    await eventually("its row deleted", async () =>
      (await store.db.selectFrom("gateway_loads").select("server").execute()).some((row) => row.server === "b") ? undefined : true,
    );
    await leader.refresh();
    assert.equal(leader.model("m1"), 2);
    assert.equal(leader.replica("r1"), 2);

    // A server that stops writing (killed): its last row is counted only while fresh.
    otherGateway.current = { models: new Map([["m1", 7]]), replicas: new Map() };
    await eventually("its row written", async () => {
      await leader.refresh();
      return leader.model("m1") === 9 ? true : undefined;
    });
    const stale = loadsOf(store, "c", new FakeGateway());
    await other.stop();
    // stop deletes b's row; write it back stale, as a dead server leaves it.
    await store.db
      .insertInto("gateway_loads")
      .values({ server: "b", loads: JSON.stringify({ models: { m1: 7 } }), reported_at: "2020-01-01T00:00:00.000Z" })
      .execute();
    assert.equal(await stale.refresh(), true);
    assert.equal(stale.model("m1"), 2, "the leader's fresh row counts, the dead server's stale one does not");

    // A row that is not JSON is passed over, not a crash.
    await store.db.updateTable("gateway_loads").set({ loads: "{nope", reported_at: new Date().toISOString() }).where("server", "=", "b").execute();
    assert.equal(await stale.refresh(), true);
    assert.equal(stale.model("m1"), 2);
  } finally {
    await leader.stop();
    await other.stop();
  }
  if (store.dialect === "postgres") {
    const left = (await store.db.selectFrom("gateway_loads").select("server").execute()).map((row) => row.server);
    assert.ok(!left.includes("a"), "a clean stop deletes the server's row");
  }
});

testBothStores("when the rows cannot be read, the load is not known once the last read is stale", async (store) => {
  if (store.dialect === "sqlite") return;
  let now = 1_000_000;
  const loads = new GatewayLoads({ store, server: "a", local: () => null, logger: silentLogger(), freshMs: 5_000, clock: () => now });
  assert.equal(loads.known, false, "nothing read yet");
  assert.equal(await loads.refresh(), true);
  assert.equal(loads.known, true);
  // The table goes away under it (a database that refuses the read).
  await store.db.schema.alterTable("gateway_loads").renameTo("gateway_loads_away").execute();
  try {
    assert.equal(await loads.refresh(), false);
    assert.equal(loads.known, true, "the last read is still fresh");
    now += 5_000;
    assert.equal(loads.known, false, "stale: the autoscaler decides nothing");
  } finally {
    await store.db.schema.alterTable("gateway_loads_away").renameTo("gateway_loads").execute();
  }
});
