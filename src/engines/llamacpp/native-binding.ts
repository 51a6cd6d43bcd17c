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
// CPU it finds no local build and takes the prebuilt binary.
//
// The build lands where node-llama-cpp keeps local builds, inside its package folder, so
// `npm ci` removes it and `llmgw engine build` makes it again. The build's log, lock and
// process-group record live in llmgw's build cache, beside llama-server's build.
import { mkdir, writeFile } from "node:fs/promises";
import path from "node:path";
import { getLlama } from "node-llama-cpp";
import { takeBuildLock } from "../llama-server/build-lock.ts";
import { runLogged, stopLeftoverTools } from "../llama-server/build-tools.ts";
import { bundledSourcePath, cpuFingerprint } from "../llama-server/llama-cpp-source.ts";
import type { BuildProgress } from "../llama-server/engine-build.ts";

/** The cmake variable that carries the CPU fingerprint (unused by llama.cpp's cmake). */
const CPU_OPTION = "LLMGW_CPU";

/** node-llama-cpp reads custom cmake options for a build from variables with this prefix. */
const CMAKE_OPTION_ENV_PREFIX = "NODE_LLAMA_CPP_CMAKE_OPTION_";

/** The custom cmake options of this CPU's build: what the engine passes to getLlama. */
export function bindingCmakeOptions(): Record<string, string> {
  return { [CPU_OPTION]: cpuFingerprint() };
}

/** node-llama-cpp's package folder (the one holding llama/ and dist/). */
export function nodeLlamaCppDir(): string {
  return path.dirname(path.dirname(bundledSourcePath()));
}

export interface BindingBuildOptions {
  /** Where the build's log, lock and process-group file go (a folder of llmgw's build cache). */
  workDir: string;
  env?: NodeJS.ProcessEnv;
  signal?: AbortSignal;
  onProgress?: (progress: BuildProgress) => void;
  packageDir?: string;
}

export interface BindingBuildResult {
  /** True when a build for this CPU was there already. */
  reused: boolean;
  log: string;
}

/**
 * Whether node-llama-cpp finds a local build for this CPU: asked of node-llama-cpp itself
 * (a dry run that loads no model and never falls back to the prebuilt binary), so the
 * answer follows its own folder naming.
 */
export async function hasBindingForThisCpu(): Promise<boolean> {
  try {
    await getLlama({
      gpu: false,
      build: "never",
      usePrebuiltBinaries: false,
      skipDownload: true,
      progressLogs: false,
      dryRun: true,
      cmakeOptions: bindingCmakeOptions(),
    });
    return true;
  } catch {
    return false;
  }
}

/** Builds node-llama-cpp's binding for this machine, unless one for this CPU exists. */
export async function buildBundledBinding(options: BindingBuildOptions): Promise<BindingBuildResult> {
  const packageDir = options.packageDir ?? nodeLlamaCppDir();
  const { workDir, signal } = options;
  const log = path.join(workDir, "bundled-binding.log");
  const progress = options.onProgress ?? (() => undefined);
  if (await hasBindingForThisCpu()) return { reused: true, log };
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
    // Another builder may have finished while this one waited for the lock.
    if (await hasBindingForThisCpu()) return { reused: true, log };
    await writeFile(log, "");
    progress({
      step: "compile",
      percent: 0,
      detail: `compiling the bundled engine's llama.cpp for this CPU with node-llama-cpp (5–10 minutes on 2 cores); log: ${log}`,
    });
    const env = options.env ?? process.env;
    await runLogged(process.execPath, [path.join(packageDir, "dist", "cli", "cli.js"), "source", "download", "--gpu", "false", "--noUsageExample"], {
      env: {
        ...env,
        // node-llama-cpp runs its compile through `npm run`: the npm beside this node
        // comes first, as a shell that started llmgw with a full path may lack it.
        PATH: [path.dirname(process.execPath), env.PATH ?? ""].join(path.delimiter),
        [`${CMAKE_OPTION_ENV_PREFIX}${CPU_OPTION}`]: cpuFingerprint(),
        // Plain output (no spinners) in the log.
        CI: "true",
      },
      log,
      what: "the bundled engine's build",
      dir: workDir,
      ...(signal === undefined ? {} : { signal }),
      onLine: (line) => {
        const percent = compilePercent(line);
        if (percent !== undefined) progress({ step: "compile", percent, detail: line.slice(0, 200) });
      },
    });
    if (!(await hasBindingForThisCpu())) {
      throw new Error(
        `node-llama-cpp's build ended, but node-llama-cpp finds no build for this CPU in ${path.join(packageDir, "llama", "localBuilds")}; see ${log}`,
      );
    }
    return { reused: false, log };
  } finally {
    lock.release();
  }
}

/**
 * How far a compile is, from one line of its output: node-llama-cpp's cmake uses Ninja
 * where it finds it ("[12/277] Building ..."), else Make ("[ 4%] Building ...").
 */
export function compilePercent(line: string): number | undefined {
  const ninja = /^\[(\d+)\/(\d+)\]/.exec(line);
  if (ninja) return Math.min(100, Math.max(1, Math.floor((Number(ninja[1]) * 100) / Number(ninja[2]))));
  const make = /^\[\s*(\d{1,3})%\]/.exec(line)?.[1];
  return make === undefined ? undefined : Number(make);
}
