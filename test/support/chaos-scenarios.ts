// The chaos scenarios, shared by the tests (test/chaos.e2e.test.ts, with short faults) and
// the benchmark (bench/chaos, with the 20 s faults). Each breaks one part of a
// running ChaosCluster while a client loop sends a request every 100 ms, then waits for
// the cluster to heal, and reports what the clients saw (failed requests, the longest
// request) and how long recovery took. Every scenario leaves the cluster as it found it:
// both servers running, both agents running, the shared model with its two replicas.
import assert from "node:assert/strict";
import { eventually } from "./eventually.ts";
import type { ChaosCluster, LoopReport, ServerName } from "./chaos-cluster.ts";
import { SERVER_NAMES } from "./chaos-cluster.ts";
import { fakeCommitSha } from "./stand-in-hub.ts";
import { GGUF_REPO, tinyGgufBytes } from "./stand-in-repos.ts";

export interface ScenarioOptions {
  /** How long a fault lasts (the database cut and blackhole). */
  faultMs: number;
  /** The model the client loop uses (two replicas, one per node). */
  model: string;
  key: string;
}

export interface ScenarioReport extends LoopReport {
  scenario: string;
  /** From the end of the fault (or the kill) to the cluster being whole again. */
  recoveryMs: number;
  /** What the scenario observed on the way, for the test's assertions and the benchmark's table. */
  facts: Record<string, number | string | boolean>;
}

