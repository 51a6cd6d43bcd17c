// `llmgw ctl` against a test server, run as a child process the way an operator runs it, and
// the variant for a run that must fail (its exit code and output, or the test fails with what
// ctl printed).
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

const BIN = fileURLToPath(new URL("../../bin/llmgw.js", import.meta.url));
const run = promisify(execFile);

export interface CtlFailure {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** `server` is read at each run: test servers start in `before`, after the runner is made. */
export function ctlRunner(server: () => { url: string; adminKey: string }, options: { timeoutMs?: number } = {}) {
  const ctl = (args: string[]) => {
    const { url, adminKey } = server();
    return run(process.execPath, [BIN, "ctl", "--server", url, "--key", adminKey, ...args], {
      env: { ...process.env, LLMGW_LOG_LEVEL: "silent" },
      ...(options.timeoutMs === undefined ? {} : { timeout: options.timeoutMs }),
    });
  };
  const ctlFails = (args: string[]): Promise<CtlFailure> =>
    ctl(args).then(
      (done) => assert.fail(`ctl ${args.join(" ")} exited 0: ${done.stdout}`),
      (error: CtlFailure) => error,
    );
  return { ctl, ctlFails };
}
