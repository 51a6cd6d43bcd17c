// Waiting for the file system's clock. The kernel stamps mtime and ctime from a coarse
// clock (one tick is a few milliseconds), so a file changed within the tick in which it
// was last stamped looks unchanged by its times. A test that changes a file to show that
// a stamp notices first waits, on a condition and not for a fixed time, until a change
// made now is stamped later than the given time.
import { rm, stat, writeFile } from "node:fs/promises";
import path from "node:path";
import { eventually } from "./eventually.ts";

/** Resolves once a file written in `dir` gets a ctime after `ns` (nanoseconds since the epoch). */
export async function fileClockPast(dir: string, ns: bigint): Promise<void> {
  const probe = path.join(dir, `.clock-probe-${process.pid}`);
  try {
    await eventually("the file system's clock to tick past the last stamp", async () => {
      await writeFile(probe, String(Date.now()));
      return (await stat(probe, { bigint: true })).ctimeNs > ns;
    });
  } finally {
    await rm(probe, { force: true });
  }
}
