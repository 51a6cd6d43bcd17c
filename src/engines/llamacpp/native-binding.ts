// The bundled engine's llama.cpp compiled for this machine: `llmgw engine build` has
// node-llama-cpp build its own binding from the llama.cpp source it ships (its documented
// `source download` command, which unpacks the package's git bundle, so nothing is
// downloaded), with this machine's cmake and compiler. node-llama-cpp then loads that
// local build instead of its prebuilt one when the engine starts (llama-load.ts).
//
// Why: the prebuilt CPU libraries are compiled for generic instruction sets, without
// OpenMP. On the engine benchmark's model they process a prompt at about half the speed
// of the same llama.cpp commit compiled for the CPU it runs on (pp512: 450–610 against
// 1,000–1,300 tokens/s, measured with a C program linked to the prebuilt libraries, so no
// Node in between; bench/engine/README.md has the figures).
//
// Only on the CPU it was compiled for: node-llama-cpp does not test a local build before
// loading it on Linux, so a node_modules copied to a machine that lacks an instruction
// the build uses would die of SIGILL. The CPU's fingerprint is therefore one of the
// build's cmake options (a variable llama.cpp's cmake ignores), and node-llama-cpp names a
// local build's folder by a hash of its custom options and looks only in the folder named
// by the options it is given: the engine asks with this CPU's fingerprint, so on another
// CPU it finds no local build and takes the prebuilt binary. node-llama-cpp also adds
// options of its own from the environment (GGML_* variables and NODE_LLAMA_CPP_CMAKE_OPTION_*),
// which engines never have (agent/engine-env.ts): the build runs without them too, so
// both name the same folder.
//
// The build lands where node-llama-cpp keeps local builds, inside its package folder, so
// `npm ci` removes it and `llmgw engine build` makes it again. Its log, lock and
// process-group record live in llmgw's build cache, in a folder per node-llama-cpp
// package (the resource the lock guards is that package's llama/ folder).
import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, readdirSync, realpathSync, statSync } from "node:fs";
import { mkdir, rm, writeFile } from "node:fs/promises";
import path from "node:path";
import { pathToFileURL } from "node:url";
import { takeBuildLock } from "../llama-server/build-lock.ts";
import { compilePercent, runLogged, stopLeftoverTools } from "../llama-server/build-tools.ts";
import { bundledSourcePath, cpuFingerprint, defaultBuildRoot } from "../llama-server/llama-cpp-source.ts";
import type { BuildProgress } from "../llama-server/engine-build.ts";

/** The cmake variable that carries the CPU fingerprint (unused by llama.cpp's cmake). */
const CPU_OPTION = "LLMGW_CPU";

/** node-llama-cpp reads custom cmake options for a build from variables with this prefix. */
const CMAKE_OPTION_ENV_PREFIX = "NODE_LLAMA_CPP_CMAKE_OPTION_";

/** How long the check of a build may take (it loads the binding, no model). */
const PROBE_TIMEOUT_MS = 60_000;

/** proper-lockfile, node-llama-cpp's lock, refreshes a held lock this often (5 s); stale after 10 s. */
const COMPILE_LOCK_FRESH_MS = 15_000;

/** The custom cmake options of this CPU's build: what the engine passes to getLlama. */
export function bindingCmakeOptions(cpu: string = cpuFingerprint()): Record<string, string> {
  return { [CPU_OPTION]: cpu };
}

/** node-llama-cpp's package folder (the one holding llama/ and dist/). */
export function nodeLlamaCppDir(): string {
  return path.dirname(path.dirname(bundledSourcePath()));
}

/** The folder of the build's log, lock and process-group record: one per node-llama-cpp package. */
export function bindingWorkDir(packageDir: string = nodeLlamaCppDir(), env: NodeJS.ProcessEnv = process.env): string {
  const key = createHash("sha256").update(realpathSync(packageDir)).digest("hex").slice(0, 12);
  return path.join(defaultBuildRoot(env), `bundled-binding-${key}`);
}

