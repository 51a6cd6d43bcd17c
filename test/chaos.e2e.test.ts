// Chaos: two servers on one PostgreSQL (each through a fault proxy), two agents, the example
// HAProxy config in front, and a client sending a chat request every 100 ms through it with
// the OpenAI SDK's default retries. Each test breaks one thing (the scenarios are in
// test/support/chaos-scenarios.ts, shared with bench/chaos, which runs them with 20 s
// faults) and checks what the issue promises: no request of a known key fails, no process
// exits, every job finishes, and the cluster heals by itself. Faults are shortened here.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { ChaosCluster } from "./support/chaos-cluster.ts";
import {
  databaseBlackhole,
  databaseCut,
  databaseSlow,
  leaderKilledDuring,
  nodeLost,
  rollingUpdate,
  runScenario,
  type Scenario,
  type ScenarioReport,
} from "./support/chaos-scenarios.ts";

const FAULT_MS = 6000;

describe("chaos: the gateway keeps answering and the cluster heals", { timeout: 900_000 }, () => {
  const cluster = new ChaosCluster();
  let key = "";

  before(async () => {
    await cluster.start();
    await cluster.addModel("tiny", 2);
    key = await cluster.createKey("steady");
  });

  after(async () => {
    await cluster.stop();
  });

  const survive = async (scenario: Scenario): Promise<ScenarioReport> => {
    const logs = () => `\na's log:\n${cluster.logOf("a")}\nb's log:\n${cluster.logOf("b")}`;
    const report = await runScenario(cluster, scenario, { faultMs: FAULT_MS, model: "tiny", key }).catch((error: Error) => {
      throw new Error(`${scenario.name}: ${error.message}${logs()}`);
    });
    const context = () =>
      `\n${JSON.stringify({ ...report, failed: report.failed.slice(0, 5) })}\na's log:\n${cluster.logOf("a")}\nb's log:\n${cluster.logOf("b")}`;
    assert.deepEqual(cluster.unexpectedExits(), [], `no process exits${context()}`);
    assert.deepEqual(
      report.failed.map((failure) => failure.error),
      [],
      `no request of a known key fails (${report.sent} sent)${context()}`,
    );
    return report;
  };

  test("database cut: known keys answered throughout, an unseen key gets 503 storage_unavailable at once, both servers ready again", async () => {
    const report = await survive(databaseCut);
    assert.equal(report.facts.unseenKeyStatus, 503);
    assert.equal(report.facts.unseenKeyCode, "storage_unavailable");
    assert.match(String(report.facts.unseenKeyRetryAfter), /^\d+$/);
    // "Quickly": it must not wait out a connect deadline per request. A generous bound for a loaded machine.
    assert.ok(Number(report.facts.unseenKeyMs) < 3000, `the unseen key was answered in ${report.facts.unseenKeyMs} ms`);
    assert.ok(Number(report.facts.notReadyMs) >= 0, "/readyz said not ready during the cut");
  });

  test("database blackhole: known keys answered, /readyz and admin writes answer 503 within 5 s, recovery by itself", async () => {
    const report = await survive(databaseBlackhole);
    assert.ok(Number(report.facts.notReadyMs) >= 0 && Number(report.facts.notReadyMs) <= 5000, `/readyz turned 503 after ${report.facts.notReadyMs} ms`);
    assert.equal(report.facts.adminWriteStatus, 503);
    assert.ok(Number(report.facts.adminWriteMs) <= 5000, `the admin write answered after ${report.facts.adminWriteMs} ms`);
  });

  test("node lost: the other replica answers, the model is whole again on one node, and spreads back when the node returns", async () => {
    await survive(nodeLost);
  });

  test("rolling update: new replicas proven beside the old ones, no request fails", async () => {
    const report = await survive(rollingUpdate);
    assert.equal(report.facts.jobState, "done");
  });

  test("database link slow: known keys answered, admin writes still succeed", async () => {
    const report = await survive(databaseSlow(300));
    assert.equal(report.facts.adminWriteStatus, 201);
  });

  for (const step of ["registry", "mirror", "check", "placement"] as const) {
    test(`leader killed during a serve job's ${step} step: the other server finishes the job (weights from wherever they are), clients unaffected`, async () => {
      const report = await survive(leaderKilledDuring(step));
      assert.equal(report.facts.jobState, "done");
    });
  }
});
