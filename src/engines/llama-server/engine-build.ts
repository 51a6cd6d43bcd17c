// `llmgw engine build`: builds llama-server (with llama-bench and llama-batched-bench) from
// the llama.cpp source node-llama-cpp ships, with the machine's cmake and C++ compiler, into
// the per-commit cache that llama-cpp-source.ts describes. A finished build is reused; an
// interrupted one is resumed (cmake's build folder is kept, and build.json is written only
// once every binary is in place and answers --version), and two builds of one commit never
// run at once (a lock file with the builder's pid; a dead builder's lock is taken over).
//
// The configure flags, each for a reason:
//   BUILD_SHARED_LIBS=OFF            one self-contained binary per program, so bin/ can be used
//                                    from anywhere (no libllama.so beside it to find)
//   GGML_NATIVE=ON                   compiled for this CPU's instructions, as llama.cpp's own
//                                    default: the cache is per machine
//   LLAMA_CURL=OFF, LLAMA_OPENSSL=OFF  no downloading from the engine: llmgw hands engines
//                                    verified local files, and the build needs no TLS library
//   LLAMA_USE_PREBUILT_UI=OFF, LLAMA_BUILD_UI=OFF  the server's web page would otherwise be
//                                    fetched from the Hugging Face Hub at build time
//                                    (scripts/ui-assets.cmake); llmgw has its own console
//   LLAMA_BUILD_TESTS=OFF, LLAMA_BUILD_EXAMPLES=OFF  only the three programs are needed
import { spawn, spawnSync } from "node:child_process";
import { createWriteStream, existsSync } from "node:fs";
import { copyFile, mkdir, open, readFile, rename, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { BadRequestError, InternalError, LlmgwError } from "../../core/errors.ts";
import { readLlamaServerVersion } from "./llama-server-version.ts";
import { LLAMA_CPP_TARGETS, binaryIn, buildDirFor, llamaCppSource, readBuildRecord, type BuildRecord, type LlamaCppTarget } from "./llama-cpp-source.ts";

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

export type BuildStep = "reuse" | "wait" | "checkout" | "configure" | "compile" | "install" | "done";

export interface BuildProgress {
  step: BuildStep;
  /** compile: cmake's own percentage. */
  percent?: number;
  detail: string;
}

export interface EngineBuildOptions {
  /** The build folder (default: the per-commit folder in the cache). */
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
  /** How often a waiting build looks at another builder's lock (ms). */
  lockPollMs?: number;
}

export interface EngineBuildResult {
  dir: string;
  llamaServer: string;
  binaries: Record<LlamaCppTarget, string>;
  record: BuildRecord;
  /** True when a finished build was found and nothing was compiled. */
  reused: boolean;
}

/** The tools a build runs, and the Debian package of each. */
const TOOLS: { names: string[]; what: string; debian: string }[] = [
  { names: ["cmake"], what: "cmake", debian: "cmake" },
  { names: ["c++", "g++", "clang++"], what: "a C++ compiler", debian: "g++" },
  { names: ["cc", "gcc", "clang"], what: "a C compiler", debian: "gcc" },
  { names: ["make"], what: "make", debian: "make" },
  { names: ["git"], what: "git", debian: "git" },
];

/** Builds (or finds) llama-server and its companions for the bundled llama.cpp commit. */
export async function buildLlamaCpp(options: EngineBuildOptions = {}): Promise<EngineBuildResult> {
  const env = options.env ?? process.env;
  const targets = [...(options.targets ?? LLAMA_CPP_TARGETS)];
  const progress = options.onProgress ?? (() => {});
  checkBuildTools(env);
  const source = await llamaCppSource(options.bundle);
  const dir = options.outDir ?? buildDirFor(source.commit, options.root);
  const short = source.commit.slice(0, 7);

  const finished = await finishedBuild(dir, source.commit, targets);
  if (finished) {
    progress({ step: "reuse", detail: `llama.cpp ${short} is already built in ${dir}` });
    return finished;
  }
  await mkdir(dir, { recursive: true });
  const release = await takeLock(dir, options.lockPollMs ?? 2000, progress);
  try {
    // Another builder may have finished while this one waited for the lock.
    const built = await finishedBuild(dir, source.commit, targets);
    if (built) {
      progress({ step: "reuse", detail: `llama.cpp ${short} was built meanwhile in ${dir}` });
      return built;
    }
    const started = Date.now();
    const log = path.join(dir, "build.log");
    await writeFile(log, "");
    await checkout(dir, source.bundle, source.commit, env, log, progress);
    progress({ step: "configure", detail: `configuring llama.cpp ${short} with cmake` });
    await runLogged("cmake", ["-S", path.join(dir, "source"), "-B", path.join(dir, "build"), ...CONFIGURE_FLAGS], { env, log, what: "cmake configure" });
    const jobs = options.jobs ?? availableCores();
    progress({ step: "compile", percent: 0, detail: `compiling ${targets.join(", ")} with ${jobs} job${jobs === 1 ? "" : "s"} (15–25 minutes on 2 cores)` });
    await runLogged("cmake", ["--build", path.join(dir, "build"), "--target", ...targets, "-j", String(jobs)], {
      env,
      log,
      what: "the compile",
      onLine: (line) => {
        const percent = /^\[\s*(\d{1,3})%\]/.exec(line)?.[1];
        if (percent !== undefined) progress({ step: "compile", percent: Number(percent), detail: line.slice(0, 200) });
      },
    });
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
    };
    // Last, through a rename: build.json is what says the build is whole.
    await writeFile(path.join(dir, "build.json.partial"), `${JSON.stringify(record, null, 2)}\n`);
    await rename(path.join(dir, "build.json.partial"), path.join(dir, "build.json"));
    progress({ step: "done", detail: `built llama.cpp ${short} in ${record.seconds} s` });
    return { dir, llamaServer: binaryIn(dir, "llama-server"), binaries: binariesIn(dir, targets), record, reused: false };
  } finally {
    await release();
  }
}