/**
 * The build's environment: the caller's without the variables node-llama-cpp turns into
 * cmake options (an engine has none of them, so its folder name would differ), with the
 * fingerprint's option, the npm beside this node first on PATH (node-llama-cpp runs its
 * compile through `npm run`), and plain output for the log.
 */
export function bindingBuildEnv(env: NodeJS.ProcessEnv, cpu: string = cpuFingerprint()): NodeJS.ProcessEnv {
  const clean: NodeJS.ProcessEnv = {};
  for (const [name, value] of Object.entries(env)) {
    if (name.startsWith("GGML_") || name.startsWith(CMAKE_OPTION_ENV_PREFIX)) continue;
    clean[name] = value;
  }
  return {
    ...clean,
    PATH: [path.dirname(process.execPath), env.PATH ?? ""].join(path.delimiter),
    [`${CMAKE_OPTION_ENV_PREFIX}${CPU_OPTION}`]: cpu,
    CI: "true",
  };
}

/**
 * True while node-llama-cpp compiles a local build in this package: its lock on the
 * build's folder (a `<folder>.lock` directory that proper-lockfile refreshes every 5 s)
 * is fresh. node-llama-cpp waits, without a deadline, for that lock to go before it
 * loads a local build, so an engine started meanwhile would hang for the whole compile.
 */
export function compileInProgress(packageDir: string = nodeLlamaCppDir(), now: number = Date.now()): boolean {
  const dir = path.join(packageDir, "llama", "localBuilds");
  let names: string[];
  try {
    names = readdirSync(dir);
  } catch {
    return false;
  }
  return names.some((name) => {
    if (!name.endsWith(".lock")) return false;
    try {
      return now - statSync(path.join(dir, name)).mtimeMs < COMPILE_LOCK_FRESH_MS;
    } catch {
      return false;
    }
  });
}

export type BindingCheck = { kind: "found" } | { kind: "none" } | { kind: "broken"; reason: string };

// Run in a child process: loading the binding runs native code, and a build that cannot
// run here (an instruction this CPU lacks, a missing library) must not take llmgw down.
const PROBE_SCRIPT = `
const [entry, options] = process.argv.slice(1);
const { getLlama } = await import(entry);
let found = false;
try {
  await getLlama({ gpu: false, build: "never", usePrebuiltBinaries: false, skipDownload: true, progressLogs: false, dryRun: true, cmakeOptions: JSON.parse(options) });
  found = true;
} catch {}
process.stdout.write(found ? "\\nfound" : "\\nnone");
`;

/**
 * Whether node-llama-cpp finds a local build for this CPU, asked of node-llama-cpp itself
 * (a dry run that loads no model and never falls back to the prebuilt binary), so the
 * answer follows its own folder naming; in the environment an engine has.
 */
export async function checkBinding(packageDir: string = nodeLlamaCppDir(), cpu: string = cpuFingerprint()): Promise<BindingCheck> {
  const entry = pathToFileURL(path.join(packageDir, "dist", "index.js")).href;
  const env = { PATH: process.env.PATH ?? "/usr/bin:/bin", ...(process.env.HOME === undefined ? {} : { HOME: process.env.HOME }) };
  return new Promise((resolve) => {
    const child = spawn(process.execPath, ["--input-type=module", "-e", PROBE_SCRIPT, entry, JSON.stringify(bindingCmakeOptions(cpu))], {
      env,
      stdio: ["ignore", "pipe", "pipe"],
      timeout: PROBE_TIMEOUT_MS,
    });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (chunk: Buffer) => {
      stdout += chunk.toString();
    });
    child.stderr.on("data", (chunk: Buffer) => {
      stderr = (stderr + chunk.toString()).slice(-2000);
    });
    child.on("error", (error) => resolve({ kind: "broken", reason: `could not run node to check it: ${error.message}` }));
    child.on("close", (code, signal) => {
      // The answer is the last line: anything node-llama-cpp prints comes before it.
      const answer = stdout.trimEnd().split("\n").at(-1);
      if (code === 0 && answer === "found") return resolve({ kind: "found" });
      if (code === 0 && answer === "none") return resolve({ kind: "none" });
      const how = signal !== null ? `was killed by ${signal}` : `exited with ${code}`;
      const last = stderr.trim().split("\n").slice(-3).join(" | ");
      resolve({ kind: "broken", reason: `loading it ${how}${last === "" ? "" : `: ${last}`}` });
    });
  });
}

