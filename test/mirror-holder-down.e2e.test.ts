// A mirror holder that is down does not park a model (issue 24): two `llmgw server`
// processes (a and b) on one PostgreSQL and one `llmgw agent` (n1, which asks a first),
// with the stand-in Hub as the origin of the weights. A serve job on a mirrors the weights
// (a alone holds them) and places a replica on n1; n1 is paused (SIGSTOP) before it can
// fetch them, a is killed with SIGKILL, and n1 goes on. It reaches b, which has no copy
// and no running holder to send it to: b fetches the file from the Hub itself (slowed down
// here, so the wait is seen), n1 waits meanwhile, saying so in its replica's state, and the
// model becomes ready on n1 with no failure counted; the job, resumed by b, finishes.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { findFreePort } from "../src/agent/free-port.ts";
import { eventually } from "./support/eventually.ts";
import { createTestDatabase, listeningUrl, spawnLlmgw, stopAll, type LlmgwProcess } from "./support/cluster-processes.ts";
import { startStandInHub, type StandInHub } from "./support/stand-in-hub.ts";
import { buildStandInRepos, GGUF_REPO } from "./support/stand-in-repos.ts";
import { postgresProblem } from "./support/stores.ts";
import type { MirrorFileView } from "../src/mirror/mirror.ts";
import type { JobStep } from "../src/serve/job-rows.ts";

const SECRET = "a-cluster-secret-for-the-holder-down-test-0123456789";

