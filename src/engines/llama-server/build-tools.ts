// The tools an engine build runs (git, cmake, make, the compilers): whether they are
// installed, and running them so that none outlives the build that started it.
//
// Each tool runs in a process group of its own (a new session, through `detached`), so the
// whole tree it starts (cmake, make, a compiler per job) can be signalled at once: when the
// build is aborted (SIGINT or SIGTERM of `llmgw engine build`), the group gets SIGTERM, on
// which make deletes the object file it was writing, then SIGKILL if it lingers. A terminal's
// Ctrl-C reaches only llmgw for the same reason, which then stops the group itself.
//
// A builder killed with SIGKILL cannot stop anything, and its compile would go on beside the
// next build's in the same build/ folder. So while a tool runs, `build.group` in the build
// folder names its group (with the leader's start time, boot and host); the next builder,
// once it holds the lock, stops a group that a dead builder left running.
import { spawn } from "node:child_process";
import { createWriteStream, existsSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { readFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { setTimeout as delay } from "node:timers/promises";
import { BadRequestError, InternalError, LlmgwError } from "../../core/errors.ts";
import { bootId, groupRuns, hasEnded, readProcStat, signalGroup } from "../../core/process-identity.ts";

/** The file naming the process group of the tool running in a build folder. */
export const GROUP_FILE = "build.group";

/** How long a stopped group may take to end on SIGTERM before it gets SIGKILL. */
const TERM_GRACE_MS = 10_000;

/** The tools a build runs, and the Debian package of each. */
const TOOLS: { names: string[]; what: string; debian: string }[] = [
  { names: ["cmake"], what: "cmake", debian: "cmake" },
  { names: ["c++", "g++", "clang++"], what: "a C++ compiler", debian: "g++" },
  { names: ["cc", "gcc", "clang"], what: "a C compiler", debian: "gcc" },
  { names: ["make"], what: "make", debian: "make" },
  { names: ["git"], what: "git", debian: "git" },
];

/** Refuses at once, naming every missing tool and its Debian package, rather than failing twenty minutes in. */
export function checkBuildTools(env: NodeJS.ProcessEnv): void {
  const missing = TOOLS.filter((tool) => !tool.names.some((name) => onPath(name, env)));
  if (missing.length === 0) return;
  const packages = [...new Set(missing.map((tool) => tool.debian))].join(" ");
  throw new BadRequestError(
    `llmgw engine build needs ${missing.map((tool) => tool.what).join(", ")}, which ${missing.length === 1 ? "is" : "are"} not on PATH. ` +
      `On Debian or Ubuntu, as root: apt-get install -y ${packages}`,
    { code: "build_tool_missing" },
  );
}

function onPath(name: string, env: NodeJS.ProcessEnv): boolean {
  return (env.PATH ?? "").split(path.delimiter).some((dir) => dir !== "" && existsSync(path.join(dir, name)));
}

/** The error of an aborted build; `signal.reason` names what stopped it (the CLI passes the signal's name). */
export function buildInterrupted(signal: AbortSignal | undefined): LlmgwError {
  const reason = typeof signal?.reason === "string" ? ` (${signal.reason})` : "";
  return new LlmgwError({
    status: 499,
    code: "engine_build_interrupted",
    message: `the engine build was interrupted${reason}: none of its tools runs any more and it holds no lock; run \`llmgw engine build\` again to go on where it stopped`,
  });
}

/** Throws buildInterrupted once the build is aborted: checked between steps that run no tool. */
export function stopIfInterrupted(signal: AbortSignal | undefined): void {
  if (signal?.aborted === true) throw buildInterrupted(signal);
}

export interface RunLoggedOptions {
  env: NodeJS.ProcessEnv;
  /** build.log: the tool's output is appended. */
  log: string;
  /** The step, for messages ("the compile"). */
  what: string;
  /** The build folder, where build.group names the running group. */
  dir: string;
  signal?: AbortSignal;
  onLine?: (line: string) => void;
}

/** What build.group holds. */
interface GroupRecord {
  group: number;
  /** The leader's start time: the group id is the leader's pid, which is reused once all of the group ended. */
  start: string | null;
  boot_id: string | null;
  host: string;
  command: string;
}

/**
 * Runs a tool in its own process group with its output appended to build.log; a failure
 * names the step, the log and its last lines. On abort the group is stopped, and the promise
 * rejects only once none of it runs.
 */
export function runLogged(command: string, args: string[], options: RunLoggedOptions): Promise<void> {
  if (options.signal?.aborted === true) return Promise.reject(buildInterrupted(options.signal));
  return new Promise((resolve, reject) => {
    const logStream = createWriteStream(options.log, { flags: "a" });
    logStream.write(`$ ${command} ${args.join(" ")}\n`);
    const child = spawn(command, args, { env: options.env, stdio: ["ignore", "pipe", "pipe"], detached: true });
    const group = child.pid;
    const groupFile = path.join(options.dir, GROUP_FILE);
    if (group !== undefined) recordGroup(groupFile, group, command);
    let stopping = false;
    let killTimer: NodeJS.Timeout | undefined;
    const onAbort = () => {
      if (group === undefined || stopping) return;
      stopping = true;
      signalGroup(group, "SIGTERM");
      killTimer = setTimeout(() => signalGroup(group, "SIGKILL"), TERM_GRACE_MS);
    };
    options.signal?.addEventListener("abort", onAbort, { once: true });
    let pending = "";
    const onData = (chunk: Buffer) => {
      logStream.write(chunk);
      if (options.onLine === undefined) return;
      pending += chunk.toString("utf8");
      const lines = pending.split("\n");
      pending = lines.pop() ?? "";
      for (const line of lines) options.onLine(line);
    };
    child.stdout.on("data", onData);
    child.stderr.on("data", onData);
    child.on("error", (error) => {
      options.signal?.removeEventListener("abort", onAbort);
      logStream.end();
      reject(new BadRequestError(`could not run ${command} for ${options.what}: ${error.message}`, { code: "build_tool_missing", cause: error }));
    });
    child.on("close", (code, signal) => {
      options.signal?.removeEventListener("abort", onAbort);
      clearTimeout(killTimer);
      const finish = async () => {
        // make waits for its jobs, but a compiler whose make was killed does not: the
        // group is empty only when every member has ended.
        if (stopping && group !== undefined) await endGroup(group);
        rmSync(groupFile, { force: true });
        if (stopping) return reject(buildInterrupted(options.signal));
        if (code === 0) return resolve();
        const tail = await lastLines(options.log, 25);
        reject(
          new LlmgwError({
            status: 500,
            code: "engine_build_failed",
            message: `${options.what} failed (${signal ?? `exit ${code}`}); the whole log is ${options.log}. Its end:\n${tail}`,
          }),
        );
      };
      logStream.end(() => {
        finish().catch(reject);
      });
    });
  });
}

async function lastLines(file: string, count: number): Promise<string> {
  const text = await readFile(file, "utf8").catch(() => "");
  return text.trimEnd().split("\n").slice(-count).join("\n");
}

function recordGroup(file: string, group: number, command: string): void {
  const record: GroupRecord = { group, start: readProcStat(group)?.start ?? null, boot_id: bootId(), host: os.hostname(), command };
  const partial = `${file}.partial`;
  writeFileSync(partial, `${JSON.stringify(record)}\n`);
  renameSync(partial, file);
}

function readGroupRecord(file: string): GroupRecord | undefined {
  try {
    const parsed = JSON.parse(readFileSync(file, "utf8")) as Partial<GroupRecord>;
    if (!Number.isInteger(parsed.group) || (parsed.group ?? 0) <= 1 || typeof parsed.host !== "string") return undefined;
    return parsed as GroupRecord;
  } catch {
    return undefined;
  }
}

/** Whether the group a record names still runs here: same host and boot, and not a reused id. */
function recordedGroupRuns(record: GroupRecord): boolean {
  if (record.host !== os.hostname()) return false;
  const boot = bootId();
  if (record.boot_id !== null && boot !== null && record.boot_id !== boot) return false;
  const leader = readProcStat(record.group);
  // A live leader with another start time is a new process that got the number after the
  // recorded group had ended entirely (the number is not reused while any member runs).
  if (leader !== undefined && !hasEnded(leader) && record.start !== null && leader.start !== record.start) return false;
  return groupRuns(record.group);
}

/**
 * Called by a builder that holds the lock: stops the tools a killed builder left running in
 * this folder, so two compiles never write one build/ at once. Returns the group stopped.
 */
export async function stopLeftoverTools(dir: string): Promise<{ group: number; command: string } | undefined> {
  const file = path.join(dir, GROUP_FILE);
  const record = readGroupRecord(file);
  if (record === undefined || !recordedGroupRuns(record)) {
    rmSync(file, { force: true });
    return undefined;
  }
  signalGroup(record.group, "SIGTERM");
  await endGroup(record.group);
  rmSync(file, { force: true });
  return { group: record.group, command: record.command };
}

/** Waits until no member of the group runs: SIGTERM's grace, then SIGKILL. */
async function endGroup(group: number): Promise<void> {
  const termDeadline = Date.now() + TERM_GRACE_MS;
  // A process stuck in the kernel (state D, a hung network disk) ignores even SIGKILL.
  const giveUp = termDeadline + 30_000;
  while (groupRuns(group)) {
    if (Date.now() > giveUp) {
      throw new InternalError(
        `process group ${group} (a compile of this build) still runs 30 s after SIGKILL; stop it (kill -KILL -- -${group}) and run again`,
        {
          code: "engine_build_failed",
        },
      );
    }
    if (Date.now() > termDeadline) signalGroup(group, "SIGKILL");
    await delay(20);
  }
}

/**
 * How far a compile is, from one line of its output: Ninja's "[12/277] Building ..." (which
 * node-llama-cpp's cmake uses where it finds Ninja) or Make's "[ 4%] Building ...". At
 * least 1: a builder announces a compile's start once, as 0.
 */
export function compilePercent(line: string): number | undefined {
  const ninja = /^\[(\d+)\/(\d+)\]/.exec(line);
  const percent = ninja ? Math.floor((Number(ninja[1]) * 100) / Number(ninja[2])) : Number(/^\[\s*(\d{1,3})%\]/.exec(line)?.[1] ?? Number.NaN);
  return Number.isFinite(percent) ? Math.min(100, Math.max(1, percent)) : undefined;
}
