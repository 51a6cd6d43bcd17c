// One server per data dir. A server holds DATA_DIR/server.lock for as long as it runs: a
// JSON file naming its PID, the process's start time, the boot, the host and the address,
// so a second `llmgw up` or `llmgw server` on the same data dir refuses to start and says
// which process holds it. (With PostgreSQL several servers may share a database; each
// still has its own data dir, and the lock is about that dir only.) A SQLite database
// belongs to one server (its budget and rate counters live in that server's memory), so
// when --database puts the file outside the data dir, the server also locks the directory
// holding the file (acquireServerLocks): two servers cannot share one SQLite file.
//
// Creating the lock is atomic: the content is written to a private file first and then
// hard-linked into place, which fails when the lock exists, so nobody ever reads a half
// written lock. A lock whose process is gone (killed with SIGKILL, a crash, a reboot) is
// taken over; "gone" means no such PID, a zombie, or a PID now used by another process
// (its start time in /proc differs). Two servers that find the same stale lock must not
// both win, and removing a file by name is not conditional on what it holds, so a
// takeover first claims the right to replace that one stale lock: it links its file to
// `server.lock.takeover-<instance of the stale holder>`, which only one process can
// create; the claimant re-reads the lock, and if it still holds the stale content it
// renames its own file over it. A claimant killed in the middle leaves a claim that is
// itself stale; the next one claims the claim the same way (a chain of claims).
import { randomUUID } from "node:crypto";
import { readFileSync, rmSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { ConflictError, type LlmgwError, UnavailableError, describeError, errorCode } from "../core/errors.ts";
import { createLockFile, replaceLockFile } from "../core/lock-file.ts";
import { bootId, hasEnded, processExists, readProcStat } from "../core/process-identity.ts";

export const LOCK_FILE = "server.lock";
const TAKEOVER_PREFIX = `${LOCK_FILE}.takeover-`;

/** What a lock file holds. */
export interface LockHolder {
  /** Random per server start: tells two holders apart even within one process. */
  instance: string;
  pid: number;
  /** /proc/PID/stat start time (clock ticks after boot), null where there is no /proc. */
  process_start: string | null;
  boot_id: string | null;
  host: string;
  /** Where it listens: the URL once it does, `host:port` (asked for) while it starts. */
  address: string;
  listening: boolean;
  started_at: string;
}

export interface DataDirLock {
  readonly holder: LockHolder;
  /** Records the address the server really listens on (port 0 resolved). */
  setAddress(url: string): void;
  /** Removes the lock, if it is still this server's. */
  release(): void;
}

export interface AcquireOptions {
  dataDir: string;
  /** The address asked for (`host:port`); replaced by the URL once listening. */
  address: string;
  /** How long to wait for another process's takeover in progress (a few ms in practice). */
  takeoverWaitMs?: number;
  /**
   * For tests: runs after a lock was found stale and before taking it over, the moment
   * where a racing server could take it over first.
   */
  beforeTakeover?: () => void;
}

/**
 * The data dir's lock and, for a SQLite file outside the data dir, the lock of the file's
 * directory too (see the module comment): a second server on that file refuses to start.
 */
export function acquireServerLocks(options: AcquireOptions & { database: string }): DataDirLock {
  const own = acquireDataDirLock(options);
  const isSqliteFile = !/^postgres(ql)?:\/\//i.test(options.database) && options.database !== ":memory:";
  const databaseDir = path.dirname(path.resolve(options.database));
  if (!isSqliteFile || databaseDir === path.resolve(options.dataDir)) return own;
  let ofDatabase: DataDirLock;
  try {
    ofDatabase = acquireDataDirLock({ ...options, dataDir: databaseDir });
  } catch (error) {
    own.release();
    if (!(error instanceof ConflictError)) throw error;
    throw new ConflictError(
      `The SQLite database ${options.database} may be in use by another llmgw: its directory is locked. ${error.message} A SQLite database belongs to one server; use PostgreSQL to share one database between servers.`,
      { code: "data_dir_in_use" },
    );
  }
  return {
    holder: own.holder,
    setAddress: (url) => {
      own.setAddress(url);
      ofDatabase.setAddress(url);
    },
    release: () => {
      ofDatabase.release();
      own.release();
    },
  };
}

export function acquireDataDirLock(options: AcquireOptions): DataDirLock {
  const lockPath = path.join(options.dataDir, LOCK_FILE);
  const me: LockHolder = {
    instance: randomUUID(),
    pid: process.pid,
    process_start: readProcessStat(process.pid)?.start ?? null,
    boot_id: bootId(),
    host: os.hostname(),
    address: options.address,
    listening: false,
    started_at: new Date().toISOString(),
  };
  const deadline = Date.now() + (options.takeoverWaitMs ?? 10_000);
  for (;;) {
    const outcome = tryAcquire(lockPath, me, options);
    if (outcome === "acquired") return heldLock(lockPath, me);
    // Another process is taking over a stale lock right now; look again once it is done.
    if (Date.now() > deadline) {
      throw new ConflictError(
        `The data dir ${options.dataDir} is being taken over by another starting llmgw (${describeHolder(outcome.claimant)}). Try again in a moment.`,
        {
          code: "data_dir_in_use",
        },
      );
    }
    sleepSync(20);
  }
}

type Attempt = "acquired" | { claimant: LockHolder };

function tryAcquire(lockPath: string, me: LockHolder, options: AcquireOptions): Attempt {
  const { dataDir } = options;
  if (createLockFile(lockPath, me, cannotWrite)) return "acquired";
  const current = readHolder(lockPath, dataDir);
  if (current === undefined) return tryAcquire(lockPath, me, options); // Released just now.
  const state = holderState(current);
  if (state === "alive") throw inUse(dataDir, current);
  if (state === "elsewhere") {
    throw new ConflictError(
      `The data dir ${dataDir} is locked by an llmgw on host '${current.host}' (${describeHolder(current)}). llmgw cannot check a process on another host: if it no longer runs, delete ${lockPath} and start again.`,
      { code: "data_dir_in_use" },
    );
  }
  options.beforeTakeover?.();
  return takeOver(lockPath, me, current, options);
}

/**
 * Replaces the stale lock `stale` with ours, if this process wins the claim on it. Claims
 * left by dead claimants are claimed in turn (the chain); a live claimant makes us wait.
 */
function takeOver(lockPath: string, me: LockHolder, stale: LockHolder, options: AcquireOptions): Attempt {
  const { dataDir } = options;
  const dir = path.dirname(lockPath);
  const passed: string[] = [];
  let subject = stale;
  for (;;) {
    const claim = path.join(dir, TAKEOVER_PREFIX + subject.instance);
    if (createLockFile(claim, me, cannotWrite)) {
      passed.push(claim);
      break;
    }
    const claimant = readHolder(claim, dataDir);
    if (claimant === undefined) continue; // Cleaned up by a winner just now; the re-read below decides.
    if (holderState(claimant) === "alive") return { claimant };
    passed.push(claim);
    subject = claimant;
  }
  try {
    // Only the holder of the claim may replace this stale content, so if the lock still
    // holds it now, it holds it until our rename.
    const now = readHolder(lockPath, dataDir);
    if (now?.instance !== stale.instance) return tryAcquire(lockPath, me, { ...options, beforeTakeover: undefined });
    replaceLockFile(lockPath, me, cannotWrite);
    return "acquired";
  } finally {
    // A late claimant of the same stale content finds the lock changed and backs off.
    for (const claim of passed) rmSync(claim, { force: true });
  }
}

function heldLock(lockPath: string, me: LockHolder): DataDirLock {
  let holder = me;
  const stillMine = () => {
    try {
      return readHolder(lockPath, path.dirname(lockPath))?.instance === me.instance;
    } catch {
      return false;
    }
  };
  return {
    get holder() {
      return holder;
    },
    setAddress(url) {
      holder = { ...holder, address: url, listening: true };
      if (stillMine()) replaceLockFile(lockPath, holder, cannotWrite);
    },
    release() {
      if (stillMine()) rmSync(lockPath, { force: true });
    },
  };
}

function cannotWrite(dir: string, error: unknown): LlmgwError {
  return new UnavailableError(`Cannot lock the data dir ${dir}: ${describeError(error)}. Check that it exists, is writable and has free space.`, {
    code: "storage_unavailable",
    cause: error,
  });
}

/** The holder named in a lock or claim file; undefined when the file is gone. */
function readHolder(file: string, dataDir: string): LockHolder | undefined {
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch (error) {
    if (errorCode(error) === "ENOENT") return undefined;
    throw cannotWrite(dataDir, error);
  }
  try {
    const parsed = JSON.parse(text) as LockHolder;
    if (typeof parsed.instance === "string" && Number.isInteger(parsed.pid)) return parsed;
  } catch {
    // Reported below: llmgw writes these files whole, so this one was edited or damaged.
  }
  throw new ConflictError(`The lock file ${file} is not one llmgw wrote. If no llmgw runs on the data dir ${dataDir}, delete it and start again.`, {
    code: "data_dir_in_use",
  });
}

/** alive: it runs now; gone: it does not (takeover is safe); elsewhere: another host, cannot tell. */
export function holderState(holder: LockHolder): "alive" | "gone" | "elsewhere" {
  if (holder.host !== os.hostname()) return "elsewhere";
  const boot = bootId();
  if (holder.boot_id !== null && boot !== null && holder.boot_id !== boot) return "gone";
  if (!processExists(holder.pid)) return "gone";
  const stat = readProcessStat(holder.pid);
  // Unreadable (no /proc, or /proc hides other users' processes): it exists, so assume it is that one.
  if (stat === undefined) return "alive";
  if (stat.ended) return "gone";
  if (holder.process_start !== null && stat.start !== holder.process_start) return "gone"; // The PID was reused.
  return "alive";
}

function inUse(dataDir: string, holder: LockHolder): ConflictError {
  return new ConflictError(
    `The data dir ${dataDir} is in use by another llmgw (${describeHolder(holder)}). Stop that one first, or give this one its own --data-dir.`,
    { code: "data_dir_in_use" },
  );
}

function describeHolder(holder: LockHolder): string {
  const where = holder.listening ? `listening on ${holder.address}` : `starting on ${holder.address}`;
  return `PID ${holder.pid}, ${where}, since ${holder.started_at}`;
}

/**
 * The start time of a process in clock ticks after boot, which with the PID names one
 * process for the life of the machine, and whether it has ended but not been reaped yet.
 * Undefined when unreadable.
 */
export function readProcessStat(pid: number): { start: string; ended: boolean } | undefined {
  const stat = readProcStat(pid);
  return stat === undefined ? undefined : { start: stat.start, ended: hasEnded(stat) };
}

function sleepSync(ms: number): void {
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);
}
