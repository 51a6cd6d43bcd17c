// A node's address is fixed at join and only an admin changes it: through the fleet with the
// test as the agent (join, heartbeat and assignments as `llmgw agent` calls them, no
// engines) on SQLite and PostgreSQL. A heartbeat that names another address (its own, or a
// replica's endpoint) is refused whole with a 409 saying which address is approved, which
// was reported and what an admin runs; the node's address, state and routes stay as they
// were, and at most one event is recorded per node per 10 minutes, not one per heartbeat
// (alternating addresses included). An admin's `update` moves the node: its endpoints on
// the old address leave routing, and the next heartbeat on the new address is accepted.
// Addresses are kept canonical (a URL's form: no zone id, IPv4 only in dotted decimal), so
// a new leader keeps the endpoints on them, and a row no URL can hold does not stop it.
import { after, test } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import pino from "pino";
import { LlmgwError } from "../core/errors.ts";
import { silentLogger } from "../core/log.ts";
import { EventLog } from "../events/event-log.ts";
import { Catalog } from "../catalog/catalog.ts";
import { SecretBox } from "../core/secret-box.ts";
import { writeTinyLlamaGguf } from "../gguf/tiny-model.ts";
import { JOIN_TOKEN, replicaReport, startClockedFleet } from "../../test/support/clocked-fleet.ts";
import { eventually } from "../../test/support/eventually.ts";
import { openSqliteTestStore, testBothStores } from "../../test/support/stores.ts";
import type { ReplicaReport } from "./agent-protocol.ts";
import { Fleet } from "./fleet.ts";
import type { NodeInventory } from "./fleet-types.ts";
import { addressProblem, checkAddress, foreignAddress, NodeAddresses, sameAddress } from "./node-address.ts";
import { type FleetNode, NodeRegistry } from "./node-registry.ts";
import { ReplicaTable } from "./replica-table.ts";

const inventory: NodeInventory = { cores: 8, memoryBytes: 32 * 1024 ** 3, gpus: [], engines: [{ engine: "llamacpp", version: "3.21.1" }] };

const weightsDir = mkdtempSync(path.join(tmpdir(), "llmgw-node-address-"));
const weights = path.join(weightsDir, "m.gguf");
const weightsWritten = writeTinyLlamaGguf({ path: weights, seed: 5 });
after(() => rmSync(weightsDir, { recursive: true, force: true }));

function replicaWith(fields: Partial<ReplicaReport>): ReplicaReport {
  return { ...replicaReport("r-1", "ready", 9, 0), ...fields };
}

function refusedWith(code: string, ...messages: RegExp[]) {
  return (error: unknown) => {
    assert.ok(error instanceof LlmgwError, String(error));
    assert.equal(error.code, code);
    for (const message of messages) assert.match(error.message, message);
    return true;
  };
}

test("an address is a host name or an IP; a scheme, port, path or brackets are refused saying which", () => {
  for (const good of ["10.0.0.5", "127.0.0.1", "gpu-01", "gpu-01.example.com", "node_1.lan", "::1", "fe80::1", "2001:db8::7"]) {
    assert.equal(addressProblem(good), null, good);
  }
  assert.match(addressProblem("http://10.0.0.5")!, /has a scheme/);
  assert.match(addressProblem("10.0.0.5:8080")!, /has a port/);
  assert.match(addressProblem("gpu-01:8080")!, /has a port/);
  assert.match(addressProblem("gpu-01/v1")!, /has a path/);
  assert.match(addressProblem("[::1]")!, /brackets/);
  assert.match(addressProblem("999.1.1.1")!, /not a valid IPv4 address/);
  assert.match(addressProblem("")!, /is empty/);
  for (const bad of ["-gpu", "gpu-", "a..b", "gpu 01", "gpu@01"]) assert.match(addressProblem(bad)!, /not a host name or IP address/, bad);
});

