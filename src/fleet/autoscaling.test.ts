// Autoscaling through the fleet (issue 28), on SQLite and PostgreSQL with the test's clock
// and the test as three agents (no engines): a load above the target for up_after places
// the replicas it needs, spread over the nodes; a load below half the target for
// down_after stops one at a time, each drained of its requests first; the decision is an
// event, shown by the health view (ctl model show), and survives a restart of the fleet.
// Also the scaling fields' refusals at the door.
import { after, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { renderModelHealth } from "../cli/ctl-node.ts";
import { applyModelPatch, parseNewModel } from "../catalog/model-schema.ts";
import { EventLog } from "../events/event-log.ts";
import { silentLogger } from "../core/log.ts";
import { writeTinyLlamaGguf } from "../gguf/tiny-model.ts";
import type { Store } from "../store/store.ts";
import { JOIN_TOKEN, replicaReport, startClockedFleet, type ClockedFleet } from "../../test/support/clocked-fleet.ts";
import { testBothStores } from "../../test/support/stores.ts";
import { eventually } from "../../test/support/eventually.ts";
import { ctlRunner } from "../../test/support/ctl-runner.ts";
import { startHarness } from "../../test/support/server-harness.ts";
import type { ScalingLoad } from "./autoscaling.ts";
import { modelHealthView } from "./fleet-views.ts";
import type { NodeInventory } from "./fleet-types.ts";

const inventory: NodeInventory = { cores: 8, memoryBytes: 32 * 1024 ** 3, gpus: [], engines: [{ engine: "llamacpp", version: "3.21.1" }] };

const weightsDir = mkdtempSync(path.join(tmpdir(), "llmgw-autoscaling-"));
const weights = path.join(weightsDir, "m.gguf");
const weightsWritten = writeTinyLlamaGguf({ path: weights, seed: 28 });
after(() => rmSync(weightsDir, { recursive: true, force: true }));

/** The gateway load the fleet reads, set by the test. */
class TestLoad implements ScalingLoad {
  known = true;
  models = new Map<string, number>();
  readable = true;
  async refresh(): Promise<boolean> {
    return this.readable;
  }
  model(modelId: string): number {
    return this.models.get(modelId) ?? 0;
  }
}

type Agents = Array<{ name: string; credential: string }>;

/** A fleet on the store with three nodes: joined now, or `agents` that joined an earlier fleet on this store. */
async function startRig(store: Store, load: TestLoad, inFlight: Map<string, number>, joined?: Agents) {
  await weightsWritten;
  const clocked: ClockedFleet = await startClockedFleet(store, {
    nodeTimeoutMs: 15_000,
    heartbeatIntervalMs: 5_000,
    load,
    inFlight: (replicaId) => inFlight.get(replicaId) ?? 0,
    drainTimeoutMs: 600_000,
  });
  const { fleet } = clocked;
  const agents: Agents = joined ?? [];
  for (const name of joined === undefined ? ["n1", "n2", "n3"] : []) {
    const { credential } = await fleet.join({ joinToken: JOIN_TOKEN, name, address: "127.0.0.1", inventory, labels: {} });
    agents.push({ name, credential });
  }
  const assigned = async (credential: string) =>
    (await fleet.assignments(credential, { knownVersion: null, waitMs: 0, signal: AbortSignal.timeout(5000) })).assignments.map((a) => a.replicaId);
  /** Every agent reports what it is assigned as ready; then the 1 s tick runs after `ms`. */
  const pass = async (ms: number) => {
    clocked.advance(ms);
    for (const agent of agents) {
      const replicas = (await assigned(agent.credential)).map((id) => replicaReport(id, "ready", 20_000, clocked.now()));
      await fleet.heartbeat(agent.credential, { name: agent.name, address: "127.0.0.1", inventory, labels: {}, replicas, agentRun: `run-${agent.name}` });
    }
    fleet.checkNow();
    await fleet.settled();
  };
  const allAssigned = async () => (await Promise.all(agents.map((agent) => assigned(agent.credential)))).flat().sort();
  const perNode = async () => Promise.all(agents.map(async (agent) => (await assigned(agent.credential)).length));
  const health = () => modelHealthView(clocked.catalog.get("m"), fleet, clocked.table);
  /** The model_scaled events once `count` are recorded (the fleet records them without waiting). */
  const scaledEvents = (count: number) =>
    eventually(`${count} model_scaled events`, async () => {
      const events = await new EventLog({ store, logger: silentLogger() }).list({ kinds: ["model_scaled"] });
      return events.length >= count ? events.sort((a, b) => a.id - b.id) : undefined;
    });
  return { ...clocked, agents, pass, allAssigned, perNode, health, scaledEvents };
}

testBothStores(
  "a load above the target for up_after adds the replicas it needs; below half for down_after, one drained replica at a time goes",
  async (store) => {
    const load = new TestLoad();
    const inFlight = new Map<string, number>();
    const rig = await startRig(store, load, inFlight);
    try {
      const model = await rig.catalog.create(
        {
          name: "m",
          source: { kind: "file", path: weights },
          // target defaults to the replica's parallel (1 here).
          scaling: { min: 1, max: 3, up_after: 15, down_after: 60 },
          profiles: [{ name: "cpu", engine: "llamacpp", ctx_size: 512, parallel: 1 }],
        },
        "test",
      );
      await rig.pass(1_000);
      await rig.pass(1_000);
      assert.equal((await rig.allAssigned()).length, 1);
      assert.deepEqual(
        { ...rig.health().autoscaling, load: rig.health().autoscaling?.load },
        { min: 1, max: 3, target: 1, up_after: 15, down_after: 60, load: 0, desired: 1, last: null },
      );

      // 3 requests in flight and queued for 1 replica of target 1: overloaded, but only for 14 s.
      load.models.set(model.id, 3);
      await rig.pass(1_000);
      await rig.pass(14_000);
      assert.equal((await rig.allAssigned()).length, 1, "a burst shorter than up_after scales nothing");
      await rig.pass(1_000);
      await rig.pass(1_000);
      assert.equal((await rig.allAssigned()).length, 3, "15 s above the target: the replicas the load needs, at once");
      assert.deepEqual(await rig.perNode(), [1, 1, 1], "placed like any other replica: spread over the nodes");
      const [up] = await rig.scaledEvents(1);
      assert.equal(up?.subject, "model:m");
      assert.deepEqual({ ...up?.data, why: undefined }, { model: "m", direction: "up", from: 1, to: 3, why: undefined });
      assert.match(String(up?.data.why), /^3 requests in flight and queued over 1 replica \(target 1 each\) for 15 s$/);
      const shown = renderModelHealth(rig.health());
      assert.match(
        shown,
        /autoscaling: 3 replicas wanted \(1 to 3\); target 1 in flight and queued per replica, load now 3; up after 15 s above target, down after 60 s below half/,
      );
      assert.match(shown, /last decision: up from 1 to 3, .*: 3 requests in flight and queued over 1 replica/);
      await rig.pass(1_000);
      assert.equal(rig.health().ready, 3);

      // Still 3 in flight: stable, nothing more (max reached) and nothing less.
      await rig.pass(120_000);
      assert.equal((await rig.allAssigned()).length, 3);

      // The load falls to 1 (a third of a request per replica, below half the target of 1).
      load.models.set(model.id, 1);
      for (const id of await rig.allAssigned()) inFlight.set(id, 1);
      await rig.pass(1_000);
      await rig.pass(59_000);
      assert.equal((await rig.allAssigned()).length, 3, "not before down_after");
      await rig.pass(1_000);
      await rig.pass(1_000);
      const down = (await rig.scaledEvents(2)).at(-1);
      assert.deepEqual({ ...down?.data, why: undefined }, { model: "m", direction: "down", from: 3, to: 2, why: undefined });
      // The replica that goes has a request in flight: it leaves routing but keeps running until it is over.
      const stopping = rig.table.forModel(model.id).filter((replica) => replica.state === "stopping");
      assert.equal(stopping.length, 1, "one replica drains");
      assert.equal((await rig.allAssigned()).length, 3, "its node keeps running it while it drains");
      // Its request ends, and the load with it.
      for (const id of await rig.allAssigned()) inFlight.set(id, 0);
      load.models.set(model.id, 0);
      await rig.pass(1_000);
      assert.equal((await rig.allAssigned()).length, 2, "drained: stopped");
      assert.ok(!(await rig.allAssigned()).includes(stopping[0]!.id));

      // The clock starts again: the next one goes only after another down_after, and never below min.
      await rig.pass(58_000);
      assert.equal((await rig.allAssigned()).length, 2);
      await rig.pass(2_000);
      await rig.pass(1_000);
      assert.equal((await rig.allAssigned()).length, 1);
      await rig.pass(300_000);
      await rig.pass(1_000);
      assert.equal((await rig.allAssigned()).length, 1, "scaling.min is the floor");
      assert.deepEqual(
        (await rig.scaledEvents(3)).map((event) => `${event.data.direction} ${event.data.from}→${event.data.to}`),
        ["up 1→3", "down 3→2", "down 2→1"],
      );
    } finally {
      await rig.fleet.stop();
    }
  },
);

testBothStores("what autoscaling decided outlives a restart; nothing is decided while the other servers' load cannot be read", async (store) => {
  const load = new TestLoad();
  const first = await startRig(store, load, new Map());
  let modelId = "";
  let agents: Agents = [];
  try {
    const model = await first.catalog.create(
      {
        name: "m",
        source: { kind: "file", path: weights },
        scaling: { min: 1, max: 3, target: 2, up_after: 0, down_after: 10 },
        profiles: [{ name: "cpu", engine: "llamacpp", ctx_size: 512, parallel: 1 }],
      },
      "test",
    );
    modelId = model.id;
    load.models.set(model.id, 5);
    await first.pass(1_000);
    await first.pass(1_000);
    assert.equal((await first.allAssigned()).length, 3, "ceil(5 / target 2) = 3, at once with up_after 0");
    agents = first.agents;
  } finally {
    await first.fleet.stop();
  }

  // A new fleet on the same store (a restart, or another server taking the lead) with no load readable yet.
  load.readable = false;
  load.models.set(modelId, 0);
  const second = await startRig(store, load, new Map(), agents);
  try {
    await second.pass(1_000);
    assert.equal(second.health().autoscaling?.desired, 3, "the replicas wanted before the restart");
    assert.equal((await second.allAssigned()).length, 3, "none is stopped on coming back");
    await second.pass(60_000);
    await second.pass(1_000);
    assert.equal((await second.allAssigned()).length, 3, "no decision on a load that cannot be read");
    assert.equal(second.health().autoscaling?.last?.to, 3);
    load.readable = true;
    await second.pass(1_000);
    await second.pass(11_000);
    await second.pass(1_000);
    assert.equal((await second.allAssigned()).length, 2, "readable again: idle for down_after, one goes");
  } finally {
    await second.fleet.stop();
  }
});

test("the scaling fields are refused at the door with the field named", () => {
  const model = (scaling: Record<string, unknown>) => ({
    name: "m",
    source: { kind: "file", path: "/models/m.gguf" },
    scaling: { min: 1, max: 3, ...scaling },
    profiles: [{ name: "cpu", engine: "llamacpp" }],
  });
  const refusal = (scaling: Record<string, unknown>) => {
    try {
      parseNewModel(model(scaling));
    } catch (error) {
      return (error as Error).message;
    }
    assert.fail(`accepted ${JSON.stringify(scaling)}`);
  };
  assert.match(refusal({ target: 0 }), /'scaling\.target': must be above 0/);
  assert.match(refusal({ target: -2 }), /'scaling\.target': must be above 0/);
  assert.match(refusal({ target: "many" }), /'scaling\.target': must be a number/);
  assert.match(refusal({ up_after: 30, down_after: 10 }), /'scaling\.down_after': must be at least scaling\.up_after \(30 s\)/);
  assert.match(refusal({ up_after: 600 }), /'scaling\.up_after': must be at most scaling\.down_after \(300 s by default\)/);
  assert.match(refusal({ down_after: -1 }), /'scaling\.down_after': must be 0 or more seconds/);
  assert.match(refusal({ up_after: 7200, down_after: 9000 }), /'scaling\.up_after': must be at most 3600 seconds/);
  assert.match(refusal({ cooldown: 5 }), /scaling/);

  // Accepted: stored as given, and a PATCH merges field by field; null goes back to the default.
  const { name: _name, ...accepted } = parseNewModel(model({ target: 4, up_after: 5, down_after: 120 }));
  assert.deepEqual({ ...accepted.scaling }, { min: 1, max: 3, idle_seconds: 900, target: 4, up_after: 5, down_after: 120 });
  const patched = applyModelPatch(accepted, { scaling: { target: null, down_after: 30 } });
  assert.deepEqual({ ...patched.definition.scaling }, { min: 1, max: 3, idle_seconds: 900, up_after: 5, down_after: 30 });
  assert.throws(() => applyModelPatch(accepted, { scaling: { down_after: 1 } }), /'scaling\.down_after': must be at least scaling\.up_after \(5 s\)/);
});

test("ctl model scale sets autoscaling, ctl model show shows it, and the API refuses nonsense naming the field", async () => {
  await weightsWritten;
  const harness = await startHarness();
  const { ctl } = ctlRunner(() => harness);
  try {
    await harness.addModel({ name: "m", source: { kind: "file", path: weights }, profiles: [{ name: "cpu", engine: "llamacpp", ctx_size: 512, parallel: 2 }] });
    const scaled = await ctl(["model", "scale", "m", "1", "--max", "3", "--target", "4"]);
    assert.match(scaled.stdout, /^'m' keeps 1 replica running and scales up to 3 replicas while requests queue\.$/m);
    const shown = await eventually("ctl model show with the load read", async () => {
      const { stdout } = await ctl(["model", "show", "m"]);
      return stdout.includes("load now 0") ? stdout : undefined;
    });
    assert.match(
      shown,
      /^autoscaling: 1 replica wanted \(1 to 3\); target 4 in flight and queued per replica, load now 0; up after 15 s above target, down after 300 s below half$/m,
    );
    assert.match(shown, /^ {2}last decision: none yet$/m);
    // Without --target the default is the replica's parallel.
    await harness.admin("PATCH", "/api/v1/models/m", { scaling: { target: null } });
    assert.match((await ctl(["model", "show", "m"])).stdout, /target 2 in flight and queued per replica/);
    for (const [scaling, field, message] of [
      [{ target: 0 }, "scaling.target", /must be above 0/],
      [{ up_after: 30, down_after: 10 }, "scaling.down_after", /must be at least scaling\.up_after \(30 s\)/],
    ] as const) {
      const refused = await harness.admin("PATCH", "/api/v1/models/m", { scaling });
      assert.equal(refused.status, 400, JSON.stringify(refused.body));
      assert.equal(refused.body.error.param, field);
      assert.match(refused.body.error.message, message);
    }
    const notAutoscaled = await ctl(["model", "scale", "m", "2"]);
    assert.match(notAutoscaled.stdout, /^'m' keeps 2 replicas running\.$/m);
    assert.doesNotMatch((await ctl(["model", "show", "m"])).stdout, /autoscaling/);
  } finally {
    await harness.close();
  }
});
