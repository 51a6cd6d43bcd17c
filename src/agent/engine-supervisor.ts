// The engine supervisor: owns ONE replica's engine from start() to stop(), as the state
// machine of DESIGN.md "Engine supervision (agent)" and "Replica lifecycle":
//
//   stopped → starting (attempt n) → ready → stopping → stopped
//                 ↓ a failure                ↑ stop() from any state
//               failed → (backoff) → starting (attempt n+1)
//                 ↓ too many failures within a window
//               parked: no more attempts until unpark()
//
// It is engine-agnostic: a `prepare` callback (one per engine, in src/engines/) turns an
// attempt into a command line, and the rest is the same for every engine. Each run
// (start() or unpark()) claims a new run folder (run-folders.ts); each attempt
// (engine-attempt.ts) runs the engine in its own process group (process-groups.ts) in a
// sandboxed offline environment (engine-env.ts), waits for readiness and validation
// (engine-health.ts) and leaves its log and record (attempt-log.ts). This file decides
// what happens between attempts: retry with exponential backoff, park after too many
// failures (peers without that protection loop or stay failed forever: llama-swap #92),
// and report every change as a snapshot to its listeners. A preflight that waits for
// something that is not the engine's fault (weights no server can send now) is shown in
// lastError meanwhile and counts as no failure (PreflightNotes).
//
// How a hosting process (`llmgw agent`, `llmgw up`) must use it: on SIGINT/SIGTERM call
// `await stopAllSupervisors()` and then exit; at start, `pruneRunFolders({ stateRoot })`.
// Both are re-exported here from where they live.
import { backoffDelay } from "../core/backoff.ts";
import { countOf } from "../core/format.ts";
import { ConflictError, describeError } from "../core/errors.ts";
import { silentLogger, type Logger } from "../core/log.ts";
import { AttemptRecorder } from "./attempt-log.ts";
import { formatSeconds, runAttempt } from "./engine-attempt.ts";
import { abortableDelay } from "./engine-health.ts";
import { trackSupervisor, untrackSupervisor } from "./process-groups.ts";
import { claimRunFolder, releaseRunFolder } from "./run-folders.ts";
import {
  SUPERVISOR_DEFAULTS,
  type AttemptFailure,
  type SupervisorListener,
  type SupervisorOptions,
  type SupervisorSnapshot,
  type WaitingNote,
} from "./supervisor-options.ts";

// For hosting processes (src/cli/run-server.ts) and the users of the supervisor's types.
export { killAllSupervisedSync, stopAllSupervisors } from "./process-groups.ts";
export { pruneRunFolders } from "./run-folders.ts";
export type * from "./supervisor-options.ts";

interface Run {
  controller: AbortController;
  stateDir: string | null;
  attempt: number;
  failures: number;
  /** Epoch ms of failures, pruned to the parking window. */
  recentFailures: number[];
}

export class EngineSupervisor {
  private readonly options: SupervisorOptions;
  private readonly log: Logger;
  private readonly listeners = new Set<SupervisorListener>();
  private readonly recorder: AttemptRecorder;
  private snap: SupervisorSnapshot;
  private run: Run | null = null;
  private loop: Promise<void> | null = null;
  private stopping: Promise<void> | null = null;
  /** lastError and its code from before the preflight began to wait, restored when it stops waiting. */
  private beforeWaiting: Pick<SupervisorSnapshot, "lastError" | "lastErrorCode"> | null = null;

  constructor(options: SupervisorOptions) {
    this.options = options;
    this.log = (options.logger ?? silentLogger()).child({ replicaId: options.replicaId });
    this.recorder = new AttemptRecorder(this.log);
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
    if (this.stopping !== null) {
      throw new ConflictError(`The engine supervisor of replica ${this.options.replicaId} is stopping; await stop() before start().`, {
        code: "supervisor_stopping",
      });
    }
    if (this.run) return;
    this.beginRun();
  }

  /** Leaves the parked state: forgets the failures and starts a new run (new state folder). Returns false when not parked. */
  unpark(): boolean {
    if (this.snap.state !== "parked" || this.stopping !== null) return false;
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
    if (this.stopping !== null) return this.stopping;
    const run = this.run;
    if (!run) return Promise.resolve();
    this.stopping = (async () => {
      this.update({ state: "stopping", retryAt: null });
      run.controller.abort();
      await this.loop;
      releaseRun(run);
      this.run = null;
      this.loop = null;
      untrackSupervisor(this);
      this.update({ state: "stopped", pid: null, endpoint: null, retryAt: null, readyAt: null });
    })().finally(() => {
      this.stopping = null;
    });
    return this.stopping;
  }

