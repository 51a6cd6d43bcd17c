// The engine supervisor: owns ONE replica's engine process from spawn to exit. It is
// engine-agnostic: a `prepare` callback (written per engine: bundled llama.cpp,
// llama-server, vLLM) turns an attempt into a command line, and the supervisor does the
// rest the same way for every engine, following DESIGN.md "Engine supervision (agent)":
//
// - each run (start() or unpark()) claims a NEW state folder below `stateRoot` with an
//   exclusive mkdir; the engine's HOME, TMPDIR and cache roots live below it; the
//   environment is built from scratch (PATH, locale, what the launch gives) plus offline
//   and no-telemetry flags, and a launch that points a cache root outside the folder is
//   refused before anything is spawned;
// - each attempt gets a free port (checked again right before the spawn), its own log
//   file `attempt-N.log` (stdout and stderr), and one line in `attempts.jsonl`, written
//   fire-and-forget so a full disk never blocks a start or a stop;
// - the engine runs detached, in its own process group, so stopping it (SIGTERM to the
//   group, SIGKILL after the grace) also stops what it forked: llama-swap could not stop
//   engines that fork (its #804);
// - readiness is a health poll over a plain undici Agent (never an environment proxy)
//   with a per-attempt deadline, and then the launch's `validate` check of what the
//   engine reports (`openAiModelsValidator`: our key is accepted and our model is
//   listed). A bare 200 is not enough: a foreign server on a reused port, or an engine
//   started with another key, answers /health too and would then fail every request;
// - a failure records why (exit code or signal and the last lines of the attempt log)
//   and is retried with exponential backoff, and too many failures within a window PARK
//   the replica: no more attempts until unpark(). Peers without that protection loop or
//   stay failed forever (llama-swap #92).
//
// How a hosting process (`llmgw agent`, `llmgw up`) must use it: on SIGINT/SIGTERM call
// `await stopAllSupervisors()` (graceful: SIGTERM, grace, SIGKILL for every engine) and
// then exit. As a last line of defence this module installs one `process.on("exit")`
// hook that SIGKILLs every process group still registered (`killAllSupervisedSync`), so
// an agent that exits, even through an uncaught exception, leaves no engine behind. A
// SIGKILL (or OOM kill) of the agent escapes that hook; the bundled `llmgw engine`
// therefore watches its parent and shuts down when the agent is gone
// (engine-command.ts). An external engine without such a watch survives it, and the
// next agent start finds its port taken and reports it.
//
// Run folders are kept after a run (their attempt logs explain failures), so they pile
// up: a hosting process calls `pruneRunFolders({ stateRoot })` at start to delete all
// but the newest ones; folders of runs that are active in this process are never
// deleted.
import { spawn } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";
import { appendFile, lstat, mkdir, open, readdir, rm } from "node:fs/promises";
import { randomBytes } from "node:crypto";
import { isAbsolute, join, relative, resolve } from "node:path";
import { Agent, request } from "undici";
import { ConflictError, LlmgwError, describeError, errorCode } from "../core/errors.ts";
import { formatHost, printable } from "../core/format.ts";
import { silentLogger, type Logger } from "../core/log.ts";
import { assertPortFree, findFreePort } from "./free-port.ts";

/** What to run for one attempt, built by the engine adapter's `prepare`. */
export interface EngineLaunch {
  command: string;
  args: string[];
  /**
   * Variables the engine needs beyond the ones the supervisor sets. Cache and temp roots
   * (HOME, TMPDIR, XDG_*, HF_HOME, VLLM_CACHE_ROOT, ...) may be set only to paths inside
   * the state folder; the offline flags cannot be overridden.
   */
  env: Record<string, string>;
  host: string;
  port: number;
  /** Path polled for readiness and liveness, for example "/health". */
  healthPath: string;
  /**
   * Checks what the engine reports once its health check first answers 200, before the
   * replica is marked ready (for OpenAI-compatible engines: `openAiModelsValidator`). A
   * throw fails the attempt with code `validation_failed` and the thrown message, kills
   * the engine's process group, and counts like any other failure (backoff, parking).
   * Runs within the attempt's readiness deadline; `signal` aborts on stop(), on the
   * engine's exit and at the deadline.
   */
  validate?: EngineValidator;
  /**
   * What attempts.jsonl records as this attempt's `settings` (for example
   * `{ flashAttention: false }`). Defaults to command, args with the values of
   * key/token/secret/password flags redacted, host and port; never the environment.
   */
  settings?: Record<string, unknown>;
}

export interface EngineValidationContext {
  /** Where the engine listens (the launch's host and port). */
  host: string;
  port: number;
  signal: AbortSignal;
}

/** Resolves when the engine on host:port is the one this attempt started, as it was configured; throws a message naming what was expected and what was found otherwise. */
export type EngineValidator = (context: EngineValidationContext) => Promise<void>;

export interface AttemptContext {
  /** 1-based attempt number within this run. */
  attempt: number;
  /** A port that was free on `host` a moment ago; the launch may use another one. */
  port: number;
  host: string;
  /** This run's state folder (absolute). */
  stateDir: string;
  /** Aborted when stop() is called; long preparation should give up on it. */
  signal: AbortSignal;
}

