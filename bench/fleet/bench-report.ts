// What the fleet benchmarks (agents.ts, cold-start.ts) share: the progress log on stderr,
// percentiles, the machine and commit a result was measured on, and the JSON report in
// bench/results/ (the same place and shape of header as bench/gateway's).
import { execFileSync } from "node:child_process";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { ROOT } from "../gateway/services.ts";

export function log(line: string): void {
  process.stderr.write(`${line}\n`);
}

export function fmt(value: number | null | undefined, digits: number): string {
  return value === null || value === undefined || !Number.isFinite(value) ? "–" : value.toFixed(digits);
}

/** Nearest-rank percentile of `values` (sorted or not); null when empty. */
export function percentile(values: readonly number[], p: number): number | null {
  if (values.length === 0) return null;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))]!;
}

export function stats(values: readonly number[]): { median: number | null; min: number | null; max: number | null; n: number } {
  return {
    median: percentile(values, 50),
    min: values.length === 0 ? null : Math.min(...values),
    max: values.length === 0 ? null : Math.max(...values),
    n: values.length,
  };
}

/** Clock ticks per second of /proc/<pid>/stat's utime and stime (USER_HZ; 100 on Linux x86). */
const CLOCK_TICKS = (() => {
  try {
    return Number(execFileSync("getconf", ["CLK_TCK"], { encoding: "utf8" }).trim()) || 100;
  } catch {
    return 100;
  }
})();

/** CPU seconds (user + system) a process has used so far, from /proc; null elsewhere. */
export function cpuSeconds(pid: number | undefined): number | null {
  if (pid === undefined) return null;
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    // Fields after the command name (which may hold spaces) start after the last ')';
    // utime and stime are fields 14 and 15 of the whole line, 11 and 12 after it.
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return (Number(fields[11]) + Number(fields[12])) / CLOCK_TICKS;
  } catch {
    return null;
  }
}

export function gitDescribe(): string | null {
  try {
    const commit = execFileSync("git", ["rev-parse", "--short", "HEAD"], { cwd: ROOT, encoding: "utf8" }).trim();
    const dirty = execFileSync("git", ["status", "--porcelain", "--", "src"], { cwd: ROOT, encoding: "utf8" }).trim() !== "";
    return dirty ? `${commit} (src/ has uncommitted changes)` : commit;
  } catch {
    return null;
  }
}

export function machine() {
  return {
    cpus: os.cpus().length,
    cpuModel: os.cpus()[0]?.model ?? "unknown",
    memoryGiB: Math.round(os.totalmem() / 2 ** 30),
    platform: `${os.platform()} ${os.release()}`,
    node: process.version,
    loadAverageAtEnd: os.loadavg().map((value) => Number(value.toFixed(2))),
  };
}

/** Writes `report` as bench/results/<name>-<stamp>.json (or under `dir`) and returns the file. */
export function writeReport(options: { dir: string; name: string; stamp: string; report: object }): string {
  mkdirSync(options.dir, { recursive: true });
  const file = path.join(options.dir, `${options.name}-${options.stamp}.json`);
  writeFileSync(
    file,
    `${JSON.stringify({ benchmark: options.name, date: new Date().toISOString(), commit: gitDescribe(), machine: machine(), ...options.report }, null, 2)}\n`,
  );
  return file;
}

export function timestamp(): string {
  return new Date().toISOString().replace(/[:.]/g, "-");
}