describe("a mirror holder killed after the serve job's mirror step", { timeout: 300_000 }, () => {
  // Short: engines' run folders go below the agent's data dir.
  const root = mkdtempSync(path.join(tmpdir(), "lh"));
  const processes: LlmgwProcess[] = [];
  const servers = new Map<string, { process: LlmgwProcess; url: string; dir: string }>();
  let database: Awaited<ReturnType<typeof createTestDatabase>> | undefined;
  let hub: StandInHub;
  let adminKey = "";
  let agent: LlmgwProcess;

  const startServer = async (name: string) => {
    const dir = path.join(root, `server-${name}`);
    const port = await findFreePort("127.0.0.1");
    const child = spawnLlmgw(
      [
        "server",
        ...["--data-dir", dir, "--listen", `127.0.0.1:${port}`, "--database", database!.url, "--server-name", name, "--registry", hub.url],
        // Long enough that the node paused below is not taken for lost meanwhile.
        ...["--node-timeout", "60s", "--heartbeat-interval", "1s"],
      ],
      { LLMGW_CLUSTER_SECRET: SECRET },
    );
    processes.push(child);
    servers.set(name, { process: child, url: await listeningUrl(child), dir });
  };
  const urlOf = (name: string) => servers.get(name)!.url;
  const call = async (name: string, method: string, pathname: string, body?: unknown) => {
    const response = await fetch(urlOf(name) + pathname, {
      method,
      headers: { authorization: `Bearer ${adminKey}`, "content-type": "application/json" },
      ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    });
    const text = await response.text();
    return { status: response.status, body: text === "" ? null : JSON.parse(text) };
  };
  const logs = () => {
    const serverLogs = [...servers].map(([name, s]) => `--- ${name}:\n${s.process.output().slice(-4000)}`);
    return [...serverLogs, `--- n1:\n${agent.output().slice(-4000)}`].join("\n");
  };

  before(async () => {
    const unreachable = await postgresProblem();
    if (unreachable !== null) throw new Error(`PostgreSQL is required for this test but is not reachable: ${unreachable}`);
    database = await createTestDatabase();
    hub = await startStandInHub({ repos: [(await buildStandInRepos()).gguf] });
    await startServer("a");
    adminKey = readFileSync(path.join(servers.get("a")!.dir, "admin.key"), "utf8").trim();
    await startServer("b");
    const dir = path.join(root, "agent-n1");
    mkdirSync(dir, { recursive: true });
    writeFileSync(path.join(dir, "inventory.json"), JSON.stringify({ cores: 4, memory: "8g", engines: [{ engine: "llamacpp", version: "3.21.1" }] }));
    const joinToken = readFileSync(path.join(servers.get("a")!.dir, "join.token"), "utf8").trim();
    agent = spawnLlmgw([
      "agent",
      "--server",
      `${urlOf("a")},${urlOf("b")}`,
      "--join-token",
      joinToken,
      "--name",
      "n1",
      "--data-dir",
      dir,
      "--inventory",
      path.join(dir, "inventory.json"),
    ]);
    processes.push(agent);
    await eventually("n1 ready", async () =>
      ((await call("a", "GET", "/api/v1/nodes")).body.data as Array<{ state: string }>).some((n) => n.state === "ready"),
    );
  });

  after(async () => {
    if (agent !== undefined && agent.child.exitCode === null) agent.child.kill("SIGCONT");
    await stopAll(processes);
    await hub?.close();
    await database?.drop();
    rmSync(root, { recursive: true, force: true });
  });

  test("the node gets the weights through b from the origin, waits meanwhile without a failure, and the serve job finishes", async () => {
    // n1 cannot fetch anything while paused: the weights stay on a alone.
    agent.child.kill("SIGSTOP");
    const job = (await call("a", "POST", "/api/v1/jobs/serve", { repo: GGUF_REPO, name: "served", quant: "Q4_K_M" })).body;
    assert.ok(typeof job.id === "string", JSON.stringify(job));
    await eventually("the job past its mirror step, a replica placed on n1", async () => {
      const steps = (await call("a", "GET", `/api/v1/jobs/${job.id}`)).body.steps as JobStep[];
      if (steps.find((s) => s.name === "mirror")?.state !== "done") return false;
      const model = await call("a", "GET", "/api/v1/models/served/health");
      return model.status === 200 && (model.body.replicas as Array<{ nodes: string[] }>).some((r) => r.nodes.includes("n1"));
    });
    const mirrored = (await call("a", "GET", "/api/v1/mirror")).body.data as MirrorFileView[];
    assert.deepEqual(
      mirrored.map((f) => f.holders),
      [["a"]],
      "a alone holds the weights",
    );

    // b's copy from the Hub takes a moment, so n1 is seen waiting for it.
    hub.setFault({ kind: "delay", ms: 3000, match: "/cdn/", times: 1 });
    const hubRequestsBefore = hub.requests.length;
    servers.get("a")!.process.child.kill("SIGKILL");
    await servers.get("a")!.process.exited;
    agent.child.kill("SIGCONT");

    const seenErrors = new Set<string>();
    const finished = await eventually(
      "the serve job to finish on b",
      async () => {
        const model = await call("b", "GET", "/api/v1/models/served/health");
        for (const replica of (model.body?.replicas ?? []) as Array<{ last_error: string | null }>) if (replica.last_error) seenErrors.add(replica.last_error);
        const view = (await call("b", "GET", `/api/v1/jobs/${job.id}`)).body;
        return view?.state === "done" || view?.state === "failed" ? view : undefined;
      },
      { timeoutMs: 180_000 },
    ).catch((error: Error) => {
      throw new Error(`${error.message}; replica errors seen: ${[...seenErrors].join(" | ")}\n${logs()}`);
    });
    assert.equal(finished.state, "done", `${JSON.stringify(finished)}\n${logs()}`);

    const health = (await call("b", "GET", "/api/v1/models/served/health")).body;
    assert.equal(health.state, "ready", JSON.stringify(health));
    assert.deepEqual(
      (health.replicas as Array<{ nodes: string[]; failures: number; weights_verified: boolean }>).map((r) => [r.nodes[0], r.failures, r.weights_verified]),
      [["n1", 0, true]],
      "waiting for weights counted no failure",
    );
    assert.ok(
      [...seenErrors].some((text) => /^waiting for weights: /.test(text)),
      `the replica said it waits for its weights: ${[...seenErrors].join(" | ")}`,
    );
    assert.ok(
      hub.requests.slice(hubRequestsBefore).some((r) => r.path.startsWith("/cdn/")),
      "b fetched the weights from the origin",
    );
    const held = (await call("b", "GET", "/api/v1/mirror")).body.data as MirrorFileView[];
    assert.deepEqual(
      held.map((f) => [f.state, f.holders]),
      [["complete", ["a", "b"]]],
      "b holds the weights now, besides a",
    );
    const parked = (await call("b", "GET", "/api/v1/events?kind=model_parked")).body.data as unknown[];
    assert.deepEqual(parked, []);
  });
});