export interface SupervisorOptions {
  replicaId: string;
  /** Parent folder; each run claims a new folder below it and never reuses one. */
  stateRoot: string;
  /** Builds the command for each attempt (fallback settings can depend on the attempt number). */
  prepare: (attempt: AttemptContext) => Promise<EngineLaunch> | EngineLaunch;
  /** Checked before every attempt (for example: the weights exist and are readable); a throw fails the attempt without a spawn. */
  preflight?: (signal: AbortSignal) => Promise<void>;
  /** Host the supervisor picks a free port on before calling prepare. Default "127.0.0.1". */
  host?: string;
  /** Deadline for one attempt to answer its health check with 200 and pass the launch's validation. Default 120 000 ms. */
  readyTimeoutMs?: number;
  /** Readiness poll interval while starting. Default 250 ms. */
  healthIntervalMs?: number;
  /** Liveness check interval once ready. Default 5 000 ms. */
  livenessIntervalMs?: number;
  /** Consecutive failed liveness checks that count as a failure of the engine. Default 3. */
  livenessFailures?: number;
  /** Timeout of one health request (connect + headers). Default 5 000 ms. */
  healthTimeoutMs?: number;
  /** SIGTERM → SIGKILL grace. Default 10 000 ms (llama-swap's value). */
  stopGraceMs?: number;
  /** Restart delay: initialMs · 2^(recent failures − 1), at most maxMs. Default 1 s … 60 s. */
  backoff?: { initialMs: number; maxMs: number };
  /** Park after this many failures within windowMs. Default 5 within 10 minutes. */
  parkAfter?: { failures: number; windowMs: number };
  logger?: Logger;
}

export type SupervisorState = "starting" | "ready" | "failed" | "parked" | "stopping" | "stopped";

export interface SupervisorSnapshot {
  replicaId: string;
  /** "stopped" before the first start(). */
  state: SupervisorState;
  /** Current (or last) attempt number in this run; 0 before the first. */
  attempt: number;
  /** Failures in this run (since start() or unpark()). */
  failures: number;
  /** Why the last attempt failed, or why the replica is parked. */
  lastError: string | null;
  /** Stable code of the last failure: preflight_failed, state_dir_failed, prepare_failed, cache_path_outside_state, port_in_use, spawn_failed, engine_exited, not_ready, validation_failed, unhealthy, internal_error. */
  lastErrorCode: string | null;
  /** How the last engine process ended. */
  lastExit: { code: number | null; signal: string | null } | null;
  /** Where the engine listens; set while its process runs (route only when state is "ready"). */
  endpoint: { host: string; port: number } | null;
  /** Epoch ms the current attempt's process was spawned. */
  startedAt: number | null;
  /** Epoch ms the current attempt became ready. */
  readyAt: number | null;
  /** Epoch ms of the next attempt while "failed". */
  retryAt: number | null;
  pid: number | null;
  /** This run's state folder. */
  stateDir: string | null;
}

export type SupervisorListener = (snapshot: SupervisorSnapshot) => void;

export const SUPERVISOR_DEFAULTS = {
  host: "127.0.0.1",
  readyTimeoutMs: 120_000,
  healthIntervalMs: 250,
  livenessIntervalMs: 5_000,
  livenessFailures: 3,
  healthTimeoutMs: 5_000,
  stopGraceMs: 10_000,
  backoff: { initialMs: 1_000, maxMs: 60_000 },
  parkAfter: { failures: 5, windowMs: 10 * 60_000 },
} as const;

/** The environment variables that may only point inside the state folder. */
const STATE_PATH_VARS = new Set([
  "HOME",
  "TMPDIR",
  "TMP",
  "TEMP",
  "XDG_CACHE_HOME",
  "XDG_CONFIG_HOME",
  "XDG_DATA_HOME",
  "XDG_STATE_HOME",
  "XDG_RUNTIME_DIR",
  "HF_HOME",
  "HF_HUB_CACHE",
  "HF_DATASETS_CACHE",
  "TRANSFORMERS_CACHE",
  "TORCH_HOME",
  "VLLM_CACHE_ROOT",
  "TRITON_CACHE_DIR",
  "TORCHINDUCTOR_CACHE_DIR",
  "CUDA_CACHE_PATH",
  "PYTHONPYCACHEPREFIX",
  "NUMBA_CACHE_DIR",
  "RAY_TMPDIR",
]);

/** Set last, so no launch can turn hub downloads or telemetry back on. */
const OFFLINE_ENV: Record<string, string> = {
  HF_HUB_OFFLINE: "1",
  TRANSFORMERS_OFFLINE: "1",
  HF_DATASETS_OFFLINE: "1",
  HF_HUB_DISABLE_TELEMETRY: "1",
  DO_NOT_TRACK: "1",
  VLLM_NO_USAGE_STATS: "1",
};

/** The only variables taken from the agent's own environment. */
const INHERITED_ENV = ["PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ"];

const SECRET_FLAG = /key|token|secret|password/i;
const LOG_TAIL_BYTES = 8192;
const LOG_TAIL_LINES = 20;
const GROUP_POLL_MS = 50;
/** How long terminate() waits, after SIGKILL, for the kernel to tear the group's processes down. */
const KILL_SETTLE_MS = 2_000;

interface Failure {
  code: string;
  message: string;
}

interface ExitInfo {
  code: number | null;
  signal: string | null;
}

interface Run {
  controller: AbortController;
  stateDir: string | null;
  attempt: number;
  failures: number;
  /** Epoch ms of failures, pruned to the parking window. */
  recentFailures: number[];
}

/** Process groups of engines that are running, by pgid (= the engine's pid). */
const liveGroups = new Map<number, string>();
const liveSupervisors = new Set<EngineSupervisor>();
/** State folders (absolute) of the runs active in this process; pruneRunFolders never deletes them. */
const activeStateDirs = new Set<string>();
let exitHookInstalled = false;

/**
 * SIGKILLs every engine process group still running. Synchronous, so it works inside a
 * `process.on("exit")` handler (installed automatically on the first spawn). Returns the
 * number of groups signalled.
 */
export function killAllSupervisedSync(): number {
  let signalled = 0;
  for (const pgid of liveGroups.keys()) {
    if (signalGroup(pgid, "SIGKILL")) signalled += 1;
  }
  liveGroups.clear();
  return signalled;
}

/** Stops every started supervisor (SIGTERM, grace, SIGKILL); call it from SIGINT/SIGTERM handlers. */
export async function stopAllSupervisors(): Promise<void> {
  await Promise.allSettled([...liveSupervisors].map((supervisor) => supervisor.stop()));
}

