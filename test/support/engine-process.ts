// Test support for the bundled engine: starts `node bin/llmgw.js engine ...` as a real
// child process on a free loopback port and waits for its /health, the way the agent's
// supervisor does, or starts it from a stand-in agent process that a test can kill.
// Used only by the engine's tests.
import { spawn, type ChildProcess } from "node:child_process";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { findFreePort } from "../../src/agent/free-port.ts";
import { eventually } from "./eventually.ts";

const BIN = fileURLToPath(new URL("../../bin/llmgw.js", import.meta.url));

/** A free loopback port (the agent's own helper). */
export function freePort(): Promise<number> {
  return findFreePort("127.0.0.1");
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

export interface EngineUnderAgent {
  /** The stand-in agent: the engine's parent until a test kills it. */
  agent: ChildProcess;
  agentExited: Promise<unknown>;
  /** The engine, detached in its own session and process group like under the supervisor. */
  enginePid: number;
  port: number;
  url: string;
  /** The engine's stdout and stderr (its log lines), read from the log file. */
  stderr(): string;
  /** Resolves when the engine process is gone (it is not our child, so this polls). */
  exited: Promise<void>;
  /** SIGKILLs the engine and the stand-in agent if they still run. */
  kill(): Promise<void>;
}

// CommonJS for `node -e`. It starts the engine as engine-supervisor.ts does (detached,
// output to a file), prints its pid and then only waits, to be killed by the test.
const STAND_IN_AGENT = `
const { spawn } = require("node:child_process");
const { openSync } = require("node:fs");
const spec = JSON.parse(process.env.LLMGW_TEST_ENGINE_SPEC);
const log = openSync(spec.logPath, "a");
const engine = spawn(process.execPath, spec.args, { detached: true, stdio: ["ignore", log, log], env: spec.env });
process.stdout.write(engine.pid + "\\n");
setInterval(() => {}, 60000);
`;

/**
 * Starts the engine from an intermediate node process standing in for the agent, so a
 * test can SIGKILL that "agent" (as the OOM killer would) and watch the orphaned engine.
 * The engine logs at info level into `logPath`.
 */
export async function startEngineUnderAgent(options: StartEngineOptions & { logPath: string }): Promise<EngineUnderAgent> {
  const port = options.port ?? (await freePort());
  const spec = {
    logPath: options.logPath,
    args: [BIN, "engine", "--port", String(port), ...options.args],
    env: { ...process.env, LLMGW_LOG_LEVEL: "info", ...options.env },
  };
  const agent = spawn(process.execPath, ["-e", STAND_IN_AGENT], {
    env: { ...process.env, LLMGW_TEST_ENGINE_SPEC: JSON.stringify(spec) },
    stdio: ["ignore", "pipe", "inherit"],
  });
  const agentExited = new Promise((resolve) => agent.once("exit", resolve));
  const enginePid = await new Promise<number>((resolve, reject) => {
    let out = "";
    agent.stdout?.setEncoding("utf8").on("data", (text: string) => {
      out += text;
      if (out.includes("\n")) resolve(Number(out.trim()));
    });
    void agentExited.then(() => reject(new Error("the stand-in agent exited before it started the engine")));
  });
  let gone = false;
  const exited = new Promise<void>((resolve) => {
    const poll = setInterval(() => {
      if (!processIsGone(enginePid)) return;
      gone = true;
      clearInterval(poll);
      resolve();
    }, 50);
  });
  return {
    agent,
    agentExited,
    enginePid,
    port,
    url: `http://127.0.0.1:${port}`,
    stderr: () => {
      try {
        return readFileSync(options.logPath, "utf8");
      } catch {
        return "";
      }
    },
    exited,
    async kill() {
      if (agent.exitCode === null && agent.signalCode === null) {
        agent.kill("SIGKILL");
        await agentExited;
      }
      if (!gone) {
        try {
          process.kill(enginePid, "SIGKILL");
        } catch {
          // Already gone.
        }
        await exited;
      }
    },
  };
}

/** Gone = no such process, or a zombie (PID 1 in a container may never reap an orphan). */
export function processIsGone(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch {
    return true;
  }
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return /^[ZX]/.test(stat.slice(stat.lastIndexOf(")") + 2));
  } catch {
    return true;
  }
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
export async function waitForReady(engine: Pick<EngineProcess, "url" | "stderr"> & { exited: Promise<unknown> }, timeoutMs = 60_000): Promise<HealthHistory> {
  const seen: number[] = [];
  const bodies = new Map<number, string>();
  let exited = false;
  void engine.exited.then(() => {
    exited = true;
  });
  let outcome: "ready" | "exited";
  try {
    outcome = await eventually(
      `${engine.url}/health to answer 200`,
      async (): Promise<"ready" | "exited" | false> => {
        if (exited) return "exited";
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
        return status === 200 ? "ready" : false;
      },
      { timeoutMs, intervalMs: 25 },
    );
  } catch (error) {
    throw new Error(
      `engine not ready: ${error instanceof Error ? error.message : String(error)}; statuses seen: ${seen.join(", ")}; stderr: ${engine.stderr()}`,
    );
  }
  if (outcome === "exited") throw new Error(`engine exited before it was ready: ${engine.stderr()}`);
  return { statuses: seen, bodies };
}
