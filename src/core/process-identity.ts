// Which process is which, for the build's lock and its tools: a pid alone names a process
// only until it exits and the number is reused, so a builder is recorded with its start
// time (field 22 of /proc/PID/stat, clock ticks after boot), the boot it ran in and the host;
// and the compile runs in a process group of its own, whose members are found through /proc
// (field 5, the group id) so that a group whose leader died can still be stopped.
// Where there is no /proc the answers degrade to "a process with that pid exists".
import { readFileSync, readdirSync } from "node:fs";
import { errorCode } from "./errors.ts";

export interface ProcStat {
  /** One letter: R, S, D, Z (ended, not yet reaped), X (dead), ... */
  state: string;
  /** The process group. */
  group: number;
  /** Clock ticks after boot: with the pid, names one process for the life of the machine. */
  start: string;
}

/** /proc/PID/stat, or undefined when unreadable (no such process, or no /proc). */
export function readProcStat(pid: number): ProcStat | undefined {
  let text: string;
  try {
    text = readFileSync(`/proc/${pid}/stat`, "utf8");
  } catch {
    return undefined;
  }
  // The command name (field 2) is in parentheses and may hold spaces or parentheses itself,
  // so the fields are counted from the last ')': field 3 (state) is index 0.
  const fields = text.slice(text.lastIndexOf(")") + 2).split(" ");
  const state = fields[0];
  const group = Number(fields[2]);
  const start = fields[19];
  if (state === undefined || start === undefined || !Number.isInteger(group)) return undefined;
  return { state, group, start };
}

export function hasEnded(stat: ProcStat): boolean {
  return stat.state === "Z" || stat.state === "X";
}

/** This boot's id; a process recorded under another boot is gone. */
export function bootId(): string | null {
  try {
    return readFileSync("/proc/sys/kernel/random/boot_id", "utf8").trim();
  } catch {
    return null;
  }
}

export function processExists(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    // EPERM: it exists but belongs to another user.
    return errorCode(error) === "EPERM";
  }
}

/**
 * Whether any process of group `group` still runs. Zombies do not count: an orphaned
 * compiler that was killed waits for init to reap it, which in a container may never happen.
 */
export function groupRuns(group: number): boolean {
  let entries: string[];
  try {
    entries = readdirSync("/proc");
  } catch {
    return signalGroup(group, 0);
  }
  for (const entry of entries) {
    if (!/^\d+$/.test(entry)) continue;
    const stat = readProcStat(Number(entry));
    if (stat !== undefined && stat.group === group && !hasEnded(stat)) return true;
  }
  return false;
}

/** Sends `signal` to every process of a group; false when the group has no process left. */
export function signalGroup(group: number, signal: NodeJS.Signals | 0): boolean {
  try {
    process.kill(-group, signal);
    return true;
  } catch (error) {
    if (errorCode(error) === "ESRCH") return false;
    throw error;
  }
}
