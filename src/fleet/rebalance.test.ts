// Replicas spread over nodes and move back to a node that returns (a move that fails there is
// given up without parking the model, and that node cools down), through the fleet with
// the test as two agents (join, heartbeat and assignments as `llmgw agent` calls them, no
// engines) on SQLite and PostgreSQL, with the test's clock: a node is lost when the clock
// passes its timeout without its heartbeat, and a returned node is given a replica only
// once it has stayed back for two heartbeat intervals. What the nodes are assigned is what
// their agents would run; what they report is what the gateway routes to.
import { after } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { silentLogger } from "../core/log.ts";
import { renderModelHealth } from "../cli/ctl-node.ts";
import { writeTinyLlamaGguf } from "../gguf/tiny-model.ts";
import { EventLog } from "../events/event-log.ts";
import { modelHealthView } from "./fleet-views.ts";
import type { Store } from "../store/store.ts";
import { JOIN_TOKEN, replicaReport, startClockedFleet } from "../../test/support/clocked-fleet.ts";
import { eventually } from "../../test/support/eventually.ts";
import { testBothStores } from "../../test/support/stores.ts";
import type { ReportedState } from "./agent-protocol.ts";
import type { NodeInventory } from "./fleet-types.ts";

const GiB = 1024 ** 3;
const inventory = (memoryGiB: number): NodeInventory => ({
  cores: 8,
  memoryBytes: memoryGiB * GiB,
  gpus: [],
  engines: [{ engine: "llamacpp", version: "3.21.1" }],
});

const weightsDir = mkdtempSync(path.join(tmpdir(), "llmgw-rebalance-"));
const weights = path.join(weightsDir, "m.gguf");
const weightsWritten = writeTinyLlamaGguf({ path: weights, seed: 21 });
after(() => rmSync(weightsDir, { recursive: true, force: true }));

const HEARTBEAT_MS = 5_000;
const NODE_TIMEOUT_MS = 15_000;

interface Agent {
  name: string;
  memoryGiB: number;
  credential: string;
}

async function startRig(store: Store) {
  await weightsWritten;
  const { fleet, catalog, table, now, advance } = await startClockedFleet(store, { nodeTimeoutMs: NODE_TIMEOUT_MS, heartbeatIntervalMs: HEARTBEAT_MS });
  // The fleet's clock a day past the wall clock the catalog stamps definitions with, as in
  // production (a definition is older than what happens to it later): a model parked now
  // must not look changed since, which would end its parking at once.
  advance(Date.now() + 86_400_000 - now());
  const join = async (name: string, memoryGiB = 32): Promise<Agent> => {
    const { credential } = await fleet.join({ joinToken: JOIN_TOKEN, name, address: "127.0.0.1", inventory: inventory(memoryGiB), labels: {} });
    return { name, memoryGiB, credential };
  };
  const assigned = async (agent: Agent) =>
    (await fleet.assignments(agent.credential, { knownVersion: null, waitMs: 0, signal: AbortSignal.timeout(5000) })).assignments
      .map((a) => a.replicaId)
      .sort();
  /** Replicas each agent has reported before: as an agent does, it reports a new one starting first. */
  const seen = new Set<string>();
  /**
   * One heartbeat of the agent: it runs what it is assigned, each starting the first time,
   * then ready, unless `states` says otherwise (a state, or one with the replica's last error).
   */
  const beat = async (agent: Agent, states: Record<string, ReportedState | { state: ReportedState; lastError: string }> = {}) => {
    const replicas = (await assigned(agent)).map((id) => {
      const given = states[id];
      const state = (typeof given === "string" ? given : given?.state) ?? (seen.has(id) ? "ready" : "starting");
      seen.add(id);
      const report = replicaReport(id, state, 20_000, now());
      return typeof given === "object" ? { ...report, failures: 5, lastError: given.lastError } : report;
    });
    await fleet.heartbeat(agent.credential, {
      name: agent.name,
      address: "127.0.0.1",
      inventory: inventory(agent.memoryGiB),
      labels: {},
      replicas,
      agentRun: `run-${agent.name}`,
    });
    await fleet.settled();
  };
  /** The clock moves on by `ms` while `alive` keep beating; then the 1 s tick runs. */
  const pass = async (ms: number, alive: Agent[]) => {
    advance(ms);
    for (const agent of alive) await beat(agent);
    fleet.checkNow();
    await fleet.settled();
  };
  const addModel = async (minMemoryGb?: number) => {
    const model = await catalog.create(
      {
        name: "m",
        source: { kind: "file", path: weights },
        scaling: { min: 2, max: 2 },
        profiles: [
          {
            name: "cpu",
            engine: "llamacpp",
            ctx_size: 512,
            parallel: 1,
            ...(minMemoryGb === undefined ? {} : { hardware: { cpu: { min_memory_gb: minMemoryGb } } }),
          },
        ],
      },
      "test",
    );
    await fleet.settled();
    return model;
  };
  const health = () => modelHealthView(catalog.get("m"), fleet, table);
  return { fleet, table, now, join, assigned, beat, pass, addModel, health, close: () => fleet.stop() };
}

