// One builder per build folder. `build.lock` names the builder: pid, the process's start
// time, the boot and the host (process-identity.ts), so a pid reused by another process or
// a lock from before a reboot is known for what it is. A live builder is waited for (with a
// line every minute); a gone one's lock is taken over; a lock from another host (a cache on
// a shared disk) is refused with what to do, since a process there cannot be checked.
//
// The lock is created whole: the content goes to a private scratch file that is then
// hard-linked to build.lock, which fails when the lock exists, so nobody reads a lock before
// its pid is in it. An older llmgw created the file first and wrote the pid after, so an
// empty or unreadable lock younger than 30 s counts as live.
//
// Taking over must not let two builders win, nor remove a lock that a racer has just made:
// removing a file by name is not conditional on what it holds. So a takeover first claims
// the right to replace that one stale content, by linking `build.lock.takeover-<its key>`,
// which only one process can create; the claimant re-reads the lock and, only when it still
// holds the stale content, renames its own file over it. A claimant killed in between leaves
// a claim that is stale in turn and is claimed the same way. The same design as the server's
// data-dir lock (src/server/data-dir-lock.ts), which refuses where this one waits.
import { createHash, randomUUID } from "node:crypto";
import { closeSync, fstatSync, openSync, readFileSync, rmSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { setTimeout as delay } from "node:timers/promises";
import { ConflictError, type LlmgwError, UnavailableError, describeError, errorCode } from "../../core/errors.ts";
import { buildInterrupted } from "./build-tools.ts";
import { createLockFile, replaceLockFile } from "../../core/lock-file.ts";
import { bootId, hasEnded, processExists, readProcStat } from "../../core/process-identity.ts";

export const LOCK_FILE = "build.lock";
const TAKEOVER_PREFIX = `${LOCK_FILE}.takeover-`;

/** How long an unreadable lock counts as one being written (see the module comment). */
export const UNREADABLE_GRACE_MS = 30_000;

/** What a lock file holds. */
export interface Builder {
  /** Random per build: tells two builders apart even within one process. */
  instance: string;
  pid: number;
  /** /proc/PID/stat start time, null where there is no /proc. */
  process_start: string | null;
  boot_id: string | null;
  host: string;
  since: string;
}

/** A lock or claim file as read: a builder, or content no llmgw of today writes. */
type Seen = { kind: "builder"; key: string; ageMs: number; builder: Builder } | { kind: "unreadable"; key: string; ageMs: number };

export interface BuildLockOptions {
  dir: string;
  /** How often a waiting build looks at the lock again (default 2 s). */
  pollMs?: number;
  /** How often a waiting build says it still waits (default every minute). */
  reportMs?: number;
  signal?: AbortSignal;
  onWait?: (detail: string) => void;
  /** For tests: runs once, after a lock was found stale and before taking it over. */
  beforeTakeover?: () => void;
}

export interface BuildLock {
  readonly holder: Builder;
  /** Removes the lock if it is still this builder's. */
  release(): void;
}

/** Takes the build folder's lock, waiting while another builder holds it. */
export async function takeBuildLock(options: BuildLockOptions): Promise<BuildLock> {
  const lockPath = path.join(options.dir, LOCK_FILE);
  const me: Builder = {
    instance: randomUUID(),
    pid: process.pid,
    process_start: readProcStat(process.pid)?.start ?? null,
    boot_id: bootId(),
    host: os.hostname(),
    since: new Date().toISOString(),
  };
  const pollMs = options.pollMs ?? 2000;
  const reportMs = options.reportMs ?? 60_000;
  const started = Date.now();
  let beforeTakeover = options.beforeTakeover;
  let lastReport: number | undefined;
  for (;;) {
    if (options.signal?.aborted === true) throw buildInterrupted(options.signal);
    const hook = beforeTakeover;
    const outcome = tryAcquire(lockPath, me, () => {
      beforeTakeover = undefined;
      hook?.();
    });
    if (outcome === "acquired") return heldLock(lockPath, me);
    // "changed": the lock was released or replaced while we looked; look again at once.
    if (outcome === "changed") continue;
    const now = Date.now();
    if (lastReport === undefined || now - lastReport >= reportMs) {
      options.onWait?.(describeWait(options.dir, outcome, lastReport === undefined, now - started));
      lastReport = now;
    }
    try {
      await delay(pollMs, undefined, { signal: options.signal });
    } catch {
      throw buildInterrupted(options.signal);
    }
  }
}

/** "acquired", "changed" (look again), or the live holder (wait). */
function tryAcquire(lockPath: string, me: Builder, beforeTakeover: () => void): "acquired" | "changed" | Seen {
  if (createLockFile(lockPath, me, cannotLock)) return "acquired";
  const seen = readSeen(lockPath);
  if (seen === undefined) return "changed";
  const state = judge(seen);
  if (state === "alive") return seen;
  if (state === "elsewhere" && seen.kind === "builder") throw lockedElsewhere(lockPath, seen.builder);
  beforeTakeover();
  return takeOver(lockPath, me, seen);
}

/** Replaces the stale lock `stale` with ours if this process wins the claim on it (see the module comment). */
function takeOver(lockPath: string, me: Builder, stale: Seen): "acquired" | "changed" | Seen {
  const passed: string[] = [];
  let subject = stale;
  try {
    for (;;) {
      const claim = path.join(path.dirname(lockPath), TAKEOVER_PREFIX + subject.key);
      if (createLockFile(claim, me, cannotLock)) {
        passed.push(claim);
        break;
      }
      const claimant = readSeen(claim);
      if (claimant === undefined) continue; // Removed by a winner just now; the re-read below decides.
      // A claim lives for milliseconds; one from another host is judged by its age alone.
      const state = judge(claimant);
      if (state === "alive" || (state === "elsewhere" && claimant.ageMs < UNREADABLE_GRACE_MS)) return claimant;
      passed.push(claim);
      subject = claimant;
    }
    // Only the holder of the claim may replace this stale content, so if the lock still
    // holds it now, it holds it until our rename.
    if (readSeen(lockPath)?.key !== stale.key) return "changed";
    replaceLockFile(lockPath, me, cannotLock);
    return "acquired";
  } finally {
    // A late claimant of the same stale content finds the lock changed and backs off.
    for (const claim of passed) rmSync(claim, { force: true });
  }
}

function heldLock(lockPath: string, me: Builder): BuildLock {
  return {
    holder: me,
    release() {
      if (readSeen(lockPath)?.key === me.instance) rmSync(lockPath, { force: true });
    },
  };
}

/** alive: it runs now (wait); gone: it does not (take over); elsewhere: another host, cannot tell. */
function judge(seen: Seen): "alive" | "gone" | "elsewhere" {
  if (seen.kind === "unreadable") return seen.ageMs < UNREADABLE_GRACE_MS ? "alive" : "gone";
  const holder = seen.builder;
  if (holder.host !== os.hostname()) return "elsewhere";
  const boot = bootId();
  if (holder.boot_id !== null && boot !== null && holder.boot_id !== boot) return "gone";
  if (!processExists(holder.pid)) return "gone";
  const stat = readProcStat(holder.pid);
  // Unreadable (no /proc, or /proc hides other users' processes): it exists, so assume it is that one.
  if (stat === undefined) return "alive";
  if (hasEnded(stat)) return "gone";
  if (holder.process_start !== null && stat.start !== holder.process_start) return "gone"; // The pid was reused.
  return "alive";
}

/** A lock or claim file as it is now; undefined when there is none. */
function readSeen(file: string): Seen | undefined {
  let text: string;
  let mtimeMs: number;
  let inode: number;
  try {
    const fd = openSync(file, "r");
    try {
      const stat = fstatSync(fd);
      mtimeMs = stat.mtimeMs;
      inode = stat.ino;
      text = readFileSync(fd, "utf8");
    } finally {
      closeSync(fd);
    }
  } catch (error) {
    if (errorCode(error) === "ENOENT") return undefined;
    throw cannotLock(path.dirname(file), error);
  }
  const ageMs = Date.now() - mtimeMs;
  const builder = parseBuilder(text);
  if (builder !== undefined) return { kind: "builder", key: builder.instance, ageMs, builder };
  // An older llmgw wrote a bare pid: a builder on this host, without a start time or boot.
  const bare = /^\s*(\d+)\s*$/.exec(text)?.[1];
  // Content without an instance is told apart by its bytes and its file, which a replacement changes.
  const key = `raw-${createHash("sha256").update(`${inode}:${mtimeMs}:${text}`).digest("hex").slice(0, 24)}`;
  if (bare !== undefined && Number(bare) > 0) {
    const since = new Date(mtimeMs).toISOString();
    return { kind: "builder", key, ageMs, builder: { instance: key, pid: Number(bare), process_start: null, boot_id: null, host: os.hostname(), since } };
  }
  return { kind: "unreadable", key, ageMs };
}

function parseBuilder(text: string): Builder | undefined {
  try {
    const parsed = JSON.parse(text) as Partial<Builder>;
    if (typeof parsed.instance === "string" && /^[\w-]{1,100}$/.test(parsed.instance) && Number.isInteger(parsed.pid) && typeof parsed.host === "string") {
      return {
        instance: parsed.instance,
        pid: parsed.pid as number,
        process_start: parsed.process_start ?? null,
        boot_id: parsed.boot_id ?? null,
        host: parsed.host,
        since: parsed.since ?? "an unknown time",
      };
    }
  } catch {
    // Not JSON: a bare pid or damaged content, told apart by the caller.
  }
  return undefined;
}

function cannotLock(dir: string, error: unknown): LlmgwError {
  return new UnavailableError(`cannot lock the build folder ${dir}: ${describeError(error)}. Check that it is writable and has free space.`, {
    code: "storage_unavailable",
    cause: error,
  });
}

function lockedElsewhere(lockPath: string, holder: Builder): ConflictError {
  return new ConflictError(
    `${lockPath} is held by a build on host '${holder.host}' (pid ${holder.pid}, since ${holder.since}); llmgw cannot check a process on another host. ` +
      `If no build runs there, delete ${lockPath} and run \`llmgw engine build\` again.`,
    { code: "engine_build_locked" },
  );
}

function describeWait(dir: string, seen: Seen, first: boolean, waitedMs: number): string {
  const minutes = Math.round(waitedMs / 60_000);
  if (seen.kind === "unreadable") {
    return `${path.join(dir, LOCK_FILE)} names no builder yet (${Math.round(seen.ageMs / 1000)} s old; a starting build writes it): waiting, and taking it over once it is ${UNREADABLE_GRACE_MS / 1000} s old`;
  }
  const { pid, since } = seen.builder;
  if (first) return `another build of this llama.cpp (pid ${pid}, since ${since}) is running in ${dir}; waiting for it`;
  return `still waiting for the build by pid ${pid} in ${dir} (${minutes} min so far)`;
}