test("a zone id, or a number in another base than dotted decimal, is refused saying what to give instead", () => {
  assert.match(addressProblem("fe80::1%eth0")!, /'fe80::1%eth0' has a zone id \(%eth0\).*a URL cannot carry it/);
  for (const [bad, ipv4] of [
    ["0x7f.1", "127.0.0.1"],
    ["0x0a000005", "10.0.0.5"],
    ["1.2.3.0x4", "1.2.3.4"],
    ["0177.0.0.1", "127.0.0.1"],
    ["2130706433", "127.0.0.1"],
    ["127.1", "127.0.0.1"],
    ["010.0.0.1", "8.0.0.1"],
  ] as const) {
    assert.match(addressProblem(bad)!, new RegExp(`is read as the IPv4 address ${ipv4.replaceAll(".", "\\.")}.*dotted-decimal form`), bad);
  }
  // A last label that is a number makes a URL read the whole name as an IPv4 address: no URL can hold it.
  assert.match(addressProblem("gpu.1")!, /is a host name no URL can carry/);
  for (const bad of ["fe80::1%eth0", "0x7f.1", "gpu.1"]) assert.throws(() => checkAddress(bad, "address"), refusedWith("invalid_address"), bad);
});

test("an address is kept in its canonical form, and compared in it everywhere", () => {
  for (const [given, canonical] of [
    ["0:0:0:0:0:0:0:1", "::1"],
    ["::FFFF:10.0.0.1", "::ffff:a00:1"],
    ["2001:DB8:0:0::7", "2001:db8::7"],
    ["GPU-01.Example.COM.", "gpu-01.example.com"],
    ["Node_1", "node_1"],
    ["10.0.0.5", "10.0.0.5"],
  ] as const) {
    assert.equal(checkAddress(given, "address"), canonical, given);
    assert.equal(sameAddress(given, canonical), true, given);
  }
  assert.equal(sameAddress("::1", "::2"), false);
  assert.equal(sameAddress("10.0.0.1", "::ffff:a00:1"), false, "an IPv4-mapped IPv6 address is another address");
  assert.equal(foreignAddress("::1", { address: "0:0:0:0:0:0:0:1", replicas: [replicaWith({ endpoint: { host: "0::1", port: 9 } })] }), null);
  assert.equal(foreignAddress("::1", { address: "::1", replicas: [replicaWith({ endpoint: null, rayAddress: "[0:0:0:0:0:0:0:1]:6379" })] }), null);
  assert.equal(foreignAddress("gpu-01.lan", { address: "GPU-01.lan.", replicas: [replicaWith({ endpoint: null, rayAddress: "Gpu-01.LAN:6379" })] }), null);
});

test("a Ray head address is a host on the node's address and a port 1-65535, nothing else", () => {
  for (const bad of ["10.0.0.5:6379@evil.example", "10.0.0.5", "10.0.0.5:0", "10.0.0.5:65536", "10.0.0.5:63x", "[::1]:", "[::1]6379", "10.0.0.5:6379/x"]) {
    assert.throws(
      () => foreignAddress("10.0.0.5", { address: "10.0.0.5", replicas: [replicaWith({ endpoint: null, rayAddress: bad })] }),
      refusedWith("invalid_ray_address", /Ray head address/, /HOST:PORT/),
      bad,
    );
  }
  assert.equal(foreignAddress("10.0.0.5", { address: "10.0.0.5", replicas: [replicaWith({ endpoint: null, rayAddress: "10.0.0.5:65535" })] }), null);
});