/** Pids (= process group ids) of the engines this process currently runs. */
export function liveEngineGroups(): number[] {
  return [...liveGroups.keys()];
}

function registerGroup(pgid: number, replicaId: string): void {
  liveGroups.set(pgid, replicaId);
  if (!exitHookInstalled) {
    exitHookInstalled = true;
    process.on("exit", () => {
      killAllSupervisedSync();
    });
  }
}

export class EngineSupervisor {
  private readonly options: SupervisorOptions;
  private readonly log: Logger;
  private readonly listeners = new Set<SupervisorListener>();
  private snap: SupervisorSnapshot;
  private run: Run | null = null;
  private loop: Promise<void> | null = null;
  private stopping: Promise<void> | null = null;
  private records: Promise<void> = Promise.resolve();

  constructor(options: SupervisorOptions) {
    this.options = options;
    this.log = (options.logger ?? silentLogger()).child({ replicaId: options.replicaId });
    this.snap = {
      replicaId: options.replicaId,
      state: "stopped",
      attempt: 0,
      failures: 0,
      lastError: null,
      lastErrorCode: null,
      lastExit: null,
      endpoint: null,
      startedAt: null,
      readyAt: null,
      retryAt: null,
      pid: null,
      stateDir: null,
    };
  }

  snapshot(): SupervisorSnapshot {
    return copySnapshot(this.snap);
  }

  /** Calls `listener` with a fresh snapshot on every state transition and every change of pid/endpoint. Returns the unsubscribe function. */
  onChange(listener: SupervisorListener): () => void {
    this.listeners.add(listener);
    return () => {
      this.listeners.delete(listener);
    };
  }

  /**
   * Starts a run: claims a new state folder and makes attempts until one is ready,
   * retrying failures with backoff until parked. Does nothing while a run is active
   * (starting, ready, failed, parked); throws a ConflictError while stopping.
   */
  start(): void {
    if (this.stopping) {
      throw new ConflictError(`The engine supervisor of replica ${this.options.replicaId} is stopping; await stop() before start().`, {
        code: "supervisor_stopping",
      });
    }
    if (this.run) return;
    this.beginRun();
  }

  /** Leaves the parked state: forgets the failures and starts a new run (new state folder). Returns false when not parked. */
  unpark(): boolean {
    if (this.snap.state !== "parked" || this.stopping) return false;
    if (this.run) releaseRun(this.run);
    this.run = null;
    this.loop = null;
    this.beginRun();
    return true;
  }

  /**
   * Stops the engine: SIGTERM to its process group, SIGKILL after the grace; resolves
   * when it is gone. Cancels a start in progress or a pending retry. Safe to call twice.
   */
  stop(): Promise<void> {
    if (this.stopping) return this.stopping;
    const run = this.run;
    if (!run) return Promise.resolve();
    this.stopping = (async () => {
      this.update({ state: "stopping", retryAt: null });
      run.controller.abort();
      await this.loop;
      releaseRun(run);
      this.run = null;
      this.loop = null;
      liveSupervisors.delete(this);
      this.update({ state: "stopped", pid: null, endpoint: null, retryAt: null, readyAt: null });
    })().finally(() => {
      this.stopping = null;
    });
    return this.stopping;
  }

  private beginRun(): void {
    const run: Run = { controller: new AbortController(), stateDir: null, attempt: 0, failures: 0, recentFailures: [] };
    this.run = run;
    liveSupervisors.add(this);
    this.update({ attempt: 0, failures: 0, lastError: null, lastErrorCode: null, stateDir: null, retryAt: null });
    this.loop = this.runLoop(run).catch((error: unknown) => {
      this.log.error({ err: error }, "engine supervisor loop ended by a fault");
    });
  }

  private async runLoop(run: Run): Promise<void> {
    const signal = run.controller.signal;
    const backoff = this.options.backoff ?? SUPERVISOR_DEFAULTS.backoff;
    const parkAfter = this.options.parkAfter ?? SUPERVISOR_DEFAULTS.parkAfter;
    while (!signal.aborted) {
      run.attempt += 1;
      this.update({ state: "starting", attempt: run.attempt, startedAt: null, readyAt: null, retryAt: null, pid: null, endpoint: null });
      let failure: Failure | null;
      try {
        failure = await this.runAttempt(run);
      } catch (error) {
        // A fault in the supervisor itself still counts as a failure, so it backs off and parks instead of spinning.
        this.log.error({ err: error }, "engine supervisor fault");
        failure = { code: "internal_error", message: `Engine supervisor fault on attempt ${run.attempt}: ${describeError(error)}` };
      }
      if (signal.aborted || failure === null) return;

      const now = Date.now();
      run.failures += 1;
      run.recentFailures = [...run.recentFailures.filter((at) => now - at < parkAfter.windowMs), now];
      const recent = run.recentFailures.length;
      if (recent >= parkAfter.failures) {
        const message =
          `Parked after ${recent} failures within ${formatSeconds(parkAfter.windowMs)} s (${run.failures} in this run); ` +
          `no more attempts until the replica is unparked or its model changes. Last failure: ${failure.message}`;
        this.log.error({ attempt: run.attempt, failures: run.failures, code: failure.code }, "engine parked");
        this.update({ state: "parked", failures: run.failures, lastError: message, lastErrorCode: failure.code, retryAt: null });
        return;
      }
      const delayMs = Math.min(backoff.maxMs, backoff.initialMs * 2 ** (recent - 1));
      this.log.warn({ attempt: run.attempt, code: failure.code, retryInMs: delayMs, error: failure.message }, "engine attempt failed");
      this.update({ state: "failed", failures: run.failures, lastError: failure.message, lastErrorCode: failure.code, retryAt: now + delayMs });
      await delay(delayMs, signal);
    }
  }

