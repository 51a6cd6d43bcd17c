// Runs the test suite with node:test through tsx. The files are listed here on purpose:
// a test file that is not in this list does not run, so adding one is a visible change.
import { spawn } from "node:child_process";

const unit = [
  "src/core/errors.test.ts",
];

const endToEnd = [
];

const files = [...unit, ...endToEnd];
const only = process.argv.slice(2);
const selected = only.length > 0 ? only : files;

const child = spawn(
  process.execPath,
  ["--import", "tsx", "--test", "--test-reporter=spec", "--test-concurrency=2", ...selected],
  { stdio: "inherit", env: { ...process.env, LLMGW_LOG_LEVEL: process.env.LLMGW_LOG_LEVEL ?? "silent" } },
);
child.on("exit", (code, signal) => process.exit(code ?? (signal ? 1 : 0)));
