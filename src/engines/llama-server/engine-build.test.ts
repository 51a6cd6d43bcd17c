// `llmgw engine build` on a stand-in llama.cpp: a git bundle of a tiny CMake project whose
// three programs print a llama.cpp-style version line. The real cmake, compiler and git run,
// in seconds, so reuse, resumption, the lock and failures are exercised for real; the real
// llama.cpp build (the same function, 15–25 minutes) is what the test suite's provisioning
// runs and test/llama-server.e2e.test.ts uses.
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { existsSync, readFileSync, statSync } from "node:fs";
import { mkdir, mkdtemp, rm, symlink, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import { eventually } from "../../../test/support/eventually.ts";
import { buildLlamaCpp, type BuildProgress } from "./engine-build.ts";
import { builtLlamaServer, llamaCppSource } from "./llama-cpp-source.ts";

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

describe("llmgw engine build", () => {
  let dir: string;
  let bundle: string;

  before(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), "llmgw-engine-build-"));
    bundle = await makeBundle(dir, { "CMakeLists.txt": CMAKE_PROJECT, "main.cpp": PROGRAM });
  });
  after(() => rm(dir, { recursive: true, force: true }));

  test("builds the three programs from the bundle, records the build last, and reuses it", async () => {
    const out = path.join(dir, "cache-a");
    const steps: BuildProgress[] = [];
    const first = await buildLlamaCpp({ bundle, outDir: out, jobs: 2, onProgress: (p) => steps.push(p) });
    assert.equal(first.reused, false);
    const { commit } = await llamaCppSource(bundle);
    assert.equal(first.record.commit, commit);
    assert.equal(first.record.version, "0.4.0-dev (build 1, commit STANDIN)");
    assert.deepEqual(first.record.targets, ["llama-server", "llama-bench", "llama-batched-bench"]);
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

  test("waits for a live builder's lock, and takes over a dead one's", async () => {
    const out = path.join(dir, "cache-c");
    await mkdir(out, { recursive: true });
    // A dead builder: a pid that has exited.
    const dead = spawnSync(process.execPath, ["-e", "process.stdout.write(String(process.pid))"], { encoding: "utf8" });
    await writeFile(path.join(out, "build.lock"), dead.stdout);
    const tookOver = await buildLlamaCpp({ bundle, outDir: out });
    assert.equal(tookOver.reused, false);
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
});

test("the default source is node-llama-cpp's own bundle, whose commit names the cache folder", async () => {
  const source = await llamaCppSource();
  assert.ok(existsSync(source.bundle), source.bundle);
  assert.match(source.bundle, /node-llama-cpp\/llama\/gitRelease\.bundle$/);
  assert.match(source.commit, /^[0-9a-f]{40}$/);
});
