// `llmgw engine build` on a stand-in llama.cpp: a git bundle of a tiny CMake project whose
// three programs print a llama.cpp-style version line. The real cmake, compiler and git run,
// in seconds, so reuse, resumption, the lock, the CPU fingerprint, --out and failures are
// exercised for real; a variant whose build runs a long `sleep` stands for a compile that is
// interrupted (abort, kill -9 of the builder, SIGTERM of the command). The real llama.cpp
// build (the same function, 15–25 minutes) is what the test suite's provisioning runs and
// test/llama-server.e2e.test.ts uses.
import assert from "node:assert/strict";
import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import { existsSync, readFileSync, readdirSync, statSync, utimesSync } from "node:fs";
import { mkdir, mkdtemp, readFile, rm, symlink, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import { fileURLToPath } from "node:url";
import { eventually } from "../../../test/support/eventually.ts";
import { GROUP_FILE } from "./build-tools.ts";
import { BUILD_MARKER, buildLlamaCpp, type BuildProgress } from "./engine-build.ts";
import { builtLlamaServer, cpuFingerprint, llamaCppSource } from "./llama-cpp-source.ts";
import { hasEnded, readProcStat } from "../../core/process-identity.ts";

const PROGRAM = `#include <cstdio>
#include <cstring>
int main(int argc, char ** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--version") == 0) {
    std::fprintf(stderr, "version: 0.4.0-dev (build 1, commit STANDIN)\\nbuilt with test for x86_64\\n");
    return 0;
  }
  return 2;
}
`;

// CMake's own ${...} references, not JavaScript placeholders.
const CMAKE_PROJECT = `cmake_minimum_required(VERSION 3.14)
project(standin CXX)
set(CMAKE_RUNTIME_OUTPUT_DIRECTORY \${CMAKE_BINARY_DIR}/bin)
foreach(t llama-server llama-bench llama-batched-bench)
  add_executable(\${t} main.cpp)
endforeach()
`;

async function makeBundle(dir: string, files: Record<string, string>): Promise<string> {
  const repo = path.join(dir, "repo");
  await rm(repo, { recursive: true, force: true });
  await mkdir(repo, { recursive: true });
  for (const [name, text] of Object.entries(files)) await writeFile(path.join(repo, name), text);
  const git = (...args: string[]) => {
    const result = spawnSync("git", ["-C", repo, "-c", "user.name=t", "-c", "user.email=t@t", ...args], { encoding: "utf8" });
    assert.equal(result.status, 0, result.stderr);
  };
  git("init", "-q");
  git("add", ".");
  git("commit", "-q", "-m", "stand-in llama.cpp");
  const bundle = path.join(dir, `source-${Date.now()}.bundle`);
  git("bundle", "create", "-q", bundle, "HEAD");
  return bundle;
}

/** Whether a process runs (a killed orphan may stay a zombie where nothing reaps it). */
function runs(pid: number): boolean {
  const stat = readProcStat(pid);
  return stat !== undefined && !hasEnded(stat);
}

function json(file: string): Record<string, unknown> {
  return JSON.parse(readFileSync(file, "utf8")) as Record<string, unknown>;
}

describe("llmgw engine build", () => {
  let dir: string;
  let bundle: string;

  before(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), "llmgw-engine-build-"));
    bundle = await makeBundle(dir, { "CMakeLists.txt": CMAKE_PROJECT, "main.cpp": PROGRAM });
  });
  after(() => rm(dir, { recursive: true, force: true }));

  test("builds the three programs from the bundle, records the build (with the CPU) last, and reuses it", async () => {
    const out = path.join(dir, "cache-a");
    const steps: BuildProgress[] = [];
    const first = await buildLlamaCpp({ bundle, outDir: out, jobs: 2, onProgress: (p) => steps.push(p) });
    assert.equal(first.reused, false);
    const { commit } = await llamaCppSource(bundle);
    assert.equal(first.record.commit, commit);
    assert.equal(first.record.version, "0.4.0-dev (build 1, commit STANDIN)");
    assert.deepEqual(first.record.targets, ["llama-server", "llama-bench", "llama-batched-bench"]);
    assert.equal(json(path.join(out, "build.json")).cpu_fingerprint, cpuFingerprint());
    assert.ok(existsSync(path.join(out, BUILD_MARKER)), "the folder is marked as a build");
    for (const program of Object.values(first.binaries)) {
      const run = spawnSync(program, ["--version"], { encoding: "utf8" });
      assert.match(run.stderr, /^version: /, `${program} runs`);
    }
    assert.deepEqual([...new Set(steps.map((p) => p.step))], ["checkout", "configure", "compile", "install", "done"], "progress names each step in order");
    assert.ok(
      steps.some((p) => p.step === "compile" && (p.percent ?? 0) > 0),
      "the compile's percentage is reported",
    );

    const built = statSync(first.llamaServer).mtimeMs;
    const again: BuildProgress[] = [];
    const second = await buildLlamaCpp({ bundle, outDir: out, onProgress: (p) => again.push(p) });
    assert.equal(second.reused, true);
    assert.deepEqual(
      again.map((p) => p.step),
      ["reuse"],
    );
    assert.equal(statSync(second.llamaServer).mtimeMs, built, "nothing was rebuilt or copied");
  });

  test("a build stopped before its record is finished by the next run, not taken as done", async () => {
    const out = path.join(dir, "cache-b");
    await buildLlamaCpp({ bundle, outDir: out });
    // A build killed after compiling but before build.json: the programs are there, the record is not.
    await rm(path.join(out, "build.json"));
    await rm(path.join(out, "bin", "llama-bench"));
    const resumed = await buildLlamaCpp({ bundle, outDir: out });
    assert.equal(resumed.reused, false);
    assert.ok(existsSync(path.join(out, "bin", "llama-bench")));
    assert.ok(existsSync(path.join(out, "build.json")));
  });

  test("the lock names its builder whole while it builds; a dead builder's is taken over, a live one's waited for", async () => {
    const out = path.join(dir, "cache-c");
    await mkdir(out);
    await writeFile(path.join(out, BUILD_MARKER), "");
    // A dead builder of an older llmgw, which wrote a bare pid.
    const dead = spawnSync(process.execPath, ["-e", "process.stdout.write(String(process.pid))"], { encoding: "utf8" });
    await writeFile(path.join(out, "build.lock"), dead.stdout);
    let lockWhileBuilding: Record<string, unknown> | undefined;
    const tookOver = await buildLlamaCpp({
      bundle,
      outDir: out,
      onProgress: (p) => {
        if (p.step === "configure") lockWhileBuilding = json(path.join(out, "build.lock"));
      },
    });
    assert.equal(tookOver.reused, false);
    assert.equal(lockWhileBuilding?.pid, process.pid);
    assert.equal(lockWhileBuilding?.host, os.hostname());
    assert.equal(lockWhileBuilding?.process_start, readProcStat(process.pid)?.start);
    assert.ok(!existsSync(path.join(out, "build.lock")), "the lock is released");

    // A live builder: the build waits, then finds the work done by nobody and does it.
    await rm(path.join(out, "build.json"));
    const holder = spawn(process.execPath, ["-e", "setInterval(() => {}, 1000)"], { stdio: "ignore" });
    try {
      await writeFile(path.join(out, "build.lock"), String(holder.pid));
      const steps: BuildProgress[] = [];
      const waiting = buildLlamaCpp({ bundle, outDir: out, lockPollMs: 20, onProgress: (p) => steps.push(p) });
      await eventually("the build to wait for the lock", () => steps.some((p) => p.step === "wait"));
      assert.ok(!steps.some((p) => p.step === "compile"), "nothing is compiled while another builder holds the lock");
      holder.kill("SIGKILL");
      const result = await waiting;
      assert.equal(result.reused, false);
      assert.match(steps.find((p) => p.step === "wait")?.detail ?? "", new RegExp(`pid ${holder.pid}`));
    } finally {
      holder.kill("SIGKILL");
    }
  });

  test("an empty lock is a starting builder's while it is younger than 30 s, and taken over after", async () => {
    // The folder of the test before, finished; without its record the build has work to do.
    const out = path.join(dir, "cache-c");
    await rm(path.join(out, "build.json"));
    await writeFile(path.join(out, "build.lock"), "");
    const steps: BuildProgress[] = [];
    const building = buildLlamaCpp({ bundle, outDir: out, lockPollMs: 20, onProgress: (p) => steps.push(p) });
    await eventually("the build to wait for the lock", () => steps.some((p) => p.step === "wait"));
    assert.ok(!steps.some((p) => p.step === "checkout" || p.step === "compile"), "not taken over while young");
    const old = new Date(Date.now() - 60_000);
    utimesSync(path.join(out, "build.lock"), old, old);
    assert.equal((await building).reused, false);
  });

  test("missing tools are named with their Debian packages before anything runs", async () => {
    const onlyGit = path.join(dir, "only-git");
    await mkdir(onlyGit, { recursive: true });
    const git = spawnSync("sh", ["-c", "command -v git"], { encoding: "utf8" }).stdout.trim();
    await symlink(git, path.join(onlyGit, "git"));
    const out = path.join(dir, "cache-d");
    await assert.rejects(buildLlamaCpp({ bundle, outDir: out, env: { PATH: onlyGit } }), (error: Error & { code?: string }) => {
      assert.equal(error.code, "build_tool_missing");
      assert.match(error.message, /needs cmake, a C\+\+ compiler, a C compiler, make, which are not on PATH/);
      assert.match(error.message, /apt-get install -y cmake g\+\+ gcc make$/);
      return true;
    });
    assert.ok(!existsSync(out), "nothing was written");
  });

  test("a finished build is reused with no build tool and no git on PATH", async () => {
    // The first test's build.
    const out = path.join(dir, "cache-a");
    const built = await buildLlamaCpp({ bundle, outDir: out });
    assert.equal(built.reused, true);
    const empty = path.join(dir, "empty-path");
    await mkdir(empty, { recursive: true });
    const reused = await buildLlamaCpp({ bundle, outDir: out, env: { PATH: empty } });
    assert.equal(reused.reused, true);
    assert.equal(reused.llamaServer, built.llamaServer);
  });

  test("a compile that fails names the log and shows its end; no record is written", async () => {
    const broken = await makeBundle(path.join(dir, "broken"), {
      "CMakeLists.txt": CMAKE_PROJECT,
      "main.cpp": "int main() { return this_does_not_compile; }\n",
    });
    const out = path.join(dir, "cache-e");
    await assert.rejects(buildLlamaCpp({ bundle: broken, outDir: out }), (error: Error & { code?: string }) => {
      assert.equal(error.code, "engine_build_failed");
      assert.match(error.message, /the compile failed \(exit \d+\); the whole log is .*build\.log/);
      assert.match(error.message, /this_does_not_compile/);
      return true;
    });
    assert.ok(!existsSync(path.join(out, "build.json")));
    assert.match(readFileSync(path.join(out, "build.log"), "utf8"), /this_does_not_compile/);
    assert.ok(!existsSync(path.join(out, "build.lock")), "a failed build releases its lock");
  });

  test("--llama-server auto finds the cached build of the bundle's commit, or says how to make it", async () => {
    const root = path.join(dir, "root");
    await assert.rejects(builtLlamaServer({ root, bundle }), /no finished llama-server build for llama\.cpp [0-9a-f]{7} .*run `llmgw engine build` first/);
    const { commit } = await llamaCppSource(bundle);
    const result = await buildLlamaCpp({ bundle, root });
    assert.equal(result.dir, path.join(root, commit));
    assert.equal(await builtLlamaServer({ root, bundle }), result.llamaServer);
  });

  test("a missing source bundle is a sentence that says how to get it", async () => {
    await assert.rejects(buildLlamaCpp({ bundle: path.join(dir, "nope.bundle"), outDir: path.join(dir, "x") }), /reinstall llmgw's dependencies \(npm ci\)/);
  });

  test("--out: a folder holding other files is refused and left as it was; a file is refused; a relative one is made absolute", async () => {
    const foreign = path.join(dir, "someones-project");
    await mkdir(path.join(foreign, "source"), { recursive: true });
    await writeFile(path.join(foreign, "notes.txt"), "mine\n");
    await writeFile(path.join(foreign, "source", "keep.c"), "int keep;\n");
    await assert.rejects(buildLlamaCpp({ bundle, outDir: foreign }), (error: Error & { code?: string }) => {
      assert.equal(error.code, "build_folder_not_ours");
      assert.match(
        error.message,
        /holds other files \(notes\.txt, source\) and is not a build of llmgw's .*name one, for example .*someones-project\/llama\.cpp/,
      );
      return true;
    });
    assert.deepEqual(readdirSync(foreign).sort(), ["notes.txt", "source"], "nothing was written or removed");
    assert.equal(readFileSync(path.join(foreign, "source", "keep.c"), "utf8"), "int keep;\n");

    await assert.rejects(buildLlamaCpp({ bundle, outDir: path.join(foreign, "notes.txt") }), /is a file, not a folder/);

    // The first test's build, named relative to the working folder.
    const relative = path.relative(process.cwd(), path.join(dir, "cache-a"));
    assert.ok(!path.isAbsolute(relative));
    const result = await buildLlamaCpp({ bundle, outDir: relative });
    assert.equal(result.dir, path.join(dir, "cache-a"));
    assert.equal(result.llamaServer, path.join(dir, "cache-a", "bin", "llama-server"));
  });

  test("a build made for another CPU is not reused: build/ starts afresh and the record is this CPU's; auto refuses it meanwhile", async () => {
    // The cache the --llama-server auto test built.
    const root = path.join(dir, "root");
    const first = await buildLlamaCpp({ bundle, root });
    assert.equal(first.reused, true);
    // As if the cache was made on another machine: the record and the build folder say so.
    const foreign = "0123456789abcdef";
    await writeFile(path.join(first.dir, "build.json"), JSON.stringify({ ...json(path.join(first.dir, "build.json")), cpu_fingerprint: foreign }));
    await writeFile(path.join(first.dir, "build", "llmgw-cpu-fingerprint"), `${foreign}\n`);
    await assert.rejects(builtLlamaServer({ root, bundle }), (error: Error & { code?: string }) => {
      assert.equal(error.code, "llama_server_other_cpu");
      assert.match(
        error.message,
        /compiled for another CPU \(GGML_NATIVE; CPU fingerprint 0123456789abcdef, this machine's is [0-9a-f]{16}\).*Run `llmgw engine build`/,
      );
      return true;
    });
    const steps: BuildProgress[] = [];
    const rebuilt = await buildLlamaCpp({ bundle, root, onProgress: (p) => steps.push(p) });
    assert.equal(rebuilt.reused, false);
    assert.match(steps[0]?.detail ?? "", /^rebuilding llama\.cpp [0-9a-f]{7} in .*: it was compiled for another CPU/);
    assert.ok(steps.some((p) => p.step === "rebuild" && /holds objects compiled for another CPU .*starting it afresh/.test(p.detail)));
    assert.ok(
      steps.some((p) => p.step === "compile" && /Building CXX object/.test(p.detail)),
      "the objects were compiled again, not relinked",
    );
    assert.equal(rebuilt.record.cpu_fingerprint, cpuFingerprint());
    assert.equal(await builtLlamaServer({ root, bundle }), rebuilt.llamaServer);
  });

  test("a record from before the CPU fingerprint is reused as this machine's and given the field in place", async () => {
    const out = path.join(dir, "cache-a");
    const first = await buildLlamaCpp({ bundle, outDir: out });
    const { cpu_fingerprint: _dropped, ...legacy } = json(path.join(out, "build.json"));
    await writeFile(path.join(out, "build.json"), JSON.stringify(legacy));
    const steps: BuildProgress[] = [];
    const again = await buildLlamaCpp({ bundle, outDir: out, onProgress: (p) => steps.push(p) });
    assert.equal(again.reused, true);
    assert.deepEqual(
      steps.map((p) => p.step),
      ["reuse"],
    );
    assert.deepEqual(json(path.join(out, "build.json")), { ...legacy, cpu_fingerprint: cpuFingerprint() });
    assert.equal(statSync(again.llamaServer).mtimeMs, statSync(first.llamaServer).mtimeMs);
  });
});

