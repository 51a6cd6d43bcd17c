// What the `llmgw ctl` command modules share: the helpers registerCtl hands each of them
// (the admin client from the flags, printing JSON or text) and the example every leaf
// command shows under --help. It exists so that the model, job, mirror and node modules
// do not import each other for these.
import type { Command } from "commander";
import type { AdminClient } from "./admin-client.ts";

/** Parsed options of a commander action. */
export type CtlOptions = Record<string, unknown>;

/** What ctl's commands share: the admin client from the flags, and printing JSON or text. */
export interface CtlHelpers {
  connect: (command: Command) => AdminClient;
  /** Prints `json` when the command (or ctl) got --json, else what `human` returns. */
  print: (command: Command, json: unknown, human: () => string) => void;
}

/** Adds example command lines after the command's --help text; every leaf command has one. */
export function withExamples(command: Command, ...examples: string[]): Command {
  return command.addHelpText("after", `\n${examples.length === 1 ? "Example" : "Examples"}:\n${examples.map((line) => `  ${line}`).join("\n")}\n`);
}

/** Whether the command (or ctl above it) got --json. */
export function wantsJson(command: Command): boolean {
  return command.optsWithGlobals().json === true;
}
