// One attempt to run an engine, from its preflight to the end of its process: preflight
// (are the weights usable), prepare (the engine adapter's command line, on a free port),
// the sandboxed environment, the port checked free again right before the spawn, the
// spawn in its own process group with output to `attempt-N.log`, readiness and the
// launch's validation within the attempt's deadline, then liveness while it serves. It
// returns why it failed (a stable code and a message with the exit and the log's last
// lines), or null when stop() ended it; every way out leaves the engine's process group
// terminated and one line in attempts.jsonl. Retrying, backoff and parking are the
// supervisor's (engine-supervisor.ts).
import { join } from "node:path";
import { Agent } from "undici";
import { LlmgwError, describeError, errorCode } from "../core/errors.ts";
import { formatHost } from "../core/format.ts";
import type { Logger } from "../core/log.ts";
import { createAttemptLog, logTail, recordedSettings, type AttemptLogFile, type AttemptRecorder } from "./attempt-log.ts";
import { awaitReadiness, watchLiveness, type HealthTarget, type Readiness } from "./engine-health.ts";
import { buildEngineEnv } from "./engine-env.ts";
import { assertPortFree, findFreePort } from "./free-port.ts";
import { spawnGroupLeader, terminateGroup, type ExitInfo, type GroupLeader } from "./process-groups.ts";
import {
  SUPERVISOR_DEFAULTS,
  type AttemptFailure,
  type EngineLaunch,
  type PreflightNotes,
  type SupervisorOptions,
  type SupervisorSnapshot,
} from "./supervisor-options.ts";

export interface AttemptInput {
  options: SupervisorOptions;
  /** 1-based attempt number within the run. */
  attempt: number;
  /** The run's state folder, already claimed. */
  stateDir: string;
  /** The run's signal: aborted by stop(). */
  signal: AbortSignal;
  recorder: AttemptRecorder;
  log: Logger;
  /** Tells the supervisor what changed: pid, endpoint and times, "ready", and the exit at the end. */
  report: (patch: Partial<SupervisorSnapshot>) => void;
  /** What the preflight waits for meanwhile (not a failure): shown in the snapshot. */
  notes: PreflightNotes;
}

/** Runs one attempt to its end. Returns the failure, or null when stopped. */
export async function runAttempt(input: AttemptInput): Promise<AttemptFailure | null> {
  const { options, attempt, stateDir, signal } = input;
  const record = (entry: { settings: unknown; result: string; log: string | null; error?: string }): void => {
    input.recorder.append(stateDir, { attempt, ...entry });
  };
  const fail = (failure: AttemptFailure, settings: unknown, log: string | null): AttemptFailure => {
    record({ settings, result: failure.code, log, error: failure.message });
    return failure;
  };

  if (options.preflight) {
    try {
      await options.preflight(signal, input.notes);
    } catch (error) {
      if (signal.aborted) return null;
      return fail({ code: "preflight_failed", message: `Preflight check failed before attempt ${attempt}: ${describeError(error)}` }, null, null);
    }
    if (signal.aborted) return null;
  }

  const host = options.host ?? SUPERVISOR_DEFAULTS.host;
  let launch: EngineLaunch;
  try {
    const port = await findFreePort(host);
    launch = await options.prepare({ attempt, port, host, stateDir, signal });
  } catch (error) {
    if (signal.aborted) return null;
    const code = error instanceof LlmgwError ? error.code : "prepare_failed";
    return fail({ code, message: `Could not prepare attempt ${attempt}: ${describeError(error)}` }, null, null);
  }
  const settings = recordedSettings(launch);
  let env: Record<string, string>;
  try {
    env = buildEngineEnv(stateDir, launch.env);
    await assertPortFree(launch.host, launch.port);
  } catch (error) {
    if (signal.aborted) return null;
    const code = error instanceof LlmgwError ? error.code : "prepare_failed";
    return fail({ code, message: `Attempt ${attempt} refused before start: ${describeError(error)}` }, settings, null);
  }
  if (signal.aborted) return null;

  let logFile: AttemptLogFile;
  try {
    logFile = await createAttemptLog(stateDir, attempt);
  } catch (error) {
    return fail({ code: "state_dir_failed", message: `Could not create ${join(stateDir, `attempt-${attempt}.log`)}: ${describeError(error)}` }, settings, null);
  }
  let engine: GroupLeader;
  try {
    engine = await spawnGroupLeader({
      command: launch.command,
      args: launch.args,
      cwd: stateDir,
      env,
      output: logFile.handle,
      replicaId: options.replicaId,
      log: input.log,
    });
  } catch (error) {
    const code = errorCode(error);
    const hint = code === "ENOENT" || code === "EACCES" ? " Check that the engine is installed and on PATH." : "";
    return fail(
      {
        code: "spawn_failed",
        message: `Could not start the engine command '${launch.command}' on attempt ${attempt}: ${asSentence(describeError(error))}${hint}`,
      },
      settings,
      logFile.name,
    );
  }
  input.report({ pid: engine.pid, endpoint: { host: launch.host, port: launch.port }, startedAt: Date.now() });
  input.log.info({ attempt, pid: engine.pid, host: launch.host, port: launch.port, stateDir }, "engine started");

  const healthTimeoutMs = options.healthTimeoutMs ?? SUPERVISOR_DEFAULTS.healthTimeoutMs;
  const target: HealthTarget = {
    // A plain Agent: the health check must never go through HTTP(S)_PROXY from the agent's environment.
    agent: new Agent({ connect: { timeout: healthTimeoutMs }, keepAliveTimeout: 5_000 }),
    url: `http://${formatHost(launch.host)}:${launch.port}${launch.healthPath}`,
    timeoutMs: healthTimeoutMs,
  };
  const terminate = (): Promise<void> => terminateGroup(engine, { graceMs: options.stopGraceMs ?? SUPERVISOR_DEFAULTS.stopGraceMs, log: input.log });
  try {
    const outcome = await awaitReady({ input, launch, engine, target, logFile, terminate });
    if (outcome === "stopped") {
      record({ settings, result: "stopped", log: logFile.name });
      return null;
    }
    if (outcome !== "ready") return fail(outcome, settings, logFile.name);
    // Recorded before the state changes, so whoever sees "ready" finds its record queued.
    record({ settings, result: "ready", log: logFile.name });
    input.log.info({ attempt, pid: engine.pid, port: launch.port }, "engine ready");
    input.report({ state: "ready", readyAt: Date.now() });
    return await superviseLiveness({ input, engine, target, logFile, terminate });
  } finally {
    await terminate();
    await target.agent.destroy().catch(() => undefined);
    input.report({ pid: null, endpoint: null, lastExit: engine.exit() });
  }
}

