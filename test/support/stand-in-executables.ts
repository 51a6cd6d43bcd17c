// Runs the stand-in engines (stand-in-llama-server.mjs, stand-in-vllm.mjs) as the
// executables an adapter names. The supervisor gives an engine a fresh environment
// (PATH and the locale only, engine-env.ts), so a test cannot steer a stand-in through its
// own environment: it writes a small shell script in a temp folder, named like the real
// command, that sets the stand-in's STAND_IN_* controls and runs it on this Node. Each
// stand-in appends what it was started with ({pid, argv, env}) to the STAND_IN_RECORD file.
import { existsSync } from "node:fs";
import { chmod, mkdir, readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

export const STAND_IN_SCRIPTS = {
  "llama-server": fileURLToPath(new URL("./stand-in-llama-server.mjs", import.meta.url)),
  vllm: fileURLToPath(new URL("./stand-in-vllm.mjs", import.meta.url)),
  ray: fileURLToPath(new URL("./stand-in-ray.mjs", import.meta.url)),
} as const;

export interface StandInStart {
  pid: number;
  argv: string[];
  env: Record<string, string>;
}

/** What a stand-in executable was started with, one entry per start, oldest first. */
export async function standInStarts(recordFile: string): Promise<StandInStart[]> {
  if (!existsSync(recordFile)) return [];
  const text = await readFile(recordFile, "utf8");
  return text
    .split("\n")
    .filter((line) => line !== "")
    .map((line) => JSON.parse(line) as StandInStart);
}

/**
 * Writes `<dir>/<name>`, an executable that runs the stand-in for `engine` with the
 * STAND_IN_* variables in `controls`, and returns its path and the record file's.
 */
export async function writeStandInExecutable(options: {
  dir: string;
  engine: keyof typeof STAND_IN_SCRIPTS;
  controls?: Record<string, string>;
}): Promise<{ executable: string; recordFile: string }> {
  await mkdir(options.dir, { recursive: true });
  const recordFile = join(options.dir, "starts.jsonl");
  const controls = { STAND_IN_RECORD: recordFile, ...options.controls };
  const assignments = Object.entries(controls)
    .map(([name, value]) => `${name}=${shellQuote(value)}`)
    .join(" ");
  const executable = join(options.dir, options.engine);
  await writeFile(executable, `#!/bin/sh\n${assignments} exec ${shellQuote(process.execPath)} ${shellQuote(STAND_IN_SCRIPTS[options.engine])} "$@"\n`);
  await chmod(executable, 0o755);
  return { executable, recordFile };
}

function shellQuote(value: string): string {
  return `'${value.replace(/'/g, `'\\''`)}'`;
}

/** The value after `flag` in `argv`, or undefined. */
export function argAfter(argv: readonly string[], flag: string): string | undefined {
  const i = argv.indexOf(flag);
  return i === -1 ? undefined : argv[i + 1];
}