/** A build whose record matches this commit, flags and targets, and whose programs are all there. */
async function finishedBuild(dir: string, commit: string, targets: LlamaCppTarget[]): Promise<EngineBuildResult | undefined> {
  const record = await readBuildRecord(dir);
  if (record === undefined || record.commit !== commit) return undefined;
  if (record.flags.join(" ") !== CONFIGURE_FLAGS.join(" ")) return undefined;
  if (!targets.every((target) => record.targets.includes(target) && existsSync(binaryIn(dir, target)))) return undefined;
  return { dir, llamaServer: binaryIn(dir, "llama-server"), binaries: binariesIn(dir, targets), record, reused: true };
}

function binariesIn(dir: string, targets: LlamaCppTarget[]): Record<LlamaCppTarget, string> {
  return Object.fromEntries(targets.map((target) => [target, binaryIn(dir, target)])) as Record<LlamaCppTarget, string>;
}

/** Refuses at once, naming every missing tool and its Debian package, rather than failing twenty minutes in. */
export function checkBuildTools(env: NodeJS.ProcessEnv): void {
  const missing = TOOLS.filter((tool) => !tool.names.some((name) => onPath(name, env)));
  if (missing.length === 0) return;
  const packages = [...new Set(missing.map((tool) => tool.debian))].join(" ");
  throw new BadRequestError(
    `llmgw engine build needs ${missing.map((tool) => tool.what).join(", ")}, which ${missing.length === 1 ? "is" : "are"} not on PATH. ` +
      `On Debian or Ubuntu, as root: apt-get install -y ${packages}`,
    { code: "build_tool_missing" },
  );
}

function onPath(name: string, env: NodeJS.ProcessEnv): boolean {
  return (env.PATH ?? "").split(path.delimiter).some((dir) => dir !== "" && existsSync(path.join(dir, name)));
}

function availableCores(): number {
  return Math.max(1, os.availableParallelism());
}

