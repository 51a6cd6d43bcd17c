// A node's address cannot be moved by its own credential (issue 25): `llmgw server` and
// `llmgw agent` processes on loopback, the bundled llama.cpp on a generated GGUF. A node
// joins on 127.0.0.1 and serves a replica; then a heartbeat forged with that node's real
// credential (read from its node.json) says the node is at 127.0.0.2 with the replica's
// engine listening there, where a plain TCP listener counts every byte it receives. The
// forged heartbeat is refused (409 node_address_mismatch), clients' requests keep going to
// the real engine, and not one byte (no prompt, no engine key) reaches 127.0.0.2.
//
// Then an agent restarted with another --advertise is refused too and says so in its log,
// until an admin runs `llmgw ctl node update NAME --address HOST`.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import OpenAI from "openai";
import { findFreePort } from "../src/agent/free-port.ts";
import { writeTinyLlamaGguf } from "../src/gguf/tiny-model.ts";
import { eventually } from "./support/eventually.ts";
import { spawnLlmgw, stopAll, type LlmgwProcess } from "./support/cluster-processes.ts";
import { adminCaller } from "./support/admin-call.ts";

const BIN = fileURLToPath(new URL("../bin/llmgw.js", import.meta.url));
const run = promisify(execFile);
const GiB = 1024 ** 3;

/** A TCP listener that accepts and counts what arrives, answering nothing: where a forged endpoint points. */
async function countingListener(host: string): Promise<{ port: number; bytes: () => number; connections: () => number; close: () => Promise<void> }> {
  let bytes = 0;
  let connections = 0;
  const sockets = new Set<net.Socket>();
  const server = net.createServer((socket) => {
    connections += 1;
    sockets.add(socket);
    socket.on("data", (chunk: Buffer) => (bytes += chunk.length));
    socket.on("close", () => sockets.delete(socket));
    socket.on("error", () => undefined);
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(0, host, () => resolve());
  });
  return {
    port: (server.address() as net.AddressInfo).port,
    bytes: () => bytes,
    connections: () => connections,
    close: () =>
      new Promise<void>((resolve) => {
        for (const socket of sockets) socket.destroy();
        server.close(() => resolve());
      }),
  };
}