test("refusals are announced (one event, one log line) at most once per node per 10 minutes, with how many were not", async () => {
  const { store, cleanup } = await openSqliteTestStore();
  try {
    let now = 0;
    const lines: Array<Record<string, unknown>> = [];
    const logger = pino({ level: "info" }, { write: (line: string) => void lines.push(JSON.parse(line) as Record<string, unknown>) });
    const events = new EventLog({ store, logger: silentLogger() });
    const addresses = new NodeAddresses({ nodes: new NodeRegistry({ store, joinToken: () => JOIN_TOKEN, logger }), events, logger, clock: () => now });
    const node = { id: "node-1", name: "n1", address: "10.0.0.1" } as FleetNode;
    const refuse = (address: string) => assert.throws(() => addresses.checkReport(node, { address, replicas: [] }), refusedWith("node_address_mismatch"));
    const refusalsLogged = () => lines.filter((line) => line.msg === "refused a node's report on another address");
    const refusedEvents = (count: number) =>
      eventually(`${count} node_address_refused events`, async () => {
        const found = await events.list({ kinds: ["node_address_refused"] });
        return found.length >= count ? found : undefined;
      });

    // A credential holder alternating two addresses, a heartbeat every 5 s for 9 minutes.
    for (let i = 0; i < 108; i += 1) {
      refuse(i % 2 === 0 ? "10.0.0.66" : "10.0.0.77");
      now += 5_000;
    }
    assert.equal(refusalsLogged().length, 1, "one log line");
    addresses.checkReport(node, { address: "10.0.0.1", replicas: [] });
    refuse("10.0.0.66");
    assert.equal(refusalsLogged().length, 1, "the real agent in between announces nothing anew");
    now += 60_000;
    refuse("10.0.0.77");
    refuse("10.0.0.66");
    // Newest first from the log: oldest first here.
    const announced = [...(await refusedEvents(2))].reverse();
    assert.deepEqual(
      announced.map((e) => e.data),
      [
        { node: "n1", approved: "10.0.0.1", reported: "10.0.0.66", where: "the heartbeat's address", suppressed: 0 },
        { node: "n1", approved: "10.0.0.1", reported: "10.0.0.77", where: "the heartbeat's address", suppressed: 108 },
      ],
    );
    assert.match(announced[1]!.message, /108 more refusals of node 'n1' since the last such event were not announced/);
    assert.deepEqual(
      refusalsLogged().map((line) => [line.reported, line.suppressed]),
      [
        ["10.0.0.66", 0],
        ["10.0.0.77", 108],
      ],
    );
    // Another node has a window of its own.
    refuse("10.0.0.66");
    assert.throws(
      () => addresses.checkReport({ ...node, id: "node-2", name: "n2" }, { address: "10.0.0.66", replicas: [] }),
      refusedWith("node_address_mismatch"),
    );
    assert.equal((await refusedEvents(3)).length, 3);
  } finally {
    await cleanup();
  }
});

test("a report's foreign address: its own, a replica's endpoint, or a Ray head's, compared without case", () => {
  const replica = replicaWith;
  assert.equal(foreignAddress("gpu-01", { address: "GPU-01", replicas: [replica({ endpoint: { host: "gpu-01", port: 9 } })] }), null);
  assert.deepEqual(foreignAddress("10.0.0.1", { address: "10.0.0.2", replicas: [] }), { where: "the heartbeat's address", address: "10.0.0.2" });
  assert.deepEqual(foreignAddress("10.0.0.1", { address: "10.0.0.1", replicas: [replica({ endpoint: { host: "10.6.6.6", port: 9 } })] }), {
    where: "replica r-1's endpoint",
    address: "10.6.6.6",
  });
  assert.deepEqual(foreignAddress("10.0.0.1", { address: "10.0.0.1", replicas: [replica({ endpoint: null, rayAddress: "10.6.6.6:6379" })] }), {
    where: "replica r-1's Ray head address",
    address: "10.6.6.6",
  });
  assert.equal(foreignAddress("::1", { address: "::1", replicas: [replica({ endpoint: { host: "::1", port: 9 }, rayAddress: "[::1]:6379" })] }), null);
});

