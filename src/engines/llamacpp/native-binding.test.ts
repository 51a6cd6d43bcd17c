// The bundled engine's local build is tied to the CPU it was compiled for through
// node-llama-cpp's own folder naming (native-binding.ts): these tests hold node-llama-cpp
// to the two behaviours that relies on, so an upgrade that changes either fails here
// rather than loading a build on a CPU that cannot run it. Then the build's guards: its
// environment, the check of a build in a child process (stand-in packages that find a
// build, find none, or crash), an engine not waiting for a compile in progress, and no
// build where the CPU cannot be told apart. (The compile itself takes minutes: it runs in
// `llmgw engine build`, not here.)
import { test } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import { pathToFileURL } from "node:url";
import { getLlama } from "node-llama-cpp";
import { cpuFingerprint } from "../llama-server/llama-cpp-source.ts";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, rm, utimes, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { compilePercent } from "../llama-server/build-tools.ts";
import { bindingBuildEnv, bindingCmakeOptions, buildBundledBinding, checkBinding, compileInProgress, nodeLlamaCppDir } from "./native-binding.ts";

interface FolderNames {
  withoutCustomCmakeOptions: string;
  withCustomCmakeOptions: string;
}

/** node-llama-cpp's internal naming of a local build's folder (not exported: imported by path). */
async function folderFor(customCmakeOptions: Record<string, string>): Promise<FolderNames> {
  const dist = path.join(nodeLlamaCppDir(), "dist", "bindings", "utils");
  const naming = (await import(pathToFileURL(path.join(dist, "getBuildFolderNameForBuildOptions.js")).href)) as {
    getBuildFolderNameForBuildOptions(options: unknown): Promise<FolderNames>;
  };
  const release = (await import(pathToFileURL(path.join(dist, "binariesGithubRelease.js")).href)) as { builtinLlamaCppRelease: string };
  return naming.getBuildFolderNameForBuildOptions({
    platform: process.platform,
    arch: process.arch,
    gpu: false,
    llamaCpp: { repo: "ggml-org/llama.cpp", release: release.builtinLlamaCppRelease },
    customCmakeOptions: new Map(Object.entries(customCmakeOptions)),
  });
}

test("the local build's folder is named by the CPU fingerprint in its cmake options: another CPU's build is another folder", async () => {
  assert.deepEqual(bindingCmakeOptions(), { LLMGW_CPU: cpuFingerprint() });
  const here = await folderFor(bindingCmakeOptions());
  const elsewhere = await folderFor({ LLMGW_CPU: "0123456789abcdef" });
  const plain = await folderFor({});
  assert.notEqual(here.withCustomCmakeOptions, elsewhere.withCustomCmakeOptions);
  assert.notEqual(here.withCustomCmakeOptions, plain.withCustomCmakeOptions, "a build without the fingerprint is not taken for this CPU's");
  assert.ok(here.withCustomCmakeOptions.startsWith(`${process.platform}-${process.arch}`), here.withCustomCmakeOptions);
});

test("with the fingerprint among the options and no build for it, node-llama-cpp still loads its prebuilt binary", async () => {
  const cmakeOptions = { LLMGW_CPU: "a-cpu-nothing-was-built-for" };
  const llama = await getLlama({ gpu: false, build: "never", skipDownload: true, usePrebuiltBinaries: true, progressLogs: false, maxThreads: 1, cmakeOptions });
  try {
    assert.equal(llama.buildType, "prebuilt");
  } finally {
    await llama.dispose();
  }
});

test("the compile's progress is read from Ninja's and Make's lines alike; other lines say nothing", () => {
  assert.equal(compilePercent("[1/277] Building CXX object CMakeFiles/llama-addon.dir/addon/AddonContext.cpp.o"), 1);
  assert.equal(compilePercent("[139/277] Building C object ggml/src/ggml-cpu.c.o"), 50);
  assert.equal(compilePercent("[277/277] Linking CXX shared module Release/llama-addon.node"), 100);
  assert.equal(compilePercent("[ 42%] Building CXX object src/llama.cpp.o"), 42);
  assert.equal(compilePercent("[  0%] Building C object ggml/src/ggml.c.o"), 1, "0 is kept for the announcement of a compile's start");
  assert.equal(compilePercent("  1243 |   (__v16si)"), undefined);
  assert.equal(compilePercent("Cloning ggml-org/llama.cpp (local bundle) 42%"), undefined);
});

