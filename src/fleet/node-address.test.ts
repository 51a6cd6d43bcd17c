// A node's address is fixed at join and only an admin changes it: through the fleet with the
// test as the agent (join, heartbeat and assignments as `llmgw agent` calls them, no
// engines) on SQLite and PostgreSQL. A heartbeat that names another address (its own, or a
// replica's endpoint) is refused whole with a 409 saying which address is approved, which
// was reported and what an admin runs; the node's address, state and routes stay as they
// were, and one event is recorded per reported address, not one per heartbeat. An admin's
// `update` moves the node: its endpoints on the old address leave routing, and the next
// heartbeat on the new address is accepted.
import { after, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { LlmgwError } from "../core/errors.ts";
import { silentLogger } from "../core/log.ts";
import { EventLog } from "../events/event-log.ts";
import { writeTinyLlamaGguf } from "../gguf/tiny-model.ts";
import { JOIN_TOKEN, replicaReport, startClockedFleet } from "../../test/support/clocked-fleet.ts";
import { eventually } from "../../test/support/eventually.ts";
import { testBothStores } from "../../test/support/stores.ts";
import type { ReplicaReport } from "./agent-protocol.ts";
import type { NodeInventory } from "./fleet-types.ts";
import { addressProblem, foreignAddress } from "./node-address.ts";
import { NodeRegistry } from "./node-registry.ts";

const inventory: NodeInventory = { cores: 8, memoryBytes: 32 * 1024 ** 3, gpus: [], engines: [{ engine: "llamacpp", version: "3.21.1" }] };

const weightsDir = mkdtempSync(path.join(tmpdir(), "llmgw-node-address-"));
const weights = path.join(weightsDir, "m.gguf");
const weightsWritten = writeTinyLlamaGguf({ path: weights, seed: 5 });
after(() => rmSync(weightsDir, { recursive: true, force: true }));

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

test("a report's foreign address: its own, a replica's endpoint, or a Ray head's, compared without case", () => {
  const replica = (fields: Partial<ReplicaReport>): ReplicaReport => ({ ...replicaReport("r-1", "ready", 9, 0), ...fields });
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
    // Four refusals naming 127.0.0.2 and one naming 127.0.0.3: one event for each address.
    const refused = await eventsWhen("node_address_refused", 2);
    assert.deepEqual(refused.map((e) => [e.severity, e.data.approved, e.data.reported]).sort(), [
      ["warning", "127.0.0.1", "127.0.0.2"],
      ["warning", "127.0.0.1", "127.0.0.3"],
    ]);
    assert.match(refused[0]!.message, /llmgw ctl node update n1 --address/);

    // The real agent goes on; a forged one after it is news again (announced once more).
    await beat("127.0.0.1", [ready("127.0.0.1", 41_001)]);
    await assert.rejects(beat("127.0.0.2", []), refusedWith("node_address_mismatch"));
    await eventsWhen("node_address_refused", 3);

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
    // Written after every refusal above (one writer, in order): no heartbeat was announced twice.
    assert.equal((await eventsOf("node_address_refused")).length, 3, "one event per reported address, not per heartbeat");
    // The agent on the old address is refused now; on the new one it is accepted and routed to.
    await assert.rejects(beat("127.0.0.1", [ready("127.0.0.1", 41_001)]), refusedWith("node_address_mismatch", /joined with address 127\.0\.0\.2/));
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