interface Running {
  input: AttemptInput;
  engine: GroupLeader;
  target: HealthTarget;
  logFile: AttemptLogFile;
  terminate: () => Promise<void>;
}

/**
 * From the spawn to "ready": readiness and validation within the attempt's deadline.
 * Returns "ready", "stopped" when stop() came first, or the failure, with the process
 * group already killed so the log tail has the engine's last words.
 */
async function awaitReady(running: Running & { launch: EngineLaunch }): Promise<AttemptFailure | "stopped" | "ready"> {
  const { input, launch, engine, target, logFile } = running;
  const { options, attempt, signal } = input;
  const readyTimeoutMs = options.readyTimeoutMs ?? SUPERVISOR_DEFAULTS.readyTimeoutMs;
  const validate = launch.validate;
  // Not AbortSignal.timeout: its timer would outlive a stopped attempt.
  const deadline = new AbortController();
  const deadlineTimer = setTimeout(() => deadline.abort(), readyTimeoutMs);
  let readiness: Readiness;
  try {
    readiness = await awaitReadiness({
      target,
      intervalMs: options.healthIntervalMs ?? SUPERVISOR_DEFAULTS.healthIntervalMs,
      signal: AbortSignal.any([signal, engine.exitSignal, deadline.signal]),
      validate: validate && ((readySignal) => validate({ host: launch.host, port: launch.port, signal: readySignal })),
    });
  } finally {
    clearTimeout(deadlineTimer);
  }
  if (signal.aborted) return "stopped";
  if (readiness.ready) return "ready";
  if (readiness.validationError !== null) {
    // Kill first, so the log tail includes whatever the engine printed on the way out.
    await running.terminate();
    return {
      code: "validation_failed",
      message:
        `Engine answered ${target.url} with 200 on attempt ${attempt} but failed validation: ${asSentence(readiness.validationError)} ` +
        `Its process group was stopped (${formatExit(engine.exit())}). ${await logTail(logFile.path)}`,
    };
  }
  if (engine.exit() !== null) {
    return {
      code: "engine_exited",
      message: `Engine exited before it was ready (${formatExit(engine.exit())}) on attempt ${attempt}. ${await logTail(logFile.path)}`,
    };
  }
  await running.terminate();
  return {
    code: "not_ready",
    message:
      `Engine was not ready within ${formatSeconds(readyTimeoutMs)} s on attempt ${attempt} (last health check of ${target.url}: ${readiness.lastObservation}); ` +
      `its process group was killed. Raise the readiness timeout if the model loads slowly. ${await logTail(logFile.path)}`,
  };
}

/** While ready: a process exit, or several failed health checks in a row, is a failure. Returns null when stop() ends it. */
async function superviseLiveness(running: Running): Promise<AttemptFailure | null> {
  const { input, engine, target, logFile } = running;
  const { options, attempt, signal } = input;
  const unhealthy = await watchLiveness({
    target,
    intervalMs: options.livenessIntervalMs ?? SUPERVISOR_DEFAULTS.livenessIntervalMs,
    failuresInARow: options.livenessFailures ?? SUPERVISOR_DEFAULTS.livenessFailures,
    signal: AbortSignal.any([signal, engine.exitSignal]),
  });
  if (unhealthy !== null) {
    await running.terminate();
    return {
      code: "unhealthy",
      message:
        `Engine stopped answering its health check on attempt ${attempt}: ${unhealthy.failedChecks} checks of ${target.url} failed in a row ` +
        `(last: ${unhealthy.detail}); its process group was killed (${formatExit(engine.exit())}).`,
    };
  }
  if (signal.aborted) return null;
  return {
    code: "engine_exited",
    message: `Engine exited while serving (${formatExit(engine.exit())}) on attempt ${attempt}. ${await logTail(logFile.path)}`,
  };
}

/** Milliseconds as seconds for a message: 1500 → "1.5". */
export function formatSeconds(ms: number): string {
  return String(Number((ms / 1000).toFixed(3)));
}

function formatExit(exit: ExitInfo | null): string {
  if (exit === null) return "still running";
  if (exit.code !== null) return `exit code ${exit.code}`;
  return `killed by signal ${exit.signal ?? "unknown"}`;
}

/** A thrown message as a sentence that can be followed by another one. */
function asSentence(text: string): string {
  const trimmed = text.trim();
  return /[.!?]$/.test(trimmed) ? trimmed : `${trimmed}.`;
}