test("the build's environment drops what node-llama-cpp would turn into options an engine never has, and adds the fingerprint", () => {
  const env = bindingBuildEnv(
    { PATH: "/usr/bin", GGML_CUDA: "1", GGML_BLAS_VENDOR: "OpenBLAS", NODE_LLAMA_CPP_CMAKE_OPTION_FOO: "x", HOME: "/home/op" },
    "abc",
  );
  assert.equal(env.GGML_CUDA, undefined);
  assert.equal(env.GGML_BLAS_VENDOR, undefined);
  assert.equal(env.NODE_LLAMA_CPP_CMAKE_OPTION_FOO, undefined);
  assert.equal(env.NODE_LLAMA_CPP_CMAKE_OPTION_LLMGW_CPU, "abc");
  assert.equal(env.HOME, "/home/op");
  assert.equal(env.PATH, `${path.dirname(process.execPath)}:/usr/bin`, "the npm beside this node comes first");
});

/** A stand-in node-llama-cpp package whose getLlama runs `body`. */
async function standInPackage(body: string): Promise<string> {
  const dir = await mkdtemp(path.join(tmpdir(), "llmgw-binding-"));
  await mkdir(path.join(dir, "dist"), { recursive: true });
  await writeFile(path.join(dir, "dist", "index.js"), `export async function getLlama(options) { ${body} }\n`);
  return dir;
}

test("the check runs in a child process: a build found, none, and one whose loading crashes is reported with the signal, not a crash of llmgw", async () => {
  const found = await standInPackage(
    "if (options.cmakeOptions.LLMGW_CPU !== 'abc' || options.usePrebuiltBinaries !== false) throw new Error('wrong'); return {};",
  );
  const none = await standInPackage("throw new Error('No local build found');");
  const crashing = await standInPackage("process.stderr.write('Illegal instruction in ggml_vec_dot\\n'); process.kill(process.pid, 'SIGILL');");
  try {
    assert.deepEqual(await checkBinding(found, "abc"), { kind: "found" });
    assert.deepEqual(await checkBinding(none, "abc"), { kind: "none" });
    const broken = await checkBinding(crashing, "abc");
    assert.equal(broken.kind, "broken");
    assert.match(broken.kind === "broken" ? broken.reason : "", /killed by SIGILL: Illegal instruction in ggml_vec_dot/);
  } finally {
    for (const dir of [found, none, crashing]) await rm(dir, { recursive: true, force: true });
  }
});

test("the real node-llama-cpp has no build for a CPU nothing was built for", async () => {
  assert.deepEqual(await checkBinding(nodeLlamaCppDir(), "0123456789abcdef"), { kind: "none" });
});