  /** One attempt, from preflight to the end of its process. Returns the failure, or null when stopped. */
  private async runAttempt(run: Run): Promise<Failure | null> {
    const signal = run.controller.signal;
    const attempt = run.attempt;

    if (run.stateDir === null) {
      try {
        run.stateDir = await claimStateDir(this.options.stateRoot, this.options.replicaId);
      } catch (error) {
        return {
          code: "state_dir_failed",
          message: `Could not create a state folder below ${this.options.stateRoot} for attempt ${attempt}: ${describeError(error)}. Check the agent's data dir is writable.`,
        };
      }
      this.update({ stateDir: run.stateDir });
      if (join(run.stateDir, "tmp").length > 60) {
        // Unix socket paths are limited to 107 bytes; engines (Ray under vLLM) put sockets
        // several levels below TMPDIR. The bundled engine makes none, so this is only a hint
        // for whoever reads a vLLM start failure, not a warning on every start.
        this.log.debug({ stateDir: run.stateDir }, "engine TMPDIR path is long; engines that create Unix sockets below it may fail");
      }
      if (signal.aborted) return null;
    }
    const stateDir = run.stateDir;
    const record = (entry: { settings: unknown; result: string; log: string | null; error?: string }): void => {
      this.appendAttemptRecord(stateDir, { attempt, ...entry, at: new Date().toISOString() });
    };

    if (this.options.preflight) {
      try {
        await this.options.preflight(signal);
      } catch (error) {
        if (signal.aborted) return null;
        const failure = { code: "preflight_failed", message: `Preflight check failed before attempt ${attempt}: ${describeError(error)}` };
        record({ settings: null, result: failure.code, log: null, error: failure.message });
        return failure;
      }
      if (signal.aborted) return null;
    }

    const host = this.options.host ?? SUPERVISOR_DEFAULTS.host;
    let launch: EngineLaunch;
    let env: Record<string, string>;
    try {
      const port = await findFreePort(host);
      launch = await this.options.prepare({ attempt, port, host, stateDir, signal });
    } catch (error) {
      if (signal.aborted) return null;
      const code = error instanceof LlmgwError ? error.code : "prepare_failed";
      const failure = { code, message: `Could not prepare attempt ${attempt}: ${describeError(error)}` };
      record({ settings: null, result: failure.code, log: null, error: failure.message });
      return failure;
    }
    const settings = launch.settings ?? { command: launch.command, args: redactArgs(launch.args), host: launch.host, port: launch.port };
    try {
      env = buildEngineEnv(stateDir, launch.env);
      await assertPortFree(launch.host, launch.port);
    } catch (error) {
      if (signal.aborted) return null;
      const code = error instanceof LlmgwError ? error.code : "prepare_failed";
      const failure = { code, message: `Attempt ${attempt} refused before start: ${describeError(error)}` };
      record({ settings, result: failure.code, log: null, error: failure.message });
      return failure;
    }
    if (signal.aborted) return null;

    const logName = `attempt-${attempt}.log`;
    const logPath = join(stateDir, logName);
    let logFile;
    try {
      logFile = await open(logPath, "wx");
    } catch (error) {
      const failure = { code: "state_dir_failed", message: `Could not create ${logPath}: ${describeError(error)}` };
      record({ settings, result: failure.code, log: null, error: failure.message });
      return failure;
    }
    let child;
    try {
      child = spawn(launch.command, launch.args, {
        cwd: stateDir,
        env,
        // Own process group (setsid), so signals to -pid reach everything the engine forks.
        detached: true,
        stdio: ["ignore", logFile.fd, logFile.fd],
      });
    } catch (error) {
      await logFile.close();
      const failure = { code: "spawn_failed", message: `Could not start the engine command '${launch.command}' on attempt ${attempt}: ${describeError(error)}` };
      record({ settings, result: failure.code, log: logName, error: failure.message });
      return failure;
    }
    let exit: ExitInfo | null = null;
    const exitController = new AbortController();
    const exited = new Promise<ExitInfo>((resolveExit) => {
      child.once("exit", (code, exitSignal) => {
        exit = { code, signal: exitSignal };
        exitController.abort();
        resolveExit(exit);
      });
    });
    const spawned = new Promise<Error | null>((resolveSpawn) => {
      child.once("spawn", () => resolveSpawn(null));
      child.once("error", (error) => resolveSpawn(error));
    });
    // The child holds its own copy of the descriptor from here on.
    await logFile.close();
    const spawnError = await spawned;
    child.on("error", (error) => this.log.warn({ err: error }, "engine process error"));
    const pid = child.pid;
    if (spawnError !== null || pid === undefined) {
      const failure = {
        code: "spawn_failed",
        message: `Could not start the engine command '${launch.command}' on attempt ${attempt}: ${describeError(spawnError)}. Check that the engine is installed and on PATH.`,
      };
      record({ settings, result: failure.code, log: logName, error: failure.message });
      return failure;
    }
    registerGroup(pid, this.options.replicaId);
    const endpoint = { host: launch.host, port: launch.port };
    this.update({ pid, endpoint, startedAt: Date.now() });
    this.log.info({ attempt, pid, host: launch.host, port: launch.port, stateDir }, "engine started");

    const url = `http://${formatHost(launch.host)}:${launch.port}${launch.healthPath}`;
    const healthTimeoutMs = this.options.healthTimeoutMs ?? SUPERVISOR_DEFAULTS.healthTimeoutMs;
    // A plain Agent: the health check must never go through HTTP(S)_PROXY from the agent's environment.
    const agent = new Agent({ connect: { timeout: healthTimeoutMs }, keepAliveTimeout: 5_000 });
    const describeExit = (): string => formatExit(exit);
    try {
      // Readiness: poll until 200, the process exits, the deadline passes or stop() is called.
      const readyTimeoutMs = this.options.readyTimeoutMs ?? SUPERVISOR_DEFAULTS.readyTimeoutMs;
      const deadline = new AbortController();
      const deadlineTimer = setTimeout(() => deadline.abort(), readyTimeoutMs);
      const readySignal = AbortSignal.any([signal, exitController.signal, deadline.signal]);
      let lastObservation = "no answer yet";
      let ready = false;
      let validationError: string | null = null;
      try {
        while (!readySignal.aborted) {
          const probe = await probeHealth(agent, url, healthTimeoutMs, readySignal);
          if (readySignal.aborted) break;
          if (probe.ok) {
            if (launch.validate) {
              try {
                await launch.validate({ host: launch.host, port: launch.port, signal: readySignal });
              } catch (error) {
                // Aborted by stop(), the engine's exit or the deadline: those paths below say why.
                if (readySignal.aborted) lastObservation = `HTTP 200, validation unfinished: ${describeError(error)}`;
                else validationError = describeError(error);
                break;
              }
            }
            ready = true;
            break;
          }
          lastObservation = probe.detail;
          await delay(this.options.healthIntervalMs ?? SUPERVISOR_DEFAULTS.healthIntervalMs, readySignal);
        }
      } finally {
        clearTimeout(deadlineTimer);
      }

      if (signal.aborted) {
        if (!ready) record({ settings, result: "stopped", log: logName });
        return null;
      }
      if (validationError !== null) {
        // Kill first, so the log tail includes whatever the engine printed on the way out.
        await this.terminate(pid, exited, () => exit !== null);
        const failure = {
          code: "validation_failed",
          message:
            `Engine answered ${url} with 200 on attempt ${attempt} but failed validation: ${asSentence(validationError)} ` +
            `Its process group was stopped (${describeExit()}). ${await logTail(logPath)}`,
        };
        record({ settings, result: failure.code, log: logName, error: failure.message });
        return failure;
      }
      if (!ready) {
        if (exit !== null) {
          const failure = {
            code: "engine_exited",
            message: `Engine exited before it was ready (${describeExit()}) on attempt ${attempt}. ${await logTail(logPath)}`,
          };
          record({ settings, result: failure.code, log: logName, error: failure.message });
          return failure;
        }
        // Kill first, so the log tail includes whatever the engine printed on the way out.
        await this.terminate(pid, exited, () => exit !== null);
        const failure = {
          code: "not_ready",
          message:
            `Engine was not ready within ${formatSeconds(readyTimeoutMs)} s on attempt ${attempt} (last health check of ${url}: ${lastObservation}); ` +
            `its process group was killed. Raise the readiness timeout if the model loads slowly. ${await logTail(logPath)}`,
        };
        record({ settings, result: failure.code, log: logName, error: failure.message });
        return failure;
      }

      record({ settings, result: "ready", log: logName });
      this.log.info({ attempt, pid, port: launch.port }, "engine ready");
      this.update({ state: "ready", readyAt: Date.now() });

      // Liveness: a process exit, or several failed health checks in a row, is a failure.
      const liveSignal = AbortSignal.any([signal, exitController.signal]);
      const livenessFailures = this.options.livenessFailures ?? SUPERVISOR_DEFAULTS.livenessFailures;
      let failedChecks = 0;
      while (!liveSignal.aborted) {
        await delay(this.options.livenessIntervalMs ?? SUPERVISOR_DEFAULTS.livenessIntervalMs, liveSignal);
        if (liveSignal.aborted) break;
        const probe = await probeHealth(agent, url, healthTimeoutMs, liveSignal);
        if (liveSignal.aborted) break;
        if (probe.ok) {
          failedChecks = 0;
          continue;
        }
        failedChecks += 1;
        if (failedChecks >= livenessFailures) {
          await this.terminate(pid, exited, () => exit !== null);
          return {
            code: "unhealthy",
            message:
              `Engine stopped answering its health check on attempt ${attempt}: ${failedChecks} checks of ${url} failed in a row ` +
              `(last: ${probe.detail}); its process group was killed (${describeExit()}).`,
          };
        }
      }
      if (signal.aborted) return null;
      return {
        code: "engine_exited",
        message: `Engine exited while serving (${describeExit()}) on attempt ${attempt}. ${await logTail(logPath)}`,
      };
    } finally {
      await this.terminate(pid, exited, () => exit !== null);
      await agent.destroy().catch(() => undefined);
      this.update({ pid: null, endpoint: null, lastExit: exit });
    }
  }