type Rig = Awaited<ReturnType<typeof startRig>>;

/** Two nodes, the model's replicas one on each; then n2 is lost and both run on n1. */
async function bothOnOneNode(rig: Rig, n2Memory = 32) {
  const n1 = await rig.join("n1");
  const n2 = await rig.join("n2", n2Memory);
  await rig.addModel(10);
  for (let i = 0; i < 2; i += 1) {
    await rig.beat(n1);
    await rig.beat(n2);
  }
  assert.equal((await rig.assigned(n1)).length, 1, "one replica on n1");
  assert.equal((await rig.assigned(n2)).length, 1, "one on n2: replicas of one model spread");

  // n2 sends nothing past the node timeout: lost; its replica is replaced on n1.
  await rig.pass(NODE_TIMEOUT_MS + 1_000, [n1]);
  await rig.beat(n1);
  await rig.beat(n1);
  const onN1 = await rig.assigned(n1);
  assert.equal(onN1.length, 2, "both replicas on n1 while n2 is lost");
  assert.deepEqual(
    onN1.map((id) => rig.table.get(id)?.state),
    ["ready", "ready"],
  );
  assert.equal(rig.health().spread, "2 replicas on n1: n2 is lost");
  assert.match(renderModelHealth(rig.health()), /\nspread: 2 replicas on n1: n2 is lost\n/, "ctl model show prints it");
  return { n1, n2, onN1 };
}

testBothStores("a node that comes back gets one replica back: started there first, one of the doubled ones stops only once it is ready", async (store) => {
  const rig = await startRig(store);
  try {
    const { n1, n2, onN1 } = await bothOnOneNode(rig);

    // n2 is back (it runs nothing now): not trusted at once.
    await rig.beat(n2);
    assert.deepEqual(await rig.assigned(n2), [], "no move to a node that came back a moment ago");
    assert.match(rig.health().spread ?? "", /^2 replicas on n1: n2 came back a moment ago; one moves there in \d+ s if it stays$/);

    // Two heartbeat intervals later it still beats: one replica moves there.
    await rig.pass(HEARTBEAT_MS, [n1, n2]);
    await rig.pass(HEARTBEAT_MS, [n1, n2]);
    const [moved, ...more] = await rig.assigned(n2);
    assert.ok(moved !== undefined && more.length === 0, "one new replica on n2");
    assert.deepEqual(await rig.assigned(n1), onN1, "n1 keeps both while the new one starts");
    assert.equal(rig.health().spread, "2 replicas on n1: moving one to n2");
    // The event is written beside the reconciliation, not within it: waited for.
    const events = await eventually("a replica_moved event", async () => {
      const recorded = await new EventLog({ store, logger: silentLogger() }).list({ kinds: ["replica_moved"] });
      return recorded.length > 0 ? recorded : undefined;
    });
    assert.deepEqual(
      events.map((e) => [e.subject, e.data]),
      [["model:m", { model: "m", replica: moved, from: "n1", to: "n2" }]],
    );

    // Starting on n2 (and later ticks): still nothing stops on n1, and nothing more starts.
    await rig.beat(n2, { [moved]: "starting" });
    await rig.pass(1_000, [n1]);
    await rig.beat(n2, { [moved]: "failed" });
    await rig.pass(1_000, [n1]);
    await rig.beat(n2, { [moved]: "starting" });
    assert.deepEqual(await rig.assigned(n1), onN1, "the doubled ones serve until the new one is ready");
    assert.deepEqual(await rig.assigned(n2), [moved]);
    for (const id of onN1) assert.equal(rig.table.get(id)?.state, "ready");

    // Ready: one of n1's stops (no request is in flight there, so at once).
    await rig.beat(n2, { [moved]: "ready" });
    const left = await rig.assigned(n1);
    assert.equal(left.length, 1, "one replica left on n1");
    assert.ok(onN1.includes(left[0]!));
    assert.equal(rig.table.get(moved)?.state, "ready");
    await rig.beat(n1);
    assert.equal(rig.health().spread, null, "spread: nothing to say");
    assert.deepEqual(
      rig
        .health()
        .replicas.map((r) => r.nodes.join(","))
        .sort(),
      ["n1", "n2"],
    );

    // Later passes move nothing back or forth.
    for (let i = 0; i < 3; i += 1) await rig.pass(HEARTBEAT_MS, [n1, n2]);
    assert.deepEqual(await rig.assigned(n1), left);
    assert.deepEqual(await rig.assigned(n2), [moved]);
  } finally {
    await rig.close();
  }
});

