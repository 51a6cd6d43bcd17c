// Many servers on one PostgreSQL, as an operator runs them: two `llmgw server` processes
// (a and b) with one cluster secret on a database made for this test, and two
// `llmgw agent` processes that know both servers (n1 asks a first, n2 asks b first). The
// model answers through either server; a key revoked on one is refused on the other; a
// mirror file fetched on a reaches an agent that asks b (a redirect with a grant signed by
// the cluster secret); and when the leader is killed with SIGKILL, the other takes over,
// resumes the serve job
// the dead one was running, keeps the model answering for clients that retry as the
// OpenAI SDK does (through the example HAProxy config of deploy/, in front of both), and
// the agents move to it without their nodes being lost. How fast a change or a takeover
// reaches the other server is a latency, measured in bench/cluster/change-feed.ts.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import OpenAI from "openai";
import { findFreePort } from "../src/agent/free-port.ts";
import { writeTinyLlamaGguf } from "../src/gguf/tiny-model.ts";
import { eventually } from "./support/eventually.ts";
import { startBalancer as startTheBalancer, type Balancer } from "./support/balancer.ts";
import { createTestDatabase, listeningUrl, spawnClusterAgent, spawnLlmgw, stopAll, type LlmgwProcess } from "./support/cluster-processes.ts";
import { startStandInHub, type StandInHub } from "./support/stand-in-hub.ts";
import { buildStandInRepos, GGUF_REPO } from "./support/stand-in-repos.ts";
import { postgresProblem } from "./support/stores.ts";
import { LIMITS_CLOCK_ENV } from "../src/policy/limits-clock.ts";
import type { ClusterView } from "../src/cluster/cluster-routes.ts";
import type { StoredEvent } from "../src/events/event-log.ts";
import type { modelHealthView, NodeView } from "../src/fleet/fleet-views.ts";
import type { MirrorFileView } from "../src/mirror/mirror.ts";
import type { JobStep } from "../src/serve/job-rows.ts";

const BIN = fileURLToPath(new URL("../bin/llmgw.js", import.meta.url));
const run = promisify(execFile);
const SECRET = "a-cluster-secret-for-the-many-servers-test-0123456789";
// Both servers' rate windows and budgets count at this one moment (LIMITS_CLOCK_ENV): a
// key's per-minute window cannot end in the middle of the test, wherever in the minute it runs.
const LIMITS_AT = new Date().toISOString();