/** A stand-in whose build of llama-server first runs `sleep 600` while `flag` exists, after writing the sleep's pid. */
function slowProject(flag: string, pidFile: string): string {
  return `${CMAKE_PROJECT}add_custom_target(slow COMMAND sh -c "if [ -e ${flag} ]; then echo $$ > ${pidFile}.partial && mv ${pidFile}.partial ${pidFile} && exec sleep 600; fi" VERBATIM)
add_dependencies(llama-server slow)
`;
}

describe("stopping a build", () => {
  let dir: string;
  let bundle: string;
  let flag: string;
  let pidFile: string;
  const sleepers: number[] = [];
  const children: ChildProcess[] = [];

  before(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), "llmgw-engine-stop-"));
    flag = path.join(dir, "slow");
    pidFile = path.join(dir, "sleep.pid");
    bundle = await makeBundle(dir, { "CMakeLists.txt": slowProject(flag, pidFile), "main.cpp": PROGRAM });
  });
  after(async () => {
    for (const child of children) child.kill("SIGKILL");
    for (const pid of sleepers) if (runs(pid)) process.kill(pid, "SIGKILL");
    await rm(dir, { recursive: true, force: true });
  });

  /** The pid of the compile's `sleep`, once it runs. */
  async function sleeping(): Promise<number> {
    await rm(pidFile, { force: true });
    const pid = await eventually("the compile's sleep", async () => Number((await readFile(pidFile, "utf8").catch(() => "")).trim()) || undefined);
    sleepers.push(pid);
    return pid;
  }

  /** `llmgw engine build --out OUT` with the stand-in bundle, run from `cwd`. */
  function command(out: string, cwd: string): { child: ChildProcess; stdout: () => string; stderr: () => string; exit: Promise<number | null> } {
    const module = fileURLToPath(new URL("../../cli/engine-build-command.ts", import.meta.url));
    const code = `const { runEngineBuildCommand } = await import(${JSON.stringify(module)});
      await runEngineBuildCommand({ out: ${JSON.stringify(out)} }, { bundle: ${JSON.stringify(bundle)} });`;
    const child = spawn(process.execPath, ["--import", import.meta.resolve("tsx"), "--input-type=module", "-e", code], {
      cwd,
      stdio: ["ignore", "pipe", "pipe"],
    });
    children.push(child);
    let stdout = "";
    let stderr = "";
    child.stdout?.on("data", (chunk: Buffer) => {
      stdout += chunk.toString();
    });
    child.stderr?.on("data", (chunk: Buffer) => {
      stderr += chunk.toString();
    });
    const exit = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)));
    return { child, stdout: () => stdout, stderr: () => stderr, exit };
  }

  test("an aborted build stops its compile (the whole process group) and releases the lock before it rejects", async () => {
    await writeFile(flag, "");
    const out = path.join(dir, "abort");
    const controller = new AbortController();
    const building = buildLlamaCpp({ bundle, outDir: out, signal: controller.signal });
    const sleep = await sleeping();
    assert.ok(existsSync(path.join(out, GROUP_FILE)), "the running group is recorded");
    controller.abort("SIGINT");
    await assert.rejects(building, (error: Error & { code?: string }) => {
      assert.equal(error.code, "engine_build_interrupted");
      assert.match(error.message, /interrupted \(SIGINT\): none of its tools runs any more and it holds no lock; run `llmgw engine build` again/);
      return true;
    });
    assert.ok(!runs(sleep), "the compile's processes are stopped");
    assert.ok(!existsSync(path.join(out, "build.lock")), "the lock is released");
    assert.ok(!existsSync(path.join(out, GROUP_FILE)));
  });

  test("a builder killed with SIGKILL leaves its compile running; the next build stops it before building", { timeout: 180_000 }, async () => {
    await writeFile(flag, "");
    const out = path.join(dir, "killed");
    const killed = command(out, dir);
    const sleep = await sleeping();
    killed.child.kill("SIGKILL");
    await killed.exit;
    assert.ok(runs(sleep), "the compile outlives its builder");
    const group = Number(json(path.join(out, GROUP_FILE)).group);

    await rm(flag);
    const steps: BuildProgress[] = [];
    const result = await buildLlamaCpp({ bundle, outDir: out, onProgress: (p) => steps.push(p) });
    assert.equal(result.reused, false);
    assert.ok(!runs(sleep), "the left-over compile was stopped");
    const cleanup = steps.find((p) => p.step === "cleanup");
    assert.match(cleanup?.detail ?? "", new RegExp(`stopped cmake \\(process group ${group}\\) left running in .* by a build that was killed`));
    assert.ok(steps.indexOf(cleanup as BuildProgress) < steps.findIndex((p) => p.step === "configure"), "stopped before the build went on");
  });

  test("SIGTERM stops `llmgw engine build`: tools stopped, lock released, exit 143; the next run resumes and prints an absolute path", {
    timeout: 180_000,
  }, async () => {
    await writeFile(flag, "");
    const run = command("cli-out", dir);
    const sleep = await sleeping();
    run.child.kill("SIGTERM");
    assert.equal(await run.exit, 143, run.stderr());
    assert.match(run.stderr(), /engine build: SIGTERM: stopping cmake and the compilers, then releasing the lock/);
    assert.match(run.stderr(), /error: the engine build was interrupted \(SIGTERM\)/);
    assert.ok(!runs(sleep), "the compile's processes are stopped");
    const out = path.join(dir, "cli-out");
    assert.ok(!existsSync(path.join(out, "build.lock")), "the lock is released");
    assert.equal(run.stdout(), "", "no path is printed for a build that did not finish");

    await rm(flag);
    const again = command("cli-out", dir);
    assert.equal(await again.exit, 0, again.stderr());
    assert.equal(again.stdout(), `${path.join(out, "bin", "llama-server")}\n`);
  });
});
