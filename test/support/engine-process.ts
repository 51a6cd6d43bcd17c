// Test support for the bundled engine: starts `node bin/llmgw.js engine ...` as a real
// child process on a free loopback port and waits for its /health, the way the agent's
// supervisor does. Used only by the engine's tests.
import { spawn, type ChildProcess } from "node:child_process";
import { createServer } from "node:net";
import { fileURLToPath } from "node:url";

const BIN = fileURLToPath(new URL("../../bin/llmgw.js", import.meta.url));

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      server.close(() => (typeof address === "object" && address ? resolve(address.port) : reject(new Error("no port"))));
    });
  });
}

export interface EngineProcess {
  child: ChildProcess;
  port: number;
  url: string;
  /** Everything the process wrote on stderr so far. */
  stderr(): string;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  /** SIGKILLs the process if it is still running. */
  kill(): Promise<void>;
}

export interface StartEngineOptions {
  /** Arguments after `engine` (without --port). */
  args: string[];
  /** Defaults to a free port. */
  port?: number;
  env?: Record<string, string>;
}

export async function startEngine(options: StartEngineOptions): Promise<EngineProcess> {
  const port = options.port ?? (await freePort());
  const child = spawn(process.execPath, [BIN, "engine", "--port", String(port), ...options.args], {
    env: { ...process.env, LLMGW_LOG_LEVEL: process.env.LLMGW_LOG_LEVEL ?? "silent", ...options.env },
    stdio: ["ignore", "ignore", "pipe"],
  });
  let stderr = "";
  child.stderr?.setEncoding("utf8").on("data", (text: string) => {
    stderr += text;
  });
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => {
    child.once("exit", (code, signal) => resolve({ code, signal }));
  });
  return {
    child,
    port,
    url: `http://127.0.0.1:${port}`,
    stderr: () => stderr,
    exited,
    async kill() {
      if (child.exitCode === null && child.signalCode === null) {
        child.kill("SIGKILL");
        await exited;
      }
    },
  };
}

export interface HealthHistory {
  /** Distinct statuses in the order seen (0 = no answer yet). */
  statuses: number[];
  /** The first body seen for each status. */
  bodies: Map<number, string>;
}

/**
 * Polls /health until it answers 200 and returns what it saw on the way. Fails if the
 * process exits or the deadline passes first.
 */
export async function waitForReady(engine: EngineProcess, timeoutMs = 60_000): Promise<HealthHistory> {
  const seen: number[] = [];
  const bodies = new Map<number, string>();
  const deadline = Date.now() + timeoutMs;
  let exited = false;
  void engine.exited.then(() => {
    exited = true;
  });
  while (Date.now() < deadline) {
    if (exited) throw new Error(`engine exited before it was ready: ${engine.stderr()}`);
    let status = 0;
    try {
      const response = await fetch(`${engine.url}/health`);
      status = response.status;
      const body = await response.text();
      if (!bodies.has(status)) bodies.set(status, body);
    } catch {
      status = 0;
    }
    if (seen.at(-1) !== status) seen.push(status);
    if (status === 200) return { statuses: seen, bodies };
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
  throw new Error(`engine not ready after ${timeoutMs} ms; statuses seen: ${seen.join(", ")}; stderr: ${engine.stderr()}`);
}
