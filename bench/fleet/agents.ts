// Benchmark of the fleet's agent protocol at scale (issue "Fleet", item 9): 500 simulated
// agents in this one process against one real `llmgw server` child, on SQLite and on
// PostgreSQL. Each agent is the real client (agent/http-assignments.ts, its own undici
// Agent, so its own connections, as separate machines would have): it joins once with the
// join token, heartbeats a small CPU-only inventory and no replicas at the interval the
// server answers with (5 s), and keeps one assignments long poll open (wait_ms 25000),
// issued again as soon as it returns. The starts are spread over the first heartbeat
// interval, as a fleet's agents would be after a server restart, not all in one tick.
//
// Measured, per store, over a window after every agent joined and a warm-up:
//   - the server's CPU share: utime + stime from /proc/<pid>/stat at the window's ends, as
//     a percentage of one core. Goal: under 20% at 500 agents.
//   - heartbeat round trips as the agents see them (p50, p99, max). On a small machine they
//     include this process's own event-loop delay, printed next to them.
//   - time to detect a lost node, after the window: one agent stops right after a heartbeat
//     was answered (its heartbeats and its poll end; that answer is T); its node is then
//     read every 100 ms until it says `lost`. Goal: T → lost within the node timeout + 1 s
//     (the server checks for lost nodes on a 1 s tick). The server's own node_lost event
//     time is shown too; it is free of the 100 ms polling.
// Agents that the server marked lost during the run, other than the one stopped on purpose,
// are counted: a server too slow to take its heartbeats would show up there.
//
// A missed goal prints MISS and still exits 0; an error (a failed join, a server that does
// not start, no PostgreSQL) exits 1, since such a run measured nothing valid.
//
// Options (flags win over environment):
//   --agents N          BENCH_AGENTS          simulated agents (default 500)
//   --window S          BENCH_WINDOW          measured seconds (default 30)
//   --warmup S          BENCH_WARMUP          seconds after the last join before the window (default 10)
//   --heartbeat S       BENCH_HEARTBEAT       the server's --heartbeat-interval (default 5)
//   --node-timeout S    BENCH_NODE_TIMEOUT    the server's --node-timeout (default 15)
//   --stores L          BENCH_STORES          sqlite,postgres (default both)
//   --postgres URL      BENCH_POSTGRES        a database to create the benchmark's own database from
//                                             (default postgres://postgres@127.0.0.1:5432/postgres)
//   --cpu-prof yes      BENCH_CPU_PROF        run the server with --cpu-prof; profiles go to
//                                             bench/results/prof-<time>/<store>/
//   --out DIR           BENCH_OUT             where the JSON goes (default bench/results)
//
//   npm run bench:fleet-agents -- --agents 500 --stores sqlite
import { randomBytes } from "node:crypto";
import { mkdirSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { monitorEventLoopDelay, performance } from "node:perf_hooks";
import { setTimeout as sleep } from "node:timers/promises";
import pg from "pg";
import { HttpAssignments } from "../../src/agent/http-assignments.ts";
import type { HeartbeatReport } from "../../src/fleet/agent-protocol.ts";
import type { NodeInventory } from "../../src/fleet/fleet-types.ts";
import { ROOT, api, startService, stopService, tail, type Service } from "../gateway/services.ts";
import { flagReader } from "../flags.ts";
import { cpuSeconds, fmt, log, percentile, timestamp, writeReport } from "./bench-report.ts";

const CPU_GOAL_PERCENT = 20;
const POLL_WAIT_MS = 25_000;
/** How often the lost node's state is read. */
const LOST_POLL_MS = 100;
/** Sockets per agent in this process and in the server: its long poll and its heartbeat connection. */
const SOCKETS_PER_AGENT = 2;
/** File descriptors kept for everything else (the store, logs, node's own, the admin calls). */
const FD_RESERVE = 256;

type StoreName = "sqlite" | "postgres";

interface Options {
  agents: number;
  windowS: number;
  warmupS: number;
  heartbeatS: number;
  nodeTimeoutS: number;
  stores: StoreName[];
  postgres: string;
  cpuProf: boolean;
  out: string;
}

function parseOptions(argv: string[]): Options {
  const flag = flagReader(argv);
  const number = (name: string, env: string, fallback: number, check: (n: number) => boolean, expected: string) => {
    const value = flag(name, env);
    if (value === undefined) return fallback;
    const parsed = Number(value.replace(/s$/, ""));
    if (!Number.isFinite(parsed) || !check(parsed)) throw new Error(`Invalid --${name} '${value}': expected ${expected}.`);
    return parsed;
  };
  const stores = (flag("stores", "BENCH_STORES") ?? "sqlite,postgres").split(",").map((part) => {
    const store = part.trim();
    if (store !== "sqlite" && store !== "postgres") throw new Error(`Invalid --stores entry '${part}': use sqlite and/or postgres.`);
    return store;
  });
  const options: Options = {
    agents: number("agents", "BENCH_AGENTS", 500, (n) => Number.isInteger(n) && n >= 2, "a whole number ≥ 2 (one is stopped to measure loss)"),
    windowS: number("window", "BENCH_WINDOW", 30, (n) => n > 0, "seconds > 0, e.g. 30 or 30s"),
    warmupS: number("warmup", "BENCH_WARMUP", 10, (n) => n >= 0, "seconds ≥ 0"),
    heartbeatS: number("heartbeat", "BENCH_HEARTBEAT", 5, (n) => n > 0, "seconds > 0"),
    nodeTimeoutS: number("node-timeout", "BENCH_NODE_TIMEOUT", 15, (n) => n > 0, "seconds > 0"),
    stores,
    postgres: flag("postgres", "BENCH_POSTGRES") ?? "postgres://postgres@127.0.0.1:5432/postgres",
    cpuProf: ["yes", "1", "true"].includes(flag("cpu-prof", "BENCH_CPU_PROF") ?? "no"),
    out: path.resolve(flag("out", "BENCH_OUT") ?? path.join(ROOT, "bench/results")),
  };
  if (options.heartbeatS * 2 > options.nodeTimeoutS) {
    throw new Error(`--heartbeat ${options.heartbeatS} s must be at most half of --node-timeout ${options.nodeTimeoutS} s (the server refuses otherwise).`);
  }
  return options;
}

/** The soft limit on open files of this process (the server child inherits it). */
function openFileLimit(): number | null {
  try {
    const line = readFileSync("/proc/self/limits", "utf8")
      .split("\n")
      .find((l) => l.startsWith("Max open files"));
    const soft = line?.split(/\s{2,}/)[1];
    return soft === undefined || soft === "unlimited" ? null : Number(soft);
  } catch {
    return null;
  }
}

// A small CPU-only machine as `llmgw agent` would detect it.
const INVENTORY: NodeInventory = {
  cores: 8,
  memoryBytes: 32 * 1024 ** 3,
  gpus: [],
  engines: [{ engine: "llamacpp", version: "3.21.1" }],
};

interface HeartbeatSample {
  /** performance.now() when it was sent. */
  at: number;
  ms: number;
  ok: boolean;
}

interface Counters {
  heartbeats: HeartbeatSample[];
  errors: string[];
  pollsAnswered: number[];
  pollErrors: number;
}

/** One simulated node: the real protocol client, its heartbeat timer and its long poll. */
class SimulatedAgent {
  readonly name: string;
  private readonly client: HttpAssignments;
  private credential = "";
  private heartbeatMs: number;
  private knownVersion: string | null = null;
  private timer: NodeJS.Timeout | undefined;
  private readonly controller = new AbortController();
  private stopAfterBeat: ((beat: { sentAt: number; answeredAt: number }) => void) | undefined;

  constructor(
    index: number,
    server: string,
    private readonly counters: Counters,
    heartbeatMs: number,
  ) {
    this.name = `bench-agent-${String(index).padStart(4, "0")}`;
    this.client = new HttpAssignments(server);
    this.heartbeatMs = heartbeatMs;
  }

  async join(joinToken: string): Promise<void> {
    const reply = await this.client.join({ joinToken, name: this.name, address: "127.0.0.1", inventory: INVENTORY, labels: { bench: "agents" } });
    this.credential = reply.credential;
    await this.beat();
    void this.poll();
  }

  /** Resolves with the times of the next answered heartbeat, after which this agent is silent. */
  stopAfterNextBeat(): Promise<{ sentAt: number; answeredAt: number }> {
    return new Promise((resolve) => {
      this.stopAfterBeat = resolve;
    });
  }

  async stop(): Promise<void> {
    clearTimeout(this.timer);
    this.controller.abort();
    await this.client.close().catch(() => undefined);
  }

  private report(): HeartbeatReport {
    return { name: this.name, address: "127.0.0.1", inventory: INVENTORY, labels: { bench: "agents" }, replicas: [], cached: [] };
  }

  private async beat(): Promise<void> {
    if (this.controller.signal.aborted) return;
    const sentAt = Date.now();
    const started = performance.now();
    let ok = true;
    try {
      const reply = await this.client.heartbeat(this.credential, this.report());
      // As the real agent does: the server says how often it wants them.
      this.heartbeatMs = reply.heartbeatIntervalMs;
    } catch (error) {
      ok = false;
      if (this.counters.errors.length < 20) this.counters.errors.push(`${this.name} heartbeat: ${error instanceof Error ? error.message : String(error)}`);
    }
    this.counters.heartbeats.push({ at: started, ms: performance.now() - started, ok });
    if (this.stopAfterBeat !== undefined && ok) {
      const resolve = this.stopAfterBeat;
      this.stopAfterBeat = undefined;
      const answeredAt = Date.now();
      await this.stop();
      resolve({ sentAt, answeredAt });
      return;
    }
    // The next one an interval after this one ended, like agent/node-agent.ts.
    if (!this.controller.signal.aborted) this.timer = setTimeout(() => void this.beat(), this.heartbeatMs);
  }

  private async poll(): Promise<void> {
    const { signal } = this.controller;
    while (!signal.aborted) {
      try {
        const set = await this.client.assignments(this.credential, { knownVersion: this.knownVersion, waitMs: POLL_WAIT_MS, signal });
        this.knownVersion = set.version;
        this.counters.pollsAnswered.push(performance.now());
      } catch (error) {
        if (signal.aborted) return;
        this.counters.pollErrors += 1;
        if (this.counters.errors.length < 20) this.counters.errors.push(`${this.name} poll: ${error instanceof Error ? error.message : String(error)}`);
        // As the real agent: a failed poll is retried after a pause, not in a tight loop.
        await sleep(1000);
      }
    }
  }
}

interface StoreResult {
  store: StoreName;
  agents: number;
  joinSeconds: number;
  windowSeconds: number;
  serverCpuPercent: number | null;
  loadCpuPercent: number;
  heartbeats: { count: number; failed: number; p50Ms: number | null; p99Ms: number | null; maxMs: number | null };
  pollsAnswered: number;
  pollErrors: number;
  loadEventLoopDelayP99Ms: number;
  /** Nodes the server showed as lost when the window ended (none expected). */
  lostDuringWindow: number;
  lostDetection: {
    node: string;
    /** From the stopped agent's last answered heartbeat to the first read that showed `lost`. */
    seconds: number | null;
    /** The same, to the time on the server's node_lost event. */
    serverEventSeconds: number | null;
    limitSeconds: number;
  };
  /** Other nodes that went lost by the end of the run (none expected). */
  otherLost: number;
  errors: string[];
  goals: { cpu: "PASS" | "MISS" | "n/a"; lostDetection: "PASS" | "MISS" };
}

async function createDatabase(adminUrl: string): Promise<{ url: string; drop: () => Promise<void> }> {
  const name = `llmgw_bench_${randomBytes(4).toString("hex")}`;
  const client = new pg.Client({ connectionString: adminUrl });
  try {
    await client.connect();
  } catch (error) {
    throw new Error(
      `Cannot reach PostgreSQL at ${adminUrl} (${error instanceof Error ? error.message : String(error)}); start it, pass --postgres URL, or run with --stores sqlite.`,
    );
  }
  await client.query(`CREATE DATABASE ${name}`);
  await client.end();
  const url = new URL(adminUrl);
  url.pathname = `/${name}`;
  return {
    url: url.toString(),
    drop: async () => {
      const dropper = new pg.Client({ connectionString: adminUrl });
      await dropper.connect();
      // FORCE (PostgreSQL 13+): a connection the server left behind must not keep the database.
      await dropper.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
      await dropper.end();
    },
  };
}

interface NodeRow {
  name: string;
  state: string;
  last_heartbeat: string;
}

async function runStore(store: StoreName, options: Options, context: { temp: string; logDir: string; profDir: string }): Promise<StoreResult> {
  const dataDir = path.join(context.temp, `data-${store}`);
  const database = store === "postgres" ? await createDatabase(options.postgres) : null;
  const counters: Counters = { heartbeats: [], errors: [], pollsAnswered: [], pollErrors: 0 };
  const agents: SimulatedAgent[] = [];
  let server: Service | undefined;
  try {
    const prof = options.cpuProf ? ["--cpu-prof", `--cpu-prof-dir=${path.join(context.profDir, store)}`] : [];
    server = await startService({
      name: `llmgw-${store}`,
      args: [
        ...prof,
        path.join(ROOT, "bin/llmgw.js"),
        "server",
        "--data-dir",
        dataDir,
        "--listen",
        "127.0.0.1:0",
        "--heartbeat-interval",
        `${options.heartbeatS}s`,
        "--node-timeout",
        `${options.nodeTimeoutS}s`,
        ...(database === null ? [] : ["--database", database.url]),
      ],
      logDir: context.logDir,
    });
    const url = server.url;
    const adminKey = readFileSync(path.join(dataDir, "admin.key"), "utf8").trim();
    const joinToken = readFileSync(path.join(dataDir, "join.token"), "utf8").trim();
    log(
      `${store}: llmgw server ${url} (pid ${server.child.pid}${database === null ? ", SQLite" : `, ${database.url.replace(/\/\/[^@]*@/, "//")}`}); ${options.agents} agents joining over ${options.heartbeatS} s`,
    );

    // Spread the starts over one heartbeat interval; a failed join fails the run.
    const joinStarted = performance.now();
    const heartbeatMs = options.heartbeatS * 1000;
    await Promise.all(
      Array.from({ length: options.agents }, async (_, index) => {
        await sleep((index * heartbeatMs) / options.agents);
        const agent = new SimulatedAgent(index, url, counters, heartbeatMs);
        agents.push(agent);
        try {
          await agent.join(joinToken);
        } catch (error) {
          throw new Error(`${agent.name} could not join: ${error instanceof Error ? error.message : String(error)}`);
        }
      }),
    );
    const joinSeconds = (performance.now() - joinStarted) / 1000;
    const joined = ((await api(`${url}/api/v1/nodes`, adminKey, "GET")) as { data: NodeRow[] }).data;
    if (joined.length !== options.agents) throw new Error(`${options.agents} agents joined but the server lists ${joined.length} nodes.`);
    log(`${store}: all ${options.agents} joined in ${joinSeconds.toFixed(1)} s; warming up ${options.warmupS} s, then measuring ${options.windowS} s`);
    await sleep(options.warmupS * 1000);

    // The window: the server's CPU, this process's CPU and event-loop delay, the heartbeats sent.
    const delay = monitorEventLoopDelay({ resolution: 10 });
    const pid = server.child.pid;
    const windowStart = performance.now();
    const cpuBefore = cpuSeconds(pid);
    const loadBefore = process.cpuUsage();
    delay.enable();
    await sleep(options.windowS * 1000);
    delay.disable();
    const cpuAfter = cpuSeconds(pid);
    const loadUsage = process.cpuUsage(loadBefore);
    const windowEnd = performance.now();
    const windowSeconds = (windowEnd - windowStart) / 1000;
    const inWindow = counters.heartbeats.filter((h) => h.at >= windowStart && h.at < windowEnd);
    const okTimes = inWindow.filter((h) => h.ok).map((h) => h.ms);
    const serverCpuPercent = cpuBefore === null || cpuAfter === null ? null : ((cpuAfter - cpuBefore) / windowSeconds) * 100;
    const nodesAfterWindow = ((await api(`${url}/api/v1/nodes`, adminKey, "GET")) as { data: NodeRow[] }).data;
    const lostDuringWindow = nodesAfterWindow.filter((node) => node.state === "lost").length;
    log(`${store}: window done: server CPU ${fmt(serverCpuPercent, 1)}% of one core, ${inWindow.length} heartbeats, p99 ${fmt(percentile(okTimes, 99), 1)} ms`);

    // Loss: one agent falls silent right after an answered heartbeat.
    const victim = agents[Math.floor(agents.length / 2)]!;
    const lastBeat = await victim.stopAfterNextBeat();
    const limitSeconds = options.nodeTimeoutS + 1;
    let seenLostAt: number | null = null;
    const giveUpAt = lastBeat.answeredAt + (options.nodeTimeoutS + 30) * 1000;
    log(`${store}: ${victim.name} stopped after its heartbeat at ${new Date(lastBeat.answeredAt).toISOString()}; reading its state every ${LOST_POLL_MS} ms`);
    while (Date.now() < giveUpAt) {
      const node = (await api(`${url}/api/v1/nodes/${victim.name}`, adminKey, "GET")) as NodeRow;
      if (node.state === "lost") {
        seenLostAt = Date.now();
        break;
      }
      await sleep(LOST_POLL_MS);
    }
    const events = ((await api(`${url}/api/v1/events?kind=node_lost`, adminKey, "GET")) as { data: { at: string; subject: string }[] }).data;
    const event = events.find((e) => e.subject === `node:${victim.name}`);
    const seconds = seenLostAt === null ? null : (seenLostAt - lastBeat.answeredAt) / 1000;
    const serverEventSeconds = event === undefined ? null : (Date.parse(event.at) - lastBeat.answeredAt) / 1000;
    const nodesAtEnd = ((await api(`${url}/api/v1/nodes`, adminKey, "GET")) as { data: NodeRow[] }).data;
    const otherLost = nodesAtEnd.filter((node) => node.state === "lost" && node.name !== victim.name).length;
    log(
      `${store}: ${victim.name} seen lost ${fmt(seconds, 2)} s after its last heartbeat (server event at ${fmt(serverEventSeconds, 2)} s; limit ${limitSeconds} s)`,
    );

    return {
      store,
      agents: options.agents,
      joinSeconds: Number(joinSeconds.toFixed(2)),
      windowSeconds: Number(windowSeconds.toFixed(2)),
      serverCpuPercent: serverCpuPercent === null ? null : Number(serverCpuPercent.toFixed(2)),
      loadCpuPercent: Number((((loadUsage.user + loadUsage.system) / 1e6 / windowSeconds) * 100).toFixed(2)),
      heartbeats: {
        count: inWindow.length,
        failed: inWindow.length - okTimes.length,
        p50Ms: percentile(okTimes, 50),
        p99Ms: percentile(okTimes, 99),
        maxMs: okTimes.length === 0 ? null : Math.max(...okTimes),
      },
      pollsAnswered: counters.pollsAnswered.filter((at) => at >= windowStart && at < windowEnd).length,
      pollErrors: counters.pollErrors,
      loadEventLoopDelayP99Ms: Number((delay.percentile(99) / 1e6).toFixed(2)),
      lostDuringWindow,
      lostDetection: { node: victim.name, seconds, serverEventSeconds, limitSeconds },
      otherLost,
      errors: counters.errors,
      goals: {
        // The goal is stated at 500 agents; fewer say nothing about it.
        cpu: options.agents < 500 ? "n/a" : serverCpuPercent !== null && serverCpuPercent < CPU_GOAL_PERCENT ? "PASS" : "MISS",
        lostDetection: seconds !== null && seconds <= limitSeconds ? "PASS" : "MISS",
      },
    };
  } catch (error) {
    if (server !== undefined) log(`--- ${server.name} log (last lines) ---\n${tail(server.logFile)}`);
    throw error;
  } finally {
    await Promise.all(agents.map((agent) => agent.stop()));
    if (server !== undefined) await stopService(server);
    await database?.drop().catch((error: unknown) => log(`could not drop the benchmark database: ${error instanceof Error ? error.message : String(error)}`));
  }
}

function renderTable(results: StoreResult[]): string {
  const header = [
    "store",
    "agents",
    "server CPU",
    "hb p50 ms",
    "hb p99 ms",
    "hb max ms",
    "hb failed",
    "polls",
    "lost in window",
    "loss seen after",
    "server event",
    "load CPU",
    "load loop p99",
  ];
  const rows = results.map((r) => [
    r.store,
    String(r.agents),
    `${fmt(r.serverCpuPercent, 1)}%`,
    fmt(r.heartbeats.p50Ms, 1),
    fmt(r.heartbeats.p99Ms, 1),
    fmt(r.heartbeats.maxMs, 1),
    `${r.heartbeats.failed}/${r.heartbeats.count}`,
    String(r.pollsAnswered),
    String(r.lostDuringWindow),
    r.lostDetection.seconds === null ? "not seen" : `${fmt(r.lostDetection.seconds, 2)} s`,
    `${fmt(r.lostDetection.serverEventSeconds, 2)} s`,
    `${fmt(r.loadCpuPercent, 0)}%`,
    `${fmt(r.loadEventLoopDelayP99Ms, 1)} ms`,
  ]);
  const widths = header.map((title, column) => Math.max(title.length, ...rows.map((row) => row[column]!.length)));
  const line = (row: string[]) =>
    `| ${row.map((text, column) => (column === 0 ? text.padEnd(widths[column]!) : text.padStart(widths[column]!))).join(" | ")} |`;
  const rule = `|${widths.map((width, column) => (column === 0 ? "-".repeat(width + 2) : `${"-".repeat(width + 1)}:`)).join("|")}|`;
  return [line(header), rule, ...rows.map(line)].join("\n");
}

function renderGoals(results: StoreResult[], options: Options): string {
  return results
    .flatMap((r) => [
      `${r.goals.cpu.padEnd(4)} ${r.store}: server CPU ${fmt(r.serverCpuPercent, 1)}% of one core at ${r.agents} agents (goal: under ${CPU_GOAL_PERCENT}% at 500${r.agents < 500 ? "; fewer agents ran" : ""})`,
      `${r.goals.lostDetection.padEnd(4)} ${r.store}: lost node seen ${r.lostDetection.seconds === null ? "never" : `${fmt(r.lostDetection.seconds, 2)} s`} after its last heartbeat (goal: within --node-timeout ${options.nodeTimeoutS} s + 1 s)`,
    ])
    .join("\n");
}

async function main(): Promise<void> {
  const options = parseOptions(process.argv.slice(2));
  const limit = openFileLimit();
  if (limit !== null) {
    const most = Math.floor((limit - FD_RESERVE) / SOCKETS_PER_AGENT);
    if (options.agents > most) {
      log(
        `The open-file limit (ulimit -n) is ${limit}: ${options.agents} agents need about ${options.agents * SOCKETS_PER_AGENT + FD_RESERVE} sockets and files in this process and as many in the server. ` +
          `Running ${most} agents instead; raise it with 'ulimit -n ${options.agents * SOCKETS_PER_AGENT + FD_RESERVE}' to run them all.`,
      );
      options.agents = most;
    }
  }
  const stamp = timestamp();
  const temp = mkdtempSync(path.join(os.tmpdir(), "llmgw-bench-fleet-"));
  const logDir = path.join(temp, "logs");
  mkdirSync(logDir);
  const profDir = path.join(options.out, `prof-fleet-agents-${stamp}`);
  log(
    `fleet agents benchmark: ${options.agents} agents, heartbeat ${options.heartbeatS} s, node timeout ${options.nodeTimeoutS} s, stores ${options.stores.join(", ")}; ` +
      `${options.warmupS} s warm-up, ${options.windowS} s window; ${os.cpus().length} CPUs, load average ${os
        .loadavg()
        .map((v) => v.toFixed(2))
        .join(" ")}`,
  );
  const results: StoreResult[] = [];
  try {
    for (const store of options.stores) results.push(await runStore(store, options, { temp, logDir, profDir }));
  } catch (error) {
    process.stderr.write(`bench/fleet/agents failed: ${error instanceof Error ? error.message : String(error)}\n`);
    rmSync(temp, { recursive: true, force: true });
    process.exit(1);
  }
  rmSync(temp, { recursive: true, force: true });
  process.stdout.write(`\n${renderTable(results)}\n\n${renderGoals(results, options)}\n`);
  for (const r of results) {
    if (r.errors.length > 0) log(`${r.store}: ${r.errors.length} protocol errors, e.g. ${r.errors[0]}`);
    if (r.otherLost > 0 || r.lostDuringWindow > 0)
      log(
        `${r.store}: ${r.lostDuringWindow} nodes lost during the window, ${r.otherLost} besides the stopped one by the end: heartbeats did not get through in time`,
      );
  }
  const file = writeReport({ dir: options.out, name: "fleet-agents", stamp, report: { options: { ...options, out: undefined }, results } });
  log(`wrote ${path.relative(process.cwd(), file)}`);
  if (options.cpuProf) log(`CPU profiles in ${path.relative(process.cwd(), profDir)}/; summarize: npx tsx bench/gateway/profile-summary.ts FILE`);
}

await main();
