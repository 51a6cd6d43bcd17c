// The bundled engine's llama.cpp compiled for this machine: `llmgw engine build` has
// node-llama-cpp build its own binding from the llama.cpp source it ships (its documented
// `source download` command, which unpacks the package's git bundle, so nothing is
// downloaded), with this machine's cmake and compiler. node-llama-cpp then loads that
// local build instead of its prebuilt one (it looks for a local build first, and tests
// that it loads before using it).
//
// Why: the prebuilt CPU libraries are compiled for generic instruction sets, without
// OpenMP. On the engine benchmark's model they process a prompt at about half the speed
// of the same llama.cpp commit compiled for the CPU it runs on (pp512: 450–610 against
// 1,000–1,300 tokens/s, measured with a C program linked to the prebuilt libraries, so no
// Node in between; bench/engine/README.md has the figures).
//
// The build lands where node-llama-cpp keeps local builds, inside its package folder, so
// `npm ci` removes it and `llmgw engine build` makes it again. A stamp beside it records
// the CPU it was compiled for: a node_modules copied to another CPU is rebuilt, never
// loaded with instructions that CPU lacks.
import { existsSync } from "node:fs";
import { mkdir, readFile, writeFile } from "node:fs/promises";
import path from "node:path";
import { runLogged } from "../llama-server/build-tools.ts";
import { bundledSourcePath, cpuFingerprint } from "../llama-server/llama-cpp-source.ts";

/** node-llama-cpp's package folder (the one holding llama/ and dist/). */
export function nodeLlamaCppDir(): string {
  return path.dirname(path.dirname(bundledSourcePath()));
}

/** The folder of node-llama-cpp's local build for this platform (its own naming, CPU only). */
export function localBuildDir(packageDir: string = nodeLlamaCppDir()): string {
  return path.join(packageDir, "llama", "localBuilds", `${process.platform}-${process.arch}`);
}

/** Beside the local build: the CPU fingerprint it was compiled for. */
const CPU_STAMP = "llmgw-cpu-fingerprint";

export interface BindingBuildOptions {
  /** Where the build's log and process-group file go (a folder of llmgw's build cache). */
  workDir: string;
  env?: NodeJS.ProcessEnv;
  signal?: AbortSignal;
  onProgress?: (detail: string) => void;
  packageDir?: string;
}

export interface BindingBuildResult {
  /** The local build's folder. */
  dir: string;
  /** True when a build for this CPU was there already. */
  reused: boolean;
  log: string;
}

/** The local build for this CPU, if there is one (its binding and our stamp). */
export async function currentBinding(packageDir: string = nodeLlamaCppDir()): Promise<string | undefined> {
  const dir = localBuildDir(packageDir);
  if (!existsSync(path.join(dir, "Release", "llama-addon.node"))) return undefined;
  const stamp = await readFile(path.join(dir, CPU_STAMP), "utf8").catch(() => "");
  return stamp.trim() === cpuFingerprint() ? dir : undefined;
}

/** Builds node-llama-cpp's binding for this machine, unless one for this CPU exists. */
export async function buildBundledBinding(options: BindingBuildOptions): Promise<BindingBuildResult> {
  const packageDir = options.packageDir ?? nodeLlamaCppDir();
  const dir = localBuildDir(packageDir);
  const log = path.join(options.workDir, "bundled-binding.log");
  const found = await currentBinding(packageDir);
  if (found !== undefined) return { dir: found, reused: true, log };
  await mkdir(options.workDir, { recursive: true });
  options.onProgress?.(`compiling the bundled engine's llama.cpp for this CPU with node-llama-cpp (5–10 minutes on 2 cores); log: ${log}`);
  await runLogged(process.execPath, [path.join(packageDir, "dist", "cli", "cli.js"), "source", "download", "--gpu", "false", "--noUsageExample"], {
    env: { ...(options.env ?? process.env), CI: "true" },
    log,
    what: "the bundled engine's build",
    dir: options.workDir,
    ...(options.signal ? { signal: options.signal } : {}),
  });
  if (!existsSync(path.join(dir, "Release", "llama-addon.node"))) {
    throw new Error(`node-llama-cpp's build ended without ${path.join(dir, "Release", "llama-addon.node")}; see ${log}`);
  }
  await writeFile(path.join(dir, CPU_STAMP), `${cpuFingerprint()}\n`);
  return { dir, reused: false, log };
}
