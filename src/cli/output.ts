// Terminal output for commands: aligned tables, and errors as one line that says what to
// do. Machine-readable output is `--json` on each command, not a parse of these tables.
import { LlmgwError, describeError } from "../core/errors.ts";

export function renderTable(headers: string[], rows: Array<Array<string | number | null | undefined>>): string {
  const cells = rows.map((row) => row.map((cell) => (cell === null || cell === undefined ? "-" : String(cell))));
  const widths = headers.map((header, i) => Math.max(header.length, ...cells.map((row) => row[i]?.length ?? 0)));
  const line = (row: string[]) => row.map((cell, i) => (i === row.length - 1 ? cell : cell.padEnd(widths[i]!))).join("  ").trimEnd();
  return [line(headers), ...cells.map(line)].join("\n");
}

/** Prints an error for a person and sets a failing exit code; never a stack trace for known errors. */
export function reportCliError(error: unknown): void {
  const message = error instanceof LlmgwError ? error.message : describeError(error);
  process.stderr.write(`error: ${message}\n`);
  if (!(error instanceof LlmgwError) && process.env.LLMGW_DEBUG === "1" && error instanceof Error) process.stderr.write(`${error.stack}\n`);
  process.exitCode = 1;
}