  /**
   * Ends the engine's process group: SIGTERM, then up to the grace for the engine and
   * everything it forked to exit, then SIGKILL. Resolves when the engine process is gone.
   * Also sweeps up members left behind by an engine that already exited on its own.
   */
  private async terminate(pgid: number, exited: Promise<ExitInfo>, hasExited: () => boolean): Promise<void> {
    if (!liveGroups.has(pgid)) return;
    const alive = (): boolean => !hasExited() || groupHasLiveMembers(pgid);
    if (alive()) {
      const graceMs = this.options.stopGraceMs ?? SUPERVISOR_DEFAULTS.stopGraceMs;
      signalGroup(pgid, "SIGTERM");
      const deadline = Date.now() + graceMs;
      while (alive() && Date.now() < deadline) {
        const wait = Math.min(GROUP_POLL_MS, deadline - Date.now());
        if (hasExited()) await sleep(wait);
        else await raceTimeout(exited, wait);
      }
      if (alive()) {
        this.log.warn({ pid: pgid, graceMs }, "engine did not stop within the grace; sending SIGKILL to its process group");
        signalGroup(pgid, "SIGKILL");
      }
    }
    // SIGKILL cannot be ignored; the wait is only as long as the kernel takes to tear the
    // processes down. Members other than the engine are not our children, so their end is
    // polled (bounded): a caller that is told "stopped" may reuse the port or the GPU at once.
    await exited;
    const settleDeadline = Date.now() + KILL_SETTLE_MS;
    while (groupHasLiveMembers(pgid) && Date.now() < settleDeadline) await sleep(GROUP_POLL_MS);
    liveGroups.delete(pgid);
  }

