// `llmgw engine build`: builds llama-server (with llama-bench and llama-batched-bench) from
// the llama.cpp source node-llama-cpp ships, with the machine's cmake and C++ compiler, into
// the per-commit cache that llama-cpp-source.ts describes. A finished build is reused (and
// needs no build tools); an interrupted one is resumed (cmake's build folder is kept, and
// build.json is written only once every binary is in place and answers --version); two
// builds of one folder never run at once (build-lock.ts), and no tool outlives its build
// (build-tools.ts).
//
// A folder given with --out is written only when it is new, empty, or one of our builds
// (build.json, or the marker file written when a build first claims a folder): a build
// removes and replaces folders inside it, which must never hit someone else's files.
//
// The configure flags, each for a reason:
//   BUILD_SHARED_LIBS=OFF            one self-contained binary per program, so bin/ can be used
//                                    from anywhere (no libllama.so beside it to find)
//   GGML_NATIVE=ON                   compiled for this CPU's instructions, as llama.cpp's own
//                                    default: build.json records the CPU's fingerprint, and
//                                    build/ is started afresh on another CPU (its objects
//                                    would otherwise count as up to date)
//   LLAMA_CURL=OFF, LLAMA_OPENSSL=OFF  no downloading from the engine: llmgw hands engines
//                                    verified local files, and the build needs no TLS library
//   LLAMA_USE_PREBUILT_UI=OFF, LLAMA_BUILD_UI=OFF  the server's web page would otherwise be
//                                    fetched from the Hugging Face Hub at build time
//                                    (scripts/ui-assets.cmake); llmgw has its own console
//   LLAMA_BUILD_TESTS=OFF, LLAMA_BUILD_EXAMPLES=OFF  only the three programs are needed
import { spawnSync } from "node:child_process";
import { existsSync, readdirSync, statSync } from "node:fs";
import { copyFile, mkdir, readFile, rename, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { BadRequestError, InternalError, errorCode } from "../../core/errors.ts";
import { takeBuildLock } from "./build-lock.ts";
import { checkBuildTools, compilePercent, runLogged, stopIfInterrupted, stopLeftoverTools } from "./build-tools.ts";
import {
  LLAMA_CPP_TARGETS,
  adoptBuildRecord,
  binaryIn,
  buildDirFor,
  cpuFingerprint,
  llamaCppSource,
  otherCpu,
  readBuildRecord,
  type BuildRecord,
  type LlamaCppTarget,
} from "./llama-cpp-source.ts";
import { readLlamaServerVersion } from "./llama-server-version.ts";

export const CONFIGURE_FLAGS: readonly string[] = [
  "-DCMAKE_BUILD_TYPE=Release",
  "-DBUILD_SHARED_LIBS=OFF",
  "-DGGML_NATIVE=ON",
  "-DLLAMA_CURL=OFF",
  "-DLLAMA_OPENSSL=OFF",
  "-DLLAMA_USE_PREBUILT_UI=OFF",
  "-DLLAMA_BUILD_UI=OFF",
  "-DLLAMA_BUILD_TESTS=OFF",
  "-DLLAMA_BUILD_EXAMPLES=OFF",
];

/** Written into a folder when a build first claims it: the folder is llmgw's to clear and fill. */
export const BUILD_MARKER = ".llmgw-engine-build";

/** In build/: the CPU fingerprint its objects were compiled for. */
const BUILD_CPU_STAMP = "llmgw-cpu-fingerprint";

export type BuildStep = "reuse" | "rebuild" | "wait" | "cleanup" | "checkout" | "configure" | "compile" | "install" | "done";

export interface BuildProgress {
  step: BuildStep;
  /** compile: cmake's own percentage. */
  percent?: number;
  detail: string;
}

export interface EngineBuildOptions {
  /** The build folder (default: the per-commit folder in the cache); a relative one is taken from the working folder. */
  outDir?: string;
  /** Cache root holding one folder per commit (default ~/.cache/llmgw/llama.cpp). Ignored with outDir. */
  root?: string;
  /** The git bundle to build from (default: node-llama-cpp's). */
  bundle?: string;
  /** Compile jobs (default: one per available core). */
  jobs?: number;
  targets?: readonly LlamaCppTarget[];
  /** The environment of the tools (PATH decides which cmake and compiler run). */
  env?: NodeJS.ProcessEnv;
  onProgress?: (progress: BuildProgress) => void;
  /** Stops the build: its tools are stopped and the lock released before the promise rejects. */
  signal?: AbortSignal;
  /** How often a waiting build looks at another builder's lock (ms). */
  lockPollMs?: number;
  /** How often a waiting build says it still waits (ms; default a minute). */
  lockReportMs?: number;
}

export interface EngineBuildResult {
  dir: string;
  llamaServer: string;
  binaries: Record<LlamaCppTarget, string>;
  record: BuildRecord;
  /** True when a finished build was found and nothing was compiled. */
  reused: boolean;
}

/** Builds (or finds) llama-server and its companions for the bundled llama.cpp commit. */
export async function buildLlamaCpp(options: EngineBuildOptions = {}): Promise<EngineBuildResult> {
  const env = options.env ?? process.env;
  const targets = [...(options.targets ?? LLAMA_CPP_TARGETS)];
  const progress = options.onProgress ?? (() => {});
  const { signal } = options;
  const source = await llamaCppSource(options.bundle);
  // Absolute: the printed path is handed to agents started elsewhere.
  const dir = options.outDir === undefined ? buildDirFor(source.commit, options.root) : path.resolve(options.outDir);
  if (options.outDir !== undefined) checkOutFolder(dir);
  const short = source.commit.slice(0, 7);
  const cpu = cpuFingerprint();

  const found = await finishedBuild(dir, source.commit, targets, cpu);
  if (found.result !== undefined) {
    progress({ step: "reuse", detail: `llama.cpp ${short} is already built in ${dir}` });
    return found.result;
  }
  if (found.otherCpu !== undefined) progress({ step: "rebuild", detail: `rebuilding llama.cpp ${short} in ${dir}: ${found.otherCpu}` });
  // Only now: reusing a finished build needs none of the tools.
  checkBuildTools(env);
  await claimFolder(dir);
  const lock = await takeBuildLock({
    dir,
    ...(options.lockPollMs === undefined ? {} : { pollMs: options.lockPollMs }),
    ...(options.lockReportMs === undefined ? {} : { reportMs: options.lockReportMs }),
    ...(signal === undefined ? {} : { signal }),
    onWait: (detail) => progress({ step: "wait", detail }),
  });
  try {
    const leftover = await stopLeftoverTools(dir);
    if (leftover !== undefined) {
      progress({ step: "cleanup", detail: `stopped ${leftover.command} (process group ${leftover.group}) left running in ${dir} by a build that was killed` });
    }
    // Another builder may have finished while this one waited for the lock.
    const built = await finishedBuild(dir, source.commit, targets, cpu);
    if (built.result !== undefined) {
      progress({ step: "reuse", detail: `llama.cpp ${short} was built meanwhile in ${dir}` });
      return built.result;
    }
    const started = Date.now();
    const log = path.join(dir, "build.log");
    await writeFile(log, "");
    const run = { env, log, dir, ...(signal === undefined ? {} : { signal }) };
    await checkout({ dir, bundle: source.bundle, commit: source.commit, run, progress });
    await buildFolderFor(dir, cpu, built.otherCpu !== undefined, progress);
    stopIfInterrupted(signal);
    progress({ step: "configure", detail: `configuring llama.cpp ${short} with cmake` });
    await runLogged("cmake", ["-S", path.join(dir, "source"), "-B", path.join(dir, "build"), ...CONFIGURE_FLAGS], { ...run, what: "cmake configure" });
    const jobs = options.jobs ?? availableCores();
    progress({ step: "compile", percent: 0, detail: `compiling ${targets.join(", ")} with ${jobs} job${jobs === 1 ? "" : "s"} (15–25 minutes on 2 cores)` });
    await runLogged("cmake", ["--build", path.join(dir, "build"), "--target", ...targets, "-j", String(jobs)], {
      ...run,
      what: "the compile",
      onLine: (line) => {
        const percent = compilePercent(line);
        if (percent !== undefined) progress({ step: "compile", percent, detail: line.slice(0, 200) });
      },
    });
    stopIfInterrupted(signal);
    progress({ step: "install", detail: `copying the programs to ${path.join(dir, "bin")}` });
    const binaries = await install(dir, targets);
    const version = await versionOf(binaries["llama-server"] ?? binaryIn(dir, "llama-server"), env);
    const record: BuildRecord = {
      commit: source.commit,
      flags: [...CONFIGURE_FLAGS],
      targets,
      version,
      built_at: new Date().toISOString(),
      seconds: Math.round((Date.now() - started) / 1000),
      cpu_fingerprint: cpu,
    };
    // Last, through a rename: build.json is what says the build is whole.
    await writeFile(path.join(dir, "build.json.partial"), `${JSON.stringify(record, null, 2)}\n`);
    await rename(path.join(dir, "build.json.partial"), path.join(dir, "build.json"));
    progress({ step: "done", detail: `built llama.cpp ${short} in ${record.seconds} s` });
    return { dir, llamaServer: binaryIn(dir, "llama-server"), binaries: binariesIn(dir, targets), record, reused: false };
  } finally {
    lock.release();
  }
}

/**
 * A build whose record matches this commit, flags and targets, and whose programs are all
 * there; or why an otherwise finished build is not usable (made for another CPU).
 */
async function finishedBuild(dir: string, commit: string, targets: LlamaCppTarget[], cpu: string): Promise<{ result?: EngineBuildResult; otherCpu?: string }> {
  const record = await readBuildRecord(dir);
  if (record === undefined || record.commit !== commit) return {};
  if (record.flags.join(" ") !== CONFIGURE_FLAGS.join(" ")) return {};
  if (!targets.every((target) => record.targets.includes(target) && existsSync(binaryIn(dir, target)))) return {};
  const why = otherCpu(record, cpu);
  if (why !== undefined) return { otherCpu: why };
  // A record from before the fingerprint is taken as made here, and says so from now on
  // (where the folder can be written: a read-only cache still serves).
  const adopted = await adoptBuildRecord(dir, record, cpu).catch(() => record);
  return { result: { dir, llamaServer: binaryIn(dir, "llama-server"), binaries: binariesIn(dir, targets), record: adopted, reused: true } };
}

function binariesIn(dir: string, targets: LlamaCppTarget[]): Record<LlamaCppTarget, string> {
  return Object.fromEntries(targets.map((target) => [target, binaryIn(dir, target)])) as Record<LlamaCppTarget, string>;
}

/** Refuses an --out folder that holds files and is not one of our builds; writes nothing. */
function checkOutFolder(dir: string): void {
  let entries: string[];
  try {
    if (!statSync(dir).isDirectory()) {
      throw new BadRequestError(`the build folder ${dir} is a file, not a folder: name a new or empty folder`, { code: "build_folder_not_ours" });
    }
    entries = readdirSync(dir);
  } catch (error) {
    if (errorCode(error) === "ENOENT") return;
    throw error;
  }
  if (entries.length === 0 || entries.includes(BUILD_MARKER) || entries.includes("build.json")) return;
  const shown = entries.slice(0, 5).join(", ") + (entries.length > 5 ? ", ..." : "");
  throw new BadRequestError(
    `the build folder ${dir} holds other files (${shown}) and is not a build of llmgw's (no build.json or ${BUILD_MARKER}); ` +
      `a build clears folders inside it, so it only uses a new or empty folder: name one, for example ${path.join(dir, "llama.cpp")}`,
    { code: "build_folder_not_ours" },
  );
}

/** Creates the build folder if needed and marks it as ours (checkOutFolder has vetted an --out folder). */
async function claimFolder(dir: string): Promise<void> {
  await mkdir(dir, { recursive: true });
  const marker = path.join(dir, BUILD_MARKER);
  if (!existsSync(marker)) {
    await writeFile(marker, "This folder is a llama.cpp build of `llmgw engine build`, which may clear and rewrite anything in it.\n");
  }
}

function availableCores(): number {
  return Math.max(1, os.availableParallelism());
}

interface CheckoutOptions {
  dir: string;
  bundle: string;
  commit: string;
  run: { env: NodeJS.ProcessEnv; log: string; dir: string; signal?: AbortSignal };
  progress: (p: BuildProgress) => void;
}

/** source/ at the commit: kept when it is already there, else cloned from the bundle beside it and renamed in. */
async function checkout({ dir, bundle, commit, run, progress }: CheckoutOptions): Promise<void> {
  const sourceDir = path.join(dir, "source");
  if (existsSync(sourceDir)) {
    const head = spawnSync("git", ["-C", sourceDir, "rev-parse", "HEAD"], { env: run.env, encoding: "utf8" });
    if (head.status === 0 && head.stdout.trim() === commit) return;
    // Another commit's or a broken checkout: its build folder would mix objects, so both go.
    await rm(sourceDir, { recursive: true, force: true });
    await rm(path.join(dir, "build"), { recursive: true, force: true });
  }
  progress({ step: "checkout", detail: `unpacking llama.cpp ${commit.slice(0, 7)} from ${bundle}` });
  const partial = path.join(dir, "source.partial");
  await rm(partial, { recursive: true, force: true });
  await runLogged("git", ["clone", "--quiet", "--no-checkout", bundle, partial], { ...run, what: "git clone of the source bundle" });
  await runLogged("git", ["-C", partial, "-c", "advice.detachedHead=false", "checkout", "--quiet", "--detach", commit], { ...run, what: "git checkout" });
  await rename(partial, sourceDir);
}

/**
 * build/ for this CPU: GGML_NATIVE's compile commands do not name the CPU, so objects made
 * on another one would count as up to date and be linked again. A build/ without a stamp
 * (from before the stamp) is taken as this machine's, as its build.json is, unless the
 * finished build it made was recorded for another CPU (`otherCpuRecord`).
 */
async function buildFolderFor(dir: string, cpu: string, otherCpuRecord: boolean, progress: (p: BuildProgress) => void): Promise<void> {
  const buildDir = path.join(dir, "build");
  const stamp = path.join(buildDir, BUILD_CPU_STAMP);
  const stamped = (await readFile(stamp, "utf8").catch(() => undefined))?.trim();
  if (existsSync(buildDir) && ((stamped !== undefined && stamped !== cpu) || (stamped === undefined && otherCpuRecord))) {
    progress({
      step: "rebuild",
      detail: `${buildDir} holds objects compiled for another CPU (fingerprint ${stamped ?? "not recorded"}, this one's is ${cpu}): starting it afresh`,
    });
    await rm(buildDir, { recursive: true, force: true });
  }
  await mkdir(buildDir, { recursive: true });
  await writeFile(stamp, `${cpu}\n`);
}

/** Copies each program from cmake's build/bin to bin/ (through a partial file, so bin/ never holds half a binary). */
async function install(dir: string, targets: LlamaCppTarget[]): Promise<Record<LlamaCppTarget, string>> {
  await mkdir(path.join(dir, "bin"), { recursive: true });
  for (const target of targets) {
    const built = path.join(dir, "build", "bin", target);
    if (!existsSync(built)) {
      throw new InternalError(`cmake finished but ${built} is not there; see ${path.join(dir, "build.log")}`, { code: "engine_build_failed" });
    }
    const partial = `${binaryIn(dir, target)}.partial`;
    await copyFile(built, partial);
    await rename(partial, binaryIn(dir, target));
  }
  return binariesIn(dir, targets);
}

/** `llama-server --version`'s version line: the build must run, not merely exist. */
async function versionOf(llamaServer: string, env: NodeJS.ProcessEnv): Promise<string> {
  const result = spawnSync(llamaServer, ["--version"], { env, encoding: "utf8", timeout: 30_000 });
  const read = readLlamaServerVersion(`${result.stdout ?? ""}\n${result.stderr ?? ""}`);
  if (read === undefined) {
    throw new InternalError(
      `the built ${llamaServer} does not run: --version printed no version line (exit ${result.status ?? result.signal}): ${(result.stderr ?? "").trim().slice(0, 300)}`,
      { code: "engine_build_failed" },
    );
  }
  return read.version;
}