test("an engine does not wait for a compile in progress: a fresh node-llama-cpp build lock counts, a stale one does not", async () => {
  const dir = await mkdtemp(path.join(tmpdir(), "llmgw-binding-"));
  try {
    const builds = path.join(dir, "llama", "localBuilds");
    assert.equal(compileInProgress(dir), false, "no localBuilds folder at all");
    await mkdir(path.join(builds, "linux-x64-abc"), { recursive: true });
    assert.equal(compileInProgress(dir), false, "a finished build");
    await mkdir(path.join(builds, "linux-x64-abc.lock"));
    assert.equal(compileInProgress(dir), true);
    const old = new Date(Date.now() - 60_000);
    await utimes(path.join(builds, "linux-x64-abc.lock"), old, old);
    assert.equal(compileInProgress(dir), false, "a lock its builder stopped refreshing");
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test("no build where the CPU's features cannot be read: it could not be told from another CPU's", async () => {
  const workDir = await mkdtemp(path.join(tmpdir(), "llmgw-binding-"));
  try {
    await assert.rejects(buildBundledBinding({ cpu: "unknown", workDir }), /does not report its CPU's features/);
  } finally {
    await rm(workDir, { recursive: true, force: true });
  }
});

/**
 * A stand-in node-llama-cpp for the build's flow: its getLlama finds a build once its CLI
 * has written one for the fingerprint it was given; its CLI prints Ninja's progress and
 * fails when it sees a variable the build must not pass on.
 */
async function standInBuildablePackage(): Promise<string> {
  const dir = await standInPackage(
    "const fs = await import('node:fs'); if (fs.existsSync(new URL('../built-' + options.cmakeOptions.LLMGW_CPU, import.meta.url))) return {}; throw new Error('none');",
  );
  await mkdir(path.join(dir, "dist", "cli"), { recursive: true });
  await writeFile(
    path.join(dir, "dist", "cli", "cli.js"),
    [
      "import fs from 'node:fs';",
      "if (process.argv[2] !== 'source' || process.argv[3] !== 'download') process.exit(2);",
      "if (process.env.GGML_CUDA !== undefined) { console.error('GGML_CUDA reached the build'); process.exit(3); }",
      "console.log('[1/2] Building CXX object addon.cpp.o');",
      "console.log('[2/2] Linking CXX shared module llama-addon.node');",
      "fs.writeFileSync(new URL('../../built-' + process.env.NODE_LLAMA_CPP_CMAKE_OPTION_LLMGW_CPU, import.meta.url), '');",
    ].join("\n"),
  );
  return dir;
}

test("a build: node-llama-cpp's CLI with the fingerprint and without GGML_*, progress from its lines, checked after; then reused; an earlier unbound build removed", async () => {
  const packageDir = await standInBuildablePackage();
  const workDir = await mkdtemp(path.join(tmpdir(), "llmgw-binding-work-"));
  try {
    const unbound = path.join(packageDir, "llama", "localBuilds", `${process.platform}-${process.arch}`);
    await mkdir(unbound, { recursive: true });
    await writeFile(path.join(unbound, "llmgw-cpu-fingerprint"), "old\n");
    const progress: Array<number | undefined> = [];
    const env = { PATH: process.env.PATH ?? "/usr/bin:/bin", GGML_CUDA: "1" };
    const built = await buildBundledBinding({ packageDir, workDir, cpu: "abc", env, onProgress: (step) => progress.push(step.percent) });
    assert.equal(built.reused, false);
    assert.deepEqual(progress, [0, 50, 100]);
    assert.equal(existsSync(unbound), false, "the build made without the fingerprint is gone");
    assert.equal((await buildBundledBinding({ packageDir, workDir, cpu: "abc", env })).reused, true);
    assert.equal(
      (await buildBundledBinding({ packageDir, workDir, cpu: "other", env: { PATH: env.PATH, NODE_LLAMA_CPP_CMAKE_OPTION_X: "1" } })).reused,
      false,
      "another CPU builds its own",
    );
  } finally {
    await rm(packageDir, { recursive: true, force: true });
    await rm(workDir, { recursive: true, force: true });
  }
});

test("a build that ends without a build node-llama-cpp finds fails, naming the log", async () => {
  const packageDir = await standInPackage("throw new Error('none');");
  const workDir = await mkdtemp(path.join(tmpdir(), "llmgw-binding-work-"));
  try {
    await mkdir(path.join(packageDir, "dist", "cli"), { recursive: true });
    await writeFile(path.join(packageDir, "dist", "cli", "cli.js"), "console.log('nothing built');\n");
    await assert.rejects(buildBundledBinding({ packageDir, workDir, cpu: "abc" }), (error: unknown) => {
      assert.match(String(error), /node-llama-cpp finds no build for this CPU/);
      assert.ok(String(error).includes(path.join(workDir, "bundled-binding.log")), String(error));
      return true;
    });
  } finally {
    await rm(packageDir, { recursive: true, force: true });
    await rm(workDir, { recursive: true, force: true });
  }
});