  /** Appends one line to attempts.jsonl without ever making start or stop wait for it or fail on it. */
  private appendAttemptRecord(stateDir: string, entry: Record<string, unknown>): void {
    const line = `${JSON.stringify(entry)}\n`;
    this.records = this.records
      .then(() => appendFile(join(stateDir, "attempts.jsonl"), line))
      .catch((error: unknown) => {
        this.log.warn({ err: error, stateDir }, "could not append to attempts.jsonl");
      });
  }

  private update(patch: Partial<SupervisorSnapshot>): void {
    let changed = false;
    for (const [key, value] of Object.entries(patch) as [keyof SupervisorSnapshot, unknown][]) {
      if (!sameValue(this.snap[key], value)) changed = true;
    }
    if (!changed) return;
    this.snap = { ...this.snap, ...patch };
    for (const listener of [...this.listeners]) {
      try {
        listener(copySnapshot(this.snap));
      } catch (error) {
        this.log.error({ err: error }, "engine supervisor change listener threw");
      }
    }
  }
}

/** Builds the engine's environment from scratch; throws when the launch points a state path outside the state folder. */
export function buildEngineEnv(stateDir: string, launchEnv: Record<string, string>): Record<string, string> {
  const home = join(stateDir, "home");
  const tmp = join(stateDir, "tmp");
  const cache = join(stateDir, "cache");
  const env: Record<string, string> = {};
  for (const name of INHERITED_ENV) {
    const value = process.env[name];
    if (value !== undefined) env[name] = value;
  }
  env.PATH ??= "/usr/local/bin:/usr/bin:/bin";
  Object.assign(env, {
    HOME: home,
    TMPDIR: tmp,
    TMP: tmp,
    TEMP: tmp,
    XDG_CACHE_HOME: cache,
    XDG_CONFIG_HOME: join(home, ".config"),
    XDG_DATA_HOME: join(home, ".local", "share"),
    XDG_STATE_HOME: join(home, ".local", "state"),
    HF_HOME: join(cache, "huggingface"),
    VLLM_CACHE_ROOT: join(cache, "vllm"),
    TRITON_CACHE_DIR: join(cache, "triton"),
    TORCHINDUCTOR_CACHE_DIR: join(cache, "torchinductor"),
    CUDA_CACHE_PATH: join(cache, "nv"),
  });
  for (const [name, value] of Object.entries(launchEnv)) {
    if (STATE_PATH_VARS.has(name)) {
      const target = resolve(stateDir, value);
      const rel = relative(stateDir, target);
      if (rel.startsWith("..") || isAbsolute(rel)) {
        throw new LlmgwError({
          code: "cache_path_outside_state",
          status: 500,
          message: `${name}=${value} points outside the run's state folder ${stateDir}; engines may write only below it. Remove ${name} from the engine's settings.`,
        });
      }
    }
    env[name] = value;
  }
  return Object.assign(env, OFFLINE_ENV);
}

/** A run folder's name: `<replica id, made safe>-<creation time, base 36 ms>-<6 hex>` (see claimStateDir). */
const RUN_FOLDER_NAME = /^[A-Za-z0-9._-]{1,24}-([0-9a-z]{1,11})-[0-9a-f]{6}$/;

export const DEFAULT_RUN_FOLDERS_KEPT = 20;

export interface PruneRunFoldersOptions {
  /** The supervisors' `stateRoot`. A root that does not exist has nothing to prune. */
  stateRoot: string;
  /** How many of the newest run folders to keep, whatever their replica. Default 20. */
  keep?: number;
  /** Further folders never to delete: absolute paths, or names below stateRoot. */
  protect?: ReadonlySet<string>;
  logger?: Logger;
}

export interface PruneRunFoldersResult {
  /** Absolute paths of the folders deleted. */
  removed: string[];
  /** Run folders left in place (the newest `keep`, the protected and the active ones). */
  kept: number;
  /** Folders that could not be deleted, with the reason (also logged). */
  failed: Array<{ path: string; error: string }>;
}

/**
 * Deletes the oldest run folders below `stateRoot` beyond the newest `keep`. Every run
 * (start() or unpark()) claims a new folder and keeps it afterwards, for its attempt logs,
 * so without pruning they accumulate forever. Only entries named like a run folder that
 * are real folders (not symlinks) are considered; age comes from the creation time in the
 * name. Folders of runs active in this process (starting, ready, failed or parked; from
 * claim until stop() or unpark()) and those in `protect` are never deleted. Meant to be
 * called when an agent starts; safe to call at any time.
 */
export async function pruneRunFolders(options: PruneRunFoldersOptions): Promise<PruneRunFoldersResult> {
  const keep = options.keep ?? DEFAULT_RUN_FOLDERS_KEPT;
  if (!Number.isInteger(keep) || keep < 0) {
    throw new LlmgwError({ code: "invalid_keep", status: 500, message: `pruneRunFolders: keep must be a whole number of at least 0, got ${keep}.` });
  }
  const root = resolve(options.stateRoot);
  const log = options.logger ?? silentLogger();
  const protect = new Set([...(options.protect ?? [])].map((entry) => resolve(root, entry)));
  let names: string[];
  try {
    names = await readdir(root);
  } catch (error) {
    if (errorCode(error) === "ENOENT") return { removed: [], kept: 0, failed: [] };
    throw error;
  }
  const folders: Array<{ path: string; createdAt: number }> = [];
  for (const name of names) {
    const match = RUN_FOLDER_NAME.exec(name);
    if (!match) continue;
    const path = join(root, name);
    try {
      if (!(await lstat(path)).isDirectory()) continue;
    } catch {
      continue;
    }
    folders.push({ path, createdAt: parseInt(match[1] as string, 36) });
  }
  // Newest first; equal times (same millisecond) in a fixed order.
  folders.sort((a, b) => b.createdAt - a.createdAt || (a.path < b.path ? 1 : -1));
  const result: PruneRunFoldersResult = { removed: [], kept: 0, failed: [] };
  for (const [index, folder] of folders.entries()) {
    // Checked right before each deletion: a run may have claimed a folder meanwhile.
    if (index < keep || protect.has(folder.path) || activeStateDirs.has(folder.path)) {
      result.kept += 1;
      continue;
    }
    try {
      await rm(folder.path, { recursive: true, force: true });
      result.removed.push(folder.path);
    } catch (error) {
      log.warn({ err: error, path: folder.path }, "could not delete an old engine run folder");
      result.failed.push({ path: folder.path, error: describeError(error) });
    }
  }
  if (result.removed.length > 0) log.info({ stateRoot: root, removed: result.removed.length, kept: result.kept }, "deleted old engine run folders");
  return result;
}

