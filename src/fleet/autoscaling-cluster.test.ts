// Autoscaling with two servers on one PostgreSQL: the requests a standby holds count in
// the leader's decision (gateway_loads), the standby shows the leader's target, load and
// decision (its health route goes to the leader) and the replicas wanted in its metrics
// (model_scaling through the change feed). The node is the test (join, heartbeats), its
// replica a stand-in engine whose answers wait at a gate.
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import OpenAI from "openai";
import { writeTinyLlamaGguf } from "../gguf/tiny-model.ts";
import { startHarness, type Harness } from "../../test/support/server-harness.ts";
import { startFakeUpstream, type FakeUpstream } from "../../test/support/fake-upstream.ts";
import { eventually } from "../../test/support/eventually.ts";
import { Gate } from "../../test/support/gate.ts";
import { replicaReport } from "../../test/support/clocked-fleet.ts";
import { parsePrometheusText } from "../../test/support/prometheus-text.ts";
import { dropSchema, postgresSchemaOrSkip } from "../../test/support/stores.ts";
import type { NodeInventory } from "./fleet-types.ts";

const inventory: NodeInventory = { cores: 8, memoryBytes: 32 * 1024 ** 3, gpus: [], engines: [{ engine: "llamacpp", version: "3.21.1" }] };

test("the leader scales a model on the requests another server holds, and that server shows it", async (t) => {
  const database = await postgresSchemaOrSkip(t);
  if (database === null) return;
  const modelDir = mkdtempSync(path.join(tmpdir(), "llmgw-autoscaling-cluster-"));
  const gate = new Gate();
  let upstream: FakeUpstream | undefined;
  const started: Harness[] = [];
  let beating = true;
  let heartbeats: Promise<void> = Promise.resolve();
  try {
    const modelFile = path.join(modelDir, "tiny.gguf");
    await writeTinyLlamaGguf({ path: modelFile, seed: 29 });
    upstream = await startFakeUpstream({ beforeAnswer: gate.wait });
    const leader = await startHarness({ database, cluster: { name: "a" } });
    started.push(leader);
    const standby = await startHarness({ database, adminKey: leader.adminKey, cluster: { name: "b" } });
    started.push(standby);
    assert.equal(leader.server.leadership.leading, true);
    await leader.addModel({
      name: "grows",
      source: { kind: "file", path: modelFile },
      // 2 requests per replica at once, 2 in flight and queued per replica meant.
      scaling: { min: 1, max: 3, target: 2, up_after: 0, down_after: 600 },
      profiles: [{ name: "cpu", engine: "llamacpp", ctx_size: 512, parallel: 2 }],
    });
    // The node: it runs what it is assigned, every replica "ready" on the stand-in engine.
    const joinToken = readFileSync(path.join(leader.dataDir, "join.token"), "utf8").trim();
    const fleet = leader.server.fleet;
    const { credential } = await fleet.join({ joinToken, name: "n1", address: "127.0.0.1", inventory, labels: {} });
    const assigned = async () => (await fleet.assignments(credential, { knownVersion: null, waitMs: 0, signal: AbortSignal.timeout(5000) })).assignments;
    const port = upstream.port;
    heartbeats = (async () => {
      while (beating) {
        const replicas = (await assigned()).map((a) => replicaReport(a.replicaId, "ready", port, Date.now()));
        await fleet.heartbeat(credential, { name: "n1", address: "127.0.0.1", inventory, labels: {}, replicas, agentRun: "run-1" });
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
    })();
    const ready = (harness: Harness) => harness.server.replicas.all().filter((r) => r.modelName === "grows" && r.state === "ready");
    await eventually("the standby routes to the first replica", () => ready(standby).length === 1);

    // Four requests at the standby: two in flight at the one replica, two queued there. The leader has none.
    const key = await leader.clientKey();
    const client = new OpenAI({ apiKey: key, baseURL: `${standby.url}/v1`, maxRetries: 0, timeout: 60_000 });
    const answers = Array.from({ length: 4 }, () => client.chat.completions.create({ model: "grows", messages: [{ role: "user", content: "hi" }] }));
    const modelId = ready(standby)[0]!.modelId;
    await eventually("2 in flight and 2 queued at the standby", () => upstream!.inFlight() === 2 && standby.server.gateway.waitingFor(modelId) === 2);
    assert.equal(leader.server.gateway.waitingFor(modelId), 0);

    await eventually("the leader places a second replica", async () => (await assigned()).length === 2);
    // Recorded once the decision is written (the fleet does not wait for it).
    const [event] = await eventually("a model_scaled event", async () => {
      const events = await leader.server.events.list({ kinds: ["model_scaled"] });
      return events.length > 0 ? events : undefined;
    });
    assert.deepEqual({ ...event!.data, why: undefined }, { model: "grows", direction: "up", from: 1, to: 2, why: undefined });
    // 3 or 4: the leader decides at the first tick that reads more than the target over one replica.
    assert.match(String(event!.data.why), /^[34] requests in flight and queued over 1 replica \(target 2 each\)/);

    // Asked at the standby: the leader's view (its health route is the leader's), with the load of both servers.
    const health = await eventually("the leader's view, asked at the standby, with all 4 requests", async () => {
      const answer = await standby.admin("GET", "/api/v1/models/grows/health");
      assert.equal(answer.status, 200, JSON.stringify(answer.body));
      return answer.body.autoscaling?.load === 4 ? answer.body : undefined;
    });
    assert.equal(health.autoscaling.desired, 2);
    assert.equal(health.autoscaling.target, 2);
    assert.equal(health.autoscaling.last.direction, "up");
    // The standby's own metrics say what the leader wants, read from model_scaling.
    await eventually("the standby's metrics show 2 replicas wanted", async () => {
      const exposition = parsePrometheusText(await (await fetch(`${standby.url}/metrics`)).text());
      return exposition.value("llmgw_model_desired_replicas", { model: "grows" }) === 2;
    });

    gate.open();
    for (const answer of await Promise.all(answers)) assert.equal(answer.choices[0]?.finish_reason, "stop");
    await eventually("the standby's row deleted once it has no requests", async () => {
      const rows = await standby.server.store.db.selectFrom("gateway_loads").select("server").execute();
      return !rows.some((row) => row.server === "b");
    });
  } finally {
    beating = false;
    await heartbeats.catch(() => undefined);
    for (const harness of started.reverse()) await harness.close();
    await upstream?.close();
    await dropSchema(database.schema);
    rmSync(modelDir, { recursive: true, force: true });
  }
});