describe("two servers on one PostgreSQL", { timeout: 900_000 }, () => {
  // Short: engines' run folders go below each agent's data dir.
  const root = mkdtempSync(path.join(tmpdir(), "lc"));
  const processes: LlmgwProcess[] = [];
  const servers = new Map<string, { process: LlmgwProcess; url: string; dir: string }>();
  let database: Awaited<ReturnType<typeof createTestDatabase>> | undefined;
  let hub: StandInHub;
  let adminKey = "";
  let modelFile = "";
  let balancer: Balancer | undefined;

  /** HAProxy with deploy/haproxy/haproxy.cfg, listening on a free port, in front of a and b. */
  const startBalancer = async () => {
    balancer = await startTheBalancer(root, { a: urlOf("a"), b: urlOf("b") });
    return balancer.url;
  };

  const startServer = async (name: string, extra: string[] = [], env: Record<string, string> = {}) => {
    const dir = path.join(root, `server-${name}`);
    const port = await findFreePort("127.0.0.1");
    const child = spawnLlmgw(
      [
        "server",
        "--data-dir",
        dir,
        "--listen",
        `127.0.0.1:${port}`,
        "--database",
        database!.url,
        "--server-name",
        name,
        "--registry",
        hub.url,
        "--node-timeout",
        "6s",
        "--heartbeat-interval",
        "1s",
        ...extra,
      ],
      { LLMGW_CLUSTER_SECRET: SECRET, [LIMITS_CLOCK_ENV]: LIMITS_AT, ...env },
    );
    processes.push(child);
    const url = await listeningUrl(child);
    servers.set(name, { process: child, url, dir });
    return { process: child, url, dir };
  };
  const urlOf = (name: string) => servers.get(name)!.url;
  const call = async (name: string, method: string, pathname: string, body?: unknown, key = adminKey) => {
    const response = await fetch(urlOf(name) + pathname, {
      method,
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    });
    const text = await response.text();
    return { status: response.status, body: text === "" ? null : JSON.parse(text) };
  };
  const ctl = (name: string, args: string[]) =>
    run(process.execPath, [BIN, "ctl", "--server", urlOf(name), "--key", adminKey, ...args], { env: { ...process.env, LLMGW_LOG_LEVEL: "silent" } });
  const startAgent = (name: string, order: string[]) => {
    const agent = spawnClusterAgent({
      name,
      dir: path.join(root, `agent-${name}`),
      servers: order.map(urlOf),
      joinTokenFile: path.join(servers.get("a")!.dir, "join.token"),
    });
    processes.push(agent);
    return agent;
  };
  const leaderOf = async (name: string) => (await call(name, "GET", "/api/v1/cluster")).body.leader?.name ?? null;

  before(async () => {
    const unreachable = await postgresProblem();
    if (unreachable !== null) throw new Error(`PostgreSQL is required for the many-servers test but is not reachable: ${unreachable}`);
    database = await createTestDatabase();
    const repos = await buildStandInRepos();
    hub = await startStandInHub({ repos: [repos.gguf] });
    modelFile = path.join(root, "tiny.gguf");
    await writeTinyLlamaGguf({ path: modelFile, seed: 21, endless: true });
    // a starts first and leads; b stands by.
    await startServer("a");
    adminKey = readFileSync(path.join(servers.get("a")!.dir, "admin.key"), "utf8").trim();
    await startServer("b");
    startAgent("n1", ["a", "b"]);
    startAgent("n2", ["b", "a"]);
    await eventually(
      "two ready nodes",
      async () => ((await call("a", "GET", "/api/v1/nodes")).body.data as NodeView[]).filter((n) => n.state === "ready").length === 2,
    );
  });

  after(async () => {
    balancer?.child.kill("SIGTERM");
    await stopAll(processes);
    await hub?.close();
    await database?.drop();
    rmSync(root, { recursive: true, force: true });
  });

  test("a server given another cluster secret is refused at start, naming the flag", async () => {
    const port = await findFreePort("127.0.0.1");
    const intruder = spawnLlmgw(
      ["server", "--data-dir", path.join(root, "server-c"), "--listen", `127.0.0.1:${port}`, "--database", database!.url, "--server-name", "c"],
      {
        LLMGW_CLUSTER_SECRET: "another-secret-that-is-long-enough-0123456789",
      },
    );
    const code = await intruder.exited;
    assert.notEqual(code, 0);
    assert.match(
      intruder.output(),
      /cluster secret \(from LLMGW_CLUSTER_SECRET\) differs from that of the running servers 'a' \(http:\/\/127\.0\.0\.1:\d+\), 'b' \(http:\/\/127\.0\.0\.1:\d+\) on the same database/,
    );
    assert.match(intruder.output(), /pass the same --cluster-secret-file \(or LLMGW_CLUSTER_SECRET\) to every one of them/);
  });

  test("both servers list the cluster: names, addresses, versions, who leads", async () => {
    for (const name of ["a", "b"]) {
      const view: ClusterView = (await call(name, "GET", "/api/v1/cluster")).body;
      assert.equal(view.self, name);
      assert.equal(view.leader!.name, "a");
      assert.deepEqual(
        view.servers.map((s) => [s.name, s.url, s.live, s.leader]),
        [
          ["a", urlOf("a"), true, true],
          ["b", urlOf("b"), true, false],
        ],
      );
    }
    const { stdout } = await ctl("b", ["cluster", "status"]);
    assert.match(stdout, /^leader: a \(term \d+/m);
    assert.match(stdout, new RegExp(`^a +${urlOf("a").replace(/[.]/g, "\\.")} +\\S+ +running +\\d+s ago +leader$`, "m"));
    assert.match(stdout, /^b \* +\S+ +\S+ +running +\d+s ago +standby$/m);
  });

  test("a model added through a answers through b, and b's admin API shows it ready", async () => {
    const created = await call("a", "POST", "/api/v1/models", {
      name: "tiny",
      source: { kind: "file", path: modelFile },
      scaling: { min: 2, max: 2 },
      profiles: [{ name: "cpu", engine: "llamacpp", ctx_size: 512, parallel: 2, hardware: { cpu: { min_memory_gb: 2 } } }],
    });
    assert.equal(created.status, 201, JSON.stringify(created.body));
    await eventually("two ready replicas seen through b", async () => (await call("b", "GET", "/api/v1/models/tiny")).body.health?.ready === 2, {
      timeoutMs: 120_000,
    });
    const key = (await call("a", "POST", "/api/v1/keys", { name: "app" })).body.key as string;
    const client = new OpenAI({ baseURL: `${urlOf("b")}/v1`, apiKey: key, maxRetries: 0 });
    const answer = await client.chat.completions.create({ model: "tiny", messages: [{ role: "user", content: "Hi" }], max_tokens: 3 });
    assert.equal(answer.usage?.completion_tokens, 3);
  });

  test("a key revoked on a is refused on b", async () => {
    const created = (await call("a", "POST", "/api/v1/keys", { name: "short-lived" })).body;
    // b has verified (and cached) the key before the revocation.
    assert.equal((await call("b", "GET", "/v1/models", undefined, created.key)).status, 200);
    assert.equal((await call("a", "DELETE", `/api/v1/keys/${created.id}`)).status, 200);
    // The change feed carries it (src/cluster/cluster.test.ts shows that path with the key
    // cache's clock stopped); the cache's TTL would refuse it later anyway.
    await eventually("b to refuse the revoked key", async () => (await call("b", "GET", "/v1/models", undefined, created.key)).status === 401);
  });

  test("a mirror file fetched on a reaches a node that asks b: b sends it to a with a signed grant", async () => {
    const fetched = await ctl("a", ["mirror", "fetch", modelFile, "--model", "mirrored"]);
    const serveLine = /llmgw ctl model add NAME --mirror (\S+)/.exec(fetched.stdout);
    assert.ok(serveLine, fetched.stdout);
    const [, version, ...parts] = serveLine[1]!.split("/");
    const file = parts.join("/");
    const listed = ((await call("b", "GET", "/api/v1/mirror?model=mirrored")).body.data as MirrorFileView[]).map((f) => [f.file, f.state, f.holders]);
    assert.deepEqual(listed, [[file, "complete", ["a"]]], "a holds the bytes, as b sees it");

    // n2 asks b first; b has no bytes of it and redirects to a.
    const n2 = JSON.parse(readFileSync(path.join(root, "agent-n2", "node.json"), "utf8")) as { credential: string };
    const filePath = `/mirror/mirrored/${version}/${file}`;
    const redirect = await fetch(urlOf("b") + filePath, { headers: { authorization: `Bearer ${n2.credential}` }, redirect: "manual" });
    assert.equal(redirect.status, 307);
    const location = redirect.headers.get("location")!;
    assert.ok(location.startsWith(`${urlOf("a")}${filePath}?grant=`), location);
    const followed = await fetch(location);
    assert.equal(followed.status, 200, "the grant alone lets the second hop through (the credential is not sent across origins)");
    assert.deepEqual(Buffer.from(await followed.arrayBuffer()), readFileSync(modelFile));
    assert.equal((await fetch(location.replace(/grant=\d+\./, "grant=9999999999."))).status, 403, "a grant is for its own path and expiry only");

    const created = await call("b", "POST", "/api/v1/models", {
      name: "mirrored",
      source: { kind: "mirror", model: "mirrored", version, file },
      scaling: { min: 2, max: 2 },
      profiles: [{ name: "cpu", engine: "llamacpp", ctx_size: 512, parallel: 1, hardware: { cpu: { min_memory_gb: 1 } } }],
    });
    assert.equal(created.status, 201, JSON.stringify(created.body));
    const health = await eventually(
      "mirrored ready on both nodes",
      async () => {
        const shown: ReturnType<typeof modelHealthView> = (await call("b", "GET", "/api/v1/models/mirrored/health")).body;
        return shown.ready === 2 ? shown : undefined;
      },
      { timeoutMs: 120_000 },
    );
    assert.deepEqual(health.replicas.map((r) => [r.nodes[0], r.weights_verified]).sort(), [
      ["n1", true],
      ["n2", true],
    ]);
    const cached = path.join(root, "agent-n2", "weights", "mirrored", version!, ...file.split("/"));
    assert.deepEqual(readFileSync(cached), readFileSync(modelFile), "n2's cache holds the bytes it got through b");
  });

  test("kill -9 of the leader: b leads, resumes the serve job, the model keeps answering for retrying clients, limits hold, node caches serve, and the agents move to b", async () => {
    // A serve job on a, held at its mirror step: the stand-in Hub's downloads hang.
    hub.setFault({ kind: "hang", match: "/cdn/" });
    const job = (await call("a", "POST", "/api/v1/jobs/serve", { repo: GGUF_REPO, name: "served", quant: "Q4_K_M" })).body;
    assert.ok(typeof job.id === "string", JSON.stringify(job));
    await eventually("the job at its mirror step on a", async () =>
      ((await call("a", "GET", `/api/v1/jobs/${job.id}`)).body.steps as JobStep[]).some((s) => s.name === "mirror" && s.state === "running"),
    );

    // Clients that retry as the SDK does (2 retries, on connection errors, 408, 409, 429 and
    // 5xx), through the load balancer in front of both servers.
    const key = (await call("a", "POST", "/api/v1/keys", { name: "steady" })).body.key as string;
    const client = new OpenAI({ baseURL: `${await startBalancer()}/v1`, apiKey: key, maxRetries: 2 });
    let stop = false;
    const failures: unknown[] = [];
    let answered = 0;
    const clients = Array.from({ length: 2 }, async () => {
      while (!stop) {
        try {
          await client.chat.completions.create({ model: "tiny", messages: [{ role: "user", content: "Hi" }], max_tokens: 2 });
          answered += 1;
        } catch (error) {
          failures.push(error);
        }
      }
    });
    await eventually("clients answered before the kill", () => answered >= 4);

    // A key with 6 requests a minute: 3 used through a before the kill, 3 left through b after
    // it. The servers' limits clock stands still (LIMITS_AT), so all of it is one window.
    const limitedKey = (await call("a", "POST", "/api/v1/keys", { name: "limited", rpm: 6 })).body.key as string;
    const limitedOn = (name: string) => new OpenAI({ baseURL: `${urlOf(name)}/v1`, apiKey: limitedKey, maxRetries: 0 });
    for (let i = 0; i < 3; i++) await limitedOn("a").chat.completions.create({ model: "tiny", messages: [{ role: "user", content: "Hi" }], max_tokens: 1 });

    servers.get("a")!.process.child.kill("SIGKILL");
    await servers.get("a")!.process.exited;
    // Any heartbeat stamped after this went to b: a is gone.
    const aGoneAt = new Date().toISOString();
    await eventually("b to lead", async () => (await leaderOf("b")) === "b");

    // The key's limit holds across the leader's loss: exactly its 3 requests left, through b.
    const limited = await Promise.all(
      Array.from({ length: 6 }, () =>
        limitedOn("b")
          .chat.completions.create({ model: "tiny", messages: [{ role: "user", content: "Hi" }], max_tokens: 1 })
          .then(
            () => "ok",
            (error: unknown) => error,
          ),
      ),
    );
    assert.equal(limited.filter((r) => r === "ok").length, 3, limited.map(String).join("; "));
    assert.ok(limited.filter((r) => r !== "ok").every((error) => error instanceof OpenAI.RateLimitError && error.code === "rate_limit_exceeded"));
    // Counted in the one window of the clock this test gave both servers, 3 requests through each.
    const rate = (await call("b", "GET", "/api/v1/keys/limited")).body.usage.rate;
    assert.deepEqual([rate.window_start, rate.requests], [new Date(Math.floor(Date.parse(LIMITS_AT) / 60_000) * 60_000).toISOString(), 6]);

    // The node caches keep working while the only server holding 'mirrored' is down: b
    // places a third replica from what a read of its weights, and a node starts it from its cache.
    assert.equal((await call("b", "PATCH", "/api/v1/models/mirrored", { scaling: { min: 3, max: 3 } })).status, 200);
    await eventually("three ready replicas of mirrored", async () => (await call("b", "GET", "/api/v1/models/mirrored/health")).body.ready === 3, {
      timeoutMs: 120_000,
    });

    // The job a was running resumes on b once the Hub answers again.
    hub.setFault(null);
    const finished = await eventually(
      "the serve job to finish on b",
      async () => {
        const view = (await call("b", "GET", `/api/v1/jobs/${job.id}`)).body;
        return view.state === "done" || view.state === "failed" ? view : undefined;
      },
      { timeoutMs: 240_000 },
    );
    assert.equal(finished.state, "done", JSON.stringify(finished));
    assert.ok(finished.resumed >= 1, "the job was resumed by the new leader");

    // The agents reach b now and their nodes were never lost.
    await eventually(
      "both nodes ready through b",
      async () => ((await call("b", "GET", "/api/v1/nodes")).body.data as NodeView[]).filter((n) => n.state === "ready").length === 2,
    );
    const lost = (await call("b", "GET", "/api/v1/events?kind=node_lost")).body.data as StoredEvent[];
    assert.deepEqual(lost, [], "no node was taken for lost while its agent switched servers");
    await eventually("the agents' heartbeats to reach b", async () =>
      ((await call("b", "GET", "/api/v1/nodes")).body.data as NodeView[]).every((n) => n.last_heartbeat > aGoneAt),
    );

    const before = answered;
    await eventually("clients answered after the takeover", () => answered >= before + 4).catch(async (error: Error) => {
      const health = (await call("b", "GET", "/api/v1/models/tiny/health")).body;
      throw new Error(
        `${error.message}; answered ${answered}, failures ${failures.map(String).join("; ")}; tiny on b: ${JSON.stringify(health)}\nb's log:\n${servers.get("b")!.process.output().slice(-6000)}`,
      );
    });
    stop = true;
    await Promise.all(clients);
    assert.deepEqual(failures.map(String), [], "no request failed for a client that retries");
    const cluster: ClusterView = (await call("b", "GET", "/api/v1/cluster")).body;
    assert.deepEqual(
      cluster.servers.map((s) => [s.name, s.live, s.leader]),
      [
        ["a", false, false],
        ["b", true, true],
      ],
    );
  });
});