describe("a node's address is fixed at join", { timeout: 600_000 }, () => {
  const root = mkdtempSync(path.join(tmpdir(), "llmgw-node-address-"));
  const serverDir = path.join(root, "server");
  const running: LlmgwProcess[] = [];
  let url = "";
  let adminKey = "";
  let joinToken = "";
  let forged: Awaited<ReturnType<typeof countingListener>>;

  const admin = adminCaller(() => ({ url, key: adminKey }));
  const startAgent = (name: string, extra: string[] = []) => {
    const dir = path.join(root, `agent-${name}`);
    mkdirSync(dir, { recursive: true });
    const inventoryFile = path.join(dir, "inventory.json");
    writeFileSync(inventoryFile, JSON.stringify({ cores: 4, memory: "8g", engines: [{ engine: "llamacpp", version: "3.21.1" }] }));
    const agent = spawnLlmgw(["agent", "--server", url, "--join-token", joinToken, "--name", name, "--data-dir", dir, "--inventory", inventoryFile, ...extra]);
    running.push(agent);
    return { agent, dir };
  };
  const node = async (name: string) => (await admin("GET", `/api/v1/nodes/${name}`)).body as { state: string; address: string };

  before(async () => {
    // 127.0.0.2 is loopback too on Linux: a listener there stands for another host.
    forged = await countingListener("127.0.0.2");
    const modelFile = path.join(root, "tiny.gguf");
    await writeTinyLlamaGguf({ path: modelFile, seed: 17 });
    const port = await findFreePort("127.0.0.1");
    url = `http://127.0.0.1:${port}`;
    const server = spawnLlmgw(["server", "--data-dir", serverDir, "--listen", `127.0.0.1:${port}`, "--node-timeout", "30s", "--heartbeat-interval", "2s"]);
    running.push(server);
    await eventually("the server to listen", () => server.output().includes("listening on"));
    adminKey = readFileSync(path.join(serverDir, "admin.key"), "utf8").trim();
    joinToken = readFileSync(path.join(serverDir, "join.token"), "utf8").trim();
    startAgent("n1");
    await eventually("n1 ready", async () => (await node("n1")).state === "ready");
    const created = await admin("POST", "/api/v1/models", {
      name: "tiny",
      source: { kind: "file", path: modelFile },
      profiles: [{ name: "cpu", engine: "llamacpp", ctx_size: 512, parallel: 1 }],
    });
    assert.equal(created.status, 201, JSON.stringify(created.body));
    await eventually("tiny ready", async () => (await admin("GET", "/api/v1/models/tiny/health")).body.ready === 1);
  });

  after(async () => {
    await stopAll(running);
    await forged.close();
    rmSync(root, { recursive: true, force: true });
  });

  test("a heartbeat forged with the node's credential cannot send clients or the engine key to another host", async () => {
    const credential = (JSON.parse(readFileSync(path.join(root, "agent-n1", "node.json"), "utf8")) as { credential: string }).credential;
    const health = (await admin("GET", "/api/v1/models/tiny/health")).body as { replicas: Array<{ id: string }> };
    const replicaId = health.replicas[0]!.id;
    const forge = async () => {
      const now = Date.now();
      const response = await fetch(`${url}/agent/v1/heartbeat`, {
        method: "POST",
        headers: { authorization: `Bearer ${credential}`, "content-type": "application/json" },
        body: JSON.stringify({
          name: "n1",
          address: "127.0.0.2",
          inventory: { cores: 4, memoryBytes: 8 * GiB, gpus: [], engines: [{ engine: "llamacpp", version: "3.21.1" }] },
          labels: {},
          replicas: [
            {
              id: replicaId,
              state: "ready",
              endpoint: { host: "127.0.0.2", port: forged.port },
              attempt: 1,
              failures: 0,
              lastError: null,
              lastErrorCode: null,
              startedAt: now,
              readyAt: now,
              weightsVerified: true,
            },
          ],
        }),
      });
      return { status: response.status, body: (await response.json()) as { error?: { code: string; message: string } } };
    };

    const client = new OpenAI({ apiKey: adminKey, baseURL: `${url}/v1`, maxRetries: 0, timeout: 60_000 });
    for (let i = 0; i < 4; i += 1) {
      // Forged again before every request, so that the real agent's next heartbeat could not undo it in between.
      const refused = await forge();
      assert.equal(refused.status, 409, JSON.stringify(refused.body));
      assert.equal(refused.body.error?.code, "node_address_mismatch");
      assert.match(refused.body.error!.message, /joined with address 127\.0\.0\.1/);
      assert.match(refused.body.error!.message, /as 127\.0\.0\.2/);
      assert.match(refused.body.error!.message, /llmgw ctl node update n1 --address 127\.0\.0\.2/);
      const answer = await client.chat.completions.create({ model: "tiny", messages: [{ role: "user", content: `Hello ${i}` }], max_tokens: 2 });
      assert.equal(answer.usage?.completion_tokens, 2, "the real engine answered");
    }
    assert.equal(forged.connections(), 0, "no connection reached 127.0.0.2");
    assert.equal(forged.bytes(), 0, "no byte reached 127.0.0.2");
    assert.equal((await node("n1")).address, "127.0.0.1");

    const events = await eventually("a node_address_refused event", async () => {
      const found = (
        (await admin("GET", "/api/v1/events?kind=node_address_refused")).body.data as Array<{ subject: string; data: Record<string, unknown> }>
      ).filter((e) => e.subject === "node:n1");
      return found.length > 0 ? found : undefined;
    });
    // Four refusals, one event (at most one per node per 10 minutes): the first, with none suppressed before it.
    assert.equal(events.length, 1);
    assert.deepEqual(events[0]!.data, { node: "n1", approved: "127.0.0.1", reported: "127.0.0.2", where: "the heartbeat's address", suppressed: 0 });
  });

  test("an agent restarted on another --advertise is refused and says so, until an admin updates the node's address", async () => {
    const first = startAgent("n2");
    // Joined, and its credential kept in node.json (the agent says so once it runs).
    await eventually("n2 joined and running", () => first.agent.output().includes("engines reachable at 127.0.0.1"));
    first.agent.child.kill("SIGTERM");
    await first.agent.exited;
    const moved = startAgent("n2", ["--advertise", "127.0.0.3"]);
    await eventually("the agent to log the refusal", () => {
      const output = moved.agent.output();
      if (output.includes("the server refuses this node's heartbeats") && output.includes("node_address_mismatch")) return true;
      throw new Error(`not yet; the agent said:\n${output.slice(-3000)}`);
    });
    assert.match(moved.agent.output(), /llmgw ctl node update n2 --address 127\.0\.0\.3/);
    assert.equal((await node("n2")).address, "127.0.0.1");

    const updated = await run(process.execPath, [BIN, "ctl", "--server", url, "--key", adminKey, "node", "update", "n2", "--address", "127.0.0.3"], {
      env: { ...process.env, LLMGW_LOG_LEVEL: "silent" },
    });
    assert.match(updated.stdout, /Node 'n2' now has address 127\.0\.0\.3 \(was 127\.0\.0\.1\)/);
    await eventually("the agent accepted again", () => moved.agent.output().includes("the server accepts this node's address again"));
    assert.equal((await node("n2")).address, "127.0.0.3");
  });
});
