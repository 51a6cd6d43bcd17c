// An agent killed while fetching weights (issue 24, "Bad input and faults"): `llmgw server`
// on SQLite and one `llmgw agent` (n1) whose link to the server runs through the TCP fault
// proxy. A model mirrored on the server (a generated GGUF of about 11 MB) is placed on n1;
// the proxy is made a narrow link, so n1's fetch of the weights into its cache takes a
// while, and n1 is killed with SIGKILL once its partial file is seen growing. Started again
// with the same data dir, n1 resumes the partial file (it asks for the rest with a Range,
// so fewer bytes than the file's size come through the proxy), the cached file matches the
// mirrored one byte for byte, and the replica becomes ready. The kill is no engine failure:
// the replica never shows a failure, and the model is never parked.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { findFreePort } from "../src/agent/free-port.ts";
import { writeTinyLlamaGguf } from "../src/gguf/tiny-model.ts";
import { PARTIAL_SUFFIX } from "../src/mirror/mirror-paths.ts";
import { listeningUrl, spawnLlmgw, stopAll, type LlmgwProcess } from "./support/cluster-processes.ts";
import { eventually } from "./support/eventually.ts";
import { startFaultProxy, type FaultProxy } from "./support/fault-proxy.ts";

const BIN = fileURLToPath(new URL("../bin/llmgw.js", import.meta.url));
const run = promisify(execFile);
const MiB = 1024 * 1024;

interface ReplicaView {
  id: string;
  state: string;
  nodes: string[];
  failures: number;
  last_error: string | null;
  weights_verified: boolean;
}

