// A child process that tries to take the data dir lock when told to (a line on stdin),
// for the test that several processes racing for one stale lock cannot all win. It
// prints `won PID` and holds the lock until killed, or `refused MESSAGE` and exits.
import { acquireDataDirLock } from "../../src/server/data-dir-lock.ts";

const dataDir = process.argv[2]!;
process.stdout.write("ready\n");
process.stdin.once("data", () => {
  try {
    acquireDataDirLock({ dataDir, address: `127.0.0.1:${process.pid}` });
    process.stdout.write(`won ${process.pid}\n`);
    setInterval(() => undefined, 60_000);
  } catch (error) {
    process.stdout.write(`refused ${error instanceof Error ? error.message : String(error)}\n`);
    process.exit(0);
  }
});
