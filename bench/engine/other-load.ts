// How busy the rest of the machine was during one measurement: CPU time of all processes
// (from /proc/stat) minus that of the benchmark's own processes (from /proc/PID/stat),
// as a number of cores. llama.cpp's threads wait for each other at every step, so one
// core taken by something else slows a 2-thread decode far more than its share; this is
// the figure to look at before trusting a run. Linux only: elsewhere it reports null.
import { readFileSync } from "node:fs";
import os from "node:os";

interface CpuTicks {
  /** Busy ticks of all CPUs together. */
  busy: number;
  /** All ticks of all CPUs together (busy and idle). */
  total: number;
  /** Busy ticks of the benchmark's processes. */
  ours: number;
}

function readTicks(pids: number[]): CpuTicks | null {
  try {
    const fields = (readFileSync("/proc/stat", "utf8").split("\n")[0] ?? "").trim().split(/\s+/).slice(1).map(Number);
    const [user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0] = fields;
    const busy = user + nice + system + irq + softirq + steal;
    let ours = 0;
    for (const pid of pids) {
      try {
        const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
        // Fields after the command name (which may hold spaces): state is field 3, utime 14, stime 15, cutime 16, cstime 17.
        const after = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
        // utime and stime, plus cutime and cstime: the time of children it has waited for
        // (a llama.cpp tool run to its end during the measurement).
        ours += Number(after[11]) + Number(after[12]) + Number(after[13]) + Number(after[14]);
      } catch {
        // The process is gone; its time no longer counts on either side.
      }
    }
    return { busy, total: busy + idle + iowait, ours };
  } catch {
    return null;
  }
}

/** Starts a measurement; the returned function gives the cores others used since, or null. */
export function measureOtherLoad(pids: () => number[]): () => number | null {
  const before = readTicks(pids());
  return () => {
    const after = readTicks(pids());
    if (!before || !after) return null;
    const elapsedPerCpu = (after.total - before.total) / os.cpus().length;
    if (elapsedPerCpu <= 0) return null;
    const others = after.busy - before.busy - (after.ours - before.ours);
    return Math.max(0, others / elapsedPerCpu);
  };
}