export interface OpenAiModelsValidatorOptions {
  /** The engine key this attempt gave the engine; sent as `Authorization: Bearer`. Never printed. */
  key: string;
  /** The model id the engine must list (llmgw engine's --model-name, vLLM's --served-model-name). */
  expectedModel: string;
  /** Path of the model list. Default "/v1/models". */
  path?: string;
  /** Deadline of the whole request (connect, headers, body). Default 5 000 ms. */
  timeoutMs?: number;
}

/** A model list is a few hundred bytes; anything far larger is not the engine we started. */
const MODEL_LIST_MAX_BYTES = 1024 * 1024;

/**
 * A validator for OpenAI-compatible engines (llmgw engine, llama-server, vLLM): GET
 * /v1/models with the attempt's engine key must answer 200 with a `data[].id` list that
 * includes the expected model. It catches what a health check cannot: a foreign server on
 * a reused port (no such route, or no key check), an engine started with another key
 * (401), or one serving another model. Plain undici with its own Agent, so no proxy from
 * the environment is ever used.
 */
export function openAiModelsValidator(options: OpenAiModelsValidatorOptions): EngineValidator {
  const path = options.path ?? "/v1/models";
  const timeoutMs = options.timeoutMs ?? 5_000;
  // A server that echoes what it received must not put the key into lastError.
  const redact = (text: string): string => (options.key === "" ? text : text.split(options.key).join("[redacted]"));
  const fail = (message: string): LlmgwError => new LlmgwError({ code: "validation_failed", status: 502, message: redact(message) });
  return async ({ host, port, signal }) => {
    const url = `http://${formatHost(host)}:${port}${path}`;
    const agent = new Agent({ connect: { timeout: timeoutMs } });
    const timeout = new AbortController();
    const timer = setTimeout(() => timeout.abort(), timeoutMs);
    try {
      let response;
      try {
        response = await request(url, {
          method: "GET",
          dispatcher: agent,
          headers: { authorization: `Bearer ${options.key}`, accept: "application/json" },
          headersTimeout: timeoutMs,
          bodyTimeout: timeoutMs,
          signal: AbortSignal.any([signal, timeout.signal]),
        });
      } catch (error) {
        const why = timeout.signal.aborted ? `no answer within ${timeoutMs} ms` : (errorCode(error) ?? describeError(error));
        throw fail(`GET ${url} failed (${why}); the engine did not answer its model list.`);
      }
      const chunks: Buffer[] = [];
      let size = 0;
      try {
        for await (const chunk of response.body as AsyncIterable<Buffer>) {
          size += chunk.length;
          if (size > MODEL_LIST_MAX_BYTES) {
            response.body.destroy();
            throw fail(`GET ${url} answered more than ${MODEL_LIST_MAX_BYTES} bytes; that is not a model list, so the server on port ${port} is not the engine this attempt started.`);
          }
          chunks.push(chunk);
        }
      } catch (error) {
        if (error instanceof LlmgwError) throw error;
        throw fail(`GET ${url} failed while reading the answer (${errorCode(error) ?? describeError(error)}).`);
      }
      const text = Buffer.concat(chunks).toString("utf8");
      const status = response.statusCode;
      if (status === 401 || status === 403) {
        throw fail(
          `GET ${url} refused this attempt's engine key (HTTP ${status}): the server on port ${port} was started with another key or is not the engine this attempt started.`,
        );
      }
      if (status !== 200) {
        throw fail(`GET ${url} answered HTTP ${status} instead of a model list (${printable(redact(text)) || "empty body"}); the server on port ${port} is not the engine this attempt started, or is not serving yet.`);
      }
      let ids: string[];
      try {
        const body = JSON.parse(text) as { data?: unknown };
        if (!Array.isArray(body.data)) throw new Error("no data array");
        ids = body.data.flatMap((entry: unknown) =>
          typeof entry === "object" && entry !== null && typeof (entry as { id?: unknown }).id === "string" ? [(entry as { id: string }).id] : [],
        );
      } catch {
        throw fail(`GET ${url} answered 200 but not with an OpenAI model list ({"data":[{"id":...}]}): ${printable(redact(text)) || "empty body"}.`);
      }
      if (!ids.includes(options.expectedModel)) {
        const found = ids.length === 0 ? "no models" : ids.map((id) => `'${printable(id)}'`).join(", ");
        throw fail(`GET ${url} lists ${found}, not the expected '${printable(options.expectedModel)}': the engine on port ${port} serves another model.`);
      }
    } finally {
      clearTimeout(timer);
      await agent.destroy().catch(() => undefined);
    }
  };
}

async function claimStateDir(stateRoot: string, replicaId: string): Promise<string> {
  const root = resolve(stateRoot);
  await mkdir(root, { recursive: true, mode: 0o700 });
  // Short names: TMPDIR lives below and Unix socket paths are limited to 107 bytes.
  const safeId = replicaId.replace(/[^A-Za-z0-9._-]/g, "_").slice(0, 24) || "replica";
  for (let tries = 0; tries < 8; tries += 1) {
    const dir = join(root, `${safeId}-${Date.now().toString(36)}-${randomBytes(3).toString("hex")}`);
    try {
      // Not recursive: an existing folder (or a symlink planted under that name) must fail, never be reused.
      await mkdir(dir, { mode: 0o700 });
    } catch (error) {
      if (errorCode(error) === "EEXIST") continue;
      throw error;
    }
    // Registered at once, so a concurrent pruneRunFolders cannot take it while it is set up.
    activeStateDirs.add(dir);
    try {
      for (const sub of ["home", "tmp", "cache"]) await mkdir(join(dir, sub), { mode: 0o700 });
    } catch (error) {
      activeStateDirs.delete(dir);
      throw error;
    }
    return dir;
  }
  throw new Error(`no unused folder name found below ${root}`);
}