testBothStores("a heartbeat on another address is refused whole, once announced; an admin's update moves the node", async (store) => {
  await weightsWritten;
  const { fleet, catalog, table, now, advance } = await startClockedFleet(store, { nodeTimeoutMs: 15_000, heartbeatIntervalMs: 5_000 });
  try {
    const events = new EventLog({ store, logger: silentLogger() });
    const eventsOf = async (kind: "node_address_refused" | "node_address_changed") =>
      (await events.list({ kinds: [kind] })).filter((e) => e.subject === "node:n1");
    /** Events are recorded without being awaited: the first `count` of a kind, once written. */
    const eventsWhen = (kind: "node_address_refused" | "node_address_changed", count: number) =>
      eventually(`${count} ${kind} events`, async () => {
        const found = await eventsOf(kind);
        return found.length >= count ? found : undefined;
      });
    const { credential } = await fleet.join({ joinToken: JOIN_TOKEN, name: "n1", address: "127.0.0.1", inventory, labels: {} });
    await catalog.create(
      { name: "m", source: { kind: "file", path: weights }, profiles: [{ name: "cpu", engine: "llamacpp", ctx_size: 512, parallel: 1 }] },
      "test",
    );
    await fleet.settled();
    const [assignment] = (await fleet.assignments(credential, { knownVersion: null, waitMs: 0, signal: AbortSignal.timeout(5000) })).assignments;
    assert.ok(assignment !== undefined, "the replica is assigned to n1");
    const replicaId = assignment.replicaId;
    const beat = (address: string, replicas: ReplicaReport[]) => fleet.heartbeat(credential, { name: "n1", address, inventory, labels: {}, replicas });
    const ready = (host: string, port: number): ReplicaReport => ({ ...replicaReport(replicaId, "ready", port, now()), endpoint: { host, port } });

    await beat("127.0.0.1", [ready("127.0.0.1", 41_001)]);
    assert.equal(table.get(replicaId)?.state, "ready");
    assert.equal(table.get(replicaId)?.endpoint?.origin, "http://127.0.0.1:41001");
    const beatenAt = fleet.nodes.byName("n1").lastHeartbeat;

    // A forged heartbeat with the node's own credential: another address and an endpoint there.
    advance(1_000);
    for (let i = 0; i < 3; i += 1) {
      await assert.rejects(
        beat("127.0.0.2", [ready("127.0.0.2", 41_999)]),
        refusedWith(
          "node_address_mismatch",
          /joined with address 127\.0\.0\.1/,
          /gives the heartbeat's address as 127\.0\.0\.2/,
          /nothing of the report was applied/,
          /llmgw ctl node update n1 --address 127\.0\.0\.2/,
        ),
      );
    }
    const refusal = await beat("127.0.0.2", []).catch((error: unknown) => error);
    assert.ok(refusal instanceof LlmgwError && refusal.status === 409, "a 409");
    // The node's own address with a replica's endpoint elsewhere is refused the same way.
    await assert.rejects(beat("127.0.0.1", [ready("127.0.0.3", 41_999)]), refusedWith("node_address_mismatch", /replica r-\w+'s endpoint as 127\.0\.0\.3/));

    const n1 = fleet.nodes.byName("n1");
    assert.equal(n1.address, "127.0.0.1", "the address is unchanged");
    assert.equal(n1.lastHeartbeat, beatenAt, "not even the heartbeat time was taken");
    assert.equal(table.get(replicaId)?.endpoint?.origin, "http://127.0.0.1:41001", "routes stay on the real replica");
    assert.equal(table.get(replicaId)?.state, "ready");
    await fleet.nodes.flush();
    const row = await store.db.selectFrom("nodes").select("address").where("name", "=", "n1").executeTakeFirstOrThrow();
    assert.equal(row.address, "127.0.0.1");
    // Four refusals naming 127.0.0.2 and one naming 127.0.0.3: one event (at most one per node per 10 minutes).
    const [refused] = await eventsWhen("node_address_refused", 1);
    assert.deepEqual([refused!.severity, refused!.data.approved, refused!.data.reported, refused!.data.suppressed], ["warning", "127.0.0.1", "127.0.0.2", 0]);
    assert.match(refused!.message, /llmgw ctl node update n1 --address/);

    // The real agent goes on; a forged report after it is refused without another event
    // until ten minutes have passed, and that one says how many were not announced.
    await beat("127.0.0.1", [ready("127.0.0.1", 41_001)]);
    await assert.rejects(beat("127.0.0.2", []), refusedWith("node_address_mismatch"));
    advance(10 * 60_000);
    await beat("127.0.0.1", [ready("127.0.0.1", 41_001)]);
    await assert.rejects(beat("127.0.0.3", []), refusedWith("node_address_mismatch"));
    const [latest] = await eventsWhen("node_address_refused", 2);
    assert.deepEqual([latest!.data.reported, latest!.data.suppressed], ["127.0.0.3", 5]);

    // An admin moves the node: the endpoint on the old address leaves routing at once.
    await assert.rejects(fleet.updateAddress("n1", "127.0.0.2:8080"), refusedWith("invalid_address", /has a port/));
    await assert.rejects(fleet.updateAddress("nope", "127.0.0.2"), refusedWith("node_not_found"));
    const moved = await fleet.updateAddress("n1", "127.0.0.2");
    assert.deepEqual([moved.previous, moved.node.address], ["127.0.0.1", "127.0.0.2"]);
    assert.equal(table.get(replicaId)?.endpoint, null);
    assert.equal(table.get(replicaId)?.state, "starting");
    assert.deepEqual(
      (await eventsWhen("node_address_changed", 1)).map((e) => e.data),
      [{ node: "n1", previous: "127.0.0.1", address: "127.0.0.2" }],
    );
    // Written after every refusal above (one writer, in order): no more than those two were announced.
    assert.equal((await eventsOf("node_address_refused")).length, 2, "at most one event per node per 10 minutes, not one per heartbeat");
    // The agent on the old address is refused now (news after the admin's change: announced);
    // on the new one it is accepted and routed to.
    await assert.rejects(beat("127.0.0.1", [ready("127.0.0.1", 41_001)]), refusedWith("node_address_mismatch", /joined with address 127\.0\.0\.2/));
    const [afterChange] = await eventsWhen("node_address_refused", 3);
    assert.deepEqual([afterChange!.data.approved, afterChange!.data.reported, afterChange!.data.suppressed], ["127.0.0.2", "127.0.0.1", 0]);
    assert.equal(table.get(replicaId)?.endpoint, null);
    await beat("127.0.0.2", [ready("127.0.0.2", 41_002)]);
    assert.equal(table.get(replicaId)?.state, "ready");
    assert.equal(table.get(replicaId)?.endpoint?.origin, "http://127.0.0.2:41002");
    assert.equal(fleet.nodes.byName("n1").state, "ready");

    // Joining again under the name (with the join token) is refused and moves nothing.
    await assert.rejects(
      fleet.join({ joinToken: JOIN_TOKEN, name: "n1", address: "127.0.0.9", inventory, labels: {} }),
      refusedWith("node_name_taken", /keep using its node credential/),
    );
    // A restarted server reads the admin's address back.
    const again = new NodeRegistry({ store, joinToken: () => JOIN_TOKEN, logger: silentLogger() });
    await again.load();
    assert.equal(again.byName("n1").address, "127.0.0.2");
  } finally {
    await fleet.stop();
  }
});

testBothStores("an address is stored canonical, so a takeover keeps its endpoints; a row it cannot read does not stop the fleet", async (store) => {
  await weightsWritten;
  const now = 1_700_000_000_000;
  const box = SecretBox.fromKey(randomBytes(32));
  const catalog = new Catalog({ store, box, weights: { check: async () => undefined } });
  await catalog.refresh();
  const lines: Array<Record<string, unknown>> = [];
  const logger = pino({ level: "warn" }, { write: (line: string) => void lines.push(JSON.parse(line) as Record<string, unknown>) });
  /** A fleet on the store as a (re)started server runs it; `takeover`: from a leader that knew the states a moment ago. */
  const startFleet = async (takeover: boolean) => {
    const table = new ReplicaTable();
    const fleet = new Fleet({
      store,
      catalog,
      replicas: table,
      mirror: { check: async () => Promise.reject(new Error("these models are local files; the mirror is not asked")) },
      box,
      joinToken: () => JOIN_TOKEN,
      logger,
      clock: () => now,
      monotonic: () => now,
      tickMs: 3_600_000,
      nodeTimeoutMs: 15_000,
      takeover,
    });
    await fleet.start();
    return { fleet, table };
  };

  const first = await startFleet(false);
  let replicaId = "";
  let credential = "";
  try {
    await assert.rejects(
      first.fleet.join({ joinToken: JOIN_TOKEN, name: "n0", address: "fe80::1%eth0", inventory, labels: {} }),
      refusedWith("invalid_address", /zone id/),
    );
    ({ credential } = await first.fleet.join({ joinToken: JOIN_TOKEN, name: "n1", address: "0:0:0:0:0:0:0:1", inventory, labels: {} }));
    assert.equal(first.fleet.nodes.byName("n1").address, "::1", "kept canonical");
    await catalog.create(
      { name: "m", source: { kind: "file", path: weights }, profiles: [{ name: "cpu", engine: "llamacpp", ctx_size: 512, parallel: 1 }] },
      "test",
    );
    await first.fleet.settled();
    const [assignment] = (await first.fleet.assignments(credential, { knownVersion: null, waitMs: 0, signal: AbortSignal.timeout(5000) })).assignments;
    assert.ok(assignment !== undefined, "the replica is assigned to n1");
    replicaId = assignment.replicaId;
    // The agent reports the address as it was given (--advertise): the same address.
    await first.fleet.heartbeat(credential, {
      name: "n1",
      address: "0:0:0:0:0:0:0:1",
      inventory,
      labels: {},
      replicas: [{ ...replicaReport(replicaId, "ready", 41_001, now), endpoint: { host: "0:0:0:0:0:0:0:1", port: 41_001 } }],
    });
    assert.equal(first.table.get(replicaId)?.endpoint?.origin, "http://[::1]:41001");
    await assert.rejects(first.fleet.updateAddress("n1", "fe80::1%eth0"), refusedWith("invalid_address", /zone id/));
  } finally {
    await first.fleet.stop();
  }
  const row = await store.db.selectFrom("nodes").select("address").where("name", "=", "n1").executeTakeFirstOrThrow();
  assert.equal(row.address, "::1");

  // A new leader takes over: the endpoint is on the node's address, so it stays routable;
  // also where the row holds the address in another form (written before addresses were kept canonical).
  await store.db.updateTable("nodes").set({ address: "0:0:0:0:0:0:0:1" }).where("name", "=", "n1").execute();
  const second = await startFleet(true);
  try {
    assert.equal(second.table.get(replicaId)?.state, "ready");
    assert.equal(second.table.get(replicaId)?.endpoint?.origin, "http://[::1]:41001");
  } finally {
    await second.fleet.stop();
  }

  // Rows from before zone ids were refused: an address and an endpoint no URL can hold.
  await store.db.updateTable("nodes").set({ address: "fe80::1%eth0" }).where("name", "=", "n1").execute();
  await store.db.updateTable("replicas").set({ endpoint: "http://[fe80::1%eth0]:41001" }).where("id", "=", replicaId).execute();
  const third = await startFleet(true);
  try {
    assert.equal(third.table.get(replicaId)?.endpoint, null, "not routable");
    assert.notEqual(third.table.get(replicaId)?.state, "ready");
    assert.ok(
      lines.some((line) => line.replica === replicaId && line.endpoint === "http://[fe80::1%eth0]:41001"),
      "a warning names the replica and its endpoint",
    );
    // The admin gives the node an address a URL can hold (no 500), and its agent is routed to there.
    const moved = await third.fleet.updateAddress("n1", "::1");
    assert.deepEqual([moved.previous, moved.node.address], ["fe80::1%eth0", "::1"]);
    await third.fleet.heartbeat(credential, {
      name: "n1",
      address: "::1",
      inventory,
      labels: {},
      replicas: [{ ...replicaReport(replicaId, "ready", 41_002, now), endpoint: { host: "::1", port: 41_002 } }],
    });
    assert.equal(third.table.get(replicaId)?.endpoint?.origin, "http://[::1]:41002");
  } finally {
    await third.fleet.stop();
  }
});
