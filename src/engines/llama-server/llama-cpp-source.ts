// Where llmgw's own llama-server comes from and where its build lives. node-llama-cpp ships
// the llama.cpp source of its bundled engine as a git bundle (`llama/gitRelease.bundle`), so
// a llama-server of the very same commit can be built here without any download
// (engine-build.ts). The build is cached per commit, by default under
// `~/.cache/llmgw/llama.cpp/<commit>/` ($XDG_CACHE_HOME is honoured):
//
//   source/      the bundle's checkout            build/   cmake's build folder (kept, so a
//   bin/         llama-server, llama-bench, ...             later build only adds what is new)
//   build.json   written last, once every binary is in bin/ and answers --version
//
// This module only reads: the agent's `--llama-server auto` and the test support look a
// finished build up here without loading the build code.
import { execFile } from "node:child_process";
import { existsSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { createRequire } from "node:module";
import os from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { z } from "zod";
import { BadRequestError } from "../../core/errors.ts";

const run = promisify(execFile);

/** The programs a build makes, in bin/. llama-batched-bench is the engine benchmark's anchor for several sequences. */
export const LLAMA_CPP_TARGETS = ["llama-server", "llama-bench", "llama-batched-bench"] as const;
export type LlamaCppTarget = (typeof LLAMA_CPP_TARGETS)[number];

/** What build.json records: enough to tell whether a finished build is the one asked for. */
export const buildRecordSchema = z.object({
  commit: z.string().regex(/^[0-9a-f]{40}$/),
  /** The cmake configure flags; a build made with other flags is not reused. */
  flags: z.array(z.string()),
  targets: z.array(z.string()),
  /** `llama-server --version`'s version line, as printed. */
  version: z.string(),
  built_at: z.string(),
  seconds: z.number(),
});
export type BuildRecord = z.infer<typeof buildRecordSchema>;

/** The llama.cpp source node-llama-cpp ships: the bundle and the commit it holds. */
export interface LlamaCppSource {
  bundle: string;
  commit: string;
}

/** The path of node-llama-cpp's git bundle (it may not exist: checked by llamaCppSource). */
export function bundledSourcePath(): string {
  // node-llama-cpp's exports map hides package.json: find its entry, then the folder above
  // it that is the package's root (the one holding llama/).
  const entry = createRequire(import.meta.url).resolve("node-llama-cpp");
  let dir = path.dirname(entry);
  while (path.basename(dir) !== "node-llama-cpp" && path.dirname(dir) !== dir) dir = path.dirname(dir);
  return path.join(dir, "llama", "gitRelease.bundle");
}

/** Reads the bundle's commit with `git bundle list-heads`; a clear error when git or the bundle is missing. */
export async function llamaCppSource(bundle: string = bundledSourcePath()): Promise<LlamaCppSource> {
  if (!existsSync(bundle)) {
    throw new BadRequestError(`node-llama-cpp's llama.cpp source is not at ${bundle}: reinstall llmgw's dependencies (npm ci), which bring it`, {
      code: "llama_cpp_source_missing",
    });
  }
  let heads: string;
  try {
    heads = (await run("git", ["bundle", "list-heads", bundle], { timeout: 60_000 })).stdout;
  } catch (error) {
    const missingGit = (error as NodeJS.ErrnoException).code === "ENOENT";
    throw new BadRequestError(
      missingGit
        ? "git is not installed: reading llama.cpp's source bundle needs it (Debian/Ubuntu: apt-get install git)"
        : `git could not read the llama.cpp source bundle ${bundle}: ${(error as Error).message.split("\n")[0]}`,
      { code: missingGit ? "build_tool_missing" : "llama_cpp_source_missing", cause: error },
    );
  }
  // One line per ref, "<sha> <name>"; the bundle holds a single commit (HEAD).
  const commit = /^([0-9a-f]{40})\s/m.exec(heads)?.[1];
  if (commit === undefined) {
    throw new BadRequestError(`the llama.cpp source bundle ${bundle} names no commit (git bundle list-heads printed '${heads.trim().slice(0, 200)}')`, {
      code: "llama_cpp_source_missing",
    });
  }
  return { bundle, commit };
}

/** The default cache root: $XDG_CACHE_HOME/llmgw/llama.cpp, else ~/.cache/llmgw/llama.cpp. */
export function defaultBuildRoot(env: NodeJS.ProcessEnv = process.env): string {
  const cacheHome = env.XDG_CACHE_HOME !== undefined && path.isAbsolute(env.XDG_CACHE_HOME) ? env.XDG_CACHE_HOME : path.join(os.homedir(), ".cache");
  return path.join(cacheHome, "llmgw", "llama.cpp");
}

/** The folder of one commit's build. */
export function buildDirFor(commit: string, root: string = defaultBuildRoot()): string {
  return path.join(root, commit);
}

/** The path of a program in a build folder. */
export function binaryIn(buildDir: string, target: LlamaCppTarget): string {
  return path.join(buildDir, "bin", target);
}

/** The finished build in `buildDir`, or undefined when there is none (no build.json, or one that does not parse). */
export async function readBuildRecord(buildDir: string): Promise<BuildRecord | undefined> {
  let text: string;
  try {
    text = await readFile(path.join(buildDir, "build.json"), "utf8");
  } catch {
    return undefined;
  }
  try {
    const parsed = buildRecordSchema.safeParse(JSON.parse(text));
    return parsed.success ? parsed.data : undefined;
  } catch {
    return undefined;
  }
}

/**
 * `--llama-server auto`: the llama-server of the finished build for node-llama-cpp's own
 * commit in the default cache, or an error that says how to make it.
 */
export async function builtLlamaServer(options: { root?: string; bundle?: string } = {}): Promise<string> {
  const source = await llamaCppSource(options.bundle);
  const dir = buildDirFor(source.commit, options.root);
  const record = await readBuildRecord(dir);
  const server = binaryIn(dir, "llama-server");
  if (record === undefined || !record.targets.includes("llama-server") || !existsSync(server)) {
    throw new BadRequestError(
      `no finished llama-server build for llama.cpp ${source.commit.slice(0, 7)} in ${dir}: run \`llmgw engine build\` first (15–25 minutes on 2 cores; it needs cmake, a C++ compiler, make and git)`,
      { code: "llama_server_not_built" },
    );
  }
  return server;
}