describe("an agent killed with SIGKILL while fetching a replica's weights", { timeout: 120_000 }, () => {
  // Short: engines' run folders go below the agent's data dir.
  const root = mkdtempSync(path.join(tmpdir(), "lk"));
  const serverDir = path.join(root, "server");
  const agentDir = path.join(root, "agent-n1");
  const processes: LlmgwProcess[] = [];
  let server: LlmgwProcess;
  let agent: LlmgwProcess;
  let proxy: FaultProxy;
  let url = "";
  let adminKey = "";
  let modelFile = "";
  let modelBytes = 0;

  const call = async (method: string, pathname: string, body?: unknown) => {
    const response = await fetch(url + pathname, {
      method,
      headers: { authorization: `Bearer ${adminKey}`, "content-type": "application/json" },
      ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    });
    const text = await response.text();
    return { status: response.status, body: text === "" ? null : JSON.parse(text) };
  };
  const logs = () => `--- server:\n${server.output().slice(-4000)}\n--- n1:\n${agent?.output().slice(-6000)}`;
  // n1 knows the server only as the proxy's address: all its traffic (join, heartbeats, weights) crosses the proxy.
  const startAgent = () => {
    const joinToken = readFileSync(path.join(serverDir, "join.token"), "utf8").trim();
    const started = spawnLlmgw([
      ...["agent", "--server", `http://127.0.0.1:${proxy.port}`, "--join-token", joinToken, "--name", "n1"],
      ...["--data-dir", agentDir, "--inventory", path.join(agentDir, "inventory.json")],
    ]);
    processes.push(started);
    return started;
  };

  before(async () => {
    modelFile = path.join(root, "wide.gguf");
    // Wider and deeper than the demo model (11 MB instead of 200 kB), so its fetch over a narrow link takes seconds.
    modelBytes = (await writeTinyLlamaGguf({ path: modelFile, seed: 24, embeddingLength: 256, layers: 4 })).bytes;
    const port = await findFreePort("127.0.0.1");
    // A node timeout well beyond the restart, so n1 is not taken for lost while it is down.
    server = spawnLlmgw(["server", "--data-dir", serverDir, "--listen", `127.0.0.1:${port}`, "--node-timeout", "60s", "--heartbeat-interval", "1s"]);
    processes.push(server);
    url = await listeningUrl(server);
    adminKey = readFileSync(path.join(serverDir, "admin.key"), "utf8").trim();
    proxy = await startFaultProxy({ host: "127.0.0.1", port });
    mkdirSync(agentDir, { recursive: true });
    writeFileSync(path.join(agentDir, "inventory.json"), JSON.stringify({ cores: 4, memory: "8g", engines: [{ engine: "llamacpp", version: "3.21.1" }] }));
    agent = startAgent();
    await eventually("n1 ready", async () => ((await call("GET", "/api/v1/nodes")).body.data as Array<{ state: string }>).some((n) => n.state === "ready"));
  });

  after(async () => {
    await stopAll(processes);
    await proxy?.close();
    rmSync(root, { recursive: true, force: true });
  });

  test("started again, it resumes the partial file with a Range, the replica becomes ready, and nothing counts as a failure or parks", async () => {
    const fetched = await run(process.execPath, [BIN, "ctl", "--server", url, "--key", adminKey, "mirror", "fetch", modelFile, "--model", "wide"], {
      env: { ...process.env, LLMGW_LOG_LEVEL: "silent" },
    });
    const mirrored = /llmgw ctl model add NAME --mirror (\S+)/.exec(fetched.stdout);
    assert.ok(mirrored, fetched.stdout);
    const [, version, ...parts] = mirrored[1]!.split("/");
    const file = parts.join("/");
    const cached = path.join(agentDir, "weights", "wide", version!, ...file.split("/"));
    const partial = cached + PARTIAL_SUFFIX;
    const sizeOf = (where: string) => {
      try {
        return statSync(where).size;
      } catch {
        return null;
      }
    };

    // A narrow link: at most one chunk (64 kB at most on loopback) per 40 ms each way, so the 11 MB take seconds.
    await proxy.set("slow", { delayMs: 40, paced: true });
    const created = await call("POST", "/api/v1/models", {
      name: "wide",
      source: { kind: "mirror", model: "wide", version, file },
      scaling: { min: 1, max: 1 },
      profiles: [{ name: "cpu", engine: "llamacpp", ctx_size: 512, parallel: 1 }],
    });
    assert.equal(created.status, 201, JSON.stringify(created.body));

    // Everything the replica and the model show, from the placement on: a failure or a park at any moment is seen.
    const seen = { failures: 0, states: new Set<string>(), errors: new Set<string>(), parked: false };
    const look = async () => {
      const health = (await call("GET", "/api/v1/models/wide/health")).body;
      if (health.parked !== null) seen.parked = true;
      for (const replica of (health.replicas ?? []) as ReplicaView[]) {
        seen.failures = Math.max(seen.failures, replica.failures);
        seen.states.add(replica.state);
        if (replica.last_error !== null) seen.errors.add(replica.last_error);
      }
      return health;
    };

    // Mid-way: the partial file has grown past 1 MiB and is not complete.
    const before = await eventually(
      "n1's partial file to grow mid-way",
      async () => {
        await look();
        const size = sizeOf(partial);
        if (sizeOf(cached) !== null) throw new Error(`the fetch completed before the kill (${modelBytes} bytes): the link is not narrow enough`);
        return size !== null && size >= MiB ? size : undefined;
      },
      { timeoutMs: 60_000, intervalMs: 10 },
    ).catch((error: Error) => {
      throw new Error(`${error.message}\n${logs()}`);
    });
    agent.child.kill("SIGKILL");
    await agent.exited;
    const keptBytes = sizeOf(partial);
    assert.ok(keptBytes !== null && keptBytes >= before && keptBytes < modelBytes, `the partial file outlives the kill (${keptBytes} of ${modelBytes} bytes)`);
    assert.equal(sizeOf(cached), null, "nothing under the final name yet");

    // The link is whole again; what n1 fetches from now on is counted at the proxy.
    await proxy.set("forward");
    const relayedBefore = proxy.bytesToClients;
    agent = startAgent();
    const ready = await eventually(
      "the replica ready on n1 again",
      async () => {
        const health = await look();
        return health.state === "ready" ? health : undefined;
      },
      { timeoutMs: 60_000 },
    ).catch((error: Error) => {
      throw new Error(`${error.message}; replica errors seen: ${[...seen.errors].join(" | ")}\n${logs()}`);
    });

    // Resumed, not fetched from byte 0: n1 said where it resumed, and less than the whole file came through.
    const resumed = agent
      .output()
      .split("\n")
      .filter((line) => line.startsWith("{"))
      .map((line) => JSON.parse(line) as { msg?: string; resumeFrom?: number; file?: string })
      .filter((line) => line.msg === "mirror fetch resuming" || line.msg === "mirror fetch starting");
    assert.deepEqual(
      resumed.map((line) => [line.msg, line.resumeFrom]),
      [["mirror fetch resuming", keptBytes]],
      logs(),
    );
    const relayed = proxy.bytesToClients - relayedBefore;
    assert.ok(relayed < modelBytes, `n1 fetched ${relayed} bytes after its restart, less than the file's ${modelBytes}: only the rest came`);
    assert.ok(relayed >= modelBytes - keptBytes, `n1 fetched the ${modelBytes - keptBytes} bytes it lacked (${relayed} came)`);
    assert.deepEqual(readFileSync(cached), readFileSync(modelFile), "the resumed file is the mirrored one, byte for byte");
    assert.equal(sizeOf(partial), null, "the partial file got its final name");

    // The kill is no engine failure: the replica never counted one, and the model was never parked.
    assert.deepEqual(
      (ready.replicas as ReplicaView[]).map((r) => [r.nodes[0], r.state, r.failures, r.weights_verified]),
      [["n1", "ready", 0, true]],
    );
    assert.equal(seen.failures, 0, `a failure was counted: ${[...seen.errors].join(" | ")}`);
    assert.ok(!seen.states.has("parked") && !seen.states.has("failed"), `states seen: ${[...seen.states].join(", ")}`);
    assert.equal(seen.parked, false, "the model was parked at some point");
    assert.deepEqual((await call("GET", "/api/v1/events?kind=model_parked")).body.data, []);
  });
});
