// A stand-in engine for the supervisor's tests, and helpers to watch a supervisor. The
// stand-in is a tiny node HTTP server, written to a temp folder and run as a REAL child
// process. It speaks llama-server's readiness protocol (reference/engines.md: /health
// answers 503 {"error":{"code":503,"message":"Loading model",...}} while loading, then 200
// {"status":"ok"}), and its modes (FAKE_MODE) reproduce what real engines do wrong: exit
// at once with a message on stderr (a missing model file), never finish loading, ignore
// SIGTERM, crash or turn unhealthy after becoming ready, and fork a helper process
// (vLLM's workers) that ignores SIGTERM. Its /v1/models follows the OpenAI protocol the
// bundled engine, llama-server and vLLM share (401 without the right Bearer key, else
// {"object":"list","data":[{"id":...}]}); mode "foreign" is some other HTTP service that
// answers /health but has no such route.
import { existsSync } from "node:fs";
import { readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import {
  EngineSupervisor,
  type EngineLaunch,
  type SupervisorOptions,
  type SupervisorSnapshot,
  type SupervisorState,
} from "../../src/agent/engine-supervisor.ts";

const STAND_IN_ENGINE = `
import http from "node:http";
import { spawn } from "node:child_process";
import { writeFileSync } from "node:fs";

const args = process.argv.slice(2);
const arg = (name) => { const i = args.indexOf(name); return i === -1 ? undefined : args[i + 1]; };
const port = Number(arg("--port"));
const host = arg("--host") ?? "127.0.0.1";
const mode = process.env.FAKE_MODE ?? "ok";
const readyAfterMs = Number(process.env.FAKE_READY_AFTER_MS ?? "0");
const failAfterMs = Number(process.env.FAKE_FAIL_AFTER_MS ?? "100");

// The engine's cwd is the run's state folder: leave the environment there for the test.
writeFileSync("env-" + process.pid + ".json", JSON.stringify(process.env));

if (mode === "exit") {
  console.error(process.env.FAKE_MESSAGE ?? "fake engine: failed");
  process.exit(3);
}
if (mode === "ignore-term") process.on("SIGTERM", () => console.log("fake engine: ignoring SIGTERM"));
if (process.env.FAKE_GRANDCHILD_PID_FILE) {
  const helper = spawn(process.execPath, ["-e", "process.on('SIGTERM', () => {}); setInterval(() => {}, 1000);"], { stdio: "ignore" });
  writeFileSync(process.env.FAKE_GRANDCHILD_PID_FILE, String(helper.pid));
}

const startedAt = Date.now();
let readyAt = null;
const server = http.createServer((req, res) => {
  if (req.url === "/v1/models" && mode !== "foreign") {
    if (req.headers.authorization !== "Bearer " + (process.env.FAKE_KEY ?? "")) {
      res.writeHead(401, { "content-type": "application/json" });
      res.end(JSON.stringify({ error: { message: "Invalid API Key", type: "authentication_error", code: 401 } }));
      return;
    }
    res.writeHead(200, { "content-type": "application/json" });
    res.end(JSON.stringify({ object: "list", data: [{ id: process.env.FAKE_MODEL ?? "fake", object: "model", owned_by: "fake" }] }));
    return;
  }
  if (req.url !== "/health") { res.writeHead(404); res.end("Not Found"); return; }
  if (mode === "never" || Date.now() - startedAt < readyAfterMs) {
    res.writeHead(503, { "content-type": "application/json" });
    res.end(JSON.stringify({ error: { code: 503, message: "Loading model", type: "unavailable_error" } }));
    return;
  }
  if (readyAt === null) {
    readyAt = Date.now();
    if (mode === "die-after-ready") {
      setTimeout(() => { console.error("fake engine: crashed while serving"); process.exit(1); }, failAfterMs);
    }
  }
  if (mode === "unhealthy-after-ready" && Date.now() - readyAt > failAfterMs) { res.writeHead(500); res.end(); return; }
  res.writeHead(200, { "content-type": "application/json" });
  res.end('{"status":"ok"}');
});
server.listen(port, host, () => console.log("fake engine listening on " + host + ":" + port));
`;

/** Writes the stand-in engine into `dir`; returns the script's path (run it with `node`). */
export async function writeStandInEngine(dir: string): Promise<string> {
  const script = join(dir, "fake-engine.mjs");
  await writeFile(script, STAND_IN_ENGINE);
  return script;
}

export interface SupervisorHarness {
  supervisor: EngineSupervisor;
  /** Every snapshot the supervisor reported, in order. */
  events: SupervisorSnapshot[];
  /** How many times prepare ran (= attempts that got past preflight). */
  prepared: () => number;
  root: string;
}

export interface SupervisorHarnessOptions {
  /** The stand-in engine's script (writeStandInEngine). */
  script: string;
  replicaId: string;
  /** The supervisor's stateRoot. */
  root: string;
  /** FAKE_* variables per attempt. */
  env: (attempt: number) => Record<string, string>;
  validate?: EngineLaunch["validate"];
  /** Replace the short test timings or anything else. */
  overrides?: Partial<SupervisorOptions>;
}

/** A supervisor over the stand-in engine with short timings (generous where a loaded machine needs them). */
export function supervisorHarness(options: SupervisorHarnessOptions): SupervisorHarness {
  let prepared = 0;
  const supervisor = new EngineSupervisor({
    replicaId: options.replicaId,
    stateRoot: options.root,
    prepare: ({ attempt, port, host }) => {
      prepared += 1;
      return {
        command: process.execPath,
        args: [options.script, "--port", String(port), "--host", host],
        env: options.env(attempt),
        host,
        port,
        healthPath: "/health",
        validate: options.validate,
      };
    },
    // Generous: on a loaded machine a node process may take seconds to boot and answer.
    readyTimeoutMs: 30_000,
    healthIntervalMs: 20,
    livenessIntervalMs: 50,
    healthTimeoutMs: 5_000,
    stopGraceMs: 300,
    backoff: { initialMs: 20, maxMs: 100 },
    parkAfter: { failures: 3, windowMs: 60_000 },
    ...options.overrides,
  });
  const events: SupervisorSnapshot[] = [];
  supervisor.onChange((snapshot) => events.push(snapshot));
  return { supervisor, events, prepared: () => prepared, root: options.root };
}

/**
 * Resolves with the first snapshot, now or from a later change, that satisfies
 * `predicate`. It listens to the supervisor's change events instead of polling (the shared
 * `eventually`), because states such as "failed" with a short backoff last only
 * milliseconds and polling would miss them. The deadline only bounds a broken test.
 */
export function untilSnapshot(
  supervisor: EngineSupervisor,
  predicate: (snapshot: SupervisorSnapshot) => boolean,
  timeoutMs = 60_000,
): Promise<SupervisorSnapshot> {
  return new Promise((resolveWait, rejectWait) => {
    const now = supervisor.snapshot();
    if (predicate(now)) return resolveWait(now);
    const timer = setTimeout(() => {
      unsubscribe();
      rejectWait(new Error(`condition not met within ${timeoutMs} ms; last snapshot ${JSON.stringify(supervisor.snapshot())}`));
    }, timeoutMs);
    const unsubscribe = supervisor.onChange((snapshot) => {
      if (!predicate(snapshot)) return;
      clearTimeout(timer);
      unsubscribe();
      resolveWait(snapshot);
    });
  });
}

export const inState = (state: SupervisorState) => (snapshot: SupervisorSnapshot) => snapshot.state === state;

/** supervisor.settled(), bounded: a supervisor that never settles fails the test instead of hanging it. */
export async function settled(supervisor: EngineSupervisor, timeoutMs = 60_000): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  const bound = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () => reject(new Error(`the supervisor did not settle within ${timeoutMs} ms; last snapshot ${JSON.stringify(supervisor.snapshot())}`)),
      timeoutMs,
    );
  });
  try {
    await Promise.race([supervisor.settled(), bound]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * The lines of attempts.jsonl. They are written fire-and-forget; once a test has seen the
 * state that follows an attempt, its line is queued, and the flush waits for it.
 */
export async function attemptRecords(supervisor: EngineSupervisor, stateDir: string): Promise<Record<string, unknown>[]> {
  await supervisor.flushAttemptRecords();
  const file = join(stateDir, "attempts.jsonl");
  const lines = existsSync(file) ? (await readFile(file, "utf8")).split("\n").filter((line) => line !== "") : [];
  return lines.map((line) => JSON.parse(line) as Record<string, unknown>);
}