type Probe = { ok: true } | { ok: false; detail: string };

async function probeHealth(agent: Agent, url: string, timeoutMs: number, signal: AbortSignal): Promise<Probe> {
  try {
    const response = await request(url, { method: "GET", dispatcher: agent, headersTimeout: timeoutMs, bodyTimeout: timeoutMs, signal });
    await response.body.dump();
    if (response.statusCode === 200) return { ok: true };
    return { ok: false, detail: `HTTP ${response.statusCode}` };
  } catch (error) {
    const code = errorCode(error);
    if (code === "ECONNREFUSED") return { ok: false, detail: "connection refused" };
    if (code === "UND_ERR_HEADERS_TIMEOUT" || code === "UND_ERR_CONNECT_TIMEOUT") return { ok: false, detail: `no answer within ${timeoutMs} ms` };
    return { ok: false, detail: code ? `${code}: ${describeError(error)}` : describeError(error) };
  }
}

/** The last lines of an attempt log, as a sentence for lastError. */
async function logTail(logPath: string): Promise<string> {
  try {
    const file = await open(logPath, "r");
    try {
      const { size } = await file.stat();
      const length = Math.min(size, LOG_TAIL_BYTES);
      const buffer = Buffer.alloc(length);
      await file.read(buffer, 0, length, size - length);
      const lines = buffer.toString("utf8").split(/\r?\n/).filter((line) => line.trim() !== "");
      // The first line may be cut in the middle when the tail starts inside it.
      if (size > length) lines.shift();
      const tail = lines.slice(-LOG_TAIL_LINES);
      if (tail.length === 0) return `Its log ${logPath} is empty.`;
      return `Last lines of ${logPath}:\n${tail.join("\n")}`;
    } finally {
      await file.close();
    }
  } catch (error) {
    return `Its log ${logPath} could not be read: ${describeError(error)}.`;
  }
}

/** True when some process of the group is alive. Zombies do not count: in containers PID 1 may never reap orphans. */
function groupHasLiveMembers(pgid: number): boolean {
  try {
    process.kill(-pgid, 0);
  } catch {
    return false;
  }
  if (process.platform !== "linux") return true;
  let entries: string[];
  try {
    entries = readdirSync("/proc");
  } catch {
    return true;
  }
  for (const entry of entries) {
    if (!/^\d+$/.test(entry)) continue;
    let stat: string;
    try {
      stat = readFileSync(`/proc/${entry}/stat`, "utf8");
    } catch {
      continue;
    }
    // Fields after "(comm)": state ppid pgrp ...; comm may itself contain spaces and parentheses.
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    if (Number(fields[2]) === pgid && fields[0] !== "Z" && fields[0] !== "X") return true;
  }
  return false;
}

function signalGroup(pgid: number, signal: NodeJS.Signals): boolean {
  try {
    process.kill(-pgid, signal);
    return true;
  } catch {
    // ESRCH: the group is already gone.
    return false;
  }
}

function redactArgs(args: string[]): string[] {
  const out: string[] = [];
  for (let i = 0; i < args.length; i += 1) {
    const arg = args[i] as string;
    const equals = arg.indexOf("=");
    const flag = equals === -1 ? arg : arg.slice(0, equals);
    if (!arg.startsWith("-") || !SECRET_FLAG.test(flag)) {
      out.push(arg);
    } else if (equals !== -1) {
      out.push(`${flag}=[redacted]`);
    } else {
      out.push(arg);
      if (i + 1 < args.length) {
        out.push("[redacted]");
        i += 1;
      }
    }
  }
  return out;
}

function delay(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolveDelay) => {
    if (signal.aborted) return resolveDelay();
    const done = (): void => {
      clearTimeout(timer);
      signal.removeEventListener("abort", done);
      resolveDelay();
    };
    const timer = setTimeout(done, ms);
    signal.addEventListener("abort", done, { once: true });
  });
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolveSleep) => setTimeout(resolveSleep, ms));
}

async function raceTimeout<T>(promise: Promise<T>, ms: number): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  try {
    await Promise.race([promise, new Promise<void>((resolveTimer) => (timer = setTimeout(resolveTimer, ms)))]);
  } finally {
    clearTimeout(timer);
  }
}

function formatExit(exit: ExitInfo | null): string {
  if (exit === null) return "still running";
  if (exit.code !== null) return `exit code ${exit.code}`;
  return `killed by signal ${exit.signal ?? "unknown"}`;
}

function formatSeconds(ms: number): string {
  return String(Number((ms / 1000).toFixed(3)));
}

/** A thrown message as a sentence that can be followed by another one. */
function asSentence(text: string): string {
  const trimmed = text.trim();
  return /[.!?]$/.test(trimmed) ? trimmed : `${trimmed}.`;
}

function releaseRun(run: Run): void {
  if (run.stateDir !== null) activeStateDirs.delete(run.stateDir);
}

function copySnapshot(snapshot: SupervisorSnapshot): SupervisorSnapshot {
  return {
    ...snapshot,
    endpoint: snapshot.endpoint ? { ...snapshot.endpoint } : null,
    lastExit: snapshot.lastExit ? { ...snapshot.lastExit } : null,
  };
}

function sameValue(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (typeof a !== "object" || typeof b !== "object" || a === null || b === null) return false;
  return JSON.stringify(a) === JSON.stringify(b);
}