testBothStores("a node that comes back without room for the model gets no replica, and the model says why", async (store) => {
  const rig = await startRig(store);
  try {
    const { n1, n2, onN1 } = await bothOnOneNode(rig);
    // It comes back with less memory than a replica needs (10 GiB; 8 GiB less the 2 GiB reserve).
    const smaller = { ...n2, memoryGiB: 8 };
    await rig.beat(smaller);
    for (let i = 0; i < 4; i += 1) await rig.pass(HEARTBEAT_MS, [n1, smaller]);
    assert.deepEqual(await rig.assigned(smaller), []);
    assert.deepEqual(await rig.assigned(n1), onN1, "both stay on n1");
    assert.equal(rig.health().spread, "2 replicas on n1: n2 cannot run it (has 6.0 GiB in all (8.0 GiB less 2.0 GiB kept for the system), needs 10.0 GiB)");
  } finally {
    await rig.close();
  }
});

testBothStores("a move whose replica cannot start on its node is given up: the model is not parked, and no move goes there for ten minutes", async (store) => {
  const rig = await startRig(store);
  try {
    const { n1, n2, onN1 } = await bothOnOneNode(rig);
    await rig.beat(n2);
    await rig.pass(HEARTBEAT_MS, [n1, n2]);
    await rig.pass(HEARTBEAT_MS, [n1, n2]);
    const [moved] = await rig.assigned(n2);
    assert.ok(moved !== undefined, "a move to n2");

    // n2's engine cannot run it: it fails, is retried, and its supervisor parks it.
    const error = "llama-server exited with code 1 (unknown model architecture)";
    await rig.beat(n2, { [moved]: { state: "failed", lastError: `${error}.` } });
    const parking = `Parked after 5 failures within 600 s (5 in this run); no more attempts until the replica is unparked or its model changes. Last failure: ${error}.`;
    await rig.beat(n2, { [moved]: { state: "parked", lastError: parking } });
    const failedAt = rig.now();
    assert.equal(rig.health().parked, null, "the model is not parked for a move's replica");
    assert.equal(rig.health().state, "ready");
    assert.deepEqual(await rig.assigned(n1), onN1, "n1's replicas keep serving");
    for (const id of onN1) assert.equal(rig.table.get(id)?.state, "ready");
    assert.deepEqual(await rig.assigned(n2), [], "the move's replica is stopped");
    await rig.beat(n2);
    assert.equal(rig.table.get(moved), undefined, "and gone once n2 no longer runs it");
    const until = new Date(Math.ceil((failedAt + 10 * 60_000) / 60_000) * 60_000).toISOString().slice(11, 16);
    const cooling = `2 replicas on n1: moving one to n2 failed: ${error}; not tried again before ${until} UTC`;
    assert.equal(rig.health().spread, cooling);

    // n2 stays ready, but no move goes there before the cool-down ends.
    while (rig.now() + 60_000 < failedAt + 10 * 60_000) {
      await rig.pass(60_000, [n1, n2]);
      assert.deepEqual(await rig.assigned(n2), [], "no move while n2 cools down");
      assert.equal(rig.health().spread, cooling);
    }
    assert.deepEqual(await rig.assigned(n1), onN1);

    // Then one try again: a new replica on n2, and once it is ready one of n1's stops.
    await rig.pass(60_000, [n1, n2]);
    const [again, ...more] = await rig.assigned(n2);
    assert.ok(again !== undefined && again !== moved && more.length === 0, "one new move to n2");
    assert.equal(rig.health().spread, "2 replicas on n1: moving one to n2");
    await rig.beat(n2, { [again]: "ready" });
    assert.equal((await rig.assigned(n1)).length, 1, "one replica left on n1");
    await rig.beat(n1);
    assert.equal(rig.health().spread, null);
    assert.equal(rig.health().parked, null);
  } finally {
    await rig.close();
  }
});