export interface BindingBuildOptions {
  env?: NodeJS.ProcessEnv;
  signal?: AbortSignal;
  onProgress?: (progress: BuildProgress) => void;
  packageDir?: string;
  /** Where the log, lock and process-group record go (default bindingWorkDir()). */
  workDir?: string;
  /** The CPU fingerprint (default this machine's); tests pass one. */
  cpu?: string;
}

export interface BindingBuildResult {
  /** True when a build for this CPU was there already. */
  reused: boolean;
  log: string;
}

/** Builds node-llama-cpp's binding for this machine, unless one for this CPU exists. */
export async function buildBundledBinding(options: BindingBuildOptions = {}): Promise<BindingBuildResult> {
  const packageDir = options.packageDir ?? nodeLlamaCppDir();
  const env = options.env ?? process.env;
  const cpu = options.cpu ?? cpuFingerprint();
  const workDir = options.workDir ?? bindingWorkDir(packageDir, env);
  const { signal } = options;
  const log = path.join(workDir, "bundled-binding.log");
  const progress = options.onProgress ?? (() => undefined);
  if (cpu === "unknown") {
    throw new Error("this machine does not report its CPU's features (/proc/cpuinfo has no flags line), so a build could not be tied to this CPU");
  }
  await mkdir(workDir, { recursive: true });
  const lock = await takeBuildLock({
    dir: workDir,
    ...(signal === undefined ? {} : { signal }),
    onWait: (detail) => progress({ step: "wait", detail }),
  });
  try {
    const leftover = await stopLeftoverTools(workDir);
    if (leftover !== undefined) {
      progress({ step: "cleanup", detail: `stopped ${leftover.command} (process group ${leftover.group}) left running by a build that was killed` });
    }
    await removeUnboundBuild(packageDir);
    const before = await checkBinding(packageDir, cpu);
    if (before.kind === "found") return { reused: true, log };
    if (before.kind === "broken") progress({ step: "rebuild", detail: `the build for this CPU does not load (${before.reason}): building it again` });
    await writeFile(log, "");
    progress({
      step: "compile",
      percent: 0,
      detail: `compiling the bundled engine's llama.cpp for this CPU with node-llama-cpp (5–10 minutes on 2 cores); log: ${log}`,
    });
    await runLogged(process.execPath, [path.join(packageDir, "dist", "cli", "cli.js"), "source", "download", "--gpu", "false", "--noUsageExample"], {
      env: bindingBuildEnv(env, cpu),
      log,
      what: "the bundled engine's build",
      dir: workDir,
      ...(signal === undefined ? {} : { signal }),
      onLine: (line) => {
        const percent = compilePercent(line);
        if (percent !== undefined) progress({ step: "compile", percent, detail: line.slice(0, 200) });
      },
    });
    const after = await checkBinding(packageDir, cpu);
    if (after.kind === "found") return { reused: false, log };
    const why = after.kind === "broken" ? after.reason : `node-llama-cpp finds no build for this CPU in ${path.join(packageDir, "llama", "localBuilds")}`;
    throw new Error(`node-llama-cpp's build ended, but ${why}; see ${log}`);
  } finally {
    lock.release();
  }
}

/**
 * Removes the local build an earlier llmgw made without the fingerprint option (the
 * folder node-llama-cpp uses when given no options, with llmgw's stamp file in it): any
 * caller of getLlama without options would load it on whatever CPU this is.
 */
async function removeUnboundBuild(packageDir: string): Promise<void> {
  const dir = path.join(packageDir, "llama", "localBuilds", `${process.platform}-${process.arch}`);
  if (existsSync(path.join(dir, "llmgw-cpu-fingerprint"))) await rm(dir, { recursive: true, force: true });
}