/** source/ at the commit: kept when it is already there, else cloned from the bundle beside it and renamed in. */
async function checkout(dir: string, bundle: string, commit: string, env: NodeJS.ProcessEnv, log: string, progress: (p: BuildProgress) => void): Promise<void> {
  const sourceDir = path.join(dir, "source");
  if (existsSync(sourceDir)) {
    const head = spawnSync("git", ["-C", sourceDir, "rev-parse", "HEAD"], { env, encoding: "utf8" });
    if (head.status === 0 && head.stdout.trim() === commit) return;
    // Another commit's or a broken checkout: its build folder would mix objects, so both go.
    await rm(sourceDir, { recursive: true, force: true });
    await rm(path.join(dir, "build"), { recursive: true, force: true });
  }
  progress({ step: "checkout", detail: `unpacking llama.cpp ${commit.slice(0, 7)} from ${bundle}` });
  const partial = path.join(dir, "source.partial");
  await rm(partial, { recursive: true, force: true });
  await runLogged("git", ["clone", "--quiet", "--no-checkout", bundle, partial], { env, log, what: "git clone of the source bundle" });
  await runLogged("git", ["-C", partial, "-c", "advice.detachedHead=false", "checkout", "--quiet", "--detach", commit], {
    env,
    log,
    what: "git checkout",
  });
  await rename(partial, sourceDir);
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

interface RunLoggedOptions {
  env: NodeJS.ProcessEnv;
  log: string;
  what: string;
  onLine?: (line: string) => void;
}

/** Runs a tool with its output appended to build.log; a failure names the step, the log and its last lines. */
function runLogged(command: string, args: string[], options: RunLoggedOptions): Promise<void> {
  return new Promise((resolve, reject) => {
    const logStream = createWriteStream(options.log, { flags: "a" });
    logStream.write(`$ ${command} ${args.join(" ")}\n`);
    const child = spawn(command, args, { env: options.env, stdio: ["ignore", "pipe", "pipe"] });
    let pending = "";
    const onData = (chunk: Buffer) => {
      logStream.write(chunk);
      if (options.onLine === undefined) return;
      pending += chunk.toString("utf8");
      const lines = pending.split("\n");
      pending = lines.pop() ?? "";
      for (const line of lines) options.onLine(line);
    };
    child.stdout.on("data", onData);
    child.stderr.on("data", onData);
    child.on("error", (error) => {
      logStream.end();
      reject(new BadRequestError(`could not run ${command} for ${options.what}: ${error.message}`, { code: "build_tool_missing", cause: error }));
    });
    child.on("close", (code, signal) => {
      logStream.end(async () => {
        if (code === 0) return resolve();
        const tail = await lastLines(options.log, 25);
        reject(
          new LlmgwError({
            status: 500,
            code: "engine_build_failed",
            message: `${options.what} failed (${signal ?? `exit ${code}`}); the whole log is ${options.log}. Its end:\n${tail}`,
          }),
        );
      });
    });
  });
}

async function lastLines(file: string, count: number): Promise<string> {
  const text = await readFile(file, "utf8").catch(() => "");
  return text.trimEnd().split("\n").slice(-count).join("\n");
}

/**
 * One builder per build folder: `build.lock` is created exclusively and holds the builder's
 * pid. A live builder's lock is waited for; a dead one's (killed mid-build) is taken over.
 */
async function takeLock(dir: string, pollMs: number, progress: (p: BuildProgress) => void): Promise<() => Promise<void>> {
  const lock = path.join(dir, "build.lock");
  let announced = false;
  for (;;) {
    try {
      const handle = await open(lock, "wx");
      await handle.writeFile(String(process.pid));
      await handle.close();
      return () => rm(lock, { force: true });
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "EEXIST") throw error;
    }
    const holder = Number((await readFile(lock, "utf8").catch(() => "")).trim());
    if (!Number.isInteger(holder) || holder <= 0 || !alive(holder)) {
      await rm(lock, { force: true });
      continue;
    }
    if (!announced) {
      progress({ step: "wait", detail: `another build of this llama.cpp (pid ${holder}) is running in ${dir}; waiting for it` });
      announced = true;
    }
    await new Promise((resolve) => setTimeout(resolve, pollMs));
  }
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    // EPERM: it exists but belongs to someone else.
    return (error as NodeJS.ErrnoException).code === "EPERM";
  }
}
