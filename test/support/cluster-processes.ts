// llmgw as child processes for end-to-end tests (spawnLlmgw), each one's output kept for
// assertions and failure messages; and for the many-servers tests, a PostgreSQL database
// made for one test and dropped after it, and a stop for many processes at once.
import { spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import pg from "pg";
import { TEST_POSTGRES_URL } from "./stores.ts";
import { eventually } from "./eventually.ts";

const BIN = fileURLToPath(new URL("../../bin/llmgw.js", import.meta.url));

export interface LlmgwProcess {
  child: ChildProcess;
  output: () => string;
  exited: Promise<number | null>;
}

export function spawnLlmgw(args: string[], env: Record<string, string> = {}): LlmgwProcess {
  const child = spawn(process.execPath, [BIN, ...args], { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, LLMGW_LOG_LEVEL: "info", ...env } });
  let out = "";
  child.stdout!.on("data", (chunk: Buffer) => (out += chunk.toString()));
  child.stderr!.on("data", (chunk: Buffer) => (out += chunk.toString()));
  const exited = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)));
  return { child, output: () => out, exited };
}

/** The URL a `llmgw server` printed once it listens. */
export async function listeningUrl(server: LlmgwProcess, timeoutMs = 60_000): Promise<string> {
  return eventually(
    "the server to listen",
    () => {
      const match = /llmgw server listening on (http:\/\/\S+)/.exec(server.output());
      if (server.child.exitCode !== null) throw new Error(`the server exited (${server.child.exitCode}):\n${server.output()}`);
      return match?.[1];
    },
    { timeoutMs },
  );
}

/** A database of its own for one test: its URL, and `drop` to remove it (ending what still uses it). */
export async function createTestDatabase(): Promise<{ url: string; name: string; drop: () => Promise<void> }> {
  const name = `llmgw_cluster_${randomBytes(5).toString("hex")}`;
  const admin = new URL(TEST_POSTGRES_URL);
  const withClient = async (body: (client: pg.Client) => Promise<unknown>) => {
    const client = new pg.Client({ connectionString: admin.toString() });
    await client.connect();
    try {
      await body(client);
    } finally {
      await client.end();
    }
  };
  await withClient((client) => client.query(`create database ${name}`));
  const url = new URL(TEST_POSTGRES_URL);
  url.pathname = `/${name}`;
  return { url: url.toString(), name, drop: () => withClient((client) => client.query(`drop database if exists ${name} with (force)`)) };
}

/** Stops processes: SIGTERM, then SIGKILL for any still running after `graceMs`. */
export async function stopAll(processes: LlmgwProcess[], graceMs = 20_000): Promise<void> {
  for (const running of processes) if (running.child.exitCode === null && running.child.signalCode === null) running.child.kill("SIGTERM");
  const killer = setTimeout(() => {
    for (const running of processes) if (running.child.exitCode === null && running.child.signalCode === null) running.child.kill("SIGKILL");
  }, graceMs);
  await Promise.all(processes.map((running) => running.exited));
  clearTimeout(killer);
}

/**
 * `llmgw agent` for a many-servers test: a node named `name` with its data dir at `dir`,
 * a fixed inventory (4 cores, 8 GiB, the bundled llama.cpp) so placement does not depend
 * on the machine, joining with the first server's join token and knowing `servers` in order.
 */
export function spawnClusterAgent(options: { name: string; dir: string; servers: string[]; joinTokenFile: string }): LlmgwProcess {
  mkdirSync(options.dir, { recursive: true });
  const inventory = path.join(options.dir, "inventory.json");
  writeFileSync(inventory, JSON.stringify({ cores: 4, memory: "8g", engines: [{ engine: "llamacpp", version: "3.21.1" }] }));
  const joinToken = readFileSync(options.joinTokenFile, "utf8").trim();
  return spawnLlmgw([
    "agent",
    "--server",
    options.servers.join(","),
    "--join-token",
    joinToken,
    "--name",
    options.name,
    "--data-dir",
    options.dir,
    "--inventory",
    inventory,
  ]);
}