export interface Scenario {
  name: string;
  /** Serves the model this scenario's client loop uses instead of the shared one (its name). */
  prepare?(cluster: ChaosCluster): Promise<string>;
  /** Removes what prepare served, once the client loop has stopped. */
  cleanup?(cluster: ChaosCluster): Promise<void>;
  /** Breaks something and waits for the cluster to heal; returns its recovery time and facts. */
  run(cluster: ChaosCluster, options: ScenarioOptions): Promise<{ recoveryMs: number; facts: ScenarioReport["facts"] }>;
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** Runs one scenario under a client loop: some answers before, the scenario, some answers after. */
export async function runScenario(cluster: ChaosCluster, scenario: Scenario, shared: ScenarioOptions): Promise<ScenarioReport> {
  const options = scenario.prepare === undefined ? shared : { ...shared, model: await scenario.prepare(cluster) };
  const loop = cluster.clientLoop(options.key, options.model);
  await eventually("the clients to be answered before the fault", () => loop.outcomes.filter((o) => o.error === undefined).length >= 5);
  let result: Awaited<ReturnType<Scenario["run"]>>;
  try {
    result = await scenario.run(cluster, options);
  } finally {
    const answeredBefore = loop.outcomes.length;
    await eventually("the clients to be answered after the fault", () => loop.outcomes.slice(answeredBefore).filter((o) => o.error === undefined).length >= 5, {
      timeoutMs: 60_000,
    }).catch(() => undefined);
  }
  const report = await loop.stop();
  await scenario.cleanup?.(cluster);
  return { scenario: scenario.name, ...report, ...result };
}

/** Both servers ready again (/readyz 200); the time it took from `since`. */
async function bothReady(cluster: ChaosCluster, since: number): Promise<number> {
  await eventually("both servers ready", async () => (await Promise.all(SERVER_NAMES.map((name) => cluster.readyz(name)))).every((status) => status === 200), {
    timeoutMs: 60_000,
    intervalMs: 100,
  });
  return Date.now() - since;
}

/** Waits until `check` holds, polling every 100 ms; the ms it took from `since` (or -1 when it did not within `withinMs`). */
async function timeUntil(check: () => Promise<boolean>, since: number, withinMs: number): Promise<number> {
  while (Date.now() - since < withinMs) {
    if (await check().catch(() => false)) return Date.now() - since;
    await sleep(100);
  }
  return -1;
}

/** The database goes away for every server: connections reset, then refused, for `faultMs`. */
export const databaseCut: Scenario = {
  name: "database cut",
  async run(cluster, { faultMs }) {
    const proxies = [...cluster.dbProxies.values()];
    // A key made before the cut and never used: no server has verified it yet.
    const unseenKey = await cluster.createKey(`unseen-${Date.now()}`);
    for (const proxy of proxies) await proxy.set("reset");
    for (const proxy of proxies) await proxy.set("refuse");
    const cutAt = Date.now();
    const notReadyMs = await timeUntil(async () => (await cluster.readyz("a")) === 503, cutAt, 10_000);
    const unseenAskedAt = Date.now();
    const unseen = await fetch(`${cluster.urlOf("b")}/v1/models`, { headers: { authorization: `Bearer ${unseenKey}` }, signal: AbortSignal.timeout(10_000) });
    const unseenBody = (await unseen.json()) as { error?: { code?: string } };
    const unseenKeyMs = Date.now() - unseenAskedAt;
    await sleep(Math.max(0, faultMs - (Date.now() - cutAt)));
    const restoredAt = Date.now();
    for (const proxy of proxies) await proxy.set("forward");
    return {
      recoveryMs: await bothReady(cluster, restoredAt),
      facts: {
        notReadyMs,
        unseenKeyStatus: unseen.status,
        unseenKeyCode: unseenBody.error?.code ?? "",
        unseenKeyRetryAfter: unseen.headers.get("retry-after") ?? "",
        unseenKeyMs,
      },
    };
  },
};

/** The database stops answering without closing anything (a partition) for `faultMs`. */
export const databaseBlackhole: Scenario = {
  name: "database blackhole",
  async run(cluster, { faultMs }) {
    const proxies = [...cluster.dbProxies.values()];
    for (const proxy of proxies) await proxy.set("blackhole");
    const holedAt = Date.now();
    const notReadyMs = await timeUntil(async () => (await cluster.readyz("b")) === 503, holedAt, 15_000);
    // An admin write needs the database: it must answer 503, and soon.
    const writeStarted = Date.now();
    const write = await cluster.call("b", "POST", "/api/v1/keys", { name: `during-blackhole-${Date.now()}` });
    const adminWriteMs = Date.now() - writeStarted;
    await sleep(Math.max(0, faultMs - (Date.now() - holedAt)));
    const restoredAt = Date.now();
    for (const proxy of proxies) await proxy.set("forward");
    return { recoveryMs: await bothReady(cluster, restoredAt), facts: { notReadyMs, adminWriteStatus: write.status, adminWriteMs } };
  },
};

/** Every server's link to the database turns slow (each chunk held `delayMs`) for `faultMs`. */
export function databaseSlow(delayMs: number): Scenario {
  return {
    name: `database link slow (${delayMs} ms each way)`,
    async run(cluster, { faultMs }) {
      const proxies = [...cluster.dbProxies.values()];
      for (const proxy of proxies) await proxy.set("slow", { delayMs });
      const slowAt = Date.now();
      // Admin work goes on, only slower: a write must still succeed, not time out.
      const write = await cluster.call("b", "POST", "/api/v1/keys", { name: `during-slow-link-${Date.now()}` });
      await sleep(Math.max(0, faultMs - (Date.now() - slowAt)));
      const restoredAt = Date.now();
      for (const proxy of proxies) await proxy.set("forward");
      return { recoveryMs: await bothReady(cluster, restoredAt), facts: { adminWriteStatus: write.status } };
    },
  };
}

/** A node is lost (its agent and engines killed), then comes back; the model keeps two replicas and spreads again. */
export const nodeLost: Scenario = {
  name: "node lost",
  async run(cluster, { model }) {
    // One replica on each node before the loss (a scenario before may have left them moving back).
    await eventually("one ready replica on each node", async () => (await cluster.replicaNodes(model)).join(",") === "n1,n2", { timeoutMs: 60_000 });
    await cluster.killNode("n2");
    const lostAt = Date.now();
    await eventually(
      "n2 to be lost and two replicas ready again",
      async () => {
        const nodes = (await cluster.callAny("GET", "/api/v1/nodes")).body.data as Array<{ name: string; state: string }>;
        return nodes.find((node) => node.name === "n2")?.state === "lost" && (await cluster.replicaNodes(model)).length === 2;
      },
      { timeoutMs: 90_000 },
    );
    const replacedMs = Date.now() - lostAt;
    cluster.restartAgent("n2");
    const backAt = Date.now();
    await eventually("the replicas to spread over both nodes again", async () => (await cluster.replicaNodes(model)).join(",") === "n1,n2", {
      timeoutMs: 120_000,
    });
    return { recoveryMs: replacedMs, facts: { replacedMs, spreadAgainMs: Date.now() - backAt } };
  },
};

/** The leader is killed while a serve job is at `step`; the other server resumes the job, and the killed one comes back as a standby. */
export function leaderKilledDuring(step: "registry" | "mirror" | "check" | "placement" | "smoke_test"): Scenario {
  return {
    // Right after the mirror step the leader is the only holder of the mirrored bytes and no
    // node has fetched them yet: its loss is the loss of the mirror holder.
    name: step === "check" ? "mirror holder killed (the leader) after the mirror step" : `leader killed during ${step}`,
    async run(cluster) {
      const leader = await leaderName(cluster);
      const name = `served-${step.replace("_", "-")}`;
      // The registry and mirror steps are held at the Hub (its API or its downloads hang) so
      // the kill lands inside them; the later steps are caught as they run.
      if (step === "registry") cluster.hub!.setFault({ kind: "hang", match: "/api/" });
      if (step === "mirror") cluster.hub!.setFault({ kind: "hang", match: "/cdn/" });
      const job = await submitJob(cluster, leader, "serve", { repo: GGUF_REPO, name, quant: "Q4_K_M", replicas: 2 });
      const hitStep = await eventually(
        `the job at its ${step} step`,
        async () => {
          const view = (await cluster.call(leader, "GET", `/api/v1/jobs/${job.id}`)).body as { steps: Array<{ name: string; state: string }> };
          const running = view.steps.find((s) => s.state === "running")?.name;
          const order = ["registry", "mirror", "check", "catalog", "placement", "smoke_test"];
          return running !== undefined && order.indexOf(running) >= order.indexOf(step) ? running : undefined;
        },
        { intervalMs: 20 },
      );
      await cluster.killServer(leader);
      const killedAt = Date.now();
      const other: ServerName = leader === "a" ? "b" : "a";
      cluster.hub!.setFault(null);
      const finished = await eventually(
        "the job to finish on the other server",
        async () => {
          const view = (await cluster.call(other, "GET", `/api/v1/jobs/${job.id}`)).body as { state: string; error?: unknown };
          return view.state === "done" || view.state === "failed" ? view : undefined;
        },
        { timeoutMs: 180_000 },
      );
      const recoveryMs = Date.now() - killedAt;
      await cluster.startServer(leader);
      await eventually("the restarted server ready", async () => (await cluster.readyz(leader)) === 200);
      assert.equal(finished.state, "done", `the serve job ended ${JSON.stringify(finished)}`);
      await cluster.waitReady(name, 2);
      assert.equal((await cluster.call(other, "DELETE", `/api/v1/models/${name}`)).status < 300, true);
      return { recoveryMs, facts: { killedDuring: hitStep, jobState: finished.state } };
    },
  };
}

/**
 * A rolling update: a model served from the Hub with two replicas, a new commit published,
 * and an update job that mirrors it, starts new replicas beside the old ones, smoke-tests
 * them and only then lets the old ones go.
 */
export const rollingUpdate: Scenario = {
  name: "rolling update",
  async prepare(cluster) {
    const job = await submitJob(cluster, "a", "serve", { repo: GGUF_REPO, name: "rolling", quant: "Q8_0", replicas: 2 });
    await waitJob(cluster, job.id, "the serve job of 'rolling'");
    await cluster.waitReady("rolling", 2);
    return "rolling";
  },
  async run(cluster) {
    const repo = cluster.repos!.gguf;
    const bytes = await tinyGgufBytes({ seed: 99 });
    const previousMain = repo.revisions!.main!;
    const updated = {
      ...repo,
      revisions: { ...repo.revisions, main: fakeCommitSha(`${GGUF_REPO}@chaos-update`) },
      filesAt: { ...repo.filesAt, [previousMain]: repo.files },
      files: repo.files.map((file) => (file.path === "tiny-llama-Q8_0.gguf" ? { path: file.path, content: bytes } : file)),
    };
    cluster.hub!.putRepo(updated);
    const startedAt = Date.now();
    const job = await submitJob(cluster, "a", "update", { model: "rolling" });
    const finished = await waitJob(cluster, job.id, "the update job");
    const recoveryMs = Date.now() - startedAt;
    // The repository as it was, for a next run; the model goes.
    cluster.hub!.putRepo(repo);
    assert.equal(finished.state, "done", `the update job ended ${JSON.stringify(finished)}`);
    return { recoveryMs, facts: { jobState: finished.state } };
  },
};

/** Deletes 'rolling' (after the loop that used it stopped). */
rollingUpdate.cleanup = async (cluster) => {
  assert.ok((await cluster.callAny("DELETE", "/api/v1/models/rolling")).status < 300);
};

/** Submits a serve or update job; its id (a refusal fails the scenario with the answer). */
async function submitJob(cluster: ChaosCluster, server: ServerName, kind: "serve" | "update", body: unknown): Promise<{ id: string }> {
  // Right after a fault a server may still be taking the lead (503 not_leader): retried, as `llmgw ctl` does.
  let answer = await cluster.call(server, "POST", `/api/v1/jobs/${kind}`, body);
  const deadline = Date.now() + 60_000;
  while (answer.status === 503 && Date.now() < deadline) {
    await sleep(500);
    answer = await cluster.call(server, "POST", `/api/v1/jobs/${kind}`, body);
  }
  assert.equal(answer.status, 202, `the ${kind} job was refused: ${JSON.stringify(answer.body)}`);
  return answer.body as { id: string };
}

async function waitJob(cluster: ChaosCluster, id: string, what: string): Promise<{ state: string }> {
  let last: unknown;
  return eventually(
    `${what} to finish`,
    async () => {
      const view = (await cluster.callAny("GET", `/api/v1/jobs/${id}`)).body as { state: string };
      last = view;
      return view.state === "done" || view.state === "failed" || view.state === "cancelled" ? view : undefined;
    },
    { timeoutMs: 180_000 },
  ).catch((error: Error) => {
    throw new Error(`${error.message}; the job as last seen: ${JSON.stringify(last)}`);
  });
}

/** The server that leads now. */
export async function leaderName(cluster: ChaosCluster): Promise<ServerName> {
  return eventually("a leader", async () => {
    const leader = (await cluster.callAny("GET", "/api/v1/cluster")).body.leader?.name as ServerName | undefined;
    return leader !== undefined && cluster.servers.get(leader)?.process !== undefined ? leader : undefined;
  });
}
