// Engine processes as process groups. An engine is spawned detached, so it leads its own
// process group (setsid), and stopping it signals the whole group: SIGTERM, a grace
// period, then SIGKILL. That also stops what it forked (vLLM's workers, a helper that
// ignores SIGTERM); llama-swap could not stop engines that fork (its #804).
//
// This module also keeps the registry of what this process supervises, for the way out:
// a hosting process (`llmgw agent`, `llmgw up`) calls `await stopAllSupervisors()` on
// SIGINT/SIGTERM (graceful, per engine) and then exits; as a last line of defence one
// `process.on("exit")` hook, installed on the first spawn, SIGKILLs every group still
// registered (`killAllSupervisedSync`), so an agent that exits, even through an uncaught
// exception, leaves no engine behind. A SIGKILL (or OOM kill) of the agent escapes that
// hook; the bundled `llmgw engine` therefore watches its parent and shuts down when the
// agent is gone (engines/llamacpp/engine-command.ts). An external engine without such a
// watch survives it, and the next agent start finds its port taken and reports it.
import { spawn, type ChildProcess } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";
import type { FileHandle } from "node:fs/promises";
import type { Logger } from "../core/log.ts";

/** How long terminateGroup waits, after SIGKILL, for the kernel to tear the group's processes down. */
const KILL_SETTLE_MS = 2_000;
const GROUP_POLL_MS = 50;

/** Process groups of engines that are running, by pgid (= the engine's pid), with their replica. */
const liveGroups = new Map<number, string>();
/** Whatever stopAllSupervisors must stop: the started supervisors. */
const liveSupervisors = new Set<{ stop(): Promise<void> }>();
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

/** A supervisor with a run: stopAllSupervisors stops it until `untrackSupervisor`. */
export function trackSupervisor(supervisor: { stop(): Promise<void> }): void {
  liveSupervisors.add(supervisor);
}

export function untrackSupervisor(supervisor: { stop(): Promise<void> }): void {
  liveSupervisors.delete(supervisor);
}

export interface ExitInfo {
  code: number | null;
  signal: string | null;
}

/** A running engine process that leads its own process group. */
export interface GroupLeader {
  /** The engine's pid, which is also its process group id. */
  pid: number;
  /** Resolves when the engine process has exited (not necessarily the rest of its group). */
  exited: Promise<ExitInfo>;
  /** Aborted when the engine process exits, to end waits on it. */
  exitSignal: AbortSignal;
  /** How the engine process ended; null while it runs. */
  exit(): ExitInfo | null;
}

export interface SpawnGroupOptions {
  command: string;
  args: string[];
  cwd: string;
  env: Record<string, string>;
  /** Receives the engine's stdout and stderr; closed here once the child holds its own copy. */
  output: FileHandle;
  /** Named in the exit registry; only for diagnostics. */
  replicaId: string;
  log: Logger;
}

/**
 * Spawns the engine detached, in its own process group, and registers the group for the
 * exit hook. Rejects with the spawn error (ENOENT for a command not found, EACCES, ...)
 * when the process could not be started.
 */
export async function spawnGroupLeader(options: SpawnGroupOptions): Promise<GroupLeader> {
  let child: ChildProcess;
  try {
    child = spawn(options.command, options.args, {
      cwd: options.cwd,
      env: options.env,
      // Own process group (setsid), so signals to -pid reach everything the engine forks.
      detached: true,
      stdio: ["ignore", options.output.fd, options.output.fd],
    });
  } catch (error) {
    await options.output.close();
    throw error;
  }
  let exit: ExitInfo | null = null;
  const exitController = new AbortController();
  const exited = new Promise<ExitInfo>((resolveExit) => {
    child.once("exit", (code, signal) => {
      exit = { code, signal };
      exitController.abort();
      resolveExit(exit);
    });
  });
  const spawned = new Promise<Error | null>((resolveSpawn) => {
    child.once("spawn", () => resolveSpawn(null));
    child.once("error", (error) => resolveSpawn(error));
  });
  // The child holds its own copy of the descriptor from here on.
  await options.output.close();
  const spawnError = await spawned;
  child.on("error", (error) => options.log.warn({ err: error }, "engine process error"));
  const pid = child.pid;
  if (spawnError !== null || pid === undefined) throw spawnError ?? new Error("the process got no pid");
  registerGroup(pid, options.replicaId);
  return { pid, exited, exitSignal: exitController.signal, exit: () => exit };
}

/**
 * Ends the engine's process group: SIGTERM, then up to `graceMs` for the engine and
 * everything it forked to exit, then SIGKILL. Resolves when the engine process is gone.
 * Also sweeps up members left behind by an engine that already exited on its own. Does
 * nothing for a group already terminated.
 */
export async function terminateGroup(leader: GroupLeader, options: { graceMs: number; log: Logger }): Promise<void> {
  const pgid = leader.pid;
  if (!liveGroups.has(pgid)) return;
  const hasExited = (): boolean => leader.exit() !== null;
  const alive = (): boolean => !hasExited() || groupHasLiveMembers(pgid);
  if (alive()) {
    signalGroup(pgid, "SIGTERM");
    const deadline = Date.now() + options.graceMs;
    while (alive() && Date.now() < deadline) {
      const wait = Math.min(GROUP_POLL_MS, deadline - Date.now());
      if (hasExited()) await sleep(wait);
      else await raceTimeout(leader.exited, wait);
    }
    if (alive()) {
      options.log.warn({ pid: pgid, graceMs: options.graceMs }, "engine did not stop within the grace; sending SIGKILL to its process group");
      signalGroup(pgid, "SIGKILL");
    }
  }
  // SIGKILL cannot be ignored; the wait is only as long as the kernel takes to tear the
  // processes down. Members other than the engine are not our children, so their end is
  // polled (bounded): a caller that is told "stopped" may reuse the port or the GPU at once.
  await leader.exited;
  const settleDeadline = Date.now() + KILL_SETTLE_MS;
  while (groupHasLiveMembers(pgid) && Date.now() < settleDeadline) await sleep(GROUP_POLL_MS);
  liveGroups.delete(pgid);
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
