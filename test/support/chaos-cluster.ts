// A small llmgw cluster to break on purpose, for the chaos tests (test/chaos.e2e.test.ts)
// and the chaos benchmark (bench/chaos): two `llmgw server` processes on one PostgreSQL
// database made for the run, each reaching it through a fault proxy of its own
// (fault-proxy.ts), the example HAProxy config in front of both, two agents that know both
// servers, and a client loop that sends a chat request through the balancer every 100 ms
// with the official OpenAI SDK (2 retries, as it does by default) and records every
// outcome. Servers keep their port across restarts, so the balancer and the agents find a
// restarted server where it was.
import { mkdtempSync, readFileSync, readdirSync, readlinkSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import OpenAI from "openai";
import { findFreePort } from "../../src/agent/free-port.ts";
import { writeTinyLlamaGguf } from "../../src/gguf/tiny-model.ts";
import { startBalancer, type Balancer } from "./balancer.ts";
import { createTestDatabase, listeningUrl, spawnClusterAgent, spawnLlmgw, stopAll, type LlmgwProcess } from "./cluster-processes.ts";
import { eventually } from "./eventually.ts";
import { startFaultProxy, type FaultProxy } from "./fault-proxy.ts";
import { startStandInHub, type StandInHub } from "./stand-in-hub.ts";
import { buildStandInRepos, type StandInRepos } from "./stand-in-repos.ts";
import { postgresProblem } from "./stores.ts";

const SECRET = "a-cluster-secret-for-the-chaos-tests-0123456789abcdef";
export const SERVER_NAMES = ["a", "b"] as const;
export type ServerName = (typeof SERVER_NAMES)[number];

interface ServerSlot {
  port: number;
  dir: string;
  process?: LlmgwProcess;
  /** Every process this slot ran (restarts included), for the "no process exited" check. */
  history: LlmgwProcess[];
}

export interface RequestOutcome {
  at: number;
  ms: number;
  error?: string;
}

export interface LoopReport {
  sent: number;
  failed: RequestOutcome[];
  longestMs: number;
}

export interface ClientLoop {
  /** Requests answered or failed so far. */
  readonly outcomes: readonly RequestOutcome[];
  stop(): Promise<LoopReport>;
}

export class ChaosCluster {
  readonly root = mkdtempSync(path.join(tmpdir(), "lx"));
  readonly servers = new Map<ServerName, ServerSlot>();
  readonly dbProxies = new Map<ServerName, FaultProxy>();
  readonly agents = new Map<string, { dir: string; process: LlmgwProcess; order: ServerName[] }>();
  /** Processes this cluster killed on purpose (their exits are not failures). */
  private readonly killed = new Set<LlmgwProcess>();
  private readonly processes: LlmgwProcess[] = [];
  database?: Awaited<ReturnType<typeof createTestDatabase>>;
  hub?: StandInHub;
  repos?: StandInRepos;
  balancer?: Balancer;
  adminKey = "";
  modelFile = "";

  /** Database, hub, both servers (a leads), two agents, the balancer. */
  async start(options: { serverArgs?: string[] } = {}): Promise<void> {
    const unreachable = await postgresProblem();
    if (unreachable !== null) throw new Error(`PostgreSQL is required for the chaos tests but is not reachable: ${unreachable}`);
    this.database = await createTestDatabase();
    const postgres = new URL(this.database.url);
    for (const name of SERVER_NAMES) this.dbProxies.set(name, await startFaultProxy({ host: postgres.hostname, port: Number(postgres.port || 5432) }));
    this.repos = await buildStandInRepos();
    this.hub = await startStandInHub({ repos: [this.repos.gguf] });
    this.modelFile = path.join(this.root, "tiny.gguf");
    await writeTinyLlamaGguf({ path: this.modelFile, seed: 24, endless: true });
    this.serverArgs = options.serverArgs ?? [];
    await this.startServer("a");
    this.adminKey = readFileSync(path.join(this.servers.get("a")!.dir, "admin.key"), "utf8").trim();
    await this.startServer("b");
    this.startAgent("n1", ["a", "b"]);
    this.startAgent("n2", ["b", "a"]);
    await eventually("two ready nodes", async () => (await this.readyNodes()).length === 2, { timeoutMs: 60_000 });
    this.balancer = await startBalancer(this.root, { a: this.urlOf("a"), b: this.urlOf("b") });
  }

  private serverArgs: string[] = [];

  async startServer(name: ServerName): Promise<string> {
    let slot = this.servers.get(name);
    if (slot === undefined) {
      slot = { port: await findFreePort("127.0.0.1"), dir: path.join(this.root, `server-${name}`), history: [] };
      this.servers.set(name, slot);
    }
    const child = spawnLlmgw(
      [
        "server",
        "--data-dir",
        slot.dir,
        "--listen",
        `127.0.0.1:${slot.port}`,
        "--database",
        this.dbProxies.get(name)!.via(this.database!.url),
        "--server-name",
        name,
        "--registry",
        this.hub!.url,
        "--node-timeout",
        "6s",
        "--heartbeat-interval",
        "1s",
        ...this.serverArgs,
      ],
      { LLMGW_CLUSTER_SECRET: SECRET },
    );
    slot.process = child;
    slot.history.push(child);
    this.processes.push(child);
    return listeningUrl(child);
  }

  urlOf(name: ServerName): string {
    return `http://127.0.0.1:${this.servers.get(name)!.port}`;
  }

  async killServer(name: ServerName): Promise<void> {
    const slot = this.servers.get(name)!;
    if (slot.process === undefined) return;
    this.killed.add(slot.process);
    slot.process.child.kill("SIGKILL");
    await slot.process.exited;
    slot.process = undefined;
  }

  startAgent(name: string, order: ServerName[]): LlmgwProcess {
    const dir = path.join(this.root, `agent-${name}`);
    const agent = spawnClusterAgent({
      name,
      dir,
      servers: order.map((server) => this.urlOf(server)),
      joinTokenFile: path.join(this.servers.get("a")!.dir, "join.token"),
    });
    this.processes.push(agent);
    this.agents.set(name, { dir, process: agent, order });
    return agent;
  }

  /**
   * A node lost as a machine is lost: the agent and every engine it started die at once
   * (SIGKILL), without a word to the servers.
   */
  async killNode(name: string): Promise<void> {
    const agent = this.agents.get(name)!;
    this.killed.add(agent.process);
    for (const pid of processesMentioning(agent.dir)) {
      try {
        process.kill(pid, "SIGKILL");
      } catch {
        // Gone already.
      }
    }
    agent.process.child.kill("SIGKILL");
    await agent.process.exited;
  }

  restartAgent(name: string): LlmgwProcess {
    const agent = this.agents.get(name)!;
    return this.startAgent(name, agent.order);
  }

  // biome-ignore lint/suspicious/noExplicitAny: the admin API's JSON, of many shapes, read field by field by the tests
  async call(name: ServerName, method: string, pathname: string, body?: unknown, key = this.adminKey): Promise<{ status: number; body: any }> {
    const response = await fetch(this.urlOf(name) + pathname, {
      method,
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      ...(body === undefined ? {} : { body: JSON.stringify(body) }),
      signal: AbortSignal.timeout(30_000),
    });
    const text = await response.text();
    return { status: response.status, body: text === "" ? null : JSON.parse(text) };
  }

  /** Some running server's answer (the first that answers), for views during faults. */
  // biome-ignore lint/suspicious/noExplicitAny: as call()
  async callAny(method: string, pathname: string, body?: unknown): Promise<{ status: number; body: any }> {
    let lastError: unknown;
    for (const name of SERVER_NAMES) {
      if (this.servers.get(name)?.process === undefined) continue;
      try {
        return await this.call(name, method, pathname, body);
      } catch (error) {
        lastError = error;
      }
    }
    throw lastError ?? new Error("no server is running");
  }

  async readyNodes(): Promise<string[]> {
    const nodes = (await this.callAny("GET", "/api/v1/nodes")).body.data as Array<{ name: string; state: string }>;
    return nodes.filter((node) => node.state === "ready").map((node) => node.name);
  }

  async readyz(name: ServerName): Promise<number> {
    try {
      return (await fetch(`${this.urlOf(name)}/readyz`, { signal: AbortSignal.timeout(10_000) })).status;
    } catch {
      return 0;
    }
  }

  /** A chat model from the tiny GGUF file with `replicas` replicas, ready. */
  async addModel(name: string, replicas: number): Promise<void> {
    const created = await this.call("a", "POST", "/api/v1/models", {
      name,
      source: { kind: "file", path: this.modelFile },
      scaling: { min: replicas, max: replicas },
      profiles: [{ name: "cpu", engine: "llamacpp", ctx_size: 512, parallel: 2, hardware: { cpu: { min_memory_gb: 1 } } }],
    });
    if (created.status !== 201) throw new Error(`adding ${name}: ${created.status} ${JSON.stringify(created.body)}`);
    await this.waitReady(name, replicas);
  }

  async waitReady(model: string, replicas: number, timeoutMs = 120_000): Promise<void> {
    await eventually(
      `${replicas} ready replicas of ${model}`,
      async () => (await this.callAny("GET", `/api/v1/models/${model}/health`)).body.ready >= replicas,
      {
        timeoutMs,
      },
    );
  }

  /** Which node each ready replica of a model runs on. */
  async replicaNodes(model: string): Promise<string[]> {
    const answer = await this.callAny("GET", `/api/v1/models/${model}/health`);
    if (answer.status !== 200) throw new Error(`the health of ${model}: ${answer.status} ${JSON.stringify(answer.body)}`);
    const health = answer.body as { replicas: Array<{ state: string; nodes: string[] }> };
    return health.replicas
      .filter((replica) => replica.state === "ready")
      .map((replica) => replica.nodes[0]!)
      .sort();
  }

  async createKey(name: string): Promise<string> {
    return (await this.call("a", "POST", "/api/v1/keys", { name })).body.key as string;
  }

  /** A request every `everyMs` through the balancer until stopped; each outcome recorded. */
  clientLoop(key: string, model: string, everyMs = 100): ClientLoop {
    const client = new OpenAI({ baseURL: `${this.balancer!.url}/v1`, apiKey: key, maxRetries: 2, timeout: 60_000 });
    const outcomes: RequestOutcome[] = [];
    let stopped = false;
    const running = (async () => {
      while (!stopped) {
        const at = Date.now();
        try {
          await client.chat.completions.create({ model, messages: [{ role: "user", content: "Hi" }], max_tokens: 2 });
          outcomes.push({ at, ms: Date.now() - at });
        } catch (error) {
          outcomes.push({ at, ms: Date.now() - at, error: String(error) });
        }
        const wait = at + everyMs - Date.now();
        if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait));
      }
    })();
    return {
      outcomes,
      async stop() {
        stopped = true;
        await running;
        return { sent: outcomes.length, failed: outcomes.filter((o) => o.error !== undefined), longestMs: Math.max(0, ...outcomes.map((o) => o.ms)) };
      },
    };
  }

  /** Processes that exited although nobody killed them on purpose, with their last output. */
  unexpectedExits(): string[] {
    return this.processes
      .filter((running) => !this.killed.has(running) && (running.child.exitCode !== null || running.child.signalCode !== null))
      .map(
        (running) =>
          `${running.child.spawnargs.slice(2, 3).join(" ")} exited (${running.child.exitCode ?? running.child.signalCode}):\n${running.output().slice(-3000)}`,
      );
  }

  /** The output of a server's current process (for failure messages). */
  logOf(name: ServerName): string {
    return this.servers.get(name)?.process?.output().slice(-6000) ?? "(not running)";
  }

  async stop(): Promise<void> {
    this.balancer?.stop();
    await stopAll(this.processes.filter((running) => running.child.exitCode === null && running.child.signalCode === null));
    for (const proxy of this.dbProxies.values()) await proxy.close();
    await this.hub?.close();
    await this.database?.drop();
    rmSync(this.root, { recursive: true, force: true });
  }
}

/**
 * Pids of processes that run in `dir` or name it on their command line: an agent and the
 * engines it started (they run in their run folders below the agent's data dir).
 */
function processesMentioning(dir: string): number[] {
  const pids: number[] = [];
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry) || Number(entry) === process.pid) continue;
    try {
      if (readFileSync(`/proc/${entry}/cmdline`, "utf8").includes(dir) || readlinkSync(`/proc/${entry}/cwd`).startsWith(dir)) pids.push(Number(entry));
    } catch {
      // Exited while we looked.
    }
  }
  return pids;
}