  /**
   * Resolves once this supervisor makes no further attempt by itself: its run parked, or
   * was stopped (at once when no run is active). A ready run keeps supervising its engine,
   * so this waits until that run parks or stops. What happens next is up to start(),
   * unpark() or stop().
   */
  settled(): Promise<void> {
    return this.loop ?? Promise.resolve();
  }

  /** Resolves once every attempts.jsonl line of the attempts so far is written (or its failure logged). */
  flushAttemptRecords(): Promise<void> {
    return this.recorder.flush();
  }

  private beginRun(): void {
    const run: Run = { controller: new AbortController(), stateDir: null, attempt: 0, failures: 0, recentFailures: [] };
    this.run = run;
    trackSupervisor(this);
    this.update({ attempt: 0, failures: 0, lastError: null, lastErrorCode: null, stateDir: null, retryAt: null });
    this.loop = this.runLoop(run).catch((error: unknown) => {
      this.log.error({ err: error }, "engine supervisor loop ended by a fault");
    });
  }

  /** Attempts until one is ready and then supervises it; after a failure, backs off and tries again, or parks. Returns when parked or stopped. */
  private async runLoop(run: Run): Promise<void> {
    const signal = run.controller.signal;
    const backoff = this.options.backoff ?? SUPERVISOR_DEFAULTS.backoff;
    const parkAfter = this.options.parkAfter ?? SUPERVISOR_DEFAULTS.parkAfter;
    while (!signal.aborted) {
      run.attempt += 1;
      this.beforeWaiting = null;
      this.update({ state: "starting", attempt: run.attempt, startedAt: null, readyAt: null, retryAt: null, pid: null, endpoint: null });
      let failure: AttemptFailure | null;
      try {
        failure = await this.attempt(run);
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
          `Parked after ${countOf(recent, "failure")} within ${formatSeconds(parkAfter.windowMs)} s (${run.failures} in this run); ` +
          `no more attempts until the replica is unparked or its model changes. Last failure: ${failure.message}`;
        this.log.error({ attempt: run.attempt, failures: run.failures, code: failure.code }, "engine parked");
        this.update({ state: "parked", failures: run.failures, lastError: message, lastErrorCode: failure.code, retryAt: null });
        return;
      }
      const delayMs = backoffDelay(recent, { baseMs: backoff.initialMs, maxMs: backoff.maxMs });
      this.log.warn({ attempt: run.attempt, code: failure.code, retryInMs: delayMs, error: failure.message }, "engine attempt failed");
      this.update({ state: "failed", failures: run.failures, lastError: failure.message, lastErrorCode: failure.code, retryAt: now + delayMs });
      await abortableDelay(delayMs, signal);
    }
  }

  /** One attempt; the run's first one claims the run's state folder. Returns the failure, or null when stopped. */
  private async attempt(run: Run): Promise<AttemptFailure | null> {
    if (run.stateDir === null) {
      try {
        run.stateDir = await claimRunFolder(this.options.stateRoot, this.options.replicaId);
      } catch (error) {
        return {
          code: "state_dir_failed",
          message: `Could not create a state folder below ${this.options.stateRoot} for attempt ${run.attempt}: ${describeError(error)}. Check the agent's data dir is writable.`,
        };
      }
      this.update({ stateDir: run.stateDir });
      if (run.stateDir.length + "/tmp".length > 60) {
        // Unix socket paths are limited to 107 bytes; engines (Ray under vLLM) put sockets
        // several levels below TMPDIR. The bundled engine makes none, so this is only a hint
        // for whoever reads a vLLM start failure, not a warning on every start.
        this.log.debug({ stateDir: run.stateDir }, "engine TMPDIR path is long; engines that create Unix sockets below it may fail");
      }
      if (run.controller.signal.aborted) return null;
    }
    return runAttempt({
      options: this.options,
      attempt: run.attempt,
      stateDir: run.stateDir,
      signal: run.controller.signal,
      recorder: this.recorder,
      log: this.log,
      report: (patch) => this.update(patch),
      notes: { waiting: (note) => this.noteWaiting(run, note) },
    });
  }

  /** A preflight that waits (not a failure): its note is the last error meanwhile; the one before comes back once it stops. */
  private noteWaiting(run: Run, note: WaitingNote | null): void {
    if (this.run !== run || run.controller.signal.aborted) return;
    if (note !== null) {
      this.beforeWaiting ??= { lastError: this.snap.lastError, lastErrorCode: this.snap.lastErrorCode };
      this.update({ lastError: note.message, lastErrorCode: note.code, retryAt: note.retryAt });
    } else if (this.beforeWaiting !== null) {
      this.update({ ...this.beforeWaiting, retryAt: null });
      this.beforeWaiting = null;
    }
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

function releaseRun(run: Run): void {
  if (run.stateDir !== null) releaseRunFolder(run.stateDir);
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
