// Terminal output for commands: aligned tables, and errors as one line that says what to
// do. Machine-readable output is `--json` on each command, not a parse of these tables.
import { LlmgwError, describeError } from "../core/errors.ts";

export { renderTable } from "../core/text-table.ts";

/** Prints an error for a person and sets a failing exit code; never a stack trace for known errors. */
export function reportCliError(error: unknown): void {
  const message = error instanceof LlmgwError ? error.message : describeError(error);
  process.stderr.write(`error: ${message}\n`);
  if (!(error instanceof LlmgwError) && process.env.LLMGW_DEBUG === "1" && error instanceof Error) process.stderr.write(`${error.stack}\n`);
  process.exitCode = 1;
}
