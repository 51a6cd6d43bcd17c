// The contract between the engine supervisor and the rest: what a supervisor is given
// (its options, and the launch an engine adapter builds for each attempt) and what it
// reports (snapshots of its state). Engine adapters in src/engines/ build `EngineLaunch`
// values and `EngineValidator`s against these types; nothing here runs anything.
import type { Logger } from "../core/log.ts";

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
  /**
   * Checked before every attempt (for example: the weights exist and are readable); a throw
   * fails the attempt without a spawn. A preflight that waits for something that is not the
   * engine's fault (weights no server can send right now) says so with `notes.waiting`
   * instead of throwing: it shows in lastError and counts as no failure.
   */
  preflight?: (signal: AbortSignal, notes: PreflightNotes) => Promise<void>;
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

/** What a preflight waits for, shown in the snapshot while it waits (see `PreflightNotes`). */
export interface WaitingNote {
  /** Stable code, for lastErrorCode (for example `weights_unavailable`). */
  code: string;
  /** The sentence for lastError, for example "waiting for weights: …". */
  message: string;
  /** Epoch ms of the preflight's next try, for retryAt. */
  retryAt: number;
}

export interface PreflightNotes {
  /**
   * The preflight waits (a note), or stopped waiting (null: lastError and lastErrorCode go
   * back to what they were before the wait). Neither changes the state or counts a failure.
   */
  waiting(note: WaitingNote | null): void;
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
  /**
   * Stable code of the last failure: preflight_failed, state_dir_failed, prepare_failed, cache_path_outside_state, port_in_use, spawn_failed, engine_exited, not_ready, validation_failed, unhealthy, internal_error;
   * or, while the preflight waits (no failure), the code of what it waits for (`WaitingNote.code`).
   */
  lastErrorCode: string | null;
  /** How the last engine process ended. */
  lastExit: { code: number | null; signal: string | null } | null;
  /** Where the engine listens; set while its process runs (route only when state is "ready"). */
  endpoint: { host: string; port: number } | null;
  /** Epoch ms the current attempt's process was spawned. */
  startedAt: number | null;
  /** Epoch ms the current attempt became ready. */
  readyAt: number | null;
  /** Epoch ms of the next attempt while "failed", or of the preflight's next try while it waits. */
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

/** Why an attempt failed: a stable code (see SupervisorSnapshot.lastErrorCode) and a sentence for lastError. */
export interface AttemptFailure {
  code: string;
  message: string;
}
